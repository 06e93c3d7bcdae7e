"""egress_openshell_policy, run as Ansible runs it: options, check mode, diff, refusals that change nothing."""

import json
import os

import pytest

from ansible.module_utils import basic

from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import readback as _readback
from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import schema as _schema
from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import translate as _translate
from ansible_collections.pi_dispatch.egress.plugins.modules import egress_openshell_policy as _module

needs_schema = pytest.mark.skipif(not _schema.available(), reason='the openshell package (%s) is not installed'
                                  % _schema.REQUIREMENT)

SEED = ('api.anthropic.com          # the provider: every turn of every job\n'
        '.github.com                # your forge: the push and the pull request\n'
        "registry.npmjs.org         # only when a job installs the serviced repo's own dependencies\n")
DECLARATION = {'version': 1, 'endpoints': [
    {'id': 'mac-ollama', 'host': 'host.docker.internal', 'port': 11434, 'slots': 2, 'keyless': True}]}


class _Exit(Exception):
    def __init__(self, kind, result):
        super(_Exit, self).__init__(kind)
        self.kind = kind
        self.result = result


@pytest.fixture
def deploy(tmp_path):
    folder = tmp_path / 'egress'
    folder.mkdir()
    (folder / 'egress-allowlist.conf').write_text(SEED)
    (folder / 'model-endpoints.json').write_text(json.dumps(DECLARATION))
    return folder


@needs_schema
def test_renders_and_writes_the_seed_policy(deploy, run_module):
    dest = deploy / 'openshell-policy.yaml'
    kind, result = run_module(_module.main, dict(deploy_dir=str(deploy), dest=str(dest)))
    assert kind == 'exit' and result['changed'] is True
    assert dest.read_text() == _readback.dumps(result['policy'], 'yaml')
    assert [r['rule'] for r in result['rules']] == [
        'allowlist_host_api_anthropic_com', 'allowlist_domain_github_com', 'allowlist_host_registry_npmjs_org',
        'model_endpoint_mac-ollama']
    assert result['schema'] == dict(package='openshell', pinned='0.1.5', installed='0.1.5')
    assert result['sources']['allowlist_exists'] and result['sources']['endpoints_exists']
    assert result['skipped'] == [] and result['differences'] == []
    # a second run changes nothing
    kind, again = run_module(_module.main, dict(deploy_dir=str(deploy), dest=str(dest)))
    assert kind == 'exit' and again['changed'] is False


@needs_schema
def test_check_mode_and_diff_write_nothing(deploy, run_module):
    dest = deploy / 'openshell-policy.json'
    kind, result = run_module(_module.main, dict(deploy_dir=str(deploy), dest=str(dest), format='json'),
                              check_mode=True, diff=True)
    assert kind == 'exit' and result['changed'] is True
    assert not dest.exists()
    assert result['diff']['before'] == '' and json.loads(result['diff']['after']) == result['policy']
    assert result['diff']['after_header'] == str(dest)


@needs_schema
def test_without_dest_it_renders_and_reports_only(deploy, run_module):
    kind, result = run_module(_module.main, dict(deploy_dir=str(deploy)))
    assert kind == 'exit' and result['changed'] is False and result['dest'] is None
    assert 'api.anthropic.com' in json.dumps(result['policy'])


@needs_schema
def test_an_untranslatable_entry_fails_naming_it_and_changes_nothing(deploy, run_module):
    dest = deploy / 'openshell-policy.yaml'
    dest.write_text('previous\n')
    (deploy / 'model-endpoints.json').write_text(json.dumps({'version': 1, 'endpoints': [
        {'id': 'v6', 'host': 'fd00::5', 'port': 8000, 'slots': 1}]}))
    kind, result = run_module(_module.main, dict(deploy_dir=str(deploy), dest=str(dest)))
    assert kind == 'fail'
    assert result['msg'].startswith('openshell-egress-untranslatable: 1 entry cannot be expressed')
    assert 'endpoint v6: [fd00::5]:8000: is an IPv6 literal' in result['msg']
    assert [r['entry'] for r in result['refused']] == ['[fd00::5]:8000']
    assert dest.read_text() == 'previous\n'


@needs_schema
def test_a_skipped_line_is_warned_and_reported(deploy, run_module):
    (deploy / 'egress-allowlist.conf').write_text(SEED + 'api.github.com\n127.0.0.1\n')
    kind, result = run_module(_module.main, dict(deploy_dir=str(deploy)))
    assert kind == 'exit'
    assert [s['entry'] for s in result['skipped']] == ['api.github.com', '127.0.0.1']
    assert any(w.startswith(_translate.SKIPPED + ': %s:4: api.github.com' % (deploy / 'egress-allowlist.conf'))
               for w in result['warnings'])


@needs_schema
def test_a_refused_allowlist_line_names_file_line_and_fix(deploy, run_module):
    (deploy / 'egress-allowlist.conf').write_text('api.anthropic.com\n.github.io\n')
    kind, result = run_module(_module.main, dict(deploy_dir=str(deploy), dest=str(deploy / 'p.yaml')))
    assert kind == 'fail'
    assert "%s:2: '.github.io': covers the whole public suffix github.io" % (deploy / 'egress-allowlist.conf') \
        in result['msg']
    assert 'your own domain (.yourdomain.tld)' in result['msg']
    assert [(p['line'], p['severity']) for p in result['problems']] == [(2, 'error')]
    assert not (deploy / 'p.yaml').exists()


@needs_schema
def test_a_refused_declaration_names_the_endpoint_and_key(deploy, run_module):
    (deploy / 'model-endpoints.json').write_text(json.dumps({'version': 1, 'endpoints': [
        {'id': 'mac-ollama', 'host': 'host.docker.internal', 'port': '11434', 'slots': 2}]}))
    kind, result = run_module(_module.main, dict(deploy_dir=str(deploy)))
    assert kind == 'fail'
    assert 'endpoint 0 (id "mac-ollama"): key "port" = "11434": must be an integer' in result['msg']
    assert result['problems'][0]['key'] == 'port'


@needs_schema
def test_no_allowlist_admits_the_endpoints_only(deploy, run_module):
    os.unlink(str(deploy / 'egress-allowlist.conf'))
    kind, result = run_module(_module.main, dict(deploy_dir=str(deploy)))
    assert kind == 'exit'
    assert list(result['policy']['network_policies']) == ['model_endpoint_mac-ollama']
    assert any('does not exist: nothing listed is admitted' in w for w in result['warnings'])


@needs_schema
def test_a_policy_read_back_the_same_passes(deploy, tmp_path, run_module):
    read_back = tmp_path / 'read-back.json'
    kind, result = run_module(_module.main, dict(deploy_dir=str(deploy)))
    policy = dict(result['policy'], filesystem_policy={'read_only': ['/usr']})
    read_back.write_text(json.dumps(policy))
    kind, result = run_module(_module.main, dict(deploy_dir=str(deploy), compare_with=str(read_back)))
    assert kind == 'exit' and result['differences'] == [] and result['not_compared'] == ['filesystem_policy']


@needs_schema
def test_a_policy_read_back_differently_by_one_endpoint_fails_naming_it(deploy, tmp_path, run_module):
    kind, result = run_module(_module.main, dict(deploy_dir=str(deploy)))
    policy = result['policy']
    rule = policy['network_policies']['allowlist_host_registry_npmjs_org']
    rule['endpoints'] = [e for e in rule['endpoints'] if e['port'] != 80]
    read_back = tmp_path / 'read-back.yaml'
    read_back.write_text(_readback.dumps(policy))
    dest = deploy / 'openshell-policy.yaml'
    kind, result = run_module(_module.main, dict(deploy_dir=str(deploy), compare_with=str(read_back), dest=str(dest)))
    assert kind == 'fail'
    assert result['msg'].startswith('openshell-policy-readback-differs: the policy read back from %s differs from '
                                    'what the sources render in 1 endpoint;' % read_back)
    assert 'registry.npmjs.org:80: missing from the policy read back' in result['msg']
    assert [(d['endpoint'], d['kind']) for d in result['differences']] == [('registry.npmjs.org:80', 'missing')]
    assert not dest.exists()


@needs_schema
@pytest.mark.parametrize('content, words', [
    (None, 'does not exist; read the sandbox policy back into it first'),
    ('version: [1\n', 'is not valid YAML'),
    ('{"version": 1, "network_policies": {"r": {"endpoints": [{"host": "a.b", "port": 443, "bogus": 1}]}}}',
     'has no field named "bogus"'),
])
def test_a_bad_read_back_file_is_refused_naming_it(deploy, tmp_path, content, words, run_module):
    read_back = tmp_path / 'read-back.yaml'
    if content is not None:
        read_back.write_text(content)
    kind, result = run_module(_module.main, dict(deploy_dir=str(deploy), compare_with=str(read_back)))
    assert kind == 'fail' and str(read_back) in result['msg'] and words in result['msg']


@needs_schema
@pytest.mark.parametrize('args, words', [
    (dict(binaries=['usr/bin/node']), "binaries: 'usr/bin/node' is not an absolute executable path"),
    (dict(deploy_dir='relative/egress'), "deploy_dir 'relative/egress' is not an absolute path"),
    (dict(dest='/nonexistent-folder-for-the-test/p.yaml'), 'the folder of /nonexistent-folder-for-the-test/p.yaml'),
])
def test_bad_options_are_refused_naming_the_option(deploy, args, words, run_module):
    kind, result = run_module(_module.main, dict(dict(deploy_dir=str(deploy)), **args))
    assert kind == 'fail' and words in result['msg']


@needs_schema
def test_a_symlinked_dest_is_refused(deploy, tmp_path, run_module):
    target = tmp_path / 'elsewhere.yaml'
    target.write_text('x\n')
    link = deploy / 'openshell-policy.yaml'
    link.symlink_to(target)
    kind, result = run_module(_module.main, dict(deploy_dir=str(deploy), dest=str(link)))
    assert kind == 'fail' and 'is not a regular file' in result['msg'] and target.read_text() == 'x\n'


@needs_schema
def test_plain_http_off_and_narrow_binaries(deploy, run_module):
    kind, result = run_module(_module.main, dict(deploy_dir=str(deploy), plain_http=False, binaries=['/usr/bin/node']))
    assert kind == 'exit'
    ports = set(e['port'] for r in result['policy']['network_policies'].values() for e in r['endpoints'])
    assert ports == {443, 11434}
    assert all(r['binaries'] == [{'path': '/usr/bin/node'}] for r in result['policy']['network_policies'].values())
    assert _translate.LIMIT_NO_PORT_80 in result['limits']


def test_without_the_package_the_module_fails_naming_it_and_the_pin(monkeypatch, deploy, run_module):
    monkeypatch.setattr(_schema, 'sandbox_pb2', None)
    monkeypatch.setattr(_schema, 'IMPORT_ERROR', 'Traceback: ImportError: No module named openshell')
    kind, result = run_module(_module.main, dict(deploy_dir=str(deploy), dest=str(deploy / 'p.yaml')))
    assert kind == 'fail'
    assert 'Failed to import the required Python library (openshell==0.1.5)' in result['msg']
    assert 'Run: pip install openshell==0.1.5' in result['msg']
    assert result['exception'].startswith('Traceback')
    assert not (deploy / 'p.yaml').exists()


def test_the_documentation_matches_the_argument_spec(monkeypatch):
    """What validate-modules checks: every option documented with the spec's type, default, choices, elements."""
    import yaml
    captured = {}

    def capture(self, argument_spec, **kwargs):
        captured.update(argument_spec)
        raise _Exit('spec', kwargs)

    monkeypatch.setattr(basic.AnsibleModule, '__init__', capture)
    with pytest.raises(_Exit) as done:
        _module.main()
    assert done.value.result == dict(supports_check_mode=True, required_together=[
        ('gateway', 'sandbox', 'workspace'), ('gateway_cert', 'gateway_key')])
    doc = yaml.safe_load(_module.DOCUMENTATION)
    assert doc['module'] == 'egress_openshell_policy' and doc['version_added'] == '0.7.0'
    assert doc['author'] == ['pi-dispatch egress team (@pi-dispatch)']
    yaml.safe_load(_module.EXAMPLES)
    yaml.safe_load(_module.RETURN)
    assert set(doc['options']) == set(captured)
    for name, spec in captured.items():
        option = doc['options'][name]
        for key in ('type', 'default', 'choices', 'elements'):
            assert option.get(key) == spec.get(key), (name, key)


@needs_schema
def test_a_gateway_without_its_sandbox_and_workspace_is_refused(deploy, run_module):
    kind, result = run_module(_module.main, dict(deploy_dir=str(deploy), gateway='127.0.0.1:1'))
    assert kind == 'fail' and 'parameters are required together: gateway, sandbox, workspace' in result['msg']
