"""egress_proxy with ``unit``: the lifecycle steps a systemd unit takes over (_proxy/lifecycle.py, issue 29)."""

import docker
import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import deploy as _deploy
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import lifecycle as _proxy
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import reload as _reload
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import spec as _proxy_spec
from ansible_collections.pi_dispatch.egress.plugins.modules import egress_proxy

UNIT = 'pi-dispatch-egress-proxy.service'


@pytest.mark.parametrize('actions, steps', [
    ([], []),
    (['create'], [('create', 'restart')]),
    (['create', 'start'], [('create', 'restart'), ('start', None)]),
    (['remove', 'create'], [('remove', None), ('create', 'restart')]),
    (['remove', 'create', 'start', 'reconnect'],
     [('remove', None), ('create', 'restart'), ('start', None), ('reconnect', None)]),
    (['start'], [('start', 'restart')]),
    (['restart'], [('restart', 'restart')]),
    (['unpause', 'restart'], [('unpause', None), ('restart', 'restart')]),
    (['stop'], [('stop', 'stop')]),
    (['unpause', 'stop'], [('unpause', None), ('stop', 'stop')]),
    (['remove'], [('remove', 'stop')]),
    (['reconfigure'], [('reconfigure', None)]),
    (['unpause', 'reconfigure'], [('unpause', None), ('reconfigure', None)]),
])
def test_each_action_is_the_units_or_the_engines(actions, steps):
    assert _proxy.unit_steps(actions) == steps


class FakeNetwork(object):
    def __init__(self, name, log):
        self.name, self.log = name, log

    def reload(self):
        pass

    def connect(self, container):
        self.log.append(('connect', self.name, container.name))


class FakeContainer(object):
    def __init__(self, name, log, generation):
        self.name, self.log, self.generation = name, log, generation

    def __getattr__(self, verb):
        if verb in ('remove', 'start', 'stop', 'restart', 'unpause'):
            return lambda **_kw: self.log.append(('engine', verb, self.generation))
        raise AttributeError(verb)


class FakeClient(object):
    """The engine as the unit leaves it: ``systemctl restart`` makes a new container, ``stop`` removes it."""

    def __init__(self, networks=()):
        self.log = []
        self.generation = 1
        self.running = True
        self.known = dict((name, FakeNetwork(name, self.log)) for name in networks)
        client = self

        class Containers(object):
            @staticmethod
            def get(name):
                if not client.running:
                    raise docker.errors.NotFound('no such container')
                return FakeContainer(name, client.log, client.generation)

        class Networks(object):
            @staticmethod
            def list(names):
                return [client.known[n] for n in names if n in client.known]

        self.containers, self.networks = Containers(), Networks()

    def systemctl(self, verb, unit):
        self.log.append(('systemctl', verb, unit))
        if verb == 'restart':
            self.generation += 1
            self.running = True
        elif verb == 'stop':
            self.running = False


def manager(client, check_mode=False, unit=UNIT):
    spec = dict(name='pi-dispatch-egress-proxy', image='x', mounts=[])
    return _proxy.ProxyManager(client, spec, check_mode=check_mode, unit=unit, systemctl=client.systemctl)


def test_a_replace_is_one_restart_of_the_unit_and_the_job_networks_follow_once():
    client = FakeClient(networks=['pi-job-a-net', 'pi-job-b-net'])
    run = manager(client)
    old = client.containers.get('pi-dispatch-egress-proxy')
    new = run.apply(['remove', 'create', 'start', 'reconnect'], old, ['pi-job-a-net', 'pi-job-b-net'])
    assert new.generation == 2
    assert client.log == [('systemctl', 'restart', UNIT),
                          ('connect', 'pi-job-a-net', 'pi-dispatch-egress-proxy'),
                          ('connect', 'pi-job-b-net', 'pi-dispatch-egress-proxy')]
    assert run.actions == ['remove', 'create', 'start', 'reconnect']
    assert 'systemctl restart %s' % UNIT in run.messages and 'reconnected job network pi-job-a-net' in run.messages


def test_a_restart_of_the_unit_reconnects_the_job_networks_and_a_gone_one_is_said():
    client = FakeClient(networks=['pi-job-a-net'])
    run = manager(client)
    run.apply(['restart'], client.containers.get('pi-dispatch-egress-proxy'), ['pi-job-a-net', 'pi-job-gone-net'])
    assert client.log == [('systemctl', 'restart', UNIT), ('connect', 'pi-job-a-net', 'pi-dispatch-egress-proxy')]
    assert 'job network pi-job-gone-net is gone; not reconnected' in run.messages


@pytest.mark.parametrize('actions', [['stop'], ['remove']])
def test_a_stop_or_removal_stops_the_unit_and_leaves_no_container(actions):
    client = FakeClient()
    run = manager(client)
    assert run.apply(actions, client.containers.get('pi-dispatch-egress-proxy'), []) is None
    assert client.log == [('systemctl', 'stop', UNIT)]


def test_unpause_and_reload_act_on_the_running_container(monkeypatch):
    reloads = []
    monkeypatch.setattr(_reload, 'reload_family', lambda _client, container: reloads.append(container.generation))
    client = FakeClient()
    run = manager(client)
    run.apply(['unpause', 'reconfigure'], client.containers.get('pi-dispatch-egress-proxy'), [])
    assert client.log == [('engine', 'unpause', 1)] and reloads == [1]


def test_check_mode_asks_nothing_of_systemd():
    client = FakeClient(networks=['pi-job-a-net'])
    run = manager(client, check_mode=True)
    run.apply(['remove', 'create', 'reconnect'], client.containers.get('pi-dispatch-egress-proxy'), ['pi-job-a-net'])
    assert client.log == [] and run.actions == ['remove', 'create', 'reconnect']


def test_without_a_unit_the_engine_does_it():
    client = FakeClient()
    run = manager(client, unit=None)
    run.apply(['restart'], client.containers.get('pi-dispatch-egress-proxy'), [])
    assert client.log == [('engine', 'restart', 1)]


def test_a_unit_that_starts_no_container_is_an_error_naming_it():
    client = FakeClient()

    def restart_fails_silently(verb, unit):
        client.log.append(('systemctl', verb, unit))
        client.running = False
    run = _proxy.ProxyManager(client, dict(name='pi-dispatch-egress-proxy'), unit=UNIT,
                              systemctl=restart_fails_silently)
    with pytest.raises(_proxy_spec.ProxyError) as info:
        run.apply(['start'], client.containers.get('pi-dispatch-egress-proxy'), [])
    assert 'no container pi-dispatch-egress-proxy runs' in str(info.value)
    assert 'journalctl -u %s' % UNIT in str(info.value)


def params(**over):
    base = dict(units='quadlet', name='pi-dispatch-egress-proxy', image='pi-dispatch-egress-proxy:latest',
                deploy_dir='/srv/egress', network='pi-dispatch-egress-out', network_internal=True, extra_hosts=[],
                health_interval=5, memory='512m', pids_limit=256, nofile=16384, log_max_size='10m',
                log_max_file=3, credentials_include=None, shard_bound=None, credentials_network='x',
                wait_timeout=60, mount_endpoints=True)
    base.update(over)
    return base


@pytest.mark.parametrize('over, words', [
    (dict(credentials_include='/srv/egress/egress-credentials.conf'), 'do not carry credentials_include'),
    (dict(shard_bound=50), 'do not carry shard_bound'),
])
def test_what_the_units_do_not_carry_is_refused(over, words):
    with pytest.raises(_proxy_spec.ProxyError) as info:
        egress_proxy.unit_spec(params(**over), None)
    assert words in str(info.value)


def test_the_wanted_shape_is_the_units():
    spec = egress_proxy.unit_spec(params(), None)
    assert spec['restart_policy'] == 'no' and spec['image'] == 'localhost/pi-dispatch-egress-proxy:latest'
    assert not spec.get('decision_log')


class FakeModule(object):
    def __init__(self, rc, err, scope='system', account=None):
        self.rc, self.err, self.calls = rc, err, []
        self.params = dict(units_scope=scope, units_account=account)

    def get_bin_path(self, name, required=False):
        return '/usr/bin/' + name

    def run_command(self, argv):
        self.calls.append(argv)
        return self.rc, '', self.err


def test_a_failing_systemctl_names_the_unit_and_where_to_look():
    module = FakeModule(1, 'Job for x.service failed.\n')
    with pytest.raises(_proxy_spec.ProxyError) as info:
        egress_proxy.systemctl(module)('restart', UNIT)
    assert module.calls == [['/usr/bin/systemctl', 'restart', UNIT]]
    message = str(info.value)
    assert 'systemctl restart %s failed (exit 1): Job for x.service failed.' % UNIT in message
    assert 'journalctl -u %s' % UNIT in message
    ok = FakeModule(0, '')
    egress_proxy.systemctl(ok)('daemon-reload')
    assert ok.calls == [['/usr/bin/systemctl', 'daemon-reload']]


def test_the_accounts_units_go_through_its_user_manager_and_the_message_says_so():
    module = FakeModule(1, 'Failed to connect to bus\n', scope='user', account='pi-egress')
    with pytest.raises(_proxy_spec.ProxyError) as info:
        egress_proxy.systemctl(module)('restart', UNIT)
    assert module.calls == [['/usr/bin/systemctl', '--user', '-M', 'pi-egress@', 'restart', UNIT]]
    message = str(info.value)
    assert 'systemctl --user -M pi-egress@ restart %s failed (exit 1)' % UNIT in message, message
    assert 'journalctl --user -M pi-egress@ -u %s' % UNIT in message, message


class FakeUnits(object):
    """The units' writer as ``units_apply.apply`` answers: ``changed`` says whether the files differed."""

    def __init__(self, fmt, changed, log):
        self.log, self.changed = log, changed
        self.units = _deploy.Units(name=UNIT, fmt=fmt, write=self.write,
                                   systemctl=lambda verb, unit=None: log.append(('systemctl', verb, unit)))

    def write(self, state, check_mode):
        self.log.append(('write', state, check_mode))
        files = ['/etc/containers/systemd/pi-dispatch-egress-proxy.container'] if self.changed else []
        return dict(changed=self.changed, units_dir='/etc/containers/systemd', units=[],
                    written=files if state == 'present' else [], removed=files if state == 'absent' else [])


def deploy_run(units, check_mode=False):
    run = _deploy.ProxyDeploy(None, dict(name='pi-dispatch-egress-proxy'), dict(name='pi-dispatch-egress-proxy'),
                              None, check_mode=check_mode, units=units.units)
    return run


@pytest.mark.parametrize('fmt, changed, state, check_mode, log, action', [
    ('quadlet', True, 'present', False,
     [('write', 'present', False), ('systemctl', 'daemon-reload', None)], 'write units'),
    ('systemd', True, 'present', False,
     [('write', 'present', False), ('systemctl', 'daemon-reload', None), ('systemctl', 'enable', UNIT)],
     'write units'),
    ('systemd', True, 'absent', False,
     [('write', 'absent', False), ('systemctl', 'daemon-reload', None)], 'remove units'),
    ('quadlet', True, 'present', True, [('write', 'present', True)], 'write units'),
    ('quadlet', False, 'present', False, [('write', 'present', False)], None),
])
def test_units_are_read_by_systemd_only_when_written(fmt, changed, state, check_mode, log, action):
    seen = []
    run = deploy_run(FakeUnits(fmt, changed, seen), check_mode=check_mode)
    run.write_units(state)
    assert seen == log
    assert run.result['actions'] == ([action] if action else [])
    assert set(run.result['units']) == {'units_dir', 'written', 'removed', 'units'}


def test_a_container_removed_while_waiting_for_health_is_said_removed(monkeypatch):
    """A unit runs the proxy with --rm: a squid that exits takes its container with it while the module waits."""
    monkeypatch.setattr(_proxy._venue, 'run_health_check', lambda client, name: None)

    class Gone(object):
        name = 'pi-dispatch-egress-proxy'

        @staticmethod
        def reload():
            raise docker.errors.NotFound('no such container')
    assert manager(FakeClient()).wait_healthy(Gone(), timeout=5) == 'removed'


@pytest.mark.parametrize('decision_log, mounted', [(True, True), (False, False)])
def test_the_units_carry_the_decision_log_as_the_engine_path_does(tmp_path, decision_log, mounted):
    """Issue 44: a venue must not lose a security feature silently; the units mount the log's folder and carry
    its rotation exactly as egress_proxy's own container does."""
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._podman import quadlet as _quadlet
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._podman import systemd_units as _systemd
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import rules as _rules
    deploy = tmp_path / 'egress'
    paths = _deployment.paths(str(deploy))
    (deploy / 'deploy').mkdir(parents=True)
    with open(paths['rules'], 'w') as handle:
        handle.write(_rules.packaged_rules())
    over = dict(deploy_dir=str(deploy), decision_log=decision_log, decision_log_dir=None,
                decision_log_max_size='10m', decision_log_keep=5)
    spec = egress_proxy.unit_spec(params(**over), paths)
    engine = _deploy.wanted_spec(dict(params(**over), units=None), paths)
    assert bool(spec.get('log_mount')) is mounted
    assert spec.get('log_mount') == engine.get('log_mount')
    assert spec['environment'] == engine['environment']
    quadlet = _quadlet.container_unit(spec).splitlines()
    service = ' '.join(_systemd.run_options(spec))
    if mounted:
        rw = '%s:/var/log/pi-dispatch:rw' % (deploy / 'decisions')
        assert 'Volume=' + rw in quadlet and '--volume=' + rw in service
        assert any(line.startswith('Environment=') and 'DECISION' in line for line in quadlet)
    else:
        assert not [line for line in quadlet if line.endswith(':rw')] and '/var/log/pi-dispatch' not in service
