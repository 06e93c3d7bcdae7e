# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The host-firewall layer: the wanted rules, computed from the daemon's network list.

Pure. :func:`select_networks` picks the job and canary networks (and the
proxy's upstream network) from the daemon's list, :func:`wanted` turns them
into one family's :class:`Ruleset` (every rule DROPs or RETURNs, written the
way iptables-save prints it), :func:`compute` does both for the module and
the doctor, and :func:`render_install` renders a ruleset for the boot unit.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import names as _jobnet_names
from ansible_collections.pi_dispatch.egress.plugins.module_utils._firewall.params import (
    DEFAULT_PREFIX,
    DNS_PORT,
    FAMILIES,
    FORWARD_HOOK,
    INPUT_HOOK,
    MULTIPORT_MAX,
    FirewallError,
    chain_names,
    params_comment,
    validate_prefix,
)

DOCTOR_NETWORK_RE = re.compile(r'^pi-dispatch-egress-doctor-(\d+)$')
DOCTOR_LABEL = 'io.pi-dispatch.egress.doctor'
BRIDGE_NAME_OPTION = 'com.docker.network.bridge.name'
_IFACE_RE = re.compile(r'^[A-Za-z0-9_.:-]{1,15}\Z')


# --------------------------------------------------------------------------
# What the daemon says -> the networks the layer covers (pure)
# --------------------------------------------------------------------------

def bridge_of(attrs: Dict[str, Any]) -> Optional[str]:
    """The host interface of a docker bridge network: its bridge.name option, else br-<id[:12]>. None otherwise."""
    if (attrs.get('Driver') or '') != 'bridge':
        return None
    name = (attrs.get('Options') or {}).get(BRIDGE_NAME_OPTION)
    if not name:
        net_id = attrs.get('Id') or ''
        if len(net_id) < 12:
            return None
        name = 'br-' + net_id[:12]
    return name if _IFACE_RE.match(name) else None


def classify(attrs: Dict[str, Any]) -> Optional[str]:
    """'job', 'canary' or None for one network (list or inspect dict)."""
    name = attrs.get('Name') or ''
    labels = attrs.get('Labels') or {}
    if _jobnet_names.looks_like_job_network(name) or _jobnet_names.LABEL_JOB_ID in labels:
        return 'job'
    if DOCTOR_NETWORK_RE.match(name) or DOCTOR_LABEL in labels:
        return 'canary'
    return None


def _subnets(attrs: Dict[str, Any]) -> List[Union[ipaddress.IPv4Network, ipaddress.IPv6Network]]:
    out = []
    for cfg in ((attrs.get('IPAM') or {}).get('Config') or []):
        try:
            out.append(ipaddress.ip_network(cfg.get('Subnet'), strict=False))
        except (TypeError, ValueError):
            continue
    return out


class Net(object):
    """A network the layer writes rules for."""

    __slots__ = ('name', 'id', 'bridge', 'kind', 'subnets')

    def __init__(self, name: Optional[str], net_id: Optional[str], bridge: str, kind: str,
                 subnets: Iterable[Any] = ()) -> None:
        self.name = name
        self.id = net_id
        self.bridge = bridge
        self.kind = kind
        self.subnets = [str(s) for s in subnets]

    def in_pool(self, pool: Optional[str]) -> bool:
        if not pool:
            return False
        pool_net = ipaddress.ip_network(pool)
        v4 = [ipaddress.ip_network(s) for s in self.subnets if ipaddress.ip_network(s).version == 4]
        return bool(v4) and all(s.subnet_of(pool_net) for s in v4)

    def as_dict(self) -> Dict[str, Any]:
        return dict(name=self.name, id=self.id, bridge=self.bridge, kind=self.kind, subnets=list(self.subnets))

    def __repr__(self) -> str:
        return 'Net(%r)' % (self.as_dict(),)


def select_networks(networks: Optional[List[Dict[str, Any]]], names: Optional[Sequence[str]] = None,
                    upstream: Optional[str] = None) -> Tuple[List[Net], Optional[Net], List[str]]:
    """(nets, upstream_net, notes) from the daemon's network list.

    ``names`` None: every job network (``pi-job-<id>-net`` or our job-id
    label) and canary network (``pi-dispatch-egress-doctor-<pid>`` or the
    doctor's label) that is a bridge. ``names`` given: exactly those networks
    (tests, and operators who scope the layer), each of which must exist.
    ``upstream``: the proxy's upstream network name (None: not looked up).
    """
    by_name = dict((n.get('Name'), n) for n in networks or [])
    notes = []
    chosen = []
    if names is not None:
        missing = [name for name in names if name not in by_name]
        if missing:
            raise FirewallError('networks: %s %s not exist on the daemon; create %s first or leave it out.'
                                % (', '.join(missing), 'does' if len(missing) == 1 else 'do',
                                   'it' if len(missing) == 1 else 'them'))
        candidates = [(by_name[name], classify(by_name[name]) or 'named') for name in names]
    else:
        candidates = [(attrs, classify(attrs)) for attrs in networks or []]
        candidates = [(attrs, kind) for attrs, kind in candidates if kind]
    for attrs, kind in candidates:
        if upstream and attrs.get('Name') == upstream:
            continue
        bridge = bridge_of(attrs)
        if bridge is None:
            notes.append('%s is not a bridge network on this host (driver %s); no interface rule for it'
                         % (attrs.get('Name'), attrs.get('Driver')))
            continue
        chosen.append(Net(attrs.get('Name'), attrs.get('Id'), bridge, kind, _subnets(attrs)))
    upstream_net = None
    if upstream:
        attrs = by_name.get(upstream)
        if attrs is not None:
            bridge = bridge_of(attrs)
            if bridge is None:
                raise FirewallError('The upstream network %s is not a bridge network (driver %s), so its traffic '
                                    'cannot be limited here; set limit_upstream: false.'
                                    % (upstream, attrs.get('Driver')))
            upstream_net = Net(upstream, attrs.get('Id'), bridge, 'upstream', _subnets(attrs))
    chosen.sort(key=lambda n: (n.bridge, n.name))
    seen = set()
    unique = []
    for net in chosen:
        if net.bridge not in seen:
            seen.add(net.bridge)
            unique.append(net)
    return unique, upstream_net, notes


# --------------------------------------------------------------------------
# The wanted ruleset (pure)
# --------------------------------------------------------------------------

class Ruleset(object):
    """One family's wanted state: our chains' rules (in order) and our jumps.

    ``chains``: chain -> [rule lines as iptables-save prints them]; ``jumps``:
    [(hook, chain)], each to be rule 1 of its hook; ``per_net``: bridge ->
    the rules that exist only for that network (the doctor's tolerance for
    job networks created or removed since the last run).
    """

    def __init__(self, family: str, prefix: str, chains: Dict[str, List[str]], jumps: List[Tuple[str, str]],
                 per_net: Dict[str, List[str]], params: str, pool_bridges: Iterable[str] = (),
                 nets: Iterable[Net] = ()) -> None:
        self.family = family
        self.prefix = prefix
        self.chains = chains
        self.jumps = jumps
        self.per_net = per_net
        self.params = params
        self.pool_bridges = set(pool_bridges)
        self.nets = list(nets)

    def lines(self) -> List[str]:
        out = ['-A %s -j %s' % (hook, chain) for hook, chain in self.jumps]
        for chain in sorted(self.chains):
            out.extend(self.chains[chain])
        return out


def _quote(text: str) -> str:
    return '"%s"' % text if (' ' in text or not text) else text


def wanted(family: str, nets: Sequence[Net], upstream: Optional[Net] = None, pool: Optional[str] = None,
           ports: Optional[Sequence[int]] = None, prefix: str = DEFAULT_PREFIX, params: str = '',
           forward_hook: Optional[str] = FORWARD_HOOK) -> Ruleset:
    """The ruleset for one family (``ipv4`` / ``ipv6``). Pure.

    ``nets``: :class:`Net` list (job, canary or named networks);
    ``upstream``: the proxy's upstream :class:`Net` when its traffic is
    limited (else None); ``pool``: the IPv4 job-network pool or None;
    ``ports``: the TCP ports the upstream may reach (with ``upstream``);
    ``forward_hook``: the chain our FORWARD chain is jumped from, or None
    when this family has no forward hook (then only INPUT is written).
    Every rule is written in the form iptables-save prints it (-s before -d,
    -i before -o, implicit -m tcp/udp spelt out), so a second run compares equal.
    """
    if family not in FAMILIES:
        raise FirewallError('family %r: use ipv4 or ipv6' % (family,))
    names = chain_names(prefix)
    cin, cfwd, cup = names['INPUT'], names['FORWARD'], names['UPSTREAM']
    chains = {cin: [], cfwd: []}
    per_net = {}
    rin, rfwd = chains[cin], chains[cfwd]
    if params:
        rin.append('-A %s -m comment --comment %s' % (cin, _quote(params)))
    rin.append('-A %s -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN' % cin)
    if upstream is not None:
        chains[cup] = rup = []
        rup.append('-A %s -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN' % cup)
        tcp = sorted(set(ports or []))
        for start in range(0, len(tcp), MULTIPORT_MAX):
            chunk = tcp[start:start + MULTIPORT_MAX]
            if len(chunk) == 1:
                rup.append('-A %s -p tcp -m tcp --dport %d -j RETURN' % (cup, chunk[0]))
            else:
                rup.append('-A %s -p tcp -m multiport --dports %s -j RETURN' % (cup, ','.join(str(p) for p in chunk)))
        rup.append('-A %s -p udp -m udp --dport %d -j RETURN' % (cup, DNS_PORT))
        rup.append('-A %s -p tcp -m tcp --dport %d -j RETURN' % (cup, DNS_PORT))
        rup.append('-A %s -j DROP' % cup)
        rin.append('-A %s -i %s -j %s' % (cin, upstream.bridge, cup))
        rfwd.append('-A %s -i %s ! -o %s -j %s' % (cfwd, upstream.bridge, upstream.bridge, cup))
    for net in nets:
        mine = ['-A %s -i %s -j DROP' % (cin, net.bridge)]
        rin.append(mine[0])
        per_net[net.bridge] = mine
    if pool and family == 'ipv4':
        rin.append('-A %s -s %s -j DROP' % (cin, pool))
    for net in nets:
        mine = ['-A %s -i %s ! -o %s -j DROP' % (cfwd, net.bridge, net.bridge),
                '-A %s ! -i %s -o %s -j DROP' % (cfwd, net.bridge, net.bridge)]
        rfwd.extend(mine)
        per_net[net.bridge].extend(mine)
    if pool and family == 'ipv4':
        rfwd.append('-A %s -s %s ! -d %s -j DROP' % (cfwd, pool, pool))
        rfwd.append('-A %s ! -s %s -d %s -j DROP' % (cfwd, pool, pool))
    jumps = [(INPUT_HOOK, cin)]
    if forward_hook:
        jumps.append((forward_hook, cfwd))
    else:
        del chains[cfwd]
        for bridge in per_net:
            per_net[bridge] = [r for r in per_net[bridge] if not r.startswith('-A %s ' % cfwd)]
    # Job networks inside the pool with no IPv6 subnet: the pool rule (IPv4) covers them even before their own
    # interface rules exist, and docker gives their containers no IPv6 (the doctor tolerates their absence).
    pool_bridges = [n.bridge for n in nets if n.kind == 'job' and n.in_pool(pool)
                    and not any(':' in s for s in n.subnets)]
    return Ruleset(family, prefix, chains, jumps, per_net, params, pool_bridges, nets)


def empty(family: str, prefix: str = DEFAULT_PREFIX) -> Ruleset:
    """The wanted state of ``state: absent``: none of our chains, none of our jumps."""
    validate_prefix(prefix)
    return Ruleset(family, prefix, {}, [], {}, '')


# --------------------------------------------------------------------------
# Rendering a ruleset
# --------------------------------------------------------------------------

def ruleset_lines(ruleset: Ruleset) -> List[str]:
    """A ruleset as lines: its jumps, then each chain (``:<chain>`` and its rules), as :func:`ours` shows a table."""
    out = ['-A %s -j %s' % (hook, chain) for hook, chain in ruleset.jumps]
    for chain in sorted(ruleset.chains):
        out.append(':%s' % chain)
        out.extend(ruleset.chains[chain])
    return out


def render_install(ruleset: Ruleset) -> str:
    """iptables-restore --noflush input that installs a ruleset on a table that has none of it (boot).

    For the restore unit: run after deleting our jumps (ignoring failures), it
    creates or flushes our chains, fills them and inserts each jump as rule 1.
    """
    lines = [':%s - [0:0]' % chain for chain in sorted(ruleset.chains)]
    for chain in sorted(ruleset.chains):
        lines.extend(ruleset.chains[chain])
    for hook, chain in ruleset.jumps:
        lines.append('-I %s 1 -j %s' % (hook, chain))
    return '*filter\n' + '\n'.join(lines) + '\nCOMMIT\n'


# --------------------------------------------------------------------------
# The daemon's networks -> the ruleset (pure)
# --------------------------------------------------------------------------

def forward_hook_for(table: Any, family: str) -> str:
    """DOCKER-USER when this family's filter table has it. IPv6 without it (Docker's ip6tables off): FORWARD."""
    if table is not None and FORWARD_HOOK in table.chains:
        return FORWARD_HOOK
    if family == 'ipv6':
        return 'FORWARD'
    return FORWARD_HOOK  # plan() then says DOCKER-USER is missing and how to fix it


def compute(networks: Optional[List[Dict[str, Any]]], family: str, table: Any, prefix: str = DEFAULT_PREFIX,
            pool: Optional[str] = None, names: Optional[Sequence[str]] = None, upstream: Optional[str] = None,
            base_ports: Optional[Sequence[int]] = None, endpoint_port_list: Optional[Sequence[int]] = None,
            endpoints: bool = False, created_table: bool = False) -> Tuple[Ruleset, List[str]]:
    """The Ruleset for one family from the daemon's network list and the table now (for the hook). Pure.

    ``base_ports``: None (the upstream is not limited) or the TCP ports the
    proxy may always reach (80, 443); ``endpoint_port_list``: the declared
    model-endpoint ports, added to them (``endpoints`` says whether they were
    read, for the parameters comment). Returns (ruleset, notes).
    """
    limited = base_ports is not None
    nets, upstream_net, notes = select_networks(networks, names, upstream if limited else None)
    if limited and upstream_net is None:
        raise FirewallError('The upstream network %s does not exist, so the proxy\'s traffic cannot be limited: '
                            'deploy the proxy first (site.yml runs the proxy role before the firewall role), or set '
                            'limit_upstream: false.' % upstream)
    base = sorted(set(base_ports)) if limited else None
    params = params_comment(pool, upstream if limited else None, base, endpoints and limited, names, created_table)
    ports = sorted(set(base or []) | set(endpoint_port_list or [])) if limited else None
    ruleset = wanted(family, nets, upstream_net if limited else None, pool, ports, prefix, params,
                     forward_hook=forward_hook_for(table, family))
    return ruleset, notes
