# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The doctor's sweep: what killed earlier doctor runs left behind, removed or reported.

A network with a doctor name (``_doctor_names``) whose pid is no longer alive on
this host is swept: its probes are removed (the stopped ones too, found by
name), whatever else is on it is detached, then the network is removed. A probe
that cannot be removed keeps its network (the only handle left on it). On a
daemon that is not on this host a leftover is only reported, and in check mode
nothing is swept. The decisions (:func:`plan_leftover`, :func:`split_attached`,
:func:`sweep_line`, ...) are pure; :class:`SweepCheck` makes the daemon calls.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import rootless as _rootless
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.context import Check, DoctorContext
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.lines import Line
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.names import (
    ISOLATION_NET_PREFIX, ISOLATION_NET_RE, NETWORK_PREFIX, PEERS, PROBE_PREFIX, daemon_locality, network_shard,
    parse_doctor_network, peer_name, pid_alive, probe_pid, probe_shard)


# --- the leftover sweep: pure decisions ---------------------------------------------------

def plan_leftover(name: Optional[str], own_pid: int, alive: bool, local: bool) -> str:
    """What to do with a network found under the canary's prefix.

    Returns one of: ``ignore`` (not exactly a canary name, or this run's own),
    ``live`` (its pid is alive: another doctor is running; leave it alone),
    ``remote`` (the daemon is not on this host: report, never sweep),
    ``sweep``.
    """
    pid = parse_doctor_network(name)
    if pid is None or pid == own_pid:
        return 'ignore'
    if not local:
        return 'remote'
    if alive:
        return 'live'
    return 'sweep'


def probe_of_network(probe: str, net: Optional[str], pid: int) -> bool:
    """Whether a (possibly stopped) probe container named for ``pid`` belongs on ``net``.

    An isolation network holds only its own peer; a shard's canary network
    (``...-doctor-<pid>-shard-<n>``) only the probes through that shard; the
    canary network every other probe of that pid.
    """
    if probe_pid(probe) != pid:
        return False
    match = ISOLATION_NET_RE.fullmatch(net or '')
    if match:
        return probe.lstrip('/') == peer_name(match.group(2), pid)
    shard = network_shard(net)
    if shard is not None:
        return probe_shard(probe) == shard
    return probe.lstrip('/') not in set(peer_name(peer, pid) for peer in PEERS) and probe_shard(probe) is None


def split_attached(attached: Iterable[str], pid: int) -> Tuple[List[str], List[str]]:
    """Split the names attached to ``pi-dispatch-egress-doctor-<pid>`` into (probes, others)."""
    probes, others = [], []
    for name in attached:
        name = name.lstrip('/')
        (probes if probe_pid(name) == pid else others).append(name)
    return sorted(probes), sorted(others)


def _names(items: Sequence[str]) -> str:
    return ', '.join(items) if items else 'nothing'


def sweep_line(net: str, removed: Iterable[str] = (), detached: Iterable[str] = (), stuck: Optional[str] = None,
               rm_error: Optional[str] = None, net_gone: bool = False) -> Optional[Line]:
    """The one line a sweep of ``net`` produces (None when nothing happened to report).

    ``stuck``: a probe that could not be removed (the network is then kept and
    must not have been removed). ``rm_error``: the network removal failed.
    ``net_gone``: the daemon said the network was not there at removal time.
    """
    removed, detached = list(removed), list(detached)
    if stuck:
        return Line('leftovers.kept', 'warn',
                    'Egress canary: %s is kept, because the probe %s could not be removed and the network is the '
                    'only way left to find it: docker rm -f %s' % (net, stuck, stuck),
                    fix='docker rm -f %s, then re-run doctor' % stuck)
    if rm_error:
        return Line('leftovers.rm_failed', 'warn',
                    'Egress canary: the network %s could not be removed: docker network rm %s (%s)'
                    % (net, net, rm_error),
                    fix='docker network rm %s; if it has active endpoints, docker network inspect %s first and '
                        'remove what is on it' % (net, net))
    if net_gone:
        if not removed and not detached:
            return None
        parts = []
        if removed:
            parts.append('removed %s' % ', '.join(removed))
        if detached:
            parts.append('detached %s' % ', '.join(detached))
        return Line('leftovers.gone', 'ok',
                    'Egress canary: %s on %s, left by an EARLIER doctor run; the network itself is gone'
                    % (' and '.join(parts), net),
                    fix=('reattach %s to the network it belongs to' % ', '.join(detached)) if detached else None)
    return Line('leftovers.removed', 'ok',
                'Egress canary: removed %s (after removing %s and detaching %s), left by an EARLIER doctor run'
                % (net, _names(removed), _names(detached)))


def remote_line(net: str, resolved: str) -> Line:
    return Line('leftovers.remote', 'warn',
                "Egress canary: %s may be left over from an EARLIER doctor run, and is not swept because this "
                "shell's docker CLI %s, so a pid that is dead here may be alive there" % (net, resolved),
                fix='check on the host that daemon belongs to, then docker network rm %s there' % net)


def unlisted_line(error: str) -> Line:
    return Line('leftovers.unlisted', 'warn',
                'Egress canary: leftovers from an EARLIER doctor run could not be listed: docker network ls '
                '--filter name=%s (%s)' % (NETWORK_PREFIX, error),
                fix='docker network ls --filter name=%s; a daemon that cannot list is usually the real problem'
                    % NETWORK_PREFIX)


def unreadable_line(net: str, error: str, command: str = 'docker network inspect %s') -> Line:
    """What is on ``net`` could not be read; ``command`` (with %s for the network) is the read that failed."""
    command = command % net
    return Line('leftovers.unreadable', 'warn',
                'Egress canary: the network %s could not be read: %s (%s)' % (net, command, error),
                fix='%s (do not skip to network rm: what is attached is exactly what is unknown)' % command)


MEMBERS_COMMAND = 'docker ps -a --filter network=%s'


def members(listed: Iterable[Mapping[str, Any]]) -> List[str]:
    """The names in a ``containers(all=True, filters={'network': net})`` answer (running, stopped or created)."""
    names = []
    for container in listed:
        found = [name.lstrip('/') for name in (container.get('Names') or []) if name]
        names.append(found[0] if found else str(container.get('Id') or '')[:12])
    return [name for name in names if name]


def would_sweep_line(net: str, probes: Sequence[str], others: Sequence[str]) -> Line:
    return Line('leftovers.would_sweep', 'warn',
                'Egress canary: %s would be removed (with %s, detaching %s), left by an EARLIER doctor run; check '
                'mode sweeps nothing' % (net, _names(probes), _names(others)),
                fix='run doctor without --check')


# --- the daemon side -------------------------------------------------------------------------------

def _sweep_one(ctx: DoctorContext, name: str, pid: int, all_probes: List[str]) -> Optional[Line]:
    try:
        attrs = ctx.client.api.inspect_network(name)
    except Exception as exc:
        if dc.is_not_found(exc):
            return None
        return unreadable_line(name, dc.api_message(exc))
    attached = [(c.get('Name') or cid) for cid, c in (attrs.get('Containers') or {}).items()]
    # Inspect lists running members only (Docker), or none at all (Podman 4.9 and later), while Podman refuses
    # to remove a network that a stopped or created container is still on: what is on it is read with a
    # filtered ps -a on every engine, so a stopped container is detached before the removal, never a surprise.
    try:
        attached += members(ctx.client.api.containers(all=True, filters={'network': name}))
    except Exception as exc:
        return unreadable_line(name, dc.api_message(exc), MEMBERS_COMMAND)
    probes, others = split_attached(sorted(set(name.lstrip('/') for name in attached)), pid)
    # Stopped probes are not listed as endpoints; their names still say whose they are.
    probes = sorted(set(probes) | set(p for p in all_probes if probe_of_network(p, name, pid)))
    if ctx.check_mode:
        return would_sweep_line(name, probes, others)
    removed, stuck = [], []
    for probe in probes:
        try:
            ctx.client.api.remove_container(probe, force=True)
            removed.append(probe)
            ctx.actions.append('removed leftover probe %s' % probe)
        except Exception as exc:
            if not dc.is_not_found(exc):
                stuck.append(probe)
    if stuck:
        # The network is the only handle on that probe: keep it, detach nothing.
        return sweep_line(name, removed=removed, stuck=stuck[0])
    detached = []
    for other in others:
        try:
            # rootless Podman 4: a keeper holds the account's network through the last running detach
            with _rootless.network_held(ctx.client, other, name, actions=ctx.actions):
                ctx.client.api.disconnect_container_from_network(other, name, force=True)
            detached.append(other)
            ctx.actions.append('detached %s from leftover %s' % (other, name))
        except Exception as exc:
            if not dc.is_not_found(exc):
                ctx.actions.append('detaching %s from %s failed: %s' % (other, name, dc.api_message(exc)))
    try:
        ctx.client.api.remove_network(name)
        ctx.actions.append('removed leftover network %s' % name)
    except Exception as exc:
        if dc.is_not_found(exc):
            return sweep_line(name, removed=removed, detached=detached, net_gone=True)
        return sweep_line(name, removed=removed, detached=detached, rm_error=dc.api_message(exc))
    return sweep_line(name, removed=removed, detached=detached)


class SweepCheck(Check):
    """The sweep's lines (none when ``ctx.sweep_enabled`` is false); ``alive`` judges a pid on this host."""

    def __init__(self, alive: Callable[[int], bool] = pid_alive) -> None:
        self.alive = alive

    def lines(self, ctx: DoctorContext) -> List[Line]:
        if not ctx.sweep_enabled:
            return []
        local, resolved = daemon_locality(ctx.docker_host, ctx.environ)
        lines = []
        try:
            nets = ctx.client.api.networks(filters={'name': NETWORK_PREFIX})
            nets += ctx.client.api.networks(filters={'name': ISOLATION_NET_PREFIX})
        except Exception as exc:
            return [unlisted_line(dc.api_message(exc))]
        try:
            all_probes = [c['Names'][0].lstrip('/') for c in
                          ctx.client.api.containers(all=True, filters={'name': PROBE_PREFIX})]
        except Exception:
            all_probes = []
        for net in sorted(nets, key=lambda n: n.get('Name') or ''):
            name = net.get('Name') or ''
            pid = parse_doctor_network(name)
            decision = plan_leftover(name, ctx.pid, self.alive(pid) if pid is not None else True, local)
            if decision in ('ignore', 'live'):
                continue
            if decision == 'remote':
                lines.append(remote_line(name, resolved))
                continue
            line = _sweep_one(ctx, name, pid, all_probes)
            if line is not None:
                lines.append(line)
        return lines
