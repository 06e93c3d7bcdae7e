"""egress_proxy's run (_proxy/deploy.py): the refusals, the decision, the consent and the result, no daemon."""

import hashlib
import os

import docker
import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import rules as _rules
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import deploy as _deploy
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import reload as _reload
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import shard_clone as _shard_clone
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import shards as _shards
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import spec as _proxy_spec

DEFAULTS = dict(
    state='started', name='pi-dispatch-egress-proxy', image='pi-dispatch-egress-proxy:latest', deploy_dir=None,
    network='pi-dispatch-egress-out', network_internal=False, extra_hosts=[], mount_endpoints=True,
    health_interval=5, wait=True, wait_timeout=60, allow_cut_jobs=False, memory='512m', pids_limit=256,
    nofile=16384, log_max_size='10m', log_max_file=3, shard_bound=None, decision_log=False, decision_log_dir=None,
    decision_log_max_size='10m', decision_log_keep=5)


def _params(deploy_dir, **kw):
    return dict(DEFAULTS, deploy_dir=deploy_dir, **kw)


def _not_found(what):
    return docker.errors.NotFound('%s not found' % what)


class _Exec(object):
    def __init__(self, exit_code, output):
        self.exit_code = exit_code
        self.output = output.encode('utf-8')


class FakeContainer(object):
    """A proxy container as the SDK shows it; exec_run answers the digest and allowlist checks."""

    def __init__(self, attrs, allowlist_rc=0, inside=None, health='healthy'):
        self.attrs = attrs
        self.name = attrs['Name'].lstrip('/')
        self.allowlist_rc = allowlist_rc
        self.inside = inside or {}
        self.health = health
        self.calls = []

    @property
    def status(self):
        return self.attrs['State']['Status']

    def exec_run(self, cmd, stdout=True, stderr=True):
        self.calls.append(cmd[0])
        if cmd[:1] == ['sha256sum']:
            return _Exec(0, ''.join('%s  %s\n' % (self.inside[d], d) for d in cmd[2:] if d in self.inside))
        if cmd[:1] == ['cmp']:
            return _Exec(self.allowlist_rc, '')
        return _Exec(0, '')

    def reload(self):
        if self.attrs['State']['Running']:
            self.attrs['State']['Health'] = {'Status': self.health}

    def start(self):
        self.calls.append('start')
        self.attrs['State'].update(Status='running', Running=True)
        if self.health != 'healthy':
            self.attrs['State'].update(Status='exited', Running=False)

    def logs(self, tail=20):
        return b'squid: FATAL something'


class FakeClient(object):
    """containers/images/networks/api as the SDK has them, for one proxy and its shards."""

    def __init__(self, container=None, image=True, shards=(), network=None):
        client = self
        # The engine answers as Docker Engine 20.10 does (_common/venue.py asks once).
        self.version = lambda: {'Version': '20.10.24', 'ApiVersion': '1.41', 'Components': [
            {'Name': 'Engine', 'Version': '20.10.24'}]}
        self.info = lambda: {'SecurityOptions': ['name=seccomp,profile=default']}
        network = container is not None if network is None else network
        self.proxy = container
        self.created = []
        self.api_calls = []

        class Containers(object):
            def get(self, name):
                if client.proxy is None or name != client.proxy.name:
                    raise _not_found(name)
                return client.proxy

            def create(self, image, **kwargs):
                client.created.append(kwargs['name'])
                client.proxy = FakeContainer(dict(
                    Name='/' + kwargs['name'], State=dict(Status='created', Running=False, Paused=False),
                    Config={}, HostConfig={}, Mounts=[], NetworkSettings={'Networks': {}}),
                    health=client.health_after_start)
                return client.proxy

        class Images(object):
            def get(self, name):
                if not image:
                    raise _not_found(name)
                return type('Image', (), {'id': 'sha256:img'})()

        class Networks(object):
            def list(self, names=None):
                if not network:
                    return []
                return [type('Network', (), {'name': names[0], 'attrs': {'Internal': False},
                                             'reload': lambda self: None})()]

            def create(self, name, **kwargs):
                client.api_calls.append(('create network', name))

        class Api(object):
            def inspect_container(self, name):
                if client.proxy is None:
                    raise _not_found(name)
                return client.proxy.attrs

            def containers(self, all=False, filters=None):
                return [dict(Names=['/' + s], State='running', Status='Up (healthy)',
                             Labels={_shards.LABEL_SHARD_OF: 'pi-dispatch-egress-proxy',
                                     _shards.LABEL_SHARD_INDEX: '1'},
                             NetworkSettings={'Networks': dict((n, {}) for n in nets)}) for s, nets in shards]

            def __getattr__(self, name):
                return lambda *a, **k: client.api_calls.append((name,) + a)

        self.containers, self.images, self.networks, self.api = Containers(), Images(), Networks(), Api()
        self.health_after_start = 'healthy'


def _attrs(spec, running=True, networks=None, labels=None, status=None):
    """docker inspect of a container made from ``spec`` (the shape test_proxy.py checks field by field)."""
    return {
        'Id': 'cid', 'Name': '/' + spec['name'], 'Image': 'sha256:img',
        'State': {'Status': status or ('running' if running else 'exited'), 'Running': running, 'Paused': False,
                  'Health': {'Status': 'healthy'}},
        'Mounts': [{'Type': 'bind', 'Source': s, 'Destination': d, 'RW': False} for s, d in spec['mounts']],
        'HostConfig': {'SecurityOpt': list(spec['security_opt']), 'CapDrop': list(spec['cap_drop']),
                       'ReadonlyRootfs': True, 'Tmpfs': dict(spec['tmpfs']), 'Sysctls': dict(spec['sysctls']),
                       'Memory': spec['memory'], 'MemorySwap': spec['memory'], 'PidsLimit': spec['pids_limit'],
                       'Ulimits': [{'Name': u['name'], 'Soft': u['soft'], 'Hard': u['hard']} for u in spec['ulimits']],
                       'LogConfig': {'Type': 'json-file', 'Config': dict(spec['log_config']['config'])},
                       'RestartPolicy': {'Name': 'unless-stopped'}, 'ExtraHosts': list(spec['extra_hosts'])},
        'Config': {'Healthcheck': {'Test': spec['healthcheck']['test'], 'Interval': spec['healthcheck']['interval'],
                                   'Timeout': spec['healthcheck']['timeout'], 'Retries': spec['healthcheck']['retries'],
                                   'StartPeriod': spec['healthcheck']['start_period']},
                   'Cmd': list(spec['command']), 'Labels': labels if labels is not None else dict(spec['labels'])},
        'NetworkSettings': {'Networks': dict((n, {}) for n in (networks or ['pi-dispatch-egress-out']))},
    }


@pytest.fixture
def deploy_dir(tmp_path):
    folder = str(tmp_path / 'egress')
    _deployment.apply(folder)
    return folder


def _run(deploy_dir, client=None, container=None, check_mode=True, diff=False, **kw):
    params = _params(deploy_dir, **kw)
    paths = _deployment.paths(deploy_dir) if deploy_dir else None
    spec = _deploy.wanted_spec(params, paths)
    run = _deploy.ProxyDeploy(client or FakeClient(container), params, spec, paths, check_mode=check_mode, diff=diff)
    return run, spec


def _matching(deploy_dir, **kw):
    spec = _run(deploy_dir)[1]
    return FakeContainer(_attrs(spec, **kw))


@pytest.mark.parametrize('options, fragment', [
    (dict(extra_hosts=['db']), "extra_hosts entry 'db' is not name:address"),
    (dict(extra_hosts=[':1.2.3.4']), 'is not name:address'),
    (dict(extra_hosts=['db:']), 'is not name:address'),
    (dict(health_interval=0), 'at least 1 second'),
    (dict(wait_timeout=0), 'at least 1 second'),
    (dict(extra_hosts=['db:10.0.0.2']), None),
])
def test_options_refused_before_the_daemon(options, fragment):
    if fragment is None:
        _deploy.check_options(_params('/d', **options))
        return
    with pytest.raises(_proxy_spec.ProxyError, match=fragment):
        _deploy.check_options(_params('/d', **options))


@pytest.mark.parametrize('decision_log, rules_v3, folder, wanted', [
    (True, True, None, 'DEPLOY/decisions'),
    (True, True, '/var/log/egress', '/var/log/egress'),
    (True, False, None, None),        # older rules keep the proxy's shape until the refresh
    (False, True, None, None),
])
def test_the_decision_log_is_mounted_only_for_rules_that_write_it(deploy_dir, decision_log, rules_v3, folder, wanted):
    paths = _deployment.paths(deploy_dir)
    with open(paths['rules']) as handle:
        assert _rules.writes_decision_log(handle.read())   # the packaged rules are version 3
    if not rules_v3:
        with open(paths['rules'], 'w') as handle:
            handle.write('http_port 3128\n')
    settings = _deploy.decision_log_settings(
        _params(deploy_dir, decision_log=decision_log, decision_log_dir=folder), paths)
    if wanted is None:
        assert settings is None
    else:
        assert settings == dict(dir=wanted.replace('DEPLOY', deploy_dir), max_size='10m', keep=5)
    assert _deploy.decision_log_settings(_params(None, decision_log=True), None) is None


def test_a_foreign_container_is_refused_and_nothing_changes(deploy_dir):
    spec = _run(deploy_dir)[1]
    foreign = FakeContainer(dict(_attrs(spec, labels={}), Mounts=[]))
    run, _spec = _run(deploy_dir, container=foreign, check_mode=False)
    with pytest.raises(_proxy_spec.ProxyError, match='exists but is not a pi-dispatch egress proxy'):
        run.run()
    assert run.result['actions'] == [] and not run.result['changed']


@pytest.mark.parametrize('breakage, state, error, fragment', [
    ('missing', 'started', _proxy_spec.ProxyError, 'Mount source(s) missing: '),
    ('symlink', 'started', _proxy_spec.ProxyError, 'is a symlink; the proxy mounts it as a single file'),
    ('allowlist', 'started', _reload.SourcesRefused, 'The allowlist is refused'),
    ('allowlist', 'stopped', None, None),     # a stopped proxy reads nothing: no allowlist check
    ('image', 'started', _proxy_spec.ProxyError, 'Image pi-dispatch-egress-proxy:latest is not on this daemon'),
])
def test_what_squid_must_not_start_on_is_refused_before_any_action(deploy_dir, tmp_path, breakage, state, error,
                                                                   fragment):
    paths = _deployment.paths(deploy_dir)
    client = FakeClient(image=breakage != 'image')
    if breakage == 'missing':
        os.remove(paths['guard_conf'])
    elif breakage == 'symlink':
        real = str(tmp_path / 'real-endpoints.conf')
        os.rename(paths['endpoints_conf'], real)
        os.symlink(real, paths['endpoints_conf'])
    elif breakage == 'allowlist':
        with open(paths['allowlist'], 'a') as handle:
            handle.write('not a host name!\n')
    run, _spec = _run(deploy_dir, client=client, state=state)
    if error is None:
        run.run()
        assert run.result['actions'] == ['create network pi-dispatch-egress-out', 'create']
        return
    with pytest.raises(error) as info:
        run.run()
    assert fragment in str(info.value)
    if error is _reload.SourcesRefused:
        assert info.value.problems and info.value.problems[0]['path'] == paths['allowlist']
    assert run.result['actions'] == [] and client.created == []


@pytest.mark.parametrize('state, wanted', [
    ('started', ['create network pi-dispatch-egress-out', 'create', 'start']),
    ('present', ['create network pi-dispatch-egress-out', 'create', 'start']),
    ('stopped', ['create network pi-dispatch-egress-out', 'create']),
    ('restarted', ['create network pi-dispatch-egress-out', 'create', 'start']),
    ('absent', []),
])
def test_no_proxy_yet_in_check_mode(deploy_dir, state, wanted):
    client = FakeClient()
    run, _spec = _run(deploy_dir, client=client, state=state, diff=True)
    result = run.run()
    assert result['actions'] == wanted
    assert result['changed'] is bool(wanted)
    assert ('diff' in result) is (state != 'absent')
    assert client.created == [] and client.api_calls == []
    assert result['container'] == {} and result['jobs_cut'] == 0 and result['shards'] == []


@pytest.mark.parametrize('state, allowlist_rc, wanted, changed', [
    ('started', 0, [], False),
    ('present', 0, [], False),
    ('started', 1, ['reconfigure'], True),       # a hand-edited allowlist is reread, no job is cut
    ('restarted', 1, ['restart'], True),         # only started/present compare the allowlist
    ('reloaded', 0, ['reconfigure'], True),
])
def test_a_matching_proxy(deploy_dir, state, allowlist_rc, wanted, changed):
    container = _matching(deploy_dir)
    container.allowlist_rc = allowlist_rc
    run, _spec = _run(deploy_dir, container=container, state=state)
    result = run.run()
    assert result['differences'] == [] and result['stale_mounts'] == []
    assert result['actions'] == wanted
    assert result['allowlist_changed'] is (allowlist_rc == 1 and state in ('started', 'present'))
    assert bool(result['messages']) is result['allowlist_changed']
    assert result['changed'] is changed
    assert result['container']['name'] == 'pi-dispatch-egress-proxy'


def _stale(deploy_dir, job_networks=()):
    paths = _deployment.paths(deploy_dir)
    container = _matching(deploy_dir, networks=['pi-dispatch-egress-out'] + list(job_networks))
    with open(paths['allowlist'], 'rb') as handle:
        disk = hashlib.sha256(handle.read()).hexdigest()
    container.inside = {_rules.CONTAINER_ALLOWLIST: '0' * 64 if disk != '0' * 64 else '1' * 64}
    return container, paths


@pytest.mark.parametrize('jobs, consent, refused, wanted', [
    ([], False, False, ['remove', 'create', 'start']),
    (['pi-job-a1-net'], False, True, []),
    (['pi-job-a1-net'], True, False, ['remove', 'create', 'start', 'reconnect']),
])
def test_a_stale_mount_replaces_the_proxy_with_consent_for_its_jobs(deploy_dir, jobs, consent, refused, wanted):
    container, paths = _stale(deploy_dir, jobs)
    run, _spec = _run(deploy_dir, container=container, allow_cut_jobs=consent, diff=True)
    if refused:
        with pytest.raises(_proxy_spec.ProxyError) as info:
            run.run()
        assert str(info.value).startswith('Refused, nothing changed: the replacement of pi-dispatch-egress-proxy '
                                          'would cut 1 job attached to it (pi-job-a1-net')
        assert 'What differs: mounts: %s was replaced on disk' % os.path.realpath(paths['allowlist']) \
            in str(info.value)
        assert run.result['refused'] is True
        assert 'refused: Refused' in run.result['diff']['after_header']
    else:
        run.run()
        assert 'refused' not in run.result
    assert run.result['stale_mounts'] == [os.path.realpath(paths['allowlist'])]
    assert run.result['jobs_cut'] == len(jobs)
    assert run.result['actions'] == wanted


def test_a_proxy_that_cannot_be_compared_is_still_managed(deploy_dir):
    container = _matching(deploy_dir)

    def broken(cmd, **_kw):
        raise RuntimeError('exec refused')
    container.exec_run = broken
    run, _spec = _run(deploy_dir, container=container)
    result = run.run()
    assert result['actions'] == [] and result['allowlist_changed'] is False
    assert [m.split(':')[0] for m in result['messages']] == [
        "could not compare the mounted files with the proxy's view",
        'could not compare the allowlist with what squid last read']


@pytest.mark.parametrize('state, consent, refused, shard_step', [
    ('restarted', False, True, 'restart'),
    ('restarted', True, False, 'restart'),
    ('stopped', False, True, 'stop'),
    ('started', False, False, None),
])
def test_the_shards_follow_the_proxy_and_their_jobs_need_consent(deploy_dir, state, consent, refused, shard_step):
    container = _matching(deploy_dir)
    client = FakeClient(container, shards=[('pi-dispatch-egress-proxy-shard-1', ['pi-job-b2-net'])])
    run, _spec = _run(deploy_dir, client=client, state=state, allow_cut_jobs=consent)
    if refused:
        with pytest.raises(_proxy_spec.ProxyError, match='following the proxy, pi-dispatch-egress-proxy-shard-1'):
            run.run()
        assert run.result['refused'] is True and run.result['actions'] == []
    else:
        run.run()
    wanted = [dict(name='pi-dispatch-egress-proxy-shard-1', action=shard_step, jobs=1)] if shard_step else []
    assert run.result['shards'] == wanted
    assert run.result['jobs_cut'] == (1 if shard_step else 0)
    if shard_step and not refused:
        assert run.result['actions'][-1] == '%s shard pi-dispatch-egress-proxy-shard-1' % shard_step


@pytest.mark.parametrize('health, wait, fragment', [
    ('healthy', True, None),
    ('unhealthy', True, 'The proxy did not become healthy within 60s (last status: exited). Its log ends with:\n'
                        'squid: FATAL something'),
    ('unhealthy', False, None),
])
def test_a_created_proxy_is_waited_for(deploy_dir, health, wait, fragment):
    client = FakeClient()
    client.health_after_start = health
    run, _spec = _run(deploy_dir, client=client, check_mode=False, wait=wait)
    if fragment:
        with pytest.raises(_proxy_spec.ProxyError) as info:
            run.run()
        assert str(info.value) == fragment
    else:
        run.run()
        assert set(run.result['container']) == set(_deploy.CONTAINER_KEYS)
    assert client.created == ['pi-dispatch-egress-proxy']
    assert ('create network', 'pi-dispatch-egress-out') in client.api_calls
    assert run.result['actions'] == ['create network pi-dispatch-egress-out', 'create', 'start']


def test_a_shard_that_does_not_follow_fails_the_run_naming_it(deploy_dir, monkeypatch):
    container = _matching(deploy_dir)
    client = FakeClient(container, shards=[('pi-dispatch-egress-proxy-shard-1', [])])
    monkeypatch.setattr(_shard_clone, 'apply_plan', lambda _c, _p, plan: [
        dict(name=m.name, action=step, jobs_cut=0, error='boom') for m, step in plan])
    container.restart = lambda timeout=10: None
    run, _spec = _run(deploy_dir, client=client, state='restarted', check_mode=False, wait=False)
    with pytest.raises(_proxy_spec.ProxyError, match=r'but 1 shard\(s\) did not follow it: '
                                                     r'pi-dispatch-egress-proxy-shard-1 \(restart: boom\)'):
        run.run()
    assert run.result['shards'][0]['error'] == 'boom'
