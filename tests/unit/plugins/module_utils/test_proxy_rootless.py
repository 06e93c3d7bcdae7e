"""A rootless engine's account and the proxy user it maps (_proxy/rootless.py), no daemon (issue 44).

The info and the modes are the ones measured under ``./run gate podman-rootless`` (Podman 4.3.1 as the account
pi-egress-rl, uid 1001, subuid 100000:65536): the engine could not mount a file under pytest's 0700 folder
("mkdir /tmp/pytest-of-root/pytest-290: permission denied", after the deploy had already made the decision log
folder), and squid could not write the decision log in a folder given to host uid 13 ("cannot write
/var/log/pi-dispatch/...decisions.jsonl (Permission denied)").
"""

import os
import stat

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import venue as _venue
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import rootless as _rootless
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import deploy as _deploy
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import lifecycle as _proxy
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import spec as _proxy_spec

# GET /v4.0.0/libpod/info of the account's service, as measured (host part).
MAPS = {'uidmap': [{'container_id': 0, 'host_id': 1001, 'size': 1},
                   {'container_id': 1, 'host_id': 100000, 'size': 65536}],
        'gidmap': [{'container_id': 0, 'host_id': 1001, 'size': 1},
                   {'container_id': 1, 'host_id': 100000, 'size': 65536}]}
ROOTLESS_INFO = {'host': {'security': {'rootless': True}, 'cgroupVersion': 'v1', 'idMappings': MAPS}}
ROOTFUL_INFO = {'host': {'security': {'rootless': False}, 'cgroupVersion': 'v1', 'idMappings': {}}}
IDS = _rootless.parse_info(ROOTLESS_INFO)


def test_the_ids_come_from_the_engine_own_mappings():
    assert IDS.uid == 1001 and IDS.gid == 1001
    assert IDS.host_uid(0) == 1001 and IDS.host_uid(13) == 100012 and IDS.host_gid(13) == 100012
    assert IDS.host_uid(65536) == 165535 and IDS.host_uid(65537) is None
    assert IDS.maps(100012, 100012) and IDS.maps(1001, 1001)
    assert not IDS.maps(0, 0) and not IDS.maps(100012, 0) and not IDS.maps(165536, 100000)
    assert _rootless.parse_info(ROOTFUL_INFO) is None
    for broken in (None, {}, {'host': None}, {'host': {'security': {'rootless': True}}},
                   {'host': {'security': {'rootless': True}, 'idMappings': {'uidmap': [{'container_id': 1}]}}},
                   {'host': {'security': {'rootless': True}, 'idMappings': {
                       'uidmap': [{'container_id': 1, 'host_id': 100000, 'size': 10}], 'gidmap': MAPS['gidmap']}}}):
        assert _rootless.parse_info(broken) is None, broken


def _st(mode, uid=0, gid=0, kind=stat.S_IFDIR):
    return os.stat_result((kind | mode, 0, 0, 1, uid, gid, 0, 0, 0, 0))


def _fs(table):
    """A stat function over ``table`` (path -> stat_result); a path not in it does not exist."""
    def lookup(path):
        if path not in table:
            raise FileNotFoundError(path)
        return table[path]
    return lookup


BASE = {'/': _st(0o755), '/srv': _st(0o755), '/srv/egress': _st(0o755), '/srv/egress/deploy': _st(0o755),
        '/srv/egress/deploy/egress-proxy.conf': _st(0o644, kind=stat.S_IFREG),
        '/srv/egress/egress-allowlist.conf': _st(0o644, kind=stat.S_IFREG)}
FILES = ['/srv/egress/deploy/egress-proxy.conf', '/srv/egress/egress-allowlist.conf']


@pytest.mark.parametrize('changes, groups, blocked', [
    ({}, [1001], None),                                                     # the default layout: 0755 / 0644
    ({'/srv': _st(0o700)}, [1001], '/srv'),                                 # pytest's 0700 folder, as measured
    ({'/srv': _st(0o750, gid=50)}, [1001], '/srv'),                         # a group the account is not in
    ({'/srv': _st(0o750, gid=50)}, [1001, 50], None),                       # ... and one it is in
    ({'/srv': _st(0o711)}, [1001], None),                                   # searchable, not listable: enough
    ({'/srv': _st(0o700, uid=1001, gid=1001)}, [1001], None),               # the account's own folder
    ({'/srv': _st(0o070, uid=1001, gid=1001)}, [1001], None),               # its bits say no, its root may
    ({'/srv': _st(0o700, uid=100012, gid=100012)}, [1001], None),           # owned by a mapped id: its root may
    ({'/srv': _st(0o700, uid=100012, gid=0)}, [1001], '/srv'),              # ... only when uid and gid are mapped
    ({'/srv/egress/deploy': _st(0o700)}, [1001], '/srv/egress/deploy'),     # the first folder that says no
])
def test_a_folder_the_account_cannot_search_is_named_with_its_fix(changes, groups, blocked):
    table = dict(BASE, **changes)
    refusal = _rootless.mount_refusal(FILES, None, IDS, account='pi-egress-rl', groups=groups, stat=_fs(table))
    if blocked is None:
        assert refusal is None
        return
    assert refusal is not None
    assert "cannot search %s (mode %04o" % (blocked, stat.S_IMODE(table[blocked].st_mode)) in refusal, refusal
    assert 'pi-egress-rl (uid 1001)' in refusal and 'chmod o+x %s' % blocked in refusal, refusal
    assert '/opt/pi-dispatch/egress' in refusal


@pytest.mark.parametrize('mode, uid, gid, refused', [
    (0o644, 0, 0, False),
    (0o600, 0, 0, True),           # root-only: the proxy user reads it as "other"
    (0o640, 0, 0, True),
    (0o640, 0, 100012, False),     # the proxy user's group on the host
    (0o400, 100012, 0, False),     # owned by the proxy user as the engine maps it
    (0o400, 13, 13, True),         # host uid 13 is someone else under a rootless engine
])
def test_a_mounted_file_the_proxy_user_cannot_read_is_named(mode, uid, gid, refused):
    path = '/srv/egress/egress-allowlist.conf'
    table = dict(BASE, **{path: _st(mode, uid, gid, kind=stat.S_IFREG)})
    refusal = _rootless.mount_refusal([path], None, IDS, account='pi-egress-rl', groups=[1001], stat=_fs(table))
    if not refused:
        assert refusal is None
        return
    assert path in refusal and 'uid 100012' in refusal and 'chmod o+r %s' % path in refusal, refusal


def test_the_log_folder_is_checked_from_the_nearest_existing_folder():
    table = dict(BASE, **{'/srv': _st(0o700)})
    refusal = _rootless.mount_refusal([], '/srv/egress/decisions/new', IDS, account='a', groups=[1001],
                                      stat=_fs(table))
    assert 'cannot search /srv ' in refusal and 'decision log folder /srv/egress/decisions/new' in refusal
    assert _rootless.mount_refusal([], '/srv/egress/decisions', IDS, account='a', groups=[1001],
                                   stat=_fs(BASE)) is None


class _Response(object):
    def __init__(self, body, status=200):
        self.body, self.status_code = body, status

    def raise_for_status(self):
        if self.status_code != 200:
            raise RuntimeError('HTTP %d' % self.status_code)

    def json(self):
        return self.body


class _Api(object):
    base_url = 'http+docker://localhost'

    def __init__(self, info):
        self.info, self.asked = info, []

    def get(self, url, timeout=None):
        self.asked.append(url)
        return _Response(self.info) if self.info is not None else _Response({}, 500)


class _Client(object):
    """Only what venue() and engine_ids() ask."""

    def __init__(self, kind, info):
        self.api = _Api(info)
        podman = [{'Name': 'Podman Engine', 'Version': '4.3.1'}] if kind == 'podman' else [{'Name': 'Engine'}]
        self.version = lambda: {'Version': '4.3.1', 'ApiVersion': '1.41', 'Components': podman}
        self.info = lambda: {'SecurityOptions': []}


def test_engine_ids_asks_a_rootless_podman_once_and_nobody_else():
    client = _Client('podman', ROOTLESS_INFO)
    ids = _rootless.engine_ids(client)
    assert ids.host_uid(13) == 100012
    asked = len(client.api.asked)
    assert _rootless.engine_ids(client) is ids and len(client.api.asked) == asked     # asked once per client
    assert _rootless.engine_ids(_Client('podman', ROOTFUL_INFO)) is None
    docker_client = _Client('docker', ROOTLESS_INFO)
    assert _rootless.engine_ids(docker_client) is None and docker_client.api.asked == []
    assert _rootless.engine_ids(None) is None


def test_the_log_folder_goes_to_the_proxy_user_as_the_rootless_engine_maps_it(tmp_path, monkeypatch):
    chowned = []
    monkeypatch.setattr(_proxy.os, 'chown', lambda path, uid, gid: chowned.append((path, uid, gid)))
    client = _Client('podman', ROOTLESS_INFO)
    folder = tmp_path / 'decisions'
    spec = _proxy_spec.desired_spec('img', '/d/r', '/d/a', '/d/e', decision_log=dict(dir=str(folder)))
    manager = _proxy.ProxyManager(client, spec)
    assert manager.ensure_log_dir() and chowned == [(str(folder), 100012, 100012)]
    assert manager.actions == ['create decision log folder %s (the proxy user: uid 100012 on this host)' % folder]
    # A folder an earlier rootful deploy gave to uid 13 is given to the mapped user.
    chowned[:] = []
    real_stat = os.stat
    owner = [13]

    def stat(path, **kw):
        return _st(0o750, owner[0], owner[0]) if str(path) == str(folder) else real_stat(path, **kw)

    monkeypatch.setattr(_proxy.os, 'stat', stat)
    manager = _proxy.ProxyManager(client, spec)
    assert manager.ensure_log_dir() and chowned == [(str(folder), 100012, 100012)]
    assert manager.actions == ['give decision log folder %s to the proxy user (uid 100012 on this host)' % folder]
    owner[0] = 100012
    assert not _proxy.ProxyManager(client, spec).ensure_log_dir()


def test_an_unreachable_deployment_is_refused_before_anything_changes(tmp_path, monkeypatch):
    deploy_dir = str(tmp_path / 'egress')
    _deployment.apply(deploy_dir)
    params = dict(state='started', name='pi-dispatch-egress-proxy', image='pi-dispatch-egress-proxy:latest',
                  deploy_dir=deploy_dir, network='pi-dispatch-egress-out', network_internal=False, extra_hosts=[],
                  mount_endpoints=True, health_interval=5, wait=True, wait_timeout=60, allow_cut_jobs=False,
                  memory='512m', pids_limit=256, nofile=16384, log_max_size='10m', log_max_file=3,
                  shard_bound=None, decision_log=True, decision_log_dir=None, decision_log_max_size='10m',
                  decision_log_keep=5)
    paths = _deployment.paths(deploy_dir)
    spec = _deploy.wanted_spec(params, paths)
    assert spec['log_mount']
    client = _Client('podman', ROOTLESS_INFO)
    client.containers = type('C', (), {'get': lambda self, name: (x for x in ()).throw(_not_found(name))})()
    client.images = type('I', (), {'get': lambda self, name: type('Image', (), {'id': 'sha256:img'})()})()
    changed = []
    monkeypatch.setattr(_proxy.os, 'chown', lambda *a: changed.append(('chown',) + a))
    monkeypatch.setattr(_proxy.os, 'makedirs', lambda *a, **k: changed.append(('makedirs',) + a))
    monkeypatch.setattr(_proxy.ProxyManager, 'ensure_network', lambda self, internal=False: changed.append('net'))
    blocked = os.path.dirname(deploy_dir)
    real_refusal = _rootless.mount_refusal

    def refusal(files, log_dir, ids, **kw):
        def stat(path):
            return _st(0o700) if path == blocked else _st(0o755) if os.path.isdir(path) else os.stat(path)
        return real_refusal(files, log_dir, ids, account='pi-egress-rl', groups=[1001], stat=stat, **kw)

    monkeypatch.setattr(_rootless, 'mount_refusal', refusal)
    run = _deploy.ProxyDeploy(client, params, spec, paths)
    with pytest.raises(_proxy_spec.ProxyError) as info:
        run.run()
    assert 'cannot search %s' % blocked in str(info.value) and 'Nothing was changed' in str(info.value)
    assert changed == [] and run.result['actions'] == []


def _not_found(name):
    import docker
    return docker.errors.NotFound('%s not found' % name)


def test_the_venue_is_asked_through_the_one_cache():
    client = _Client('podman', ROOTLESS_INFO)
    assert _venue.venue(client).rootless
    assert _rootless.engine_ids(client).uid == 1001


class _ProbeApi(_Api):
    """Records the probe container the doctor creates, and runs it to an empty end."""

    def __init__(self, info):
        super(_ProbeApi, self).__init__(info)
        self.created = []

    def create_host_config(self, **kwargs):
        return dict(kwargs)

    def create_endpoint_config(self, **kwargs):
        return dict(kwargs)

    def create_networking_config(self, config):
        return config

    def create_container(self, image, command, **kwargs):
        self.created.append(kwargs)
        return {'Id': kwargs['name']}

    def start(self, cid):
        pass

    def wait(self, cid, timeout=None):
        return {'StatusCode': 0}

    def logs(self, cid, **kwargs):
        return b''

    def remove_container(self, name, force=False):
        pass


@pytest.mark.parametrize('kind, info, user, userns', [
    ('podman', ROOTLESS_INFO, '1001:1001', 'keep-id'),   # the account's uid, keep-id: as a podman job starts
    ('podman', ROOTFUL_INFO, None, None),
    ('docker', ROOTLESS_INFO, None, None),
])
def test_the_doctor_probes_start_the_way_a_job_starts_on_the_venue(kind, info, user, userns):
    """On rootless Podman a job runs as its account's uid with --userns=keep-id, so the doctor's probes do
    (measured on 4.3.1 through the Docker API: the probe's uid_map maps 1001 to itself); elsewhere as before."""
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import containers as _containers
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import context as _context
    client = _Client(kind, info)
    client.api = _ProbeApi(info)
    ctx = _context.DoctorContext(client=client, proxy='proxy', deploy_dir=None, probe_image='img', pid=42, environ={})
    assert _containers.job_identity(ctx) == (user, userns)
    results = {}
    _containers.run_container(ctx, 'canary', 'probe-42', 'true', 'net', results, 5)
    _output, error = _containers.run_job_probe(ctx, 'job', 'job-probe-42', 'true', 'jobnet', {}, 5)
    assert results['canary'] == ('', None) and error is None
    assert [made['user'] for made in client.api.created] == [user, user]
    assert [made['host_config'].get('UsernsMode') for made in client.api.created] == [userns, userns]
    assert all(made['host_config']['cap_drop'] == ['ALL'] for made in client.api.created)


# --- the rootless network keeper (Podman 4) --------------------------------------------------------------


def _summary(name, networks, cid=None):
    return {'Id': cid or ('c0ffee' * 11)[:64], 'Names': ['/' + name],
            'NetworkSettings': {'Networks': dict((n, {}) for n in networks)}}


class _KeeperApi(_Api):
    """An engine's running containers, and a record of every call the keeper rule makes."""

    def __init__(self, info, running, refuse_create=False):
        super(_KeeperApi, self).__init__(info)
        self.running, self.refuse_create, self.calls = running, refuse_create, []

    def containers(self, filters=None):
        assert filters == {'status': 'running'}, filters
        return list(self.running)

    def inspect_container(self, name):
        return {'Image': 'sha256:proxyimage', 'State': {'Running': True}}

    def create_host_config(self, **kwargs):
        return dict(kwargs)

    def create_container(self, image, command, **kwargs):
        if self.refuse_create:
            raise RuntimeError('image not known')
        self.calls.append(('create', image, command, kwargs['name'], kwargs['entrypoint'],
                           kwargs['host_config']['network_mode'], kwargs['host_config']['cap_drop']))
        return {'Id': kwargs['name']}

    def start(self, cid):
        self.calls.append(('start', cid))

    def remove_container(self, name, force=False):
        self.calls.append(('remove', name))


def _keeper_client(version, info, running, **more):
    client = _Client('podman' if version else 'docker', info)
    if version:
        client.version = lambda: {'Version': version, 'ApiVersion': '1.41',
                                  'Components': [{'Name': 'Podman Engine', 'Version': version}]}
    client.api = _KeeperApi(info, running, **more)
    return client


PROXY_ALONE = [_summary('pi-dispatch-egress-proxy', ['pi-dispatch-egress-out', 'pi-job-a-net'])]
WITH_A_JOB = PROXY_ALONE + [_summary('job-b', ['pi-job-b-net'], cid='b' * 64)]
ON_PRIVATE_NETWORKS_ONLY = PROXY_ALONE + [_summary('other', ['slirp4netns'], cid='d' * 64)]


@pytest.mark.parametrize('case, version, info, running, kept', [
    # Measured on 4.3.1 rootless: the proxy the only running container on a bridge network -> torn down without one
    ('rootless Podman 4, the proxy alone', '4.3.1', ROOTLESS_INFO, PROXY_ALONE, True),
    ('rootless Podman 4, a job runs too', '4.3.1', ROOTLESS_INFO, WITH_A_JOB, False),
    ('rootless Podman 4, the other one on its own slirp4netns', '4.3.1', ROOTLESS_INFO, ON_PRIVATE_NETWORKS_ONLY, True),
    ('rootless Podman 4, the leaving one not running', '4.3.1', ROOTLESS_INFO, WITH_A_JOB[1:], False),
    ('rootful Podman 4', '4.3.1', ROOTFUL_INFO, PROXY_ALONE, False),
    ('rootless Podman 5 (another rootless netns)', '5.4.2', ROOTLESS_INFO, PROXY_ALONE, False),
    ('Docker', None, ROOTLESS_INFO, PROXY_ALONE, False),
])
def test_a_keeper_holds_the_rootless_network_through_the_last_detach(case, version, info, running, kept):
    client = _keeper_client(version, info, running)
    actions, detached = [], []
    with _rootless.network_held(client, 'pi-dispatch-egress-proxy', 'pi-job-a-net', actions=actions) as keeper:
        detached.append(list(client.api.calls))   # what ran before the detach
    name = 'pi-dispatch-egress-proxy-keeper-%d' % os.getpid()
    if kept:
        assert keeper == name, case
        assert detached == [[('create', 'sha256:proxyimage', ['60'], name, ['sleep'], 'pi-job-a-net', ['ALL']),
                             ('start', name)]], case
        assert client.api.calls[-1] == ('remove', name) and len(actions) == 1, case
    else:
        assert keeper is None and client.api.calls == [] and actions == [], case


def test_a_keeper_that_cannot_start_refuses_the_detach():
    client = _keeper_client('4.3.1', ROOTLESS_INFO, PROXY_ALONE, refuse_create=True)
    ran = []
    with pytest.raises(_rootless.dc.EngineError) as raised:
        with _rootless.network_held(client, 'pi-dispatch-egress-proxy', 'pi-job-a-net'):
            ran.append('detach')
    assert ran == []
    text = str(raised.value)
    assert 'Podman 4.3.1 (rootless)' in text and 'pi-dispatch-egress-proxy is the only running container' in text
    assert 'image not known' in text and text.endswith('Nothing was detached.')


@pytest.mark.parametrize('running, leaving, holds', [
    (PROXY_ALONE, 'pi-dispatch-egress-proxy', False),
    (WITH_A_JOB, 'pi-dispatch-egress-proxy', True),
    (WITH_A_JOB, 'job-b', True),                                                 # the proxy still holds it
    ([_summary('job-b', ['pi-job-b-net'], cid='b' * 64)], 'b' * 12, False),      # an id prefix is the leaving one
    ([_summary('x', [])], 'pi-dispatch-egress-proxy', False),
    ([_summary('x', ['host']), _summary('y', ['none'])], 'z', False),
])
def test_holds_without(running, leaving, holds):
    assert _rootless.holds_without(running, leaving) is holds
