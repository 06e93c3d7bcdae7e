"""The doctor's pure decisions: the sweep table, probe classification, the report, the docs table."""

import json
import os
import re
import subprocess

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import canary as _doctor_canary
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import doctor as _doctor
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import lines as _doctor_lines
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import names as _doctor_names
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import probes as _doctor_probes
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import proxy as _doctor_proxy
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import sweep as _doctor_sweep
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import rules as _rules
from ansible_collections.pi_dispatch.egress.tests.unit.plugins.module_utils.fakes import EngineClient as FakeClient

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
OWN = 4242


# --- names ------------------------------------------------------------------------------------

@pytest.mark.parametrize('name, pid', [
    ('pi-dispatch-egress-doctor-123', 123),
    ('pi-dispatch-egress-doctor-1', 1),
    ('pi-dispatch-egress-doctor-', None),
    ('pi-dispatch-egress-doctor-12a', None),
    ('pi-dispatch-egress-doctor-12-net', None),
    ('xpi-dispatch-egress-doctor-12', None),
    ('pi-dispatch-egress-doctor-12\n', None),
    ('pi-dispatch-egress-out', None),
    ('pi-job-12-net', None),
    ('pi-job-doctor-12-a-net', 12),
    ('pi-job-doctor-12-b-net', 12),
    ('pi-job-doctor-12-c-net', None),
    ('pi-job-doctor-12-net', None),
    ('pi-job-doctor-x-a-net', None),
])
def test_parse_doctor_network(name, pid):
    assert _doctor_names.parse_doctor_network(name) == pid


@pytest.mark.parametrize('name, pid', [
    ('pi-dispatch-egress-probe-provider-77', 77),
    ('/pi-dispatch-egress-probe-deny-77', 77),
    ('pi-dispatch-egress-probe-endpoint-mac-ollama-tunnel-77', 77),
    ('pi-dispatch-egress-probe-77', None),
    ('pi-dispatch-egress-probe-plain-', None),
    ('pi-job-77', None),
])
def test_probe_pid(name, pid):
    assert _doctor_names.probe_pid(name) == pid


def test_own_names():
    assert _doctor_names.network_name(9) == 'pi-dispatch-egress-doctor-9'
    assert _doctor_names.probe_name('deny', 9) == 'pi-dispatch-egress-probe-deny-9'


# --- the sweep decision table --------------------------------------------------------------------

@pytest.mark.parametrize('case, name, alive, local, decision', [
    ('dead pid, local daemon', 'pi-dispatch-egress-doctor-100', False, True, 'sweep'),
    ('live pid, local daemon', 'pi-dispatch-egress-doctor-100', True, True, 'live'),
    ('dead pid, remote daemon', 'pi-dispatch-egress-doctor-100', False, False, 'remote'),
    ('live pid, remote daemon', 'pi-dispatch-egress-doctor-100', True, False, 'remote'),
    ('this run', 'pi-dispatch-egress-doctor-%d' % OWN, False, True, 'ignore'),
    ('not exactly a canary name', 'pi-dispatch-egress-doctor-100-old', False, True, 'ignore'),
    ('prefix only', 'pi-dispatch-egress-doctor-', False, True, 'ignore'),
])
def test_plan_leftover(case, name, alive, local, decision):
    assert _doctor_sweep.plan_leftover(name, OWN, alive, local) == decision, case


@pytest.mark.parametrize('docker_host, env, local', [
    (None, {}, True),
    (None, {'DOCKER_HOST': 'unix:///run/user/1000/docker.sock'}, True),
    ('unix:///var/run/docker.sock', {}, True),
    (None, {'DOCKER_HOST': 'tcp://10.0.0.5:2376'}, False),
    ('ssh://builder@ci', {}, False),
    ('tcp://127.0.0.1:2375', {'DOCKER_HOST': 'unix:///var/run/docker.sock'}, False),
])
def test_daemon_locality(docker_host, env, local):
    got, resolved = _doctor_names.daemon_locality(docker_host, env)
    assert got is local
    assert resolved.startswith('resolved ')


def test_pid_alive():
    assert _doctor_names.pid_alive(os.getpid())
    assert _doctor_names.pid_alive(0)  # nonsense is never called dead


def test_split_attached_probes_and_foreign():
    probes, others = _doctor_sweep.split_attached(
        ['pi-dispatch-egress-probe-deny-5', 'pi-dispatch-egress-proxy', 'pi-dispatch-egress-probe-deny-6',
         '/pi-dispatch-egress-probe-provider-5', 'my-app'], 5)
    assert probes == ['pi-dispatch-egress-probe-deny-5', 'pi-dispatch-egress-probe-provider-5']
    # A probe of ANOTHER pid on this network is not this network's probe: detached, not removed.
    assert others == ['my-app', 'pi-dispatch-egress-probe-deny-6', 'pi-dispatch-egress-proxy']


NET = 'pi-dispatch-egress-doctor-5'


@pytest.mark.parametrize('kwargs, line_id, status, words', [
    (dict(removed=['p1'], detached=['proxy']), 'leftovers.removed', 'ok',
     ['removed %s' % NET, 'after removing p1 and detaching proxy', 'EARLIER']),
    (dict(), 'leftovers.removed', 'ok', ['removing nothing and detaching nothing']),
    (dict(removed=['p1'], stuck='p2'), 'leftovers.kept', 'warn', ['%s is kept' % NET, 'docker rm -f p2']),
    (dict(removed=['p1'], rm_error='has active endpoints'), 'leftovers.rm_failed', 'warn',
     ['docker network rm %s' % NET, 'has active endpoints']),
    (dict(removed=['p1'], net_gone=True), 'leftovers.gone', 'ok', ['removed p1 on', 'the network itself is gone']),
    (dict(detached=['app'], net_gone=True), 'leftovers.gone', 'ok', ['detached app on']),
])
def test_sweep_line(kwargs, line_id, status, words):
    line = _doctor_sweep.sweep_line(NET, **kwargs)
    assert (line.id, line.status) == (line_id, status)
    for word in words:
        assert word in line.message
    if status == 'warn':
        assert line.fix


def test_sweep_line_nothing_done_and_gone_is_no_line():
    assert _doctor_sweep.sweep_line(NET, net_gone=True) is None


# --- the sweep against a fake daemon ----------------------------------------------------------

class NotFound(Exception):
    pass


class FakeAPI(object):
    def __init__(self, nets, attached=None, containers=(), stuck=(), list_error=None, inspect_error=None,
                 rm_error=None, members=None, ps_error=None):
        self.nets = list(nets)
        # What ps -a --filter network=<net> lists: running ones (as inspect does on Docker) and stopped ones.
        self.members = members or {}
        self.ps_error = ps_error
        self.attached = attached or {}
        self.all_containers = list(containers)
        self.stuck = set(stuck)
        self.list_error = list_error
        self.inspect_error = inspect_error
        self.rm_error = rm_error
        self.calls = []

    def networks(self, filters=None):
        if self.list_error:
            raise Exception(self.list_error)
        return [dict(Name=n) for n in self.nets if n.startswith(filters['name'])]

    def containers(self, all=False, filters=None):
        if 'network' in filters:
            if self.ps_error:
                raise Exception(self.ps_error)
            return [dict(Id='id-' + n, Names=['/' + n]) for n in self.members.get(filters['network'], [])]
        return [dict(Names=['/' + n]) for n in self.all_containers if n.startswith(filters['name'])]

    def inspect_network(self, name):
        if self.inspect_error:
            raise Exception(self.inspect_error)
        return dict(Containers=dict(('id%d' % i, dict(Name=n)) for i, n in enumerate(self.attached.get(name, []))))

    def remove_container(self, name, force=False):
        self.calls.append(('rm', name))
        if name in self.stuck:
            raise Exception('device or resource busy')

    def disconnect_container_from_network(self, container, net, force=False):
        self.calls.append(('disconnect', container, net))

    def remove_network(self, name):
        self.calls.append(('network rm', name))
        if self.rm_error:
            raise Exception(self.rm_error)


@pytest.fixture(autouse=True)
def fake_not_found(monkeypatch):
    monkeypatch.setattr(dc, 'is_not_found', lambda exc: isinstance(exc, NotFound))
    monkeypatch.setattr(dc, 'api_message', str)


def doctor(api, docker_host=None, check_mode=False, isolation=False):
    return _doctor.Doctor(FakeClient(api), _doctor.DoctorOptions(
        'pi-dispatch-egress-proxy', '/nonexistent', 'img', docker_host=docker_host, check_mode=check_mode, pid=OWN,
        environ={}, isolation=isolation))


RUNNING = {'State': {'Running': True}}


def run_canary(doc, shards=()):
    """The canary check of a running proxy with ``shards`` as its family: (canary, endpoint, isolation) lines."""
    doc.ctx.attrs, doc.ctx.family = RUNNING, list(shards)
    out = doc.checks['canary'].lines(doc.ctx)
    canary = [line for line in out if line.id.startswith('canary.')]
    assert out == canary + [line for line in out if not line.id.startswith('canary.')]  # canary lines first
    assert all(line.id.startswith('endpoint.') for line in out[len(canary):])
    return canary, out[len(canary):], doc.ctx.isolation_lines


def sweep(doc, alive):
    return _doctor_sweep.SweepCheck(alive=alive).lines(doc.ctx)


def test_sweep_dead_pid_removes_probes_detaches_others_removes_network():
    api = FakeAPI(['pi-dispatch-egress-doctor-100'],
                  attached={'pi-dispatch-egress-doctor-100': [
                      'pi-dispatch-egress-probe-deny-100', 'pi-dispatch-egress-proxy']},
                  containers=['pi-dispatch-egress-probe-plain-100', 'pi-dispatch-egress-probe-plain-101'])
    doc = doctor(api)
    lines = sweep(doc, lambda pid: False)
    assert [line.id for line in lines] == ['leftovers.removed']
    assert 'pi-dispatch-egress-probe-deny-100, pi-dispatch-egress-probe-plain-100' in lines[0].message
    assert 'detaching pi-dispatch-egress-proxy' in lines[0].message
    assert api.calls == [('rm', 'pi-dispatch-egress-probe-deny-100'), ('rm', 'pi-dispatch-egress-probe-plain-100'),
                         ('disconnect', 'pi-dispatch-egress-proxy', 'pi-dispatch-egress-doctor-100'),
                         ('network rm', 'pi-dispatch-egress-doctor-100')]
    assert doc.actions


@pytest.mark.parametrize('inspected, listed, removed, detached', [
    # Docker: inspect lists the running proxy; ps -a also lists it and a stopped container inspect leaves out.
    (['pi-dispatch-egress-proxy'], ['pi-dispatch-egress-proxy', 'stopped-job'], [],
     ['pi-dispatch-egress-proxy', 'stopped-job']),
    # Podman 4.9 and later: inspect lists nobody; ps -a finds the probe and the proxy.
    ([], ['pi-dispatch-egress-probe-deny-100', 'pi-dispatch-egress-proxy'], ['pi-dispatch-egress-probe-deny-100'],
     ['pi-dispatch-egress-proxy']),
    # A created (never started) container is on it too: detached, named.
    ([], ['created-only'], [], ['created-only']),
    # Nothing on it either way.
    ([], [], [], []),
])
def test_sweep_reads_members_with_ps_so_a_stopped_one_is_detached_before_the_removal(
        inspected, listed, removed, detached):
    net = 'pi-dispatch-egress-doctor-100'
    api = FakeAPI([net], attached={net: inspected}, members={net: listed})
    lines = sweep(doctor(api), lambda pid: False)
    assert [line.id for line in lines] == ['leftovers.removed'], lines
    assert api.calls == ([('rm', name) for name in removed] + [('disconnect', name, net) for name in detached] +
                         [('network rm', net)])
    for name in detached:
        assert name in lines[0].message


def test_sweep_names_the_ps_command_when_the_members_cannot_be_listed_and_touches_nothing():
    net = 'pi-dispatch-egress-doctor-100'
    api = FakeAPI([net], attached={net: ['pi-dispatch-egress-probe-deny-100']}, ps_error='boom')
    lines = sweep(doctor(api), lambda pid: False)
    assert [(line.id, line.status) for line in lines] == [('leftovers.unreadable', 'warn')]
    assert 'docker ps -a --filter network=%s (boom)' % net in lines[0].message
    assert lines[0].fix.startswith('docker ps -a --filter network=%s' % net)
    assert api.calls == []


def test_sweep_live_pid_and_own_pid_are_left_alone():
    api = FakeAPI(['pi-dispatch-egress-doctor-100', 'pi-dispatch-egress-doctor-%d' % OWN],
                  attached={'pi-dispatch-egress-doctor-100': ['pi-dispatch-egress-probe-deny-100']})
    assert sweep(doctor(api), lambda pid: True) == []
    assert sweep(doctor(api), lambda pid: pid == 100) == []  # own pid 'dead': still ignored
    assert api.calls == []


def test_sweep_remote_daemon_reports_never_sweeps():
    api = FakeAPI(['pi-dispatch-egress-doctor-100'])
    lines = sweep(doctor(api, docker_host='tcp://10.1.2.3:2376'), lambda pid: False)
    assert [(line.id, line.status) for line in lines] == [('leftovers.remote', 'warn')]
    assert 'tcp://10.1.2.3:2376' in lines[0].message
    assert lines[0].fix == 'check on the host that daemon belongs to, then docker network rm ' \
                           'pi-dispatch-egress-doctor-100 there'
    assert api.calls == []


def test_sweep_stuck_probe_keeps_network():
    api = FakeAPI(['pi-dispatch-egress-doctor-100'],
                  attached={'pi-dispatch-egress-doctor-100': [
                      'pi-dispatch-egress-probe-deny-100', 'pi-dispatch-egress-probe-plain-100', 'other']},
                  stuck=['pi-dispatch-egress-probe-deny-100'])
    lines = sweep(doctor(api), lambda pid: False)
    assert [line.id for line in lines] == ['leftovers.kept']
    assert 'docker rm -f pi-dispatch-egress-probe-deny-100' in lines[0].message
    assert ('network rm', 'pi-dispatch-egress-doctor-100') not in api.calls
    assert not [call for call in api.calls if call[0] == 'disconnect']
    assert ('rm', 'pi-dispatch-egress-probe-plain-100') in api.calls  # the others still go


def test_sweep_listing_fails():
    lines = sweep(doctor(FakeAPI([], list_error='connection reset')), lambda pid: False)
    assert [line.id for line in lines] == ['leftovers.unlisted']
    assert 'docker network ls --filter name=pi-dispatch-egress-doctor-' in lines[0].message


def test_sweep_inspect_fails_touches_nothing():
    api = FakeAPI(['pi-dispatch-egress-doctor-100'], inspect_error='permission denied')
    lines = sweep(doctor(api), lambda pid: False)
    assert [line.id for line in lines] == ['leftovers.unreadable']
    assert 'docker network inspect pi-dispatch-egress-doctor-100' in lines[0].message
    assert api.calls == []


def test_sweep_network_rm_fails():
    api = FakeAPI(['pi-dispatch-egress-doctor-100'], rm_error='has active endpoints')
    lines = sweep(doctor(api), lambda pid: False)
    assert [line.id for line in lines] == ['leftovers.rm_failed']


def test_sweep_non_matching_names_ignored():
    api = FakeAPI(['pi-dispatch-egress-doctor-100-x', 'pi-dispatch-egress-doctor-abc'])
    assert sweep(doctor(api), lambda pid: False) == []
    assert api.calls == []


def test_sweep_check_mode_reports_only():
    api = FakeAPI(['pi-dispatch-egress-doctor-100'],
                  attached={'pi-dispatch-egress-doctor-100': ['pi-dispatch-egress-probe-deny-100', 'app']})
    lines = sweep(doctor(api, check_mode=True), lambda pid: False)
    assert [line.id for line in lines] == ['leftovers.would_sweep']
    assert 'pi-dispatch-egress-probe-deny-100' in lines[0].message and 'detaching app' in lines[0].message
    assert api.calls == []


def test_teardown_stuck_probe_keeps_own_network():
    api = FakeAPI([], stuck=['pi-dispatch-egress-probe-deny-%d' % OWN])
    lines = _doctor_canary.teardown(doctor(api).ctx, 'pi-dispatch-egress-doctor-%d' % OWN, True)
    assert [line.id for line in lines] == ['canary.cleanup_kept']
    assert ('network rm', 'pi-dispatch-egress-doctor-%d' % OWN) not in api.calls


def test_teardown_network_rm_failure_reported():
    api = FakeAPI([], rm_error='has active endpoints')
    lines = _doctor_canary.teardown(doctor(api).ctx, 'pi-dispatch-egress-doctor-%d' % OWN, True)
    assert [(line.id, line.status) for line in lines] == [('canary.cleanup_rm', 'warn')]


# --- probe results ------------------------------------------------------------------------------------

def probe_output(code, connect, rc=0, headers='', stderr=''):
    return ('PIDOCTOR %03d %03d\nPIDOCTOR-rc %d\nPIDOCTOR-headers\n%sPIDOCTOR-stderr\n%s'
            % (code, connect, rc, headers, stderr))


def test_parse_probe_output():
    text = probe_output(403, 0, rc=0, headers='HTTP/1.1 403 Forbidden\r\nX-Squid-Error: ERR_ACCESS_DENIED 0\r\n')
    got = _doctor_probes.parse_probe_output(text)
    assert (got['code'], got['connect'], got['rc'], got['squid_error']) == (403, 0, 0, 'ERR_ACCESS_DENIED 0')
    assert _doctor_probes.parse_probe_output('sh: curl: not found\n') is None
    assert _doctor_probes.parse_probe_output('') is None


def test_probe_script_is_bounded_and_never_reads_a_file_for_w():
    script = _doctor_probes.probe_script('https://api.provider.test/', 'http://proxy:3128', 7)
    assert '--max-time 7' in script and '--connect-timeout 7' in script
    assert "-w '@" not in script


FAKE_CURL = """#!/bin/sh
# answers each call with the next exit code of $FAKE_CODES, printing the -w line as curl would
n=$(cat "$FAKE_DIR/calls" 2>/dev/null || echo 0); n=$((n+1)); echo $n > "$FAKE_DIR/calls"
code=$(echo $FAKE_CODES | cut -d' ' -f$n)
[ "$code" = 0 ] && echo "PIDOCTOR 401 200" || echo "PIDOCTOR 000 000"
# 28r: a timeout while the proxy's name was being resolved (curl: "Resolving timed out after 5000 ms")
if [ "$code" = 28r ]; then echo "curl: (28) Resolving timed out after 5000 milliseconds attempt $n" >&2; exit 28; fi
echo "curl: ($code) attempt $n" >&2
exit $code
"""


@pytest.mark.parametrize('codes, calls, rc, code', [
    ('5 5 0', 3, 0, 401),         # the proxy's name resolved on the third try
    ('5 5 5 5 5', 4, 5, 0),       # one try and RESOLVE_RETRIES more, then the probe did not run
    ('56', 1, 56, 0),             # a refused tunnel is an answer: never tried again
    ('28', 1, 28, 0),             # nor a timeout
    # Podman 4.3's aardvark-dns may drop the query instead of refusing it: the name's lookup times out
    ('28r 28r 0', 3, 0, 401),
    ('28r 28r 28r 28r 28r', 4, 28, 0),
    ('28r 28', 2, 28, 0),
    ('7', 1, 7, 0),
    ('0', 1, 0, 401),
])
def test_a_probe_tries_again_only_while_the_proxy_name_does_not_resolve(monkeypatch, tmp_path, codes, calls, rc,
                                                                        code):
    monkeypatch.setattr(_doctor_probes, 'RESOLVE_RETRY_S', 0)
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    (bin_dir / 'curl').write_text(FAKE_CURL)
    os.chmod(str(bin_dir / 'curl'), 0o755)
    # The script writes the probe container's /tmp/h and /tmp/e: here, into the test's own folder.
    script = _doctor_probes.probe_script('https://api.provider.test/', 'http://proxy:3128', 7)
    script = script.replace('/tmp/', str(tmp_path) + '/')
    env = dict(os.environ, PATH='%s:%s' % (bin_dir, os.environ['PATH']), FAKE_CODES=codes, FAKE_DIR=str(tmp_path))
    out = subprocess.run(['sh', '-c', script], stdout=subprocess.PIPE, env=env, timeout=30,
                         check=False).stdout.decode()
    assert (tmp_path / 'calls').read_text().strip() == str(calls)
    parsed = _doctor_probes.parse_probe_output(out)
    assert (parsed['rc'], parsed['code']) == (rc, code), out
    assert 'attempt %d' % calls in parsed['error'], out  # the last try's error is the one reported


@pytest.mark.parametrize('result, none', [
    (dict(rc=5, connect=0, code=0, error='curl: (5) Could not resolve proxy: p'), True),
    (dict(rc=28, connect=0, code=0, error='curl: (28) Connection timed out after 5001 milliseconds'), True),
    (dict(rc=7, connect=0, code=0, error='curl: (7) Failed to connect'), True),
    (dict(rc=56, connect=403, code=0, error='curl: (56) CONNECT tunnel failed, response 403'), False),
    (dict(rc=28, connect=200, code=0, error='curl: (28) Operation timed out'), False),   # the tunnel opened
    (dict(rc=0, connect=0, code=403, error=''), False),
    (dict(rc=0, connect=200, code=401, error=''), False),
    (None, False),
])
def test_got_no_answer(result, none):
    assert _doctor_probes.got_no_answer(result) is none


UNRESOLVED = ('PIDOCTOR 000 000\nPIDOCTOR-rc 28\nPIDOCTOR-headers\nPIDOCTOR-stderr\n'
              'curl: (28) Resolving timed out after 5000 ms\n')
ANSWERED = 'PIDOCTOR 401 200\nPIDOCTOR-rc 0\nPIDOCTOR-headers\nPIDOCTOR-stderr\n'


@pytest.mark.parametrize('outputs, names, rc', [
    ([ANSWERED], ['pi-dispatch-egress-probe-provider-7'], 0),
    ([UNRESOLVED, ANSWERED], ['pi-dispatch-egress-probe-provider-7', 'pi-dispatch-egress-probe-provider-again-7'], 0),
    ([UNRESOLVED, UNRESOLVED], ['pi-dispatch-egress-probe-provider-7',
                                'pi-dispatch-egress-probe-provider-again-7'], 28),
])
def test_a_probe_whose_proxy_name_never_resolved_runs_once_more_in_a_fresh_container(
        monkeypatch, outputs, names, rc):
    """On Podman 4.3 a container that joined while aardvark-dns reloaded can stay unknown to it: its every
    try times out resolving the proxy (measured in the Podman gate). One fresh container, never more."""
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import containers as _containers
    started = []

    def fake_run_container(ctx, key, name, script, net, results, wait, address=None):
        started.append(name)
        results[key] = (outputs[len(started) - 1], None)
    monkeypatch.setattr(_containers, 'run_container', fake_run_container)
    ctx = type('Ctx', (), dict(probe_timeout=5, start_grace=20, pid=7, proxy='p', proxy_port=3128))()
    monkeypatch.setattr(_containers, 'probe_env', lambda c: ('http://p:3128', {}))
    results = {}
    _containers.run_probe(ctx, 'provider', 'https://api.provider.test/', 'net', results)
    assert started == names
    assert results['provider'][0]['rc'] == rc


P = 'api.provider.test'


@pytest.mark.parametrize('fn, code, connect, headers, rc, line_id, status', [
    # provider
    (_doctor_probes.classify_provider, 401, 200, '', 0, 'canary.provider', 'ok'),
    (_doctor_probes.classify_provider, 200, 200, '', 0, 'canary.provider', 'ok'),
    (_doctor_probes.classify_provider, 0, 403, '', 56, 'canary.provider_unreached', 'warn'),
    (_doctor_probes.classify_provider, 0, 503, '', 56, 'canary.provider_unreached', 'warn'),
    (_doctor_probes.classify_provider, 0, 200, '', 28, 'canary.provider_unreached', 'warn'),
    (_doctor_probes.classify_provider, 0, 0, '', 7, 'canary.notrun', 'notrun'),
    # deny
    (_doctor_probes.classify_deny, 0, 403, '', 56, 'canary.deny', 'ok'),
    (_doctor_probes.classify_deny, 401, 200, '', 0, 'canary.deny_leaks', 'fail'),
    (_doctor_probes.classify_deny, 0, 503, '', 56, 'canary.deny_leaks', 'fail'),
    (_doctor_probes.classify_deny, 0, 200, '', 28, 'canary.deny_leaks', 'fail'),
    (_doctor_probes.classify_deny, 0, 0, '', 7, 'canary.notrun', 'notrun'),
    # plain HTTP to a listed host on 443
    (_doctor_probes.classify_plain, 403, 0, 'X-Squid-Error: ERR_ACCESS_DENIED 0\n', 0, 'canary.plain', 'ok'),
    (_doctor_probes.classify_plain, 403, 0, '', 0, 'canary.plain_leaks', 'fail'),
    (_doctor_probes.classify_plain, 502, 0, 'X-Squid-Error: ERR_READ_ERROR 104\n', 0, 'canary.plain_leaks', 'fail'),
    (_doctor_probes.classify_plain, 400, 0, '', 0, 'canary.plain_leaks', 'fail'),
    (_doctor_probes.classify_plain, 0, 0, '', 7, 'canary.notrun', 'notrun'),
])
def test_classification(fn, code, connect, headers, rc, line_id, status):
    result = _doctor_probes.parse_probe_output(probe_output(code, connect, rc=rc, headers=headers))
    line = fn(P, result)
    assert (line.id, line.status) == (line_id, status), line
    if status in ('warn', 'fail'):
        assert line.fix


@pytest.mark.parametrize('fn', [_doctor_probes.classify_provider, _doctor_probes.classify_deny,
                                _doctor_probes.classify_plain])
def test_probe_that_did_not_run_is_never_a_pass(fn):
    line = fn(P, None, why_not='the container could not start: no such image')
    assert (line.id, line.status) == ('canary.notrun', 'notrun')
    assert 'no such image' in line.message


# --- proxy lines ------------------------------------------------------------------------------------------

@pytest.mark.parametrize('attrs, expect', [
    (None, [('proxy.missing', 'fail')]),
    ({'State': {'Running': False, 'Status': 'exited'}}, [('proxy.stopped', 'fail')]),
    ({'State': {'Running': True, 'Paused': True, 'Status': 'paused'}}, [('proxy.stopped', 'fail')]),
    ({'State': {'Running': True, 'Health': {'Status': 'healthy'}}}, [('proxy.running', 'ok'), ('proxy.health', 'ok')]),
    ({'State': {'Running': True, 'Health': {'Status': 'unhealthy'}}},
     [('proxy.running', 'ok'), ('proxy.health', 'fail')]),
    ({'State': {'Running': True, 'Health': {'Status': 'starting'}}},
     [('proxy.running', 'ok'), ('proxy.health', 'warn')]),
])
def test_proxy_lines(attrs, expect):
    lines = _doctor_proxy.proxy_lines('pi-dispatch-egress-proxy', attrs)
    assert [(line.id, line.status) for line in lines] == expect


def test_stopped_proxy_fix_is_the_start_command():
    line = _doctor_proxy.proxy_lines('p', {'State': {'Running': False, 'Status': 'exited'}})[0]
    assert line.fix == 'docker start p'


def test_rules_lines():
    assert _doctor_proxy.rules_line('/d/deploy/egress-proxy.conf', _rules.packaged_rules()).id == 'proxy.rules'
    changed = _rules.packaged_rules().replace('http_access deny all', 'http_access allow all')
    line = _doctor_proxy.rules_line('/d/deploy/egress-proxy.conf', changed)
    assert (line.id, line.status) == ('proxy.rules_differ', 'warn')
    assert '/d/deploy/egress-proxy.conf' in line.message and _doctor_proxy.PACKAGED_FILE in line.message
    assert 'http_access allow all' in line.message
    line = _doctor_proxy.rules_line('/d/deploy/egress-proxy.conf', None, error='No such file or directory')
    assert line.id == 'proxy.rules_unreadable'


# --- report and JSON --------------------------------------------------------------------------------------

def sample_lines():
    return [
        _doctor_lines.Line('proxy.running', 'ok', 'Egress proxy running (p)'),
        _doctor_lines.Line('canary.deny_leaks', 'fail', 'Egress policy lets an unlisted host through (x)',
                           fix='fix it'),
        _doctor_lines.Line('leftovers.remote', 'warn', 'Egress canary: n may be left over', fix='check there'),
        _doctor_lines.Line('isolation.peers', 'notrun', 'Job-to-job isolation is not checked yet'),
        _doctor_lines.Line('proxy.health', 'ok', 'Egress proxy health: healthy'),
    ]


def test_render_report_groups_symbols_fixes_and_summary():
    report = _doctor.render_report(sample_lines())
    assert report.splitlines() == [
        'Egress proxy:',
        u'  \u2713 Egress proxy running (p)',
        u'  \u2713 Egress proxy health: healthy',
        '',
        'Egress canary:',
        u'  \u2717 Egress policy lets an unlisted host through (x)',
        '      fix: fix it',
        '',
        'Job networks:',
        u'  \u25cb Job-to-job isolation is not checked yet',
        '',
        'Leftovers of earlier doctor runs:',
        u'  \u26a0 Egress canary: n may be left over',
        '      fix: check there',
        '',
        u'5 checks: 2 \u2713, 1 \u26a0, 1 \u2717, 1 not run',
    ]


def test_json_lines():
    out = _doctor.json_lines(sample_lines())
    rows = [json.loads(text) for text in out.splitlines()]
    assert len(rows) == 5
    assert rows[1] == {'id': 'canary.deny_leaks', 'status': 'fail',
                       'message': 'Egress policy lets an unlisted host through (x)', 'fix': 'fix it'}
    assert all(set(row) == {'id', 'status', 'message', 'fix'} for row in rows)


def test_line_rejects_unknown_id_and_status():
    with pytest.raises(ValueError):
        _doctor_lines.Line('no.such', 'ok', 'x')
    with pytest.raises(ValueError):
        _doctor_lines.Line('proxy.running', 'great', 'x')


def test_line_table_is_well_formed():
    assert len(set(_doctor_lines.LINE_IDS)) == len(_doctor_lines.LINE_IDS)
    groups = set(group for group, _title in _doctor_lines.GROUPS)
    for line_id, group, status, shape in _doctor_lines.LINES:
        assert group in groups and status in _doctor_lines.STATUSES and shape


# --- docs/doctor.md cannot drift ------------------------------------------------------------------------

def doc_rows():
    with open(os.path.join(ROOT, 'docs', 'doctor.md')) as handle:
        text = handle.read()
    rows = []
    for line in text.splitlines():
        match = re.match(r'^\| `([a-z_.]+)` \| (\S+) `(.*?)` \|', line)
        if match:
            rows.append((match.group(1), match.group(2), match.group(3)))
    return rows


def test_docs_table_first_column_rebuilt_from_code():
    assert [row[0] for row in doc_rows()] == _doctor_lines.LINE_IDS


def test_docs_table_shapes_match_code():
    expected = [(line_id, _doctor_lines.SYMBOLS[status], shape.replace('|', '\\|'))
                for line_id, _group, status, shape in _doctor_lines.LINES]
    assert doc_rows() == expected


# --- the model-endpoints include ---------------------------------------------------------------------------

HEADER = '# header\n'
RENDER = HEADER + 'acl pi_ep_m1_host dstdomain -n models.test\n'


@pytest.mark.parametrize('case, ids, render, running, mounted, mounts, expect', [
    ('nothing declared, all agree', [], HEADER, HEADER, HEADER, True, None),
    ('declared, all agree', ['m1'], RENDER, RENDER, RENDER, True, ('endpoints.include', 'ok')),
    ('replaced by rename', ['m1'], RENDER, HEADER, RENDER, True, ('endpoints.include_replaced', 'fail')),
    ('stale render', ['m1'], RENDER, HEADER, HEADER, True, ('endpoints.include_stale', 'fail')),
    ('stale, nothing declared any more', [], HEADER, RENDER, RENDER, True, ('endpoints.include_stale', 'fail')),
    ('remote daemon: mounted file unknown', ['m1'], RENDER, RENDER, None, True, ('endpoints.include', 'ok')),
    ('could not read inside the proxy', ['m1'], RENDER, None, RENDER, True,
     ('endpoints.include_unchecked', 'warn')),
    ('not mounted, declared', ['m1'], RENDER, None, None, False, ('endpoints.include_unmounted', 'fail')),
    ('not mounted, nothing declared', [], HEADER, None, None, False, None),
])
def test_include_line(case, ids, render, running, mounted, mounts, expect):
    line = _doctor_proxy.include_line('p', ids, render, running, mounted, '/d/model-endpoints.conf',
                                      '/d/model-endpoints.json', mounts)
    got = (line.id, line.status) if line else None
    assert got == expect, case
    if line and line.status in ('warn', 'fail'):
        assert line.fix


class SetupAPI(FakeAPI):
    def __init__(self, fail_on):
        super(SetupAPI, self).__init__([])
        self.fail_on = fail_on

    def create_network(self, name, **kwargs):
        self.calls.append(('network create', name))
        if self.fail_on == 'create':
            raise Exception('could not find an available, non-overlapping IPv4 address pool')

    def connect_container_to_network(self, container, net):
        self.calls.append(('connect', container, net))
        if self.fail_on == 'connect':
            raise Exception('container is not running')


@pytest.mark.parametrize('fail_on, removed', [('create', False), ('connect', True)])
def test_canary_setup_failure_is_not_run_and_cleans_up(monkeypatch, fail_on, removed):
    monkeypatch.setattr(dc, 'get_image', lambda client, name: object())
    api = SetupAPI(fail_on)
    lines, endpoint_lines, isolation_lines = run_canary(doctor(api))
    assert [(line.id, line.status) for line in lines] == [('canary.setup', 'notrun')]
    assert endpoint_lines == []  # nothing declared in /nonexistent
    assert [line.id for line in isolation_lines] == ['isolation.notrun']
    net = 'pi-dispatch-egress-doctor-%d' % OWN
    assert (('network rm', net) in api.calls) is removed
    assert not [call for call in api.calls if call[0] == 'run']


def test_canary_missing_probe_image_is_not_run(monkeypatch):
    monkeypatch.setattr(dc, 'get_image', lambda client, name: None)
    api = SetupAPI(None)
    lines, _endpoint_lines, isolation_lines = run_canary(doctor(api, isolation=True))
    assert [(line.id, line.status) for line in lines] == [('canary.setup', 'notrun')]
    assert [(line.id, line.status) for line in isolation_lines] == [('isolation.notrun', 'notrun')]
    assert 'img' in lines[0].message and lines[0].fix
    assert api.calls == []


# --- the destination guard, the rules' endpoints include, the mounts -------------------------------------

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import guard as G  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import rules as R  # noqa: E402

GUARD = G.render(G.validate(['172.18.0.0/16'], gateways=['172.18.0.1'], host_gateway='172.17.0.1'),
                 gateways=['172.18.0.1'], host_gateway='172.17.0.1')
RULES = R.packaged_rules()
RULES_V1 = '\n'.join(line for line in RULES.splitlines() if not line.startswith('include '))
GUARD_NO_POOL = GUARD.replace('# Job-network pool: 10.47.0.0/16', '# Job-network pool: 44.99.0.0/16')
GUARD_NO_ACL = '\n'.join(line for line in GUARD.splitlines() if not line.startswith('acl pi_guard'))


@pytest.mark.parametrize('case, rules, guard, mounted, gateways, host_gw, expect, needles', [
    ('in force', RULES, GUARD, True, {'172.18.0.1': 'up', '10.47.0.1': 'pi-job-a-net'}, '172.17.0.1',
     'proxy.guard', ['the job pool 10.47.0.0/16', 'the gateways 172.18.0.1', 'the host 172.17.0.1',
                     'opened: 172.18.0.0/16']),
    ('a docker-default network attached later is covered by the private ranges', RULES, GUARD, True,
     {'172.22.0.1': 'late'}, '172.17.0.1', 'proxy.guard', []),
    ('rules of version 1', RULES_V1, GUARD, True, {}, None, 'proxy.guard_missing', ['do not include']),
    ('an older container without the mount', RULES, None, False, {}, None, 'proxy.guard_unmounted', []),
    ('the guard unreadable inside', RULES, None, True, {}, None, 'proxy.guard_unchecked', []),
    ('rules unreadable', None, GUARD, True, {}, None, 'proxy.guard_unchecked', []),
    ('no pi_guard line', RULES, GUARD_NO_ACL, True, {}, None, 'proxy.guard_empty', []),
    ('an opened range swallows a gateway attached later', RULES, GUARD, True, {'172.18.5.1': 'other'}, None,
     'proxy.guard_gap', ['the gateway 172.18.5.1 of other']),
    ('the named pool is not covered', RULES, GUARD_NO_POOL, True, {}, None, 'proxy.guard_gap',
     ['the job-network pool 44.99.0.0/16']),
    ('a public host gateway', RULES, GUARD, True, {}, '44.1.2.3', 'proxy.guard_gap',
     ['the host-gateway address 44.1.2.3']),
])
def test_guard_line(case, rules, guard, mounted, gateways, host_gw, expect, needles):
    line = _doctor_proxy.guard_line('p', rules, guard, mounted, gateways, host_gw)
    assert line.id == expect, (case, line)
    assert line.status == _doctor_lines._BY_ID[expect][2]
    for needle in needles:
        assert needle in line.message, (case, line.message)
    if line.status != 'ok':
        assert line.fix, case


@pytest.mark.parametrize('rules, ids, expect', [
    (RULES, ['m1'], None),
    (RULES_V1, ['m1', 'm2'], 'endpoints.rules_without_include'),
    (RULES_V1, [], None),
    (None, ['m1'], None),
])
def test_rules_without_the_endpoints_include(rules, ids, expect):
    line = _doctor_proxy.endpoints_rules_line('p', rules, ids)
    assert (line.id if line else None) == expect
    if line:
        assert 'm1, m2' in line.message and 'until the rules are refreshed' in line.message


@pytest.mark.parametrize('stale, count, why, expect', [
    ([], 4, None, 'proxy.mounts'),
    (['/d/egress-allowlist.conf'], 4, None, 'proxy.mounts_stale'),
    ([], 4, 'the daemon is on another host', 'proxy.mounts_unchecked'),
])
def test_mounts_line(stale, count, why, expect):
    line = _doctor_proxy.mounts_line('p', stale, count, why)
    assert line.id == expect
    for path in stale:
        assert path in line.message and 'saved by rename' in line.message


def test_attrs_gateways():
    attrs = {'NetworkSettings': {'Networks': {'b': {'Gateway': '10.47.0.1', 'IPv6Gateway': ''},
                                              'a': {'Gateway': '172.18.0.1', 'IPv6Gateway': 'fd00::1'}}}}
    assert _doctor_proxy.attrs_gateways(attrs) == {'172.18.0.1': 'a', 'fd00::1': 'a', '10.47.0.1': 'b'}
    assert _doctor_proxy.attrs_gateways({}) == {}


# --- egress_canary's options and result (check_canary_options, canary_options, canary_result) ---------------
CANARY = dict(proxy_name='pi-dispatch-egress-proxy', probe_image='probe:it', fallback_probe_image=None,
              decision_log_dir=None, provider_host='api.anthropic.com', deny_host='example.com', listed_host=None,
              probe_timeout=10, probe_start_grace=5, endpoint_timeout=5, models_json=None, isolation=True,
              job_network_pool='10.47.0.0/16', job_network_prefix=24, sweep=True, firewall=True,
              firewall_chain_prefix='PI-EGRESS', firewall_probe=True, docker_host=None)


@pytest.mark.parametrize('change, fragment', [
    ({}, None),
    (dict(probe_timeout=0), 'probe_timeout must be at least 1 second, not 0'),
    (dict(endpoint_timeout=0), 'endpoint_timeout must be at least 1 second, not 0'),
    (dict(job_network_pool='10.47.0.0/33'), 'job_network_pool'),
    (dict(provider_host='https://api.anthropic.com'), "provider_host 'https://api.anthropic.com' is not a host name"),
    (dict(listed_host=''), "listed_host '' is not a host name"),
])
def test_canary_options_refused_before_the_daemon(change, fragment):
    params = dict(CANARY, **change)
    if fragment is None:
        _doctor.check_canary_options(params)
        options = _doctor.canary_options(params, '/d', check_mode=True)
        assert (options.proxy, options.deploy_dir, options.check_mode, options.firewall) == (
            'pi-dispatch-egress-proxy', '/d', True, dict(enabled=True, chain_prefix='PI-EGRESS', probe=True))
        return
    with pytest.raises(ValueError, match=re.escape(fragment)):
        _doctor.check_canary_options(params)


@pytest.mark.parametrize('change, expect', [
    ({}, True),  # an older caller that does not pass it: the mirror check runs, as before 0.9.0
    (dict(squid_mirror=True), True),
    (dict(squid_mirror=False), False),
])
def test_squid_mirror_switches_the_mirror_check(change, expect):
    options = _doctor.canary_options(dict(CANARY, **change), '/d')
    assert options.squid_candidate is expect


def test_the_switched_off_mirror_check_names_the_switch_and_starts_nothing():
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import squid as _squid

    class NoDaemon(object):
        def __getattr__(self, name):
            raise AssertionError('the switched-off mirror check called the daemon: %s' % name)

    ctx = type('Ctx', (), {'squid_candidate': False, 'client': NoDaemon(), 'attrs': {}, 'timings': {}})()
    candidate, why = _squid.squid_candidate_version(ctx)
    assert candidate is None and 'switched off (squid_mirror: false' in why and 'doctor_squid_mirror' in why
    line = [x for x in _squid.squid_lines('p', '6.13-2', None, candidate, why) if x.id == 'proxy.squid_mirror_unread']
    assert line and line[0].status == 'notrun' and 'switched off' in line[0].message


@pytest.mark.parametrize('actions, would_sweep, check_mode, changed', [
    ([], False, False, False),
    (['removed container x'], False, False, True),
    ([], True, True, True),
    ([], True, False, False),
])
def test_canary_result_is_changed_when_it_swept(actions, would_sweep, check_mode, changed):
    lines = [_doctor_lines.Line('leftovers.would_sweep' if would_sweep else 'proxy.running', 'ok', 'fine')]
    doctor = type('Ran', (), {'actions': actions, 'timings': {'probe': 0.12345}})()
    result = _doctor.canary_result(doctor, lines, check_mode=check_mode)
    assert result['changed'] is changed and result['timings'] == {'probe': 0.123}
    assert set(result) == {'changed', 'lines', 'report', 'json_lines', 'summary', 'actions', 'timings'}


# --- the limits line: rootless on cgroup v1, deployed with the consent ----------------------------------------

def _limits_venue(kind, rootless, cgroup):
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import venue as _venue
    found = _venue.Venue(kind, '4.3.1', '1.41', rootless)
    found.cgroup_version = cgroup
    return found


RUNNING_ATTRS = {'State': {'Running': True}, 'HostConfig': {'Memory': 0, 'PidsLimit': 0}}


@pytest.mark.parametrize('kind, rootless, cgroup, attrs, warned', [
    ('podman', True, '1', RUNNING_ATTRS, True),       # measured: Podman 4.3.1 rootless here reports Memory=0
    ('docker', True, '1', RUNNING_ATTRS, True),       # Docker documents the same for its rootless mode
    ('podman', False, '1', RUNNING_ATTRS, False),     # rootful on v1 applies them
    ('podman', True, '2', RUNNING_ATTRS, False),
    ('podman', True, '', RUNNING_ATTRS, False),       # an engine that does not say: no claim either way
    ('podman', True, '1', None, False),               # no proxy: proxy.missing says it
])
def test_the_limits_line_warns_only_where_the_engine_cannot_apply_them(kind, rootless, cgroup, attrs, warned):
    line = _doctor_proxy.limits_line('p', attrs, _limits_venue(kind, rootless, cgroup))
    assert (line is not None) is warned
    if warned:
        out = line.as_dict()
        assert out['id'] == 'proxy.limits_unenforced' and out['status'] == 'warn'
        assert 'cgroup v1 host' in out['message'] and 'Memory=0, PidsLimit=0' in out['message']
        assert 'cgroup v2' in out['fix'] and 'egress_proxy_limits_unenforced_ok' in out['fix']
