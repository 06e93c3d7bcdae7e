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
