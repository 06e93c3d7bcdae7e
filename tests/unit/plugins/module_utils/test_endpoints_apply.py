"""model_endpoints' run (_proxy/endpoints_apply.py): declare, render, decide the reload, write, reload; no daemon."""

import os

import docker
import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import rules as _rules
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import endpoints_apply as _apply

ENDPOINT = dict(id='lan-vllm', host='192.168.1.20', port=8000, slots=4)
PROXY = 'pi-dispatch-egress-proxy'


class _Exec(object):
    def __init__(self, exit_code, output=b''):
        self.exit_code = exit_code
        self.output = output


class FakeProxy(object):
    def __init__(self, include, status='running', parse_rc=0, reconfigure_rc=0, mounts=None):
        self.name = PROXY
        self.status = status
        self.parse_rc = parse_rc
        self.reconfigure_rc = reconfigure_rc
        self.ran = []
        self.attrs = {'Mounts': mounts if mounts is not None else [
            {'Destination': _rules.CONTAINER_ENDPOINTS, 'Source': include}]}

    def exec_run(self, cmd, stdout=True, stderr=True):
        if cmd[:3] == ['squid', '-k', 'parse']:
            self.ran.append('parse')
            return _Exec(self.parse_rc, b'FATAL: bad line')
        self.ran.append('reconfigure')
        return _Exec(self.reconfigure_rc, b'reconfigure said no')


class FakeClient(object):
    def __init__(self, proxy=None, fail=None):
        client = self

        class Containers(object):
            def get(self, name):
                if fail:
                    raise fail
                if proxy is None:
                    raise docker.errors.NotFound('no such container')
                return proxy

        class Api(object):
            def inspect_container(self, name):
                raise docker.errors.NotFound('no such container')

            def containers(self, all=False, filters=None):
                return []

        self.containers, self.api, self.connected = Containers(), Api(), 0
        self.connect = lambda: (setattr(client, 'connected', client.connected + 1), client)[1]


@pytest.fixture
def layout(tmp_path):
    folder = str(tmp_path / 'egress')
    _deployment.apply(folder)
    return _deployment.Layout(folder)


def _params(**kw):
    return dict(dict(declaration=None, endpoints=[ENDPOINT], state='present', proxy_name=PROXY, reload=True), **kw)


def _include(layout):
    with open(_apply.EndpointsApply(_params(), layout).include, 'rb') as handle:
        return handle.read()


def test_a_refused_declaration_names_its_problems_and_writes_nothing(layout):
    before = _include(layout)
    client = FakeClient()
    run = _apply.EndpointsApply(_params(endpoints=[dict(ENDPOINT, port='x')]), layout)
    with pytest.raises(_apply.EndpointsFailed) as info:
        run.run(client.connect)
    assert info.value.extra['problems'] and info.value.extra['problems'][0]['key'] == 'port'
    assert run.result['endpoints'] == [] and run.result['actions'] == []
    assert _include(layout) == before and client.connected == 0


@pytest.mark.parametrize('endpoints, state, changed, skipped', [
    ([ENDPOINT], 'validated', False, 'state is validated'),
    ([], 'validated', False, ''),
    ([], 'present', False, ''),        # the laid-out include is the empty render: nothing to do
])
def test_nothing_to_write_or_validated_contacts_nobody(layout, endpoints, state, changed, skipped):
    before = _include(layout)
    client = FakeClient()
    result = _apply.EndpointsApply(_params(endpoints=endpoints, state=state), layout).run(client.connect)
    assert result['changed'] is changed and result['reload_skipped'] == skipped
    assert result['include_changed'] is bool(endpoints)
    assert result['actions'] == [] and not result['reloaded']
    assert client.connected == 0 and _include(layout) == before


@pytest.mark.parametrize('reload, proxy, skipped, warned', [
    (False, 'running', 'reload is false', None),
    (True, None, 'proxy pi-dispatch-egress-proxy does not exist', 'Reload skipped: proxy'),
    (True, 'exited', 'proxy pi-dispatch-egress-proxy is not running (exited)', 'Reload skipped: proxy'),
    (True, 'running', '', None),
    (True, 'other-mount', '', 'The proxy mounts /elsewhere.conf as its model-endpoints include'),
    (True, 'no-mount', '', 'The proxy does not mount'),
])
@pytest.mark.parametrize('check_mode', [True, False])
def test_the_reload_is_decided_before_anything_is_written(layout, reload, proxy, skipped, warned, check_mode):
    include = _apply.EndpointsApply(_params(), layout).include
    inode = os.stat(include).st_ino
    before = _include(layout)
    container = None
    if proxy:
        mounts = {'other-mount': [{'Destination': _rules.CONTAINER_ENDPOINTS, 'Source': '/elsewhere.conf'}],
                  'no-mount': []}.get(proxy)
        container = FakeProxy(include, status='exited' if proxy == 'exited' else 'running', mounts=mounts)
    client = FakeClient(container)
    run = _apply.EndpointsApply(_params(reload=reload), layout, check_mode=check_mode, diff=True)
    result = run.run(client.connect)
    reloads = not skipped
    assert result['changed'] is True and result['include_changed'] is True
    assert result['reload_skipped'] == skipped
    assert result['reloaded'] is reloads
    assert result['actions'] == ['write %s' % include] + (
        ['squid -k parse', 'squid -k reconfigure'] if reloads else [])
    assert client.connected == (1 if reload else 0)
    assert (warned is None and run.warnings == []) or (warned and run.warnings[0].startswith(warned))
    assert result['diff']['after_header'] == include + (
        ' (then squid -k reconfigure in %s)' % PROXY if reloads else ' (no reload: %s)' % skipped)
    assert result['diff']['before'] == before.decode('utf-8')
    if check_mode:
        assert _include(layout) == before and 'loaded' not in result
        assert container is None or container.ran == []
    else:
        assert _include(layout) != before and os.stat(include).st_ino == inode == result['inode']
        assert ('loaded' in result) is reloads
        assert container is None or container.ran == (['parse', 'reconfigure'] if reloads else [])


def test_a_daemon_that_fails_the_lookup_writes_nothing(layout):
    before = _include(layout)
    client = FakeClient(fail=docker.errors.APIError('503 Server Error: busy'))
    run = _apply.EndpointsApply(_params(), layout)
    with pytest.raises(_apply.EndpointsFailed) as info:
        run.run(client.connect)
    assert str(info.value).startswith('Inspecting container pi-dispatch-egress-proxy failed')
    assert str(info.value).endswith(' Nothing was written.')
    assert set(info.value.extra) == {'retryable'}
    assert run.result['actions'] == [] and _include(layout) == before


@pytest.mark.parametrize('parse_rc, reconfigure_rc, message, kept', [
    (1, 0, 'squid refused its rules (squid -k parse exited 1), so the proxy was not reloaded', True),
    (0, 1, 'squid -k reconfigure exited 1: reconfigure said no The include is written; reload with docker exec '
           'pi-dispatch-egress-proxy squid -k reconfigure.', False),
])
def test_a_refused_reload_puts_the_previous_include_back_or_says_how_to_reload(
        layout, parse_rc, reconfigure_rc, message, kept):
    before = _include(layout)
    include = _apply.EndpointsApply(_params(), layout).include
    client = FakeClient(FakeProxy(include, parse_rc=parse_rc, reconfigure_rc=reconfigure_rc))
    run = _apply.EndpointsApply(_params(), layout)
    with pytest.raises(_apply.EndpointsFailed) as info:
        run.run(client.connect)
    assert str(info.value).startswith(message)
    if kept:
        assert str(info.value).endswith('The previous include was written back.')
    assert (_include(layout) == before) is kept
    assert run.result['reloaded'] is False and info.value.extra == {}


def test_a_failed_write_reports_no_reload(layout, monkeypatch):
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import files as _files

    def refuse(path, content, fallback=None):
        raise _files.InPlaceError('%s has other hard links' % path)
    monkeypatch.setattr(_files, 'write_in_place', refuse)
    include = _apply.EndpointsApply(_params(), layout).include
    client = FakeClient(FakeProxy(include))
    run = _apply.EndpointsApply(_params(), layout)
    with pytest.raises(_apply.EndpointsFailed, match='has other hard links'):
        run.run(client.connect)
    assert run.result['reloaded'] is False and client.containers.get(PROXY).ran == []
