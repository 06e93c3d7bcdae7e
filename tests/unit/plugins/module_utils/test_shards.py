"""Proxy shards: the family's names, the choice of the member a job network gets, the clone (no daemon).

At the end, create and teardown against a fake daemon: the Engine calls a job's start and end make, and
how much they read, do not grow with the networks on the daemon or the number of shards.
"""

import collections
import ipaddress

import docker.errors
import pytest
import requests

from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as jn
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import engine
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import shard_clone as cl
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import shards as sh

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


# None is a valid bound since API 3.0: "follow the proxy" (resolve_bound).
@pytest.mark.parametrize('bound, ok', [(0, True), (1, True), (50, True), (None, True), (-1, False), ('50', False),
                                       (True, False), (2.5, False)])
def test_bound_must_be_a_count(bound, ok):
    if ok:
        assert sh.check_bound(bound) == bound
    else:
        with pytest.raises(sh.ShardError) as caught:
            sh.check_bound(bound, key='egress_proxy_shard_bound')
        assert 'egress_proxy_shard_bound' in str(caught.value)


def labelled(load, label):
    member = m(0, load)
    member.bound_label = label
    return member


@pytest.mark.parametrize('bound, label, wanted', [
    (None, None, sh.DEFAULT_BOUND),   # nobody set one: the collection's default
    (None, '3', 3),                   # the proxy's label (egress_proxy_shard_bound)
    (None, ' 25 ', 25),
    (None, '0', 0),                   # the operator turned shards off for every dispatcher
    (7, '3', 7),                      # a dispatcher's own bound wins over the label
    (0, '3', 0),
    (None, 'ten', 'not a number of job networks'),
    (None, '-1', 'not a number of job networks'),
    (None, '', 'not a number of job networks'),
])
def test_resolve_bound(bound, label, wanted):
    if isinstance(wanted, int):
        assert sh.resolve_bound(bound, labelled(0, label)) == wanted
    else:
        with pytest.raises(sh.ShardError) as caught:
            sh.resolve_bound(bound, labelled(0, label))
        assert wanted in str(caught.value) and 'egress_proxy_shard_bound' in str(caught.value)


def test_default_bound_and_the_shard_cap_hold_a_thousand_jobs():
    assert sh.DEFAULT_BOUND == 10
    assert (sh.MAX_SHARDS + 1) * sh.DEFAULT_BOUND >= 1000


@pytest.mark.parametrize('family, bound, chosen', [
    ([labelled(2, '3')], None, P),                          # below the proxy's own bound
    ([labelled(3, '3')], None, None),                       # at it: a shard
    ([labelled(3, '3'), m(1, 2)], None, P + '-shard-1'),
    ([labelled(3, '3')], 5, P),                             # the caller's bound wins
    ([labelled(400, '0')], None, P),                        # label 0: no shards
    ([m(0, sh.DEFAULT_BOUND - 1)], None, P),                # no label: the default
    ([m(0, sh.DEFAULT_BOUND)], None, None),
])
def test_choice_follows_the_proxys_bound(family, bound, chosen):
    got = sh.choose(family, bound)
    assert (got.name if got else None) == chosen


@pytest.mark.parametrize('attrs, label', [
    (dict(Name='/' + P, Config={'Labels': {sh.LABEL_SHARD_BOUND: '4'}}, State={'Status': 'running'}), '4'),
    (dict(Names=['/' + P], Labels={sh.LABEL_SHARD_BOUND: '4'}, State='running'), '4'),
    (dict(Name='/' + P, Config={'Labels': None}, State={'Status': 'running'}), None),
    (dict(Names=['/' + P], State='running'), None),
])
def test_member_reads_the_bound_label_from_an_inspect_and_a_summary(attrs, label):
    assert sh.member_from_attrs(attrs, 0).bound_label == label


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


S = 1000000000


@pytest.mark.parametrize('check, wanted', [
    ({'Test': ['CMD', 'squidclient', 'mgr:info'], 'Interval': 5 * S, 'Retries': 3},
     {'Test': ['CMD', 'squidclient', 'mgr:info'], 'Interval': 30 * S, 'Retries': 3}),
    ({'Test': ['CMD', 'true'], 'Interval': 90 * S}, {'Test': ['CMD', 'true'], 'Interval': 90 * S}),   # longer: kept
    ({'Test': ['CMD-SHELL', 'true']}, {'Test': ['CMD-SHELL', 'true'], 'Interval': 30 * S}),         # Docker's default
    ({'Test': ['NONE']}, {'Test': ['NONE']}),                                                      # disabled: kept
    (None, None),
    ({}, {}),
])
def test_shard_healthcheck(check, wanted):
    assert cl.shard_healthcheck(check) == wanted


@pytest.mark.parametrize('test, argv', [
    (['CMD', 'squidclient', '-h', 'localhost', 'mgr:info'], ['squidclient', '-h', 'localhost', 'mgr:info']),
    (['CMD-SHELL', 'squidclient mgr:info || exit 1'], ['/bin/sh', '-c', 'squidclient mgr:info || exit 1']),
    (['NONE'], None),
    (['CMD'], None),
    ([], None),
    (None, None),
])
def test_health_argv(test, argv):
    assert cl.health_argv(test) == argv


class _ReadyApi(object):
    """A container whose states (inspect answers) and health-test exit codes come from lists."""

    def __init__(self, states, exits, test=('CMD', 'squidclient', 'mgr:info')):
        self.states, self.exits, self.test = list(states), list(exits), list(test) if test else None
        self.execs = []
        self.api = self

    def inspect_container(self, name):
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        status, health = state
        return {'State': dict({'Status': status}, **({'Health': {'Status': health}} if health else {})),
                'Config': {'Healthcheck': {'Test': self.test} if self.test else None}}

    def exec_create(self, name, argv, **_kw):
        self.execs.append(argv)
        return {'Id': 'e%d' % len(self.execs)}

    def exec_start(self, exec_id):
        return b''

    def exec_inspect(self, exec_id):
        return {'ExitCode': self.exits.pop(0) if len(self.exits) > 1 else self.exits[0]}


class _Clock(object):
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


@pytest.mark.parametrize('states, exits, test, status, execs', [
    # squid answers its own test on the third try: admitted at once, not at the first scheduled check
    ([('running', 'starting')], [1, 1, 0], ('CMD', 'squidclient', 'mgr:info'), 'healthy', 3),
    ([('running', 'healthy')], [1], ('CMD', 'squidclient', 'mgr:info'), 'healthy', 0),    # Docker said so
    ([('running', None)], [1], None, 'running', 0),                                       # no test to run
    ([('running', 'starting'), ('exited', None)], [1], ('CMD', 'x'), 'exited', 1),        # died meanwhile
    ([('created', None), ('running', 'starting')], [0], ('CMD', 'x'), 'healthy', 1),      # not running yet: no exec
    ([('running', 'starting')], [1], ('CMD', 'x'), 'starting', 21),                        # never: the last status
])
def test_wait_ready(states, exits, test, status, execs):
    client, clock = _ReadyApi(states, exits, test), _Clock()
    assert cl.wait_ready(client, 's', 10, sleep=clock.sleep, clock=clock) == status
    assert len(client.execs) == execs
    assert all(argv == list(test[1:]) for argv in client.execs)


def test_clone_is_the_proxy_shape_with_the_shard_labels_and_no_job_network():
    spec = cl.clone_spec(PROXY_ATTRS, P, 2)
    assert spec['name'] == P + '-shard-2'
    assert spec['image'] == 'sha256:abc'                 # exactly what the proxy runs
    assert spec['command'] == ['sh', '-c', 'exec squid -N'] and spec['user'] == 'proxy'
    # the proxy's health test, on the shards' slower schedule (a check is a docker exec per shard)
    assert spec['healthcheck'] == {'Test': ['CMD', 'squidclient', 'mgr:info'],
                                   'Interval': cl.SHARD_HEALTH_INTERVAL * 1000000000}
    assert PROXY_ATTRS['Config']['Healthcheck']['Interval'] == 5000000000   # the proxy's own is not touched
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
    plan = cl.follow_plan(family, proxy_actions)
    assert [(member.index, step) for member, step in plan] == wanted


def test_the_jobs_a_plan_cuts_count_shard_by_shard():
    family = [m(0, 4), m(1, 3), m(2, 5)]
    assert cl.plan_jobs_cut(cl.follow_plan(family, ['restart'])) == 8
    assert cl.plan_jobs_cut(cl.follow_plan([m(0, 4), m(1, 3, 'exited')], ['start'])) == 0


def test_no_shard_no_plan():
    assert cl.follow_plan([m(0, 9)], ['remove', 'create']) == []


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
    done = cl.apply_plan(client, P, [(m(1, 2), 'stop'), (m(2, 1), 'stop')])
    assert [(d['name'], d['action'], d['jobs_cut'], bool(d['error'])) for d in done] == [
        (P + '-shard-1', 'stop', 2, True), (P + '-shard-2', 'stop', 1, False)]
    assert 'the daemon said no' in done[0]['error']
    assert ('stop', P + '-shard-2') in client.api.calls


def test_a_restarted_shard_must_come_back_healthy():
    client = _Client()
    done = cl.apply_plan(client, P, [(m(1, 0), 'restart')], wait_timeout=1)
    assert done[0]['error'] is None
    assert [c[0] for c in client.api.calls] == ['restart', 'inspect_container']


def test_shard_consent_counts_each_shard():
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import lifecycle as _proxy
    plan = cl.follow_plan([m(0, 0), m(1, 2), m(2, 0), m(3, 1)], ['restart'])
    refusal = _proxy.shard_consent_refusal(plan, allow_cut_jobs=False)
    assert refusal.startswith('Refused, nothing changed: following the proxy, ')
    assert P + '-shard-1 (restart)' in refusal and P + '-shard-3 (restart)' in refusal
    assert P + '-shard-2' not in refusal          # no job on it: nothing to consent to
    assert 'would cut 3 jobs' in refusal
    assert _proxy.shard_consent_refusal(plan, allow_cut_jobs=True) is None
    assert _proxy.shard_consent_refusal(cl.follow_plan([m(0, 5), m(1, 0)], ['restart']), False) is None


# ---------------------------------------------------------------- create and teardown on a fake daemon

def _refusal(status, message, cls=docker.errors.APIError):
    resp = requests.Response()
    resp.status_code = status
    return cls(message, response=resp, explanation=message)


class Daemon(object):
    """The Engine calls of create, teardown and the shards, on dicts. ``calls`` counts them; ``records``
    counts what they return (a listed network, a container summary, a network a container is on)."""

    def __init__(self, refuse_status=False):
        self.api = self
        self.nets, self.boxes = {}, {}
        self.calls, self.records = collections.Counter(), 0
        self.refuse_status = refuse_status
        self.box(P, 0)

    def box(self, name, index, state='running', nets=('upstream',)):
        labels = {sh.LABEL_SHARD_OF: P, sh.LABEL_SHARD_INDEX: str(index)} if index else {}
        self.boxes[name] = dict(Id='c-' + name, name=name, state=state, labels=labels, nets=set())
        for net in nets:
            self.net(net, carrier=name)

    def net(self, name, subnet=None, job=None, carrier=None):
        if name not in self.nets:
            self.nets[name] = dict(Name=name, Id='n-' + name, Labels={jn.LABEL_JOB_ID: job} if job else {},
                                   Internal=bool(job), IPAM={'Config': [{'Subnet': subnet}] if subnet else []})
        if carrier:
            self.boxes[carrier]['nets'].add(name)

    def count(self, call, records=0):
        self.calls[call] += 1
        self.records += records

    def version(self):
        """A Docker Engine. Not counted: the venue is asked once per client and kept (_common/venue.py)."""
        return {'Version': '20.10.24', 'ApiVersion': '1.41', 'Components': [{'Name': 'Engine', 'Version': '20.10.24'}]}

    def info(self):
        return {'CgroupVersion': '2', 'SecurityOptions': []}

    def _net(self, ref):
        for n in self.nets.values():
            if ref in (n['Name'], n['Id']):
                return n
        raise _refusal(404, 'network %s not found' % ref, docker.errors.NotFound)

    def _box(self, ref):
        for b in self.boxes.values():
            if ref in (b['name'], b['Id']):
                return b
        raise _refusal(404, 'No such container: %s' % ref, docker.errors.NotFound)

    def networks(self, filters=None):
        self.count('networks', len(self.nets))
        return [dict(n) for n in self.nets.values()]

    def inspect_network(self, ref):
        n = self._net(ref)
        on = [b for b in self.boxes.values() if n['Name'] in b['nets'] and b['state'] in ('running', 'paused')]
        self.count('inspect_network', len(on))
        return dict(n, Containers=dict((b['Id'], {'Name': b['name']}) for b in on))

    def create_network(self, name, ipam=None, labels=None, internal=False, **_kw):
        self.count('create_network')
        if name in self.nets:
            raise _refusal(409, 'network with name %s already exists' % name)
        self.net(name, ipam['Config'][0]['Subnet'], labels[jn.LABEL_JOB_ID])
        return {'Id': 'n-' + name}

    def remove_network(self, ref):
        self.count('remove_network')
        del self.nets[self._net(ref)['Name']]

    def connect_container_to_network(self, container, net_id, aliases=None):
        self.count('connect_container_to_network')
        self._box(container)['nets'].add(self._net(net_id)['Name'])

    def disconnect_container_from_network(self, container, net_id, force=False):
        self.count('disconnect_container_from_network')
        self._box(container)['nets'].discard(self._net(net_id)['Name'])

    def _summary(self, b):
        return {'Id': b['Id'], 'Names': ['/' + b['name']], 'State': b['state'], 'Labels': dict(b['labels']),
                'NetworkSettings': {'Networks': dict((n, {}) for n in b['nets'])}}

    def containers(self, all=False, filters=None):
        if 'status' in filters and self.refuse_status:
            raise _refusal(500, 'unknown container state: restarting')
        label = filters.get('label', '=').split('=', 1)
        out = [self._summary(b) for b in self.boxes.values()
               if (not label[0] or b['labels'].get(label[0]) == label[1])
               and ('network' not in filters or any(self.nets[n]['Id'] == filters['network'] for n in b['nets']))
               and ('status' not in filters or b['state'] in filters['status'])]
        self.count('containers', sum(1 + len(c['NetworkSettings']['Networks']) for c in out))
        return out

    def inspect_container(self, ref):
        b = self._box(ref)
        self.count('inspect_container', len(b['nets']))
        return dict(self._summary(b), Name='/' + b['name'], Image='x', Config={'Labels': dict(b['labels'])},
                    State={'Status': b['state'], 'Health': {'Status': 'healthy'}}, HostConfig={'NetworkMode': 'up'})

    def create_container(self, image, name=None, labels=None, **_kw):
        self.count('create_container')
        self.boxes[name] = dict(Id='c-' + name, name=name, state='created', labels=dict(labels), nets=set())
        return {'Id': 'c-' + name}

    def start(self, ref):
        self.count('start')
        self._box(ref)['state'] = 'running'

    def remove_container(self, ref, force=False):
        self.count('remove_container')
        del self.boxes[self._box(ref)['name']]

    def reset(self):
        self.calls.clear()
        self.records = 0


def seeded(jobs, foreign=0, bound=50, **kwargs):
    """A daemon with the upstream network, ``jobs`` job networks (the proxy, then shard after shard,
    carrying ``bound`` each, as create fills them) and ``foreign`` networks of somebody else."""
    d = Daemon(**kwargs)
    for i in range(jobs):
        index = i // bound if bound else 0
        carrier = sh.shard_name(P, index) if index else P
        if carrier not in d.boxes:
            d.box(carrier, index)
        d.net('pi-job-s%d-net' % i, str(ipaddress.ip_network((0x0A2F0000 + 8 * i, 29))), 's%d' % i, carrier)
    for i in range(foreign):
        d.net('other-%d' % i, '172.%d.%d.0/24' % (20 + i // 256, i % 256))
    return d


def start_and_end(d, bound, job='x1'):
    """One job's create and teardown after a first one (which reads what a client keeps): their calls and reads."""
    jn.create_job_network(d, 'warm-' + job, routes=[], shard_bound=bound)
    jn.teardown_job_network(d, 'warm-' + job)
    d.reset()
    net = jn.create_job_network(d, job, routes=[], shard_bound=bound)
    create = (dict(d.calls), d.records)
    d.reset()
    jn.teardown_job_network(d, job)
    return net.proxy, create, (dict(d.calls), d.records)


def test_a_create_without_a_bound_follows_the_proxys_label_at_no_extra_call():
    d = seeded(jobs=1, bound=0)
    d.boxes[P]['labels'][sh.LABEL_SHARD_BOUND] = '3'
    jn.create_job_network(d, 'warm', routes=[])                 # the first create reads the family whole (2)
    d.reset()
    third = jn.create_job_network(d, 'third', routes=[])        # the proxy now carries 3
    assert third.proxy == P
    assert dict(d.calls) == dict(CREATE, inspect_container=1)   # the proxy's inspect it makes anyway
    fourth = jn.create_job_network(d, 'fourth', routes=[])
    assert fourth.proxy == P + '-shard-1'                       # beyond the label's 3, not the default 10
    explicit = jn.create_job_network(d, 'fifth', routes=[], shard_bound=0)
    assert explicit.proxy == P                                  # a caller's own bound still wins


CREATE = {'create_network': 1, 'connect_container_to_network': 1}
TEARDOWN = {'inspect_network': 1, 'containers': 1, 'disconnect_container_from_network': 1, 'remove_network': 1}
# (what carries the new network, shard_bound, daemon with 10 networks, daemon with 1,000) -> container inspects
# per create and per teardown. Before: every create also listed every network (1,000 records at 1,000) and
# read each member's job networks (2,000 records), and a teardown without shards read the proxy's 1,000.
CALL_TABLE = [
    ('the proxy, no shards', 0, dict(jobs=9), dict(jobs=999), 0, 0),
    ('the proxy, shards on', 50, dict(jobs=9), dict(jobs=49, foreign=950), 1, 0),
    ('the last shard', 50, dict(jobs=9, bound=4), dict(jobs=999), 2, 1),
]


@pytest.mark.parametrize('case, bound, small, big, creates, teardowns', CALL_TABLE, ids=[c[0] for c in CALL_TABLE])
def test_a_jobs_engine_work_does_not_grow_with_the_networks(case, bound, small, big, creates, teardowns):
    seen = []
    for layout in (small, big):
        d = seeded(**layout)
        assert len(d.nets) == (10 if layout is small else 1000)
        carrier, (c_calls, c_read), (t_calls, t_read) = start_and_end(d, bound)
        assert c_calls == dict(CREATE, **({'inspect_container': creates} if creates else {}))
        assert t_calls == dict(TEARDOWN, **({'inspect_container': teardowns} if teardowns else {}))
        # What they read is bounded by what one proxy container carries, never by the daemon's networks.
        assert c_read <= 2 * (bound + 1) and t_read <= bound + 3
        seen.append(carrier.startswith(P + '-shard-'))
    assert seen[0] == seen[1] == (case == 'the last shard')


def test_the_first_create_of_a_client_reads_the_daemon_once_then_keeps_it_current():
    # bound 50 throughout (seeded's layout), given explicitly: the default follows the proxy (API 3.0)
    d = seeded(jobs=120)
    first = jn.create_job_network(d, 'a', routes=[], shard_bound=50)
    assert d.calls['networks'] == 1 and d.calls['containers'] == 1   # the subnets, the family: once
    assert first.proxy == sh.shard_name(P, 2) and first.subnet == '10.47.3.192/29'
    d.reset()
    made = [jn.create_job_network(d, 'b%d' % i, routes=[], shard_bound=50) for i in range(40)]
    # No network listing; the whole family once, when every member it knew was full (before shard 3).
    assert d.calls['networks'] == 0 and d.calls['containers'] == 1 and d.calls['create_container'] == 1
    # Two inspects a create (the proxy and the chosen shard); the one that starts shard 3 makes five.
    assert d.calls['inspect_container'] == 2 * 39 + 5
    assert [m.proxy for m in made].count(sh.shard_name(P, 3)) == 11   # shard 2 full at 50, shard 3 started
    assert len(set(m.subnet for m in made + [first])) == 41
    for m in made:
        jn.teardown_job_network(d, m.job_id)
    assert sh.shard_name(P, 3) not in d.boxes   # its last job went: removed, and forgotten
    again = jn.create_job_network(d, 'c', routes=[], shard_bound=50)
    assert again.subnet == '10.47.3.200/29' and again.proxy == sh.shard_name(P, 2)   # freed, picked again


def test_pick_corrects_what_another_process_changed():
    d = seeded(jobs=60)
    memo = engine.client_memo(d)
    assert sh.pick(d, P, 50, memo).name == sh.shard_name(P, 1)     # read whole: shard 1 carries 10
    d.boxes[sh.shard_name(P, 1)]['state'] = 'exited'                # stopped by somebody else
    d.box(sh.shard_name(P, 2), 2)                                   # started by somebody else
    d.reset()
    assert sh.pick(d, P, 50, memo) is None                          # shard 1 read again: not running
    assert d.calls == {'inspect_container': 2}
    # the whole family read again
    assert jn.create_job_network(d, 'j', routes=[], shard_bound=50).proxy == sh.shard_name(P, 2)
    assert sh.shard_name(P, 3) not in d.boxes
    del d.boxes[sh.shard_name(P, 2)]                                # removed by somebody else
    d.boxes[P]['nets'] -= set('pi-job-s%d-net' % i for i in range(5))
    assert jn.create_job_network(d, 'k', routes=[], shard_bound=50).proxy == P      # the proxy has room again


def test_the_proxy_missing_or_stopped_is_still_refused_from_the_picture():
    d = seeded(jobs=60)
    memo = engine.client_memo(d)
    sh.pick(d, P, 50, memo)
    d.boxes[P]['state'] = 'exited'
    with pytest.raises(sh.ShardError, match='is exited'):
        sh.pick(d, P, 50, memo)
    del d.boxes[P]
    with pytest.raises(sh.ShardError, match='does not exist'):
        sh.pick(d, P, 50, memo)


@pytest.mark.parametrize('refuse_status', [False, True])
def test_teardown_still_refuses_while_a_stopped_or_running_job_is_on_the_network(refuse_status):
    d = seeded(jobs=3, refuse_status=refuse_status)
    jn.create_job_network(d, 'j', routes=[])
    for state in ('exited', 'created', 'running'):
        d.boxes.pop('pi-job-j', None)
        d.box('pi-job-j', 0, state=state, nets=['pi-job-j-net'])
        with pytest.raises(jn.EngineError, match=r'still has pi-job-j \(%s\)' % state):
            jn.teardown_job_network(d, 'j')
        assert 'pi-job-j-net' in d.nets
    del d.boxes['pi-job-j']
    d.reset()
    assert jn.teardown_job_network(d, 'j')['changed']
    # A daemon that refuses the state filter (Podman) is asked once, then listed whole.
    assert d.calls['containers'] == 1


def test_create_again_keeps_the_network_from_the_daemons_refusal():
    d = seeded(jobs=3)
    first = jn.create_job_network(d, 'j', routes=[])
    d.reset()
    again = jn.create_job_network(d, 'j', routes=[])
    assert (again.changed, again.subnet, again.proxy) == (False, first.subnet, P)
    assert d.calls == {'create_network': 1, 'inspect_network': 1}   # refused (the name exists), inspected


def test_each_shard_writes_the_decision_log_under_its_own_name():
    attrs = dict(PROXY_ATTRS, Config=dict(PROXY_ATTRS['Config'], Env=[
        'PATH=/usr/bin', 'PI_EGRESS_DECISION_LOG_NAME=%s' % P, 'PI_EGRESS_DECISION_LOG_KEEP=5']))
    spec = cl.clone_spec(attrs, P, 3)
    assert spec['environment'] == ['PATH=/usr/bin', 'PI_EGRESS_DECISION_LOG_NAME=%s-shard-3' % P,
                                   'PI_EGRESS_DECISION_LOG_KEEP=5']
    assert attrs['Config']['Env'][1] == 'PI_EGRESS_DECISION_LOG_NAME=%s' % P   # the proxy's is not touched
    assert cl.clone_spec(PROXY_ATTRS, P, 1)['environment'] == ['PATH=/usr/bin']  # an older proxy has none
