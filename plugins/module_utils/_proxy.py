# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The proxy container: its desired shape, the comparison, and the actions.

:func:`differences` and :func:`decide` are pure (they take inspect data),
so the decision table is unit-tested without a daemon; :class:`ProxyManager`
applies a decision through the Docker SDK.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import time

from ansible_collections.pi_dispatch.egress.plugins.module_utils import _docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils import _rules

PROXY_NAME = 'pi-dispatch-egress-proxy'
UPSTREAM_NETWORK = 'pi-dispatch-egress-out'
LABEL_ROLE = 'io.pi-dispatch.egress.role'
LABEL_NETWORK_ROLE = 'io.pi-dispatch.egress.network'
JOB_NETWORK_PREFIX = 'pi-job-'
JOB_NETWORK_SUFFIX = '-net'
HOST_GATEWAY = 'host.docker.internal:host-gateway'
RESTART_POLICY = 'unless-stopped'
HEALTHCHECK_TEST = ['CMD', 'squidclient', '-h', 'localhost', '-p', str(_rules.PROXY_PORT), '-T', '3', 'mgr:info']

STATES = ('present', 'started', 'stopped', 'absent', 'restarted', 'reloaded')
_NS = 1000000000


class ProxyError(Exception):
    pass


class ParseRefused(ProxyError):
    """squid -k parse refused the rules with what is on disk now; nothing was reloaded."""


def is_job_network(name):
    return name.startswith(JOB_NETWORK_PREFIX) and name.endswith(JOB_NETWORK_SUFFIX) and \
        len(name) > len(JOB_NETWORK_PREFIX) + len(JOB_NETWORK_SUFFIX)


# The proxy's own user in the image (Debian's "proxy"), which owns squid's pid directory.
PROXY_UID = 13
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
DEFAULT_LIMITS = dict(memory='512m', pids=256, nofile=16384, log_max_size='10m', log_max_file=3)

_UNITS = {'': 1, 'b': 1, 'k': 1024, 'm': 1024 ** 2, 'g': 1024 ** 3}


def parse_size(value, key='egress_proxy_memory'):
    """Bytes of a docker-style size (512m, 1g, 65536). Raises ProxyError naming ``key``."""
    text = str(value).strip().lower()
    number, unit = text, ''
    if text and text[-1] in 'bkmg':
        number, unit = text[:-1], text[-1]
    if not number.isdigit() or int(number) <= 0:
        raise ProxyError('%s = %r is not a size; write a whole number with an optional unit k, m or g, e.g. 512m'
                         % (key, value))
    return int(number) * _UNITS[unit]


def check_limits(limits):
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


def desired_spec(image, rules, allowlist, endpoints, network=UPSTREAM_NETWORK, name=PROXY_NAME,
                 extra_hosts=None, health_interval=5, mount_endpoints=True, guard=None, limits=None):
    mounts = [(os.path.realpath(rules), _rules.CONTAINER_RULES),
              (os.path.realpath(allowlist), _rules.CONTAINER_ALLOWLIST)]
    if mount_endpoints:
        mounts.append((os.path.realpath(endpoints), _rules.CONTAINER_ENDPOINTS))
    if guard:
        mounts.append((os.path.realpath(guard), _rules.CONTAINER_GUARD))
    limits = check_limits(limits)
    return dict(
        name=name,
        image=image,
        network=network,
        mounts=mounts,
        restart_policy=RESTART_POLICY,
        extra_hosts=sorted([HOST_GATEWAY] + list(extra_hosts or [])),
        healthcheck=dict(test=HEALTHCHECK_TEST, interval=int(health_interval) * _NS,
                         timeout=5 * _NS, retries=3, start_period=int(health_interval) * _NS),
        labels={LABEL_ROLE: 'proxy'},
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


def observed(attrs):
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
        command=list(config.get('Cmd') or []),
        security_opt=sorted(host.get('SecurityOpt') or []),
        cap_drop=sorted(host.get('CapDrop') or []),
        cap_add=sorted(host.get('CapAdd') or []),
        read_only=bool(host.get('ReadonlyRootfs')),
        tmpfs=dict(host.get('Tmpfs') or {}),
        sysctls=dict(host.get('Sysctls') or {}),
        memory=host.get('Memory') or 0,
        memory_swap=host.get('MemorySwap') or 0,
        pids_limit=host.get('PidsLimit') or 0,
        ulimits=sorted((u.get('Name'), u.get('Soft'), u.get('Hard')) for u in host.get('Ulimits') or []),
        log_config=dict(type=log.get('Type'), config=dict(log.get('Config') or {})),
    )


def is_ours(obs):
    """A container under the proxy's name that we may manage.

    Ours: labelled by this collection, or shaped like a pi-dispatch proxy
    (it mounts the squid rules and the allowlist), including the older
    two-mount shape from before model endpoints existed.
    """
    if obs['labels'].get(LABEL_ROLE) == 'proxy':
        return True
    destinations = set(m['destination'] for m in obs['mounts'])
    return _rules.CONTAINER_RULES in destinations and _rules.CONTAINER_ALLOWLIST in destinations


def mounts_endpoints(obs):
    return any(m['destination'] == _rules.CONTAINER_ENDPOINTS for m in obs['mounts'])


def _wanted_ulimits(spec):
    return sorted((u['name'], u['soft'], u['hard']) for u in spec['ulimits'])


def _timing(spec):
    check = spec['healthcheck']
    return dict(interval=check['interval'], timeout=check['timeout'], retries=check['retries'],
                start_period=check['start_period'])


def differences(spec, obs, image_id):
    """Human-readable list of what differs between the wanted and the running shape.

    Every setting the module applies is compared, so a proxy changed by hand
    (or made by an earlier version of this collection, before the hardening)
    is reported and replaced rather than silently kept.
    """
    diffs = []

    def differ(what, have, want):
        if have != want:
            diffs.append('%s: running %s, wanted %s' % (what, have, want))

    if image_id and obs['image_id'] != image_id:
        diffs.append('image: running %s, wanted %s (%s)' % (obs['image_id'], image_id, spec['image']))
    wanted = sorted((src, dst) for src, dst in spec['mounts'])
    have = sorted((m['source'], m['destination']) for m in obs['mounts'] if m['type'] == 'bind')
    differ('mounts', have, wanted)
    writable = [m['destination'] for m in obs['mounts'] if m['rw']]
    if writable:
        diffs.append('mounts: %s mounted read-write, wanted read-only' % ', '.join(writable))
    if spec['network'] not in obs['networks']:
        diffs.append('networks: not on %s' % spec['network'])
    differ('restart policy', obs['restart_policy'], spec['restart_policy'])
    differ('extra hosts', obs['extra_hosts'], spec['extra_hosts'])
    if obs['published_ports']:
        diffs.append('published ports: %s (the proxy publishes none)' % ', '.join(obs['published_ports']))
    differ('health check', obs['healthcheck'], spec['healthcheck']['test'])
    differ('health check timing (ns)', obs['health_timing'], _timing(spec))
    for label, value in sorted(spec['labels'].items()):
        if obs['labels'].get(label) != value:
            diffs.append('labels: %s is %r, wanted %r' % (label, obs['labels'].get(label), value))
    differ('command', obs['command'], spec['command'])
    differ('security options', obs['security_opt'], sorted(spec['security_opt']))
    differ('capabilities dropped', obs['cap_drop'], sorted(spec['cap_drop']))
    differ('capabilities added', obs['cap_add'], sorted(spec['cap_add']))
    differ('read-only root file system', obs['read_only'], spec['read_only'])
    differ('tmpfs', obs['tmpfs'], spec['tmpfs'])
    differ('sysctls', obs['sysctls'], spec['sysctls'])
    differ('memory limit (bytes)', obs['memory'], spec['memory'])
    # No swap beyond the memory limit: Docker stores MemorySwap = Memory for that.
    differ('memory+swap limit (bytes)', obs['memory_swap'], spec['memory'])
    differ('pids limit', obs['pids_limit'], spec['pids_limit'])
    differ('ulimits', obs['ulimits'], _wanted_ulimits(spec))
    differ('log config', obs['log_config'], spec['log_config'])
    return diffs


def create_kwargs(spec):
    """Keyword arguments of ``client.containers.create`` for ``spec`` (pure, unit-tested)."""
    return dict(
        image=spec['image'], name=spec['name'], detach=True,
        restart_policy={'Name': spec['restart_policy']},
        extra_hosts=spec['extra_hosts'], network=spec['network'],
        labels=spec['labels'], healthcheck=spec['healthcheck'], command=list(spec['command']),
        security_opt=list(spec['security_opt']), cap_drop=list(spec['cap_drop']),
        cap_add=list(spec['cap_add']) or None, read_only=spec['read_only'], tmpfs=dict(spec['tmpfs']),
        sysctls=dict(spec['sysctls']), mem_limit=spec['memory'], memswap_limit=spec['memory'],
        pids_limit=spec['pids_limit'], log_config=dict(spec['log_config']),
    )


# A copy of the allowlist as squid last read it, kept inside the container (on its /tmp tmpfs).
# It is taken BEFORE squid reads the file, at start (the container's command) and at every
# reconfigure (:func:`reconfigure_cmd`): an edit in between is then recorded as not read and
# reconfigured once more on the next run, never recorded as read while squid has the old one.
LOADED_ALLOWLIST = '/tmp/pi-egress-loaded-allowlist.conf'
COMMAND = ['sh', '-c', 'cp %s %s; exec squid -N -f %s' % (
    _rules.CONTAINER_ALLOWLIST, LOADED_ALLOWLIST, _rules.CONTAINER_RULES)]
PARSE_CMD = ['squid', '-k', 'parse', '-f', _rules.CONTAINER_RULES]


def allowlist_check_cmd():
    """Exit 0 when the mounted allowlist is what squid last read, 1 when it changed, 2 when unknown."""
    return ['cmp', '-s', LOADED_ALLOWLIST, _rules.CONTAINER_ALLOWLIST]


def reconfigure_cmd():
    """Record the allowlist, then make squid reread everything (rules, allowlist, includes)."""
    return ['sh', '-c', 'cp %s %s && exec squid -k reconfigure -f %s' % (
        _rules.CONTAINER_ALLOWLIST, LOADED_ALLOWLIST, _rules.CONTAINER_RULES)]


def mounted_digests_cmd(destinations):
    return ['sha256sum', '--'] + list(destinations)


def parse_digests(output):
    """{path: sha256} from sha256sum output."""
    found = {}
    for line in output.splitlines():
        parts = line.strip().split(None, 1)
        if len(parts) == 2 and len(parts[0]) == 64:
            found[parts[1].lstrip('*')] = parts[0]
    return found


def stale_mounts(spec, inside):
    """Mounted files whose content inside the proxy differs from the file on disk.

    A single-file bind mount pins the inode it was made with: a file saved by
    rename (``sed -i``, an editor, ``lineinfile``, ``template``) is a new inode
    the running proxy never sees, so squid keeps reading the old content.
    ``inside`` is :func:`parse_digests` of the proxy's view. Returns
    [(host path, container path)].
    """
    import hashlib
    stale = []
    for src, dst in spec['mounts']:
        try:
            with open(src, 'rb') as handle:
                disk = hashlib.sha256(handle.read()).hexdigest()
        except (IOError, OSError):
            continue
        if dst in inside and inside[dst] != disk:
            stale.append((src, dst))
    return stale


def reconfigure(container, parse_first=True):
    """The one reload path: ``squid -k parse``, then record and ``squid -k reconfigure``.

    Raises ProxyError with squid's own words when it refuses; a refused
    parse reconfigures nothing, so the running squid keeps its last good rules.
    """
    if parse_first:
        rc, out = dc.exec_in(container, PARSE_CMD)
        if rc != 0:
            raise ParseRefused('squid refused its rules (squid -k parse exited %s), so the proxy was not reloaded '
                               'and keeps its last good rules. squid said:\n%s' % (rc, _tail(out)))
    rc, out = dc.exec_in(container, reconfigure_cmd())
    if rc != 0:
        raise ProxyError('squid -k reconfigure exited %s: %s' % (rc, _tail(out)))


def _tail(text, lines=15):
    return '\n'.join((text or '').strip().splitlines()[-lines:])


def decide(state, obs, diffs, allowlist_changed=False, upstream=UPSTREAM_NETWORK):
    """The ordered actions for ``state`` given the observed container (or None).

    ``allowlist_changed``: the running squid read another allowlist than the
    file it mounts now (a hand edit); started/present then reconfigure it,
    which re-reads the allowlist without cutting any job's tunnel.
    """
    if state == 'absent':
        return ['remove'] if obs else []
    actions = []
    if obs is None:
        actions.append('create')
    elif diffs:
        actions += ['remove', 'create']
    fresh = 'create' in actions
    running = bool(obs and obs['running'] and not fresh)
    paused = bool(obs and obs['paused'] and not fresh)
    if state == 'stopped':
        if paused:
            actions.append('unpause')
        if running:
            actions.append('stop')
        return actions
    if paused:
        actions.append('unpause')
    if state == 'restarted':
        actions.append('restart' if running else 'start')
    elif not running:
        actions.append('start')
    if fresh and obs and reattach_networks(obs, upstream):
        actions.append('reconnect')
    reread = state == 'reloaded' or (state in ('present', 'started') and allowlist_changed)
    if reread and not fresh and running:
        actions.append('reconfigure')
    return actions


# Actions that drop every tunnel of every job attached to a running (or paused) proxy.
CUTTING_ACTIONS = ('remove', 'restart', 'stop')


def jobs_cut(actions, obs):
    """How many attached job networks ``actions`` would cut (0 for a stopped or missing proxy)."""
    if not obs or not (obs['running'] or obs['paused']):
        return 0
    if not set(actions) & set(CUTTING_ACTIONS):
        return 0
    return len(obs['job_networks'])


def consent_refusal(actions, obs, allow_cut_jobs, variable='egress_proxy_allow_cut_jobs'):
    """None when ``actions`` may go ahead, else the refusal (the same rule as the upgrade's)."""
    cut = jobs_cut(actions, obs)
    if not cut or allow_cut_jobs:
        return None
    step = 'replacement' if 'remove' in actions and 'create' in actions else \
        'restart' if 'restart' in actions else 'removal' if 'remove' in actions else 'stop'
    return ('Refused, nothing changed: the %s of %s would cut %d job%s attached to it (%s: their tunnels drop). '
            'Set %s (allow_cut_jobs) to consent, or wait until they end.'
            % (step, obs['name'], cut, '' if cut == 1 else 's', ', '.join(obs['job_networks']), variable))


def reattach_networks(obs, upstream):
    """The networks a replaced proxy joins again: every one it was on but the upstream (made with it)."""
    return [n for n in obs['networks'] if n != upstream and n not in ('bridge', 'host', 'none')]


class ProxyManager(object):
    def __init__(self, client, spec, check_mode=False):
        self.client = client
        self.spec = spec
        self.check_mode = check_mode
        self.actions = []
        self.messages = []
        self.warnings = []

    # --- inspection --------------------------------------------------------
    def container(self):
        return dc.get_container(self.client, self.spec['name'])

    def image_id(self):
        image = dc.get_image(self.client, self.spec['image'])
        return image.id if image else None

    def missing_sources(self):
        return [src for src, _dst in self.spec['mounts'] if not os.path.isfile(src)]

    # --- actions -----------------------------------------------------------
    def ensure_network(self, internal=False):
        net = dc.get_network(self.client, self.spec['network'])
        if net is not None:
            is_internal = bool((net.attrs or {}).get('Internal'))
            if is_internal != bool(internal):
                self.warnings.append(
                    'network %s already exists and is %s, but network_internal is %s; it is used as it is. '
                    '%s' % (self.spec['network'], 'internal (no route out)' if is_internal else 'not internal',
                            bool(internal),
                            'Jobs will reach nothing: remove the network (docker network rm) after removing '
                            'the proxy, and rerun.' if is_internal else
                            'Remove it and rerun if you want an internal upstream.'))
            return False
        self.actions.append('create network %s%s' % (self.spec['network'], ' (internal)' if internal else ''))
        if not self.check_mode:
            try:
                self.client.networks.create(self.spec['network'], driver='bridge', internal=internal,
                                            labels={LABEL_NETWORK_ROLE: 'upstream'})
            except Exception as exc:
                raise ProxyError('Creating network %s failed: %s' % (self.spec['network'], dc.api_message(exc)))
        return True

    def _create(self):
        from docker.types import LogConfig, Mount, Ulimit
        spec = self.spec
        kwargs = create_kwargs(spec)
        kwargs['mounts'] = [Mount(target=dst, source=src, type='bind', read_only=True) for src, dst in spec['mounts']]
        kwargs['ulimits'] = [Ulimit(name=u['name'], soft=u['soft'], hard=u['hard']) for u in spec['ulimits']]
        kwargs['log_config'] = LogConfig(type=spec['log_config']['type'], config=spec['log_config']['config'])
        image = kwargs.pop('image')
        try:
            return self.client.containers.create(image, **kwargs)
        except Exception as exc:
            raise ProxyError('Creating container %s failed: %s' % (spec['name'], dc.api_message(exc)))

    def apply(self, actions, container, old_networks):
        for action in actions:
            self.actions.append(action)
            if self.check_mode:
                continue
            try:
                if action == 'remove':
                    container.remove(force=True)
                    container = None
                elif action == 'create':
                    container = self._create()
                elif action == 'start':
                    container.start()
                elif action == 'stop':
                    container.stop(timeout=10)
                elif action == 'restart':
                    container.restart(timeout=10)
                elif action == 'unpause':
                    container.unpause()
                elif action == 'reconnect':
                    for net_name in old_networks:
                        kind = 'job network' if is_job_network(net_name) else 'network'
                        net = dc.get_network(self.client, net_name)
                        if net is None:
                            self.messages.append('%s %s is gone; not reconnected' % (kind, net_name))
                            continue
                        net.connect(container)
                        self.messages.append('reconnected %s %s' % (kind, net_name))
                elif action == 'reconfigure':
                    reconfigure(container)
            except ProxyError:
                raise
            except dc.EngineError as exc:
                raise ProxyError(str(exc))
            except Exception as exc:
                raise ProxyError('%s of %s failed: %s' % (action, self.spec['name'], dc.api_message(exc)))
        return container

    def wait_healthy(self, container, timeout):
        """Wait (bounded) until the health check passes; return the last status."""
        deadline = time.monotonic() + timeout
        status = None
        while True:
            container.reload()
            state = container.attrs.get('State') or {}
            status = (state.get('Health') or {}).get('Status')
            if status == 'healthy':
                return status
            if not state.get('Running') and state.get('Status') in ('exited', 'dead'):
                return state.get('Status')
            if time.monotonic() >= deadline:
                return status
            time.sleep(0.5)


def logs_tail(container, lines=20):
    try:
        data = container.logs(tail=lines)
        return data.decode('utf-8', 'replace') if isinstance(data, bytes) else str(data)
    except Exception:  # best effort, only for error messages
        return ''


def hosts_address(hosts_text, name='host.docker.internal'):
    """The address ``name`` has in an /etc/hosts text, or None."""
    for line in (hosts_text or '').splitlines():
        words = line.split('#', 1)[0].split()
        if len(words) >= 2 and name in words[1:]:
            return words[0]
    return None


def gateways(client, container):
    """(gateways of every network the proxy is on, host-gateway address) from the daemon.

    The host-gateway address is what ``host.docker.internal`` is in the
    proxy's own /etc/hosts; without a running proxy, the default bridge's
    gateway (which is what Docker maps host-gateway to unless configured).
    """
    found = set()
    host_gateway = None
    if container is not None:
        container.reload()
        for settings in ((container.attrs.get('NetworkSettings') or {}).get('Networks') or {}).values():
            for key in ('Gateway', 'IPv6Gateway'):
                if settings.get(key):
                    found.add(settings[key])
        if (container.attrs.get('State') or {}).get('Running'):
            rc, out = dc.exec_in(container, ['cat', '/etc/hosts'])
            if rc == 0:
                host_gateway = hosts_address(out)
    if host_gateway is None:
        bridge = dc.get_network(client, 'bridge')
        for config in (((bridge.attrs or {}).get('IPAM') or {}).get('Config') or []) if bridge else []:
            if config.get('Gateway') and ':' not in config['Gateway']:
                host_gateway = config['Gateway']
                break
    return sorted(found), host_gateway
