# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""Proxy shards: more proxy containers, each carrying a bounded number of job networks.

The cost of attaching a job network grows with the number of networks the joining container
already holds (docs/job-networks.md: x31.8 at 300), so one proxy carrying every job makes job
starts slow on a busy host. A shard is a clone of the proxy container (same image, command,
mounts, limits, health check, upstream network) named ``<proxy>-shard-<n>``. A job network gets
the least-loaded running member of the family (the proxy first on a tie), attached with the
network alias ``<proxy>`` (``pi-dispatch-egress-proxy``), so the job still reaches
``pi-dispatch-egress-proxy:3128`` and nothing in the job contract changes.

The proxy alone carries up to ``bound`` job networks; a shard is started only when every running
member is full, and a shard whose last job network is torn down is removed. ``bound`` 0 turns
sharding off (the proxy carries every job network).

This file holds the family and the choice: the names, :func:`members` (the read), the bound
(the caller's, the proxy's label, the default) and :func:`choose` (the pure decision). :func:`pick`
is the choice a job network's create makes: from what the client remembers of the family (the loads
it read last and the attaches and detaches it made since), checked with at most two container
inspects, not a read of every member's job networks per job. Making, removing and following a
shard (the clone and its readiness) are ``_proxy/shard_clone.py``'s.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy.spec import (
    LABEL_SHARD_BOUND,
    is_job_network,
)

LABEL_SHARD_OF = 'io.pi-dispatch.egress.shard-of'
LABEL_SHARD_INDEX = 'io.pi-dispatch.egress.shard-index'
SHARD_ROLE = 'proxy-shard'
SHARD_INFIX = '-shard-'
# Job networks the proxy (and each shard) carries before the next job gets a shard of its own,
# unless the caller passes a bound or the proxy carries one (LABEL_SHARD_BOUND, role variable
# egress_proxy_shard_bound). Measured on Docker 20.10 (docs/job-networks.md, "What grows"): a
# connect walks the daemon's whole network store once per network the joining container already
# holds, about 8 ms per held network at 1,000 networks on the daemon, so the bound is the slope of
# a job's start on a busy host; a shard costs one idle squid (about 25 MiB) and a start of about
# a second (until squid answers its health test), paid by one job in every ``bound``.
DEFAULT_BOUND = 10
# The most shards one proxy gets (a runaway guard): at the default bound, 2,560 jobs on one host.
MAX_SHARDS = 255


class ShardError(dc.EngineError):
    """A shard could not be chosen, made or removed; the message says what to do."""


def shard_name(proxy: str, index: int) -> str:
    return '%s%s%d' % (proxy, SHARD_INFIX, index)


def is_family_name(name: str, proxy: str) -> bool:
    """True for ``proxy`` itself and for a name of its shards (``<proxy>-shard-<n>``). Pure."""
    if name == proxy:
        return True
    rest = name[len(proxy) + len(SHARD_INFIX):] if name.startswith(proxy + SHARD_INFIX) else ''
    return rest.isdigit() and not rest.startswith('0')


def family_on(net_attrs: Dict[str, Any], proxy: str) -> List[str]:
    """The names of ``proxy``'s family with an active endpoint in a network's inspect dict."""
    return sorted((c or {}).get('Name') for c in (net_attrs.get('Containers') or {}).values()
                  if is_family_name((c or {}).get('Name') or '', proxy))


def check_bound(bound: Any, key: str = 'shard_bound') -> Optional[int]:
    """``bound`` as given: a whole number of at least 0, or None (follow the proxy, :func:`resolve_bound`)."""
    if bound is None:
        return None
    if not isinstance(bound, int) or isinstance(bound, bool) or bound < 0:
        raise ShardError('%s %r is not a number of job networks; use 0 (one proxy carries every job) or '
                         'a whole number such as %d.' % (key, bound, DEFAULT_BOUND))
    return bound


class Member(object):
    """One container of the proxy family: the proxy itself (index 0) or a shard."""

    def __init__(self, name: str, index: int, state: str, job_networks: Iterable[str],
                 networks: Optional[Iterable[str]] = None, health: Optional[str] = None,
                 bound_label: Optional[str] = None) -> None:
        self.name = name
        self.bound_label = bound_label  # the proxy's LABEL_SHARD_BOUND as written, None when unset
        self.index = index
        self.state = state
        self.job_networks = sorted(job_networks)
        self.networks = sorted(networks or [])
        self.health = health

    @property
    def is_shard(self) -> bool:
        return self.index > 0

    @property
    def running(self) -> bool:
        return self.state == 'running'

    @property
    def load(self) -> int:
        return len(self.job_networks)

    def as_dict(self) -> Dict[str, Any]:
        return dict(name=self.name, index=self.index, state=self.state, health=self.health, load=self.load,
                    job_networks=list(self.job_networks), shard=self.is_shard)

    def __repr__(self) -> str:
        return 'Member(%r)' % (self.as_dict(),)


def member_from_attrs(attrs: Dict[str, Any], index: int) -> Member:
    """Member of a container inspect (or a container list summary)."""
    state = attrs.get('State')
    if isinstance(state, dict):
        health = (state.get('Health') or {}).get('Status')
        state = (state.get('Status') or 'unknown').lower()
    else:
        # a container list summary: the health is in its Status text, e.g. "Up 3 minutes (healthy)"
        status = (attrs.get('Status') or '').lower()
        health = next((h for h in ('unhealthy', 'healthy', 'starting') if '(%s)' % h in status
                       or '(health: %s)' % h in status), None)
        state = (state or 'unknown').lower()
    nets = ((attrs.get('NetworkSettings') or {}).get('Networks') or {})
    name = (attrs.get('Name') or (attrs.get('Names') or [''])[0]).lstrip('/')
    labels = (attrs.get('Config') or {}).get('Labels') if 'Config' in attrs else attrs.get('Labels')
    return Member(name, index, state, [n for n in nets if is_job_network(n)], list(nets), health,
                  bound_label=(labels or {}).get(LABEL_SHARD_BOUND))


def resolve_bound(bound: Optional[int], primary: Optional[Member]) -> int:
    """The bound a create uses: ``bound`` when the caller gave one, else the proxy's label (the role
    variable egress_proxy_shard_bound), else DEFAULT_BOUND. Raises ShardError for a label that is
    not a whole number of at least 0."""
    if bound is not None:
        return bound
    label = primary.bound_label if primary is not None else None
    if label is None:
        return DEFAULT_BOUND
    try:
        value = int(str(label).strip())
    except ValueError:
        value = -1
    if value < 0:
        raise ShardError('The proxy %s carries the label %s=%r, which is not a number of job networks. Set '
                         'egress_proxy_shard_bound to a whole number of at least 0 and run playbooks/site.yml, '
                         'or pass shard_bound to the create.' % (primary.name, LABEL_SHARD_BOUND, label))
    return value


def shard_index(labels: Optional[Dict[str, str]], proxy: str) -> Optional[int]:
    """The shard index a container's labels give it within ``proxy``'s family, or None."""
    labels = labels or {}
    if labels.get(LABEL_SHARD_OF) != proxy:
        return None
    try:
        index = int(labels.get(LABEL_SHARD_INDEX, ''))
    except ValueError:
        return None
    return index if index >= 1 else None


def members(client: Any, proxy: str) -> List[Member]:
    """Every container of ``proxy``'s family: [the proxy (when it exists)] + its shards by index."""
    found = []
    primary = dc.read('Inspecting container %s' % proxy, lambda: client.api.inspect_container(proxy), missing=True)
    if primary is not None:
        found.append(member_from_attrs(primary, 0))
    listed = dc.read('Listing the shards of %s' % proxy,
                     lambda: client.api.containers(all=True, filters={'label': '%s=%s' % (LABEL_SHARD_OF, proxy)}))
    shards = []
    for summary in listed:
        index = shard_index(summary.get('Labels'), proxy)
        if index is not None:
            shards.append(member_from_attrs(summary, index))
    return found + sorted(shards, key=lambda m: m.index)


def choose(family: Sequence[Member], bound: Optional[int]) -> Optional[Member]:
    """The member a new job network gets, or None when a shard must be added first. Pure.

    The least-loaded running member below ``bound`` (the proxy first on a tie, then the lowest
    shard). ``bound`` 0: the proxy, whatever its load; None: the proxy's own (:func:`resolve_bound`).
    Raises ShardError when the proxy does not exist or is not running (a shard is a copy of it:
    nothing to copy from).
    """
    primary = family[0] if family and not family[0].is_shard else None
    if primary is None:
        raise ShardError('The egress proxy does not exist, so no job network can be attached. Create it '
                         '(ansible-playbook pi_dispatch.egress.site), then retry.')
    if not primary.running:
        raise ShardError('The egress proxy %s is %s, so no job network can be attached. Start it (docker start '
                         '%s, or ansible-playbook pi_dispatch.egress.site), then retry.'
                         % (primary.name, primary.state, primary.name))
    bound = resolve_bound(bound, primary)
    if not bound:
        return primary
    open_ = [m for m in family if m.running and m.load < bound]
    if not open_:
        return None
    return min(open_, key=lambda m: (m.load, m.index))


# --- what one client remembers of the family (job-network create and teardown) ------------------
# How long a full read of the family is trusted before the next create reads it whole again (the
# loads other processes changed meanwhile; a member pick() returns is always read just now).
BOOK_SECONDS = 60.0
_BOOK_LOCK = threading.Lock()


def _book(memo: Dict[Any, Any], proxy: str) -> Optional[Dict[str, Any]]:
    return memo.get(('family', proxy))


def remember(memo: Dict[Any, Any], proxy: str, family: Iterable[Member],
             clock: Callable[[], float] = time.monotonic) -> None:
    """Keep ``family`` (an exact read, :func:`members`) as the client's picture of ``proxy``'s family."""
    with _BOOK_LOCK:
        memo[('family', proxy)] = dict(read_at=clock(), members=dict((m.name, m) for m in family))


def forget(memo: Dict[Any, Any], proxy: str) -> None:
    """Drop the picture: the next :func:`pick` reads the whole family."""
    memo.pop(('family', proxy), None)


def note(memo: Dict[Any, Any], proxy: str, name: str, network: Optional[str] = None, attached: bool = True,
         member: Optional[Member] = None) -> None:
    """Keep the picture current: ``network`` attached to (or detached from) ``name``; ``member`` (a
    Member) added, or with ``attached`` False and no ``network``, ``name`` gone."""
    book = _book(memo, proxy)
    if book is None:
        return
    with _BOOK_LOCK:
        known = book['members']
        if member is not None:
            known[member.name] = member
        elif network is None and not attached:
            known.pop(name, None)
        elif name in known:
            nets = set(known[name].job_networks)
            if attached:
                nets.add(network)
            else:
                nets.discard(network)
            known[name].job_networks = sorted(nets)


def _read_member(client: Any, proxy: str, name: str, index: int) -> Optional[Member]:
    """``name`` as a Member, read now (one inspect), or None when it is gone or not this member."""
    attrs = dc.read('Inspecting container %s' % name, lambda: client.api.inspect_container(name), missing=True)
    if attrs is None:
        return None
    if index and shard_index((attrs.get('Config') or {}).get('Labels'), proxy) != index:
        return None
    return member_from_attrs(attrs, index)


def pick(client: Any, proxy: str, bound: Optional[int], memo: Dict[Any, Any],
         clock: Callable[[], float] = time.monotonic) -> Optional[Member]:
    """:func:`choose` for a new job network, reading two members as a rule; None: a shard must be added.

    ``memo`` is what the client remembers (``_jobnet_engine.client_memo``). Without a picture of
    the family, or with one older than BOOK_SECONDS, it reads the family whole (:func:`members`)
    and keeps it. Otherwise it reads the proxy (is it there and running: ShardError as
    :func:`choose` when not) and the member the picture names; one that is gone, stopped or full
    meanwhile is corrected in the picture and the next is read. A member it returns was read just
    now, running and below ``bound``. Each read carries at most ``bound`` job networks, whatever the
    number of networks on the daemon or of shards. Raises ShardError or EngineError.
    """
    book = _book(memo, proxy)
    if book is None or clock() - book['read_at'] >= BOOK_SECONDS:
        family = members(client, proxy)
        remember(memo, proxy, family, clock)
        return choose(family, bound)
    known = book['members']
    primary = _read_member(client, proxy, proxy, 0)
    with _BOOK_LOCK:
        if primary is None:
            known.pop(proxy, None)
        else:
            known[proxy] = primary
    if primary is not None:
        bound = resolve_bound(bound, primary)
    for _attempt in range(len(known) + 1):
        with _BOOK_LOCK:
            family = sorted(known.values(), key=lambda m: m.index)
        chosen = choose(family, bound)
        if chosen is None or not chosen.is_shard:
            return chosen
        fresh = _read_member(client, proxy, chosen.name, chosen.index)
        if fresh is None:
            note(memo, proxy, chosen.name, attached=False)
            continue
        note(memo, proxy, fresh.name, member=fresh)
        if fresh.running and fresh.load < bound:
            return fresh
    return None  # pragma: no cover - each round corrects one member, so choose() ran out first


def next_index(family: Iterable[Member]) -> int:
    """The lowest shard index not taken (1, 2, ...)."""
    taken = set(m.index for m in family if m.is_shard)
    index = 1
    while index in taken:
        index += 1
    return index
