"""The route line per model endpoint named by a host alias: the measured table, per runtime and version."""

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import venue as _venue
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import doctor as _doctor
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import route as _route
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.context import DoctorContext
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy.endpoints import Endpoint

DOCKER, PODMAN = _venue.DOCKER, _venue.PODMAN


@pytest.mark.parametrize('kind, version, rootless, system, host, line_id, says', [
    # Docker Engine 20.10: host.docker.internal through host-gateway; host.containers.internal is not defined.
    (DOCKER, '20.10.24+dfsg1', False, 'Debian GNU/Linux 12 (bookworm)', 'host.docker.internal', 'endpoint.route',
     'host-gateway'),
    (DOCKER, '20.10.5', False, 'Ubuntu', 'host.containers.internal', 'endpoint.route_none', 'does not define it'),
    (DOCKER, '20.10.24', False, '', 'HOST.DOCKER.INTERNAL', 'endpoint.route', 'Docker Engine 20.10'),
    # Docker Engine versions nobody measured: said, not warned, with the measured ones named.
    (DOCKER, '26.1.5', False, 'Debian GNU/Linux 13', 'host.docker.internal', 'endpoint.route_unmeasured',
     'Docker Engine 26.1 was not measured'),
    (DOCKER, '27.0.1', False, '', 'host.containers.internal', 'endpoint.route_unmeasured', 'measured: '),
    (DOCKER, '', False, '', 'host.docker.internal', 'endpoint.route_unmeasured', '(version unknown)'),
    # Docker Desktop says so in OperatingSystem; not measured here.
    (DOCKER, '20.10.24', False, 'Docker Desktop', 'host.docker.internal', 'endpoint.route_unmeasured',
     'Docker Desktop 20.10'),
    # Podman 4.3 rootful: only host.containers.internal.
    (PODMAN, '4.3.1', False, '', 'host.containers.internal', 'endpoint.route', 'gateway of the proxy\'s network'),
    (PODMAN, '4.3.1', False, '', 'host.docker.internal', 'endpoint.route_none', 'Podman 4.3 does not define it'),
    # Podman 5.4 rootful and rootless: both names.
    (PODMAN, '5.4.2', False, '', 'host.docker.internal', 'endpoint.route', 'Podman 5 maps it'),
    (PODMAN, '5.4.2', False, '', 'host.containers.internal', 'endpoint.route', 'rootful Podman 5.4'),
    (PODMAN, '5.4.2', True, '', 'host.containers.internal', 'endpoint.route', '169.254.1.2'),
    (PODMAN, '5.4.0', True, '', 'host.docker.internal', 'endpoint.route', 'rootless Podman 5.4'),
    # Podman versions and modes nobody measured.
    (PODMAN, '4.9.3', False, '', 'host.containers.internal', 'endpoint.route_unmeasured', 'rootful Podman 4.9'),
    (PODMAN, '4.3.1', True, '', 'host.containers.internal', 'endpoint.route_unmeasured', 'rootless Podman 4.3'),
    # Any other host: no route line (its tunnel probe is the proof).
    (DOCKER, '20.10.24', False, '', 'llm.lan.test', None, None),
    (PODMAN, '4.3.1', False, '', '10.0.0.7', None, None),
    (DOCKER, '20.10.24', False, '', 'host.docker.internal.example.com', None, None),
])
def test_route_table(kind, version, rootless, system, host, line_id, says):
    venue = _venue.Venue(kind, version, rootless=rootless)
    endpoint = Endpoint('local', host.lower(), 11434, 2)
    lines = _route.route_lines([endpoint], *_route.runtime_of(venue, system))
    if line_id is None:
        assert lines == []
        return
    assert [line.id for line in lines] == [line_id]
    line = lines[0]
    assert says in line.message and 'Model endpoint local' in line.message and '<' not in line.message
    assert line.status == {'endpoint.route': 'ok', 'endpoint.route_none': 'fail',
                           'endpoint.route_unmeasured': 'notrun'}[line_id]
    if line_id == 'endpoint.route_none':
        other = 'host.containers.internal' if 'docker' in host else 'host.docker.internal'
        assert other in line.fix


def test_every_measured_row_names_both_aliases():
    for key, row in _route.MEASURED.items():
        assert set(row) == set(_route.HOST_ALIASES), key
        assert all(how for _reaches, how in row.values())


class _Client(object):
    def __init__(self, version, info=None, fail=False):
        self._version, self._info, self._fail = version, info or {}, fail

    def version(self):
        if self._fail:
            raise RuntimeError('Cannot connect to the Docker daemon')
        return self._version

    def info(self):
        return self._info


def _ctx(tmp_path, client, endpoints):
    deploy = tmp_path / 'egress'
    deploy.mkdir()
    ctx = DoctorContext.build(client, _doctor.DoctorOptions('p', str(deploy), 'img', pid=7, environ={}))
    ctx.endpoints_loaded = endpoints
    return ctx


def test_the_check_asks_docker_desktop_its_operating_system(tmp_path):
    client = _Client({'Version': '20.10.24', 'ApiVersion': '1.41'}, {'OperatingSystem': 'Docker Desktop'})
    lines = _route.RouteCheck().lines(_ctx(tmp_path, client, [Endpoint('mac', 'host.docker.internal', 11434, 1)]))
    assert [line.id for line in lines] == ['endpoint.route_unmeasured'] and 'Docker Desktop' in lines[0].message


def test_the_check_on_podman_needs_no_info(tmp_path):
    client = _Client({'Version': '4.3.1', 'Components': [{'Name': 'Podman Engine', 'Version': '4.3.1'}]})
    client.api = None  # rootless detection falls back to the socket path: none here, so rootful
    lines = _route.RouteCheck().lines(_ctx(tmp_path, client, [Endpoint('a', 'host.docker.internal', 8080, 1),
                                                              Endpoint('b', 'host.containers.internal', 8080, 1),
                                                              Endpoint('c', 'llm.test', 8080, 1)]))
    assert [(line.id, line.status) for line in lines] == [('endpoint.route_none', 'fail'), ('endpoint.route', 'ok')]


def test_no_alias_endpoint_asks_the_engine_nothing(tmp_path):
    lines = _route.RouteCheck().lines(_ctx(tmp_path, object(), [Endpoint('c', 'llm.test', 8080, 1)]))
    assert lines == []


def test_an_engine_that_does_not_answer_is_said_per_endpoint(tmp_path):
    client = _Client({}, fail=True)
    lines = _route.RouteCheck().lines(_ctx(tmp_path, client, [Endpoint('a', 'host.docker.internal', 8080, 1)]))
    assert [(line.id, line.status) for line in lines] == [('endpoint.route_unread', 'notrun')]
    assert 'Cannot connect to the Docker daemon' in lines[0].message, lines[0].message
