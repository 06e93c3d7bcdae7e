"""egress_guard's run (_proxy/guard_apply.py): the gateways, the render, the write and the reload; no daemon."""

import docker
import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import files as _files
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import guard as _guard
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import guard_apply as _apply

PROXY = 'pi-dispatch-egress-proxy'


class _Exec(object):
    def __init__(self, exit_code, output=b''):
        self.exit_code = exit_code
        self.output = output


class FakeProxy(object):
    def __init__(self, status='running', hosts='172.17.0.1\thost.docker.internal\n', parse_rc=0, reconfigure_rc=0):
        self.name = PROXY
        self.status = status
        self.hosts = hosts
        self.parse_rc = parse_rc
        self.reconfigure_rc = reconfigure_rc
        self.ran = []
        self.attrs = {'State': {'Running': status == 'running'},
                      'NetworkSettings': {'Networks': {'pi-dispatch-egress-out': {'Gateway': '172.20.0.1'}}}}

    def reload(self):
        pass

    def exec_run(self, cmd, stdout=True, stderr=True):
        if cmd[:1] == ['cat']:
            return _Exec(0, self.hosts.encode('utf-8'))
        step = 'parse' if cmd[:3] == ['squid', '-k', 'parse'] else 'reconfigure'
        self.ran.append(step)
        return _Exec(self.parse_rc if step == 'parse' else self.reconfigure_rc, b'said no')


class FakeClient(object):
    def __init__(self, proxy=None, fail=None):
        # Docker Engine 20.10 (_common/venue.py asks once: the host's name is host.docker.internal)
        self.version = lambda: {'Version': '20.10.24', 'ApiVersion': '1.41',
                                'Components': [{'Name': 'Engine', 'Version': '20.10.24'}]}
        self.info = lambda: {'SecurityOptions': []}

        class Containers(object):
            def get(self, name):
                if fail:
                    raise fail
                if proxy is None:
                    raise docker.errors.NotFound('no such container')
                return proxy

        class Networks(object):
            def list(self, names=None):
                return [type('Net', (), {'name': 'bridge', 'reload': lambda self: None,
                                         'attrs': {'IPAM': {'Config': [{'Gateway': '172.17.0.1'}]}}})()]

        class Api(object):
            def inspect_container(self, name):
                raise docker.errors.NotFound('no such container')

            def containers(self, all=False, filters=None):
                return []

        self.containers, self.networks, self.api = Containers(), Networks(), Api()


@pytest.fixture
def paths(tmp_path):
    folder = str(tmp_path / 'egress')
    _deployment.apply(folder)
    return _deployment.paths(folder)


def _params(**kw):
    return dict(dict(proxy_name=PROXY, private_destinations=['192.168.50.0/24'], job_pool=_guard.DEFAULT_POOL,
                     client_max_connections=_guard.DEFAULT_CLIENT_MAX_CONNECTIONS, reload=True), **kw)


def _read(path):
    with open(path, 'rb') as handle:
        return handle.read()


@pytest.mark.parametrize('proxy, reloads, warned', [
    ('running', True, None),
    ('exited', False, 'The proxy pi-dispatch-egress-proxy is not running, so it was not reloaded'),
    (None, False, 'The proxy pi-dispatch-egress-proxy is not running, so it was not reloaded'),
])
@pytest.mark.parametrize('check_mode', [True, False])
def test_a_changed_guard_is_written_and_the_running_proxy_reloaded(paths, proxy, reloads, warned, check_mode):
    before = _read(paths['guard_conf'])
    container = FakeProxy(status=proxy) if proxy else None
    run = _apply.GuardApply(_params(), paths, check_mode=check_mode, diff=True)
    result = run.run(FakeClient(container))
    assert result['changed'] is True and result['opened'] == ['192.168.50.0/24']
    assert result['host_gateway'] == '172.17.0.1'
    assert result['gateways'] == (['172.20.0.1'] if proxy else [])
    assert result['reloaded'] is reloads
    assert result['actions'] == ['write %s' % paths['guard_conf']] + (
        ['squid -k parse, then squid -k reconfigure in %s' % PROXY] if reloads else [])
    assert (run.warnings[0].startswith(warned) if warned else run.warnings == [])
    assert result['diff']['before'] == before.decode('utf-8')
    assert (_read(paths['guard_conf']) == before) is check_mode
    assert ('loaded' in result) is (reloads and not check_mode)
    if container is not None:
        assert container.ran == (['parse', 'reconfigure'] if reloads and not check_mode else [])


def test_the_same_guard_again_changes_nothing(paths):
    _apply.GuardApply(_params(), paths, check_mode=False).run(FakeClient(FakeProxy()))
    result = _apply.GuardApply(_params(), paths, check_mode=False).run(FakeClient(FakeProxy()))
    assert result['changed'] is False and result['actions'] == [] and result['reloaded'] is False


def test_a_host_gateway_that_is_no_address_is_left_out_with_a_warning(paths):
    run = _apply.GuardApply(_params(), paths)
    result = run.run(FakeClient(FakeProxy(hosts='gateway\thost.docker.internal\n')))
    assert result['host_gateway'] is None
    assert run.warnings[0] == ("host.docker.internal is 'gateway' inside pi-dispatch-egress-proxy, not an address; "
                               "it is not in the guard")


@pytest.mark.parametrize('params, fragment', [
    (dict(private_destinations=['x']), 'x'),
    (dict(client_max_connections=0), 'egress_proxy_client_max_connections'),
])
def test_a_refused_destination_writes_nothing(paths, params, fragment):
    before = _read(paths['guard_conf'])
    run = _apply.GuardApply(_params(**params), paths, check_mode=False)
    with pytest.raises(_apply.GuardFailed) as info:
        run.run(FakeClient(FakeProxy()))
    assert fragment in str(info.value) and info.value.extra == {}
    assert run.result['actions'] == [] and _read(paths['guard_conf']) == before


def test_a_daemon_that_fails_writes_nothing_and_says_whether_to_retry(paths):
    run = _apply.GuardApply(_params(), paths, check_mode=False)
    with pytest.raises(_apply.GuardFailed) as info:
        run.run(FakeClient(fail=docker.errors.APIError('503 Server Error: busy')))
    assert str(info.value).endswith(' Nothing was written.') and set(info.value.extra) == {'retryable'}


def test_a_missing_guard_file_names_the_layout(paths):
    import os
    os.remove(paths['guard_conf'])
    with pytest.raises(_apply.GuardFailed, match='Lay out the deployment folder first'):
        _apply.GuardApply(_params(), paths).run(FakeClient(FakeProxy()))


@pytest.mark.parametrize('parse_rc, reconfigure_rc, ending, kept', [
    (1, 0, 'The previous %s was written back.', True),
    (0, 1, 'The include is written; reload with docker exec pi-dispatch-egress-proxy squid -k reconfigure.', False),
])
def test_a_refused_reload(paths, parse_rc, reconfigure_rc, ending, kept):
    before = _read(paths['guard_conf'])
    run = _apply.GuardApply(_params(), paths, check_mode=False)
    with pytest.raises(_apply.GuardFailed) as info:
        run.run(FakeClient(FakeProxy(parse_rc=parse_rc, reconfigure_rc=reconfigure_rc)))
    assert str(info.value).endswith(ending % paths['guard_conf'] if '%s' in ending else ending)
    assert (_read(paths['guard_conf']) == before) is kept and run.result['reloaded'] is False


def test_a_failed_write_fails_the_run(paths, monkeypatch):
    def refuse(path, content, fallback=None):
        raise _files.InPlaceError('%s has other hard links' % path)
    monkeypatch.setattr(_files, 'write_in_place', refuse)
    proxy = FakeProxy()
    with pytest.raises(_apply.GuardFailed, match='has other hard links'):
        _apply.GuardApply(_params(), paths, check_mode=False).run(FakeClient(proxy))
    assert proxy.ran == []
