"""The doctor and the proxy's shards: the family lines, the probes through every shard, their names and lines."""

import re
import threading

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import doctor as _doctor
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import lines as _doctor_lines
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import names as _doctor_names
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import probes as _doctor_probes
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import shards as _doctor_shards
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import sweep as _doctor_sweep
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import endpoints as _endpoints
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy.shards import Member
from ansible_collections.pi_dispatch.egress.tests.unit.plugins.module_utils.fakes import EngineClient as FakeClient

PROXY = 'pi-dispatch-egress-proxy'
S1 = PROXY + '-shard-1'
S2 = PROXY + '-shard-2'
OWN = 4242
EP = _endpoints.Endpoint('m1', 'models.test', 11434, 1)


def member(index, state='running', health='healthy', load=0):
    name = PROXY if index == 0 else '%s-shard-%d' % (PROXY, index)
    return Member(name, index, state, ['pi-job-%d-%d-net' % (index, n) for n in range(load)], health=health)


def ids(lines):
    return [(line.id, line.status) for line in lines]


class NotFound(Exception):
    pass


@pytest.fixture(autouse=True)
def fake_not_found(monkeypatch):
    monkeypatch.setattr(dc, 'is_not_found', lambda exc: isinstance(exc, NotFound))
    monkeypatch.setattr(dc, 'api_message', str)


# --- the family line and the per-shard lines ------------------------------------------------------------

@pytest.mark.parametrize('case, family, expect', [
    ('no shard: nothing (a single-proxy report is unchanged)', [member(0, load=3)], []),
    ('no shard, proxy unhealthy: still nothing (proxy.health says it)', [member(0, health='unhealthy')], []),
    ('nothing at all', [], []),
    ('one healthy shard', [member(0, load=50), member(1, load=2)], [('proxy.shards', 'ok')]),
    ('a stopped shard carrying jobs', [member(0), member(1, state='exited', health='unhealthy', load=4)],
     [('proxy.shards', 'ok'), ('proxy.shard_stopped', 'fail')]),
    ('a stopped empty shard', [member(0), member(1, state='exited', load=0)],
     [('proxy.shards', 'ok'), ('proxy.shard_stopped', 'warn')]),
    ('a paused shard', [member(0), member(1, state='paused', load=1)],
     [('proxy.shards', 'ok'), ('proxy.shard_stopped', 'fail')]),
    ('an unhealthy shard', [member(0), member(1, health='unhealthy', load=1)],
     [('proxy.shards', 'ok'), ('proxy.shard_health', 'fail')]),
    ('a starting shard', [member(0), member(1, health='starting')],
     [('proxy.shards', 'ok'), ('proxy.shard_health', 'warn')]),
    ('a shard without a health check', [member(0), member(1, health=None)],
     [('proxy.shards', 'ok'), ('proxy.shard_health', 'warn')]),
    ('two shards, the second stopped', [member(0), member(1), member(2, state='exited', load=1)],
     [('proxy.shards', 'ok'), ('proxy.shard_stopped', 'fail')]),
    ('shards without the proxy (proxy.missing says it)', [member(1, load=1)], [('proxy.shards', 'ok')]),
])
def test_family_lines(case, family, expect):
    lines = _doctor_shards.family_lines(PROXY, family)
    assert ids(lines) == expect, case
    for line in lines:
        assert line.id in _doctor_lines.LINE_IDS
        if line.status in ('warn', 'fail'):
            assert line.fix, case


@pytest.mark.parametrize('family, text', [
    ([member(0, load=50), member(1, load=1)],
     'Egress proxy family of 2, with state, health and job networks: pi-dispatch-egress-proxy (running, healthy, '
     '50 job networks); pi-dispatch-egress-proxy-shard-1 (running, healthy, 1 job network)'),
    ([member(0, health=None), member(1, state='exited', load=0), member(2, health='starting', load=7)],
     'Egress proxy family of 3, with state, health and job networks: pi-dispatch-egress-proxy (running, no health '
     'check, 0 job networks); pi-dispatch-egress-proxy-shard-1 (exited, 0 job networks); '
     'pi-dispatch-egress-proxy-shard-2 (running, starting, 7 job networks)'),
    ([member(1, load=2)],
     'Egress proxy family of 2, with state, health and job networks: pi-dispatch-egress-proxy (missing); '
     'pi-dispatch-egress-proxy-shard-1 (running, healthy, 2 job networks)'),
])
def test_family_line_text(family, text):
    assert _doctor_shards.family_lines(PROXY, family)[0].message == text


@pytest.mark.parametrize('shard, words, fix', [
    (member(1, state='exited', load=3), ['Egress proxy shard stopped (%s is exited)' % S1,
                                         'the 3 job networks on it have no egress, so their jobs are refused'],
     'docker start %s' % S1),
    (member(1, state='exited', load=1), ['the 1 job network on it has no egress, so its job is refused'],
     'docker start %s' % S1),
    (member(1, state='paused', load=1), ['(%s is paused)' % S1], 'docker unpause %s' % S1),
    (member(1, state='dead', load=0), ['it carries no job network, so no job is cut'], 'docker rm %s' % S1),
    (member(1, health='unhealthy'), ['Egress proxy shard health: %s is unhealthy' % S1], 'docker restart %s' % S1),
    (member(1, health='starting'), ['Egress proxy shard health: %s is starting' % S1], 'docker inspect %s' % S1),
    (member(1, health=None), ['%s is unchecked (no health check is configured)' % S1], S1),
])
def test_shard_line_text(shard, words, fix):
    line = _doctor_shards.shard_line(shard)
    for word in words:
        assert word in line.message, line.message
    assert fix in line.fix


def test_a_healthy_running_shard_has_no_line_of_its_own():
    assert _doctor_shards.shard_line(member(1, load=9)) is None


@pytest.mark.parametrize('family, probed', [
    ([member(0)], []),
    ([member(0), member(1), member(2)], [S1, S2]),
    ([member(0), member(1, state='exited'), member(2)], [S2]),
    ([member(0), member(1, state='paused'), member(2, state='restarting')], []),
    ([member(0), member(1, health='unhealthy'), member(2, health='starting')], [S1, S2]),  # running: probed
    ([member(0, state='exited'), member(1)], [S1]),  # the proxy itself is never a lane
])
def test_which_members_the_shard_canary_runs_through(family, probed):
    assert [m.name for m in _doctor_shards.probed_shards(family)] == probed


def test_shards_unread_line():
    line = _doctor_shards.shards_unread_line(PROXY, 'connection reset')
    assert (line.id, line.status) == ('proxy.shards_unread', 'warn')
    assert 'connection reset' in line.message and 'io.pi-dispatch.egress.shard-of=%s' % PROXY in line.fix


# --- lines through a shard -------------------------------------------------------------------------------

SHARD_IDS = [line_id for line_id in _doctor_lines.LINE_IDS
             if line_id.startswith(('canary.shard_', 'endpoint.shard_'))]


def test_every_shard_id_is_the_variant_of_a_proxy_line_with_the_shard_in_its_wording():
    assert len(SHARD_IDS) == 21  # the 19 of the canary and the model endpoints, and the MCP server endpoint tunnel pair
    for line_id in SHARD_IDS:
        base = line_id.replace('.shard_', '.')
        assert _doctor_lines.shard_line_id(base) == line_id
        group, status, shape = _doctor_lines._BY_ID[line_id][1:]
        assert (group, status) == _doctor_lines._BY_ID[base][1:3], line_id
        assert shape == _doctor_lines.via_shard(_doctor_lines.shape(base), '<shard>'), line_id


@pytest.mark.parametrize('text, expect', [
    ('Egress policy reaches the provider (a answered 401, so ...)',
     'Egress policy reaches the provider through S (a answered 401, so ...)'),
    ('Egress policy lets an unlisted host through (d: x)', 'Egress policy lets an unlisted host through S (d: x)'),
    ('Egress policy lets plain HTTP through to l on port 443 (x)',
     'Egress policy lets plain HTTP through to l on port 443 through S (x)'),
    ('Model endpoint m1 answers through the proxy (GET ...)', 'Model endpoint m1 answers through S (GET ...)'),
    ('Model endpoint m1: the tunnel probe did not run (why (nested))',
     'Model endpoint m1: the tunnel probe did not run through S (why (nested))'),
    ('Egress canary could not be set up (x), so no probe ran',
     'Egress canary could not be set up through S (x), so no probe ran'),
    ('no parenthesis', 'no parenthesis through S'),
])
def test_via_shard(text, expect):
    assert _doctor_lines.via_shard(text, 'S') == expect


def parsed(code, connect, squid_error=None, rc=0):
    return dict(rc=rc, code=code, connect=connect, squid_error=squid_error, error='')


@pytest.mark.parametrize('line, line_id, text', [
    (_doctor_probes.classify_provider('api.provider.test', parsed(401, 200)), 'canary.shard_provider',
     'Egress policy reaches the provider through %s (api.provider.test answered 401, so the whole path works and no '
     'key was spent)' % S1),
    (_doctor_probes.classify_provider('api.provider.test', parsed(0, 403)), 'canary.shard_provider_unreached',
     'Egress policy does not reach the provider through %s (api.provider.test: the proxy answered the tunnel with 403 '
     '(refused by the rules))' % S1),
    (_doctor_probes.classify_deny('denied.test', parsed(0, 403)), 'canary.shard_deny',
     'Egress policy denies an unlisted host through %s (denied.test: the proxy refused the tunnel with 403; the deny '
     'direction is the half an allowlist can silently lose)' % S1),
    (_doctor_probes.classify_deny('denied.test', parsed(401, 200)), 'canary.shard_deny_leaks',
     'Egress policy lets an unlisted host through %s (denied.test: ' % S1),
    (_doctor_probes.classify_plain('api.provider.test', parsed(403, 0, 'ERR_ACCESS_DENIED 0')), 'canary.shard_plain',
     'Egress policy refuses plain HTTP to a listed host off port 80 through %s (api.provider.test:443 without a '
     'tunnel got squid\'s 403 ERR_ACCESS_DENIED; only a CONNECT reaches 443)' % S1),
    (_doctor_probes.classify_plain('api.provider.test', parsed(200, 0)), 'canary.shard_plain_leaks',
     'Egress policy lets plain HTTP through to api.provider.test on port 443 through %s (' % S1),
    (_doctor_probes.notrun_line('deny', 'it did not finish'), 'canary.shard_notrun',
     'Egress canary probe deny did not run through %s (it did not finish)' % S1),
    (_doctor_probes.classify_endpoint_tunnel(EP, parsed(200, 200), 15), 'endpoint.shard_tunnel',
     'Model endpoint m1 answers through %s (GET http://models.test:11434/v1/models through a CONNECT tunnel: 200)'
     % S1),
    (_doctor_probes.classify_endpoint_tunnel(EP, parsed(0, 503), 15), 'endpoint.shard_tunnel_fails',
     'Model endpoint m1 does not answer through %s (GET http://models.test:11434/v1/models' % S1),
    (_doctor_probes.classify_endpoint_port(EP, 'http://models.test:11435/', parsed(0, 403)),
     'endpoint.shard_port_exact',
     "Model endpoint m1's rule is port-exact through %s (a CONNECT to models.test:11435" % S1),
    (_doctor_probes.classify_endpoint_port(EP, 'http://models.test:11435/', parsed(0, 200)),
     'endpoint.shard_port_leaks', "Model endpoint m1's rule is not port-exact through %s (" % S1),
    (_doctor_probes.classify_endpoint_plain(EP, parsed(403, 0, 'ERR_ACCESS_DENIED 0')), 'endpoint.shard_plain',
     'Model endpoint m1 admits no plain forward request through %s (GET' % S1),
    (_doctor_probes.classify_endpoint_plain(EP, parsed(200, 0)), 'endpoint.shard_plain_leaks',
     'Model endpoint m1 admits a plain forward request through %s (GET' % S1),
    (_doctor_probes.endpoint_notrun_line(EP, 'tunnel', 'x'), 'endpoint.shard_notrun',
     'Model endpoint m1: the tunnel probe did not run through %s (x)' % S1),
])
def test_through_shard(line, line_id, text):
    got = _doctor_shards.through_shard(line, S1)
    assert (got.id, got.status) == (line_id, line.status)
    assert got.message.startswith(text), got.message
    if got.status in ('warn', 'fail'):
        assert got.fix.startswith(line.fix) and 'docker exec %s squid -k reconfigure' % S1 in got.fix


def test_shard_notrun_lines_per_shard_probe_and_endpoint_probe():
    canary, endpoint_lines = _doctor_shards.shard_notrun_lines(
        [member(1), member(2)], [(EP, kind) for kind in _doctor_probes.ENDPOINT_PROBES], 'the proxy is not running')
    assert [line.id for line in canary] == ['canary.shard_notrun'] * 10
    assert [line.message for line in canary][:5] == [
        'Egress canary probe %s did not run through %s (the proxy is not running)' % (probe, S1)
        for probe in _doctor_probes.PROBES]
    assert [line.id for line in endpoint_lines] == ['endpoint.shard_notrun'] * 6
    assert S2 in endpoint_lines[-1].message and 'plain-request' in endpoint_lines[-1].message
    assert _doctor_shards.shard_notrun_lines([], [(EP, 'tunnel')], 'x') == ([], [])


# --- names and the sweep -----------------------------------------------------------------------------------

def test_shard_names_carry_the_pid():
    net = _doctor_names.shard_network_name(77, 2)
    assert net == 'pi-dispatch-egress-doctor-77-shard-2'
    assert _doctor_names.parse_doctor_network(net) == 77
    assert _doctor_names.network_shard(net) == 2
    probe = _doctor_names.shard_probe_name(2, 'deny', 77)
    assert probe == 'pi-dispatch-egress-probe-shard-2-deny-77'
    assert _doctor_names.probe_pid(probe) == 77 and _doctor_names.probe_shard(probe) == 2
    endpoint_probe = _doctor_names.probe_name(_doctor_names.shard_key(2, 'endpoint-tunnel-m-1'), 77)
    assert _doctor_names.probe_pid(endpoint_probe) == 77 and _doctor_names.probe_shard(endpoint_probe) == 2


@pytest.mark.parametrize('name, pid, shard', [
    ('pi-dispatch-egress-doctor-12-shard-1', 12, 1),
    ('pi-dispatch-egress-doctor-12-shard-10', 12, 10),
    ('pi-dispatch-egress-doctor-12-shard-0', None, None),
    ('pi-dispatch-egress-doctor-12-shard-01', None, None),
    ('pi-dispatch-egress-doctor-12-shard-', None, None),
    ('pi-dispatch-egress-doctor-12-shard-1-x', None, None),
    ('pi-dispatch-egress-doctor-12', 12, None),
])
def test_shard_network_names(name, pid, shard):
    assert _doctor_names.parse_doctor_network(name) == pid
    assert _doctor_names.network_shard(name) == shard


@pytest.mark.parametrize('probe, net, expect', [
    ('pi-dispatch-egress-probe-shard-1-deny-12', 'pi-dispatch-egress-doctor-12-shard-1', True),
    ('pi-dispatch-egress-probe-shard-1-endpoint-tunnel-m1-12', 'pi-dispatch-egress-doctor-12-shard-1', True),
    ('pi-dispatch-egress-probe-shard-2-deny-12', 'pi-dispatch-egress-doctor-12-shard-1', False),
    ('pi-dispatch-egress-probe-deny-12', 'pi-dispatch-egress-doctor-12-shard-1', False),
    ('pi-dispatch-egress-probe-shard-1-deny-13', 'pi-dispatch-egress-doctor-12-shard-1', False),
    ('pi-dispatch-egress-probe-shard-1-deny-12', 'pi-dispatch-egress-doctor-12', False),  # its shard's, not this
    ('pi-dispatch-egress-probe-deny-12', 'pi-dispatch-egress-doctor-12', True),
    ('pi-dispatch-egress-probe-shard-1-deny-12', 'pi-job-doctor-12-a-net', False),
])
def test_probe_of_network_with_shards(probe, net, expect):
    assert _doctor_sweep.probe_of_network(probe, net, 12) is expect


class SweepAPI(object):
    def __init__(self, nets, attached, containers):
        self.nets, self.attached, self.all_containers = nets, attached, containers
        self.calls = []

    def networks(self, filters=None):
        return [dict(Name=n) for n in self.nets if n.startswith(filters['name'])]

    def containers(self, all=False, filters=None):
        if 'network' in filters:  # the sweep's ps -a --filter network=: what inspect lists here
            return [dict(Names=['/' + n]) for n in self.attached.get(filters['network'], [])]
        return [dict(Names=['/' + n]) for n in self.all_containers if n.startswith(filters['name'])]

    def inspect_network(self, name):
        return dict(Containers=dict(('id%d' % i, dict(Name=n)) for i, n in enumerate(self.attached.get(name, []))))

    def remove_container(self, name, force=False):
        self.calls.append(('rm', name))

    def disconnect_container_from_network(self, container, net, force=False):
        self.calls.append(('disconnect', container, net))

    def remove_network(self, name):
        self.calls.append(('network rm', name))


def doctor(api, **more):
    options = dict(provider_host='api.provider.test', deny_host='denied.test', pid=OWN, environ={}, isolation=False,
                   probe_timeout=1, start_grace=0, endpoint_timeout=1)
    options.update(more)
    return _doctor.Doctor(FakeClient(api), _doctor.DoctorOptions(PROXY, '/nonexistent', 'img', **options))


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


def test_sweep_of_a_killed_run_with_a_shard_network():
    canary, shard_net = 'pi-dispatch-egress-doctor-100', 'pi-dispatch-egress-doctor-100-shard-1'
    api = SweepAPI([canary, shard_net],
                   attached={canary: ['pi-dispatch-egress-probe-deny-100', PROXY],
                             shard_net: ['pi-dispatch-egress-probe-shard-1-deny-100', S1]},
                   containers=['pi-dispatch-egress-probe-shard-1-plain-100', 'pi-dispatch-egress-probe-plain-100'])
    lines = sweep(doctor(api), lambda pid: False)
    assert [line.id for line in lines] == ['leftovers.removed', 'leftovers.removed']
    assert lines[0].message == (
        'Egress canary: removed %s (after removing pi-dispatch-egress-probe-deny-100, '
        'pi-dispatch-egress-probe-plain-100 and detaching %s), left by an EARLIER doctor run' % (canary, PROXY))
    assert lines[1].message == (
        'Egress canary: removed %s (after removing pi-dispatch-egress-probe-shard-1-deny-100, '
        'pi-dispatch-egress-probe-shard-1-plain-100 and detaching %s), left by an EARLIER doctor run'
        % (shard_net, S1))
    assert ('disconnect', S1, shard_net) in api.calls and ('network rm', shard_net) in api.calls


def test_sweep_leaves_a_live_runs_shard_network_alone():
    api = SweepAPI(['pi-dispatch-egress-doctor-100-shard-1'], {}, [])
    assert sweep(doctor(api), lambda pid: True) == []
    assert api.calls == []


# --- the family read ---------------------------------------------------------------------------------------

class FamilyAPI(object):
    def __init__(self, inspects, listed, list_error=None):
        self.inspects, self.listed, self.list_error = inspects, listed, list_error

    def inspect_container(self, name):
        if name not in self.inspects:
            raise NotFound(name)
        return self.inspects[name]

    def containers(self, all=False, filters=None):
        if self.list_error:
            raise Exception(self.list_error)
        assert filters == {'label': 'io.pi-dispatch.egress.shard-of=%s' % PROXY}
        return self.listed


def inspect(name, status='running', health='healthy', nets=()):
    state = {'Status': status, 'Running': status == 'running'}
    if health:
        state['Health'] = {'Status': health}
    return {'Name': '/' + name, 'State': state, 'NetworkSettings': {'Networks': dict((n, {}) for n in nets)}}


def summary(name, index, state='running', nets=()):
    return {'Names': ['/' + name], 'State': state, 'Status': 'Up',
            'Labels': {'io.pi-dispatch.egress.shard-of': PROXY, 'io.pi-dispatch.egress.shard-index': str(index)},
            'NetworkSettings': {'Networks': dict((n, {}) for n in nets)}}


def test_proxy_family_reads_each_shards_health():
    api = FamilyAPI({PROXY: inspect(PROXY, nets=['up', 'pi-job-a-net']),
                     S1: inspect(S1, health='unhealthy', nets=['up', 'pi-job-b-net'])},
                    [summary(S1, 1, nets=['up', 'pi-job-b-net']), summary(S2, 2, state='exited')])
    family, lines = _doctor_shards.read_family(doctor(api).ctx)
    assert [(m.name, m.state, m.health, m.load) for m in family] == [
        (PROXY, 'running', 'healthy', 1), (S1, 'running', 'unhealthy', 1), (S2, 'exited', None, 0)]
    assert ids(lines) == [('proxy.shards', 'ok'), ('proxy.shard_health', 'fail'), ('proxy.shard_stopped', 'warn')]


def test_proxy_family_without_shards_says_nothing():
    family, lines = _doctor_shards.read_family(doctor(FamilyAPI({PROXY: inspect(PROXY)}, [])).ctx)
    assert [m.name for m in family] == [PROXY] and lines == []


def test_proxy_family_unlisted():
    api = FamilyAPI({PROXY: inspect(PROXY)}, [], list_error='connection reset')
    family, lines = _doctor_shards.read_family(doctor(api).ctx)
    assert family == [] and ids(lines) == [('proxy.shards_unread', 'warn')]


# --- the canary through the proxy and its shards, against a fake engine ----------------------------------------

MARK = _doctor_probes.PROBE_MARK


def output(code, connect, squid_error=None):
    headers = 'X-Squid-Error: %s\n' % squid_error if squid_error else ''
    return '%s %03d %03d\n%s-rc 0\n%s-headers\n%s%s-stderr\n' % (MARK, code, connect, MARK, MARK, headers, MARK)


PASSING = {
    "'https://api.provider.test/'": output(401, 200),
    "'https://denied.test/'": output(0, 403),
    "'http://api.provider.test:443/'": output(403, 0, 'ERR_ACCESS_DENIED 0'),
    # the TLS name check cuts both: the tunnel opened (200), nothing answered (0)
    "--connect-to 'denied.test:443:api.provider.test:443' 'https://denied.test/'": output(0, 200),
    "-p 'http://api.provider.test:443/'": output(0, 200),
    "-p 'http://models.test:11434/v1/models'": output(200, 200),
    "-p 'http://models.test:11435/'": output(0, 403),
    "'http://models.test:11434/v1/models'": output(403, 0, 'ERR_ACCESS_DENIED 0'),
}


class CanaryAPI(object):
    """Networks, probe containers and their output; ``leaky``: networks whose proxy lets the deny host through."""

    def __init__(self, leaky=(), fail_create=(), stuck=()):
        self.leaky, self.fail_create, self.stuck = set(leaky), set(fail_create), set(stuck)
        self.calls = []
        self.containers_made = {}
        self.lock = threading.Lock()

    def _call(self, *call):
        with self.lock:
            self.calls.append(call)

    def create_network(self, name, **kwargs):
        self._call('network create', name, kwargs.get('internal'), kwargs.get('labels'))
        if name in self.fail_create:
            raise Exception('could not find an available, non-overlapping IPv4 address pool')

    def connect_container_to_network(self, container, net, aliases=None):
        self._call('connect', container, net, aliases)

    def create_endpoint_config(self, **kwargs):
        return kwargs

    def create_host_config(self, **kwargs):
        return kwargs

    def create_networking_config(self, config):
        return config

    def create_container(self, image, command, name=None, host_config=None, **kwargs):
        net = host_config['network_mode']
        self._call('create', name, net)
        with self.lock:
            self.containers_made[name] = (net, command[-1])
        return {'Id': name}

    def start(self, cid):
        pass

    def wait(self, cid, timeout=None):
        return {'StatusCode': 0}

    def logs(self, cid, stdout=True, stderr=True):
        net, script = self.containers_made[cid]
        if net in self.leaky and "'https://denied.test/'" in script:
            return output(401, 200).encode()
        for needle in sorted(PASSING, key=len, reverse=True):
            if needle in script:
                return PASSING[needle].encode()
        return b'sh: curl: not found\n'

    def remove_container(self, name, force=False):
        self._call('rm', name)
        if name in self.stuck:
            raise Exception('device or resource busy')

    def disconnect_container_from_network(self, container, net, force=False):
        self._call('disconnect', container, net)

    def remove_network(self, name):
        self._call('network rm', name)


@pytest.fixture
def image_present(monkeypatch):
    monkeypatch.setattr(dc, 'get_image', lambda client, name: object())


NET = 'pi-dispatch-egress-doctor-%d' % OWN
CANARY_OK = [('canary.provider', 'ok'), ('canary.deny', 'ok'), ('canary.plain', 'ok'), ('canary.sni', 'ok'),
             ('canary.tunnel_plain', 'ok')]
SHARD_OK = [('canary.shard_provider', 'ok'), ('canary.shard_deny', 'ok'), ('canary.shard_plain', 'ok'),
            ('canary.shard_sni', 'ok'), ('canary.shard_tunnel_plain', 'ok')]
NET1 = 'pi-dispatch-egress-doctor-%d-shard-1' % OWN
NET2 = 'pi-dispatch-egress-doctor-%d-shard-2' % OWN


def test_canary_without_shards_is_what_it_was(image_present):
    api = CanaryAPI()
    lines, endpoint_lines, _iso = run_canary(doctor(api))
    assert ids(lines) == CANARY_OK
    assert endpoint_lines == []
    assert sorted(name for name, (net, _s) in api.containers_made.items()) == sorted(
        'pi-dispatch-egress-probe-%s-%d' % (probe, OWN) for probe in _doctor_probes.PROBES)
    assert [c for c in api.calls if c[0] in ('network create', 'connect', 'disconnect', 'network rm')] == [
        ('network create', NET, True, {'io.pi-dispatch.egress.doctor': str(OWN)}), ('connect', PROXY, NET, None),
        ('disconnect', PROXY, NET), ('network rm', NET)]


def test_canary_runs_through_every_running_shard(image_present):
    api = CanaryAPI()
    family = [member(0), member(1, load=3), member(2, state='exited', load=1)]
    lines, endpoint_lines, _iso = run_canary(doctor(api), family)
    assert ids(lines) == CANARY_OK + SHARD_OK
    assert all(S1 in line.message for line in lines[5:])
    assert not [line for line in lines if S2 in line.message]  # a stopped shard is not probed
    assert endpoint_lines == []
    # The shard's own network, the shard attached under the proxy's name; its probes on it.
    assert ('network create', NET1, True, {'io.pi-dispatch.egress.doctor': str(OWN)}) in api.calls
    assert ('connect', S1, NET1, [PROXY]) in api.calls
    assert not [c for c in api.calls if c[0] == 'network create' and c[1] == NET2]
    on = dict((name, net) for name, (net, _s) in api.containers_made.items())
    for probe in _doctor_probes.PROBES:
        assert on['pi-dispatch-egress-probe-%s-%d' % (probe, OWN)] == NET
        assert on['pi-dispatch-egress-probe-shard-1-%s-%d' % (probe, OWN)] == NET1
    # Every probe dials the proxy's name (which is the shard on the shard's network).
    assert all("--proxy http://%s:3128" % PROXY in script for _net, script in api.containers_made.values())
    # Torn down: every probe, then each network with its member detached.
    for name in on:
        assert ('rm', name) in api.calls
    assert ('disconnect', S1, NET1) in api.calls and ('network rm', NET1) in api.calls
    assert ('network rm', NET) in api.calls


def test_canary_endpoint_probes_run_through_shards_too(image_present):
    api = CanaryAPI()
    doc = doctor(api)
    doc.ctx.endpoints_loaded = [EP]
    lines, endpoint_lines, _iso = run_canary(doc, [member(0), member(1)])
    assert ids(lines)[5:] == SHARD_OK
    assert ids(endpoint_lines) == [
        ('endpoint.tunnel', 'ok'), ('endpoint.port_exact', 'ok'), ('endpoint.plain', 'ok'),
        ('endpoint.shard_tunnel', 'ok'), ('endpoint.shard_port_exact', 'ok'), ('endpoint.shard_plain', 'ok')]
    assert endpoint_lines[3].message == ('Model endpoint m1 answers through %s (GET http://models.test:11434/v1/models '
                                         'through a CONNECT tunnel: 200)' % S1)
    on = dict((name, net) for name, (net, _s) in api.containers_made.items())
    assert on['pi-dispatch-egress-probe-shard-1-endpoint-tunnel-m1-%d' % OWN] == NET1
    assert on['pi-dispatch-egress-probe-endpoint-tunnel-m1-%d' % OWN] == NET
    assert len(on) == 16


def test_a_shard_that_leaks_is_named(image_present):
    api = CanaryAPI(leaky=[NET2])
    lines, _endpoint_lines, _iso = run_canary(doctor(api), [member(0), member(1), member(2)])
    by_id = dict((line.id, line) for line in lines)
    assert by_id['canary.deny'].status == 'ok'
    assert [line.id for line in lines if line.id.startswith('canary.shard_deny')] == [
        'canary.shard_deny', 'canary.shard_deny_leaks']
    leak = by_id['canary.shard_deny_leaks']
    assert leak.status == 'fail' and leak.message.startswith(
        'Egress policy lets an unlisted host through %s (denied.test: ' % S2)
    assert 'docker exec %s squid -k reconfigure' % S2 in leak.fix


def test_a_shard_network_that_cannot_be_made_is_not_run_and_the_rest_runs(image_present):
    api = CanaryAPI(fail_create=[NET1])
    doc = doctor(api)
    doc.ctx.endpoints_loaded = [EP]
    lines, endpoint_lines, _iso = run_canary(doc, [member(0), member(1), member(2)])
    assert ids(lines) == CANARY_OK + [('canary.shard_setup', 'notrun')] + SHARD_OK
    assert lines[5].message.startswith('Egress canary could not be set up through %s (creating %s: ' % (S1, NET1))
    assert [line.id for line in endpoint_lines[3:6]] == ['endpoint.shard_notrun'] * 3
    assert all(S1 in line.message for line in endpoint_lines[3:6])
    assert all(S2 in line.message for line in endpoint_lines[6:])
    assert not [name for name in api.containers_made if 'shard-1-' in name]


def test_the_proxy_network_failing_still_runs_the_shards(image_present):
    api = CanaryAPI(fail_create=[NET])
    lines, _endpoint_lines, _iso = run_canary(doctor(api), [member(0), member(1)])
    assert ids(lines) == [('canary.setup', 'notrun')] + SHARD_OK
    assert ('network rm', NET) not in api.calls and ('network rm', NET1) in api.calls


def test_missing_probe_image_says_every_shard_did_not_run(monkeypatch):
    monkeypatch.setattr(dc, 'get_image', lambda client, name: None)
    api = CanaryAPI()
    lines, _endpoint_lines, _iso = run_canary(doctor(api), [member(0), member(1)])
    assert ids(lines) == [('canary.setup', 'notrun')] + [('canary.shard_notrun', 'notrun')] * 5
    assert api.calls == []


def test_a_stuck_shard_probe_keeps_only_its_shard_network(image_present):
    api = CanaryAPI(stuck=['pi-dispatch-egress-probe-shard-1-deny-%d' % OWN])
    lines, _endpoint_lines, _iso = run_canary(doctor(api), [member(0), member(1)])
    kept = [line for line in lines if line.id == 'canary.cleanup_kept']
    assert len(kept) == 1 and kept[0].message.startswith('Egress canary: %s is kept' % NET1)
    assert ('network rm', NET1) not in api.calls and ('network rm', NET) in api.calls


def test_the_family_lines_are_proxy_lines_naming_the_shard():
    for line_id in ('proxy.shards', 'proxy.shard_stopped', 'proxy.shard_health', 'proxy.shards_unread'):
        assert _doctor_lines._BY_ID[line_id][1] == 'proxy' and re.match(r'^[a-z_.]+$', line_id)
    for line_id in ('proxy.shard_stopped', 'proxy.shard_health'):
        assert '<shard>' in _doctor_lines.shape(line_id)


# --- the isolation check when the job-network API puts its networks on a shard ---------------------------------

class JobNet(object):
    def __init__(self, network, subnet, proxy):
        self.network, self.subnet, self.proxy = network, subnet, proxy


class IsolationAPI(CanaryAPI):
    def __init__(self, carriers):
        super(IsolationAPI, self).__init__()
        self.carriers = carriers  # network -> (carrier, its address there)

    def inspect_network(self, name):
        carrier, address = self.carriers[name]
        return {'Containers': {'c1': {'Name': carrier, 'IPv4Address': address + '/29'}}}


@pytest.mark.parametrize('carrier_b', [PROXY, S1])
def test_isolation_finds_the_member_that_carries_each_job_network(monkeypatch, carrier_b):
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import isolation as _doctor_isolation
    nets = {'a': JobNet('pi-job-doctor-%d-a-net' % OWN, '10.47.0.8/29', PROXY),
            'b': JobNet('pi-job-doctor-%d-b-net' % OWN, '10.47.0.16/29', carrier_b)}
    monkeypatch.setattr(_doctor_isolation._jobnet_lifecycle, 'create_job_network',
                        lambda client, job_id, **kwargs: nets[job_id[-1]])
    monkeypatch.setattr(_doctor_isolation._jobnet_teardown, 'teardown_job_network',
                        lambda client, job_id, **kwargs: None)
    api = IsolationAPI({nets['a'].network: (PROXY, '10.47.0.9'), nets['b'].network: (carrier_b, '10.47.0.17')})
    lines = _doctor_isolation.IsolationCheck().lines(doctor(api, isolation=True).ctx)
    assert not [line for line in lines if 'has no address' in line.message], lines
    scripts = dict((name, script) for name, (_net, script) in api.containers_made.items())
    # Peer a dials the address of b's carrier (the proxy or the shard) on the other network.
    assert '10.47.0.17:3128' in scripts['pi-dispatch-egress-probe-peer-a-%d' % OWN]
    assert '10.47.0.9:3128' in scripts['pi-dispatch-egress-probe-peer-b-%d' % OWN]


@pytest.mark.parametrize('loads, words', [
    ([1], '1 job network on p-shard-1 still has egress through it; new jobs are refused until p runs again, '
          'and the checks below ran through the shard'),
    ([3, 2], '5 job networks on p-shard-1, p-shard-2 still have egress through them; new jobs are refused until p '
             'runs again, and the checks below ran through the shards'),
])
def test_the_shards_serving_line(loads, words):
    serving = [Member('p-shard-%d' % (i + 1), i + 1, 'running',
                      ['pi-job-%d-%d-net' % (i, n) for n in range(load)]) for i, load in enumerate(loads)]
    line = _doctor_shards.shards_serving_line('p', serving)
    assert line.id == 'proxy.shards_serving' and line.status == 'warn'
    assert line.message == 'Egress proxy down, shards serving: ' + words
    assert line.fix.startswith('docker start p ')
