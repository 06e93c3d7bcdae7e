# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""Job networks: the garbage collector (the sweep of networks a dead worker left behind).

:func:`decide_sweep` is the pure decision for one network (the table in
docs/job-networks.md, unit-tested row by row); :func:`members_of` reads
what is on a network from the container list; :func:`sweep` lists, decides
and removes over the daemon; :func:`sweep_lines` reports a sweep's result.
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import credentials as _jobcreds
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import transparent as _transparent
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy.gateway import GATEWAY_NAME
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import lock as _jobnet_lock
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import shards as _shards
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import shard_clone as _shard_clone
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common.docker_client import EngineError
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets.engine import (
    as_engine_error,
    client_memo,
    disconnect,
    remove_network,
    status_404,
    summary_name,
)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets.names import (
    CONTAINER_PREFIX,
    LABEL_CREATED,
    LABEL_JOB_ID,
    NETWORK_PREFIX,
    NETWORK_SUFFIX,
    JobNetError,
    job_id_from_network_name,
    looks_like_job_network,
    network_name,
    parse_time,
    validate_id_prefix,
)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy.spec import PROXY_NAME

# --------------------------------------------------------------------------
# The decision for one network (pure)
# --------------------------------------------------------------------------

KEEP_REASONS = {
    'job-id-invalid': 'the name looks like a job network but the id in it is not a valid job id',
    'foreign-labels': 'the network carries labels, none of them ours',
    'label-mismatch': "our job-id label names another job than the network's name",
    'age-unknown': 'a minimum age is set and the creation time cannot be read',
    'too-young': 'younger than the minimum age: a job may be setting it up right now',
    'job-running': "the job's container is running (or paused, or restarting) on it",
    'member-running': 'a container other than the proxy and the job is running on it',
    'job-created': "the job's container is created and not started: it would lose its network",
    'job-stopped': "the job's container is stopped (exited or dead) and remove_exited_jobs is off: "
                   "it would lose its network",
    'member-stopped': 'a container other than the proxy is stopped or created on it: it would lose its network',
    'member-removing': 'a container on it is being removed right now; the next sweep takes it',
}

LIVE_STATES = ('running', 'paused', 'restarting')
OVER_STATES = ('exited', 'dead')
MISSING = 'missing'  # an endpoint whose container no longer exists (stale)

# Precedence when several members each keep the network.
_KEEP_ORDER = ('job-running', 'member-running', 'job-created', 'job-stopped', 'member-stopped',
               'member-removing')


class SweepDecision(object):
    """``action`` is 'remove', 'keep' or None (not a candidate)."""

    def __init__(self, action: Optional[str], job_id: Optional[str] = None, reason: Optional[str] = None,
                 detach: Optional[Iterable[str]] = None, remove_containers: Optional[Iterable[str]] = None) -> None:
        self.action = action
        self.job_id = job_id
        self.reason = reason
        self.detach = list(detach or [])
        self.remove_containers = list(remove_containers or [])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SweepDecision) and self.__dict__ == other.__dict__

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __repr__(self) -> str:
        return 'SweepDecision(%r)' % (self.__dict__,)


def decide_sweep(name: str, labels: Optional[Dict[str, str]], created: Optional[float],
                 members: Optional[Sequence[Dict[str, Any]]], now: float, min_age: float = 0,
                 proxy_name: str = PROXY_NAME, remove_exited_jobs: bool = False, id_prefix: str = '',
                 gateway_name: str = GATEWAY_NAME) -> SweepDecision:
    """What the sweep does with one network. Pure.

    ``labels``: the network's labels; ``created``: epoch seconds or None;
    ``members``: [{'name': ..., 'state': ...}] for every container configured
    on it (``state`` as docker says, or 'missing' for a stale endpoint);
    ``now``: epoch seconds. ``id_prefix`` limits the sweep to job ids that
    start with it (tests and shared daemons). The gateway ``gateway_name`` of
    a transparent network is detached like the proxy.
    """
    if not looks_like_job_network(name):
        return SweepDecision(None)
    job_id = job_id_from_network_name(name)
    if job_id is None:
        raw = name[len(NETWORK_PREFIX):-len(NETWORK_SUFFIX)]
        if id_prefix and not raw.startswith(id_prefix):
            return SweepDecision(None)
        return SweepDecision('keep', raw, 'job-id-invalid')
    if id_prefix and not job_id.startswith(id_prefix):
        return SweepDecision(None)
    labels = labels or {}
    if LABEL_JOB_ID in labels:
        if labels[LABEL_JOB_ID] != job_id:
            return SweepDecision('keep', job_id, 'label-mismatch')
    elif labels:
        return SweepDecision('keep', job_id, 'foreign-labels')
    if min_age and min_age > 0:
        if created is None:
            return SweepDecision('keep', job_id, 'age-unknown')
        if now - created < min_age:
            return SweepDecision('keep', job_id, 'too-young')
    job_container = CONTAINER_PREFIX + job_id
    reasons = set()
    detach = []
    remove_containers = []
    for member in members or []:
        mname = member.get('name')
        state = (member.get('state') or '').lower()
        if _shards.is_family_name(mname or '', proxy_name) or mname == gateway_name:
            detach.append(mname)
            continue
        is_job = mname == job_container
        if state in LIVE_STATES:
            reasons.add('job-running' if is_job else 'member-running')
        elif state == 'created':
            reasons.add('job-created' if is_job else 'member-stopped')
        elif state in OVER_STATES:
            if is_job and remove_exited_jobs:
                remove_containers.append(mname)
            else:
                reasons.add('job-stopped' if is_job else 'member-stopped')
        elif state == MISSING:
            detach.append(mname)
        else:  # 'removing' or anything docker adds later: do not guess
            reasons.add('member-removing')
    for reason in _KEEP_ORDER:
        if reason in reasons:
            return SweepDecision('keep', job_id, reason)
    return SweepDecision('remove', job_id, None, detach=sorted(set(detach)),
                         remove_containers=sorted(set(remove_containers)))


def members_of(net_attrs: Dict[str, Any], containers: Iterable[Dict[str, Any]]) -> List[Dict[str, str]]:
    """[{'name', 'state'}] on a network, from the container list and its inspect.

    A stopped or created container is configured on a network without being
    in the network's own ``Containers`` (which lists active endpoints only),
    so membership comes from each container's ``NetworkSettings``; an active
    endpoint with no container behind it is reported as 'missing'.
    """
    name = net_attrs.get('Name')
    net_id = net_attrs.get('Id')
    seen = set()
    out = []
    for summary in containers:
        nets = ((summary.get('NetworkSettings') or {}).get('Networks') or {})
        hit = name in nets or any((v or {}).get('NetworkID') == net_id for v in nets.values() if net_id)
        if hit:
            seen.add(summary.get('Id'))
            out.append(dict(name=summary_name(summary), state=(summary.get('State') or '').lower()))
    for cid, endpoint in (net_attrs.get('Containers') or {}).items():
        if cid not in seen:
            out.append(dict(name=(endpoint or {}).get('Name') or cid, state=MISSING))
    return sorted(out, key=lambda m: m['name'])


def _resolve_missing(client: Any, members: Iterable[Dict[str, str]]) -> List[Dict[str, str]]:
    """Re-read an active endpoint the container listing did not show.

    The containers are listed once, before the networks are inspected, so a
    job container started in between shows up only as an endpoint. Treating
    it as stale would detach a live job: ask the daemon about that one
    container instead (an extra inspect only in that rare case).
    """
    out = []
    for member in members:
        if member.get('state') == MISSING:
            try:
                info = client.api.inspect_container(member['name'])
                state = ((info.get('State') or {}).get('Status') or 'unknown').lower()
                member = dict(name=(info.get('Name') or member['name']).lstrip('/'), state=state)
            except Exception as exc:
                if not status_404(exc):
                    member = dict(member, state='unknown')
        out.append(member)
    return out


def network_created(net_attrs: Dict[str, Any]) -> Optional[float]:
    labels = net_attrs.get('Labels') or {}
    created = parse_time(labels.get(LABEL_CREATED))
    if created is None:
        created = parse_time(net_attrs.get('Created'))
    return created


# --------------------------------------------------------------------------
# The sweep over the daemon
# --------------------------------------------------------------------------

def sweep(client: Any, min_age: int = 300, remove_exited_jobs: bool = False, proxy_name: str = PROXY_NAME,
          id_prefix: str = '', check_mode: bool = False, now: Optional[float] = None,
          gateway_name: str = GATEWAY_NAME, credentials_dir: Optional[str] = None) -> Dict[str, Any]:
    """Collect job networks a dead worker left behind.

    Returns dict(removed=[...], kept=[...], failed=[...], changed=bool).
    Every candidate is in exactly one list: removed (with what was detached
    and which exited job containers were removed first; in check mode what
    would be), kept (a fixed reason from KEEP_REASONS and the members), or
    failed (the step and the daemon's message).

    ``credentials_dir`` (the deployment folder; docs/credentials.md): the credential placeholders of each
    removed network's job are forgotten, and so is any job's record older than ``min_age`` whose network
    is gone (``forgotten``: the job ids), so the interceptor refuses them from then on.

    Raises JobNetError for a bad ``id_prefix`` or ``min_age`` and
    EngineError / EngineUnavailable when the first listings fail; a failure
    on one network is reported in ``failed`` and the sweep goes on.
    """
    validate_id_prefix(id_prefix)
    try:
        min_age = int(min_age or 0)
    except (TypeError, ValueError):
        raise JobNetError('min_age %r is not a number of seconds; use e.g. 300.' % (min_age,))
    if min_age < 0:
        raise JobNetError('min_age %d is negative; use 0 (no minimum) or a number of seconds.' % min_age)
    try:
        nets = client.api.networks()
    except Exception as exc:
        raise as_engine_error('Listing networks failed', exc)
    candidates = [n for n in nets if looks_like_job_network(n.get('Name'))]
    if id_prefix:
        candidates = [n for n in candidates if n['Name'][len(NETWORK_PREFIX):].startswith(id_prefix)]
    result = dict(removed=[], kept=[], failed=[], changed=False, removed_shards=[], forgotten=[])
    if credentials_dir:
        _forget_orphans(credentials_dir, set(n.get('Name') for n in nets), min_age, result, check_mode, now)
    if not candidates:
        _sweep_shards(client, proxy_name, result, check_mode)
        return result
    try:
        containers = client.api.containers(all=True)
    except Exception as exc:
        raise as_engine_error('Listing containers failed', exc)
    now = time.time() if now is None else now
    for summary in sorted(candidates, key=lambda n: n['Name']):
        name = summary['Name']
        try:
            attrs = client.api.inspect_network(summary['Id'])
        except Exception as exc:
            if status_404(exc):
                continue  # removed meanwhile by its own worker: not ours to report
            result['failed'].append(dict(network=name, job_id=job_id_from_network_name(name), step='inspect',
                                         message=str(as_engine_error('docker network inspect %s' % name, exc)),
                                         done=[]))
            continue
        members = _resolve_missing(client, members_of(attrs, containers))
        decision = decide_sweep(name, attrs.get('Labels'), network_created(attrs), members, now, min_age,
                                proxy_name, remove_exited_jobs, id_prefix, gateway_name)
        if decision.action is None:
            continue
        if decision.action == 'keep':
            result['kept'].append(dict(network=name, job_id=decision.job_id, reason=decision.reason,
                                       members=members))
            continue
        entry = dict(network=name, job_id=decision.job_id, detached=list(decision.detach),
                     removed_containers=list(decision.remove_containers))
        if check_mode:
            result['removed'].append(entry)
            result['changed'] = True
            continue
        failure = _execute_removal(client, attrs['Id'], decision, gateway_name, name)
        if failure:
            step, message, done = failure
            result['failed'].append(dict(network=name, job_id=decision.job_id, step=step, message=message,
                                         done=done))
            result['changed'] = result['changed'] or bool(done)
        else:
            result['removed'].append(entry)
            result['changed'] = True
            if _jobcreds.forget(credentials_dir, decision.job_id):
                result['forgotten'].append(decision.job_id)
    _sweep_shards(client, proxy_name, result, check_mode)
    return result


def _forget_orphans(credentials_dir: str, networks: Set[str], min_age: int, result: Dict[str, Any],
                    check_mode: bool, now: Optional[float]) -> None:
    """Forget the placeholder records older than ``min_age`` whose job network is gone."""
    folder = _jobcreds.jobs_dir(credentials_dir)
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith('.json') and not n.startswith('.'))
    except OSError:
        return
    now = time.time() if now is None else now
    for entry in names:
        job_id = entry[:-len('.json')]
        if network_name(job_id) in networks:
            continue
        try:
            if now - os.stat(os.path.join(folder, entry)).st_mtime < min_age:
                continue
        except OSError:
            continue
        if _jobcreds.forget(credentials_dir, job_id, check_mode):
            result['forgotten'].append(job_id)
            result['changed'] = True


def _sweep_shards(client: Any, proxy_name: str, result: Dict[str, Any], check_mode: bool) -> None:
    """Remove the proxy's shards that carry no job network any more (after the networks went).

    Under the daemon's job-network lock (_jobnet_lock), so a create on this host never attaches a
    job to a shard the sweep is removing.
    """
    if check_mode:
        _sweep_shards_held(client, proxy_name, result, True, None)
        return
    memo = client_memo(client)
    memo.clear()  # what create remembers of the subnets and the shards: read it afresh
    try:
        with _jobnet_lock.held(client, memo) as lock:
            _sweep_shards_held(client, proxy_name, result, False, lock)
    except EngineError as exc:
        result['failed'].append(dict(network=None, job_id=None, step='lock', message=str(exc), done=[]))


def _sweep_shards_held(client: Any, proxy_name: str, result: Dict[str, Any], check_mode: bool,
                       lock: Optional[_jobnet_lock.Held]) -> None:
    try:
        family = _shards.members(client, proxy_name)
    except EngineError as exc:
        result['failed'].append(dict(network=None, job_id=None, step='list-shards', message=str(exc), done=[]))
        return
    for member in family:
        if not member.is_shard or member.load:
            continue
        if check_mode:
            result['removed_shards'].append(member.name)
            result['changed'] = True
            continue
        try:
            if _shard_clone.remove_if_empty(client, proxy_name, member.name):
                result['removed_shards'].append(member.name)
                result['changed'] = True
                lock.changed()
        except EngineError as exc:
            result['failed'].append(dict(network=None, job_id=None, step='remove-shard %s' % member.name,
                                         message=str(exc), done=[]))


def _execute_removal(client: Any, net_id: str, decision: SweepDecision, gateway_name: str = GATEWAY_NAME,
                     net_name: str = '') -> Optional[Tuple[str, str, List[str]]]:
    """None on success, else (step, daemon message, actions already done)."""
    done = []
    for cname in decision.remove_containers:
        try:
            client.api.remove_container(cname)
            done.append('removed container %s' % cname)
        except Exception as exc:
            if not status_404(exc):
                return ('remove-container %s' % cname, str(as_engine_error('docker rm %s' % cname, exc)), done)
    for member in decision.detach:
        if member == gateway_name and net_name:
            try:
                _transparent.forget(client, gateway_name, net_name)
            except EngineError:
                pass  # a stopped gateway forgets the network at its next start
        try:
            if disconnect(client, member, net_id):
                done.append('detached %s' % member)
        except EngineError as exc:
            return ('detach %s' % member, str(exc), done)
    try:
        remove_network(client, net_id)
    except EngineError as exc:
        return ('remove-network', str(exc), done)
    return None


# --------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------

def sweep_lines(result: Dict[str, Any], check_mode: bool = False) -> List[str]:
    """One line per network of a :func:`sweep` result (removed, kept, failed)."""
    verb = 'would remove' if check_mode else 'removed'
    lines = []
    for entry in result.get('removed', []):
        extra = []
        if entry.get('removed_containers'):
            extra.append('removing %s' % ', '.join(entry['removed_containers']))
        if entry.get('detached'):
            extra.append('detaching %s' % ', '.join(entry['detached']))
        lines.append('%s %s%s' % (verb, entry['network'], ' (after %s)' % ' and '.join(extra) if extra else ''))
    for entry in result.get('kept', []):
        lines.append('kept %s: %s (%s)' % (entry['network'], entry['reason'],
                                           KEEP_REASONS.get(entry['reason'], entry['reason'])))
    for name in result.get('removed_shards', []):
        lines.append('%s the empty proxy shard %s' % (verb, name))
    for job_id in result.get('forgotten', []):
        lines.append('%s the credential placeholders of %s' % ('would forget' if check_mode else 'forgot', job_id))
    for entry in result.get('failed', []):
        lines.append('failed %s at %s: %s' % (entry['network'] or 'the proxy shards', entry['step'], entry['message']))
    return lines
