# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The proxy container's wanted shape and what a daemon shows of it.

Pure: :func:`desired_spec` builds the wanted container from the deployment
paths and the hardening limits, :func:`observed` reads inspect data, and
:func:`differences` names every way one differs from the other. The lifecycle
(:mod:`_proxy`) and the reload path (:mod:`_reload`) build on this.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import venue as _venue
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import rules as _rules

PROXY_NAME = 'pi-dispatch-egress-proxy'
UPSTREAM_NETWORK = 'pi-dispatch-egress-out'
LABEL_ROLE = 'io.pi-dispatch.egress.role'
# The job networks the proxy and each of its shards carry before a job gets a new shard
# (egress_proxy's shard_bound, role variable egress_proxy_shard_bound). Set only when the operator
# sets it; a dispatcher that passes no bound of its own follows it (_shards.resolve_bound).
LABEL_SHARD_BOUND = 'io.pi-dispatch.egress.shard-bound'

LABEL_NETWORK_ROLE = 'io.pi-dispatch.egress.network'
JOB_NETWORK_PREFIX = 'pi-job-'
JOB_NETWORK_SUFFIX = '-net'
HOST_GATEWAY = 'host.docker.internal:host-gateway'
RESTART_POLICY = 'unless-stopped'
HEALTHCHECK_TEST = ['CMD', 'squidclient', '-h', 'localhost', '-p', str(_rules.PROXY_PORT), '-T', '3', 'mgr:info']

_NS = 1000000000


class ProxyError(Exception):
    pass


def is_job_network(name: str) -> bool:
    return name.startswith(JOB_NETWORK_PREFIX) and name.endswith(JOB_NETWORK_SUFFIX) and \
        len(name) > len(JOB_NETWORK_PREFIX) + len(JOB_NETWORK_SUFFIX)


# The proxy's own user in the image (Debian's "proxy"), which owns squid's pid directory.
PROXY_UID = 13
# The TLS name check's credential include (``_proxy/interceptor.py``; the image holds an empty copy).
CONTAINER_CREDENTIALS_INCLUDE = '/etc/pi-dispatch/egress-credentials.conf'
# The network only the proxy and the credential interceptor are on (``_proxy/interceptor.py`` NETWORK).
CREDENTIALS_NETWORK = 'pi-dispatch-egress-credentials'
TMPFS = {
    # squid's core dumps (coredump_dir) and the record of the allowlist it read.
    '/tmp': 'rw,nosuid,nodev,noexec,size=16m,mode=1777',
    # squid's pid file (pid_filename), owned by the proxy user.
    '/run/squid': 'rw,nosuid,nodev,noexec,size=1m,uid=%d,gid=%d,mode=0755' % (PROXY_UID, PROXY_UID),
}
# The proxy routes nothing: it only relays what squid admits (issue 17: it inherited ip_forward=1).
SYSCTLS = {'net.ipv4.ip_forward': '0', 'net.ipv6.conf.all.forwarding': '0'}
SECURITY_OPT = ['no-new-privileges:true']
# squid runs as the unprivileged "proxy" user from the start, listens on 3128 (no bind
# capability), never changes user and opens no raw socket (pinger_enable off), so it
# needs no capability at all: every one is dropped, NET_RAW included.
CAP_DROP = ['ALL']
CAP_ADD = []
# What Podman mounts writable on a read-only container unless the container names them (for_venue).
PODMAN_READ_ONLY_TMPFS = {
    '/run': 'rw,nosuid,nodev,noexec,size=1m,mode=0755',
    '/var/tmp': 'rw,nosuid,nodev,noexec,size=1m,mode=1777',
}
# The proxy's RLIMIT_NPROC on Podman (for_venue).
PODMAN_NPROC = 4096
DEFAULT_LIMITS = dict(memory='512m', pids=256, nofile=16384, log_max_size='10m', log_max_file=3)

_UNITS = {'': 1, 'b': 1, 'k': 1024, 'm': 1024 ** 2, 'g': 1024 ** 3}


def parse_size(value: Union[str, int], key: str = 'egress_proxy_memory') -> int:
    """Bytes of a docker-style size (512m, 1g, 65536). Raises ProxyError naming ``key``."""
    text = str(value).strip().lower()
    number, unit = text, ''
    if text and text[-1] in 'bkmg':
        number, unit = text[:-1], text[-1]
    if not number.isdigit() or int(number) <= 0:
        raise ProxyError('%s = %r is not a size; write a whole number with an optional unit k, m or g, e.g. 512m'
                         % (key, value))
    return int(number) * _UNITS[unit]


def check_limits(limits: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """Validate the container bounds; return them complete (defaults filled in)."""
    out = dict(DEFAULT_LIMITS)
    out.update(dict((k, v) for k, v in (limits or {}).items() if v is not None))
    memory = parse_size(out['memory'])
    if memory < 64 * 1024 ** 2:
        raise ProxyError('egress_proxy_memory = %r is below 64m, in which squid cannot start; give it at least 128m'
                         % out['memory'])
    for key, low, var in (('pids', 16, 'egress_proxy_pids_limit'), ('nofile', 1024, 'egress_proxy_nofile'),
                          ('log_max_file', 1, 'egress_proxy_log_max_file')):
        value = out[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ProxyError('%s = %r must be a whole number of at least %d' % (var, value, low))
    parse_size(out['log_max_size'], 'egress_proxy_log_max_size')
    out['memory_bytes'] = memory
    out['log_max_size'] = str(out['log_max_size']).strip().lower()
    return out


def check_shard_bound(value: Any, key: str = 'egress_proxy_shard_bound') -> Optional[int]:
    """``value`` as a number of job networks per proxy container (0: no shards); None stays None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ProxyError('%s = %r is not a number of job networks; use 0 (the proxy carries every job '
                         'network) or a whole number such as 10' % (key, value))
    return value


# The decision log (docs/decisions.md): a host folder mounted read-write at
# _rules.CONTAINER_DECISION_LOG_DIR, and what the image's decision-log program reads from the
# environment: the file name of this container, and the size rotation.
ENV_DECISION_LOG_NAME = 'PI_EGRESS_DECISION_LOG_NAME'
ENV_DECISION_LOG_MAX_BYTES = 'PI_EGRESS_DECISION_LOG_MAX_BYTES'
ENV_DECISION_LOG_KEEP = 'PI_EGRESS_DECISION_LOG_KEEP'
ENV_PREFIX = 'PI_EGRESS_'
DECISION_LOG_DEFAULTS = dict(max_size='10m', keep=5)


def check_decision_log(decision_log: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """dict(dir, max_bytes, keep) from dict(dir, max_size, keep), or None for None. ProxyError names the key."""
    if not decision_log:
        return None
    out = dict(DECISION_LOG_DEFAULTS)
    out.update(dict((k, v) for k, v in decision_log.items() if v is not None))
    if not out.get('dir') or not os.path.isabs(out['dir']):
        raise ProxyError('egress_decision_log_dir = %r is not an absolute path; name the host folder the '
                         'decision log is written to, e.g. /srv/pi-egress/decisions' % (out.get('dir'),))
    max_bytes = parse_size(out['max_size'], key='egress_decision_log_max_size')
    if max_bytes < 65536:
        raise ProxyError('egress_decision_log_max_size = %r is below 64k; each file holds at least that '
                         'much (write e.g. 10m)' % (out['max_size'],))
    keep = out['keep']
    if isinstance(keep, bool) or not isinstance(keep, int) or not 0 <= keep <= 100:
        raise ProxyError('egress_decision_log_keep = %r is not a number of older files from 0 to 100 (e.g. 5)'
                         % (keep,))
    return dict(dir=os.path.realpath(out['dir']), asked=out['dir'], max_bytes=max_bytes, keep=keep)


def decision_log_env(name: str, decision_log: Optional[Dict[str, Any]]) -> Dict[str, str]:
    """The environment a container of ``name`` gets for its decision log (empty without one)."""
    if not decision_log:
        return {}
    return {ENV_DECISION_LOG_NAME: name, ENV_DECISION_LOG_MAX_BYTES: str(decision_log['max_bytes']),
            ENV_DECISION_LOG_KEEP: str(decision_log['keep'])}


def desired_spec(image: str, rules: str, allowlist: str, endpoints: str, network: str = UPSTREAM_NETWORK,
                 name: str = PROXY_NAME, extra_hosts: Optional[Sequence[str]] = None, health_interval: int = 5,
                 mount_endpoints: bool = True, guard: Optional[str] = None, limits: Optional[Dict[str, Any]] = None,
                 shard_bound: Optional[int] = None, decision_log: Optional[Dict[str, Any]] = None,
                 credentials_include: Optional[str] = None, credentials_network: str = '') -> Dict[str, Any]:
    mounts = [(os.path.realpath(rules), _rules.CONTAINER_RULES),
              (os.path.realpath(allowlist), _rules.CONTAINER_ALLOWLIST)]
    if mount_endpoints:
        mounts.append((os.path.realpath(endpoints), _rules.CONTAINER_ENDPOINTS))
    if guard:
        mounts.append((os.path.realpath(guard), _rules.CONTAINER_GUARD))
    extra_networks = []
    if credentials_include:
        # Only when a credential is declared (docs/credentials.md): otherwise the image's empty copy stands.
        # The proxy is on the interceptor's network before squid starts (squid resolves its cache_peer then).
        mounts.append((os.path.realpath(credentials_include), CONTAINER_CREDENTIALS_INCLUDE))
        extra_networks.append(credentials_network or CREDENTIALS_NETWORK)
    limits = check_limits(limits)
    labels = {LABEL_ROLE: 'proxy'}
    if check_shard_bound(shard_bound) is not None:
        labels[LABEL_SHARD_BOUND] = str(shard_bound)
    decision_log = check_decision_log(decision_log)
    return dict(
        name=name,
        image=image,
        network=network,
        extra_networks=extra_networks,
        mounts=mounts,
        log_mount=(decision_log['dir'], _rules.CONTAINER_DECISION_LOG_DIR) if decision_log else None,
        log_dir_asked=decision_log['asked'] if decision_log else None,
        environment=decision_log_env(name, decision_log),
        restart_policy=RESTART_POLICY,
        extra_hosts=sorted([HOST_GATEWAY] + list(extra_hosts or [])),
        healthcheck=dict(test=HEALTHCHECK_TEST, interval=int(health_interval) * _NS,
                         timeout=5 * _NS, retries=3, start_period=int(health_interval) * _NS),
        labels=labels,
        command=list(COMMAND),
        security_opt=list(SECURITY_OPT),
        cap_drop=list(CAP_DROP),
        cap_add=list(CAP_ADD),
        read_only=True,
        tmpfs=dict(TMPFS),
        sysctls=dict(SYSCTLS),
        memory=limits['memory_bytes'],
        pids_limit=limits['pids'],
        ulimits=[dict(name='nofile', soft=limits['nofile'], hard=limits['nofile'])],
        log_config=dict(type='json-file', config={'max-size': limits['log_max_size'],
                                                  'max-file': str(limits['log_max_file'])}),
    )


def for_venue(spec: Dict[str, Any], venue: Any) -> Dict[str, Any]:
    """``spec`` as the engine behind ``venue`` (``_common/venue.py``) takes it (pure; the Docker shape unchanged).

    Each change below is one measured difference of Podman 4.3 and 5.4 (docs/podman.md).
    """
    if venue is None or not venue.is_podman or spec.get('for_venue') == venue.kind:
        return spec
    spec = dict(spec, for_venue=venue.kind)
    tmpfs = dict(spec['tmpfs'])
    # A read-only Podman container gets writable, executable tmpfs on /run and /var/tmp unless it names its
    # own (read-only-tmpfs): name them, noexec like the others.
    for path in PODMAN_READ_ONLY_TMPFS:
        tmpfs.setdefault(path, PODMAN_READ_ONLY_TMPFS[path])
    spec['tmpfs'] = tmpfs
    # Podman refuses a tmpfs uid=/gid= ("unknown mount option"): it is created with U (chown to the container's
    # user, squid's "proxy") and reports the result as uid=13,gid=13, the shape compared.
    owner = 'uid=%d,gid=%d' % (PROXY_UID, PROXY_UID)
    spec['create_tmpfs'] = dict((path, options.replace(owner, venue.tmpfs_owner(PROXY_UID, PROXY_UID)))
                                for path, options in tmpfs.items())
    # Podman keeps one log file, cut at max-size (it has no max-file); it reads the size 1000-based and shows it
    # in its own words ("10MB"), which is what is compared. The container is created with the operator's words.
    create_config = dict(spec['log_config'].get('config') or {})
    create_config.pop('max-file', None)
    spec['create_log_config'] = dict(spec['log_config'], config=create_config)
    shown = dict(create_config)
    if shown.get('max-size'):
        shown['max-size'] = _venue.podman_size(shown['max-size']) or shown['max-size']
    spec['log_config'] = dict(spec['log_config'], config=shown)
    # Podman 4.3 writes "host-gateway" into /etc/hosts as if it were an address (squid then skips the line and
    # resolves the name by DNS); Podman adds its own name for the host (host.containers.internal) to every
    # container, so the proxy maps none, and an operator's name mapped to host-gateway is refused.
    spec['extra_hosts'] = [entry for entry in spec['extra_hosts'] if entry != HOST_GATEWAY]
    refused = [entry for entry in spec['extra_hosts'] if entry.rpartition(':')[2] == 'host-gateway']
    if refused:
        raise ProxyError(
            'egress_proxy_extra_hosts %s: %s does not resolve host-gateway (it would write it into /etc/hosts as '
            'an address). Name the host %s instead, which Podman maps itself, or give the address'
            % (', '.join(refused), venue.describe(), venue.host_alias))
    # Podman replaces its default rlimits when a container names any ulimit, and then sets RLIMIT_NPROC to its
    # own maximum, which a host whose bounding set lacks CAP_SYS_RESOURCE cannot grant ("error setting rlimit
    # type 6"): name nproc too. squid runs a handful of processes; pids_limit caps them anyway.
    if not any(u['name'] == 'nproc' for u in spec['ulimits']):
        spec['ulimits'] = list(spec['ulimits']) + [dict(name='nproc', soft=PODMAN_NPROC, hard=PODMAN_NPROC)]
    return spec


def observed(attrs: Dict[str, Any]) -> Dict[str, Any]:
    """The parts of ``docker inspect`` that the comparison looks at."""
    host = attrs.get('HostConfig') or {}
    config = attrs.get('Config') or {}
    state = attrs.get('State') or {}
    nets = (attrs.get('NetworkSettings') or {}).get('Networks') or {}
    mounts = []
    for mount in attrs.get('Mounts') or []:
        mounts.append(dict(type=mount.get('Type'), source=mount.get('Source'),
                           destination=mount.get('Destination'), rw=bool(mount.get('RW'))))
    health = (state.get('Health') or {}).get('Status')
    bindings = host.get('PortBindings') or {}
    published = sorted(port for port, binds in bindings.items() if binds)
    check = config.get('Healthcheck') or {}
    log = host.get('LogConfig') or {}
    return dict(
        id=attrs.get('Id'),
        name=(attrs.get('Name') or '').lstrip('/'),
        image_id=attrs.get('Image'),
        status=state.get('Status'),
        running=bool(state.get('Running')),
        paused=bool(state.get('Paused')),
        health=health,
        started_at=state.get('StartedAt'),
        mounts=mounts,
        networks=sorted(nets.keys()),
        job_networks=sorted(n for n in nets if is_job_network(n)),
        restart_policy=(host.get('RestartPolicy') or {}).get('Name') or 'no',
        extra_hosts=sorted(host.get('ExtraHosts') or []),
        published_ports=published,
        healthcheck=check.get('Test'),
        health_timing=dict(interval=check.get('Interval') or 0, timeout=check.get('Timeout') or 0,
                           retries=check.get('Retries') or 0, start_period=check.get('StartPeriod') or 0),
        labels=config.get('Labels') or {},
        environment=dict(item.split('=', 1) for item in config.get('Env') or []
                         if item.startswith(ENV_PREFIX) and '=' in item),
        command=list(config.get('Cmd') or []),
        security_opt=sorted(host.get('SecurityOpt') or []),
        cap_drop=sorted(host.get('CapDrop') or []),
        cap_add=sorted(host.get('CapAdd') or []),
        read_only=bool(host.get('ReadonlyRootfs')),
        tmpfs=dict(host.get('Tmpfs') or {}),
        # None: the engine applied them but does not report them (Podman; _common/venue.py).
        sysctls=None if 'Sysctls' in (attrs.get(_venue.UNREPORTED) or []) else dict(host.get('Sysctls') or {}),
        memory=host.get('Memory') or 0,
        memory_swap=host.get('MemorySwap') or 0,
        pids_limit=host.get('PidsLimit') or 0,
        ulimits=sorted((u.get('Name'), u.get('Soft'), u.get('Hard')) for u in host.get('Ulimits') or []),
        log_config=dict(type=log.get('Type'), config=dict(log.get('Config') or {})),
    )


def is_ours(obs: Dict[str, Any]) -> bool:
    """A container under the proxy's name that we may manage.

    Ours: labelled by this collection, or shaped like a pi-dispatch proxy
    (it mounts the squid rules and the allowlist), including the older
    two-mount shape from before model endpoints existed.
    """
    if obs['labels'].get(LABEL_ROLE) == 'proxy':
        return True
    destinations = set(m['destination'] for m in obs['mounts'])
    return _rules.CONTAINER_RULES in destinations and _rules.CONTAINER_ALLOWLIST in destinations


def mounts_endpoints(obs: Dict[str, Any]) -> bool:
    return any(m['destination'] == _rules.CONTAINER_ENDPOINTS for m in obs['mounts'])


def _all_mounts(spec: Dict[str, Any]) -> List[Tuple[str, str]]:
    return list(spec['mounts']) + ([spec['log_mount']] if spec.get('log_mount') else [])


def _writable(spec: Dict[str, Any]) -> List[str]:
    """The container paths mounted read-write: the decision log's folder, when there is one."""
    return [spec['log_mount'][1]] if spec.get('log_mount') else []


def _wanted_ulimits(spec: Dict[str, Any]) -> List[Tuple[str, int, int]]:
    return sorted((u['name'], u['soft'], u['hard']) for u in spec['ulimits'])


def _timing(spec: Dict[str, Any]) -> Dict[str, int]:
    check = spec['healthcheck']
    return dict(interval=check['interval'], timeout=check['timeout'], retries=check['retries'],
                start_period=check['start_period'])


def _settings(spec: Dict[str, Any], obs: Dict[str, Any], image_id: Optional[str]
              ) -> List[Tuple[str, Any, Any, Optional[str]]]:
    """[(setting, running, wanted, message)] for every setting the module applies.

    ``message`` is what :func:`differences` says when running != wanted (None: the default
    "setting: running X, wanted Y").
    """
    writable = [m['destination'] for m in obs['mounts'] if m['rw']]
    rows = [
        ('image', obs['image_id'], image_id or obs['image_id'],
         'image: running %s, wanted %s (%s)' % (obs['image_id'], image_id, spec['image'])),
        ('mounts', sorted((m['source'], m['destination']) for m in obs['mounts'] if m['type'] == 'bind'),
         sorted((src, dst) for src, dst in _all_mounts(spec)), None),
        ('read-write mounts', writable, _writable(spec),
         'mounts: %s mounted read-write, wanted %s' % (
             ', '.join(writable) or 'none', ', '.join(_writable(spec)) or 'every mount read-only')),
        ('environment', obs.get('environment', {}), spec.get('environment', {}), None),
        ('on network %s' % spec['network'], spec['network'] in obs['networks'], True,
         'networks: not on %s' % spec['network']),
        ('restart policy', obs['restart_policy'], spec['restart_policy'], None),
        ('extra hosts', obs['extra_hosts'], spec['extra_hosts'], None),
        ('published ports', obs['published_ports'], [],
         'published ports: %s (the proxy publishes none)' % ', '.join(obs['published_ports'])),
        ('health check', obs['healthcheck'], spec['healthcheck']['test'], None),
        ('health check timing (ns)', obs['health_timing'], _timing(spec), None),
    ]
    # The shard bound is compared both ways: a label the operator's variable no longer asks for goes,
    # or dispatchers would keep following it. (A proxy made before the variable existed has none.)
    wanted_labels = dict(spec['labels'])
    if LABEL_SHARD_BOUND in obs['labels']:
        wanted_labels.setdefault(LABEL_SHARD_BOUND, None)
    for label, value in sorted(wanted_labels.items()):
        rows.append(('labels: %s' % label, obs['labels'].get(label), value,
                     'labels: %s is %r, wanted %r' % (label, obs['labels'].get(label), value)))
    rows += [
        ('command', obs['command'], spec['command'], None),
        ('security options', obs['security_opt'], sorted(spec['security_opt']), None),
        ('capabilities dropped', obs['cap_drop'], sorted(spec['cap_drop']), None),
        ('capabilities added', obs['cap_add'], sorted(spec['cap_add']), None),
        ('read-only root file system', obs['read_only'], spec['read_only'], None),
        ('tmpfs', obs['tmpfs'], spec['tmpfs'], None),
        # Podman applies sysctls but does not report them (obs None): compared where the engine says.
        ('sysctls', spec['sysctls'] if obs['sysctls'] is None else obs['sysctls'], spec['sysctls'],
         None),
    ] + _limit_rows(spec, obs) + [
        # An engine that drops the ulimits of an API create (rootless Podman, _common/venue.py) reports none: what it
        # reports is taken as it is, or every run would replace the proxy.
        ('ulimits', obs['ulimits'], obs['ulimits'] if spec.get('ulimits_unapplied') else _wanted_ulimits(spec), None),
        ('log config', obs['log_config'], spec['log_config'], None),
    ]
    return rows


def _limit_rows(spec: Dict[str, Any], obs: Dict[str, Any]) -> List[Tuple[str, Any, Any, Optional[str]]]:
    """The memory and pids rows. Where the operator consented to limits the engine cannot apply
    (``limits_unenforced``: rootless on cgroup v1, _common/venue.py), the container is still created with them
    and what the engine reports is taken as it is: comparing would replace the proxy on every run."""
    # No swap beyond the memory limit: Docker stores MemorySwap = Memory for that.
    rows = [('memory limit (bytes)', obs['memory'], spec['memory']),
            ('memory+swap limit (bytes)', obs['memory_swap'], spec['memory']),
            ('pids limit', obs['pids_limit'], spec['pids_limit'])]
    if spec.get('limits_unenforced'):
        return [(setting + ' (not enforced on this host)', have, have, None) for setting, have, _want in rows]
    return [(setting, have, want, None) for setting, have, want in rows]


def differences(spec: Dict[str, Any], obs: Dict[str, Any], image_id: Optional[str]) -> List[str]:
    """Human-readable list of what differs between the wanted and the running shape.

    Every setting the module applies is compared, so a proxy changed by hand
    (or made by an earlier version of this collection, before the hardening)
    is reported and replaced rather than silently kept.
    """
    return [message or '%s: running %s, wanted %s' % (setting, have, want)
            for setting, have, want, message in _settings(spec, obs, image_id) if have != want]


def shape_diff(spec: Dict[str, Any], obs: Optional[Dict[str, Any]], image_id: Optional[str]) -> Dict[str, str]:
    """Ansible's ``diff`` of the proxy: one ``setting: value`` line per setting, running (before) and wanted (after).

    ``obs`` None is a proxy that does not exist yet (before is empty).
    """
    if obs is None:
        return dict(before='', after='(%s created from %s)\n' % (spec['name'], spec['image']),
                    before_header='%s (missing)' % spec['name'], after_header='%s (wanted)' % spec['name'])
    rows = _settings(spec, obs, image_id)
    return dict(before=''.join('%s: %s\n' % (setting, have) for setting, have, _w, _m in rows),
                after=''.join('%s: %s\n' % (setting, want) for setting, _h, want, _m in rows),
                before_header='%s (running)' % spec['name'], after_header='%s (wanted)' % spec['name'])


def create_kwargs(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Keyword arguments of ``client.containers.create`` for ``spec`` (pure, unit-tested)."""
    return dict(
        image=spec['image'], name=spec['name'], detach=True,
        restart_policy={'Name': spec['restart_policy']},
        extra_hosts=spec['extra_hosts'], network=spec['network'],
        labels=spec['labels'], healthcheck=spec['healthcheck'], command=list(spec['command']),
        security_opt=list(spec['security_opt']), cap_drop=list(spec['cap_drop']),
        cap_add=list(spec['cap_add']) or None, read_only=spec['read_only'],
        tmpfs=dict(spec.get('create_tmpfs') or spec['tmpfs']),
        sysctls=dict(spec['sysctls']), mem_limit=spec['memory'], memswap_limit=spec['memory'],
        pids_limit=spec['pids_limit'], log_config=dict(spec.get('create_log_config') or spec['log_config']),
        environment=dict(spec.get('environment') or {}),
    )


# A copy of the allowlist as squid last read it, kept inside the container (on its /tmp tmpfs).
# It is taken BEFORE squid reads the file, at start (the container's command) and at every
# reconfigure (:func:`reconfigure_cmd`): an edit in between is then recorded as not read and
# reconfigured once more on the next run, never recorded as read while squid has the old one.
LOADED_ALLOWLIST = '/tmp/pi-egress-loaded-allowlist.conf'
COMMAND = ['sh', '-c', 'cp %s %s; exec squid -N -f %s' % (
    _rules.CONTAINER_ALLOWLIST, LOADED_ALLOWLIST, _rules.CONTAINER_RULES)]
