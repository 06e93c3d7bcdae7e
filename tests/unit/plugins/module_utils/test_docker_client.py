"""The one Docker client layer: connection options, TLS, retries, error mapping (no daemon)."""

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc


@pytest.mark.parametrize('options, fragment', [
    (dict(), None),
    (dict(docker_host='unix:///run/docker.sock'), None),
    (dict(docker_host='tcp://engine.test:2376', tls=True), None),
    (dict(docker_host='tcp://engine.test:2376', validate_certs=True, ca_path='/ca.pem'), None),
    (dict(docker_host='tcp://engine.test:2376', tls=True, client_cert='/c.pem', client_key='/k.pem'), None),
    (dict(docker_host='tcp://engine.test:2376', client_cert='/c.pem'), 'client_cert and client_key go together'),
    (dict(docker_host='tcp://engine.test:2376', client_key='/k.pem'), 'client_cert and client_key go together'),
    (dict(docker_host='unix:///run/docker.sock', tls=True), 'TLS needs a tcp:// docker_host'),
    (dict(docker_host='unix:///run/docker.sock', ca_path='/ca.pem'), 'TLS needs a tcp:// docker_host'),
    (dict(docker_host='tcp://engine.test:2376', validate_certs=True), 'validate_certs needs ca_path'),
    (dict(docker_timeout=0), 'docker_timeout 0 is not a number of seconds'),
    (dict(docker_retries=-1), 'docker_retries -1 is out of range'),
    (dict(docker_retries=11), 'docker_retries 11 is out of range'),
    (dict(docker_retries=0), None),
])
def test_connection_options_table(options, fragment):
    problem = dc.check_connection_options(options)
    if fragment is None:
        assert problem is None
    else:
        assert fragment in problem


def test_tls_off_unless_asked():
    assert dc.tls_config(dict(docker_host='tcp://engine.test:2375')) is None


@pytest.mark.skipif(dc.docker is None, reason='needs the Docker SDK')
def test_tls_config_carries_the_files(tmp_path):
    for name in ('ca.pem', 'c.pem', 'k.pem'):
        (tmp_path / name).write_text('x')
    cfg = dc.tls_config(dict(validate_certs=True, ca_path=str(tmp_path / 'ca.pem'),
                             client_cert=str(tmp_path / 'c.pem'), client_key=str(tmp_path / 'k.pem')))
    assert cfg.verify == str(tmp_path / 'ca.pem') or cfg.verify is True
    assert cfg.cert == (str(tmp_path / 'c.pem'), str(tmp_path / 'k.pem'))
    unverified = dc.tls_config(dict(tls=True))
    assert unverified.verify is False and unverified.cert is None


def test_argument_spec_adds_the_shared_options_without_touching_the_module_own():
    own = dict(name=dict(type='str'))
    spec = dc.argument_spec(own)
    assert own == dict(name=dict(type='str'))
    assert set(spec) == set(['name']) | set(dc.DOCKER_ARGUMENT_SPEC)
    assert set(dc.CONNECTION_KEYS) == set(['docker_host', 'docker_timeout', 'docker_retries', 'tls', 'validate_certs',
                                           'ca_path', 'client_cert', 'client_key'])


class _Clock(object):
    def __init__(self):
        self.slept = []

    def __call__(self, seconds):
        self.slept.append(seconds)


@pytest.mark.parametrize('failures, retries, retryable, calls, raised', [
    (0, 2, True, 1, False),      # first try answers
    (1, 2, True, 2, False),      # one transient failure, then the answer
    (2, 2, True, 3, False),      # the last retry answers
    (3, 2, True, 3, True),       # out of retries
    (1, 0, True, 1, True),       # no retries asked
    (1, 5, False, 1, True),      # not retryable: never repeated
])
def test_retry_table(failures, retries, retryable, calls, raised):
    made = []
    clock = _Clock()

    def call():
        made.append(1)
        if len(made) <= failures:
            raise dc.EngineError('busy', retryable=retryable)
        return 'answer'
    if raised:
        with pytest.raises(dc.EngineError):
            dc.retry(call, retries=retries, delay=1.0, sleep=clock)
    else:
        assert dc.retry(call, retries=retries, delay=1.0, sleep=clock) == 'answer'
    assert len(made) == calls
    assert clock.slept == [1.0 * n for n in range(1, len(clock.slept) + 1)]


class _Response(object):
    def __init__(self, status):
        self.status_code = status


@pytest.mark.skipif(dc.docker is None, reason='needs the Docker SDK')
@pytest.mark.parametrize('status, transient', [(500, True), (502, True), (503, True), (504, True),
                                               (404, False), (409, False), (400, False)])
def test_api_errors_are_transient_only_for_a_busy_daemon(status, transient):
    exc = dc.docker_errors.APIError('x', response=_Response(status))
    assert dc.is_transient(exc) is transient


GONE = ('no container with ID 6d89 found in database: no such container')


@pytest.mark.skipif(dc.docker is None, reason='needs the Docker SDK')
@pytest.mark.parametrize('status, explanation, not_found', [
    (404, 'No such container: x', True),   # Docker (NotFound)
    (500, GONE, True),                     # Podman, a container removed while it was read (a unit's --rm)
    (500, 'database is locked', False),    # busy: transient, not gone
    (409, GONE, False),                    # only the 500 Podman answers for it
])
def test_a_container_gone_is_not_found_on_both_engines(status, explanation, not_found):
    kind = dc.docker_errors.NotFound if status == 404 else dc.docker_errors.APIError
    exc = kind('x', response=_Response(status), explanation=explanation)
    assert dc.is_not_found(exc) is not_found
    if not_found:  # a read that may find nothing says nothing, not an engine error

        def gone():
            raise exc
        assert dc.read('Inspecting container x', gone, retries=0, missing=True) is None


@pytest.mark.parametrize('exc, transient', [
    (ConnectionResetError('reset'), True),
    (TimeoutError('slow'), True),
    (ValueError('bad'), False),
    (KeyError('k'), False),
])
def test_python_errors_transient_table(exc, transient):
    assert dc.is_transient(exc) is transient


def test_read_retries_a_transient_failure_then_maps_the_error():
    made = []

    def flaky():
        made.append(1)
        if len(made) == 1:
            raise ConnectionResetError('reset by peer')
        return 'ok'
    assert dc.read('Inspecting thing', flaky, retries=1) == 'ok'

    def broken():
        raise ValueError('the daemon said no')
    with pytest.raises(dc.EngineError) as caught:
        dc.read('Inspecting thing', broken, retries=3)
    assert str(caught.value) == 'Inspecting thing failed: the daemon said no'
    assert caught.value.retryable is False


@pytest.mark.skipif(dc.docker is None, reason='needs the Docker SDK')
def test_module_client_fails_with_the_fix_and_retryable_for_a_silent_daemon(tmp_path, fake_module):
    params = dict((key, None) for key in dc.CONNECTION_KEYS)
    params.update(docker_host='unix://%s' % (tmp_path / 'no.sock'), docker_timeout=2, docker_retries=0)
    module = fake_module(params)
    with pytest.raises(SystemExit):
        dc.module_client(module, dict(changed=False), suffix='Nothing was written.')
    assert module.failed['retryable'] is True
    assert 'does not answer' in module.failed['msg'] and str(tmp_path / 'no.sock') in module.failed['msg']
    assert module.failed['msg'].endswith('Nothing was written.')
    assert module.failed['changed'] is False


@pytest.mark.skipif(dc.docker is None, reason='needs the Docker SDK')
def test_module_client_refuses_bad_tls_options_before_connecting(fake_module):
    params = dict((key, None) for key in dc.CONNECTION_KEYS)
    params.update(docker_host='unix:///nowhere.sock', tls=True, docker_timeout=2)
    module = fake_module(params)
    with pytest.raises(SystemExit):
        dc.module_client(module)
    assert 'TLS needs a tcp:// docker_host' in module.failed['msg']
    assert module.failed['retryable'] is False


class _RemoveApi(object):
    def __init__(self, raises=None):
        self.raises, self.asked = raises, []

    def remove_container(self, name, force=False):
        self.asked.append((name, force))
        if self.raises is not None:
            raise self.raises


@pytest.mark.parametrize('raises, removed', [
    (None, True),
    (RuntimeError('404 Client Error: no such container'), False),
    (ConnectionError('the daemon went away'), False),
    (ValueError('anything at all'), False),
])
def test_remove_quietly_forces_and_never_raises(raises, removed):
    api = _RemoveApi(raises)
    assert dc.remove_quietly(api, 'probe-1') is removed
    assert api.asked == [('probe-1', True)]
