"""Unit tables for plugins/module_utils/jobnet.py (the published facade) and its _jobnet_*.py files (no daemon).

Public names are reached through the facade ``jn``, so the tables also prove what it exports; the
internal helpers through their own file.
"""

import ipaddress
import os

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as jn
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import engine
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import gc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import lifecycle
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import names
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import pool
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import preflight as pf
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import teardown

PROXY = jn.PROXY_NAME
NOW = 1_800_000_000


# ---------------------------------------------------------------- job ids

@pytest.mark.parametrize('job_id', ['1', '1234', 'job-1234', 'a_b', 'A9', 'x' * 64, 'it5-abc', 'a-b_c-9'])
def test_valid_job_ids(job_id):
    assert jn.validate_job_id(job_id) == job_id


@pytest.mark.parametrize('job_id', ['', '-a', 'a-', '_a', 'a_', 'a.b', 'a/b', 'a b', '../x', 'x' * 65,
                                    'ä', 'a;rm', None, 12, 'a\n', 'a:b'])
def test_invalid_job_ids(job_id):
    with pytest.raises(jn.JobNetError):
        jn.validate_job_id(job_id)


@pytest.mark.parametrize('job_id,net,cont', [
    ('1234', 'pi-job-1234-net', 'pi-job-1234'),
    ('a-net', 'pi-job-a-net-net', 'pi-job-a-net'),
])
def test_names(job_id, net, cont):
    assert jn.network_name(job_id) == net
    assert jn.container_name(job_id) == cont
    assert jn.job_id_from_network_name(net) == job_id


@pytest.mark.parametrize('name,expected', [
    ('pi-job-1234-net', '1234'), ('pi-job--net', None), ('pi-job-a.b-net', None), ('pi-job-1234', None),
    ('pi-dispatch-egress-out', None), ('bridge', None), ('xpi-job-1-net', None), (None, None),
])
def test_job_id_from_network_name(name, expected):
    assert jn.job_id_from_network_name(name) == expected


def test_names_refuse_bad_ids():
    with pytest.raises(jn.JobNetError):
        jn.network_name('a/../b')


@pytest.mark.parametrize('prefix,ok', [
    ('', True), ('it5-', True), ('it5_', True), ('it5-\n', False), ('-x', False), ('a b', False)])
def test_id_prefix(prefix, ok):
    if ok:
        assert jn.validate_id_prefix(prefix) == prefix
    else:
        with pytest.raises(jn.JobNetError):
            jn.validate_id_prefix(prefix)


def test_labels_env_run_args():
    labels = jn.job_labels('7', now=0, host='h')
    assert labels == {jn.LABEL_JOB_ID: '7', jn.LABEL_CREATED: '1970-01-01T00:00:00Z', jn.LABEL_OWNER_HOST: 'h'}
    env = jn.job_env()
    assert env['HTTPS_PROXY'] == env['HTTP_PROXY'] == 'http://pi-dispatch-egress-proxy:3128'
    assert env['NO_PROXY'] == jn.NO_PROXY and env['NODE_USE_ENV_PROXY'] == '1'
    assert all(k == k.upper() for k in env)
    args = jn.JobNetwork('7', 'pi-job-7-net', 'pi-job-7', '10.47.0.0/29', env).run_args()
    assert args[:4] == ['--name', 'pi-job-7', '--network', 'pi-job-7-net']
    assert '-e' in args and 'HTTPS_PROXY=http://pi-dispatch-egress-proxy:3128' in args


@pytest.mark.parametrize('text,epoch', [
    ('2027-01-15T08:00:00Z', 1800000000), ('2027-01-15T08:00:00.5Z', 1800000000.5),
    ('2027-01-15T09:00:00+01:00', 1800000000), ('0001-01-01T00:00:00Z', None), ('garbage', None), (None, None),
])
def test_parse_time(text, epoch):
    assert names.parse_time(text) == epoch


# ---------------------------------------------------------------- subnets

@pytest.mark.parametrize('taken,expected', [
    ([], '10.47.0.0/29'),
    (['10.47.0.0/29'], '10.47.0.8/29'),
    (['10.47.0.0/29', '10.47.0.16/29'], '10.47.0.8/29'),
    (['10.47.0.4/32'], '10.47.0.8/29'),           # a host route inside the first /29
    (['10.47.0.0/24'], '10.47.1.0/29'),           # a wider route blocks a whole range
    (['172.17.0.0/16', '192.168.0.0/16'], '10.47.0.0/29'),  # outside the pool: irrelevant
    (['10.47.0.0/29', 'not-a-net', 'fe80::/64'], '10.47.0.8/29'),
])
def test_allocate_subnet(taken, expected):
    assert str(pool.allocate_subnet('10.47.0.0/16', 29, taken)) == expected


def test_allocate_is_never_overlapping_and_fills_the_pool():
    taken = []
    for _attempt in range(32):
        net = pool.allocate_subnet('10.47.0.0/24', 29, taken)
        assert not any(net.overlaps(t) for t in taken)
        taken.append(net)
    with pytest.raises(jn.PoolExhausted) as exc:
        pool.allocate_subnet('10.47.0.0/24', 29, taken)
    assert '10.47.0.0/24' in str(exc.value) and 'gc.yml' in str(exc.value)


@pytest.mark.parametrize('taken', [['10.0.0.0/8'], ['0.0.0.0/1'], ['10.47.0.0/16']])
def test_allocate_exhausted_by_covering_route(taken):
    with pytest.raises(jn.PoolExhausted):
        pool.allocate_subnet('10.47.0.0/16', 29, taken)


def test_default_pool_capacity():
    assert jn.pool_capacity() == 8192
    assert jn.pool_capacity('10.47.0.0/24', 29) == 32


@pytest.mark.parametrize('pool,prefix', [('10.47.0.1/16', 29), ('fd00::/64', 29), ('nope', 29),
                                         ('10.47.0.0/16', 30), ('10.47.0.0/16', 8), ('10.47.0.0/16', 'x')])
def test_bad_pool_or_prefix(pool, prefix):
    with pytest.raises(jn.JobNetError):
        jn.parse_pool(pool, prefix)


def test_parse_proc_net_route():
    text = ('Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n'
            'eth0\t00000000\t0100A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n'
            'eth0\t0000A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n'
            'docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n'
            'short line\n')
    assert [str(n) for n in pool.parse_proc_net_route(text)] == ['192.168.0.0/24', '172.17.0.0/16']


def test_parse_ip_json_routes():
    text = ('[{"dst":"default","gateway":"192.168.0.1"},{"dst":"192.168.0.0/24"},'
            '{"dst":"10.47.0.5"},{"dst":"fe80::/64"}]')
    assert [str(n) for n in pool.parse_ip_json_routes(text)] == ['192.168.0.0/24', '10.47.0.5/32']
    assert pool.parse_ip_json_routes('not json') == []


def test_network_subnets():
    nets = [{'IPAM': {'Config': [{'Subnet': '172.18.0.0/16'}, {'Subnet': 'fd00::/64'}]}}, {'IPAM': None}, {}]
    assert pool.network_subnets(nets) == [ipaddress.ip_network('172.18.0.0/16')]


# ---------------------------------------------------------------- picking a subnet on a daemon

class _Nets(object):
    """A daemon's networks (shard_bound 0: the proxy is only connected). ``hidden`` subnets are refused as
    overlapping but never listed (another address space); ``racer``: what another creator takes just
    before each create call (None: nothing)."""

    def __init__(self, hidden=(), racer=()):
        self.api, self.nets, self.calls = self, {}, []
        self.hidden, self.racer = [ipaddress.ip_network(h) for h in hidden], list(racer)

    def networks(self, filters=None):
        self.calls.append('networks')
        return [dict(Name=n, Id='n-' + n, IPAM={'Config': [{'Subnet': s}]}) for n, s in self.nets.items()]

    def create_network(self, name, ipam=None, **_kw):
        self.calls.append('create')
        taken = self.racer.pop(0) if self.racer else None
        if taken:
            self.nets['other-%d' % len(self.nets)] = taken
        subnet = ipaddress.ip_network(ipam['Config'][0]['Subnet'])
        if any(subnet.overlaps(ipaddress.ip_network(s)) for s in self.nets.values()) or \
                any(subnet.overlaps(h) for h in self.hidden):
            raise _api_error(403, 'Pool overlaps with other one on this address space')
        self.nets[name] = str(subnet)
        return {'Id': 'n-' + name}

    def connect_container_to_network(self, *_args, **_kw):
        self.calls.append('connect')

    def inspect_network(self, ref):
        self.calls.append('inspect')
        raise _api_error(404, 'network %s not found' % ref)


def _api_error(status, message):
    import docker.errors
    import requests
    resp = requests.Response()
    resp.status_code = status
    return docker.errors.APIError(message, response=resp, explanation=message)


class _Start(object):
    """Stands in for ``random`` in _jobnet_lifecycle: the pick after a refusal starts at ``index``."""

    def __init__(self, index):
        self.index, self.asked = index, []

    def randrange(self, capacity):
        self.asked.append(capacity)
        return self.index


@pytest.fixture
def lowest_start(monkeypatch):
    """A pick after a refusal starts at the pool's start too (index 0), as the tables below expect."""
    start = _Start(0)
    monkeypatch.setattr(lifecycle, 'random', start)
    return start


def test_a_pick_after_a_refusal_starts_at_a_random_place_in_the_pool(monkeypatch):
    start = _Start(100)
    monkeypatch.setattr(lifecycle, 'random', start)
    d = _Nets(hidden=['10.47.0.0/29', '10.47.3.32/29'])
    net = jn.create_job_network(d, 'a', routes=[], shard_bound=0)
    # 10.47.0.0 refused; the next pick starts at /29 number 100 (10.47.3.32), refused too; then 101.
    assert net.subnet == '10.47.3.40/29' and start.asked == [8192, 8192]


@pytest.mark.parametrize('index, taken, expected', [
    (0, [], '10.47.0.0/29'),
    (3, [], '10.47.0.24/29'),
    (3, ['10.47.0.24/29'], '10.47.0.32/29'),
    (8191, ['10.47.255.248/29'], '10.47.0.0/29'),         # wraps round to the pool's start
    (8192 + 2, [], '10.47.0.16/29'),                      # modulo the capacity
])
def test_allocate_subnet_from_a_start(index, taken, expected):
    assert str(pool.allocate_subnet('10.47.0.0/16', 29, taken, start=index)) == expected


def test_allocate_subnet_from_a_start_still_knows_a_full_pool():
    taken = ['10.47.0.0/24']
    with pytest.raises(pool.PoolExhausted):
        pool.allocate_subnet('10.47.0.0/24', 29, taken, start=5)


def test_a_subnet_refused_as_overlapping_is_skipped_and_the_networks_listed_again(lowest_start):
    d = _Nets(hidden=['10.47.0.0/29'], racer=[None, '10.47.0.8/29'])
    net = jn.create_job_network(d, 'a', routes=[], shard_bound=0)
    # 10.47.0.0 refused (hidden), listed again; 10.47.0.8 taken meanwhile, listed again; then 10.47.0.16.
    assert net.subnet == '10.47.0.16/29'
    assert d.calls == ['networks', 'create', 'networks', 'create', 'networks', 'create', 'connect']
    del d.calls[:]
    # The refused subnet stays taken in the client's book: the next create lists nothing, is refused nothing.
    assert jn.create_job_network(d, 'b', routes=[], shard_bound=0).subnet == '10.47.0.24/29'
    assert d.calls == ['create', 'connect']


def test_overlap_refusals_give_up_after_the_bound_with_what_was_tried(lowest_start):
    hidden = ['10.47.0.%d/29' % (8 * i) for i in range(jn.CREATE_ATTEMPTS)]
    d = _Nets(hidden=hidden)
    with pytest.raises(jn.EngineError) as caught:
        jn.create_job_network(d, 'a', routes=[], shard_bound=0)
    text = str(caught.value)
    assert 'refused %d subnets of 10.47.0.0/16 in a row as overlapping' % jn.CREATE_ATTEMPTS in text
    assert all(h in text for h in hidden) and 'Pool overlaps' in text and 'Nothing was created' in text
    assert d.calls.count('create') == jn.CREATE_ATTEMPTS and d.nets == {}
    assert caught.value.retryable is True                  # a race lost: calling again is the fix


def test_the_book_is_read_again_after_a_minute_and_routes_still_count():
    d = _Nets()
    jn.create_job_network(d, 'a', routes=[], shard_bound=0)
    d.nets['elsewhere'] = '10.47.0.8/29'              # made by another process: unknown to the book
    engine.client_memo(d)['subnets'].read_at -= pool.BOOK_SECONDS
    del d.calls[:]
    net = jn.create_job_network(d, 'b', routes=['10.47.0.16/28'], shard_bound=0)
    assert net.subnet == '10.47.0.32/29' and d.calls == ['networks', 'create', 'connect']


def test_a_full_book_is_read_again_before_the_pool_counts_as_exhausted():
    d = _Nets()
    jn.create_job_network(d, 'a', pool='10.47.0.0/28', routes=[], shard_bound=0)
    jn.create_job_network(d, 'b', pool='10.47.0.0/28', routes=[], shard_bound=0)
    del d.nets['pi-job-a-net']                        # removed by another process
    del d.calls[:]
    assert jn.create_job_network(d, 'c', pool='10.47.0.0/28', routes=[], shard_bound=0).subnet == '10.47.0.0/29'
    assert d.calls == ['networks', 'create', 'connect']
    del d.calls[:]
    with pytest.raises(jn.PoolExhausted):
        jn.create_job_network(d, 'd', pool='10.47.0.0/28', routes=[], shard_bound=0)
    assert d.calls == ['networks', 'inspect']     # read again, and not there already: exhausted indeed


@pytest.mark.parametrize('message, taken', [
    ('Pool overlaps with other one on this address space', True),
    ('conflicts with network n-1 (br-1): networks have overlapping IPv4', True),
    ('subnet 10.47.0.0/29 is already used on the host or by another config', True),   # Podman
    ('network with name pi-job-1-net already exists', False),
])
def test_what_counts_as_the_subnet_being_taken(message, taken):
    assert lifecycle._overlap_refused(message) is taken


# ---------------------------------------------------------------- the sweep

OURS = {jn.LABEL_JOB_ID: '9', jn.LABEL_CREATED: '2027-01-15T07:00:00Z', jn.LABEL_OWNER_HOST: 'h'}
P = {'name': PROXY, 'state': 'running'}


def m(name, state):
    return {'name': name, 'state': state}


# (name, labels, members, options) -> (action, reason, detach, remove_containers)
SWEEP_TABLE = [
    ('proxy-only', 'pi-job-9-net', OURS, [P], {}, ('remove', None, [PROXY], [])),
    ('empty', 'pi-job-9-net', OURS, [], {}, ('remove', None, [], [])),
    ('unlabelled', 'pi-job-9-net', {}, [P], {}, ('remove', None, [PROXY], [])),
    ('stopped proxy only', 'pi-job-9-net', OURS, [m(PROXY, 'exited')], {}, ('remove', None, [PROXY], [])),
    ('stale endpoint', 'pi-job-9-net', OURS, [P, m('gone', gc.MISSING)], {}, ('remove', None, ['gone', PROXY], [])),
    ('job running', 'pi-job-9-net', OURS, [P, m('pi-job-9', 'running')], {}, ('keep', 'job-running', [], [])),
    ('job paused', 'pi-job-9-net', OURS, [P, m('pi-job-9', 'paused')], {}, ('keep', 'job-running', [], [])),
    ('job restarting', 'pi-job-9-net', OURS, [m('pi-job-9', 'restarting')], {}, ('keep', 'job-running', [], [])),
    ('other running', 'pi-job-9-net', OURS, [P, m('intruder', 'running')], {}, ('keep', 'member-running', [], [])),
    ('job created', 'pi-job-9-net', OURS, [P, m('pi-job-9', 'created')], {}, ('keep', 'job-created', [], [])),
    ('job created, remove on', 'pi-job-9-net', OURS, [m('pi-job-9', 'created')], {'remove_exited_jobs': True},
     ('keep', 'job-created', [], [])),
    ('job stopped', 'pi-job-9-net', OURS, [P, m('pi-job-9', 'exited')], {}, ('keep', 'job-stopped', [], [])),
    ('job dead', 'pi-job-9-net', OURS, [P, m('pi-job-9', 'dead')], {}, ('keep', 'job-stopped', [], [])),
    ('job stopped, remove on', 'pi-job-9-net', OURS, [P, m('pi-job-9', 'exited')], {'remove_exited_jobs': True},
     ('remove', None, [PROXY], ['pi-job-9'])),
    ('other stopped', 'pi-job-9-net', OURS, [P, m('other', 'exited')], {}, ('keep', 'member-stopped', [], [])),
    ('other stopped, remove on', 'pi-job-9-net', OURS, [m('other', 'exited')], {'remove_exited_jobs': True},
     ('keep', 'member-stopped', [], [])),
    ('other created', 'pi-job-9-net', OURS, [m('other', 'created')], {}, ('keep', 'member-stopped', [], [])),
    ('removing', 'pi-job-9-net', OURS, [m('pi-job-9', 'removing')], {}, ('keep', 'member-removing', [], [])),
    ('running beats stopped', 'pi-job-9-net', OURS, [m('other', 'exited'), m('pi-job-9', 'running')], {},
     ('keep', 'job-running', [], [])),
    ('too young', 'pi-job-9-net', OURS, [P], {'min_age': 7200}, ('keep', 'too-young', [], [])),
    ('old enough', 'pi-job-9-net', OURS, [P], {'min_age': 600}, ('remove', None, [PROXY], [])),
    ('age unknown', 'pi-job-9-net', OURS, [P], {'min_age': 600, 'created': None}, ('keep', 'age-unknown', [], [])),
    ('foreign labels', 'pi-job-9-net', {'com.example': 'x'}, [P], {}, ('keep', 'foreign-labels', [], [])),
    ('label mismatch', 'pi-job-9-net', dict(OURS, **{jn.LABEL_JOB_ID: '8'}), [P], {},
     ('keep', 'label-mismatch', [], [])),
    ('invalid id in name', 'pi-job-a.b-net', {}, [P], {}, ('keep', 'job-id-invalid', [], [])),
    ('foreign name', 'my-net', {}, [P], {}, (None, None, [], [])),
    ('near miss name', 'pi-job-9-network', {}, [P], {}, (None, None, [], [])),
    ('outside id prefix', 'pi-job-9-net', OURS, [P], {'id_prefix': 'it5-'}, (None, None, [], [])),
    # a proxy shard is the proxy: detached, never a reason to keep
    ('shard only', 'pi-job-9-net', OURS, [m(PROXY + '-shard-2', 'running')], {},
     ('remove', None, [PROXY + '-shard-2'], [])),
    ('shard and job running', 'pi-job-9-net', OURS, [m(PROXY + '-shard-1', 'running'), m('pi-job-9', 'running')],
     {}, ('keep', 'job-running', [], [])),
    ('not a shard name', 'pi-job-9-net', OURS, [m(PROXY + '-shard-x', 'running')], {},
     ('keep', 'member-running', [], [])),
]


@pytest.mark.parametrize('case,name,labels,members,opts,expected', SWEEP_TABLE, ids=[r[0] for r in SWEEP_TABLE])
def test_sweep_decision_table(case, name, labels, members, opts, expected):
    opts = dict(opts)
    created = opts.pop('created', names.parse_time(OURS[jn.LABEL_CREATED]))
    d = gc.decide_sweep(name, labels, created, members, NOW, proxy_name=PROXY, **opts)
    assert (d.action, d.reason, d.detach, d.remove_containers) == expected
    if d.action == 'keep':
        assert d.reason in jn.KEEP_REASONS


def test_members_of_uses_container_config_and_flags_stale_endpoints():
    net = {'Name': 'pi-job-9-net', 'Id': 'n1', 'Containers': {'c1': {'Name': PROXY}, 'zz': {'Name': 'ghost'}}}
    containers = [
        {'Id': 'c1', 'Names': ['/' + PROXY], 'State': 'running',
         'NetworkSettings': {'Networks': {'pi-job-9-net': {'NetworkID': 'n1'}}}},
        {'Id': 'c2', 'Names': ['/pi-job-9'], 'State': 'exited',
         'NetworkSettings': {'Networks': {'pi-job-9-net': {'NetworkID': 'n1'}}}},
        {'Id': 'c3', 'Names': ['/elsewhere'], 'State': 'running',
         'NetworkSettings': {'Networks': {'bridge': {'NetworkID': 'b'}}}},
    ]
    assert gc.members_of(net, containers) == [
        {'name': 'ghost', 'state': gc.MISSING}, {'name': PROXY, 'state': 'running'},
        {'name': 'pi-job-9', 'state': 'exited'}]


def test_sweep_lines():
    result = {'removed': [{'network': 'pi-job-1-net', 'detached': [PROXY], 'removed_containers': ['pi-job-1']}],
              'kept': [{'network': 'pi-job-2-net', 'reason': 'job-running'}],
              'failed': [{'network': 'pi-job-3-net', 'step': 'remove-network', 'message': 'boom'}]}
    lines = jn.sweep_lines(result, check_mode=True)
    assert lines[0].startswith('would remove pi-job-1-net (after removing pi-job-1 and detaching')
    assert lines[1].startswith('kept pi-job-2-net: job-running')
    assert lines[2] == 'failed pi-job-3-net at remove-network: boom'


# ---------------------------------------------------------------- errors

def test_api_errors_are_answers_not_outages():
    import docker.errors
    import requests

    resp = requests.Response()
    resp.status_code = 400
    err = docker.errors.APIError('x', response=resp, explanation='Pool overlaps with other one')
    assert not engine.connection_failed(err)
    assert not isinstance(engine.as_engine_error('create', err), jn.EngineUnavailable)
    assert engine.connection_failed(requests.exceptions.ConnectionError('refused'))
    assert isinstance(engine.as_engine_error('x', requests.exceptions.ConnectionError('refused')), jn.EngineUnavailable)


# ---------------------------------------------------------------- preflight

@pytest.mark.parametrize('state,verdict', [
    ('running', jn.ADMIT), ('paused', jn.PROXY_STOPPED), ('exited', jn.PROXY_STOPPED),
    ('dead', jn.PROXY_STOPPED), ('created', jn.PROXY_STOPPED), ('restarting', jn.PROXY_STOPPED),
    (None, jn.PROXY_MISSING),
])
def test_verdict_table(state, verdict):
    v = pf.verdict_for_state(state)
    assert v.verdict == verdict and v.retryable is False
    assert v.admitted == (verdict == jn.ADMIT)
    # VERDICTS is the published list a dispatcher switches on: every verdict is in it.
    assert v.verdict in jn.VERDICTS


def test_the_published_verdicts_are_the_four_values():
    assert jn.VERDICTS == (jn.ADMIT, jn.PROXY_STOPPED, jn.PROXY_MISSING, jn.ENGINE_UNAVAILABLE)
    # a transparent job's preflight may also say its gateway is down (API 3.1, only with mode='transparent')
    assert jn.TRANSPARENT_VERDICTS == jn.VERDICTS + (jn.GATEWAY_STOPPED, jn.GATEWAY_MISSING)


@pytest.mark.parametrize('proxy_state, gateway_state, verdict', [
    ('running', 'running', jn.ADMIT),
    ('running', None, jn.GATEWAY_MISSING),
    ('running', 'exited', jn.GATEWAY_STOPPED),
    ('running', 'paused', jn.GATEWAY_STOPPED),
    ('exited', 'running', jn.PROXY_STOPPED),      # the proxy is asked first: one inspect when it is down
    (None, None, jn.PROXY_MISSING),
])
def test_transparent_preflight_needs_the_gateway_too(proxy_state, gateway_state, verdict):
    import docker.errors as docker_errors
    states = {'pi-dispatch-egress-proxy': proxy_state, 'pi-dispatch-egress-gateway': gateway_state}
    asked = []

    class _Client:
        class containers:  # noqa: N801 - the SDK's attribute name
            @staticmethod
            def get(name):
                asked.append(name)
                if states[name] is None:
                    raise docker_errors.NotFound('no such container')
                return type('C', (), {'attrs': {'State': {'Status': states[name]}}, 'status': states[name]})()

    v = jn.preflight(_Client(), mode=jn.TRANSPARENT)
    assert v.verdict == verdict, v
    assert v.verdict in jn.TRANSPARENT_VERDICTS
    assert asked == (['pi-dispatch-egress-proxy'] if verdict in (jn.PROXY_STOPPED, jn.PROXY_MISSING)
                     else ['pi-dispatch-egress-proxy', 'pi-dispatch-egress-gateway'])
    # an explicit job's preflight never asks about the gateway
    asked[:] = []
    if proxy_state == 'running':
        assert jn.preflight(_Client()).verdict == jn.ADMIT and asked == ['pi-dispatch-egress-proxy']


class _Containers:
    def __init__(self, result):
        self.result = result
        self.calls = 0

    def get(self, name):
        self.calls += 1
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


class _Client:
    def __init__(self, result):
        self.containers = _Containers(result)


class _C:
    def __init__(self, status):
        self.attrs = {'State': {'Status': status}}


def test_preflight_off_never_touches_the_daemon():
    def boom():
        raise AssertionError('daemon touched')
    v = jn.preflight(boom, enabled=False)
    assert v.verdict == jn.ADMIT


def test_preflight_one_inspect():
    client = _Client(_C('running'))
    assert jn.preflight(client).verdict == jn.ADMIT
    assert client.containers.calls == 1
    assert jn.preflight(_Client(_C('paused'))).verdict == jn.PROXY_STOPPED


def test_preflight_missing_and_unavailable():
    import docker.errors
    import requests
    assert jn.preflight(_Client(docker.errors.NotFound('no such container'))).verdict == jn.PROXY_MISSING
    v = jn.preflight(_Client(requests.exceptions.ConnectionError('refused')))
    assert v.verdict == jn.ENGINE_UNAVAILABLE and v.retryable is True

    def unbuildable():
        raise docker.errors.DockerException('Error while fetching server API version')
    assert jn.preflight(unbuildable).verdict == jn.ENGINE_UNAVAILABLE
    # The message names the daemon that does not answer (the local one when none was given).
    named = jn.preflight(unbuildable, docker_host='unix:///run/elsewhere.sock')
    assert named.message.startswith('The Docker Engine at unix:///run/elsewhere.sock does not answer about ')
    assert 'DOCKER_HOST or unix:///var/run/docker.sock' in jn.preflight(unbuildable).message


# ---------------------------------------------------------------- the published facade

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
FUTURE_NAMES = {'annotations', 'Any', 'List'}  # from __future__ import annotations; typing names of the hints


def test_facade_exports_exactly_all():
    assert jn.API_VERSION == '3.4'
    assert len(set(jn.__all__)) == len(jn.__all__)
    public = set(n for n in vars(jn) if not n.startswith('_')) - FUTURE_NAMES
    assert public == set(jn.__all__)


def test_facade_reexports_the_implementation():
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
    assert jn.create_job_network is lifecycle.create_job_network
    assert jn.teardown_job_network is teardown.teardown_job_network
    assert jn.preflight is pf.preflight and jn.Verdict is pf.Verdict
    assert jn.plan_subnet is pool.plan_subnet and jn.PoolExhausted is pool.PoolExhausted
    assert jn.sweep is gc.sweep and jn.JobNetError is names.JobNetError
    assert jn.EngineError is dc.EngineError and jn.EngineUnavailable is dc.EngineUnavailable
    assert issubclass(jn.PoolExhausted, jn.EngineError) and issubclass(jn.EngineUnavailable, jn.EngineError)


@pytest.mark.parametrize('name', [n for n in jn.__all__ if callable(getattr(jn, n))])
def test_every_published_callable_states_its_contract(name):
    assert (getattr(jn, name).__doc__ or '').strip(), name


def test_api_page_documents_every_published_name_and_the_version():
    with open(os.path.join(ROOT, 'docs', 'job-network-api.md')) as handle:
        text = handle.read()
    assert "API_VERSION = '%s'" % jn.API_VERSION in text
    missing = [n for n in jn.__all__ if '`%s' % n not in text]
    assert not missing, missing


@pytest.mark.parametrize('module', [names, pool, engine, lifecycle, gc, pf])
def test_implementation_files_never_import_the_facade(module):
    with open(module.__file__) as handle:
        text = handle.read()
    assert 'module_utils import _jobnet\n' not in text and 'module_utils._jobnet import' not in text
