"""A sandbox's policy fetched from a gateway (_openshell/gateway.py), against a fake gateway on 127.0.0.1.

The fake is a real gRPC server built from the ``openshell`` package's own service stubs
(``OpenShellServicer``, ``add_OpenShellServicer_to_server``): the real protocol, a fake server, on this machine.
"""

import socket

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import apply as _apply
from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import gateway as _gateway
from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import schema as _schema
from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import translate as _translate
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import allowlist as _allowlist
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment

try:
    import grpc
except ImportError:  # the package's own dependency: absent exactly when openshell is
    grpc = None

pytestmark = pytest.mark.skipif(grpc is None or not _schema.available(),
                                reason='the openshell package (%s) is not installed' % _schema.REQUIREMENT)

SEED = 'api.anthropic.com\n.github.com\nregistry.npmjs.org\n'


def _policy(text=SEED):
    return _translate.translate(_allowlist.parse(text, '/d/egress-allowlist.conf')).policy


def test_the_policy_is_fetched_through_the_package_stub(fake_gateway):
    fake_gateway.serve('pi', 'job-1', _policy())
    where, message = _gateway.fetch(fake_gateway.endpoint, 'job-1', 'pi', timeout=5)
    assert where == 'gateway %s, sandbox job-1 in workspace pi' % fake_gateway.endpoint
    assert message == _schema.parse(_policy(), 'rendered')
    assert fake_gateway.requests == [('pi', 'job-1')]


def test_an_unknown_sandbox_names_the_status(fake_gateway):
    with pytest.raises(_gateway.GatewayError) as err:
        _gateway.fetch(fake_gateway.endpoint, 'job-2', 'pi', timeout=5)
    assert ('sandbox job-2 in workspace pi: GetSandboxConfig failed (NOT_FOUND: sandbox job-2 not found)'
            in str(err.value))


def test_a_sandbox_with_no_policy_yet_is_refused(fake_gateway):
    fake_gateway.serve('pi', 'job-3', None)
    with pytest.raises(_gateway.GatewayError) as err:
        _gateway.fetch(fake_gateway.endpoint, 'job-3', 'pi', timeout=5)
    assert "answered with no policy (configuration_error: 'not admitted yet')" in str(err.value)


def test_a_gateway_that_does_not_answer_names_the_status():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        port = sock.getsockname()[1]
    with pytest.raises(_gateway.GatewayError) as err:
        _gateway.fetch('127.0.0.1:%d' % port, 'job-1', 'pi', timeout=2)
    assert 'GetSandboxConfig failed (UNAVAILABLE' in str(err.value) or 'DEADLINE_EXCEEDED' in str(err.value)


@pytest.mark.parametrize('files, words', [
    (dict(cert_path='/c.pem'), 'a client certificate and its key go together'),
    (dict(ca_path='/nonexistent/ca.pem'), 'The gateway CA /nonexistent/ca.pem cannot be read'),
])
def test_bad_tls_files_are_refused_before_any_call(files, words):
    with pytest.raises(_gateway.GatewayError) as err:
        _gateway.channel('127.0.0.1:1', **files)
    assert words in str(err.value)


def _run(tmp_path, endpoint, text=SEED):
    folder = tmp_path / 'egress'
    folder.mkdir()
    (folder / 'egress-allowlist.conf').write_text(text)
    params = dict(binaries=None, private_destinations=[], plain_http=True, dest=None, format='yaml',
                  compare_with=None, gateway=endpoint, sandbox='job-1', workspace='pi', gateway_timeout=5,
                  gateway_ca=None, gateway_cert=None, gateway_key=None)
    return _apply.PolicyRun(params, _deployment.Layout(str(folder)))


def test_a_sandbox_whose_policy_reads_back_the_same_passes(fake_gateway, tmp_path):
    fake_gateway.serve('pi', 'job-1', _policy())
    run = _run(tmp_path, fake_gateway.endpoint)
    assert run.run()['differences'] == []


def test_a_sandbox_whose_policy_differs_by_one_endpoint_is_refused_naming_it(fake_gateway, tmp_path):
    fake_gateway.serve('pi', 'job-1', _policy(SEED + 'evil.example.com\n'))
    run = _run(tmp_path, fake_gateway.endpoint)
    with pytest.raises(_apply.PolicyFailed) as err:
        run.run()
    text = str(err.value)
    assert text.startswith('openshell-policy-readback-differs: the policy read back from gateway %s, sandbox job-1 '
                           'in workspace pi differs from what the sources render in 2 endpoints;'
                           % fake_gateway.endpoint)
    assert '  - evil.example.com:80: admitted by the policy read back, which the sources do not admit' in text
    assert [(d['endpoint'], d['kind']) for d in run.result['differences']] == [
        ('evil.example.com:80', 'added'), ('evil.example.com:443', 'added')]


def test_a_gateway_error_fails_the_run_and_writes_nothing(fake_gateway, tmp_path):
    run = _run(tmp_path, fake_gateway.endpoint)
    run.params['dest'] = str(tmp_path / 'p.yaml')
    with pytest.raises(_apply.PolicyFailed) as err:
        run.run()
    assert 'NOT_FOUND' in str(err.value) and 'Nothing was written.' in str(err.value)
    assert not (tmp_path / 'p.yaml').exists()
