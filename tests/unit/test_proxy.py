"""The proxy's comparison and decision table (no daemon)."""

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils import _proxy


def _spec(**kw):
    return _proxy.desired_spec('pi-dispatch-egress-proxy:latest', '/d/deploy/egress-proxy.conf',
                               '/d/egress-allowlist.conf', '/d/model-endpoints.conf', **kw)


def _attrs(spec, running=True, paused=False, status=None, networks=None, mounts=None, image='sha256:img',
           restart='unless-stopped', extra_hosts=None, ports=None, labels=None):
    mounts = mounts if mounts is not None else [
        {'Type': 'bind', 'Source': src, 'Destination': dst, 'RW': False} for src, dst in spec['mounts']]
    return {
        'Id': 'cid', 'Name': '/pi-dispatch-egress-proxy', 'Image': image,
        'State': {'Status': status or ('paused' if paused else 'running' if running else 'exited'),
                  'Running': running, 'Paused': paused, 'Health': {'Status': 'healthy'}},
        'Mounts': mounts,
        'HostConfig': {'RestartPolicy': {'Name': restart},
                       'ExtraHosts': extra_hosts if extra_hosts is not None else list(spec['extra_hosts']),
                       'PortBindings': ports or {}},
        'Config': {'Healthcheck': {'Test': spec['healthcheck']['test']},
                   'Labels': labels if labels is not None else {_proxy.LABEL_ROLE: 'proxy'}},
        'NetworkSettings': {'Networks': dict((n, {}) for n in (networks or ['pi-dispatch-egress-out']))},
    }


def test_matching_container_has_no_differences():
    spec = _spec()
    obs = _proxy.observed(_attrs(spec))
    assert _proxy.differences(spec, obs, 'sha256:img') == []


@pytest.mark.parametrize('change, needle', [
    (dict(image='sha256:old'), 'image'),
    (dict(restart='no'), 'restart policy'),
    (dict(extra_hosts=[]), 'extra hosts'),
    (dict(networks=['bridge']), 'networks'),
    (dict(ports={'3128/tcp': [{'HostPort': '3128'}]}), 'published ports'),
])
def test_each_difference_is_named(change, needle):
    spec = _spec()
    obs = _proxy.observed(_attrs(spec, **change))
    diffs = _proxy.differences(spec, obs, 'sha256:img')
    assert len(diffs) == 1 and diffs[0].startswith(needle), diffs


def test_read_write_and_missing_mounts_are_differences():
    spec = _spec()
    rw = [{'Type': 'bind', 'Source': s, 'Destination': d, 'RW': True} for s, d in spec['mounts']]
    diffs = _proxy.differences(spec, _proxy.observed(_attrs(spec, mounts=rw)), 'sha256:img')
    assert any('read-write' in d for d in diffs)
    two = [{'Type': 'bind', 'Source': s, 'Destination': d, 'RW': False} for s, d in spec['mounts'][:2]]
    obs = _proxy.observed(_attrs(spec, mounts=two, labels={}))
    assert any(d.startswith('mounts') for d in _proxy.differences(spec, obs, 'sha256:img'))
    assert _proxy.is_ours(obs) and not _proxy.mounts_endpoints(obs)


def test_foreign_container_is_not_ours():
    spec = _spec()
    obs = _proxy.observed(_attrs(spec, mounts=[], labels={'app': 'something-else'}))
    assert not _proxy.is_ours(obs)


def test_job_networks_are_recognised():
    spec = _spec()
    obs = _proxy.observed(_attrs(spec, networks=['pi-dispatch-egress-out', 'pi-job-a1-net', 'pi-job--nett', 'x']))
    assert obs['job_networks'] == ['pi-job-a1-net']


R, P, S = 'running', 'paused', 'stopped'

# (state wanted, container: None / running / paused / stopped, differs, has job networks) -> actions
DECISIONS = [
    ('started', None, False, False, ['create', 'start']),
    ('started', R, False, False, []),
    ('started', R, True, False, ['remove', 'create', 'start']),
    ('started', R, True, True, ['remove', 'create', 'start', 'reconnect']),
    ('started', P, False, False, ['unpause']),
    ('started', S, False, False, ['start']),
    ('started', S, True, False, ['remove', 'create', 'start']),
    ('present', S, False, False, ['start']),
    ('stopped', R, False, False, ['stop']),
    ('stopped', P, False, False, ['unpause', 'stop']),
    ('stopped', S, False, False, []),
    ('stopped', None, False, False, ['create']),
    ('absent', None, False, False, []),
    ('absent', R, False, False, ['remove']),
    ('absent', S, True, False, ['remove']),
    ('restarted', R, False, False, ['restart']),
    ('restarted', S, False, False, ['start']),
    ('restarted', P, False, False, ['unpause', 'restart']),
    ('restarted', None, False, False, ['create', 'start']),
    ('reloaded', R, False, False, ['reconfigure']),
    ('reloaded', S, False, False, ['start']),
    ('reloaded', R, True, True, ['remove', 'create', 'start', 'reconnect']),
]


@pytest.mark.parametrize('state, have, differs, jobs, want', DECISIONS)
def test_decision_table(state, have, differs, jobs, want):
    spec = _spec()
    obs = None
    if have:
        nets = ['pi-dispatch-egress-out'] + (['pi-job-7-net'] if jobs else [])
        obs = _proxy.observed(_attrs(spec, running=have in (R, P), paused=have == P, networks=nets))
    diffs = ['image: differs'] if differs else []
    assert _proxy.decide(state if state != 'present' else 'started', obs, diffs) == want


# (state wanted, container, differs) with the allowlist changed since squid read it -> actions
ALLOWLIST_CHANGED = [
    ('started', R, False, ['reconfigure']),        # a hand edit: re-read it, cut nothing
    ('present', R, False, ['reconfigure']),
    ('started', R, True, ['remove', 'create', 'start']),  # recreated anyway: squid reads it at start
    ('started', S, False, ['start']),              # a start reads it
    ('started', P, False, ['unpause', 'reconfigure']),
    ('started', None, False, ['create', 'start']),
    ('restarted', R, False, ['restart']),          # a restart reads it; no extra reconfigure
    ('reloaded', R, False, ['reconfigure']),       # never twice
    ('stopped', R, False, ['stop']),
    ('absent', R, False, ['remove']),
]


@pytest.mark.parametrize('state, have, differs, want', ALLOWLIST_CHANGED)
def test_decision_when_the_allowlist_changed(state, have, differs, want):
    spec = _spec()
    obs = None
    if have:
        obs = _proxy.observed(_attrs(spec, running=have in (R, P), paused=have == P,
                                     networks=['pi-dispatch-egress-out']))
    diffs = ['image: differs'] if differs else []
    assert _proxy.decide(state, obs, diffs, allowlist_changed=True) == want


def test_allowlist_commands_compare_and_record_the_mounted_file():
    mounted = '/etc/pi-dispatch/egress-allowlist.conf'
    assert _proxy.allowlist_check_cmd() == ['cmp', '-s', _proxy.LOADED_ALLOWLIST, mounted]
    assert _proxy.allowlist_record_cmd() == ['cp', mounted, _proxy.LOADED_ALLOWLIST]
