# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The doctor's route line per model endpoint: can the proxy reach the host's name on this runtime?

A model server on the host is declared by the name a container uses for the host:
``host.docker.internal`` or ``host.containers.internal``. Whether that name leads anywhere is the
runtime's, and differs per runtime and version, so the answer comes from :data:`MEASURED`, a table
of what was measured here (the version, the names, where each points and what the server must do),
never from a guess. A runtime the table says cannot is a ✗; a runtime or version nobody measured is
said as ○ (not warned: nothing is known to be wrong), naming the measured ones. An endpoint whose
host is any other name or address gets no route line: the tunnel probe is the proof for it.

:func:`runtime_of` and :func:`route_lines` are pure; :class:`RouteCheck` asks the engine its
version (``venue.venue``) and, on Docker, its ``OperatingSystem`` (Docker Desktop says so there).
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import venue as _venue
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.context import Check, DoctorContext
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.lines import Line, shape

DOCKER_ALIAS = 'host.docker.internal'
PODMAN_ALIAS = 'host.containers.internal'
HOST_ALIASES = (DOCKER_ALIAS, PODMAN_ALIAS)

ENGINE, DESKTOP, PODMAN, PODMAN_ROOTLESS = 'docker-engine', 'docker-desktop', 'podman', 'podman-rootless'
RUNTIME_NAMES = {ENGINE: 'Docker Engine', DESKTOP: 'Docker Desktop', PODMAN: 'rootful Podman',
                 PODMAN_ROOTLESS: 'rootless Podman'}

_GATEWAY = 'the gateway of the proxy\'s network, so the server must listen on that address or 0.0.0.0'
_NOT_DEFINED = '%s does not define it, and squid then asks DNS, which has no such name'

# (runtime, 'major.minor') -> {host name: (reaches the host, how or why)}: what was measured, and where.
MEASURED: Dict[Tuple[str, str], Dict[str, Tuple[bool, str]]] = {
    # Docker Engine 20.10 (this machine): the proxy role adds host.docker.internal:host-gateway, the bridge
    # gateway (test_guard.py: a listed name mapped to host-gateway is refused by the guard, so it resolved there).
    (ENGINE, '20.10'): {
        DOCKER_ALIAS: (True, 'the proxy maps it to host-gateway, the bridge gateway, so the server must listen on '
                             'that address or 0.0.0.0 (a server on 127.0.0.1 is not reached)'),
        PODMAN_ALIAS: (False, _NOT_DEFINED % 'Docker Engine'),
    },
    # Podman 4.3.1 rootful, netavark (Debian 12): /etc/hosts has host.containers.internal only.
    (PODMAN, '4.3'): {
        PODMAN_ALIAS: (True, 'Podman maps it to ' + _GATEWAY),
        DOCKER_ALIAS: (False, _NOT_DEFINED % 'Podman 4.3' + '; declare host.containers.internal'),
    },
    # Podman 5.4.2 rootful, netavark (Debian 13, in a test host): both names, on the gateway.
    (PODMAN, '5.4'): {
        PODMAN_ALIAS: (True, 'Podman maps it to ' + _GATEWAY),
        DOCKER_ALIAS: (True, 'Podman 5 maps it, as host.containers.internal, to ' + _GATEWAY),
    },
    # Podman 5.4.2 rootless, pasta: both names, on 169.254.1.2, which pasta maps to the host.
    (PODMAN_ROOTLESS, '5.4'): {
        PODMAN_ALIAS: (True, 'pasta maps 169.254.1.2 to the host, so the server must listen on an address of the '
                             'host other than its loopback, or 0.0.0.0'),
        DOCKER_ALIAS: (True, 'Podman 5 maps it, as host.containers.internal, to 169.254.1.2, which pasta maps to '
                             'the host; the server must listen on an address other than the loopback, or 0.0.0.0'),
    },
}


def runtime_of(venue: Any, operating_system: str = '') -> Tuple[str, str]:
    """(runtime, 'major.minor') of an engine: Docker Desktop says so in ``info['OperatingSystem']``."""
    version = _venue.version_tuple(getattr(venue, 'version', ''))
    short = '.'.join(str(part) for part in version[:2]) if version else ''
    if getattr(venue, 'is_podman', False):
        return (PODMAN_ROOTLESS if venue.rootless else PODMAN), short
    return (DESKTOP if 'docker desktop' in (operating_system or '').lower() else ENGINE), short


def described(runtime: str, short: str) -> str:
    return '%s %s' % (RUNTIME_NAMES[runtime], short or '(version unknown)')


def measured_list() -> str:
    return ', '.join(described(runtime, short) for runtime, short in sorted(MEASURED))


def route_lines(endpoints: Sequence[Any], runtime: str, short: str) -> List[Line]:
    """One route line per endpoint whose host is a name for the host; none for any other host."""
    lines = []
    table = MEASURED.get((runtime, short))
    where = described(runtime, short)
    for endpoint in endpoints:
        host = str(endpoint.host).lower().rstrip('.')
        if host not in HOST_ALIASES:
            continue
        values = dict(id=endpoint.id, host=host, runtime=where)
        if table is None or host not in table:
            lines.append(Line('endpoint.route_unmeasured', 'notrun',
                              shape('endpoint.route_unmeasured', measured=measured_list(), **values),
                              fix='run doctor: the endpoint\'s tunnel probe says whether it answers'))
            continue
        reaches, how = table[host]
        if reaches:
            lines.append(Line('endpoint.route', 'ok', shape('endpoint.route', how=how, **values)))
        else:
            other = PODMAN_ALIAS if host == DOCKER_ALIAS else DOCKER_ALIAS
            lines.append(Line('endpoint.route_none', 'fail', shape('endpoint.route_none', why=how, **values),
                              fix='declare the endpoint with %s in model-endpoints.json (the name this runtime '
                                  'gives the host), then run ansible-playbook pi_dispatch.egress.site' % other))
    return lines


class RouteCheck(Check):
    """The route lines: the declared endpoints named by a host alias, against the runtime's measured table."""

    def lines(self, ctx: DoctorContext) -> List[Line]:
        endpoints = [ep for ep in (ctx.declared_endpoints() or [])
                     if str(ep.host).lower().rstrip('.') in HOST_ALIASES]
        if not endpoints:
            return []
        operating_system = ''
        try:
            venue = _venue.venue(ctx.client)
            if not venue.is_podman:
                info = dc.read('Asking the engine its configuration', ctx.client.info) or {}
                operating_system = str(info.get('OperatingSystem') or '')
        except dc.EngineError as exc:
            why = ' '.join(str(exc).split())
            fix = 'check that the engine answers (docker version), then re-run doctor'
            return [Line('endpoint.route_unread', 'notrun',
                         shape('endpoint.route_unread', id=ep.id, host=ep.host, why=why), fix=fix)
                    for ep in endpoints]
        return route_lines(endpoints, *runtime_of(venue, operating_system))
