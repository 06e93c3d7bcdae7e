# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""Job networks: the subnet pool, and picking a free subnet from it.

Pure parts: :func:`parse_pool`, :func:`pool_capacity`,
:func:`allocate_subnet` (the lowest free /prefix, checked against every
docker network's subnet and this host's routes), the route parsers and
:func:`network_subnets`. Reading parts: :func:`read_host_routes` (this
host's routes), :func:`plan_subnet` (one network listing; read-only) and
:func:`subnet_book` (the subnets one client's daemon has: listed once, then
kept up to date by create and teardown, so a create does not list every
network again).
"""

from __future__ import annotations

import collections
import ipaddress
import json
import socket
import subprocess
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common.docker_client import EngineError
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets.engine import list_networks
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets.names import JobNetError
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy.jobpool import DEFAULT_POOL, DEFAULT_PREFIX

# The pool's defaults live in _policy/jobpool.py (the guard and the endpoints include name the pool too).

MAX_PREFIX = 29


class PoolExhausted(EngineError):
    """No free subnet of the requested size is left in the pool."""


# --------------------------------------------------------------------------
# Subnets (pure allocator + readers)
# --------------------------------------------------------------------------

def parse_pool(pool: Any, prefix: Any, pool_key: str = 'pool',
               prefix_key: str = 'prefix') -> Tuple[ipaddress.IPv4Network, int]:
    """Validate a pool and a per-job prefix; return (IPv4Network, int)."""
    try:
        net = ipaddress.ip_network(str(pool), strict=True)
    except ValueError as exc:
        raise JobNetError(
            "%s %r is not an IPv4 network in CIDR form with no host bits set (%s). "
            "For example '%s'." % (pool_key, pool, exc, DEFAULT_POOL))
    if net.version != 4:
        raise JobNetError("%s %r is IPv6; job networks take IPv4 subnets. For example '%s'."
                          % (pool_key, pool, DEFAULT_POOL))
    try:
        prefix = int(prefix)
    except (TypeError, ValueError):
        raise JobNetError("%s %r is not a number; use a prefix length such as %d."
                          % (prefix_key, prefix, DEFAULT_PREFIX))
    if prefix > MAX_PREFIX or prefix < net.prefixlen:
        raise JobNetError(
            "%s %d does not fit: it must be between the pool's own /%d and /%d (a job network "
            "needs the gateway, the job and the proxy, and a /30 holds only two addresses). "
            "Use %s %d." % (prefix_key, prefix, net.prefixlen, MAX_PREFIX, prefix_key, DEFAULT_PREFIX))
    return net, prefix


def pool_capacity(pool: str = DEFAULT_POOL, prefix: int = DEFAULT_PREFIX) -> int:
    """How many /``prefix`` subnets the pool holds (8192 for the defaults); JobNetError for bad input."""
    net, prefix = parse_pool(pool, prefix)
    return 2 ** (prefix - net.prefixlen)


def _as_networks(items: Iterable[Any]) -> List[ipaddress.IPv4Network]:
    out = []
    for item in items:
        try:
            net = item if isinstance(item, ipaddress.IPv4Network) else ipaddress.ip_network(str(item), strict=False)
        except ValueError:
            continue
        if net.version == 4:
            out.append(net)
    return out


def _first_free(cand: int, end: int, size: int, intervals: Sequence[Tuple[int, int]]) -> Optional[int]:
    """The first ``size``-aligned block at or after ``cand`` that ends by ``end`` and overlaps no interval."""
    for low, high in intervals:
        if cand + size - 1 < low:
            break
        if high >= cand:
            cand = ((high + 1 + size - 1) // size) * size
        if cand > end:
            break
    return cand if cand + size - 1 <= end else None


def allocate_subnet(pool: Any, prefix: Any, taken: Iterable[Any], start: Optional[int] = None) -> ipaddress.IPv4Network:
    """The lowest /``prefix`` of ``pool`` that overlaps nothing in ``taken``.

    ``taken`` is any iterable of IPv4 networks (or CIDR strings): existing
    docker networks' subnets and the host's routes. ``start`` (the index of a
    /``prefix`` in the pool, taken modulo the pool's capacity) makes it the
    first free one at or after that index, wrapping round to the pool's start:
    creators that raced for one subnet spread out instead of racing again for
    the next. Pure; raises PoolExhausted naming what blocked the pool.
    """
    pool, prefix = parse_pool(pool, prefix)
    size = 2 ** (32 - prefix)
    first = int(pool.network_address)
    end = int(pool.broadcast_address)
    blocking = [n for n in _as_networks(taken) if n.overlaps(pool)]
    intervals = sorted((int(n.network_address), int(n.broadcast_address)) for n in blocking)
    cand = None
    if start:
        cand = _first_free(first + (int(start) % 2 ** (prefix - pool.prefixlen)) * size, end, size, intervals)
    if cand is None:
        cand = _first_free(first, end, size, intervals)
    if cand is None:
        shown = ', '.join(str(n) for n in sorted(set(blocking))[:5])
        more = len(set(blocking)) - 5
        raise PoolExhausted(
            "No free /%d is left in the job network pool %s (%d fit in it; taken or overlapping: "
            "%s%s). Tear down or sweep finished job networks (playbooks/gc.yml), or give a larger "
            "or different pool." % (prefix, pool, 2 ** (prefix - pool.prefixlen), shown,
                                    ' and %d more' % more if more > 0 else ''))
    return ipaddress.ip_network((cand, prefix))


def parse_ip_json_routes(text: Optional[str]) -> List[ipaddress.IPv4Network]:
    """Destinations from ``ip -j route`` output; the default route is left out."""
    try:
        routes = json.loads(text or '[]')
    except ValueError:
        return []
    out = []
    for route in routes if isinstance(routes, list) else []:
        dst = route.get('dst') if isinstance(route, dict) else None
        if not dst or dst == 'default':
            continue
        if '/' not in dst:
            dst += '/32'
        out.extend(_as_networks([dst]))
    return [n for n in out if n.prefixlen > 0]


def parse_proc_net_route(text: Optional[str]) -> List[ipaddress.IPv4Network]:
    """Destinations from /proc/net/route (little-endian hex); default route left out."""
    out = []
    for line in (text or '').splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8:
            continue
        try:
            dst = int(fields[1], 16)
            mask = int(fields[7], 16)
        except ValueError:
            continue
        dst = socket.ntohl(dst)
        mask = socket.ntohl(mask)
        plen = bin(mask).count('1')
        if plen == 0:
            continue
        try:
            out.append(ipaddress.ip_network((dst, plen), strict=False))
        except ValueError:
            continue
    return out


def read_host_routes() -> List[ipaddress.IPv4Network]:
    """The host's IPv4 route destinations (main table), without the default route."""
    try:
        with open('/proc/net/route') as handle:
            return parse_proc_net_route(handle.read())
    except (IOError, OSError):
        pass
    try:
        out = subprocess.run(['ip', '-j', '-4', 'route'], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, timeout=10, check=False).stdout
        return parse_ip_json_routes(out.decode('utf-8', 'replace'))
    except (OSError, subprocess.SubprocessError):
        return []


def network_subnets(networks: Iterable[Dict[str, Any]]) -> List[ipaddress.IPv4Network]:
    """IPv4 subnets used by docker networks (dicts as the Engine API lists them)."""
    out = []
    for net in networks:
        for cfg in ((net.get('IPAM') or {}).get('Config') or []):
            if cfg.get('Subnet'):
                out.extend(_as_networks([cfg['Subnet']]))
    return out


def subnet_of(net: Dict[str, Any]) -> Optional[str]:
    """A network's first IPv4 subnet as text (inspect or list dict), else None."""
    subs = network_subnets([net])
    return str(subs[0]) if subs else None


# --------------------------------------------------------------------------
# Picking a free subnet on the daemon
# --------------------------------------------------------------------------

def route_subnets(routes: Optional[Iterable[Any]]) -> List[ipaddress.IPv4Network]:
    """``routes`` as networks; None reads this host's routes."""
    return read_host_routes() if routes is None else _as_networks(routes)


def taken_subnets(nets: Iterable[Dict[str, Any]], routes: Optional[Iterable[Any]]) -> List[ipaddress.IPv4Network]:
    """What a new subnet must not overlap: the networks' subnets and the routes (None: this host's)."""
    return network_subnets(nets) + route_subnets(routes)


def plan_subnet(client: Any, pool: str = DEFAULT_POOL, prefix: int = DEFAULT_PREFIX,
                routes: Optional[Sequence[Any]] = None) -> ipaddress.IPv4Network:
    """Pick a subnet (read-only): one network listing plus the host's routes.

    Returns the ``ipaddress.IPv4Network`` :func:`allocate_subnet` picks: the
    lowest /``prefix`` of ``pool`` that overlaps no docker network's subnet
    and no route in ``routes`` (None reads this host's routes; pass ``[]``
    for a remote daemon). Nothing is created or reserved, so a concurrent
    creator may take it first: a caller that creates a network with it
    retries on the daemon's "overlaps" refusal. Raises JobNetError for a bad
    pool or prefix, PoolExhausted when nothing is free, EngineError /
    EngineUnavailable when the listing fails.
    """
    nets = list_networks(client)
    return allocate_subnet(pool, prefix, taken_subnets(nets, routes))


# --------------------------------------------------------------------------
# The subnet book: what create picks from without listing every network
# --------------------------------------------------------------------------

# How long a listing is trusted (seconds) before the next create lists the networks again: bounds
# how long a network made by somebody else in another address space (an overlay, another IPAM
# driver: ones the daemon's own overlap check does not see) can go unnoticed.
BOOK_SECONDS = 60.0


class SubnetBook(object):
    """The IPv4 subnets of one daemon's networks: as last listed, plus what create and teardown did since.

    A create adds the subnet it made (or one the daemon refused as overlapping), a teardown takes
    away the one it removed. Counted, so two networks on one subnet (other address spaces) stay
    taken until both are gone. What another process made is not in it: the daemon refuses that
    overlap and create lists again (:func:`subnet_book` with ``refresh``).
    """

    def __init__(self, nets: Iterable[Dict[str, Any]], read_at: float) -> None:
        self.read_at = read_at
        self._count = collections.Counter(network_subnets(nets))
        self._lock = threading.Lock()

    def taken(self) -> List[ipaddress.IPv4Network]:
        with self._lock:
            return list(self._count)

    def add(self, subnet: Any) -> None:
        for net in _as_networks([subnet]):
            with self._lock:
                self._count[net] += 1

    def discard(self, subnet: Any) -> None:
        for net in _as_networks([subnet] if subnet else []):
            with self._lock:
                if self._count[net] > 1:
                    self._count[net] -= 1
                else:
                    self._count.pop(net, None)


def subnet_book(client: Any, memo: Dict[Any, Any], refresh: bool = False,
                clock: Callable[[], float] = time.monotonic) -> SubnetBook:
    """The client's :class:`SubnetBook` (``memo``: ``_jobnet_engine.client_memo(client)``).

    One network listing when there is none yet, when it is older than BOOK_SECONDS, or with
    ``refresh`` (a pick was refused: something this client did not make took it); otherwise no
    Engine call at all. Raises EngineError / EngineUnavailable when the listing fails.
    """
    book = memo.get('subnets')
    now = clock()
    if refresh or book is None or now - book.read_at >= BOOK_SECONDS:
        book = SubnetBook(list_networks(client), now)
        memo['subnets'] = book
    return book


def forget_subnet(memo: Dict[Any, Any], subnet: Any) -> None:
    """A network on ``subnet`` was removed: free it in the client's book (when it has one)."""
    book = memo.get('subnets')
    if book is not None and subnet:
        book.discard(subnet)
