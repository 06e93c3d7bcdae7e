# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The doctor and the proxy's shards: the family lines, and the canary through every running shard.

A shard (``_shards.py``) is a clone of the proxy that carries some of the job
networks, attached with the proxy's name as its network alias. The doctor
reports the family (:func:`family_lines`: one ``proxy.shards`` line, and a line
per shard that is not running or not healthy) and runs the canary's probes
through every running shard as well, each shard on a throwaway network of its
own, ``pi-dispatch-egress-doctor-<pid>-shard-<n>``, with the shard attached under
the alias ``<proxy>``: the probe dials the same name a job does. The lines of a
probe through a shard are the proxy's lines renamed (:func:`through_shard`: id
``canary.shard_<x>`` / ``endpoint.shard_<x>``, the shard named in the text).

Without shards nothing here adds a line: a single-proxy report is unchanged.
:class:`ShardsCheck` reads the family into the context; :func:`setup_lanes`
makes the shards' canary networks for ``canary.py``.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import shards as _shards
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import shard_clone as _shard_clone
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.context import Check, DoctorContext
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.lines import Line, shard_line_id, via_shard
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.names import (
    LABEL, NETWORK_PREFIX, shard_key, shard_network_name)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.probes import (
    ENDPOINT_PROBE_LABELS, PROBES, endpoint_notrun_line, notrun_line)

# How long the shards' canary networks may take to be created and attached (all at once) before
# a shard that is not ready is reported as not set up.
SHARD_SETUP_TIMEOUT = 30


# --- the family: pure ------------------------------------------------------------------------------

def _plural(count: int, word: str) -> str:
    return '%d %s%s' % (count, word, '' if count == 1 else 's')


def member_words(member: _shards.Member) -> str:
    """``<name> (running, healthy, 3 job networks)``; a member that is not running shows its state only."""
    if member.running:
        what = 'running, %s' % (member.health or 'no health check')
    else:
        what = member.state
    return '%s (%s, %s)' % (member.name, what, _plural(member.load, 'job network'))


def family_lines(proxy: str, family: Sequence[_shards.Member]) -> List[Line]:
    """The family line and one line per shard that is not running or not healthy; [] without shards. Pure.

    ``family``: ``_shards.members()`` (the proxy first when it exists, then the shards by index).
    """
    shards = [m for m in family if m.is_shard]
    if not shards:
        return []
    words = [member_words(m) for m in family]
    if family[0].is_shard:  # the proxy itself is missing (proxy.missing says so too)
        words.insert(0, '%s (missing)' % proxy)
    lines = [Line('proxy.shards', 'ok', 'Egress proxy family of %d, with state, health and job networks: %s'
                  % (len(words), '; '.join(words)))]
    for shard in shards:
        line = shard_line(shard)
        if line is not None:
            lines.append(line)
    return lines


def shard_line(shard: _shards.Member) -> Optional[Line]:
    """The line for one shard that is not running (✗, ⚠ when it carries no job) or not healthy; else None."""
    name = shard.name
    if not shard.running:
        start = ('docker unpause %s' if shard.state == 'paused' else 'docker start %s') % name
        if shard.load:
            return Line('proxy.shard_stopped', 'fail',
                        'Egress proxy shard stopped (%s is %s): the %s on it %s no egress, so %s refused'
                        % (name, shard.state, _plural(shard.load, 'job network'),
                           'has' if shard.load == 1 else 'have', 'its job is' if shard.load == 1 else 'their jobs are'),
                        fix='%s; docker logs --tail 50 %s says why it stopped' % (start, name))
        return Line('proxy.shard_stopped', 'warn',
                    'Egress proxy shard stopped (%s is %s): it carries no job network, so no job is cut and new '
                    'ones go to a running member' % (name, shard.state),
                    fix='%s, or docker rm %s (an empty shard is not needed; the next full member starts a new one)'
                        % (start, name))
    if shard.health == 'healthy':
        return None
    if shard.health == 'unhealthy':
        return Line('proxy.shard_health', 'fail',
                    'Egress proxy shard health: %s is unhealthy (squid does not answer its own health check)' % name,
                    fix='docker logs --tail 50 %s, then docker restart %s' % (name, name))
    if shard.health:
        return Line('proxy.shard_health', 'warn', 'Egress proxy shard health: %s is %s' % (name, shard.health),
                    fix='a shard is checked every %d s: wait that long and re-run doctor; docker inspect %s shows '
                        'the health log' % (_shard_clone.SHARD_HEALTH_INTERVAL, name))
    return Line('proxy.shard_health', 'warn',
                'Egress proxy shard health: %s is unchecked (no health check is configured)' % name,
                fix='docker rm -f %s once it carries no job network (a shard is a clone of the proxy, health '
                    'check included: recreate the proxy with ansible-playbook pi_dispatch.egress.site)' % name)


def shards_serving_line(proxy: str, serving: Sequence[_shards.Member]) -> Line:
    """The proxy is down while ``serving`` (running shards) still carry jobs: what that means. Pure."""
    jobs = sum(m.load for m in serving)
    return Line('proxy.shards_serving', 'warn',
                'Egress proxy down, shards serving: %s on %s still %s egress through %s; new jobs are refused until '
                '%s runs again, and the checks below ran through the %s'
                % (_plural(jobs, 'job network'), ', '.join(m.name for m in serving), 'has' if jobs == 1 else 'have',
                   'it' if len(serving) == 1 else 'them', proxy, 'shard' if len(serving) == 1 else 'shards'),
                fix='docker start %s (ansible-playbook pi_dispatch.egress.site); the shards follow the proxy, so '
                    'do not remove them while their jobs run' % proxy)


def shards_unread_line(proxy: str, why: str) -> Line:
    return Line('proxy.shards_unread', 'warn',
                'Egress proxy shards could not be listed (%s), so the canary ran through the proxy only' % why,
                fix='docker ps -a --filter label=%s=%s' % (_shards.LABEL_SHARD_OF, proxy))


def probed_shards(family: Sequence[_shards.Member]) -> List[_shards.Member]:
    """The shards the canary runs through: every running one, by index. Pure."""
    return [m for m in family if m.is_shard and m.running]


# --- lines through a shard: pure -------------------------------------------------------------------

def through_shard(line: Line, shard: str) -> Line:
    """The proxy's canary or endpoint ``line`` as the same probe's line through ``shard``. Pure."""
    fix = line.fix
    if fix and line.status in ('warn', 'fail'):
        fix = ('%s; when the proxy passes and only %s fails, that shard runs other rules: docker exec %s squid -k '
               'reconfigure reloads it' % (fix, shard, shard))
    return Line(shard_line_id(line.id), line.status, via_shard(line.message, shard), fix=fix)


def shard_setup_line(shard: str, why: str) -> Line:
    return Line('canary.shard_setup', 'notrun',
                via_shard('Egress canary could not be set up (%s), so no probe ran' % why, shard),
                fix='docker network ls --filter name=%s; docker inspect %s' % (NETWORK_PREFIX, shard))


def shard_notrun_lines(shards: Sequence[_shards.Member], endpoints: Sequence[Tuple[Any, str]], why: str
                       ) -> Tuple[List[Line], List[Line]]:
    """(canary lines, endpoint lines) of probes that did not run through ``shards``, for ``why``. Pure.

    ``endpoints``: (endpoint, kind) pairs in report order.
    """
    canary, endpoint_lines = [], []
    for shard in shards:
        canary.extend(through_shard(notrun_line(probe, why), shard.name) for probe in PROBES)
        endpoint_lines.extend(through_shard(endpoint_notrun_line(endpoint, ENDPOINT_PROBE_LABELS[kind], why),
                                            shard.name) for endpoint, kind in endpoints)
    return canary, endpoint_lines


# --- the daemon side -------------------------------------------------------------------------------

class ShardLane(object):
    """One running shard's part of a canary run: its network, whether it is set up, its probe keys."""

    def __init__(self, member: _shards.Member, pid: int) -> None:
        self.member = member
        self.name = member.name
        self.net = shard_network_name(pid, member.index)
        self.prefix = shard_key(member.index)
        self.created = False
        self.ready = False
        self.why = None


def _setup_lane(ctx: DoctorContext, lane: ShardLane) -> None:
    """Create the shard's canary network and attach the shard with the proxy's name as its alias."""
    try:
        ctx.client.api.create_network(lane.net, driver='bridge', internal=True, labels={LABEL: str(ctx.pid)})
        lane.created = True
        ctx.client.api.connect_container_to_network(lane.name, lane.net, aliases=[ctx.proxy])
        lane.ready = True
    except Exception as exc:
        lane.why = '%s %s: %s' % ('attaching %s to' % lane.name if lane.created else 'creating', lane.net,
                                  dc.api_message(exc))


def setup_lanes(ctx: DoctorContext, shards: list) -> Tuple[List[ShardLane], Callable[[], None]]:
    """Start setting up one lane per running shard, all at once; returns (lanes, join) where join() waits."""
    lanes = [ShardLane(member, ctx.pid) for member in shards]
    threads = [threading.Thread(target=_setup_lane, args=(ctx, lane)) for lane in lanes]
    for thread in threads:
        thread.daemon = True
        thread.start()

    def join() -> None:
        deadline = time.monotonic() + SHARD_SETUP_TIMEOUT
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        for lane in lanes:
            if not lane.ready and not lane.why:
                lane.why = 'setting up %s did not finish within %ss' % (lane.net, SHARD_SETUP_TIMEOUT)
    return lanes, join


def read_family(ctx: DoctorContext) -> Tuple[list, List[Line]]:
    """(family, lines): the proxy's family (shards with their health) and :func:`family_lines`.

    A family that cannot be listed is ([], [proxy.shards_unread]).
    """
    try:
        family = _shards.members(ctx.client, ctx.proxy)
    except Exception as exc:  # EngineError, or an SDK error the read did not wrap
        return [], [shards_unread_line(ctx.proxy, ' '.join(str(exc).split()))]
    read = []
    for member in family:
        if member.is_shard and member.health is None:
            # A container listing carries no health status: the inspect does.
            try:
                member = _shards.member_from_attrs(ctx.client.api.inspect_container(member.name), member.index)
            except Exception:  # gone meanwhile, or unreadable: what the listing said stands
                pass
        read.append(member)
    return read, family_lines(ctx.proxy, read)


class ShardsCheck(Check):
    """The family lines; leaves the family in ``ctx.family`` for the canary."""

    def lines(self, ctx: DoctorContext) -> List[Line]:
        ctx.family, lines = read_family(ctx)
        return lines
