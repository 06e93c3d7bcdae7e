# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""Which engine answers, and the few ways it differs from the Docker Engine (docs/podman.md).

Every module speaks the Docker Engine API. Podman serves the same API (rootful at
``unix:///run/podman/podman.sock``, rootless at ``unix://$XDG_RUNTIME_DIR/podman/podman.sock``), so
the modules work there unchanged except for the differences in :data:`VENUES`, measured on the
versions named there. Code asks the venue (``venue(client).tmpfs_owner(13, 13)``) instead of
branching on the engine's name.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

DOCKER = 'docker'
PODMAN = 'podman'

# What differs, per engine (measured: Docker Engine 20.10 and 26; Podman 4.3.1 and 5.4.2).
VENUES: Dict[str, Dict[str, Any]] = {
    DOCKER: dict(
        # The name a container uses for the host it runs on (the extra host the proxy maps).
        host_alias='host.docker.internal',
        # tmpfs options that make a mount owned by a user: Docker passes uid/gid to the kernel.
        tmpfs_owner='uid={uid},gid={gid}',
        # A network inspect lists its containers (running ones: stopped ones hold no endpoint).
        inspect_lists_members=True,
        # Removing a network with a stopped container still connected: Docker allows it.
        network_rm_needs_detach=False,
        # The log driver whose size options the proxy sets.
        log_driver='json-file',
    ),
    PODMAN: dict(
        host_alias='host.containers.internal',
        # Podman 4.3 refuses uid=/gid= ("unknown mount option"); U chowns the tmpfs to the container's user.
        tmpfs_owner='U',
        # Podman 4.9's network inspect shows no containers; `ps -a --filter network=` does.
        inspect_lists_members=False,
        # "network is being used": a stopped or created container attached blocks the removal.
        network_rm_needs_detach=True,
        log_driver='k8s-file',
    ),
}


class Venue(object):
    """The engine behind a client: ``kind`` (docker or podman), its version and whether it runs rootless."""

    def __init__(self, kind: str, version: str = '', api_version: str = '', rootless: bool = False,
                 cgroup_version: str = '') -> None:
        if kind not in VENUES:
            raise ValueError('unknown engine kind %r' % kind)
        self.kind = kind
        self.version = version
        self.api_version = api_version
        self.rootless = rootless
        self.cgroup_version = cgroup_version  # '1' or '2' as the engine says it ('' not said)
        self.traits = VENUES[kind]

    @property
    def is_podman(self) -> bool:
        return self.kind == PODMAN

    @property
    def host_alias(self) -> str:
        return self.traits['host_alias']

    def tmpfs_owner(self, uid: int, gid: int) -> str:
        return self.traits['tmpfs_owner'].format(uid=uid, gid=gid)

    def describe(self) -> str:
        return '%s %s%s' % ('Podman' if self.is_podman else 'Docker Engine', self.version or '(version unknown)',
                            ' (rootless)' if self.rootless else '')

    def limits_problem(self) -> Optional[str]:
        """Why a container's memory and pids limits would not hold on this engine, or None.

        Rootless on cgroup v1, the engine applies none. Measured with Podman 4.3.1 (Debian 12) rootless on a
        cgroup v1 host: ``podman run --memory=512m --pids-limit=256`` says "Resource limits are not supported
        and ignored on cgroups V1 rootless systems", the same create through the API succeeds without a word,
        the process sits in its parent's unlimited memory cgroup, and inspect reports ``Memory=0
        PidsLimit=0`` while the compat ``/info`` says ``MemoryLimit: true``. Docker documents the same for
        its rootless mode (limits need cgroup v2).
        """
        if self.rootless and self.cgroup_version == '1':
            return ('%s runs rootless on a cgroup v1 host, where it applies no memory or pids limit: the proxy '
                    'would run without the limits it is deployed with, and every later run would see it differ '
                    '(inspect reports Memory=0). Fix: boot the host with cgroup v2 (systemd.unified_cgroup_'
                    'hierarchy=1, the default of Debian 12 and later), or run the proxy on the rootful engine '
                    '(docs/podman.md)' % self.describe())
        return None

    @property
    def drops_api_ulimits(self) -> bool:
        """Rootless Podman drops the ulimits of a container created through its Docker API: its compat create passes
        HostConfig.Ulimits on only when rootful (``if !rootless.IsRootless()``), and containers.conf default_ulimits
        do not apply there either. Measured on 4.3.1: a create with nofile 16384 runs with the service's own
        RLIMIT_NOFILE (20000 here) and inspect reports ``Ulimits: []``."""
        return self.is_podman and self.rootless

    def limits_decision(self, consent: bool) -> Tuple[Optional[str], Dict[str, Any]]:
        """(refusal or None, the ``limits`` the deploy reports) for a proxy with memory and pids limits. Pure.

        Without a problem the limits are enforced. With one, the deploy is refused unless the operator consented
        (``egress_proxy_limits_unenforced_ok``); with consent it goes on, reported as not enforced.
        """
        problem = self.limits_problem()
        if problem is None:
            return None, dict(enforced=True, cgroup_version=self.cgroup_version, engine=self.describe(),
                              ulimits_enforced=not self.drops_api_ulimits)
        report = dict(enforced=False, cgroup_version=self.cgroup_version, engine=self.describe(), why=problem,
                      ulimits_enforced=not self.drops_api_ulimits)
        if consent:
            return None, report
        return ('%s; or, knowing the limits hold nothing there, consent with egress_proxy_limits_unenforced_ok: '
                'true (module option limits_unenforced_ok)' % problem), report

    def as_dict(self) -> Dict[str, Any]:
        return dict(kind=self.kind, version=self.version, api_version=self.api_version, rootless=self.rootless)

    def __repr__(self) -> str:
        return 'Venue(%r, %r, rootless=%r)' % (self.kind, self.version, self.rootless)


def version_tuple(text: Any) -> Tuple[int, ...]:
    """``4.3.1`` -> (4, 3, 1); the digits before anything else in each part (``5.4.2-dev`` -> (5, 4, 2)).

    The one parser of engine and SDK versions (``_fleet/host_check.py`` uses it too).
    """
    parts = []
    for piece in ('' if text is None else str(text)).split('.'):
        digits = ''
        for char in piece:
            if not char.isdigit():
                break
            digits += char
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def from_version(version: Dict[str, Any], rootless: Optional[bool] = None) -> Venue:
    """The venue from ``GET /version`` (pure): Podman names itself in Components as "Podman Engine"."""
    if not isinstance(version, dict):
        version = {}
    components = version.get('Components') or []
    names = [str((c or {}).get('Name') or '') for c in components]
    podman = [c for c, name in zip(components, names) if name.lower().startswith('podman')]
    if podman:
        return Venue(PODMAN, str(podman[0].get('Version') or version.get('Version') or ''),
                     str(version.get('ApiVersion') or ''), bool(rootless))
    return Venue(DOCKER, str(version.get('Version') or ''), str(version.get('ApiVersion') or ''),
                 bool(rootless))


def docker_rootless(info: Dict[str, Any]) -> bool:
    """Docker says rootless in SecurityOptions (``name=rootless``); Podman's compat info does not."""
    if not isinstance(info, dict):
        return False
    return any('name=rootless' in str(opt) for opt in info.get('SecurityOptions') or [])


_ATTR = '_pi_egress_venue'


def venue(client: Any) -> Venue:
    """The venue of ``client``, asked once per client (``/version``, and Podman's own info for rootless)."""
    known = getattr(client, _ATTR, None)
    if known is not None:
        return known
    from . import docker_client  # pylint: disable=import-outside-toplevel
    version = docker_client.read('Asking the engine its version', client.version)
    found = from_version(version)
    if found.is_podman:
        found.rootless, found.cgroup_version = _podman_rootless(client)
    else:
        info = docker_client.read('Asking the engine its configuration', client.info)
        found.rootless = docker_rootless(info)
        found.cgroup_version = cgroup_version((info or {}).get('CgroupVersion') if isinstance(info, dict) else None)
    try:
        setattr(client, _ATTR, found)
    except AttributeError:  # pragma: no cover - a client type that refuses attributes is asked again
        pass
    return found


def cgroup_version(text: Any) -> str:
    """``1`` or ``2`` from Docker's ``CgroupVersion`` or Podman's ``cgroupVersion`` (``v1``); '' otherwise."""
    value = str(text or '').strip().lower().lstrip('v')
    return value if value in ('1', '2') else ''


def _podman_rootless(client: Any) -> Tuple[bool, str]:
    """(rootless, cgroup version) from Podman's libpod info (the compat /info does not say rootless)."""
    api = client.api
    try:
        response = api.get(api.base_url + '/v4.0.0/libpod/info', timeout=30)
        response.raise_for_status()
        host = response.json().get('host') or {}
        return bool((host.get('security') or {}).get('rootless')), cgroup_version(host.get('cgroupVersion'))
    except Exception:  # an older Podman without the libpod API: the socket path tells
        # The SDK's base_url is http+docker://localhost for every socket; the adapter keeps the path.
        path = getattr(getattr(api, '_custom_adapter', None), 'socket_path', '') or getattr(api, 'base_url', '')
        return '/run/user/' in str(path or ''), ''


def run_health_check(client: Any, name: str) -> None:
    """On Podman, run ``name``'s health check now (it records the result in State.Health); elsewhere nothing.

    Podman runs health checks from systemd timers: on a host whose PID 1 is not systemd (a container
    host, a CI runner) the status stays "starting" forever. Waiting code calls this before it reads
    the status, so the wait means the same on both engines. Best effort: a failure leaves the status as it was.
    """
    if not venue(client).is_podman:
        return
    api = client.api
    try:
        api.get(api.base_url + '/v4.0.0/libpod/containers/%s/healthcheck' % name, timeout=30)
    except Exception:  # the status read next says what is known
        pass


# The capabilities Podman grants by default (containers.conf default_capabilities): a CapDrop listing
# every one of them is Podman's way of reporting a Docker "--cap-drop ALL" (the bounding set is empty).
# containers/common before 0.51 (Podman 4.3) granted 14; from 0.51 (Podman 4.4 and later) 11, without
# AUDIT_WRITE, MKNOD and NET_RAW. Podman's own inspect (BoundingCaps) settles it where it says.
PODMAN_DEFAULT_CAPS = frozenset([
    'AUDIT_WRITE', 'CHOWN', 'DAC_OVERRIDE', 'FOWNER', 'FSETID', 'KILL', 'MKNOD', 'NET_BIND_SERVICE',
    'NET_RAW', 'SETFCAP', 'SETGID', 'SETPCAP', 'SETUID', 'SYS_CHROOT'])
PODMAN_DEFAULT_CAPS_0_51 = PODMAN_DEFAULT_CAPS - frozenset(['AUDIT_WRITE', 'MKNOD', 'NET_RAW'])
# Mount options Podman adds to every tmpfs it reports.
_PODMAN_TMPFS_NOISE = ('rprivate', 'tmpcopyup')
# attrs['PiEgressUnreported']: HostConfig keys the engine applied but does not report back.
UNREPORTED = 'PiEgressUnreported'


def from_human_size(text: Any) -> Optional[int]:
    """Bytes of a size as Podman reads it (go-units FromHumanSize: 1000-based, ``10m`` = 10000000); None if not one."""
    value = str(text if text is not None else '').strip().lower()
    if value.endswith('b'):
        value = value[:-1]
    number = value.rstrip('kmgtp')
    unit = value[len(number):]
    if len(unit) > 1:
        return None
    try:
        amount = float(number)
    except ValueError:
        return None
    if amount < 0:
        return None
    return int(amount * 1000 ** ('kmgtp'.index(unit) + 1 if unit else 0))


def human_size(size: int) -> str:
    """A size as Podman prints it in its inspect (go-units HumanSize: 1000-based, 4 significant digits)."""
    units = ['B', 'kB', 'MB', 'GB', 'TB', 'PB']
    amount = float(size)
    index = 0
    while amount >= 1000 and index < len(units) - 1:
        amount /= 1000
        index += 1
    return '%.4g%s' % (amount, units[index])


def podman_size(text: Any) -> Optional[str]:
    """What Podman's inspect shows for a size the operator wrote (``10m`` -> ``10MB``); None if not a size."""
    size = from_human_size(text)
    return None if size is None else human_size(size)


def _cap_name(cap: str) -> str:
    return cap[4:] if cap.upper().startswith('CAP_') else cap


def podman_attrs(attrs: Dict[str, Any], libpod: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Podman's compat inspect in Docker's words (pure): what differs is spelling, not substance.

    ``libpod`` is Podman's own inspect of the same container (for the log size the compat view leaves out).
    Ulimits ``RLIMIT_NOFILE`` -> ``nofile``; ``no-new-privileges`` -> ``no-new-privileges:true``; a CapDrop
    of Podman's whole default set -> ``ALL``; tmpfs options without the ``rprivate``/``tmpcopyup`` Podman adds;
    Sysctls, applied but never reported, are named in ``attrs[UNREPORTED]`` instead of reading as none.
    """
    attrs = dict(attrs or {})
    host = dict(attrs.get('HostConfig') or {})
    ulimits = []
    for limit in host.get('Ulimits') or []:
        limit = dict(limit)
        name = str(limit.get('Name') or '')
        if name.upper().startswith('RLIMIT_'):
            limit['Name'] = name[len('RLIMIT_'):].lower()
        ulimits.append(limit)
    host['Ulimits'] = ulimits
    host['SecurityOpt'] = [('no-new-privileges:true' if opt == 'no-new-privileges' else opt)
                           for opt in host.get('SecurityOpt') or []]
    dropped = set(_cap_name(c).upper() for c in host.get('CapDrop') or [])
    added = list(host.get('CapAdd') or [])
    bounding = (libpod or {}).get('BoundingCaps')
    if not added and (bounding == [] or (bounding is None and (
            PODMAN_DEFAULT_CAPS <= dropped or PODMAN_DEFAULT_CAPS_0_51 == dropped))):
        host['CapDrop'] = ['ALL']
    else:
        host['CapDrop'] = sorted(_cap_name(c) for c in host.get('CapDrop') or [])
    host['CapAdd'] = sorted(_cap_name(c) for c in added)
    tmpfs = {}
    for path, options in (host.get('Tmpfs') or {}).items():
        tmpfs[path] = ','.join(o for o in str(options).split(',') if o and o not in _PODMAN_TMPFS_NOISE)
    host['Tmpfs'] = tmpfs
    log = dict(host.get('LogConfig') or {})
    config = dict(log.get('Config') or {})
    # Podman stores the size 1000-based and prints it with 4 significant digits ("10MB"): kept in its words,
    # and for_venue() words the wanted size the same way.
    size = ((((libpod or {}).get('HostConfig') or {}).get('LogConfig') or {}).get('Size'))
    if from_human_size(size) and 'max-size' not in config:
        config['max-size'] = str(size)
    log['Config'] = config
    host['LogConfig'] = log
    attrs['HostConfig'] = host
    if not host.get('Sysctls'):
        attrs[UNREPORTED] = ['Sysctls']
    return attrs


def container_attrs(client: Any, attrs: Dict[str, Any]) -> Dict[str, Any]:
    """``attrs`` (a container's inspect) in Docker's words, asking Podman's own inspect when needed."""
    if not venue(client).is_podman:
        return attrs
    api = client.api
    libpod = None
    ident = attrs.get('Id') or (attrs.get('Name') or '').lstrip('/')
    try:
        response = api.get(api.base_url + '/v4.0.0/libpod/containers/%s/json' % ident, timeout=30)
        if response.status_code == 200:
            libpod = response.json()
    except Exception:  # the log size then reads as unknown
        libpod = None
    return podman_attrs(attrs, libpod)
