"""The doctor's OpenShell line (_doctor/openshell.py): a deployed policy file against what the sources render."""

import json
import os

import pytest

from ansible.module_utils import basic

from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import doctor as _doctor
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import lines as _lines
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import openshell as _openshell
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.context import DoctorContext
from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import apply as _apply
from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import readback as _readback
from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import schema as _schema
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment
from ansible_collections.pi_dispatch.egress.plugins.modules import egress_canary as _canary

needs_schema = pytest.mark.skipif(not _schema.available(), reason='the openshell package (%s) is not installed'
                                  % _schema.REQUIREMENT)

SEED = 'api.anthropic.com\n.github.com\nregistry.npmjs.org\n'
DECLARATION = {'version': 1, 'endpoints': [
    {'id': 'mac-ollama', 'host': 'host.docker.internal', 'port': 11434, 'slots': 2, 'keyless': True}]}
POLICY = 'openshell-policy.yaml'


def _folder(tmp_path, allowlist=SEED, declaration=None):
    folder = tmp_path / 'egress'
    folder.mkdir()
    if allowlist is not None:
        (folder / 'egress-allowlist.conf').write_text(allowlist)
    (folder / 'model-endpoints.json').write_text(json.dumps(DECLARATION if declaration is None else declaration))
    return folder


def _deploy(folder, name=POLICY, fmt='yaml'):
    """The policy file as egress_openshell_policy writes it with dest (its own run, its defaults)."""
    params = _openshell.render_params()
    params.update(dest=str(folder / name), format=fmt)
    _apply.PolicyRun(params, _deployment.Layout(str(folder))).run()
    return folder / name


def _ctx(folder, policy):
    return DoctorContext(client=None, proxy='p', deploy_dir=str(folder), probe_image='i', pid=1, environ={},
                         openshell_policy=None if policy is None else str(policy))


def _lines_of(folder, policy):
    return _openshell.OpenShellCheck().lines(_ctx(folder, policy))


def _drop_endpoint(path, host, port):
    policy = _readback.loads(path.read_text(), str(path))
    for rule in policy['network_policies'].values():
        rule['endpoints'] = [e for e in rule['endpoints'] if (e['host'], e['port']) != (host, port)]
    path.write_text(_readback.dumps(policy))


def _add_endpoint(path, host, port):
    policy = _readback.loads(path.read_text(), str(path))
    rule = next(iter(policy['network_policies'].values()))
    rule['endpoints'].append(dict(rule['endpoints'][0], host=host, port=port))
    path.write_text(_readback.dumps(policy))


def _change_access(path, host, port):
    policy = _readback.loads(path.read_text(), str(path))
    for rule in policy['network_policies'].values():
        for e in rule['endpoints']:
            if (e['host'], e['port']) == (host, port):
                e['access'] = 'read-only'
    path.write_text(_readback.dumps(policy))


# --- setup functions: (tmp_path) -> (the deployment folder, the openshell_policy option) -------------------

def same_yaml(tmp_path):
    folder = _folder(tmp_path)
    return folder, _deploy(folder)


def same_json(tmp_path):
    folder = _folder(tmp_path)
    return folder, _deploy(folder, 'policy.json', 'json')


def same_without_allowlist(tmp_path):
    folder = _folder(tmp_path, allowlist=None)
    return folder, _deploy(folder)


def same_reordered(tmp_path):
    folder = _folder(tmp_path)
    path = _deploy(folder)
    policy = _readback.loads(path.read_text(), str(path))
    rules = dict(('r%d' % n, dict(rule, endpoints=list(reversed(rule['endpoints']))))
                 for n, rule in enumerate(reversed(list(policy['network_policies'].values()))))
    path.write_text(json.dumps(dict(policy, network_policies=rules, filesystem_policy={'read_only': ['/usr']})))
    return folder, path


def one_endpoint_missing(tmp_path):
    folder = _folder(tmp_path)
    path = _deploy(folder)
    _drop_endpoint(path, 'registry.npmjs.org', 80)
    return folder, path


def one_endpoint_added(tmp_path):
    folder = _folder(tmp_path)
    path = _deploy(folder)
    _add_endpoint(path, 'evil.example', 443)
    return folder, path


def one_endpoint_changed(tmp_path):
    folder = _folder(tmp_path)
    path = _deploy(folder)
    _change_access(path, 'api.anthropic.com', 443)
    return folder, path


def sources_changed_since(tmp_path):
    folder = _folder(tmp_path)
    path = _deploy(folder)
    (folder / 'egress-allowlist.conf').write_text(SEED + 'pypi.org\n')
    return folder, path


def endpoint_removed_since(tmp_path):
    folder = _folder(tmp_path)
    path = _deploy(folder)
    (folder / 'model-endpoints.json').write_text(json.dumps({'version': 1, 'endpoints': []}))
    return folder, path


def no_file(tmp_path):
    return _folder(tmp_path), tmp_path / 'egress' / POLICY


def a_symlink(tmp_path):
    folder = _folder(tmp_path)
    real = _deploy(folder, 'real.yaml')
    link = folder / POLICY
    os.symlink(str(real), str(link))
    return folder, link


def a_directory(tmp_path):
    folder = _folder(tmp_path)
    (folder / POLICY).mkdir()
    return folder, folder / POLICY


def not_utf8(tmp_path):
    folder = _folder(tmp_path)
    (folder / POLICY).write_bytes(b'version: 1\nnetwork_policies: {}\n# \xff\xfe\n')
    return folder, folder / POLICY


def not_yaml(tmp_path):
    folder = _folder(tmp_path)
    (folder / POLICY).write_text('version: [1\n')
    return folder, folder / POLICY


def not_a_mapping(tmp_path):
    folder = _folder(tmp_path)
    (folder / POLICY).write_text('- a list\n')
    return folder, folder / POLICY


def unknown_field(tmp_path):
    folder = _folder(tmp_path)
    (folder / POLICY).write_text(json.dumps({'version': 1, 'network_policies': {}, 'wider': True}))
    return folder, folder / POLICY


def public_suffix_wildcard(tmp_path):
    folder = _folder(tmp_path, allowlist=SEED + '.github.io\n')
    return folder, folder / POLICY


def ipv6_endpoint(tmp_path):
    folder = _folder(tmp_path, declaration={'version': 1, 'endpoints': [
        {'id': 'v6', 'host': 'fd00::5', 'port': 8000, 'slots': 1}]})
    return folder, folder / POLICY


def refused_allowlist(tmp_path):
    folder = _folder(tmp_path, allowlist=SEED + 'http://not a host/\n')
    return folder, folder / POLICY


def refused_declaration(tmp_path):
    folder = _folder(tmp_path, declaration={'version': 1, 'endpoints': [{'id': 'x'}]})
    return folder, folder / POLICY


CASES = [
    # (case, setup, line id, status, words in the message)
    ('the file as the module wrote it (YAML)', same_yaml, 'openshell.policy', 'ok',
     ['reads back as the current sources', 'endpoints']),
    ('the file as the module wrote it (JSON)', same_json, 'openshell.policy', 'ok', ['policy.json reads back']),
    ('no allowlist: model endpoints only', same_without_allowlist, 'openshell.policy', 'ok',
     ['(1 endpoints, 1 rules)']),
    ('other rule names, order and sections', same_reordered, 'openshell.policy', 'ok', ['reads back']),
    ('one endpoint missing from the file', one_endpoint_missing, 'openshell.policy_differs', 'fail',
     ['in 1 endpoint:', 'registry.npmjs.org:80: missing from the policy read back']),
    ('one endpoint added by the file', one_endpoint_added, 'openshell.policy_differs', 'fail',
     ['in 1 endpoint:', 'evil.example:443: admitted by the policy read back']),
    ('one endpoint changed in the file', one_endpoint_changed, 'openshell.policy_differs', 'fail',
     ['api.anthropic.com:443: changed', 'read-only']),
    ('the allowlist changed since', sources_changed_since, 'openshell.policy_differs', 'fail',
     ['in 2 endpoints:', 'pypi.org:443: missing', 'pypi.org:80: missing']),
    ('a model endpoint removed since', endpoint_removed_since, 'openshell.policy_differs', 'fail',
     ['host.docker.internal:11434: admitted by the policy read back']),
    ('no file', no_file, 'openshell.policy_missing', 'fail', ['it does not exist']),
    ('a symlink', a_symlink, 'openshell.policy_missing', 'fail', ['symlink']),
    ('a directory', a_directory, 'openshell.policy_missing', 'fail', ['not a regular file']),
    ('not UTF-8', not_utf8, 'openshell.policy_missing', 'fail', ['UTF-8']),
    ('not YAML', not_yaml, 'openshell.policy_missing', 'fail', ['is not valid YAML']),
    ('not a mapping', not_a_mapping, 'openshell.policy_missing', 'fail', ['does not hold a policy']),
    ('a field the schema does not know', unknown_field, 'openshell.policy_missing', 'fail',
     ["not accepted by OpenShell's SandboxPolicy message", 'wider']),
    ('a public-suffix wildcard (refused with the allowlist)', public_suffix_wildcard, 'openshell.untranslatable',
     'fail',
     ["egress-allowlist.conf:4: '.github.io': covers the whole public suffix github.io"]),
    ('an IPv6 model endpoint', ipv6_endpoint, 'openshell.untranslatable', 'fail',
     ['[fd00::5]:8000', 'IPv6']),
    ('a refused allowlist', refused_allowlist, 'openshell.untranslatable', 'fail',
     ['The allowlist is refused']),
    ('a refused model-endpoints declaration', refused_declaration, 'openshell.untranslatable', 'fail',
     ['model-endpoints.json']),
]


@needs_schema
@pytest.mark.parametrize('case, setup, line_id, status, words', CASES, ids=[c[0] for c in CASES])
def test_the_line(tmp_path, case, setup, line_id, status, words):
    folder, policy = setup(tmp_path)
    lines = _lines_of(folder, policy)
    assert [(line.id, line.status) for line in lines] == [(line_id, status)], (case, lines)
    line = lines[0]
    assert str(policy) in line.message or line_id == 'openshell.untranslatable' and str(folder) in line.message
    for word in words:
        assert word in line.message, (case, word, line.message)
    assert _lines.Line(line.id, line.status, line.message).group == 'openshell'
    if status == 'fail':
        assert 'egress_openshell_policy' in line.fix and str(policy) in line.fix
    assert _apply.NOTHING_WRITTEN not in line.message
    assert '\n' not in line.message


@needs_schema
def test_every_difference_is_named(tmp_path):
    folder, policy = one_endpoint_missing(tmp_path)
    _drop_endpoint(policy, 'github.com', 443)
    line = _lines_of(folder, policy)[0]
    assert line.id == 'openshell.policy_differs' and 'in 2 endpoints:' in line.message
    assert 'github.com:443: missing' in line.message and 'registry.npmjs.org:80: missing' in line.message


@needs_schema
def test_the_untranslatable_fix_is_each_entrys_own(tmp_path):
    folder, policy = ipv6_endpoint(tmp_path)
    line = _lines_of(folder, policy)[0]
    assert 'endpoint v6: [fd00::5]:8000: is an IPv6 literal' in line.message
    assert line.fix.count('then run pi_dispatch.egress.egress_openshell_policy') == 1
    assert line.fix.endswith('dest %s, then load it into the sandbox (openshell policy set --policy %s)'
                             % (policy, policy))


def test_no_option_no_line(tmp_path):
    folder = _folder(tmp_path)
    assert _lines_of(folder, None) == []


def test_a_missing_package_is_a_warning_naming_the_pinned_version(monkeypatch, tmp_path):
    monkeypatch.setattr(_schema, 'available', lambda: False)
    folder, policy = no_file(tmp_path)
    lines = _lines_of(folder, policy)
    assert [(line.id, line.status) for line in lines] == [('openshell.package_missing', 'warn')]
    assert _schema.PINNED_VERSION in lines[0].message and 'openshell' in lines[0].message
    assert lines[0].fix.startswith('pip install openshell==%s' % _schema.PINNED_VERSION)


def test_any_other_error_is_a_line_and_never_crashes_the_doctor(monkeypatch, tmp_path):
    def boom(self):
        raise RuntimeError('unexpected\nthing')

    monkeypatch.setattr(_schema, 'available', lambda: True)
    monkeypatch.setattr(_apply.PolicyRun, 'render', boom)
    folder, policy = no_file(tmp_path)
    lines = _lines_of(folder, policy)
    assert [(line.id, line.status) for line in lines] == [('openshell.unchecked', 'warn')]
    assert 'unexpected thing' in lines[0].message and lines[0].fix


def test_a_bad_deployment_folder_is_a_line(monkeypatch, tmp_path):
    monkeypatch.setattr(_schema, 'available', lambda: True)
    lines = _openshell.OpenShellCheck().lines(_ctx('relative/folder', tmp_path / POLICY))
    assert [line.id for line in lines] == ['openshell.unchecked']


def test_the_render_is_the_modules_own_at_its_defaults():
    params = _openshell.render_params()
    assert params['plain_http'] is True and params['binaries'] == ['/**'] and params['private_destinations'] == []
    assert params['dest'] is None and params['compare_with'] is None and params['gateway'] is None


# --- wiring: the doctor, its options, the module ---------------------------------------------------------

def test_the_doctor_runs_the_check_and_the_catalogue_has_its_group():
    assert isinstance(_doctor.default_checks()['openshell'], _openshell.OpenShellCheck)
    assert ('openshell', 'OpenShell policy') in _lines.GROUPS
    ids = [item[0] for item in _lines.LINES if item[1] == 'openshell']
    assert ids == ['openshell.policy', 'openshell.policy_differs', 'openshell.policy_missing',
                   'openshell.untranslatable', 'openshell.package_missing', 'openshell.unchecked',
                   'openshell.gateway_policy', 'openshell.gateway_differs', 'openshell.gateway_unread']


def test_the_option_reaches_the_context():
    options = _doctor.DoctorOptions('p', '/opt/pi-dispatch/egress', 'i', openshell_policy='/x/policy.yaml')
    assert DoctorContext.build(None, options).openshell_policy == '/x/policy.yaml'
    assert DoctorContext.build(None, _doctor.DoctorOptions('p', '/d', 'i')).openshell_policy is None


def test_canary_options_pass_it_on():
    params = dict(proxy_name='p', probe_image='i', provider_host='a.test', deny_host='b.test', listed_host=None,
                  probe_timeout=10, probe_start_grace=20, docker_host=None, endpoint_timeout=15, models_json=None,
                  isolation=True, job_network_pool='10.0.0.0/8', job_network_prefix=28, sweep=True, firewall=True,
                  firewall_chain_prefix='PI-EGRESS', firewall_probe=True, fallback_probe_image=None,
                  decision_log_dir=None, openshell_policy='/d/openshell-policy.yaml')
    assert _doctor.canary_options(params, '/d').openshell_policy == '/d/openshell-policy.yaml'


class _Spec(Exception):
    pass


def test_egress_canary_documents_the_option_as_its_argument_spec(monkeypatch):
    import yaml
    captured = {}

    def capture(self, argument_spec, **kwargs):
        captured.update(argument_spec)
        raise _Spec()

    monkeypatch.setattr(basic.AnsibleModule, '__init__', capture)
    with pytest.raises(_Spec):
        _canary.main()
    doc = yaml.safe_load(_canary.DOCUMENTATION)['options']['openshell_policy']
    assert captured['openshell_policy'] == dict(type='path')
    assert doc['type'] == 'path' and 'default' not in doc and doc['version_added'] == '0.8.0'


# --- the gateway's sandbox policy, fetched from a fake gateway (the package's own gRPC stubs) -----------------

def _gateway_ctx(folder, endpoint, sandbox='job-1', workspace='pi', **tls):
    gateway = dict(endpoint=endpoint, sandbox=sandbox, workspace=workspace, ca=None, cert=None, key=None, timeout=5)
    gateway.update(tls)
    return DoctorContext(client=None, proxy='p', deploy_dir=str(folder), probe_image='i', pid=1, environ={},
                         openshell_gateway=gateway)


def _rendered(folder):
    return _apply.PolicyRun(_openshell.render_params(), _deployment.Layout(str(folder))).render()


@needs_schema
def test_the_gateway_policy_that_reads_back_as_rendered_passes(tmp_path, fake_gateway):
    folder = _folder(tmp_path)
    fake_gateway.policies[('pi', 'job-1')] = _rendered(folder)
    lines = _openshell.OpenShellCheck().lines(_gateway_ctx(folder, fake_gateway.endpoint))
    assert [(line.id, line.status) for line in lines] == [('openshell.gateway_policy', 'ok')], lines
    assert 'gateway %s, sandbox job-1 in workspace pi' % fake_gateway.endpoint in lines[0].message
    assert fake_gateway.requests == [('pi', 'job-1')]


@needs_schema
def test_a_gateway_policy_missing_one_endpoint_is_named(tmp_path, fake_gateway):
    folder = _folder(tmp_path)
    served = _rendered(folder)
    for rule in served.network_policies.values():
        kept = [e for e in rule.endpoints if e.host != 'registry.npmjs.org']
        del rule.endpoints[:]
        rule.endpoints.extend(kept)
    fake_gateway.policies[('pi', 'job-1')] = served
    lines = _openshell.OpenShellCheck().lines(_gateway_ctx(folder, fake_gateway.endpoint))
    assert [(line.id, line.status) for line in lines] == [('openshell.gateway_differs', 'fail')], lines
    assert 'registry.npmjs.org:443: missing' in lines[0].message, lines[0].message
    assert 'openshell policy set' in lines[0].fix


@needs_schema
@pytest.mark.parametrize('sandbox, serve, words', [
    ('job-2', False, 'NOT_FOUND: sandbox job-2 not found'),
    ('job-3', True, "no policy (configuration_error: 'not admitted yet')"),
])
def test_a_gateway_that_cannot_give_the_policy_fails_naming_why(tmp_path, fake_gateway, sandbox, serve, words):
    folder = _folder(tmp_path)
    if serve:
        fake_gateway.serve('pi', sandbox, None)
    lines = _openshell.OpenShellCheck().lines(_gateway_ctx(folder, fake_gateway.endpoint, sandbox=sandbox))
    assert [(line.id, line.status) for line in lines] == [('openshell.gateway_unread', 'fail')], lines
    assert words in lines[0].message and 'no job there runs under a policy read back' in lines[0].message


@needs_schema
def test_an_unreadable_tls_file_is_a_gateway_line_before_any_call(tmp_path, fake_gateway):
    folder = _folder(tmp_path)
    lines = _openshell.OpenShellCheck().lines(_gateway_ctx(folder, fake_gateway.endpoint,
                                                           ca=str(tmp_path / 'absent-ca.pem')))
    assert [(line.id, line.status) for line in lines] == [('openshell.gateway_unread', 'fail')], lines
    assert 'absent-ca.pem cannot be read' in lines[0].message and fake_gateway.requests == []


@needs_schema
def test_the_file_and_the_gateway_give_a_line_each(tmp_path, fake_gateway):
    folder = _folder(tmp_path)
    policy = _deploy(folder)
    fake_gateway.policies[('pi', 'job-1')] = _rendered(folder)
    ctx = _gateway_ctx(folder, fake_gateway.endpoint)
    ctx.openshell_policy = str(policy)
    lines = _openshell.OpenShellCheck().lines(ctx)
    assert [line.id for line in lines] == ['openshell.policy', 'openshell.gateway_policy']


def test_the_gateway_options_reach_the_context():
    params = dict(openshell_gateway='gw.test:8080', openshell_sandbox='s', openshell_workspace='w',
                  openshell_gateway_ca='/ca.pem', openshell_gateway_cert=None, openshell_gateway_key=None,
                  openshell_gateway_timeout=7.0)
    gateway = _doctor.openshell_gateway_options(params)
    assert gateway == dict(endpoint='gw.test:8080', sandbox='s', workspace='w', ca='/ca.pem', cert=None, key=None,
                           timeout=7.0)
    options = _doctor.DoctorOptions('p', '/d', 'i', openshell_gateway=gateway)
    assert DoctorContext.build(None, options).openshell_gateway == gateway
    assert _doctor.openshell_gateway_options(dict(openshell_gateway=None)) is None
    assert DoctorContext.build(None, _doctor.DoctorOptions('p', '/d', 'i')).openshell_gateway is None
