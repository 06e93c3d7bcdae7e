# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The proxy container's lifecycle: the decision and the actions.

The one owner of the proxy container. :func:`decide` is pure (it takes the
observed container and the differences from ``spec.py``), so the
decision table is unit-tested without a daemon; :class:`ProxyManager`
applies a decision through the Docker SDK, and reloads only through
:func:`reload.reload`. The shape lives in ``_proxy/spec.py`` and the reload path in
``_proxy/reload.py``; callers import each name from the file that defines it.
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import venue as _venue
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import reload as _reload
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import rootless as _rootless
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import shard_clone as _shard_clone
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy.spec import (
    CREDENTIALS_NETWORK, LABEL_NETWORK_ROLE, PROXY_UID, UPSTREAM_NETWORK, ProxyError, create_kwargs, is_job_network)

STATES = ('present', 'started', 'stopped', 'absent', 'restarted', 'reloaded')


def decide(state: str, obs: Optional[Dict[str, Any]], diffs: Sequence[str], allowlist_changed: bool = False,
           upstream: str = UPSTREAM_NETWORK) -> List[str]:
    """The ordered actions for ``state`` given the observed container (or None).

    ``allowlist_changed``: the running squid read another allowlist than the
    file it mounts now (a hand edit); started/present then reconfigure it,
    which re-reads the allowlist without cutting any job's tunnel.
    """
    if state == 'absent':
        return ['remove'] if obs else []
    actions: List[str] = []
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


def jobs_cut(actions: Iterable[str], obs: Optional[Dict[str, Any]]) -> int:
    """How many attached job networks ``actions`` would cut (0 for a stopped or missing proxy)."""
    if not obs or not (obs['running'] or obs['paused']):
        return 0
    if not set(actions) & set(CUTTING_ACTIONS):
        return 0
    return len(obs['job_networks'])


def consent_refusal(actions: Sequence[str], obs: Optional[Dict[str, Any]], allow_cut_jobs: bool,
                    variable: str = 'egress_proxy_allow_cut_jobs') -> Optional[str]:
    """None when ``actions`` may go ahead, else the refusal (the same rule as the upgrade's)."""
    cut = jobs_cut(actions, obs)
    if not cut or allow_cut_jobs:
        return None
    step = 'replacement' if 'remove' in actions and 'create' in actions else \
        'restart' if 'restart' in actions else 'removal' if 'remove' in actions else 'stop'
    return ('Refused, nothing changed: the %s of %s would cut %d job%s attached to it (%s: their tunnels drop). '
            'Set %s (allow_cut_jobs) to consent, or wait until they end.'
            % (step, obs['name'], cut, '' if cut == 1 else 's', ', '.join(obs['job_networks']), variable))


def shard_consent_refusal(plan: Iterable[Tuple[Any, str]], allow_cut_jobs: bool,
                          variable: str = 'egress_proxy_allow_cut_jobs') -> Optional[str]:
    """None when the shards may follow the proxy, else the refusal: each shard's jobs count
    (``shard_clone.follow_plan``)."""
    cutting = [(member, step) for member, step in plan if step in _shard_clone.CUTTING and member.load]
    if not cutting or allow_cut_jobs:
        return None
    cut = sum(member.load for member, _step in cutting)
    return ('Refused, nothing changed: following the proxy, %s would cut %d job%s attached to %s (their tunnels '
            'drop). Set %s (allow_cut_jobs) to consent, or wait until they end.'
            % (', '.join('%s (%s)' % (m.name, step) for m, step in cutting), cut, '' if cut == 1 else 's',
               'them' if len(cutting) > 1 else 'it', variable))


def reattach_networks(obs: Dict[str, Any], upstream: str, extra: Optional[Iterable[str]] = None) -> List[str]:
    """The networks a replaced proxy joins again: every one it was on but the upstream (made with it) and the
    credential interceptor's (joined at creation when the new shape wants it, ``extra_networks``)."""
    skip = ('bridge', 'host', 'none', CREDENTIALS_NETWORK) + tuple(extra or ())
    return [n for n in obs['networks'] if n != upstream and n not in skip]


# What a lifecycle action asks of the systemd unit that runs the proxy (egress_podman_units): the unit owns
# the container, so every step that makes, replaces, starts or ends it goes through systemctl; the others
# (unpause, reconnect, reconfigure) act on the running container as they do without a unit.
UNIT_VERBS = {'create': 'restart', 'start': 'restart', 'restart': 'restart', 'stop': 'stop', 'remove': 'stop'}


def unit_steps(actions: Sequence[str]) -> List[Tuple[str, Optional[str]]]:
    """(action, systemctl verb or None) for each action. The create's restart is the whole replacement: the
    remove before it and the start after it are folded into it (one restart, one new container)."""
    steps: List[Tuple[str, Optional[str]]] = []
    for index, action in enumerate(actions):
        folded = ((action == 'remove' and 'create' in actions[index + 1:])
                  or (action == 'start' and 'create' in actions[:index]))
        steps.append((action, None if folded else UNIT_VERBS.get(action)))
    return steps


class ProxyManager(object):
    def __init__(self, client: Any, spec: Dict[str, Any], check_mode: bool = False, unit: Optional[str] = None,
                 systemctl: Optional[Any] = None, journal: Optional[str] = None) -> None:
        """``unit``: the systemd unit that runs the proxy; ``systemctl(verb, unit)`` then makes, replaces,
        starts and ends the container (it raises ProxyError naming what failed); ``journal`` the command that
        shows the unit's log."""
        self.client = client
        self.spec = spec
        self.check_mode = check_mode
        self.unit = unit
        self.systemctl = systemctl
        self.journal = journal or 'journalctl -u %s' % unit
        self.actions: List[str] = []
        self.messages: List[str] = []
        self.warnings: List[str] = []

    # --- inspection --------------------------------------------------------
    def container(self) -> Any:
        return dc.get_container(self.client, self.spec['name'])

    def image_id(self) -> Optional[str]:
        image = dc.get_image(self.client, self.spec['image'])
        return image.id if image else None

    def missing_sources(self) -> List[str]:
        return [src for src, _dst in self.spec['mounts'] if not os.path.isfile(src)]

    # --- actions -----------------------------------------------------------
    def check_log_dir(self) -> None:
        """ProxyError when the decision log's folder cannot be used (a symlink, not a folder). Changes nothing."""
        if not self.spec.get('log_mount'):
            return
        path = self.spec['log_mount'][0]
        asked = self.spec.get('log_dir_asked') or path
        if os.path.islink(asked):
            raise ProxyError('%s (egress_decision_log_dir) is a symlink; the proxy mounts the folder it names '
                             'read-write. Name the real folder instead. Nothing was changed' % asked)
        if os.path.lexists(path) and not os.path.isdir(path):
            raise ProxyError('%s (egress_decision_log_dir) exists and is not a folder; move it away or name '
                             'another folder. Nothing was changed' % path)

    def proxy_owner(self) -> Tuple[int, int]:
        """The proxy user (squid's "proxy", uid and gid 13 in the container) as host ids: 13 and 13, or what a
        rootless engine maps them to (its account's subordinate ids, _proxy/rootless.py)."""
        ids = _rootless.engine_ids(self.client)
        if ids is None:
            return PROXY_UID, PROXY_UID
        uid, gid = ids.host_uid(PROXY_UID), ids.host_gid(PROXY_UID)
        if uid is None or gid is None:
            raise ProxyError('The rootless engine maps no host id to the proxy user (uid %d in the container): give '
                             'its account a subordinate range (/etc/subuid, /etc/subgid; podman system migrate). '
                             'Nothing was changed' % PROXY_UID)
        return uid, gid

    def ensure_log_dir(self) -> bool:
        """The decision log's host folder: made (0750, the proxy user's) when missing, given to the proxy user
        when it is someone else's. True when something was (or would be) done."""
        self.check_log_dir()
        if not self.spec.get('log_mount'):
            return False
        path = self.spec['log_mount'][0]
        uid, gid = self.proxy_owner()
        who = 'uid %d' % uid if uid == PROXY_UID else 'uid %d on this host' % uid
        if os.path.isdir(path):
            info = os.stat(path)
            if info.st_uid == uid:
                return False
            self.actions.append('give decision log folder %s to the proxy user (%s)' % (path, who))
            if not self.check_mode:
                os.chown(path, uid, gid)
            return True
        self.actions.append('create decision log folder %s%s' % (
            path, '' if uid == PROXY_UID else ' (the proxy user: %s)' % who))
        if not self.check_mode:
            os.makedirs(path, 0o750)
            os.chmod(path, 0o750)
            os.chown(path, uid, gid)
        return True

    def ensure_network(self, internal: bool = False) -> bool:
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

    def _create(self) -> Any:
        from docker.types import LogConfig, Mount, Ulimit
        spec = self.spec
        kwargs = create_kwargs(spec)
        kwargs['mounts'] = [Mount(target=dst, source=src, type='bind', read_only=True) for src, dst in spec['mounts']]
        if spec.get('log_mount'):
            src, dst = spec['log_mount']
            kwargs['mounts'].append(Mount(target=dst, source=src, type='bind', read_only=False))
        kwargs['ulimits'] = [Ulimit(name=u['name'], soft=u['soft'], hard=u['hard']) for u in spec['ulimits']]
        log_config = kwargs['log_config']
        kwargs['log_config'] = LogConfig(type=log_config['type'], config=log_config['config'])
        image = kwargs.pop('image')
        try:
            container = self.client.containers.create(image, **kwargs)
        except Exception as exc:
            raise ProxyError('Creating container %s failed: %s' % (spec['name'], dc.api_message(exc)))
        # Networks the proxy must be on before squid starts (the credential interceptor's: squid resolves
        # its cache_peer when it reads its configuration).
        for net_name in spec.get('extra_networks') or []:
            net = dc.get_network(self.client, net_name)
            if net is None:
                raise ProxyError('The network %s is missing: the proxy must be on it before it starts (the '
                                 'egress_credentials module makes it; docs/credentials.md).' % net_name)
            try:
                net.connect(container)
            except Exception as exc:
                raise ProxyError('Attaching %s to %s failed: %s' % (spec['name'], net_name, dc.api_message(exc)))
        return container

    def apply(self, actions: Iterable[str], container: Any, old_networks: Iterable[str]) -> Any:
        actions = list(actions)
        steps = unit_steps(actions) if self.unit else [(action, None) for action in actions]
        reconnected = False
        for action, verb in steps:
            self.actions.append(action)
            if self.check_mode or (self.unit and action in ('remove', 'start') and verb is None):
                continue  # folded into the create's restart of the unit
            try:
                if verb:
                    container = self._unit_step(verb)
                    if verb == 'restart' and container is not None:
                        # A unit's restart makes a new container: the job networks the old one had follow it.
                        self._reconnect(container, old_networks)
                        reconnected = True
                elif action == 'remove':
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
                    if not reconnected:
                        self._reconnect(container, old_networks)
                elif action == 'reconfigure':
                    _reload.reload_family(self.client, container)
            except ProxyError:
                raise
            except dc.EngineError as exc:
                raise ProxyError(str(exc))
            except Exception as exc:
                raise ProxyError('%s of %s failed: %s' % (action, self.spec['name'], dc.api_message(exc)))
        return container

    def _reconnect(self, container: Any, old_networks: Iterable[str]) -> None:
        for net_name in old_networks:
            kind = 'job network' if is_job_network(net_name) else 'network'
            net = dc.get_network(self.client, net_name)
            if net is None:
                self.messages.append('%s %s is gone; not reconnected' % (kind, net_name))
                continue
            net.connect(container)
            self.messages.append('reconnected %s %s' % (kind, net_name))

    def _unit_step(self, verb: str) -> Any:
        """``systemctl <verb> <unit>``; the container the unit runs afterwards (None after a stop)."""
        self.systemctl(verb, self.unit)
        self.messages.append('systemctl %s %s' % (verb, self.unit))
        if verb == 'stop':
            return None
        container = self.container()
        if container is None:
            raise ProxyError('systemctl restart %s succeeded, but no container %s runs; see %s'
                             % (self.unit, self.spec['name'], self.journal))
        return container

    def wait_healthy(self, container: Any, timeout: float) -> Optional[str]:
        """Wait (bounded) until the health check passes; return the last status."""
        deadline = time.monotonic() + timeout
        status = None
        while True:
            _venue.run_health_check(self.client, container.name)
            try:
                container.reload()
            except Exception as exc:
                if dc.is_not_found(exc):  # it exited and was removed (a unit runs it with --rm)
                    return 'removed'
                raise
            state = container.attrs.get('State') or {}
            status = (state.get('Health') or {}).get('Status')
            if status == 'healthy':
                return status
            if not state.get('Running') and state.get('Status') in ('exited', 'dead'):
                return state.get('Status')
            if time.monotonic() >= deadline:
                return status
            time.sleep(0.5)


def logs_tail(container: Any, lines: int = 20) -> str:
    try:
        data = container.logs(tail=lines)
        return data.decode('utf-8', 'replace') if isinstance(data, bytes) else str(data)
    except Exception:  # best effort, only for error messages
        return ''


def hosts_address(hosts_text: Optional[str], name: str = 'host.docker.internal') -> Optional[str]:
    """The address ``name`` has in an /etc/hosts text, or None."""
    for line in (hosts_text or '').splitlines():
        words = line.split('#', 1)[0].split()
        if len(words) >= 2 and name in words[1:]:
            return words[0]
    return None


def gateways(client: Any, container: Any) -> Tuple[List[str], Optional[str]]:
    """(gateways of every network the proxy is on, host-gateway address) from the daemon.

    The host-gateway address is what the engine's name for the host (``host.docker.internal``,
    Podman's ``host.containers.internal``) is in the proxy's own /etc/hosts; without a running
    proxy, the default bridge's gateway (which is what Docker maps host-gateway to unless
    configured).
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
                # host.docker.internal on Docker, host.containers.internal on Podman (_common/venue.py)
                host_gateway = hosts_address(out, _venue.venue(client).host_alias)
    if host_gateway is None:
        bridge = dc.get_network(client, 'bridge')
        for config in (((bridge.attrs or {}).get('IPAM') or {}).get('Config') or []) if bridge else []:
            if config.get('Gateway') and ':' not in config['Gateway']:
                host_gateway = config['Gateway']
                break
    return sorted(found), host_gateway
