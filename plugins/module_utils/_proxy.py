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


def is_job_network(name):
    return name.startswith(JOB_NETWORK_PREFIX) and name.endswith(JOB_NETWORK_SUFFIX) and \
        len(name) > len(JOB_NETWORK_PREFIX) + len(JOB_NETWORK_SUFFIX)


def desired_spec(image, rules, allowlist, endpoints, network=UPSTREAM_NETWORK, name=PROXY_NAME,
                 extra_hosts=None, health_interval=5, mount_endpoints=True):
    mounts = [(os.path.realpath(rules), _rules.CONTAINER_RULES),
              (os.path.realpath(allowlist), _rules.CONTAINER_ALLOWLIST)]
    if mount_endpoints:
        mounts.append((os.path.realpath(endpoints), _rules.CONTAINER_ENDPOINTS))
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
    return dict(
        id=attrs.get('Id'),
        name=(attrs.get('Name') or '').lstrip('/'),
        image_id=attrs.get('Image'),
        status=state.get('Status'),
        running=bool(state.get('Running')),
        paused=bool(state.get('Paused')),
        health=health,
        mounts=mounts,
        networks=sorted(nets.keys()),
        job_networks=sorted(n for n in nets if is_job_network(n)),
        restart_policy=(host.get('RestartPolicy') or {}).get('Name') or 'no',
        extra_hosts=sorted(host.get('ExtraHosts') or []),
        published_ports=published,
        healthcheck=(config.get('Healthcheck') or {}).get('Test'),
        labels=config.get('Labels') or {},
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


def differences(spec, obs, image_id):
    """Human-readable list of what differs between the wanted and the running shape."""
    diffs = []
    if image_id and obs['image_id'] != image_id:
        diffs.append('image: running %s, wanted %s (%s)' % (obs['image_id'], image_id, spec['image']))
    wanted = sorted((src, dst) for src, dst in spec['mounts'])
    have = sorted((m['source'], m['destination']) for m in obs['mounts'] if m['type'] == 'bind')
    if wanted != have:
        diffs.append('mounts: running %s, wanted %s' % (have, wanted))
    writable = [m['destination'] for m in obs['mounts'] if m['rw']]
    if writable:
        diffs.append('mounts: %s mounted read-write, wanted read-only' % ', '.join(writable))
    if spec['network'] not in obs['networks']:
        diffs.append('networks: not on %s' % spec['network'])
    if obs['restart_policy'] != spec['restart_policy']:
        diffs.append('restart policy: running %s, wanted %s' % (obs['restart_policy'], spec['restart_policy']))
    if obs['extra_hosts'] != spec['extra_hosts']:
        diffs.append('extra hosts: running %s, wanted %s' % (obs['extra_hosts'], spec['extra_hosts']))
    if obs['published_ports']:
        diffs.append('published ports: %s (the proxy publishes none)' % ', '.join(obs['published_ports']))
    if obs['healthcheck'] != spec['healthcheck']['test']:
        diffs.append('health check: running %s, wanted %s' % (obs['healthcheck'], spec['healthcheck']['test']))
    return diffs


# A copy of the allowlist as squid last read it, kept inside the container (its /tmp survives a
# container restart, so a stale copy only ever causes one extra, harmless reconfigure).
LOADED_ALLOWLIST = '/tmp/pi-egress-loaded-allowlist.conf'


def allowlist_check_cmd():
    """Exit 0 when the mounted allowlist is what squid last read, 1 when it changed, 2 when unknown."""
    return ['cmp', '-s', LOADED_ALLOWLIST, _rules.CONTAINER_ALLOWLIST]


def allowlist_record_cmd():
    return ['cp', _rules.CONTAINER_ALLOWLIST, LOADED_ALLOWLIST]


def decide(state, obs, diffs, allowlist_changed=False):
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
    if fresh and obs and obs['job_networks']:
        actions.append('reconnect')
    reread = state == 'reloaded' or (state in ('present', 'started') and allowlist_changed)
    if reread and not fresh and running:
        actions.append('reconfigure')
    return actions


class ProxyManager(object):
    def __init__(self, client, spec, check_mode=False):
        self.client = client
        self.spec = spec
        self.check_mode = check_mode
        self.actions = []
        self.messages = []

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
                self.messages.append(
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
        from docker.types import Mount
        spec = self.spec
        mounts = [Mount(target=dst, source=src, type='bind', read_only=True) for src, dst in spec['mounts']]
        try:
            return self.client.containers.create(
                spec['image'], name=spec['name'], detach=True,
                restart_policy={'Name': spec['restart_policy']},
                extra_hosts=spec['extra_hosts'], mounts=mounts, network=spec['network'],
                labels=spec['labels'], healthcheck=spec['healthcheck'],
                security_opt=['no-new-privileges:true'])
        except Exception as exc:
            raise ProxyError('Creating container %s failed: %s' % (spec['name'], dc.api_message(exc)))

    def apply(self, actions, container, old_job_networks):
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
                    for net_name in old_job_networks:
                        net = dc.get_network(self.client, net_name)
                        if net is None:
                            self.messages.append('job network %s is gone; not reconnected' % net_name)
                            continue
                        net.connect(container)
                        self.messages.append('reconnected job network %s' % net_name)
                elif action == 'reconfigure':
                    rc, out = dc.exec_in(container, ['squid', '-k', 'reconfigure', '-f', _rules.CONTAINER_RULES])
                    if rc != 0:
                        raise ProxyError('squid -k reconfigure exited %s: %s' % (rc, out.strip()))
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
