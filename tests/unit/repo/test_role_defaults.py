"""Every role variable is documented twice: a comment in defaults/main.yml and an entry in the argument spec."""

import glob
import os
import re

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
ROLES = sorted(os.path.basename(os.path.dirname(os.path.dirname(p)))
               for p in glob.glob(os.path.join(ROOT, 'roles', '*', 'defaults', 'main.yml')))


def _read(role, *parts):
    with open(os.path.join(ROOT, 'roles', role, *parts)) as handle:
        return handle.read()


def test_every_role_is_covered():
    assert ROLES == sorted(os.path.basename(p.rstrip('/')) for p in glob.glob(os.path.join(ROOT, 'roles', '*/')))


@pytest.mark.parametrize('role', ROLES)
def test_every_default_has_a_comment_right_above_it(role):
    lines = _read(role, 'defaults', 'main.yml').splitlines()
    missing = []
    for number, line in enumerate(lines):
        match = re.match(r'^([A-Za-z_][A-Za-z0-9_]*):', line)
        if match and (number == 0 or not lines[number - 1].startswith('#')):
            missing.append(match.group(1))
    assert missing == [], '%s: variables without a comment right above them: %s' % (role, missing)


@pytest.mark.parametrize('role', ROLES)
def test_every_default_is_in_the_argument_spec_with_the_same_default(role):
    defaults = yaml.safe_load(_read(role, 'defaults', 'main.yml')) or {}
    options = yaml.safe_load(_read(role, 'meta', 'argument_specs.yml'))['argument_specs']['main']['options']
    assert sorted(set(defaults) - set(options)) == [], role
    for name, value in defaults.items():
        spec = options[name]
        assert spec.get('description'), (role, name)
        assert spec.get('type'), (role, name)
        if 'default' in spec:
            assert spec['default'] == value, (role, name, spec['default'], value)


def _collections_base():
    import sys
    for entry in sys.path:
        if os.path.isdir(os.path.join(entry, 'ansible_collections', 'pi_dispatch', 'egress', 'roles')):
            return entry
    raise AssertionError('tests/conftest.py did not expose the collection')


WRONG_TYPES = [
    ('deployment', 'egress_allowlist_seed', 'not-a-list'),
    ('proxy', 'egress_proxy_wait_timeout', 'soon'),
    ('proxy', 'egress_proxy_extra_hosts', {'a': 1}),
    ('upgrade', 'egress_upgrade_refresh_rules', 'perhaps'),
    ('doctor', 'doctor_probe_timeout', 'ten'),
    ('doctor', 'doctor_isolation', 'sometimes'),
]


@pytest.mark.parametrize('role, variable, value', WRONG_TYPES)
def test_a_wrong_type_fails_at_the_argument_check_naming_the_variable(tmp_path, role, variable, value):
    """The role stops at its argument-spec validation, before any task that could change something."""
    import json
    import subprocess
    import sys
    play = tmp_path / 'play.yml'
    play.write_text('- hosts: localhost\n  gather_facts: false\n  roles:\n    - role: pi_dispatch.egress.%s\n' % role)
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=_collections_base(), ANSIBLE_COLLECTIONS_SCAN_SYS_PATH='false',
               ANSIBLE_NOCOLOR='1', ANSIBLE_LOCALHOST_WARNING='false', ANSIBLE_INVENTORY_UNPARSED_WARNING='false',
               ANSIBLE_PYTHON_INTERPRETER=sys.executable, ANSIBLE_RETRY_FILES_ENABLED='false')
    playbook = os.path.join(os.path.dirname(sys.executable), 'ansible-playbook')
    proc = subprocess.run([playbook, '-i', 'localhost,', '-c', 'local', str(play), '-e', json.dumps({variable: value})],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, timeout=120, check=False)
    out = proc.stdout.decode('utf-8', 'replace')
    assert proc.returncode != 0, out
    assert 'Validating arguments against arg spec' in out, out
    tasks = [line for line in out.splitlines() if line.startswith('TASK [')]
    assert len(tasks) == 1 and 'Validating arguments' in tasks[0], tasks  # nothing ran after the check
    assert variable in out.split(tasks[0], 1)[1], out


# --- every variable a role reads is in its argument spec -------------------------------

ROLE_VARIABLE = re.compile(r'\b((?:egress|doctor|gc)_[a-z0-9_]+)\b')
BARE_EXPRESSION_KEYS = ('when', 'failed_when', 'changed_when', 'that', 'until')


def _expressions(node, key=None):
    """Every templated string (and bare conditional) of a parsed task file."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _expressions(v, k)
    elif isinstance(node, list):
        for item in node:
            yield from _expressions(item, key)
    elif isinstance(node, str) and ('{{' in node or '{%' in node or key in BARE_EXPRESSION_KEYS):
        yield node


def _set_here(node):
    """Names a task file defines itself: registered results, set_fact keys, task and include vars."""
    names = set()
    if isinstance(node, dict):
        if isinstance(node.get('register'), str):
            names.add(node['register'])
        for key in ('ansible.builtin.set_fact', 'set_fact', 'vars'):
            if isinstance(node.get(key), dict):
                names.update(node[key])
        for value in node.values():
            names |= _set_here(value)
    elif isinstance(node, list):
        for item in node:
            names |= _set_here(item)
    return names


def _all_tasks():
    out = {}
    for path in glob.glob(os.path.join(ROOT, 'roles', '*', 'tasks', '*.yml')):
        with open(path) as handle:
            out[path] = yaml.safe_load(handle) or []
    return out


@pytest.mark.parametrize('role', ROLES)
def test_every_variable_a_role_reads_is_in_its_argument_spec(role):
    tasks = _all_tasks()
    defined = set()
    for parsed in tasks.values():  # results registered by an included role's tasks count too
        defined |= _set_here(parsed)
    read = set()
    for path, parsed in tasks.items():
        if os.sep + os.path.join('roles', role, 'tasks') + os.sep in path:
            for text in _expressions(parsed):
                read.update(ROLE_VARIABLE.findall(text))
    for path in glob.glob(os.path.join(ROOT, 'roles', role, 'templates', '*.j2')):
        with open(path) as handle:
            for block in re.findall(r'\{\{.*?\}\}|\{%.*?%\}', handle.read(), re.S):
                read.update(ROLE_VARIABLE.findall(block))
    options = yaml.safe_load(_read(role, 'meta', 'argument_specs.yml'))['argument_specs']['main']['options']
    missing = sorted(read - defined - set(options))
    assert missing == [], '%s reads variables its argument spec does not list: %s' % (role, missing)


DEPRECATED_ALIASES = [
    ('doctor', 'doctor_deploy_dir', 'egress_deploy_dir'),
    ('doctor', 'doctor_proxy_name', 'egress_proxy_name'),
    ('doctor', 'doctor_job_network_pool', 'egress_job_network_pool'),
    ('doctor', 'doctor_firewall_chain_prefix', 'egress_firewall_chain_prefix'),
    ('doctor', 'doctor_docker_host', 'egress_docker_host'),
    ('gc', 'gc_proxy_name', 'egress_proxy_name'),
    ('gc', 'gc_docker_host', 'egress_docker_host'),
]


@pytest.mark.parametrize('role, old, new', DEPRECATED_ALIASES)
def test_a_removed_alias_is_refused_by_name_and_no_longer_read(role, old, new):
    """Removed in 0.4.0: not in the spec or the defaults, never read, and a set one fails the role first."""
    defaults = yaml.safe_load(_read(role, 'defaults', 'main.yml')) or {}
    options = yaml.safe_load(_read(role, 'meta', 'argument_specs.yml'))['argument_specs']['main']['options']
    assert old not in defaults and old not in options and new in options
    tasks = yaml.safe_load(_read(role, 'tasks', 'main.yml'))
    first = tasks[0]
    assert 'ansible.builtin.fail' in first and '%s: %s' % (old, new) in yaml.safe_dump(first['vars'], width=200)
    assert 'removed in pi_dispatch.egress 0.4.0' in first['ansible.builtin.fail']['msg']
    assert not [t for t in tasks[1:] if old in yaml.safe_dump(t, width=200)]
    with open(os.path.join(ROOT, 'docs', 'reference.md')) as handle:
        assert '| `%s` | `%s` |' % (old, new) in handle.read()


NEW_ROLE_WRONG_TYPES = [
    ('endpoints', 'egress_model_endpoints_reload', 'perhaps'),
    ('endpoints', 'egress_model_endpoints', {'id': 'not-a-list'}),
    ('gc', 'gc_min_age', 'soon'),
    ('gc', 'gc_fail_on_failed', 'sometimes'),
]


@pytest.mark.parametrize('role, variable, value', NEW_ROLE_WRONG_TYPES)
def test_a_wrong_type_stops_the_new_roles_at_the_argument_check(tmp_path, role, variable, value):
    test_a_wrong_type_fails_at_the_argument_check_naming_the_variable(tmp_path, role, variable, value)


@pytest.mark.parametrize('role', ROLES)
def test_every_role_has_a_readme_naming_each_variable_with_an_example_play(role):
    path = os.path.join(ROOT, 'roles', role, 'README.md')
    assert os.path.isfile(path), 'roles/%s has no README.md' % role
    with open(path) as handle:
        text = handle.read()
    assert text.startswith('# Role `pi_dispatch.egress.%s`' % role)
    options = yaml.safe_load(_read(role, 'meta', 'argument_specs.yml'))['argument_specs']['main']['options']
    missing = [name for name in options if '| `%s` |' % name not in text]
    assert not missing, 'roles/%s/README.md does not list %s' % (role, missing)
    example = text.split('```yaml\n', 1)[1].split('```', 1)[0]
    play = yaml.safe_load(example)
    assert any(r == 'pi_dispatch.egress.%s' % role or r.get('role') == 'pi_dispatch.egress.%s' % role
               for r in play[0]['roles']), example
    for link in re.findall(r'\]\((\.\./\.\./docs/[a-z-]+\.md)', text):
        assert os.path.isfile(os.path.normpath(os.path.join(ROOT, 'roles', role, link))), link
