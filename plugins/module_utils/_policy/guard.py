# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The destination guard: where a listed name may never lead a job.

A name on the allowlist is trusted as a *name*; what it resolves to is not:
DNS that anyone can steer (a user-content domain, DNS rebinding, a listed
wildcard) could point it at another job's container, at the host through a
network gateway, or into a private range. The guard is the set of addresses
squid refuses to connect to for a listed name (or a listed IP literal):

* every non-public range (RFC 1918, CGNAT, benchmarking, documentation,
  multicast, reserved, ULA, link-local, loopback), minus the private ranges
  the operator opened with ``egress_private_destinations``;
* always, whatever was opened: the job-network pool (every job's container
  and every job network's gateway), the gateway of every network the proxy
  is on, the ``host-gateway`` address (the host itself), loopback,
  link-local and the cloud metadata addresses, slirp4netns's 10.0.2.2,
  multicast and the reserved ranges.

The guard is rendered into ``<deploy_dir>/egress-guard.conf`` (the proxy
mounts it; written in place, reloaded with ``squid -k reconfigure``), which
also carries the per-client connection bound. The packaged rules (version 2)
test ``pi_allowlist`` before ``pi_guard``, so an unlisted name is still never
resolved. squid's ``dst`` ACL matches when ANY resolved address is in the
set, so a name with records [public, private] is refused whole.

IPv6 addresses that embed an IPv4 address are judged by it (issue 42): the
NAT64 form ``64:ff9b::a.b.c.d`` (RFC 6052, the last 32 bits) and the 6to4 form
``2002:AABB:CCDD::/48`` (RFC 3056, bits 16-47) reach the embedded address
through a translator or relay, so for every refused IPv4 network ``N/p`` the
guard also refuses ``64:ff9b::N/(96+p)`` and ``2002:N::/(16+p)``. An embedded
public address passes like the public address (a DNS64 resolver answers the
NAT64 form for every IPv4-only name on an IPv6-only network); an opened IPv4
range opens its embedded forms, and an embedded range cannot be opened by
itself. Local-use NAT64 (``64:ff9b:1::/48``, RFC 8215, where the embedding
is the operator's choice) stays refused whole.

IPv4-mapped IPv6 forms (``::ffff:a.b.c.d``) are NOT rendered: squid keeps
IPv4 addresses as mapped IPv6 internally, so the IPv4 ranges already match
them, and squid parses ``::ffff:0:0/96`` as the whole IPv4 space (measured on
squid 6.13). Pure logic, no I/O.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Iterable, List, Optional, Sequence, Union

IPNet = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy.jobpool import DEFAULT_POOL

GUARD_ACL = 'pi_guard'
CLIENT_CONNS_ACL = 'pi_client_conns'
DEFAULT_CLIENT_MAX_CONNECTIONS = 256

# Not reachable on the public internet (IANA special-purpose registries).
NONPUBLIC_V4 = (
    '0.0.0.0/8',        # "this network"
    '10.0.0.0/8',       # RFC 1918
    '100.64.0.0/10',    # shared address space (CGNAT; Alibaba's metadata 100.100.100.200)
    '127.0.0.0/8',      # loopback
    '169.254.0.0/16',   # link-local (cloud metadata 169.254.169.254)
    '172.16.0.0/12',    # RFC 1918 (Docker's default pools)
    '192.0.0.0/24',     # IETF protocol assignments
    '192.0.2.0/24',     # TEST-NET-1
    '192.88.99.0/24',   # 6to4 relay anycast (deprecated)
    '192.168.0.0/16',   # RFC 1918
    '198.18.0.0/15',    # benchmarking
    '198.51.100.0/24',  # TEST-NET-2
    '203.0.113.0/24',   # TEST-NET-3
    '224.0.0.0/4',      # multicast
    '240.0.0.0/4',      # reserved, and the limited broadcast address
)
NONPUBLIC_V6 = (
    '::/128',           # unspecified
    '::1/128',          # loopback
    '64:ff9b:1::/48',   # local-use NAT64
    '100::/64',         # discard-only
    '2001:db8::/32',    # documentation
    'fc00::/7',         # unique local (AWS's metadata fd00:ec2::254)
    'fe80::/10',        # link-local
    'fec0::/10',        # site-local (deprecated)
    'ff00::/8',         # multicast
)

# IPv6 prefixes that embed an IPv4 address: (prefix, the bit where the IPv4 address starts, name).
NAT64 = ipaddress.ip_network('64:ff9b::/96')      # RFC 6052 well-known prefix: the last 32 bits
SIX_TO_FOUR = ipaddress.ip_network('2002::/16')   # RFC 3056: bits 16-47
EMBEDDING = ((NAT64, 96, 'NAT64'), (SIX_TO_FOUR, 16, '6to4'))


def embedded_forms(v4nets: Iterable[IPNet]) -> List[IPNet]:
    """The NAT64 and 6to4 networks whose embedded IPv4 address lies in one of ``v4nets``."""
    out = []
    for net in v4nets:
        if net.version != 4:
            continue
        for prefix, start, _name in EMBEDDING:
            shift = 128 - start - 32
            base = int(prefix.network_address) | (int(net.network_address) << shift)
            out.append(ipaddress.IPv6Network((base, start + net.prefixlen)))
    return out


# Never opened, whatever egress_private_destinations says.
NEVER_OPEN = (
    ('127.0.0.0/8', 'loopback: inside the proxy that is the proxy itself'),
    ('0.0.0.0/8', '"this network": 0.0.0.0 is this host'),
    ('169.254.0.0/16', 'link-local: the cloud metadata service and the host alias of rootless runtimes'),
    ('10.0.2.2/32', "slirp4netns's alias of the host's loopback"),
    ('100.100.100.200/32', 'a cloud metadata address (Alibaba)'),
    ('224.0.0.0/4', 'multicast'),
    ('240.0.0.0/4', 'reserved'),
    ('::/128', 'the unspecified address'),
    ('::1/128', 'loopback'),
    ('fe80::/10', 'link-local'),
    ('fd00:ec2::254/128', 'a cloud metadata address (AWS)'),
    ('ff00::/8', 'multicast'),
)


class GuardError(ValueError):
    """Bad input: every problem names the key, the value, the rule and the fix."""

    def __init__(self, problems: List[str]) -> None:
        self.problems = list(problems)
        lines = ['egress_private_destinations is refused (%d problem%s); nothing was rendered or changed:'
                 % (len(self.problems), '' if len(self.problems) == 1 else 's')]
        lines += ['  - %s' % p for p in self.problems]
        super(GuardError, self).__init__('\n'.join(lines))


def _nets(items: Iterable[str]) -> List[IPNet]:
    return [ipaddress.ip_network(item, strict=False) for item in items]


def subtract(nets: Iterable[IPNet], holes: Iterable[IPNet]) -> List[IPNet]:
    """The networks of ``nets`` minus every network of ``holes`` (collapsed, sorted)."""
    out = []
    for version in (4, 6):
        current = [n for n in nets if n.version == version]
        for hole in [h for h in holes if h.version == version]:
            nxt = []
            for net in current:
                if not net.overlaps(hole):
                    nxt.append(net)
                elif hole.supernet_of(net):
                    continue
                else:  # the hole is inside this net
                    nxt.extend(net.address_exclude(hole))
            current = nxt
        out.extend(ipaddress.collapse_addresses(current))
    return out


def _host_net(address: str) -> IPNet:
    address = ipaddress.ip_address(address)
    return ipaddress.ip_network('%s/%d' % (address, address.max_prefixlen))


def validate(cidrs: Sequence[str], pool: str = DEFAULT_POOL, gateways: Sequence[str] = (),
             host_gateway: Optional[str] = None, key: str = 'egress_private_destinations') -> List[IPNet]:
    """Validate the private ranges to open; return [ip_network] or raise GuardError.

    Refused: not a CIDR (or host bits set), a public range (nothing to open:
    the guard only refuses non-public addresses), anything that overlaps a
    never-opened range, the job-network pool, or contains the host-gateway
    address (unless that address is one of ``gateways``, as on rootful Podman);
    a CIDR that is nothing but network gateways. A wider range that
    merely contains a gateway is accepted: the gateway stays refused (see
    :func:`denied`), which :func:`kept_inside` reports.
    """
    problems = []
    opened = []
    if cidrs is None:
        cidrs = []
    if not isinstance(cidrs, (list, tuple)):
        raise GuardError(['%s must be a list of CIDR strings, e.g. ["192.168.50.0/24"], not %r' % (key, cidrs)])
    pool_net = ipaddress.ip_network(pool, strict=False)
    gateway_nets = [_host_net(g) for g in gateways]
    never = [(ipaddress.ip_network(n), why) for n, why in NEVER_OPEN]
    nonpublic = _nets(NONPUBLIC_V4 + NONPUBLIC_V6)
    for index, item in enumerate(cidrs):
        where = '%s[%d] = %r' % (key, index, item)
        if not isinstance(item, str):
            problems.append('%s: must be a string such as "192.168.50.0/24"; quote it' % where)
            continue
        try:
            net = ipaddress.ip_network(item.strip(), strict=True)
        except ValueError as exc:
            problems.append('%s: is not a CIDR (%s); write a network such as "192.168.50.0/24" with its host '
                            'bits zero (a single address is "192.168.50.7/32")' % (where, exc))
            continue
        embedding = [(prefix, name) for prefix, _start, name in EMBEDDING
                     if prefix.version == net.version and net.overlaps(prefix)]
        if embedding:
            prefix, name = embedding[0]
            problems.append('%s: lies in %s (%s): each of its addresses embeds an IPv4 address and is judged by it; '
                            'open the IPv4 range instead (its %s form follows it), e.g. "192.168.50.0/24"'
                            % (where, prefix, name, name))
            continue
        if not any(net.overlaps(n) for n in nonpublic):
            problems.append('%s: is a public range, which the guard never refuses; remove it (a listed name that '
                            'resolves there is reached already)' % where)
            continue
        bad = [why + ' (%s)' % n for n, why in never if n.version == net.version and net.overlaps(n)]
        if bad:
            problems.append('%s: overlaps what can never be opened: %s; narrow the range so it leaves these out'
                            % (where, '; '.join(bad)))
            continue
        if net.version == pool_net.version and net.overlaps(pool_net):
            problems.append('%s: overlaps the job-network pool %s (every job container and job network gateway); '
                            'opening it would let a listed name lead one job to another. Narrow the range, or '
                            'move the job pool (job_network pool) elsewhere' % (where, pool_net))
            continue
        host = _host_net(host_gateway) if host_gateway else None
        # Where the engine's name for the host is a gateway of the proxy's networks (rootful Podman:
        # host.containers.internal is the first network's gateway), it is kept refused inside the range
        # like every gateway; Docker's host-gateway (docker0) is not, so a range holding it is refused.
        if host is not None and host in gateway_nets:
            host = None
        if host is not None and host.version == net.version and host.subnet_of(net):
            problems.append('%s: contains the host-gateway address %s (this host, as host.docker.internal); '
                            'narrow the range so it leaves that address out, and declare a model server on this '
                            'host as a model endpoint instead' % (where, host_gateway))
            continue
        if not subtract([net], gateway_nets):
            problems.append('%s: is nothing but network gateways (this host), which can never be opened; remove it'
                            % where)
            continue
        opened.append(net)
    if problems:
        raise GuardError(problems)
    return sorted(set(opened), key=lambda n: (n.version, n))


def always_denied(pool: str = DEFAULT_POOL, gateways: Sequence[str] = (),
                  host_gateway: Optional[str] = None) -> List[IPNet]:
    """What no opened range can open: the never-open ranges, the pool, the gateways, the host gateway."""
    nets = [ipaddress.ip_network(n) for n, _why in NEVER_OPEN]
    nets.append(ipaddress.ip_network(pool, strict=False))
    nets.extend(_host_net(g) for g in outside_pool(gateways, pool))
    if host_gateway:
        nets.append(_host_net(host_gateway))
    return nets


def outside_pool(gateways: Sequence[str], pool: str = DEFAULT_POOL) -> List[str]:
    """The gateways the pool does not already cover (job networks' gateways are inside it)."""
    pool_net = ipaddress.ip_network(pool, strict=False)
    return [g for g in gateways
            if not (ipaddress.ip_address(g).version == pool_net.version and ipaddress.ip_address(g) in pool_net)]


def denied(opened: Sequence[Any] = (), pool: str = DEFAULT_POOL, gateways: Sequence[str] = (),
           host_gateway: Optional[str] = None) -> List[IPNet]:
    """The guard's address set: (non-public minus opened) plus what is always denied, plus the NAT64
    and 6to4 forms of every refused IPv4 network (:func:`embedded_forms`). Collapsed."""
    base = subtract(_nets(NONPUBLIC_V4 + NONPUBLIC_V6), list(opened))
    every = base + always_denied(pool, gateways, host_gateway)
    v4 = list(ipaddress.collapse_addresses([n for n in every if n.version == 4]))
    v6 = list(ipaddress.collapse_addresses([n for n in every if n.version == 6] + embedded_forms(v4)))
    return v4 + v6


def kept_inside(opened: Sequence[Any], gateways: Sequence[str] = (), host_gateway: Optional[str] = None) -> List[str]:
    """Gateways that lie inside an opened range and stay refused all the same."""
    kept = []
    for address in list(gateways) + ([host_gateway] if host_gateway else []):
        net = _host_net(address)
        if any(o.version == net.version and net.subnet_of(o) for o in opened):
            kept.append(str(net.network_address))
    return sorted(set(kept))


HEADER = """\
# pi-dispatch egress guard, rendered by the pi_dispatch.egress collection
# (egress_guard module) from egress_private_destinations, the job-network
# pool and the gateways the Docker Engine reports. Do not edit: set the role
# variables and run the playbook again, which writes this file in place and
# reloads the proxy (squid -k reconfigure; no job is cut).
"""


def render(opened: Iterable[Any] = (), pool: str = DEFAULT_POOL, gateways: Sequence[str] = (),
           host_gateway: Optional[str] = None, client_max_connections: int = DEFAULT_CLIENT_MAX_CONNECTIONS) -> str:
    """The include text. Deterministic: the same inputs give the same bytes."""
    opened = list(opened)
    out = [HEADER, '\n']
    out.append('# Opened private ranges: %s\n' % (', '.join(str(n) for n in opened) or 'none'))
    out.append('# Job-network pool: %s\n' % ipaddress.ip_network(pool, strict=False))
    # A gateway inside the pool (every job network's) is refused with the pool: leaving it out keeps
    # the file the same bytes while job networks come and go.
    # IPv4 first, then IPv6 (a daemon with an IPv6 network reports gateways of both; they do not compare)
    gws = sorted(set(str(ipaddress.ip_address(g)) for g in outside_pool(gateways, pool)),
                 key=lambda g: (ipaddress.ip_address(g).version, ipaddress.ip_address(g)))
    out.append('# Network gateways outside the pool (this host): %s\n' % (', '.join(gws) or 'none known'))
    out.append('# host-gateway (host.docker.internal): %s\n' % (host_gateway or 'not known'))
    kept = kept_inside(opened, gateways, host_gateway)
    if kept:
        out.append('# Refused although inside an opened range: %s\n' % ', '.join(kept))
    out.append('\n# A listed name (or listed IP literal) that resolves to any of these is refused.\n')
    nets = denied(opened, pool, gateways, host_gateway)
    # One ACL line per block of addresses keeps the lines readable.
    for start in range(0, len(nets), 8):
        out.append('acl %s dst %s\n' % (GUARD_ACL, ' '.join(str(n) for n in nets[start:start + 8])))
    out.append('\n# More than this many open connections from one client address are refused, so one job '
               'cannot\n# exhaust the proxy for the others.\n')
    out.append('acl %s maxconn %d\n' % (CLIENT_CONNS_ACL, int(client_max_connections)))
    return ''.join(out)


def default_render() -> str:
    """What the deployment layout creates before the daemon's gateways are known (no range opened)."""
    return render()


def check_client_max_connections(value: Any, key: str = 'egress_proxy_client_max_connections') -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise GuardError(['%s = %r: must be a whole number of connections between 1 and 65535, e.g. %d'
                          % (key, value, DEFAULT_CLIENT_MAX_CONNECTIONS)])
    return value


def acl_networks(text: str) -> List[IPNet]:
    """The networks of the ``pi_guard`` ACL lines in an include text (for the doctor)."""
    nets = []
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 3 and words[0] == 'acl' and words[1] == GUARD_ACL and words[2] == 'dst':
            for word in words[3:]:
                try:
                    nets.append(ipaddress.ip_network(word, strict=False))
                except ValueError:
                    pass
    return nets


def covers(nets: Iterable[IPNet], address: Union[ipaddress.IPv4Address, ipaddress.IPv6Address]) -> bool:
    """True when ``address`` lies in one of ``nets``."""
    address = ipaddress.ip_address(address)
    return any(n.version == address.version and address in n for n in nets)
