"""Proxy shards: the family's names, the choice of the member a job network gets, the clone (no daemon)."""

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils import _shards as sh

P = 'pi-dispatch-egress-proxy'


@pytest.mark.parametrize('name, member', [
    (P, True),
    (P + '-shard-1', True),
    (P + '-shard-12', True),
    (P + '-shard-0', False),
    (P + '-shard-01', False),
    (P + '-shard-', False),
    (P + '-shard-x', False),
    (P + '-shard-1x', False),
    (P + '-other', False),
    ('pi-job-1-net', False),
    ('other-proxy-shard-1', False),
])
def test_family_names(name, member):
    assert sh.is_family_name(name, P) is member


def m(index, load, state='running'):
    return sh.Member(P if index == 0 else sh.shard_name(P, index), index, state,
                     ['pi-job-%d-%d-net' % (index, i) for i in range(load)])


@pytest.mark.parametrize('family, bound, chosen', [
    ([m(0, 0)], 50, P),                                           # a small host: the proxy
    ([m(0, 49)], 50, P),
    ([m(0, 50)], 50, None),                                       # full: a shard must be added
    ([m(0, 50), m(1, 3)], 50, P + '-shard-1'),
    ([m(0, 10), m(1, 3)], 50, P + '-shard-1'),                    # least loaded wins
    ([m(0, 3), m(1, 3)], 50, P),                                  # a tie: the proxy first
    ([m(0, 50), m(1, 7), m(2, 7)], 50, P + '-shard-1'),           # a tie: the lowest shard
    ([m(0, 50), m(1, 2, 'exited'), m(2, 9)], 50, P + '-shard-2'),  # a stopped shard is skipped
    ([m(0, 50), m(1, 50)], 50, None),
    ([m(0, 500)], 0, P),                                          # bound 0: sharding off
    ([m(0, 3), m(1, 0)], 3, P + '-shard-1'),
])
def test_choice_table(family, bound, chosen):
    got = sh.choose(family, bound)
    assert (got.name if got else None) == chosen


@pytest.mark.parametrize('family, fragment', [
    ([], 'does not exist'),
    ([m(1, 0)], 'does not exist'),
    ([m(0, 0, 'exited')], 'is exited'),
    ([m(0, 0, 'paused'), m(1, 0)], 'is paused'),
])
def test_no_running_proxy_is_refused(family, fragment):
    with pytest.raises(sh.ShardError) as caught:
        sh.choose(family, 50)
    assert fragment in str(caught.value)


@pytest.mark.parametrize('indexes, wanted', [([0], 1), ([0, 1], 2), ([0, 2], 1), ([0, 1, 2, 4], 3)])
def test_next_index_fills_the_lowest_gap(indexes, wanted):
    assert sh.next_index([m(i, 0) for i in indexes]) == wanted


@pytest.mark.parametrize('bound, ok', [(0, True), (1, True), (50, True), (-1, False), ('50', False),
                                       (True, False), (None, False), (2.5, False)])
def test_bound_must_be_a_count(bound, ok):
    if ok:
        assert sh.check_bound(bound) == bound
    else:
        with pytest.raises(sh.ShardError) as caught:
            sh.check_bound(bound, key='egress_proxy_shard_bound')
        assert 'egress_proxy_shard_bound' in str(caught.value)


@pytest.mark.parametrize('labels, index', [
    ({sh.LABEL_SHARD_OF: P, sh.LABEL_SHARD_INDEX: '3'}, 3),
    ({sh.LABEL_SHARD_OF: 'another', sh.LABEL_SHARD_INDEX: '3'}, None),
    ({sh.LABEL_SHARD_OF: P, sh.LABEL_SHARD_INDEX: '0'}, None),
    ({sh.LABEL_SHARD_OF: P, sh.LABEL_SHARD_INDEX: 'x'}, None),
    ({sh.LABEL_SHARD_OF: P}, None),
    (None, None),
])
def test_shard_index_from_labels(labels, index):
    assert sh.shard_index(labels, P) == index


PROXY_ATTRS = {
    'Name': '/' + P,
    'Image': 'sha256:abc',
    'State': {'Status': 'running', 'Health': {'Status': 'healthy'}},
    'Config': {'Image': 'pi-dispatch-egress-proxy:latest', 'Cmd': ['sh', '-c', 'exec squid -N'],
               'Entrypoint': None, 'Env': ['PATH=/usr/bin'], 'User': 'proxy',
               'Labels': {'io.pi-dispatch.egress.role': 'proxy'},
               'Healthcheck': {'Test': ['CMD', 'squidclient', 'mgr:info'], 'Interval': 5000000000}},
    'HostConfig': {'NetworkMode': 'pi-dispatch-egress-out', 'CapDrop': ['ALL'], 'CapAdd': None,
                   'ReadonlyRootfs': True, 'Tmpfs': {'/tmp': 'rw'}, 'SecurityOpt': ['no-new-privileges:true'],
                   'Sysctls': {'net.ipv4.ip_forward': '0'}, 'Memory': 536870912, 'MemorySwap': 536870912,
                   'PidsLimit': 256, 'Ulimits': [{'Name': 'nofile', 'Soft': 16384, 'Hard': 16384}],
                   'LogConfig': {'Type': 'json-file', 'Config': {'max-size': '10m'}},
                   'RestartPolicy': {'Name': 'unless-stopped', 'MaximumRetryCount': 0},
                   'ExtraHosts': ['host.docker.internal:host-gateway'],
                   'Mounts': [{'Type': 'bind', 'Source': '/d/egress-proxy.conf', 'Target': '/etc/squid/squid.conf',
                               'ReadOnly': True, 'BindOptions': {}}],
                   'Binds': None, 'Links': None, 'PortBindings': {}},
    'NetworkSettings': {'Networks': {'pi-dispatch-egress-out': {}, 'pi-job-a-net': {}, 'pi-job-b-net': {},
                                     'extra-net': {}}},
}


def test_clone_is_the_proxy_shape_with_the_shard_labels_and_no_job_network():
    spec = sh.clone_spec(PROXY_ATTRS, P, 2)
    assert spec['name'] == P + '-shard-2'
    assert spec['image'] == 'sha256:abc'                 # exactly what the proxy runs
    assert spec['command'] == ['sh', '-c', 'exec squid -N'] and spec['user'] == 'proxy'
    assert spec['healthcheck'] == PROXY_ATTRS['Config']['Healthcheck']
    assert spec['labels'] == {'io.pi-dispatch.egress.role': sh.SHARD_ROLE, sh.LABEL_SHARD_OF: P,
                              sh.LABEL_SHARD_INDEX: '2'}
    host = spec['host_config']
    for key in ('CapDrop', 'ReadonlyRootfs', 'Tmpfs', 'SecurityOpt', 'Sysctls', 'Memory', 'MemorySwap',
                'PidsLimit', 'Ulimits', 'LogConfig', 'RestartPolicy', 'ExtraHosts'):
        assert host[key] == PROXY_ATTRS['HostConfig'][key], key
    assert host['Mounts'] == [{'Type': 'bind', 'Source': '/d/egress-proxy.conf', 'Target': '/etc/squid/squid.conf',
                               'ReadOnly': True}]
    assert 'Binds' not in host and 'PortBindings' not in host and 'CapAdd' not in host
    assert host['NetworkMode'] == 'pi-dispatch-egress-out'
    assert spec['networks'] == ['pi-dispatch-egress-out', 'extra-net']   # upstream first, no job network
    # the proxy's own labels are not changed by the clone
    assert PROXY_ATTRS['Config']['Labels'] == {'io.pi-dispatch.egress.role': 'proxy'}


def test_member_reads_inspect_and_list_summaries():
    member = sh.member_from_attrs(PROXY_ATTRS, 0)
    assert member.name == P and member.running and member.health == 'healthy'
    assert member.job_networks == ['pi-job-a-net', 'pi-job-b-net'] and member.load == 2 and not member.is_shard
    summary = {'Names': ['/' + P + '-shard-1'], 'State': 'exited',
               'NetworkSettings': {'Networks': {'pi-dispatch-egress-out': {}}}}
    shard = sh.member_from_attrs(summary, 1)
    assert shard.name == P + '-shard-1' and shard.state == 'exited' and shard.load == 0 and shard.is_shard
    assert shard.health is None


@pytest.mark.parametrize('status, health', [
    ('Up 3 minutes (healthy)', 'healthy'),
    ('Up 2 seconds (health: starting)', 'starting'),
    ('Up 1 hour (unhealthy)', 'unhealthy'),
    ('Up 1 hour', None),
    ('Exited (0) 5 seconds ago', None),
])
def test_member_health_from_a_list_summary(status, health):
    summary = {'Names': ['/' + P + '-shard-1'], 'State': 'running', 'Status': status}
    assert sh.member_from_attrs(summary, 1).health == health


def test_family_on_reads_the_active_endpoints():
    attrs = {'Containers': {'a': {'Name': P + '-shard-3'}, 'b': {'Name': 'pi-job-x'}, 'c': {'Name': P}}}
    assert sh.family_on(attrs, P) == [P, P + '-shard-3']
    assert sh.family_on({'Containers': None}, P) == []


@pytest.mark.parametrize('proxy_actions, wanted', [
    (['remove'], [(1, 'remove'), (2, 'remove')]),                       # state absent
    (['remove', 'create', 'reconnect'], [(1, 'replace'), (2, 'replace')]),
    (['create'], [(1, 'replace'), (2, 'replace')]),
    (['restart'], [(1, 'restart'), (2, 'restart')]),
    (['unpause', 'restart'], [(1, 'restart'), (2, 'restart')]),
    (['stop'], [(1, 'stop')]),                                          # shard 2 is already stopped
    (['start'], [(2, 'start')]),                                        # shard 1 already runs
    (['unpause'], [(2, 'start')]),
    (['reconfigure'], []),                                              # the reload path reaches the shards
    ([], []),
])
def test_shards_follow_the_proxy(proxy_actions, wanted):
    family = [m(0, 4), m(1, 3), m(2, 0, 'exited')]
    plan = sh.follow_plan(family, proxy_actions)
    assert [(member.index, step) for member, step in plan] == wanted


def test_the_jobs_a_plan_cuts_count_shard_by_shard():
    family = [m(0, 4), m(1, 3), m(2, 5)]
    assert sh.plan_jobs_cut(sh.follow_plan(family, ['restart'])) == 8
    assert sh.plan_jobs_cut(sh.follow_plan([m(0, 4), m(1, 3, 'exited')], ['start'])) == 0


def test_no_shard_no_plan():
    assert sh.follow_plan([m(0, 9)], ['remove', 'create']) == []


class _Api(object):
    def __init__(self, fail=None):
        self.calls = []
        self.fail = fail

    def __getattr__(self, name):
        def call(*args, **kwargs):
            self.calls.append((name, args[0] if args else None))
            if self.fail and (name, args[0] if args else None) == self.fail:
                raise RuntimeError('the daemon said no')
            if name == 'inspect_container':
                return {'State': {'Status': 'running', 'Health': {'Status': 'healthy'}}}
            return None
        return call


class _Client(object):
    def __init__(self, fail=None):
        self.api = _Api(fail)


def test_apply_plan_goes_shard_by_shard_and_reports_each():
    client = _Client(fail=('stop', P + '-shard-1'))
    done = sh.apply_plan(client, P, [(m(1, 2), 'stop'), (m(2, 1), 'stop')])
    assert [(d['name'], d['action'], d['jobs_cut'], bool(d['error'])) for d in done] == [
        (P + '-shard-1', 'stop', 2, True), (P + '-shard-2', 'stop', 1, False)]
    assert 'the daemon said no' in done[0]['error']
    assert ('stop', P + '-shard-2') in client.api.calls


def test_a_restarted_shard_must_come_back_healthy():
    client = _Client()
    done = sh.apply_plan(client, P, [(m(1, 0), 'restart')], wait_timeout=1)
    assert done[0]['error'] is None
    assert [c[0] for c in client.api.calls] == ['restart', 'inspect_container']


def test_shard_consent_counts_each_shard():
    from ansible_collections.pi_dispatch.egress.plugins.module_utils import _proxy
    plan = sh.follow_plan([m(0, 0), m(1, 2), m(2, 0), m(3, 1)], ['restart'])
    refusal = _proxy.shard_consent_refusal(plan, allow_cut_jobs=False)
    assert refusal.startswith('Refused, nothing changed: following the proxy, ')
    assert P + '-shard-1 (restart)' in refusal and P + '-shard-3 (restart)' in refusal
    assert P + '-shard-2' not in refusal          # no job on it: nothing to consent to
    assert 'would cut 3 jobs' in refusal
    assert _proxy.shard_consent_refusal(plan, allow_cut_jobs=True) is None
    assert _proxy.shard_consent_refusal(sh.follow_plan([m(0, 5), m(1, 0)], ['restart']), False) is None
