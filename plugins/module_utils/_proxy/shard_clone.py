# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""Proxy shards made, removed and following the proxy: the clone and its readiness.

:func:`clone_spec` is the pure copy of the proxy's shape as a shard (``<proxy>-shard-<n>``, on the
proxy's upstream network, no job network); :func:`wait_ready` admits a new or restarted shard once
its health test passes; :func:`add_shard` and :func:`remove_if_empty` act. :func:`follow_plan` (pure)
and :func:`apply_plan` make the shards follow what egress_proxy does to the proxy. The family, the
bound and the choice are ``_proxy/shards.py``'s.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy.shards import (
    LABEL_SHARD_INDEX,
    LABEL_SHARD_OF,
    MAX_SHARDS,
    SHARD_ROLE,
    Member,
    ShardError,
    member_from_attrs,
    members,
    next_index,
    shard_index,
    shard_name,
)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy.spec import (
    ENV_DECISION_LOG_NAME,
    LABEL_ROLE,
    is_job_network,
)

# Seconds between a shard's Docker health checks (the proxy keeps egress_proxy_health_interval).
# Each check is a docker exec, so with the proxy's 5 s a host with 100 shards ran 20 a second, which
# slowed every job start on it (docs/job-networks.md, "What grows"). A new or restarted shard is not
# left to its first check: it is admitted once its health test passes, run here (:func:`wait_ready`).
SHARD_HEALTH_INTERVAL = 30
_NS = 1000 * 1000 * 1000
WAIT_HEALTHY = 60


_KEEP_HOST_CONFIG = ('Mounts', 'Binds', 'CapAdd', 'CapDrop', 'ReadonlyRootfs', 'Tmpfs', 'SecurityOpt', 'Sysctls',
                     'Memory', 'MemorySwap', 'PidsLimit', 'Ulimits', 'LogConfig', 'RestartPolicy', 'ExtraHosts',
                     'Privileged', 'Init', 'ShmSize', 'NanoCpus', 'CpuShares')


def upstream_networks(attrs: Dict[str, Any]) -> List[str]:
    """The proxy's networks that are not job networks (its upstream first), in a stable order."""
    nets = list(((attrs.get('NetworkSettings') or {}).get('Networks') or {}))
    mode = (attrs.get('HostConfig') or {}).get('NetworkMode')
    others = sorted(n for n in nets if not is_job_network(n))
    if mode in others:
        others.remove(mode)
        others.insert(0, mode)
    return others


def clone_spec(attrs: Dict[str, Any], proxy: str, index: int) -> Dict[str, Any]:
    """The create call of shard ``index`` from the proxy's inspect ``attrs``. Pure.

    Returns dict(name, image, command, entrypoint, environment, labels, healthcheck, user,
    host_config, networks): the same image id, command, environment, health check, mounts,
    capabilities, read-only root, tmpfs, sysctls, limits, log config and restart policy; the labels
    of the proxy plus the shard's own; on the proxy's upstream network(s), no job network. The
    health check is the proxy's test, run every SHARD_HEALTH_INTERVAL seconds (or the proxy's
    interval when that is longer).
    """
    config = attrs.get('Config') or {}
    host = attrs.get('HostConfig') or {}
    labels = dict(config.get('Labels') or {})
    labels[LABEL_ROLE] = SHARD_ROLE
    labels[LABEL_SHARD_OF] = proxy
    labels[LABEL_SHARD_INDEX] = str(index)
    host_config = dict((k, host[k]) for k in _KEEP_HOST_CONFIG if host.get(k) not in (None, [], {}))
    if 'Mounts' in host_config:
        host_config.pop('Binds', None)
        host_config['Mounts'] = [dict((k, v) for k, v in m.items() if v not in (None, {}, ''))
                                 for m in host_config['Mounts']]
    networks = upstream_networks(attrs)
    host_config['NetworkMode'] = networks[0] if networks else 'none'
    name = shard_name(proxy, index)
    # each member writes the decision log to a file of its own name (the image's decision-log program)
    environment = [('%s=%s' % (ENV_DECISION_LOG_NAME, name)) if item.startswith(ENV_DECISION_LOG_NAME + '=')
                   else item for item in config.get('Env') or []] or config.get('Env')
    return dict(name=name, image=attrs.get('Image') or config.get('Image'),
                command=config.get('Cmd'), entrypoint=config.get('Entrypoint'), environment=environment,
                labels=labels, healthcheck=shard_healthcheck(config.get('Healthcheck')),
                user=config.get('User') or None, host_config=host_config, networks=networks)


def shard_healthcheck(check: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The proxy's health check as a shard runs it: the same test, every SHARD_HEALTH_INTERVAL seconds
    at least. None or a disabled check is kept as it is. Pure."""
    if not check or not check.get('Test') or check['Test'][0] == 'NONE':
        return check
    out = dict(check)
    out['Interval'] = max(int(check.get('Interval') or 0), SHARD_HEALTH_INTERVAL * _NS)
    return out


def health_argv(test: Optional[Sequence[str]]) -> Optional[List[str]]:
    """The command of a Docker health test (``["CMD", ...]`` / ``["CMD-SHELL", "..."]``), else None. Pure."""
    if not test:
        return None
    if test[0] == 'CMD' and len(test) > 1:
        return list(test[1:])
    if test[0] == 'CMD-SHELL' and len(test) > 1:
        return ['/bin/sh', '-c', test[1]]
    return None


def _passes(client: Any, name: str, argv: List[str]) -> bool:
    """True when ``argv`` exits 0 in the running container ``name`` (one exec)."""
    try:
        exec_id = client.api.exec_create(name, argv, stdout=True, stderr=True)['Id']
        client.api.exec_start(exec_id)
        return client.api.exec_inspect(exec_id).get('ExitCode') == 0
    except Exception as exc:
        if dc.is_transient(exc):
            raise dc.engine_error('Running the health test in %s' % name, exc)
        return False  # not running (yet, or any more): the state read says which


def wait_ready(client: Any, name: str, timeout: float, sleep: Callable[[float], Any] = time.sleep,
               clock: Callable[[], float] = time.monotonic) -> Optional[str]:
    """Wait until the shard ``name`` serves: its health test (the proxy's) passes when run now.

    Returns 'healthy' (Docker said so, or the test passed), 'running' (no health test to run),
    the state it ended in ('exited', 'dead'), or the last status at ``timeout``. Polls every half
    second, so a new shard is admitted when squid answers, not at its first scheduled check.
    """
    deadline = clock() + timeout
    status = None
    while True:
        attrs = dc.read('Inspecting container %s' % name, lambda: client.api.inspect_container(name))
        state = attrs.get('State') or {}
        status = (state.get('Health') or {}).get('Status') or state.get('Status')
        if state.get('Status') in ('exited', 'dead'):
            return state.get('Status')
        if status == 'healthy':
            return status
        if state.get('Status') == 'running':
            argv = health_argv(((attrs.get('Config') or {}).get('Healthcheck') or {}).get('Test'))
            if argv is None:
                return 'running'
            if _passes(client, name, argv):
                return 'healthy'
        if clock() >= deadline:
            return status
        sleep(0.5)


def add_shard(client: Any, proxy: str, family: Sequence[Member], wait_timeout: float = WAIT_HEALTHY) -> Member:
    """Start the next shard of ``proxy`` (a clone of it) and wait until it is healthy. Returns its Member.

    A name another process took meanwhile is taken as that process's shard (re-read, not made
    twice). Raises ShardError when the proxy cannot be read, more than MAX_SHARDS would exist, or
    the shard does not become healthy (it is removed again).
    """
    index = next_index(family)
    if index > MAX_SHARDS:
        raise ShardError('%s already has %d shards, the most this collection starts; raise the shard bound '
                         '(egress_proxy_shard_bound, or the create\'s shard_bound) or spread the jobs over more '
                         'hosts.' % (proxy, MAX_SHARDS))
    return _create_shard(client, proxy, index, wait_timeout)


def _create_shard(client: Any, proxy: str, index: int, wait_timeout: float = WAIT_HEALTHY) -> Member:
    attrs = dc.read('Inspecting container %s' % proxy, lambda: client.api.inspect_container(proxy))
    spec = clone_spec(attrs, proxy, index)
    name = spec['name']
    try:
        created = client.api.create_container(
            spec['image'], command=spec['command'], name=name, environment=spec['environment'],
            labels=spec['labels'], healthcheck=spec['healthcheck'], user=spec['user'],
            entrypoint=spec['entrypoint'], host_config=spec['host_config'])
    except Exception as exc:
        if dc.is_transient(exc):
            raise dc.engine_error('Creating the shard %s' % name, exc)
        if 'already in use' in dc.api_message(exc) or 'Conflict' in str(exc):
            found = [m for m in members(client, proxy) if m.name == name]
            if found:
                return found[0]
        raise ShardError('Creating the shard %s of %s failed: %s. Nothing is left of it.'
                         % (name, proxy, dc.api_message(exc)))
    try:
        for extra in spec['networks'][1:]:
            client.api.connect_container_to_network(created['Id'], extra)
        client.api.start(created['Id'])
        status = wait_ready(client, name, wait_timeout)
    except Exception as exc:
        _remove_quietly(client, name)
        raise ShardError('Starting the shard %s of %s failed: %s. It was removed again.'
                         % (name, proxy, dc.api_message(exc)))
    if status != 'healthy':
        _remove_quietly(client, name)
        raise ShardError('The shard %s of %s did not become healthy within %ss (last status: %s). It was '
                         'removed again; docker logs %s shows why the proxy itself would fail too.'
                         % (name, proxy, wait_timeout, status, proxy))
    attrs = dc.read('Inspecting container %s' % name, lambda: client.api.inspect_container(name))
    return member_from_attrs(attrs, index)


def _remove_quietly(client: Any, name: str) -> None:
    dc.remove_quietly(client.api, name)  # best effort: the caller reports the first failure


def remove_if_empty(client: Any, proxy: str, name: str) -> bool:
    """Remove shard ``name`` of ``proxy`` when it carries no job network. True when removed.

    Never the proxy itself, never a container that is not a shard of ``proxy``.
    """
    attrs = dc.read('Inspecting container %s' % name, lambda: client.api.inspect_container(name), missing=True)
    if attrs is None:
        return False
    index = shard_index((attrs.get('Config') or {}).get('Labels'), proxy)
    if index is None:
        return False
    if member_from_attrs(attrs, index).load:
        return False
    try:
        client.api.remove_container(attrs['Id'], force=True)
    except Exception as exc:
        if dc.is_not_found(exc):
            return False
        raise dc.engine_error('Removing the empty shard %s' % name, exc)
    return True


# --- following the proxy ------------------------------------------------------------
CUTTING = ('remove', 'replace', 'restart', 'stop')


def follow_plan(family: Iterable[Member], proxy_actions: Iterable[str]) -> List[Tuple[Member, str]]:
    """What each shard does after the proxy's ``proxy_actions`` (egress_proxy's decision). Pure.

    A shard is a copy of the proxy, so it follows it: the proxy removed (state absent) -> the
    shard removed; the proxy (re)created -> the shard replaced by a fresh copy of the new proxy
    (its job networks attached again); restarted -> restarted (it reads the refreshed rules);
    stopped -> stopped; started or unpaused -> a stopped shard started. A reconfigure reaches the
    shards through the reload path (_reload.reload_family). Returns [(Member, action)].
    """
    actions = list(proxy_actions)
    if 'remove' in actions and 'create' not in actions:
        step = 'remove'
    elif 'create' in actions:
        step = 'replace'
    elif 'restart' in actions:
        step = 'restart'
    elif 'stop' in actions:
        step = 'stop'
    elif 'start' in actions or 'unpause' in actions:
        step = 'start'
    else:
        step = None
    plan = []
    for member in family:
        if not member.is_shard or step is None:
            continue
        if step == 'start' and member.running:
            continue
        if step == 'stop' and member.state in ('exited', 'created', 'dead'):
            continue
        plan.append((member, step))
    return plan


def plan_jobs_cut(plan: Iterable[Tuple[Member, str]]) -> int:
    """Job networks the plan disconnects: every job of a shard that is removed, replaced, restarted or stopped."""
    return sum(member.load for member, step in plan if step in CUTTING)


def apply_plan(client: Any, proxy: str, plan: Iterable[Tuple[Member, str]], wait_timeout: float = WAIT_HEALTHY
               ) -> List[Dict[str, Any]]:
    """Carry out :func:`follow_plan` shard by shard. Returns [dict(name, action, jobs_cut, error)].

    A replaced shard cuts only its own jobs: its job networks are attached to the new copy again
    (with the proxy's alias) before the next shard is touched. A failure is reported for that
    shard and the others go on.
    """
    done = []
    for member, step in plan:
        entry = dict(name=member.name, action=step, jobs_cut=member.load if step in CUTTING else 0, error=None)
        try:
            if step == 'remove':
                client.api.remove_container(member.name, force=True)
            elif step == 'replace':
                client.api.remove_container(member.name, force=True)
                _create_shard(client, proxy, member.index, wait_timeout)
                for net in member.job_networks:
                    client.api.connect_container_to_network(member.name, net, aliases=[proxy])
            elif step == 'restart':
                client.api.restart(member.name, timeout=10)
                status = wait_ready(client, member.name, wait_timeout)
                if status != 'healthy':
                    raise ShardError('did not become healthy again within %ss (last status: %s)'
                                     % (wait_timeout, status))
            elif step == 'stop':
                client.api.stop(member.name, timeout=10)
            elif step == 'start':
                client.api.start(member.name)
        except Exception as exc:  # one shard's failure is reported; the others still follow
            entry['error'] = dc.api_message(exc)
        done.append(entry)
    return done
