"""The engine venue (_common/venue.py) and the proxy spec as Podman takes it (_proxy/spec.for_venue), no daemon.

The inputs are the shapes measured on Docker Engine 20.10 and Podman 4.3.1 / 5.4.2 (docs/podman.md).
"""

import copy

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import venue as _venue
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import spec as _spec

try:
    import docker
except ImportError:  # pragma: no cover - the unit requirements install the SDK
    docker = None

IMAGE_ID = 'sha256:aaa'
OPERATOR_HOST = 'registry.local:10.0.0.5'

# GET /version, as measured.
DOCKER_VERSION = {'Version': '20.10.24', 'ApiVersion': '1.41',
                  'Components': [{'Name': 'Engine', 'Version': '20.10.24'},
                                 {'Name': 'containerd', 'Version': '1.6.20'}]}
PODMAN_43_VERSION = {'Version': '4.3.1', 'ApiVersion': '1.41',
                     'Components': [{'Name': 'Podman Engine', 'Version': '4.3.1', 'Details': {'APIVersion': '4.3.1'}}]}
PODMAN_54_VERSION = {'Version': '5.4.2', 'ApiVersion': '1.41',
                     'Components': [{'Name': 'Podman Engine', 'Version': '5.4.2', 'Details': {'APIVersion': '5.4.2'}}]}
# GET /info SecurityOptions.
DOCKER_ROOTLESS_INFO = {'SecurityOptions': ['name=seccomp,profile=default', 'name=rootless']}
DOCKER_ROOTFUL_INFO = {'SecurityOptions': ['name=apparmor', 'name=seccomp,profile=default']}
PODMAN_COMPAT_INFO = {'SecurityOptions': ['name=seccomp,profile=default']}  # no name=rootless, even rootless

# Podman 4.3.1's CapDrop of a container created with cap_drop=['ALL'] (its default set, sorted).
PODMAN_43_CAP_DROP = ['AUDIT_WRITE', 'CHOWN', 'DAC_OVERRIDE', 'FOWNER', 'FSETID', 'KILL', 'MKNOD',
                      'NET_BIND_SERVICE', 'NET_RAW', 'SETFCAP', 'SETGID', 'SETPCAP', 'SETUID', 'SYS_CHROOT']
# containers/common >= v0.51.0 (Podman >= 4.4): the built-in default_capabilities lost AUDIT_WRITE, MKNOD and
# NET_RAW (commit a3328f26 "Rework default list of capabilities to minimal"); Podman's CapDrop is
# "the default set minus the bounding set", so cap_drop=['ALL'] is reported as these 11.
PODMAN_MINIMAL_CAP_DROP = ['CHOWN', 'DAC_OVERRIDE', 'FOWNER', 'FSETID', 'KILL', 'NET_BIND_SERVICE', 'SETFCAP',
                           'SETGID', 'SETPCAP', 'SETUID', 'SYS_CHROOT']

# Podman 4.3.1 compat inspect HostConfig, as measured (cap_drop ALL, no-new-privileges, ulimits, tmpfs with U,
# read-only, json-file max-size 10m).
MEASURED_HOST = {
    'LogConfig': {'Type': 'json-file', 'Config': None},
    'Tmpfs': {'/run': 'rw,rprivate,nosuid,nodev,tmpcopyup',
              '/run/x': 'rw,nosuid,nodev,noexec,size=1m,U,mode=0755,rprivate,tmpcopyup',
              '/tmp': 'rw,nosuid,nodev,noexec,size=16m,mode=1777,rprivate,tmpcopyup',
              '/var/tmp': 'rw,rprivate,nosuid,nodev,tmpcopyup'},
    'Ulimits': [{'Name': 'RLIMIT_NOFILE', 'Hard': 16384, 'Soft': 16384},
                {'Name': 'RLIMIT_NPROC', 'Hard': 4096, 'Soft': 4096}],
    'SecurityOpt': ['no-new-privileges'],
    'CapDrop': list(PODMAN_43_CAP_DROP),
    'CapAdd': [],
    'Sysctls': None,
    'Memory': 536870912,
    'PidsLimit': 256,
    'NetworkMode': 'bridge',
    'ReadonlyRootfs': True,
}
# Podman's own (libpod) inspect of the same container: the log size the compat view leaves out.
MEASURED_LIBPOD = {'HostConfig': {'LogConfig': {'Type': 'json-file', 'Config': None, 'Path': '/x/ctr.log', 'Tag': '',
                                                'Size': '10MB'}}}

# A Docker Engine inspect HostConfig of the same container.
DOCKER_HOST = {
    'LogConfig': {'Type': 'json-file', 'Config': {'max-size': '10m', 'max-file': '3'}},
    'Tmpfs': {'/tmp': 'rw,nosuid,nodev,noexec,size=16m,mode=1777'},
    'Ulimits': [{'Name': 'nofile', 'Hard': 16384, 'Soft': 16384}],
    'SecurityOpt': ['no-new-privileges:true'],
    'CapDrop': ['ALL'],
    'CapAdd': None,
    'Sysctls': {'net.ipv4.ip_forward': '0'},
    'Memory': 536870912,
    'PidsLimit': 256,
    'ReadonlyRootfs': True,
}

PODMAN = _venue.Venue(_venue.PODMAN, '4.3.1', '1.41')
DOCKER = _venue.Venue(_venue.DOCKER, '20.10.24', '1.41')


# --- fakes -------------------------------------------------------------------------------------------------


class FakeResponse(object):
    def __init__(self, status_code=200, payload=None):
        self.status_code = status_code
        self.payload = payload if payload is not None else {}

    def json(self):
        return self.payload

    def raise_for_status(self):
        if self.status_code >= 400:
            raise RuntimeError('%d Client Error' % self.status_code)


class FakeApi(object):
    """``client.api``: answers get(url) by the end of the URL; an Exception answer is raised."""

    def __init__(self, base_url='http+docker://localhost', answers=None):
        self.base_url = base_url
        self.answers = dict(answers or {})
        self.calls = []

    def get(self, url, timeout=None):
        self.calls.append((url, timeout))
        for suffix, answer in self.answers.items():
            if url.endswith(suffix):
                if isinstance(answer, Exception):
                    raise answer
                return answer
        raise ConnectionError('nothing answers %s' % url)


class FakeClient(object):
    def __init__(self, version, info=None, api=None):
        self._version = version
        self._info = info if info is not None else {}
        self.api = api or FakeApi()
        self.version_calls = 0
        self.info_calls = 0

    def version(self):
        self.version_calls += 1
        return self._version

    def info(self):
        self.info_calls += 1
        return self._info


LIBPOD_INFO = '/v4.0.0/libpod/info'


def _libpod_info(rootless):
    return FakeResponse(200, {'host': {'security': {'rootless': rootless}}})


def _podman_client(answers=None, base_url='http+docker://localhost', version=None):
    return FakeClient(version or PODMAN_43_VERSION, PODMAN_COMPAT_INFO, FakeApi(base_url, answers))


# --- version_tuple -----------------------------------------------------------------------------------------


@pytest.mark.parametrize('text, expected', [
    ('4.3.1', (4, 3, 1)),
    ('5.4.2', (5, 4, 2)),
    ('20.10.24', (20, 10, 24)),
    ('1.41', (1, 41)),
    ('5.4.2-dev', (5, 4, 2)),
    ('4.9.3~rc1', (4, 9, 3)),
    ('5.4.2+ds1', (5, 4, 2)),
    ('26.1', (26, 1)),
    ('4..1', (4,)),
    ('v1.2', ()),
    ('abc', ()),
    ('', ()),
    (None, ()),
])
def test_version_tuple(text, expected):
    assert _venue.version_tuple(text) == expected


def test_version_tuple_orders_versions():
    assert _venue.version_tuple('4.3.1') >= (4, 3) and _venue.version_tuple('5.4.2') > (4, 9, 9)
    assert _venue.version_tuple('4.2.0') < (4, 3)


# --- from_version ------------------------------------------------------------------------------------------


@pytest.mark.parametrize('version, kind, number, api', [
    (DOCKER_VERSION, 'docker', '20.10.24', '1.41'),
    (PODMAN_43_VERSION, 'podman', '4.3.1', '1.41'),
    (PODMAN_54_VERSION, 'podman', '5.4.2', '1.41'),
    ({'Version': '24.0.7', 'ApiVersion': '1.43'}, 'docker', '24.0.7', '1.43'),
    ({'Version': '24.0.7', 'ApiVersion': '1.43', 'Components': None}, 'docker', '24.0.7', '1.43'),
    ({'Version': '4.3.1', 'Components': [{'Name': 'podman', 'Version': '4.3.1'}]}, 'podman', '4.3.1', ''),
    ({'Version': '5.0.0', 'Components': [{'Name': 'Podman Engine'}]}, 'podman', '5.0.0', ''),
    ({'Components': [None, {'Name': 'Podman Engine', 'Version': '4.9.3'}]}, 'podman', '4.9.3', ''),
    ({'Components': [{'Name': 'Engine', 'Version': '26.1.0'}], 'Version': '26.1.0'}, 'docker', '26.1.0', ''),
    ({}, 'docker', '', ''),
    (None, 'docker', '', ''),
    ('Podman Engine 4.3.1', 'docker', '', ''),
    ([PODMAN_43_VERSION], 'docker', '', ''),
])
def test_from_version(version, kind, number, api):
    found = _venue.from_version(version)
    assert (found.kind, found.version, found.api_version, found.rootless) == (kind, number, api, False)
    assert found.is_podman == (kind == 'podman')


@pytest.mark.parametrize('rootless, expected', [(None, False), (False, False), (True, True)])
def test_from_version_carries_rootless(rootless, expected):
    assert _venue.from_version(PODMAN_54_VERSION, rootless=rootless).rootless is expected


# --- docker_rootless ---------------------------------------------------------------------------------------


@pytest.mark.parametrize('info, expected', [
    (DOCKER_ROOTLESS_INFO, True),
    (DOCKER_ROOTFUL_INFO, False),
    (PODMAN_COMPAT_INFO, False),
    ({'SecurityOptions': None}, False),
    ({'SecurityOptions': []}, False),
    ({}, False),
    (None, False),
    (['name=rootless'], False),
])
def test_docker_rootless(info, expected):
    assert _venue.docker_rootless(info) is expected


# --- Podman's sizes (go-units: FromHumanSize reads, HumanSize prints; both 1000-based) ------------------


@pytest.mark.parametrize('text, expected', [
    ('10m', 10000000),
    ('10MB', 10000000),
    ('10M', 10000000),
    ('10485760', 10485760),
    (10485760, 10485760),
    ('1.5MB', 1500000),
    ('512k', 512000),
    ('512kB', 512000),
    (' 1g ', 1000000000),
    ('1GB', 1000000000),
    ('7B', 7),
    ('7', 7),
    ('0', 0),
    (0, 0),
    ('2t', 2 * 1000 ** 4),
    ('abc', None),
    ('', None),
    (None, None),
    ('10XB', None),
    ('10KiB', None),
    ('MB', None),
    ('-1', None),
])
def test_from_human_size(text, expected):
    assert _venue.from_human_size(text) == expected


@pytest.mark.parametrize('size, expected', [
    (10000000, '10MB'),
    (10485760, '10.49MB'),
    (1500000, '1.5MB'),
    (1024000, '1.024MB'),
    (65536, '65.54kB'),
    (512000, '512kB'),
    (999, '999B'),
    (1000, '1kB'),
    (0, '0B'),
    (2048 * 1000 ** 2, '2.048GB'),
])
def test_human_size(size, expected):
    assert _venue.human_size(size) == expected


@pytest.mark.parametrize('text, expected', [
    ('10m', '10MB'), ('1500k', '1.5MB'), ('1024k', '1.024MB'), ('2048m', '2.048GB'), ('65536', '65.54kB'),
    ('1g', '1GB'), ('bad', None),
])
def test_podman_size_is_what_podman_shows(text, expected):
    assert _venue.podman_size(text) == expected


# --- podman_attrs ------------------------------------------------------------------------------------------


def _host(**changes):
    host = copy.deepcopy(MEASURED_HOST)
    host.update(changes)
    return host


@pytest.mark.parametrize('host, libpod, key, expected', [
    (_host(), None, 'Ulimits', [{'Name': 'nofile', 'Hard': 16384, 'Soft': 16384},
                                {'Name': 'nproc', 'Hard': 4096, 'Soft': 4096}]),
    (_host(Ulimits=None), None, 'Ulimits', []),
    (_host(), None, 'SecurityOpt', ['no-new-privileges:true']),
    (_host(SecurityOpt=['label=disable', 'no-new-privileges']), None, 'SecurityOpt',
     ['label=disable', 'no-new-privileges:true']),
    (_host(SecurityOpt=None), None, 'SecurityOpt', []),
    (_host(), None, 'CapDrop', ['ALL']),
    (_host(CapDrop=['CAP_' + cap for cap in PODMAN_43_CAP_DROP]), None, 'CapDrop', ['ALL']),
    (_host(CapDrop=list(reversed(PODMAN_43_CAP_DROP))), None, 'CapDrop', ['ALL']),
    # a host whose containers.conf grants SYS_ADMIN too: dropping all it grants is ALL
    (_host(CapDrop=PODMAN_43_CAP_DROP + ['SYS_ADMIN']), None, 'CapDrop', ['ALL']),
    (_host(CapDrop=[cap for cap in PODMAN_43_CAP_DROP if cap != 'NET_RAW']), None, 'CapDrop',
     [cap for cap in PODMAN_43_CAP_DROP if cap != 'NET_RAW']),
    (_host(CapDrop=['NET_RAW', 'MKNOD']), None, 'CapDrop', ['MKNOD', 'NET_RAW']),
    (_host(CapDrop=None), None, 'CapDrop', []),
    (_host(CapAdd=['NET_BIND_SERVICE']), None, 'CapDrop', sorted(PODMAN_43_CAP_DROP)),
    (_host(CapAdd=['CAP_NET_BIND_SERVICE']), None, 'CapAdd', ['NET_BIND_SERVICE']),
    (_host(CapAdd=None), None, 'CapAdd', []),
    (_host(), None, 'Tmpfs', {'/run': 'rw,nosuid,nodev',
                              '/run/x': 'rw,nosuid,nodev,noexec,size=1m,U,mode=0755',
                              '/tmp': 'rw,nosuid,nodev,noexec,size=16m,mode=1777',
                              '/var/tmp': 'rw,nosuid,nodev'}),
    (_host(Tmpfs=None), None, 'Tmpfs', {}),
    (_host(), MEASURED_LIBPOD, 'LogConfig', {'Type': 'json-file', 'Config': {'max-size': '10MB'}}),
    (_host(), None, 'LogConfig', {'Type': 'json-file', 'Config': {}}),
    (_host(), {'HostConfig': {'LogConfig': {'Size': '0B'}}}, 'LogConfig', {'Type': 'json-file', 'Config': {}}),
    (_host(), {'HostConfig': {'LogConfig': {'Size': 'unknown'}}}, 'LogConfig',
     {'Type': 'json-file', 'Config': {}}),
    (_host(), {'HostConfig': {}}, 'LogConfig', {'Type': 'json-file', 'Config': {}}),
    (_host(LogConfig={'Type': 'json-file', 'Config': {'max-size': '20m'}}), MEASURED_LIBPOD, 'LogConfig',
     {'Type': 'json-file', 'Config': {'max-size': '20m'}}),
    (_host(), None, 'Memory', 536870912),
    (_host(), None, 'PidsLimit', 256),
])
def test_podman_attrs_normalises(host, libpod, key, expected):
    attrs = _venue.podman_attrs({'Id': 'abc', 'HostConfig': host}, libpod)
    assert attrs['HostConfig'][key] == expected
    assert attrs['Id'] == 'abc'


@pytest.mark.parametrize('sysctls, unreported', [
    (None, ['Sysctls']),
    ({}, ['Sysctls']),
    ({'net.ipv4.ip_forward': '0'}, None),
])
def test_podman_attrs_names_the_sysctls_it_cannot_read(sysctls, unreported):
    attrs = _venue.podman_attrs({'HostConfig': _host(Sysctls=sysctls)})
    assert attrs.get(_venue.UNREPORTED) == unreported
    assert (_spec.observed(attrs)['sysctls'] is None) == bool(unreported)


def test_podman_attrs_does_not_touch_its_input():
    attrs = {'Id': 'abc', 'HostConfig': _host()}
    libpod = copy.deepcopy(MEASURED_LIBPOD)
    before = copy.deepcopy(attrs)
    _venue.podman_attrs(attrs, libpod)
    assert attrs == before and libpod == MEASURED_LIBPOD
    assert _venue.UNREPORTED not in attrs


def test_podman_attrs_of_nothing():
    attrs = _venue.podman_attrs(None)
    assert attrs['HostConfig']['CapDrop'] == [] and attrs['HostConfig']['Tmpfs'] == {}
    assert attrs[_venue.UNREPORTED] == ['Sysctls']


def test_docker_shaped_attrs_pass_podman_attrs_unchanged_in_substance():
    attrs = {'Id': 'abc', 'Image': IMAGE_ID, 'HostConfig': copy.deepcopy(DOCKER_HOST)}
    again = _venue.podman_attrs(attrs, None)
    assert _venue.UNREPORTED not in again
    assert _spec.observed(again) == _spec.observed(attrs)


def test_podman_attrs_reads_cap_drop_all_on_the_minimal_default_set():
    attrs = _venue.podman_attrs({'HostConfig': _host(CapDrop=list(PODMAN_MINIMAL_CAP_DROP))})
    assert attrs['HostConfig']['CapDrop'] == ['ALL']


# --- Venue -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize('kind', ['containerd', '', 'Docker', 'PODMAN', None])
def test_venue_refuses_an_unknown_kind(kind):
    with pytest.raises(ValueError):
        _venue.Venue(kind)


@pytest.mark.parametrize('kind, alias, owner, podman', [
    (_venue.DOCKER, 'host.docker.internal', 'uid=13,gid=13', False),
    (_venue.PODMAN, 'host.containers.internal', 'U', True),
])
def test_venue_traits(kind, alias, owner, podman):
    found = _venue.Venue(kind)
    assert found.host_alias == alias
    assert found.tmpfs_owner(13, 13) == owner
    assert found.is_podman is podman


def test_docker_tmpfs_owner_names_the_ids():
    assert _venue.Venue(_venue.DOCKER).tmpfs_owner(1000, 1001) == 'uid=1000,gid=1001'


@pytest.mark.parametrize('found, text', [
    (_venue.Venue(_venue.DOCKER, '20.10.24'), 'Docker Engine 20.10.24'),
    (_venue.Venue(_venue.DOCKER, '20.10.24', rootless=True), 'Docker Engine 20.10.24 (rootless)'),
    (_venue.Venue(_venue.PODMAN, '4.3.1'), 'Podman 4.3.1'),
    (_venue.Venue(_venue.PODMAN, '5.4.2', rootless=True), 'Podman 5.4.2 (rootless)'),
    (_venue.Venue(_venue.DOCKER), 'Docker Engine (version unknown)'),
])
def test_venue_describe(found, text):
    assert found.describe() == text


def test_venue_as_dict_and_repr():
    found = _venue.Venue(_venue.PODMAN, '5.4.2', '1.41', rootless=True)
    assert found.as_dict() == dict(kind='podman', version='5.4.2', api_version='1.41', rootless=True)
    assert repr(found) == "Venue('podman', '5.4.2', rootless=True)"


# --- venue(client) -----------------------------------------------------------------------------------------


@pytest.mark.parametrize('version, info, answers, base_url, kind, rootless, info_calls, get_calls', [
    (DOCKER_VERSION, DOCKER_ROOTFUL_INFO, {}, 'http+docker://localhost', 'docker', False, 1, 0),
    (DOCKER_VERSION, DOCKER_ROOTLESS_INFO, {}, 'http+docker://localhost', 'docker', True, 1, 0),
    (DOCKER_VERSION, {}, {}, 'http+docker://localhost', 'docker', False, 1, 0),
    (PODMAN_43_VERSION, PODMAN_COMPAT_INFO, {LIBPOD_INFO: _libpod_info(False)}, 'http+docker://localhost',
     'podman', False, 0, 1),
    (PODMAN_54_VERSION, PODMAN_COMPAT_INFO, {LIBPOD_INFO: _libpod_info(True)}, 'http+docker://localhost',
     'podman', True, 0, 1),
    (PODMAN_54_VERSION, PODMAN_COMPAT_INFO, {LIBPOD_INFO: FakeResponse(200, {})}, 'http+docker://localhost',
     'podman', False, 0, 1),
    (PODMAN_43_VERSION, PODMAN_COMPAT_INFO, {LIBPOD_INFO: ConnectionError('refused')},
     'http+unix:///run/user/1000/podman/podman.sock', 'podman', True, 0, 1),
    (PODMAN_43_VERSION, PODMAN_COMPAT_INFO, {LIBPOD_INFO: ConnectionError('refused')},
     'http+unix:///run/podman/podman.sock', 'podman', False, 0, 1),
    (PODMAN_43_VERSION, PODMAN_COMPAT_INFO, {LIBPOD_INFO: FakeResponse(404, {'message': 'not found'})},
     'http+unix:///run/user/1000/podman/podman.sock', 'podman', True, 0, 1),
])
def test_venue_asks_the_engine(version, info, answers, base_url, kind, rootless, info_calls, get_calls):
    client = FakeClient(version, info, FakeApi(base_url, answers))
    found = _venue.venue(client)
    assert (found.kind, found.rootless) == (kind, rootless)
    assert (client.version_calls, client.info_calls, len(client.api.calls)) == (1, info_calls, get_calls)
    for url, timeout in client.api.calls:
        assert url == base_url + LIBPOD_INFO and timeout == 30


@pytest.mark.parametrize('client', [
    FakeClient(DOCKER_VERSION, DOCKER_ROOTLESS_INFO),
    _podman_client({LIBPOD_INFO: _libpod_info(True)}),
])
def test_venue_is_asked_once_per_client(client):
    first = _venue.venue(client)
    assert _venue.venue(client) is first and _venue.venue(client) is first
    assert client.version_calls == 1 and client.info_calls <= 1 and len(client.api.calls) <= 1


def test_each_client_is_asked_on_its_own():
    docker_client = FakeClient(DOCKER_VERSION, DOCKER_ROOTFUL_INFO)
    podman_client = _podman_client({LIBPOD_INFO: _libpod_info(False)})
    assert not _venue.venue(docker_client).is_podman and _venue.venue(podman_client).is_podman
    assert docker_client.version_calls == 1 and podman_client.version_calls == 1


@pytest.mark.skipif(docker is None, reason='needs the Docker SDK')
def test_rootless_fallback_with_the_real_sdk_client(monkeypatch):
    client = docker.DockerClient(base_url='unix:///run/user/1000/podman/podman.sock', version='1.41')

    def refused(url, timeout=None):
        raise ConnectionError('libpod API unreachable: %s' % url)

    monkeypatch.setattr(client, 'version', lambda: PODMAN_43_VERSION)
    monkeypatch.setattr(client.api, 'get', refused)
    assert _venue.venue(client).rootless is True


# --- container_attrs / run_health_check --------------------------------------------------------------------


def _compat_attrs(**changes):
    attrs = {'Id': 'abc123', 'Name': '/pi-dispatch-egress-proxy', 'HostConfig': _host()}
    attrs.update(changes)
    return attrs


def test_container_attrs_on_docker_is_the_same_dict():
    client = FakeClient(DOCKER_VERSION, DOCKER_ROOTFUL_INFO)
    attrs = {'Id': 'abc', 'HostConfig': copy.deepcopy(DOCKER_HOST)}
    assert _venue.container_attrs(client, attrs) is attrs
    assert client.api.calls == []


@pytest.mark.parametrize('attrs, answer, ident, max_size', [
    (_compat_attrs(), FakeResponse(200, MEASURED_LIBPOD), 'abc123', '10MB'),
    (_compat_attrs(Id=None), FakeResponse(200, MEASURED_LIBPOD), 'pi-dispatch-egress-proxy', '10MB'),
    (_compat_attrs(), FakeResponse(404, {'message': 'no such container'}), 'abc123', None),
    (_compat_attrs(), ConnectionError('refused'), 'abc123', None),
])
def test_container_attrs_on_podman(attrs, answer, ident, max_size):
    client = _podman_client({LIBPOD_INFO: _libpod_info(False), '/json': answer})
    got = _venue.container_attrs(client, attrs)
    assert got['HostConfig']['LogConfig']['Config'].get('max-size') == max_size
    assert got['HostConfig']['CapDrop'] == ['ALL'] and got[_venue.UNREPORTED] == ['Sysctls']
    url, timeout = client.api.calls[-1]
    assert url == client.api.base_url + '/v4.0.0/libpod/containers/%s/json' % ident and timeout == 30


def test_run_health_check_asks_nothing_of_docker():
    client = FakeClient(DOCKER_VERSION, DOCKER_ROOTFUL_INFO)
    assert _venue.run_health_check(client, 'proxy') is None
    assert client.api.calls == []


@pytest.mark.parametrize('answer', [FakeResponse(200, {'Status': 'healthy'}), FakeResponse(500, {}),
                                    ConnectionError('refused'), RuntimeError('anything')])
def test_run_health_check_on_podman(answer):
    client = _podman_client({LIBPOD_INFO: _libpod_info(False), '/healthcheck': answer})
    assert _venue.run_health_check(client, 'proxy') is None
    url, timeout = client.api.calls[-1]
    assert url == client.api.base_url + '/v4.0.0/libpod/containers/proxy/healthcheck' and timeout == 30
    assert len(client.api.calls) == 2


# --- spec.for_venue ----------------------------------------------------------------------------------------


@pytest.fixture
def files(tmp_path):
    paths = []
    for name in ('egress-proxy.conf', 'egress-allowlist.conf', 'egress-endpoints.conf'):
        path = tmp_path / name
        path.write_text('')
        paths.append(str(path))
    return paths


def _desired(files, **kw):
    return _spec.desired_spec('pi-dispatch-egress-proxy:latest', files[0], files[1], files[2], **kw)


@pytest.mark.parametrize('found', [None, DOCKER, _venue.Venue(_venue.DOCKER, rootless=True)])
def test_for_venue_leaves_the_docker_shape(files, found):
    spec = _desired(files, extra_hosts=[OPERATOR_HOST])
    before = copy.deepcopy(spec)
    assert _spec.for_venue(spec, found) is spec
    assert spec == before and 'create_tmpfs' not in spec


def test_for_venue_podman_tmpfs(files):
    spec = _spec.for_venue(_desired(files), PODMAN)
    squid = 'rw,nosuid,nodev,noexec,size=1m,uid=13,gid=13,mode=0755'
    assert spec['tmpfs'] == {'/tmp': _spec.TMPFS['/tmp'], '/run/squid': squid,
                             '/run': 'rw,nosuid,nodev,noexec,size=1m,mode=0755',
                             '/var/tmp': 'rw,nosuid,nodev,noexec,size=1m,mode=1777'}
    assert spec['create_tmpfs']['/run/squid'] == 'rw,nosuid,nodev,noexec,size=1m,U,mode=0755'
    assert set(spec['create_tmpfs']) == set(spec['tmpfs'])
    assert all('noexec' in options for options in spec['create_tmpfs'].values())
    assert not any('uid=' in options for options in spec['create_tmpfs'].values())


def test_for_venue_keeps_a_tmpfs_the_spec_names(files):
    spec = _desired(files)
    spec['tmpfs'] = dict(spec['tmpfs'], **{'/run': 'rw,noexec,size=2m'})
    assert _spec.for_venue(spec, PODMAN)['tmpfs']['/run'] == 'rw,noexec,size=2m'


@pytest.mark.parametrize('asked, shown', [
    ('10m', '10MB'),
    ('1024k', '1.024MB'),
    ('1g', '1GB'),
    ('512k', '512kB'),
    ('65536', '65.54kB'),
    ('2048m', '2.048GB'),
])
def test_for_venue_podman_log_config(files, asked, shown):
    """Compared in Podman's words (what its inspect shows); created with the operator's, and no max-file."""
    spec = _spec.for_venue(_desired(files, limits={'log_max_size': asked}), PODMAN)
    assert spec['log_config'] == {'type': 'json-file', 'config': {'max-size': shown}}
    assert spec['create_log_config'] == {'type': 'json-file', 'config': {'max-size': asked}}
    assert _spec.create_kwargs(spec)['log_config'] == spec['create_log_config']


@pytest.mark.parametrize('extra_hosts, wanted', [
    (None, []),
    ([OPERATOR_HOST], [OPERATOR_HOST]),
    (['a.local:10.0.0.1', 'host.docker.internal:10.9.9.9'], ['a.local:10.0.0.1', 'host.docker.internal:10.9.9.9']),
])
def test_for_venue_podman_extra_hosts(files, extra_hosts, wanted):
    docker_spec = _desired(files, extra_hosts=extra_hosts)
    assert _spec.HOST_GATEWAY in docker_spec['extra_hosts']
    assert _spec.for_venue(docker_spec, PODMAN)['extra_hosts'] == wanted


def test_for_venue_podman_names_nproc_once(files):
    spec = _spec.for_venue(_desired(files, limits={'nofile': 4096}), PODMAN)
    assert spec['ulimits'] == [dict(name='nofile', soft=4096, hard=4096),
                               dict(name='nproc', soft=_spec.PODMAN_NPROC, hard=_spec.PODMAN_NPROC)]
    own = _desired(files)
    own['ulimits'] = own['ulimits'] + [dict(name='nproc', soft=100, hard=100)]
    assert [u for u in _spec.for_venue(own, PODMAN)['ulimits'] if u['name'] == 'nproc'] == [
        dict(name='nproc', soft=100, hard=100)]


def test_for_venue_podman_is_idempotent(files):
    once = _spec.for_venue(_desired(files, extra_hosts=[OPERATOR_HOST]), PODMAN)
    assert _spec.for_venue(once, PODMAN) == once


def test_for_venue_does_not_touch_its_input(files):
    spec = _desired(files, extra_hosts=[OPERATOR_HOST])
    before = copy.deepcopy(spec)
    changed = _spec.for_venue(spec, PODMAN)
    assert spec == before and changed is not spec
    assert changed['sysctls'] == spec['sysctls'] and changed['cap_drop'] == ['ALL']


def test_create_kwargs_of_the_podman_spec(files):
    kwargs = _spec.create_kwargs(_spec.for_venue(_desired(files, extra_hosts=[OPERATOR_HOST]), PODMAN))
    assert kwargs['tmpfs']['/run/squid'] == 'rw,nosuid,nodev,noexec,size=1m,U,mode=0755'
    assert set(kwargs['tmpfs']) == set(['/tmp', '/run/squid', '/run', '/var/tmp'])
    assert kwargs['log_config'] == {'type': 'json-file', 'config': {'max-size': '10m'}}
    assert kwargs['extra_hosts'] == [OPERATOR_HOST]
    assert kwargs['cap_drop'] == ['ALL'] and kwargs['security_opt'] == ['no-new-privileges:true']


def test_create_kwargs_of_the_docker_spec_keeps_uid(files):
    kwargs = _spec.create_kwargs(_spec.for_venue(_desired(files), DOCKER))
    assert kwargs['tmpfs']['/run/squid'] == _spec.TMPFS['/run/squid']
    assert 'max-file' in kwargs['log_config']['config']


# --- differences() on a Podman inspect ---------------------------------------------------------------------


def _podman_inspect(spec):
    """Podman 4.3's compat inspect and libpod inspect of the proxy created from ``spec`` (the measured shapes)."""
    check = spec['healthcheck']
    attrs = {
        'Id': 'abc123', 'Name': '/' + spec['name'], 'Image': IMAGE_ID,
        'State': {'Status': 'running', 'Running': True, 'Paused': False, 'Health': {'Status': 'healthy'}},
        'Mounts': [{'Type': 'bind', 'Source': src, 'Destination': dst, 'RW': False} for src, dst in spec['mounts']],
        'NetworkSettings': {'Networks': {spec['network']: {}}},
        'Config': {'Labels': {_spec.LABEL_ROLE: 'proxy'}, 'Env': ['PATH=/usr/sbin:/usr/bin'],
                   'Cmd': list(_spec.COMMAND),
                   'Healthcheck': {'Test': list(_spec.HEALTHCHECK_TEST), 'Interval': check['interval'],
                                   'Timeout': check['timeout'], 'Retries': check['retries'],
                                   'StartPeriod': check['start_period']}},
        'HostConfig': _host(
            RestartPolicy={'Name': 'unless-stopped', 'MaximumRetryCount': 0},
            ExtraHosts=[OPERATOR_HOST], PortBindings={}, MemorySwap=536870912,
            Tmpfs={'/run': 'rw,nosuid,nodev,noexec,size=1m,mode=0755,rprivate,tmpcopyup',
                   '/run/squid': 'rw,nosuid,nodev,noexec,size=1m,uid=13,gid=13,mode=0755,rprivate,tmpcopyup',
                   '/tmp': 'rw,nosuid,nodev,noexec,size=16m,mode=1777,rprivate,tmpcopyup',
                   '/var/tmp': 'rw,nosuid,nodev,noexec,size=1m,mode=1777,rprivate,tmpcopyup'}),
    }
    return attrs, copy.deepcopy(MEASURED_LIBPOD)


def _set_host(key, value):
    def change(attrs, libpod):
        attrs['HostConfig'][key] = value
        return attrs, libpod
    return change


def _set_tmpfs(path, options):
    def change(attrs, libpod):
        attrs['HostConfig']['Tmpfs'][path] = options
        return attrs, libpod
    return change


def _set_log_size(size):
    def change(attrs, libpod):
        libpod['HostConfig']['LogConfig']['Size'] = size
        return attrs, libpod
    return change


def _unchanged(attrs, libpod):
    return attrs, libpod


def _no_libpod(attrs, libpod):
    return attrs, None


@pytest.mark.parametrize('change, settings', [
    (_unchanged, []),
    (_set_tmpfs('/var/tmp', 'rw,rprivate,nosuid,nodev,tmpcopyup'), ['tmpfs']),
    (_set_tmpfs('/run', 'rw,rprivate,nosuid,nodev,tmpcopyup'), ['tmpfs']),
    (_set_tmpfs('/run/squid', 'rw,nosuid,nodev,noexec,size=1m,U,mode=0755,rprivate,tmpcopyup'), ['tmpfs']),
    (_set_host('CapDrop', [cap for cap in PODMAN_43_CAP_DROP if cap != 'NET_RAW']), ['capabilities dropped']),
    (_set_host('CapAdd', ['NET_RAW']), ['capabilities dropped', 'capabilities added']),
    (_set_host('Ulimits', MEASURED_HOST['Ulimits'][:1]), ['ulimits']),
    (_set_host('SecurityOpt', []), ['security options']),
    (_set_host('ExtraHosts', [OPERATOR_HOST, _spec.HOST_GATEWAY]), ['extra hosts']),
    (_set_host('Sysctls', {'net.ipv4.ip_forward': '1'}), ['sysctls']),
    (_set_host('PidsLimit', 2048), ['pids limit']),
    (_set_log_size('20MB'), ['log config']),
    (_no_libpod, ['log config']),
])
def test_differences_on_a_podman_inspect(files, change, settings):
    wanted = _spec.for_venue(_desired(files, extra_hosts=[OPERATOR_HOST]), PODMAN)
    attrs, libpod = change(*_podman_inspect(wanted))
    diffs = _spec.differences(wanted, _spec.observed(_venue.podman_attrs(attrs, libpod)), IMAGE_ID)
    assert [line.split(':')[0] for line in diffs] == settings, diffs


def test_the_docker_spec_against_a_podman_inspect_differs(files):
    """Without for_venue the Podman container would be replaced on every run."""
    docker_spec = _desired(files, extra_hosts=[OPERATOR_HOST])
    attrs, libpod = _podman_inspect(_spec.for_venue(docker_spec, PODMAN))
    diffs = _spec.differences(docker_spec, _spec.observed(_venue.podman_attrs(attrs, libpod)), IMAGE_ID)
    assert set(line.split(':')[0] for line in diffs) == set(['extra hosts', 'tmpfs', 'ulimits', 'log config'])


# --- the log size, through Podman's own parsing and printing -----------------------------------------------

_GO_DECIMAL = {'': 1, 'k': 1000, 'm': 1000 ** 2, 'g': 1000 ** 3}


def _go_from_human_size(text):
    """go-units FromHumanSize, as Podman reads ``--log-opt max-size`` (1000-based)."""
    text = text.lower().rstrip('b')
    unit = text[-1] if text[-1] in 'kmg' else ''
    return int(float(text[:len(text) - len(unit)]) * _GO_DECIMAL[unit])


def _go_human_size(size):
    """go-units HumanSize, as Podman prints LogConfig.Size (1000-based, 4 significant digits)."""
    value, units = float(size), ['B', 'kB', 'MB', 'GB', 'TB']
    index = 0
    while value >= 1000 and index < len(units) - 1:
        value /= 1000
        index += 1
    return '%.4g%s' % (value, units[index])


def test_the_go_size_helpers_reproduce_the_measured_size():
    assert _go_human_size(_go_from_human_size('10m')) == MEASURED_LIBPOD['HostConfig']['LogConfig']['Size']


@pytest.mark.parametrize('asked', [
    '10m', '512k', '1g', '100m', '3m',
    '1500k',
    '1024k',
    '2048m',
    '65536',
])
def test_the_podman_log_size_reads_back_as_wanted(files, asked):
    wanted = _spec.for_venue(_desired(files, limits={'log_max_size': asked}), PODMAN)
    attrs, libpod = _podman_inspect(wanted)
    libpod['HostConfig']['LogConfig']['Size'] = _go_human_size(_go_from_human_size(asked))
    assert _spec.observed(_venue.podman_attrs(attrs, libpod))['log_config'] == wanted['log_config']


@pytest.mark.parametrize('bounding, cap_drop, expected', [
    ([], ['CHOWN'], ['ALL']),                        # Podman's own inspect says nothing is left
    (['CAP_NET_RAW'], list(PODMAN_43_CAP_DROP), sorted(PODMAN_43_CAP_DROP)),  # something is left: not ALL
    (None, list(PODMAN_43_CAP_DROP), ['ALL']),       # no BoundingCaps: the default sets decide
])
def test_podman_attrs_prefers_podmans_bounding_set(bounding, cap_drop, expected):
    libpod = {} if bounding is None else {'BoundingCaps': bounding}
    attrs = _venue.podman_attrs({'HostConfig': _host(CapDrop=cap_drop)}, libpod)
    assert attrs['HostConfig']['CapDrop'] == expected


@pytest.mark.parametrize('extra_hosts', [
    ['hostgw.example.test:host-gateway'],
    ['a.local:10.0.0.1', 'b.test:host-gateway'],
])
def test_for_venue_podman_refuses_an_operator_host_gateway(files, extra_hosts):
    """Podman 4.3 would write host-gateway into /etc/hosts literally; refused, naming the entry and the fix."""
    spec = _desired(files, extra_hosts=extra_hosts)
    with pytest.raises(_spec.ProxyError) as raised:
        _spec.for_venue(spec, PODMAN)
    text = str(raised.value)
    assert [e for e in extra_hosts if e.endswith(':host-gateway')][0] in text
    assert 'host.containers.internal' in text and 'egress_proxy_extra_hosts' in text
    assert _spec.for_venue(spec, _venue.Venue(_venue.DOCKER, '20.10.24')) is spec


# --- the proxy's limits: rootless on cgroup v1 applies none -------------------------------------------------


@pytest.mark.parametrize('text, expected', [
    ('1', '1'), ('2', '2'), ('v1', '1'), ('v2', '2'), ('V2', '2'), (' v1 ', '1'), (1, '1'), (2, '2'),
    ('', ''), (None, ''), ('v3', ''), ('cgroup2', ''),
])
def test_cgroup_version(text, expected):
    assert _venue.cgroup_version(text) == expected


def _libpod_info_cgroup(rootless, version):
    return FakeResponse(200, {'host': {'security': {'rootless': rootless}, 'cgroupVersion': version}})


# (engine, its answers, whether the limits would not hold)
LIMITS = [
    # Measured: Podman 4.3.1 rootless on this cgroup v1 machine says cgroupVersion v1 and applies none.
    ('rootless Podman on cgroup v1', _podman_client({LIBPOD_INFO: _libpod_info_cgroup(True, 'v1')}), True),
    ('rootful Podman on cgroup v1', _podman_client({LIBPOD_INFO: _libpod_info_cgroup(False, 'v1')}), False),
    ('rootless Podman on cgroup v2', _podman_client({LIBPOD_INFO: _libpod_info_cgroup(True, 'v2')}), False),
    ('rootless Podman that does not say', _podman_client({LIBPOD_INFO: _libpod_info(True)}), False),
    ('Podman without the libpod API',
     _podman_client({LIBPOD_INFO: ConnectionError('refused')}, base_url='http+unix:///run/user/1000/podman/podman.sock'),
     False),
    ('rootless Docker on cgroup v1', FakeClient(DOCKER_VERSION, dict(DOCKER_ROOTLESS_INFO, CgroupVersion='1')), True),
    ('rootless Docker on cgroup v2', FakeClient(DOCKER_VERSION, dict(DOCKER_ROOTLESS_INFO, CgroupVersion='2')), False),
    ('rootful Docker on cgroup v1', FakeClient(DOCKER_VERSION, dict(DOCKER_ROOTFUL_INFO, CgroupVersion='1')), False),
]


@pytest.mark.parametrize('case, client, refused', LIMITS, ids=[c[0] for c in LIMITS])
def test_the_limits_do_not_hold_rootless_on_cgroup_v1(case, client, refused):
    found = _venue.venue(client)
    problem = found.limits_problem()
    assert (problem is not None) is refused, case
    if refused:
        assert found.describe() in problem and 'cgroup v1' in problem and 'Fix: boot the host with cgroup v2' in problem
        assert 'rootful engine' in problem


@pytest.mark.parametrize('case, client, unenforced', LIMITS, ids=[c[0] for c in LIMITS])
@pytest.mark.parametrize('consent', [False, True])
def test_the_limits_decision_refuses_unless_consented(case, client, unenforced, consent):
    found = _venue.venue(client)
    refusal, report = found.limits_decision(consent)
    assert report['enforced'] is (not unenforced), case
    assert report['engine'] == found.describe() and report['cgroup_version'] == found.cgroup_version
    if not unenforced:
        assert refusal is None and 'why' not in report
    elif consent:
        assert refusal is None and report['why'] == found.limits_problem()
    else:
        assert refusal.startswith(found.limits_problem()), refusal
        assert 'egress_proxy_limits_unenforced_ok: true' in refusal and 'limits_unenforced_ok' in refusal


# (what the engine reports as Memory, MemorySwap, PidsLimit; consented to unenforced limits; settings that differ)
LIMIT_ROWS = [
    ((0, 0, 0), False, ['memory limit (bytes)', 'memory+swap limit (bytes)', 'pids limit']),
    ((0, 0, 0), True, []),
    ((536870912, 536870912, 256), False, []),
    ((536870912, 536870912, 256), True, []),
    ((1, 2, 3), True, []),
]


@pytest.mark.parametrize('reported, unenforced, settings', LIMIT_ROWS)
def test_unenforced_limits_are_not_compared(files, reported, unenforced, settings):
    """Measured: Podman 4.3.1 rootless on cgroup v1 reports Memory=0 PidsLimit=0 for a container created
    with limits. With consent that is what the engine can do, not drift that replaces the proxy every run."""
    wanted = _spec.for_venue(_desired(files, extra_hosts=[OPERATOR_HOST]), PODMAN)
    attrs, libpod = _podman_inspect(wanted)
    host = attrs['HostConfig']
    host['Memory'], host['MemorySwap'], host['PidsLimit'] = reported
    if unenforced:
        wanted = dict(wanted, limits_unenforced=True)
    diffs = _spec.differences(wanted, _spec.observed(_venue.podman_attrs(attrs, libpod)), IMAGE_ID)
    assert [line.split(':')[0] for line in diffs] == settings, diffs
    if unenforced:
        shown = _spec.shape_diff(wanted, _spec.observed(_venue.podman_attrs(attrs, libpod)), IMAGE_ID)['after']
        assert 'memory limit (bytes) (not enforced on this host): %d' % reported[0] in shown


# (engine, whether its Docker API applies the ulimits a create names)
ULIMITS = [
    # Measured: Podman 4.3.1 rootless drops HostConfig.Ulimits of a compat create (inspect: Ulimits []).
    ('rootless Podman on cgroup v1', LIMITS[0][1], False),
    ('rootless Podman on cgroup v2', LIMITS[2][1], False),
    ('rootful Podman on cgroup v1', LIMITS[1][1], True),
    ('rootless Docker on cgroup v1', LIMITS[5][1], True),
    ('rootful Docker on cgroup v1', LIMITS[7][1], True),
]


@pytest.mark.parametrize('case, client, applied', ULIMITS, ids=[c[0] for c in ULIMITS])
@pytest.mark.parametrize('consent', [False, True])
def test_the_limits_report_says_whether_the_ulimits_are_applied(case, client, applied, consent):
    found = _venue.venue(client)
    assert found.drops_api_ulimits is (not applied), case
    assert found.limits_decision(consent)[1]['ulimits_enforced'] is applied, case


@pytest.mark.parametrize('unapplied, settings', [(False, ['ulimits']), (True, [])])
def test_ulimits_an_engine_drops_are_not_compared(files, unapplied, settings):
    """Measured: rootless Podman 4.3.1 reports ``Ulimits: []`` for a proxy created with nofile and nproc through its
    Docker API. Where the venue says it drops them, what it reports is taken; elsewhere the gap is drift."""
    wanted = _spec.for_venue(_desired(files, extra_hosts=[OPERATOR_HOST]), PODMAN)
    attrs, libpod = _podman_inspect(wanted)
    attrs['HostConfig']['Ulimits'] = []
    if unapplied:
        wanted = dict(wanted, ulimits_unapplied=True)
    diffs = _spec.differences(wanted, _spec.observed(_venue.podman_attrs(attrs, libpod)), IMAGE_ID)
    assert [line.split(':')[0] for line in diffs] == settings, diffs
