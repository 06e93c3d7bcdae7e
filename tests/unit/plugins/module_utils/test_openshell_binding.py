"""The job's credential provider on the openshell venue: every endpoint bound to it, and a lost binding refused.

Seed 000: "every endpoint of the policy is bound to the job's provider, so a placeholder in the agent's
environment becomes the real value only in a request to a host the policy admits". The render
(_openshell/translate.py ``bind``), the module (egress_openshell_policy ``credential_provider``), the read-back
comparison and the doctor's two comparisons (``openshell_credential_provider``), each against OpenShell's own
``SandboxPolicy`` message from the pinned ``openshell`` package.
"""

import json

import pytest


from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import doctor as _doctor
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import openshell as _openshell
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.context import DoctorContext
from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import apply as _apply
from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import readback as _readback
from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import schema as _schema
from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import translate as _translate
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import allowlist as _allowlist
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import endpoints as _endpoints
from ansible_collections.pi_dispatch.egress.plugins.modules import egress_openshell_policy as _module

needs_schema = pytest.mark.skipif(not _schema.available(), reason='the openshell package (%s) is not installed'
                                  % _schema.REQUIREMENT)

SEED = ('api.anthropic.com          # the provider: every turn of every job\n'
        '.github.com                # your forge: the push and the pull request\n'
        "registry.npmjs.org         # only when a job installs the serviced repo's own dependencies\n")
DECLARATION = {'version': 1, 'endpoints': [
    {'id': 'mac-ollama', 'host': 'host.docker.internal', 'port': 11434, 'slots': 2, 'keyless': True}]}
PROVIDER = 'job-1234-anthropic'
# Every (host, port) the seed renders: three listed lines (443 and 80; the wildcard two hosts) and the endpoint.
SEED_ENDPOINTS = 2 + 4 + 2 + 1


def _folder(tmp_path):
    folder = tmp_path / 'egress'
    folder.mkdir()
    (folder / 'egress-allowlist.conf').write_text(SEED)
    (folder / 'model-endpoints.json').write_text(json.dumps(DECLARATION))
    return folder


def _translate_seed(provider):
    return _translate.translate(_allowlist.parse(SEED, '/d/egress-allowlist.conf'),
                                _endpoints.validate(DECLARATION, '/d/model-endpoints.json'),
                                credential_provider=provider)


def _bindings(message):
    """(host, port) -> the provider its endpoint is bound to ('' when unbound), from the parsed message."""
    return dict(((e.host, e.port), e.credential_binding.provider)
                for rule in message.network_policies.values() for e in rule.endpoints)


# --- the render ----------------------------------------------------------------------------------------------

@needs_schema
@pytest.mark.parametrize('provider', [PROVIDER, 'anthropic', 'github-app.prod', 'x' * 253, 'проверка'])
def test_every_endpoint_is_bound_to_the_provider(provider):
    translation = _translate_seed(provider)
    message = _schema.parse(translation.policy, 'the rendered policy')
    bindings = _bindings(message)
    assert len(bindings) >= 8
    assert set(bindings.values()) == {provider}
    assert translation.provider == provider
    # the file round-trips with the binding
    for fmt in ('yaml', 'json'):
        again = _schema.parse(_readback.loads(_readback.dumps(translation.policy, fmt), 'p.' + fmt), 'again')
        assert _readback.compare(message, again) == []


@needs_schema
def test_without_a_provider_nothing_is_bound():
    message = _schema.parse(_translate_seed(None).policy, 'x')
    assert set(_bindings(message).values()) == {''}
    assert all(not e.HasField('credential_binding')
               for rule in message.network_policies.values() for e in rule.endpoints)


@pytest.mark.parametrize('name, words', [
    ('', 'is not a provider name'),
    (' anthropic', 'is not a provider name'),
    ('anthropic\n', 'is not a provider name'),
    ('anth\tropic', 'is not a provider name'),
    ('x' * 254, 'at most 253 bytes'),
    ('é' * 127, 'at most 253 bytes'),  # 254 bytes in UTF-8
    (7, 'is not a provider name'),
    (['anthropic'], 'is not a provider name'),
])
def test_a_bad_provider_name_is_refused_naming_the_option(name, words):
    with pytest.raises(ValueError) as err:
        _translate.check_provider(name)
    assert str(err.value).startswith('credential_provider: ') and words in str(err.value)
    with pytest.raises(ValueError) as err:
        _translate.check_provider(name, 'openshell_credential_provider')
    assert str(err.value).startswith('openshell_credential_provider: ')


def test_no_provider_is_no_binding():
    assert _translate.check_provider(None) is None


# --- the read back -------------------------------------------------------------------------------------------

@needs_schema
@pytest.mark.parametrize('read_back_provider', [None, 'someone-else'])
def test_a_policy_that_lost_or_changed_the_binding_differs_in_every_endpoint(read_back_provider):
    rendered = _schema.parse(_translate_seed(PROVIDER).policy, 'rendered')
    read_back = _schema.parse(_translate_seed(read_back_provider).policy, 'read back')
    differences = _readback.compare(rendered, read_back)
    assert len(differences) == len(_bindings(rendered))
    assert all(d.kind == 'changed' for d in differences)
    text = '; '.join(str(d) for d in differences)
    assert 'api.anthropic.com:443: changed' in text and 'host.docker.internal:11434: changed' in text
    assert '"credential_binding": {"provider": "%s"}' % PROVIDER in text


@needs_schema
def test_one_endpoint_unbound_is_the_one_difference():
    rendered = _schema.parse(_translate_seed(PROVIDER).policy, 'rendered')
    read_back = _schema.parse(_translate_seed(PROVIDER).policy, 'read back')
    for rule in read_back.network_policies.values():
        for endpoint in rule.endpoints:
            if (endpoint.host, endpoint.port) == ('registry.npmjs.org', 443):
                endpoint.ClearField('credential_binding')
    differences = _readback.compare(rendered, read_back)
    assert [(d.host, d.port, d.kind) for d in differences] == [('registry.npmjs.org', 443, 'changed')]


# --- the module ----------------------------------------------------------------------------------------------


@needs_schema
def test_the_module_binds_and_refuses_a_read_back_without_the_binding(tmp_path, run_module):
    folder = _folder(tmp_path)
    unbound = tmp_path / 'unbound.yaml'
    kind, result = run_module(_module.main, dict(deploy_dir=str(folder), dest=str(unbound)))
    assert kind == 'exit', result
    kind, result = run_module(_module.main, dict(deploy_dir=str(folder), credential_provider=PROVIDER,
                                                 dest=str(tmp_path / 'bound.yaml')))
    assert kind == 'exit', result
    endpoints = [e for r in result['policy']['network_policies'].values() for e in r['endpoints']]
    assert len(endpoints) == SEED_ENDPOINTS
    assert all(e['credential_binding'] == {'provider': PROVIDER} for e in endpoints)
    assert 'provider: "%s"' % PROVIDER in (tmp_path / 'bound.yaml').read_text()
    kind, result = run_module(_module.main, dict(deploy_dir=str(folder), credential_provider=PROVIDER,
                                                 compare_with=str(unbound)))
    assert kind == 'fail' and _readback.READBACK_DIFFERS in result['msg']
    assert 'api.anthropic.com:443: changed' in result['msg']
    assert len(result['differences']) == SEED_ENDPOINTS


@needs_schema
def test_the_module_refuses_a_bad_provider_and_writes_nothing(tmp_path, run_module):
    folder = _folder(tmp_path)
    dest = tmp_path / 'p.yaml'
    kind, result = run_module(_module.main, dict(deploy_dir=str(folder), credential_provider=' x', dest=str(dest)))
    assert kind == 'fail' and result['msg'].startswith('credential_provider: ') and not dest.exists()


# --- the doctor ----------------------------------------------------------------------------------------------

def _deploy(folder, provider):
    params = _openshell.render_params(provider)
    params.update(dest=str(folder / 'openshell-policy.yaml'))
    _apply.PolicyRun(params, _deployment.Layout(str(folder))).run()
    return folder / 'openshell-policy.yaml'


def _lines(folder, policy, provider):
    ctx = DoctorContext(client=None, proxy='p', deploy_dir=str(folder), probe_image='i', pid=1, environ={},
                        openshell_policy=str(policy), openshell_credential_provider=provider)
    return _openshell.OpenShellCheck().lines(ctx)


@needs_schema
@pytest.mark.parametrize('deployed, expected, status', [
    (PROVIDER, PROVIDER, 'ok'),
    (None, None, 'ok'),
    (None, PROVIDER, 'fail'),       # the deployed policy lost the binding
    (PROVIDER, None, 'fail'),       # the doctor expects none: a binding it was not told of is a difference too
    ('someone-else', PROVIDER, 'fail'),
])
def test_the_doctor_renders_with_the_provider(tmp_path, deployed, expected, status):
    folder = _folder(tmp_path)
    lines = _lines(folder, _deploy(folder, deployed), expected)
    assert [line.status for line in lines] == [status], lines
    if status == 'fail':
        assert lines[0].id == 'openshell.policy_differs'
        assert 'in %d endpoints' % SEED_ENDPOINTS in lines[0].message


@needs_schema
def test_the_doctor_compares_a_gateways_policy_with_the_binding(tmp_path, fake_gateway):
    folder = _folder(tmp_path)
    unbound = _apply.PolicyRun(_openshell.render_params(), _deployment.Layout(str(folder))).render()
    bound = _apply.PolicyRun(_openshell.render_params(PROVIDER), _deployment.Layout(str(folder))).render()
    gateway = dict(endpoint=fake_gateway.endpoint, sandbox='job-1', workspace='pi', ca=None, cert=None, key=None,
                   timeout=5)
    ctx = DoctorContext(client=None, proxy='p', deploy_dir=str(folder), probe_image='i', pid=1, environ={},
                        openshell_gateway=gateway, openshell_credential_provider=PROVIDER)
    fake_gateway.policies[('pi', 'job-1')] = unbound
    lines = _openshell.OpenShellCheck().lines(ctx)
    assert [(line.id, line.status) for line in lines] == [('openshell.gateway_differs', 'fail')], lines
    assert 'registry.npmjs.org:443: changed' in lines[0].message
    fake_gateway.policies[('pi', 'job-1')] = bound
    lines = _openshell.OpenShellCheck().lines(ctx)
    assert [(line.id, line.status) for line in lines] == [('openshell.gateway_policy', 'ok')], lines


def test_the_doctor_option_is_checked_and_passed_on():
    params = dict(proxy_name='p', probe_image='i', provider_host='a.test', deny_host='b.test', listed_host=None,
                  probe_timeout=10, probe_start_grace=20, docker_host=None, endpoint_timeout=15, models_json=None,
                  isolation=True, job_network_pool='10.0.0.0/8', job_network_prefix=28, sweep=True, firewall=True,
                  firewall_chain_prefix='PI-EGRESS', firewall_probe=True, fallback_probe_image=None,
                  decision_log_dir=None, openshell_credential_provider=PROVIDER)
    _doctor.check_canary_options(params)
    options = _doctor.canary_options(params, '/d')
    assert options.openshell_credential_provider == PROVIDER
    assert DoctorContext.build(None, options).openshell_credential_provider == PROVIDER
    with pytest.raises(ValueError) as err:
        _doctor.check_canary_options(dict(params, openshell_credential_provider='bad\nname'))
    assert str(err.value).startswith('openshell_credential_provider: ')
