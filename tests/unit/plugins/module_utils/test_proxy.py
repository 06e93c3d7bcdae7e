"""The proxy's comparison and decision table (no daemon)."""

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import lifecycle as _proxy
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import reload as _reload
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import spec as _proxy_spec


def _spec(**kw):
    return _proxy_spec.desired_spec('pi-dispatch-egress-proxy:latest', '/d/deploy/egress-proxy.conf',
                                    '/d/egress-allowlist.conf', '/d/model-endpoints.conf', **kw)


def _hardened(spec):
    """HostConfig fields as Docker reports them for a container created from ``spec``."""
    return {'SecurityOpt': list(spec['security_opt']), 'CapDrop': list(spec['cap_drop']), 'CapAdd': None,
            'ReadonlyRootfs': True, 'Tmpfs': dict(spec['tmpfs']), 'Sysctls': dict(spec['sysctls']),
            'Memory': spec['memory'], 'MemorySwap': spec['memory'], 'PidsLimit': spec['pids_limit'],
            'Ulimits': [{'Name': u['name'], 'Soft': u['soft'], 'Hard': u['hard']} for u in spec['ulimits']],
            'LogConfig': {'Type': spec['log_config']['type'], 'Config': dict(spec['log_config']['config'])}}


def _attrs(spec, running=True, paused=False, status=None, networks=None, mounts=None, image='sha256:img',
           restart='unless-stopped', extra_hosts=None, ports=None, labels=None, host=None, health=None, cmd=None):
    mounts = mounts if mounts is not None else [
        {'Type': 'bind', 'Source': src, 'Destination': dst, 'RW': False} for src, dst in spec['mounts']]
    return {
        'Id': 'cid', 'Name': '/pi-dispatch-egress-proxy', 'Image': image,
        'State': {'Status': status or ('paused' if paused else 'running' if running else 'exited'),
                  'Running': running, 'Paused': paused, 'Health': {'Status': 'healthy'}},
        'Mounts': mounts,
        'HostConfig': dict(_hardened(spec), RestartPolicy={'Name': restart},
                           ExtraHosts=extra_hosts if extra_hosts is not None else list(spec['extra_hosts']),
                           PortBindings=ports or {}, **(host or {})),
        'Config': {'Healthcheck': dict({'Test': spec['healthcheck']['test'],
                                        'Interval': spec['healthcheck']['interval'],
                                        'Timeout': spec['healthcheck']['timeout'],
                                        'Retries': spec['healthcheck']['retries'],
                                        'StartPeriod': spec['healthcheck']['start_period']}, **(health or {})),
                   'Cmd': cmd if cmd is not None else list(spec['command']),
                   # Docker merges the image's labels in: only ours are compared.
                   'Labels': labels if labels is not None else {_proxy_spec.LABEL_ROLE: 'proxy',
                                                                'org.opencontainers.image.title': 'x'}},
        'NetworkSettings': {'Networks': dict((n, {}) for n in (networks or ['pi-dispatch-egress-out']))},
    }


def test_matching_container_has_no_differences():
    spec = _spec()
    obs = _proxy_spec.observed(_attrs(spec))
    assert _proxy_spec.differences(spec, obs, 'sha256:img') == []


@pytest.mark.parametrize('change, needle', [
    (dict(image='sha256:old'), 'image'),
    (dict(restart='no'), 'restart policy'),
    (dict(extra_hosts=[]), 'extra hosts'),
    (dict(networks=['bridge']), 'networks'),
    (dict(ports={'3128/tcp': [{'HostPort': '3128'}]}), 'published ports'),
    (dict(health={'Interval': 30 * 10 ** 9}), 'health check timing'),
    (dict(host={'CapDrop': None}), 'capabilities dropped'),
    (dict(host={'CapDrop': ['NET_RAW']}), 'capabilities dropped'),
    (dict(host={'CapAdd': ['NET_ADMIN']}), 'capabilities added'),
    (dict(host={'LogConfig': {'Type': 'json-file', 'Config': {}}}), 'log config'),
    (dict(host={'LogConfig': {'Type': 'local', 'Config': {'max-size': '10m', 'max-file': '3'}}}), 'log config'),
    (dict(host={'ReadonlyRootfs': False}), 'read-only root file system'),
    (dict(host={'SecurityOpt': None}), 'security options'),
    (dict(host={'Tmpfs': None}), 'tmpfs'),
    (dict(host={'Sysctls': None}), 'sysctls'),
    (dict(host={'PidsLimit': None}), 'pids limit'),
    (dict(host={'Ulimits': None}), 'ulimits'),
    (dict(cmd=['squid', '-N', '-f', '/etc/squid/squid.conf']), 'command'),
    (dict(labels={'other': 'x'}), 'labels'),
])
def test_each_difference_is_named(change, needle):
    spec = _spec()
    obs = _proxy_spec.observed(_attrs(spec, **change))
    diffs = _proxy_spec.differences(spec, obs, 'sha256:img')
    assert len(diffs) == 1 and diffs[0].startswith(needle), diffs


def test_read_write_and_missing_mounts_are_differences():
    spec = _spec()
    rw = [{'Type': 'bind', 'Source': s, 'Destination': d, 'RW': True} for s, d in spec['mounts']]
    diffs = _proxy_spec.differences(spec, _proxy_spec.observed(_attrs(spec, mounts=rw)), 'sha256:img')
    assert any('read-write' in d for d in diffs)
    two = [{'Type': 'bind', 'Source': s, 'Destination': d, 'RW': False} for s, d in spec['mounts'][:2]]
    obs = _proxy_spec.observed(_attrs(spec, mounts=two, labels={}))
    assert any(d.startswith('mounts') for d in _proxy_spec.differences(spec, obs, 'sha256:img'))
    assert _proxy_spec.is_ours(obs) and not _proxy_spec.mounts_endpoints(obs)


def test_foreign_container_is_not_ours():
    spec = _spec()
    obs = _proxy_spec.observed(_attrs(spec, mounts=[], labels={'app': 'something-else'}))
    assert not _proxy_spec.is_ours(obs)


def test_job_networks_are_recognised():
    spec = _spec()
    obs = _proxy_spec.observed(_attrs(spec, networks=['pi-dispatch-egress-out', 'pi-job-a1-net', 'pi-job--nett', 'x']))
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
        obs = _proxy_spec.observed(_attrs(spec, running=have in (R, P), paused=have == P, networks=nets))
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
        obs = _proxy_spec.observed(_attrs(spec, running=have in (R, P), paused=have == P,
                                          networks=['pi-dispatch-egress-out']))
    diffs = ['image: differs'] if differs else []
    assert _proxy.decide(state, obs, diffs, allowlist_changed=True) == want


def test_allowlist_commands_compare_and_record_the_mounted_file():
    mounted = '/etc/pi-dispatch/egress-allowlist.conf'
    assert _reload.allowlist_check_cmd() == ['cmp', '-s', _proxy_spec.LOADED_ALLOWLIST, mounted]
    # The record is taken BEFORE squid reads: at start and in the same exec as the reconfigure.
    assert _proxy_spec.COMMAND[-1].startswith('cp %s %s; exec squid ' % (mounted, _proxy_spec.LOADED_ALLOWLIST))
    assert _reload.reconfigure_cmd()[-1].startswith('cp %s %s && ' % (mounted, _proxy_spec.LOADED_ALLOWLIST))
    # the TLS name check (a second squid of the image) rereads a changed guard first and answers again,
    # then squid rereads everything
    script = _reload.reconfigure_cmd()[-1]
    assert script.endswith(_reload.relisten_script('/etc/squid/squid.conf'))
    peek = script.index('squid -k reconfigure -f /etc/squid/peek.conf')
    assert peek < script.index('0100007F:0C39') < script.index('squid -k reconfigure -f /etc/squid/squid.conf')
    # then it waits until squid listens on the job port again (a new socket: the old one closes after the signal)
    main = script.index('squid -k reconfigure -f /etc/squid/squid.conf')
    assert script.index('$10 != old', main) > main and 'exit 1' in script[main:]
    assert 'cmp -s /etc/pi-dispatch/egress-guard.conf /tmp/pi-egress-peek-guard.conf' in script


def test_memory_without_swap_and_the_limit_in_bytes():
    spec = _spec(limits=dict(memory='1g'))
    assert spec['memory'] == 1024 ** 3
    obs = _proxy_spec.observed(_attrs(spec, host={'MemorySwap': 2 * 1024 ** 3}))
    assert [d for d in _proxy_spec.differences(spec, obs, 'sha256:img') if d.startswith('memory+swap')]


@pytest.mark.parametrize('limits, needle', [
    (dict(memory='lots'), 'egress_proxy_memory'),
    (dict(memory='32m'), 'below 64m'),
    (dict(pids=0), 'egress_proxy_pids_limit'),
    (dict(nofile='x'), 'egress_proxy_nofile'),
    (dict(log_max_size='10q'), 'egress_proxy_log_max_size'),
    (dict(log_max_file=0), 'egress_proxy_log_max_file'),
])
def test_bad_limits_name_the_variable(limits, needle):
    with pytest.raises(_proxy_spec.ProxyError) as info:
        _spec(limits=limits)
    assert needle in str(info.value)


def test_the_hardened_shape():
    spec = _spec(guard='/d/egress-guard.conf')
    assert spec['cap_drop'] == ['ALL'] and spec['cap_add'] == [] and spec['read_only'] is True
    assert spec['sysctls'] == {'net.ipv4.ip_forward': '0', 'net.ipv6.conf.all.forwarding': '0'}
    assert spec['security_opt'] == ['no-new-privileges:true']
    assert set(spec['tmpfs']) == {'/tmp', '/run/squid'}
    assert ('/d/egress-guard.conf', '/etc/pi-dispatch/egress-guard.conf') in spec['mounts']
    kwargs = _proxy_spec.create_kwargs(spec)
    assert kwargs['memswap_limit'] == kwargs['mem_limit'] == spec['memory']
    assert kwargs['log_config'] == {'type': 'json-file', 'config': {'max-size': '10m', 'max-file': '3'}}


@pytest.mark.parametrize('actions, running, jobs, cut, refused', [
    (['remove', 'create', 'start', 'reconnect'], True, ['pi-job-a-net'], 1, True),
    (['restart'], True, ['pi-job-a-net', 'pi-job-b-net'], 2, True),
    (['stop'], True, ['pi-job-a-net'], 1, True),
    (['remove'], True, ['pi-job-a-net'], 1, True),
    (['reconfigure'], True, ['pi-job-a-net'], 0, False),
    (['remove', 'create', 'start'], True, [], 0, False),
    (['remove', 'create', 'start'], False, ['pi-job-a-net'], 0, False),
])
def test_consent_rule(actions, running, jobs, cut, refused):
    spec = _spec()
    obs = _proxy_spec.observed(_attrs(spec, running=running, networks=['pi-dispatch-egress-out'] + jobs))
    assert _proxy.jobs_cut(actions, obs) == cut
    refusal = _proxy.consent_refusal(actions, obs, False)
    assert bool(refusal) is refused
    if refused:
        assert 'would cut %d job' % cut in refusal and 'egress_proxy_allow_cut_jobs' in refusal
    assert _proxy.consent_refusal(actions, obs, True) is None


def test_a_replaced_proxy_rejoins_every_network_but_the_upstream():
    spec = _spec()
    networks = ['pi-dispatch-egress-out', 'pi-job-a-net', 'client-net', 'bridge']
    obs = _proxy_spec.observed(_attrs(spec, networks=networks))
    assert _proxy.reattach_networks(obs, 'pi-dispatch-egress-out') == ['client-net', 'pi-job-a-net']


def test_stale_mounts_are_found_by_content(tmp_path):
    import hashlib
    src = tmp_path / 'egress-allowlist.conf'
    src.write_text('new.test\n')
    spec = {'mounts': [(str(src), '/etc/pi-dispatch/egress-allowlist.conf')]}
    old = hashlib.sha256(b'old.test\n').hexdigest()
    new = hashlib.sha256(b'new.test\n').hexdigest()
    out = '%s  /etc/pi-dispatch/egress-allowlist.conf\n' % old
    assert _reload.stale_mounts(spec, _reload.parse_digests(out)) == [
        (str(src), '/etc/pi-dispatch/egress-allowlist.conf')]
    out = '%s  /etc/pi-dispatch/egress-allowlist.conf\n' % new
    assert _reload.stale_mounts(spec, _reload.parse_digests(out)) == []


def test_host_gateway_is_read_from_the_hosts_file():
    text = '127.0.0.1 localhost\n172.17.0.1\thost.docker.internal\n10.0.0.5 other # host.docker.internal\n'
    assert _proxy.hosts_address(text) == '172.17.0.1'
    assert _proxy.hosts_address('127.0.0.1 localhost\n') is None


@pytest.mark.parametrize('bound, label', [(None, None), (0, '0'), (10, '10'), (250, '250')])
def test_the_shard_bound_is_a_label_only_when_set(bound, label):
    labels = _spec(shard_bound=bound)['labels']
    assert labels.get('io.pi-dispatch.egress.shard-bound') == label
    assert labels['io.pi-dispatch.egress.role'] == 'proxy'
    if label is None:
        # unset adds nothing to compare, so a proxy made before the variable existed is not replaced
        assert set(labels) == {'io.pi-dispatch.egress.role'}


@pytest.mark.parametrize('bound', [-1, True, '10', 2.5])
def test_a_shard_bound_that_is_not_a_count_is_refused(bound):
    with pytest.raises(_proxy_spec.ProxyError) as info:
        _spec(shard_bound=bound)
    assert 'egress_proxy_shard_bound' in str(info.value) and 'whole number' in str(info.value)


BOUND = 'io.pi-dispatch.egress.shard-bound'


@pytest.mark.parametrize('wanted, running_label, differs', [
    (None, None, False),    # a proxy from before the variable, nothing asked: kept as it is
    (10, '10', False),
    (10, None, True),       # the variable set: the proxy is replaced to carry it
    (10, '25', True),       # changed
    (None, '25', True),     # the variable removed: the label goes, or dispatchers would keep following it
])
def test_the_shard_bound_label_is_compared_both_ways(wanted, running_label, differs):
    spec = _spec(shard_bound=wanted)
    labels = {_proxy_spec.LABEL_ROLE: 'proxy'}
    if running_label is not None:
        labels[BOUND] = running_label
    diffs = _proxy_spec.differences(spec, _proxy_spec.observed(_attrs(spec, labels=labels)), 'sha256:img')
    assert bool(diffs) is differs, diffs
    if differs:
        wanted_text = None if wanted is None else str(wanted)
        assert diffs == ['labels: %s is %r, wanted %r' % (BOUND, running_label, wanted_text)]


# --- the decision log's folder and environment (issue 25) -------------------------------------------

LOG = dict(dir='/d/decisions', max_size='1m', keep=3)


def _log_attrs(spec, rw=True, env=None):
    mounts = [{'Type': 'bind', 'Source': s, 'Destination': d, 'RW': False} for s, d in spec['mounts']]
    mounts.append({'Type': 'bind', 'Source': spec['log_mount'][0], 'Destination': spec['log_mount'][1], 'RW': rw})
    attrs = _attrs(spec, mounts=mounts)
    attrs['Config']['Env'] = env if env is not None else ['PATH=/usr/bin'] + [
        '%s=%s' % item for item in sorted(spec['environment'].items())]
    return attrs


def test_the_decision_log_is_one_read_write_folder_and_three_variables():
    spec = _spec(decision_log=LOG)
    assert spec['log_mount'] == ('/d/decisions', '/var/log/pi-dispatch')
    assert spec['environment'] == {'PI_EGRESS_DECISION_LOG_NAME': 'pi-dispatch-egress-proxy',
                                   'PI_EGRESS_DECISION_LOG_MAX_BYTES': str(1024 * 1024),
                                   'PI_EGRESS_DECISION_LOG_KEEP': '3'}
    assert _proxy_spec.create_kwargs(spec)['environment'] == spec['environment']
    assert _proxy_spec.differences(spec, _proxy_spec.observed(_log_attrs(spec)), 'sha256:img') == []
    # read-only, missing, or other variables: each a difference, so the proxy is replaced
    ro = _proxy_spec.observed(_log_attrs(spec, rw=False))
    assert any('read-write' in d for d in _proxy_spec.differences(spec, ro, 'sha256:img'))
    assert any(d.startswith('environment') for d in _proxy_spec.differences(
        spec, _proxy_spec.observed(_log_attrs(spec, env=['PATH=/usr/bin'])), 'sha256:img'))
    old = _proxy_spec.observed(_attrs(spec))   # a proxy from before the decision log
    assert any(d.startswith('mounts') for d in _proxy_spec.differences(spec, old, 'sha256:img'))
    # and without one, nothing of it is wanted
    assert _spec()['log_mount'] is None and _spec()['environment'] == {}


@pytest.mark.parametrize('log, needle', [
    (dict(dir='relative/path'), 'egress_decision_log_dir'),
    (dict(dir=''), 'egress_decision_log_dir'),
    (dict(dir='/d', max_size='10x'), 'egress_decision_log_max_size'),
    (dict(dir='/d', max_size='1k'), 'below 64k'),
    (dict(dir='/d', keep=-1), 'egress_decision_log_keep'),
    (dict(dir='/d', keep=101), 'egress_decision_log_keep'),
    (dict(dir='/d', keep=True), 'egress_decision_log_keep'),
])
def test_bad_decision_log_settings_name_the_variable(log, needle):
    with pytest.raises(_proxy_spec.ProxyError) as info:
        _spec(decision_log=log)
    assert needle in str(info.value)


def test_the_log_folder_is_made_for_the_proxy_user_and_a_symlink_is_refused(tmp_path, monkeypatch):
    chowned = []
    monkeypatch.setattr(_proxy.os, 'chown', lambda path, uid, gid: chowned.append((path, uid, gid)))
    folder = tmp_path / 'decisions'
    manager = _proxy.ProxyManager(None, _spec(decision_log=dict(dir=str(folder))), check_mode=True)
    assert manager.ensure_log_dir() and not folder.exists() and chowned == []   # check mode: said, not done
    manager = _proxy.ProxyManager(None, _spec(decision_log=dict(dir=str(folder))))
    assert manager.ensure_log_dir()
    assert folder.is_dir() and oct(folder.stat().st_mode & 0o777) == '0o750'
    assert chowned == [(str(folder), 13, 13)]
    (tmp_path / 'link').symlink_to(folder)
    manager = _proxy.ProxyManager(None, _spec(decision_log=dict(dir=str(tmp_path / 'link'))))
    with pytest.raises(_proxy_spec.ProxyError) as info:
        manager.ensure_log_dir()
    assert 'is a symlink' in str(info.value) and 'Nothing was changed' in str(info.value)
    (tmp_path / 'afile').write_text('x')
    with pytest.raises(_proxy_spec.ProxyError):
        _proxy.ProxyManager(None, _spec(decision_log=dict(dir=str(tmp_path / 'afile')))).check_log_dir()
