"""The doctor's wall time (issue 43): checks beside the canary in a bounded pool, the report in its fixed order,
the run's wall time said, and the MCP server endpoint's probe through the same retries as every other probe."""

import threading

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import canary as _doctor_canary
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import context as _doctor_context
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import doctor as _doctor
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import isolation as _doctor_isolation
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import lines as _doctor_lines
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import names as _doctor_names
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import probes as _doctor_probes
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import endpoints as _endpoints
from ansible_collections.pi_dispatch.egress.tests.unit.plugins.module_utils.fakes import EngineClient as Client

Line = _doctor_lines.Line
PROXY = 'pi-dispatch-egress-proxy'
OWN = 4242
RUNNING = {'State': {'Running': True}}
WAIT = 10  # seconds a test waits for an event that proves two checks ran at once (never reached when they do)
REPORT = ['probe_image', 'proxy', 'shards', 'rules', 'guard', 'include', 'squid', 'canary', 'route', 'overlay',
          'mcp', 'decisions', 'isolation', 'firewall', 'transparent', 'credentials', 'openshell', 'forge', 'sweep']


class Fake(_doctor_context.Check):
    """A check that records its call, runs ``effect`` and returns one line named for it."""

    def __init__(self, name, calls, effect=None):
        self.name, self.calls, self.effect = name, calls, effect

    def lines(self, ctx):
        self.calls.append(self.name)
        if self.effect is not None:
            self.effect(ctx)
        return [Line('canary.notrun', 'notrun', self.name)]


def fakes(calls, **effects):
    def set_attrs(ctx):
        ctx.attrs = RUNNING

    def set_isolation(ctx):
        ctx.isolation_lines = [Line('isolation.notrun', 'notrun', 'isolation')]
    effects.setdefault('proxy', set_attrs)
    effects.setdefault('canary', set_isolation)
    names = [name for name in REPORT if name != 'isolation']
    return dict((name, Fake(name, calls, effects.get(name))) for name in names)


def doctor(checks):
    return _doctor.Doctor(object(), _doctor.DoctorOptions('p', '/nonexistent', 'img', pid=7, environ={}),
                          checks=checks)


def test_the_checks_beside_the_canary_run_while_it_runs_and_keep_their_place_in_the_report():
    """The canary waits until a check beside it has started, and that check until the canary has ended: run one
    after another, the canary would wait out WAIT and the assertion on the event would fail."""
    overlay_started, canary_ended, waited = threading.Event(), threading.Event(), []

    def canary(ctx):
        waited.append(overlay_started.wait(WAIT))
        ctx.isolation_lines = [Line('isolation.notrun', 'notrun', 'isolation')]
        canary_ended.set()

    def overlay(ctx):
        overlay_started.set()
        waited.append(canary_ended.wait(WAIT))

    calls = []
    doc = doctor(fakes(calls, canary=canary, overlay=overlay))
    lines = doc.run()
    assert waited == [True, True]
    assert [line.message for line in lines] == REPORT  # the order of today, whichever ended first
    # before the canary, in order: what it needs, the sweep, and the guard; after it: the decision log, the firewall
    calls = [name for name in calls if name != 'squid']  # in its own thread since before issue 43
    assert calls[:6] == ['probe_image', 'proxy', 'shards', 'rules', 'sweep', 'guard']
    assert calls[-2:] == ['decisions', 'firewall']
    assert sorted(calls[6:-2]) == sorted(_doctor.BESIDE_CANARY + ('canary',))
    assert all('check.' + name in doc.timings for name in REPORT if name not in ('squid', 'isolation'))


class SplitFirewall(_doctor_context.Check):
    """A firewall check in two steps, as firewall.FirewallCheck: the presence now, the probe later."""

    def __init__(self, calls, probe):
        self.calls, self.probe = calls, probe

    def lines(self, ctx):
        raise AssertionError('the doctor runs a check with split() in its two steps')

    def split(self, ctx):
        self.calls.append('firewall.presence')

        def rest():
            self.calls.append('firewall.probe')
            self.probe()
            return [Line('canary.notrun', 'notrun', 'firewall.probe')]
        return [Line('canary.notrun', 'notrun', 'firewall.presence')], rest


def test_the_firewall_presence_is_read_before_the_canary_and_its_probe_runs_after_it():
    """A network outside the pool made since reads as stale (firewall.stale): the presence is read before the
    canary makes its network; the gateway probe runs after the canary ended, alone (beside it, a fresh-clone run
    once reported no probe line with the layer on)."""
    canary_ended, seen = threading.Event(), []

    def canary(ctx):
        ctx.isolation_lines = [Line('isolation.notrun', 'notrun', 'isolation')]
        canary_ended.set()

    def probe():
        seen.append(canary_ended.is_set())

    calls = []
    checks = fakes(calls, canary=canary)
    checks['firewall'] = SplitFirewall(calls, probe)
    doc = doctor(checks)
    lines = doc.run()
    assert seen == [True]
    calls = [name for name in calls if name != 'squid']
    assert calls[:7] == ['probe_image', 'proxy', 'shards', 'rules', 'sweep', 'guard', 'firewall.presence']
    assert calls.index('firewall.probe') > calls.index('canary')
    expected = []
    for name in REPORT:
        expected.extend(['firewall.presence', 'firewall.probe'] if name == 'firewall' else [name])
    assert [line.message for line in lines] == expected
    assert doc.timings['check.firewall'] > 0


def test_at_most_max_workers_checks_run_beside_the_canary_at_once():
    running, most, lock = [0], [0], threading.Lock()
    release = threading.Event()

    def busy(ctx):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
            full = running[0] >= _doctor.MAX_WORKERS
        if full:
            release.set()
        release.wait(WAIT)
        with lock:
            running[0] -= 1

    effects = dict((name, busy) for name in _doctor.BESIDE_CANARY)
    assert len(effects) > _doctor.MAX_WORKERS
    lines = doctor(fakes([], **effects)).run()
    assert most[0] == _doctor.MAX_WORKERS and release.is_set()
    assert [line.message for line in lines] == REPORT


def test_a_check_beside_the_canary_that_raises_fails_the_run_as_before():
    def boom(ctx):
        raise dc.EngineError('Inspecting container g failed: 500')
    with pytest.raises(dc.EngineError):
        doctor(fakes([], transparent=boom)).run()


def test_the_report_says_the_run_s_wall_time():
    lines = [Line('canary.notrun', 'notrun', 'x')]
    assert _doctor.render_report(lines).rstrip('\n').endswith('1 checks: 0 \u2713, 0 \u26a0, 0 \u2717, 1 not run')
    report = _doctor.render_report(lines, wall=23.44)
    assert report.endswith('1 not run\ndoctor run: 23.4 s\n')
    doc = doctor(fakes([]))
    result = _doctor.canary_result(doc, doc.run())
    assert result['report'].splitlines()[-1] == 'doctor run: %.1f s' % doc.timings['total']


# --- the canary's teardown leaves the probes of the checks beside it -------------------------------------------

class TeardownAPI(object):
    def __init__(self):
        self.calls = []

    def remove_container(self, name, force=False):
        self.calls.append(('rm', name))

    def disconnect_container_from_network(self, container, net, force=False):
        self.calls.append(('disconnect', container, net))

    def remove_network(self, name):
        self.calls.append(('network rm', name))


def test_the_canary_teardown_never_removes_a_probe_another_check_removes_itself():
    api = TeardownAPI()
    options = _doctor.DoctorOptions(PROXY, '/nonexistent', 'img', pid=OWN, environ={})
    ctx = _doctor_context.DoctorContext.build(Client(api), options)
    theirs = [_doctor_names.probe_name(probe, OWN) for probe in _doctor_names.SELF_REMOVED] + \
        [_doctor_names.peer_name(peer, OWN) for peer in _doctor_names.PEERS]
    own = [_doctor_names.probe_name('provider-again', OWN),
           _doctor_names.endpoint_probe_name('tunnel', 'm1', OWN)]
    ctx.launched.extend(theirs + own)
    _doctor_canary.teardown(ctx, _doctor_names.network_name(OWN), True)
    removed = [call[1] for call in api.calls if call[0] == 'rm']
    assert not set(removed) & set(theirs)
    assert set(own) <= set(removed)
    assert set(_doctor_names.probe_name(probe, OWN) for probe in _doctor_probes.PROBES) <= set(removed)


# --- the isolation check removes its two peers at once, then its two job networks at once --------------------

def test_the_isolation_teardown_removes_both_peers_before_either_network_and_keeps_a_stuck_peer_s(monkeypatch):
    events, lock = [], threading.Lock()

    class API(object):
        def remove_container(self, name, force=False):
            with lock:
                events.append(('rm', name))
            if name.endswith('peer-b-%d' % OWN):
                raise Exception('device or resource busy')

    def teardown(client, job_id, proxy_name=None):
        with lock:
            events.append(('net', job_id))

    monkeypatch.setattr(dc, 'is_not_found', lambda exc: False)
    monkeypatch.setattr(dc, 'api_message', str)
    monkeypatch.setattr(_doctor_isolation._jobnet_teardown, 'teardown_job_network', teardown)
    options = _doctor.DoctorOptions(PROXY, '/nonexistent', 'img', pid=OWN, environ={})
    ctx = _doctor_context.DoctorContext.build(Client(API()), options)
    lines = _doctor_isolation._teardown(ctx, ['a', 'b'])
    assert sorted(events[:2]) == [('rm', _doctor_names.peer_name('a', OWN)), ('rm', _doctor_names.peer_name('b', OWN))]
    assert events[2:] == [('net', 'doctor-%d-a' % OWN)]  # b's network stays: its peer would not go
    assert [(line.id, line.status) for line in lines] == [('isolation.cleanup', 'warn')]
    assert 'device or resource busy' in lines[0].message and 'pi-job-doctor-%d-b-net' % OWN in lines[0].message


# --- issue 43, item 5: the MCP server endpoint's probe retries as every probe does -------------------------

MARK = _doctor_probes.PROBE_MARK
UNRESOLVED = ('%s 000 000\n%s-rc 28\n%s-headers\n%s-stderr\ncurl: (28) Resolving timed out after 1000 ms\n'
              % (MARK, MARK, MARK, MARK))


def answered(code, connect):
    return '%s %03d %03d\n%s-rc 0\n%s-headers\n%s-stderr\n' % (MARK, code, connect, MARK, MARK, MARK)


class ProbeAPI(object):
    """Probe containers on the canary's network: the MCP server endpoint's tunnel probe gets no answer in its first
    container (Podman 4.3's aardvark-dns dropped the proxy's name) and an answer in a fresh one."""

    def __init__(self):
        self.made, self.scripts, self.lock = [], {}, threading.Lock()

    def create_network(self, name, **kwargs):
        pass

    def connect_container_to_network(self, container, net, aliases=None):
        pass

    def create_endpoint_config(self, **kwargs):
        return kwargs

    def create_host_config(self, **kwargs):
        return kwargs

    def create_networking_config(self, config):
        return config

    def create_container(self, image, command, name=None, **kwargs):
        with self.lock:
            self.made.append(name)
            self.scripts[name] = command[-1]
        return {'Id': name}

    def start(self, cid):
        pass

    def wait(self, cid, timeout=None):
        return {'StatusCode': 0}

    def logs(self, cid, stdout=True, stderr=True):
        script = self.scripts[cid]
        if "-p 'http://mcp.test:8080/v1/models'" in script:
            return (answered(404, 200) if '-again-' in cid else UNRESOLVED).encode()
        return answered(403, 0).encode()

    def remove_container(self, name, force=False):
        pass

    def disconnect_container_from_network(self, container, net, force=False):
        pass

    def remove_network(self, name):
        pass


def test_the_mcp_server_endpoint_probe_runs_once_more_in_a_fresh_container(monkeypatch):
    """Issue 43, item 5: an endpoint only an MCP server uses is probed by the canary's own endpoint jobs
    (canary.endpoint_jobs -> containers.run_probe), so it has the resolve retry inside its container
    (probes.probe_script) and the fresh container after no answer at all (probes.got_no_answer)."""
    endpoint = _endpoints.Endpoint('mcp1', 'mcp.test', 8080, 1)
    monkeypatch.setattr(dc, 'get_image', lambda client, name: object())
    monkeypatch.setattr(_doctor_canary, 'mcp_only_endpoints', lambda ctx: {'mcp1'})
    api = ProbeAPI()
    options = _doctor.DoctorOptions(PROXY, '/nonexistent', 'img', pid=OWN, environ={}, isolation=False,
                                    probe_timeout=1, start_grace=0, endpoint_timeout=1)
    ctx = _doctor_context.DoctorContext.build(Client(api), options)
    ctx.attrs, ctx.endpoints_loaded = RUNNING, [endpoint]
    lines = _doctor_canary.CanaryCheck(_doctor_isolation.IsolationCheck()).lines(ctx)
    tunnel = _doctor_names.endpoint_probe_name('tunnel', 'mcp1', OWN)
    again = _doctor_names.probe_name('endpoint-tunnel-mcp1-again', OWN)
    assert [name for name in api.made if name in (tunnel, again)] == [tunnel, again]
    assert 'Resolving timed out' in _doctor_probes.probe_script('x', 'y', 1)  # the retry inside the container too
    mcp = [line for line in lines if line.id.startswith('endpoint.mcp_tunnel')]
    assert [(line.id, line.status) for line in mcp] == [('endpoint.mcp_tunnel', 'ok')], lines
    assert mcp[0].message.startswith('MCP server endpoint mcp1 answers through the proxy')


@pytest.mark.parametrize('probe, name', [
    ('provider', _doctor_names.probe_name('provider', OWN)),
    ('endpoint-tunnel-mcp1', _doctor_names.endpoint_probe_name('tunnel', 'mcp1', OWN)),
    ('shard-1-deny', _doctor_names.shard_probe_name(1, 'deny', OWN)),
])
def test_the_fresh_container_of_a_probe_is_one_the_sweep_of_a_killed_run_removes(monkeypatch, probe, name):
    """The second container of a probe that got no answer carries the pid where every probe does, so that a killed
    run's is removed by the next run's sweep (sweep.split_attached), not merely detached and left behind."""
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import containers as _containers
    started = []

    def fake_run_container(ctx, key, name_, script, net, results, wait, address=None):
        started.append(name_)
        results[key] = (UNRESOLVED, None)
    monkeypatch.setattr(_containers, 'run_container', fake_run_container)
    ctx = type('Ctx', (), dict(probe_timeout=1, start_grace=0, pid=OWN, proxy='p'))()
    _containers.run_probe(ctx, probe, 'https://x.test/', 'net', {}, name=name)
    assert started[0] == name and len(started) == 2
    again = started[1]
    assert again != name and 'again' in again
    assert _doctor_names.probe_pid(again) == OWN, again
    assert _doctor_names.probe_shard(again) == _doctor_names.probe_shard(name)
    probes, others = __import__(
        'ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.sweep',
        fromlist=['split_attached']).split_attached(['/' + again, '/' + PROXY], OWN)
    assert probes == [again] and others == [PROXY]
