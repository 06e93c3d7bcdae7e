# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The host-firewall layer: this collection's own iptables chains, computed from the daemon.

``--internal`` stops a job network routing anywhere, but its gateway is this
host, so a service listening on ``0.0.0.0`` answers a job that dials it. This
layer drops that traffic on the host, in chains the collection owns:

* ``<prefix>-INPUT``, jumped from ``INPUT`` (rule 1): nothing from a job or
  canary network reaches the host itself (replies to connections the host
  opened still do); IPv4 also by source, the whole job-network pool, so a job
  network created after the last run is covered too;
* ``<prefix>-FORWARD``, jumped from ``DOCKER-USER`` (rule 1): nothing is
  forwarded off a job or canary network, or onto one from elsewhere (defence in
  depth for a job network that is not ``--internal`` by mistake); traffic
  between two containers on the SAME bridge (a job and the proxy) passes;
* optionally ``<prefix>-UPSTREAM``: the proxy's own traffic out of the upstream
  network, to the host or forwarded, only to TCP 80, 443, the declared model
  endpoint ports and DNS.

The layer never ACCEPTs: its rules DROP or RETURN, so it can only take away
from what Docker's own rules allow. It never flushes or deletes a chain it
does not own and it touches exactly one rule in ``INPUT`` and one in
``DOCKER-USER`` (its jumps), so ``state: absent`` leaves ``iptables-save``
as it was before, minus counters.

Pure parts, unit-tested with tables: :func:`bridge_of`, :func:`classify`,
:func:`select_networks`, :func:`wanted`, :func:`parse_save`, :func:`plan`,
:func:`render_install`, :func:`params_comment` / :func:`parse_params`,
:func:`strip_counters`, :func:`currency`. The I/O (``iptables -V``,
``iptables-save``, ``iptables-restore --noflush``) goes through a
:class:`Runner` so tests can point it at a throwaway network namespace.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ipaddress
import os
import re
import shutil
import subprocess

from ansible_collections.pi_dispatch.egress.plugins.module_utils import _jobnet

DEFAULT_PREFIX = 'PI-EGRESS'
DEFAULT_UPSTREAM = 'pi-dispatch-egress-out'
DEFAULT_PORTS = (80, 443)
KINDS = ('INPUT', 'FORWARD', 'UPSTREAM')
INPUT_HOOK = 'INPUT'
FORWARD_HOOK = 'DOCKER-USER'
FAMILIES = ('ipv4', 'ipv6')
CHAIN_MAX = 28           # iptables: a chain name has at most 28 characters
IFACE_MAX = 15           # IFNAMSIZ - 1
MULTIPORT_MAX = 15       # -m multiport takes at most 15 ports
COMMENT_MAX = 255
PARAMS_TAG = 'pi_dispatch.egress.egress_firewall v1'
DNS_PORT = 53

DOCTOR_NETWORK_RE = re.compile(r'^pi-dispatch-egress-doctor-(\d+)$')
DOCTOR_LABEL = 'io.pi-dispatch.egress.doctor'
BRIDGE_NAME_OPTION = 'com.docker.network.bridge.name'

_PREFIX_RE = re.compile(r'^[A-Z0-9][A-Z0-9_-]*\Z')
_IFACE_RE = re.compile(r'^[A-Za-z0-9_.:-]{1,15}\Z')
_NET_NAME_RE = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.-]*\Z')


class FirewallError(ValueError):
    """Bad input or a host that cannot take the layer; the message names the fix. Nothing was changed."""


# --------------------------------------------------------------------------
# Names and parameters (pure)
# --------------------------------------------------------------------------

def validate_prefix(prefix):
    """The chain-name prefix: upper-case letters, digits, '-' and '_', so every chain fits in 28 characters."""
    longest = max(len(kind) for kind in KINDS) + 1
    if not isinstance(prefix, str) or not _PREFIX_RE.match(prefix) or len(prefix) + longest > CHAIN_MAX:
        raise FirewallError(
            'chain_prefix %r is refused: use upper-case letters, digits, "-" and "_", starting with a letter or '
            'a digit, at most %d characters (the chains are <prefix>-INPUT, <prefix>-FORWARD and '
            '<prefix>-UPSTREAM, and iptables allows %d characters), e.g. PI-EGRESS.'
            % (prefix, CHAIN_MAX - longest, CHAIN_MAX))
    if prefix in ('INPUT', 'FORWARD', 'OUTPUT', 'DOCKER', 'DOCKER-USER') or prefix.startswith('DOCKER'):
        raise FirewallError('chain_prefix %r is refused: it names chains Docker or iptables own; use e.g. '
                            'PI-EGRESS.' % prefix)
    return prefix


def chain_names(prefix=DEFAULT_PREFIX):
    """kind -> chain name ('INPUT' -> 'PI-EGRESS-INPUT', ...)."""
    validate_prefix(prefix)
    return dict((kind, '%s-%s' % (prefix, kind)) for kind in KINDS)


def validate_pool(pool):
    """None/'' (no pool rule) or an IPv4 network (string form)."""
    if pool in (None, ''):
        return None
    try:
        net = ipaddress.ip_network(pool, strict=True)
    except ValueError as exc:
        raise FirewallError('pool %r is not a network (%s); give the job networks\' pool as a CIDR such as '
                            '%s, or "" for no pool rule.' % (pool, exc, _jobnet.DEFAULT_POOL))
    if net.version != 4 or net.prefixlen == 0:
        raise FirewallError('pool %r is refused: give the IPv4 job-network pool (e.g. %s); a /0 would drop '
                            'everything.' % (pool, _jobnet.DEFAULT_POOL))
    return str(net)


def validate_ports(ports, key='upstream_ports'):
    out = []
    for port in ports or []:
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise FirewallError('%s: %r is not a TCP port (1-65535); e.g. [80, 443].' % (key, port))
        out.append(port)
    return sorted(set(out))


def validate_network_names(names):
    if names is None:
        return None
    for name in names:
        if not isinstance(name, str) or not _NET_NAME_RE.match(name) or ',' in name:
            raise FirewallError('networks: %r is not a docker network name.' % (name,))
    return sorted(set(names))


def params_comment(pool, upstream, ports, endpoints, networks, created_table=False):
    """The comment rule that opens ``<prefix>-INPUT``: what the module was asked, so the doctor can recompute.

    ``ports`` None means the upstream is not limited; ``networks`` None means
    every job and canary network on the daemon.
    """
    text = '%s pool=%s upstream=%s ports=%s endpoints=%s networks=%s' % (
        PARAMS_TAG, pool or '-', upstream or '-',
        ','.join(str(p) for p in ports) if ports is not None else '-',
        'yes' if endpoints else 'no',
        ','.join(networks) if networks is not None else '*')
    if created_table:
        text += ' table=created'
    if len(text) > COMMENT_MAX:
        raise FirewallError('The parameters do not fit in an iptables comment (%d > %d characters): name fewer '
                            'networks (leave networks unset to cover every job network).' % (len(text), COMMENT_MAX))
    return text


def parse_params(comment):
    """The parameters from :func:`params_comment`'s text, or None when it is not ours."""
    if not comment or not comment.startswith(PARAMS_TAG + ' '):
        return None
    fields = {}
    for word in comment[len(PARAMS_TAG) + 1:].split():
        key, sep, value = word.partition('=')
        if not sep:
            return None
        fields[key] = value
    try:
        ports = None if fields.get('ports', '-') == '-' else [int(p) for p in fields['ports'].split(',') if p]
    except ValueError:
        return None
    networks = fields.get('networks', '*')
    return dict(pool=None if fields.get('pool', '-') == '-' else fields['pool'],
                upstream=None if fields.get('upstream', '-') == '-' else fields['upstream'],
                ports=ports, endpoints=fields.get('endpoints') == 'yes',
                networks=None if networks == '*' else [n for n in networks.split(',') if n],
                created_table=fields.get('table') == 'created')


# --------------------------------------------------------------------------
# What the daemon says -> the networks the layer covers (pure)
# --------------------------------------------------------------------------

def bridge_of(attrs):
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


def classify(attrs):
    """'job', 'canary' or None for one network (list or inspect dict)."""
    name = attrs.get('Name') or ''
    labels = attrs.get('Labels') or {}
    if _jobnet.looks_like_job_network(name) or _jobnet.LABEL_JOB_ID in labels:
        return 'job'
    if DOCTOR_NETWORK_RE.match(name) or DOCTOR_LABEL in labels:
        return 'canary'
    return None


def _subnets(attrs):
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

    def __init__(self, name, net_id, bridge, kind, subnets=()):
        self.name = name
        self.id = net_id
        self.bridge = bridge
        self.kind = kind
        self.subnets = [str(s) for s in subnets]

    def in_pool(self, pool):
        if not pool:
            return False
        pool_net = ipaddress.ip_network(pool)
        v4 = [ipaddress.ip_network(s) for s in self.subnets if ipaddress.ip_network(s).version == 4]
        return bool(v4) and all(s.subnet_of(pool_net) for s in v4)

    def as_dict(self):
        return dict(name=self.name, id=self.id, bridge=self.bridge, kind=self.kind, subnets=list(self.subnets))

    def __repr__(self):
        return 'Net(%r)' % (self.as_dict(),)


def select_networks(networks, names=None, upstream=None):
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

    def __init__(self, family, prefix, chains, jumps, per_net, params, pool_bridges=(), nets=()):
        self.family = family
        self.prefix = prefix
        self.chains = chains
        self.jumps = jumps
        self.per_net = per_net
        self.params = params
        self.pool_bridges = set(pool_bridges)
        self.nets = list(nets)

    def lines(self):
        out = ['-A %s -j %s' % (hook, chain) for hook, chain in self.jumps]
        for chain in sorted(self.chains):
            out.extend(self.chains[chain])
        return out


def _quote(text):
    return '"%s"' % text if (' ' in text or not text) else text


def wanted(family, nets, upstream=None, pool=None, ports=None, prefix=DEFAULT_PREFIX, params='',
           forward_hook=FORWARD_HOOK):
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


def empty(family, prefix=DEFAULT_PREFIX):
    """The wanted state of ``state: absent``: none of our chains, none of our jumps."""
    validate_prefix(prefix)
    return Ruleset(family, prefix, {}, [], {}, '')


# --------------------------------------------------------------------------
# iptables-save (pure)
# --------------------------------------------------------------------------

_COUNTERS_RE = re.compile(r'\[\d+:\d+\]')


class Table(object):
    """One table of iptables-save output: chains (name -> policy, in order) and rules per chain."""

    def __init__(self, name):
        self.name = name
        self.chains = {}
        self.order = []
        self.rules = {}

    def add_chain(self, chain, policy):
        if chain not in self.chains:
            self.order.append(chain)
            self.rules.setdefault(chain, [])
        self.chains[chain] = policy


def parse_save(text):
    """table name -> :class:`Table` from iptables-save output (counters dropped). Pure.

    Raises FirewallError on a line it does not understand, rather than
    guessing what the host has.
    """
    tables = {}
    current = None
    for number, raw in enumerate((text or '').splitlines(), 1):
        line = raw.rstrip()
        if not line or line.startswith('#'):
            continue
        if line.startswith('*'):
            current = Table(line[1:])
            tables[current.name] = current
        elif line == 'COMMIT':
            current = None
        elif current is None:
            raise FirewallError('iptables-save line %d is outside a table: %r' % (number, line))
        elif line.startswith(':'):
            fields = line[1:].split()
            if len(fields) < 2:
                raise FirewallError('iptables-save line %d is not a chain line: %r' % (number, line))
            current.add_chain(fields[0], fields[1])
        elif line.startswith('-A '):
            if line.startswith('-A ') and line.split()[1] not in current.chains:
                current.add_chain(line.split()[1], '-')
            current.rules[line.split()[1]].append(line)
        elif line.startswith('[') and '] -A ' in line:  # iptables-save -c
            rule = line.split('] ', 1)[1]
            current.rules.setdefault(rule.split()[1], []).append(rule)
        else:
            raise FirewallError('iptables-save line %d is not understood: %r' % (number, line))
    return tables


def strip_counters(text):
    """iptables-save output without its comments and counters, for a byte comparison."""
    out = []
    for line in (text or '').splitlines():
        if line.startswith('#'):
            continue
        line = _COUNTERS_RE.sub('[0:0]', line)
        if line.startswith('[0:0] '):
            line = line[len('[0:0] '):]
        out.append(line)
    return '\n'.join(out) + ('\n' if out else '')


HOOKS = (INPUT_HOOK, FORWARD_HOOK, 'FORWARD')


def _target(rule):
    words = rule.split()
    for flag in ('-j', '-g'):
        if flag in words[:-1]:
            return words[words.index(flag) + 1]
    return None


def _jump_target(rule):
    words = rule.split()
    if len(words) == 4 and words[0] == '-A' and words[2] == '-j':
        return words[3]
    return None


def ours(table, prefix):
    """Our part of a filter table as lines: the jumps (with their position) and our chains' rules."""
    names = set(chain_names(prefix).values())
    lines = []
    for chain in table.order:
        if chain in names:
            continue
        for index, rule in enumerate(table.rules.get(chain, [])):
            if _jump_target(rule) in names:
                lines.append(rule if index == 0 else '%s   (rule %d of %s)' % (rule, index + 1, chain))
    for chain in sorted(c for c in table.order if c in names):
        lines.append(':%s' % chain)
        lines.extend(table.rules.get(chain, []))
    return lines


def ruleset_lines(ruleset):
    out = ['-A %s -j %s' % (hook, chain) for hook, chain in ruleset.jumps]
    for chain in sorted(ruleset.chains):
        out.append(':%s' % chain)
        out.extend(ruleset.chains[chain])
    return out


# --------------------------------------------------------------------------
# wanted vs present (pure)
# --------------------------------------------------------------------------

class Plan(object):
    """What :func:`plan` found: the actions, the iptables-restore input that does them, problems."""

    def __init__(self, family):
        self.family = family
        self.actions = []
        self.script_lines = []
        self.problems = []
        self.missing_jumps = []
        self.before = []
        self.after = []

    @property
    def changed(self):
        return bool(self.actions)

    def script(self):
        if not self.script_lines:
            return ''
        return '*filter\n' + '\n'.join(self.script_lines) + '\nCOMMIT\n'


def plan(present, ruleset):
    """Compare one family's filter table (:class:`Table` or None) with a :class:`Ruleset`. Pure.

    Returns a :class:`Plan` whose script, fed to ``iptables-restore
    --noflush``, makes the table match: a chain whose rules differ is declared
    (which creates or flushes it) and refilled; a jump that is missing, not
    rule 1, or doubled is deleted and inserted as rule 1; a chain of ours that
    is no longer wanted is flushed and deleted after every rule that jumps to
    it is gone. Chains that are not ours are never declared, flushed or deleted.
    """
    result = Plan(ruleset.family)
    table = present if present is not None else Table('filter')
    names = chain_names(ruleset.prefix)
    our_names = set(names.values())
    result.before = ours(table, ruleset.prefix)
    result.after = ruleset_lines(ruleset)
    hooks = set(hook for hook, _chain in ruleset.jumps) | set(HOOKS)
    # A rule we did not write that jumps to one of our chains: we would break it, and could not delete the chain.
    for chain in table.order:
        if chain in our_names:
            continue
        for rule in table.rules.get(chain, []):
            target = _target(rule)
            if target in our_names and not (chain in hooks and _jump_target(rule) == target):
                result.problems.append(
                    '"%s" jumps to %s, and this collection did not write it (its only jumps are "-A <hook> -j '
                    '<chain>" in %s); delete it (iptables -D %s) and re-run'
                    % (rule, target, ', '.join(HOOKS), rule[3:]))
    for hook, _chain in ruleset.jumps:
        if hook not in table.chains:
            result.problems.append(
                'the %s chain is missing in the %s filter table: dockerd is not running, runs with iptables '
                'disabled, or writes its rules with the other iptables variant (iptables-legacy / iptables-nft); '
                'start docker (systemctl start docker) and re-run' % (hook, result.family))
    if result.problems:
        return result
    # 1. our chains: declare (create or flush) and refill the ones that differ
    #    (every declaration first: a rule may jump to a chain declared after it)
    changed_chains = [c for c in sorted(ruleset.chains)
                      if not (c in table.chains and table.rules.get(c, []) == ruleset.chains[c])]
    for chain in changed_chains:
        result.script_lines.append(':%s - [0:0]' % chain)
    for chain in changed_chains:
        want = ruleset.chains[chain]
        result.script_lines.extend(want)
        verb = 'rewrite' if chain in table.chains else 'create'
        result.actions.append('%s %s (%d rules)' % (verb, chain, len(want)))
    # 2. the jumps: exactly one, rule 1 of its hook; any other jump of ours in a hook goes
    wanted_jumps = set(ruleset.jumps)
    for hook in [c for c in table.order if c in hooks]:
        rules = table.rules.get(hook, [])
        for chain in sorted(our_names):
            positions = [i for i, rule in enumerate(rules) if _jump_target(rule) == chain]
            want = (hook, chain) in wanted_jumps
            if want and positions == [0]:
                continue
            for _pos in positions:
                result.script_lines.append('-D %s -j %s' % (hook, chain))
            if want:
                result.script_lines.append('-I %s 1 -j %s' % (hook, chain))
                if not positions:
                    result.missing_jumps.append((hook, chain))
                    result.actions.append('insert the jump %s -> %s (rule 1)' % (hook, chain))
                else:
                    result.actions.append('move the jump %s -> %s to rule 1 (it was rule %s)'
                                          % (hook, chain, ', '.join(str(p + 1) for p in positions)))
            elif positions:
                result.actions.append('delete the jump %s -> %s' % (hook, chain))
    # 3. chains of ours that are no longer wanted: flush, then delete
    unwanted = [c for c in sorted(our_names) if c in table.chains and c not in ruleset.chains]
    for chain in unwanted:
        result.script_lines.append('-F %s' % chain)
        result.actions.append('delete %s' % chain)
    for chain in unwanted:
        result.script_lines.append('-X %s' % chain)
    return result


def render_install(ruleset):
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


def currency(present, ruleset, existing_bridges=()):
    """The doctor's reading of one family: (state, details). Pure.

    ``state``: 'absent' (none of our chains), 'jump-missing' (a chain is
    there and its jump is not: a dockerd restart or a firewall reload),
    'stale' (differs from what the module would write now), or 'current'.
    Tolerated as current: the interface rules of job networks inside the pool
    created since the last run (the pool rule covers them), and rules of
    bridges that no longer exist (harmless; the next run drops them).
    ``existing_bridges``: every bridge interface the daemon has now.
    """
    table = present if present is not None else Table('filter')
    names = chain_names(ruleset.prefix)
    if not any(c in table.chains for c in names.values()):
        return 'absent', []
    result = plan(table, ruleset)
    if result.problems:
        return 'stale', list(result.problems)
    if result.missing_jumps:
        return 'jump-missing', ['%s -> %s' % jump for jump in result.missing_jumps]
    if not result.actions:
        return 'current', []
    bridges_now = set(existing_bridges or ())
    tolerated = set()
    for bridge in ruleset.pool_bridges:
        tolerated.update(ruleset.per_net.get(bridge, []))
    details = []
    for chain in sorted(set(ruleset.chains) | (set(names.values()) & set(table.chains))):
        want = [r for r in ruleset.chains.get(chain, []) if r not in tolerated]
        have = [r for r in table.rules.get(chain, []) if r not in tolerated and not _vanished(r, bridges_now)]
        if want == have:
            continue
        missing = [r for r in want if r not in have]
        extra = [r for r in have if r not in want]
        what = []
        if chain not in table.chains:
            what.append('the chain is missing')
        elif chain not in ruleset.chains:
            what.append('the chain is no longer wanted')
        else:
            if missing:
                what.append('missing %s' % _some(missing))
            if extra:
                what.append('not wanted %s' % _some(extra))
        details.append('%s: %s' % (chain, ', '.join(what) or 'the rules are in another order'))
    for action in result.actions:
        if action.startswith(('move the jump', 'delete the jump')):
            details.append(action)
    if details:
        return 'stale', details
    have_in = set(table.rules.get(names['INPUT'], []))
    new = [b for b in sorted(ruleset.pool_bridges) if ruleset.per_net.get(b) and ruleset.per_net[b][0] not in have_in]
    if new:
        return 'current', ['%d job network(s) created since the last run (%s) are covered by the pool rule, not yet '
                           'by their interface rules' % (len(new), ', '.join(new[:3]) + (' ...' if len(new) > 3
                                                                                         else ''))]
    return 'current', []


def _some(rules, shown=3):
    more = ' and %d more' % (len(rules) - shown) if len(rules) > shown else ''
    return '"%s"%s' % ('", "'.join(rules[:shown]), more)


def _vanished(rule, bridges_now):
    """True for a per-network rule whose bridge no longer exists (harmless; gone at the next run)."""
    words = rule.split()
    for flag in ('-i', '-o'):
        if flag in words:
            iface = words[words.index(flag) + 1]
            if iface.startswith('br-') and iface not in bridges_now:
                return True
    return False


# --------------------------------------------------------------------------
# The host's iptables (I/O through a Runner)
# --------------------------------------------------------------------------

class Runner(object):
    """Runs a command, optionally inside a network namespace (tests: ``ip netns exec <ns>``)."""

    def __init__(self, netns=None, timeout=30):
        self.netns = netns
        self.timeout = timeout

    def run(self, argv, stdin=None):
        if self.netns:
            argv = ['ip', 'netns', 'exec', self.netns] + list(argv)
        try:
            proc = subprocess.run(argv, input=stdin.encode('utf-8') if stdin is not None else None,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=self.timeout,
                                  check=False)
        except FileNotFoundError:
            return 127, '', '%s: not found' % argv[0]
        except subprocess.TimeoutExpired:
            return 124, '', '%s did not finish within %ss' % (' '.join(argv), self.timeout)
        return (proc.returncode, proc.stdout.decode('utf-8', 'replace'), proc.stderr.decode('utf-8', 'replace'))


def parse_version(text):
    """'nft' or 'legacy' from ``iptables -V`` ("iptables v1.8.9 (nf_tables)" / "(legacy)"), else None.

    iptables before 1.8 prints no variant: that is legacy.
    """
    text = (text or '').strip()
    if not re.match(r'^ip6?tables v\d', text):
        return None
    if '(nf_tables)' in text:
        return 'nft'
    if '(legacy)' in text or '(' not in text:
        return 'legacy'
    return None


class Backend(object):
    """One family's iptables commands on this host."""

    def __init__(self, family, variant, save, restore, version):
        self.family = family
        self.variant = variant
        self.save = save
        self.restore = restore
        self.version = version

    def as_dict(self):
        return dict(family=self.family, variant=self.variant, version=self.version, save=self.save,
                    restore=self.restore)


def _binary(runner, name):
    if runner.netns:
        return name  # resolved inside the namespace's exec, same PATH
    for folder in (os.environ.get('PATH') or '').split(os.pathsep) + ['/usr/sbin', '/sbin']:
        path = os.path.join(folder, name)
        if folder and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return shutil.which(name)


def detect(runner, family, variant='auto'):
    """(Backend, None) or (None, why): which iptables this host's ``iptables`` (``ip6tables``) is.

    ``variant`` 'auto' follows ``iptables -V`` (the Debian alternative Docker
    uses too); 'nft' or 'legacy' picks ``iptables-nft-*`` / ``iptables-legacy-*``.
    """
    base = 'iptables' if family == 'ipv4' else 'ip6tables'
    cmd = base if variant == 'auto' else '%s-%s' % (base, variant)
    if _binary(runner, cmd) is None:
        return None, ('%s is not installed (apt-get install iptables)' % cmd)
    rc, out, err = runner.run([cmd, '-V'])
    if rc != 0:
        return None, '%s -V failed (rc %s): %s' % (cmd, rc, (err or out).strip())
    found = parse_version(out)
    if found is None:
        return None, '%s -V printed %r, which is neither iptables-nft nor iptables-legacy' % (cmd, out.strip())
    if variant != 'auto' and found != variant:
        return None, '%s -V says %s, not %s' % (cmd, found, variant)
    save, restore = '%s-%s-save' % (base, found), '%s-%s-restore' % (base, found)
    if _binary(runner, save) is None or _binary(runner, restore) is None:
        save, restore = '%s-save' % base, '%s-restore' % base
    return Backend(family, found, save, restore, out.strip()), None


def _permission_hint(text):
    low = (text or '').lower()
    if 'permission denied' in low or 'you must be root' in low or 'operation not permitted' in low:
        return ' Run it as root (become: true).'
    return ''


def read_table(runner, backend):
    """The filter table as text (``iptables-save -t filter``); raises FirewallError naming the fix."""
    rc, out, err = runner.run([backend.save, '-t', 'filter'])
    if rc != 0:
        raise FirewallError('%s -t filter failed (rc %s): %s.%s'
                            % (backend.save, rc, (err or out).strip(), _permission_hint(err or out)))
    return out


def apply(runner, backend, script):
    """Feed ``script`` to ``iptables-restore --noflush`` (one atomic transaction per family)."""
    rc, out, err = runner.run([backend.restore, '-w', '10', '--noflush'], stdin=script)
    if rc != 0:
        raise FirewallError('%s --noflush failed (rc %s): %s.%s Nothing of this family was changed (the restore '
                            'is one transaction). The input was:\n%s'
                            % (backend.restore, rc, (err or out).strip(), _permission_hint(err or out), script))


def forward_hook_for(table, family):
    """DOCKER-USER when this family's filter table has it. IPv6 without it (Docker's ip6tables off): FORWARD."""
    if table is not None and FORWARD_HOOK in table.chains:
        return FORWARD_HOOK
    if family == 'ipv6':
        return 'FORWARD'
    return FORWARD_HOOK  # plan() then says DOCKER-USER is missing and how to fix it


def endpoint_ports(deploy_dir):
    """The declared model-endpoint ports in ``<deploy_dir>/model-endpoints.json`` (sorted)."""
    from ansible_collections.pi_dispatch.egress.plugins.module_utils import _endpoints
    try:
        endpoints, _path, _exists = _endpoints.load(deploy_dir)
    except Exception as exc:  # EndpointsError names the file, the key and the fix
        raise FirewallError('The model endpoints could not be read for the upstream ports: %s'
                            % ' '.join(str(exc).split()))
    return sorted(set(int(e.port) for e in endpoints))


def compute(networks, family, table, prefix=DEFAULT_PREFIX, pool=None, names=None, upstream=None,
            base_ports=None, endpoint_port_list=None, endpoints=False, created_table=False):
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


def present_params(table, prefix):
    """The parameters comment of an installed layer (dict from :func:`parse_params`), or None."""
    chain = chain_names(prefix)['INPUT']
    for rule in (table.rules.get(chain, []) if table is not None else []):
        match = re.match(r'^-A \S+ -m comment --comment "(.*)"$', rule)
        if match:
            return parse_params(match.group(1))
    return None


def _full_save_has_filter(runner, backend):
    """Whether this family's filter table exists at all (``iptables-save`` without -t lists only existing ones)."""
    rc, out, _err = runner.run([backend.save])
    return rc != 0 or any(line.strip() == '*filter' for line in out.splitlines())


def _empty_builtin(table):
    return (table is not None and all(not rules for rules in table.rules.values())
            and set(table.chains) <= {'INPUT', 'FORWARD', 'OUTPUT'}
            and all(policy == 'ACCEPT' for policy in table.chains.values()))


def converge(networks, runner, state='present', prefix=DEFAULT_PREFIX, pool=None, names=None,
             upstream=DEFAULT_UPSTREAM, base_ports=None, endpoint_port_list=None, endpoints=False, ipv6=True,
             variant='auto', check_mode=False):
    """Make this host's iptables match (both families); the module's whole job.

    ``networks``: the daemon's network list (``client.api.networks()``).
    Both families are read and planned before anything is applied; each
    family is then one ``iptables-restore --noflush`` transaction, re-read
    afterwards to prove it took. Returns a dict: changed, actions,
    families (per family: variant, version, actions, script, before, after,
    skipped), messages, networks, install (per family: the restore input
    for the boot unit).
    """
    validate_prefix(prefix)
    result = dict(changed=False, actions=[], families={}, messages=[], networks=[], install={})
    planned = []
    for family in FAMILIES:
        if family == 'ipv6' and not ipv6:
            result['families'][family] = dict(skipped='ipv6 is false')
            continue
        backend, why = detect(runner, family, variant)
        if backend is None:
            if family == 'ipv4':
                raise FirewallError('The host firewall layer needs iptables: %s.' % why)
            result['families'][family] = dict(skipped=why)
            result['messages'].append('IPv6 skipped: %s' % why)
            continue
        table = parse_save(read_table(runner, backend)).get('filter')
        created_table = False
        if table is None or not _full_save_has_filter(runner, backend):
            created_table = True
        if table is None:
            table = Table('filter')
            for chain in ('INPUT', 'FORWARD', 'OUTPUT'):
                table.add_chain(chain, 'ACCEPT')
        installed = present_params(table, prefix)
        if installed is not None and installed.get('created_table'):
            created_table = True
        if state == 'absent':
            ruleset, notes = empty(family, prefix), []
        else:
            ruleset, notes = compute(networks, family, table, prefix, pool, names, upstream, base_ports,
                                     endpoint_port_list, endpoints, created_table)
            if family == 'ipv4':
                result['networks'] = [n.as_dict() for n in ruleset.nets]
            if ruleset.jumps and ruleset.jumps[-1][0] == 'FORWARD' and family == 'ipv6':
                result['messages'].append('IPv6: there is no DOCKER-USER chain in the ip6tables filter table (Docker '
                                          'does not manage ip6tables here), so %s is jumped from FORWARD'
                                          % chain_names(prefix)['FORWARD'])
        result['messages'].extend(notes if family == 'ipv4' else [])
        steps = plan(table, ruleset)
        if steps.problems:
            raise FirewallError('%s (%s, %s): %s. Nothing was changed.' % (
                family, backend.variant, backend.restore, '; '.join(steps.problems)))
        drop_table = (state == 'absent' and created_table and backend.variant == 'nft' and steps.changed)
        planned.append((backend, steps, ruleset, drop_table))
        result['install'][family] = render_install(ruleset) if state == 'present' else ''
        result['families'][family] = dict(variant=backend.variant, version=backend.version,
                                          actions=list(steps.actions), script=steps.script(),
                                          before='\n'.join(steps.before) + ('\n' if steps.before else ''),
                                          after='\n'.join(steps.after) + ('\n' if steps.after else ''))
        result['actions'].extend('%s: %s' % (family, action) for action in steps.actions)
        if drop_table:
            result['actions'].append('%s: delete the filter table this layer created (it is empty again)' % family)
    for backend, steps, ruleset, drop_table in planned:
        if not steps.changed:
            continue
        result['changed'] = True
        if check_mode:
            continue
        apply(runner, backend, steps.script())
        after = parse_save(read_table(runner, backend)).get('filter')
        again = plan(after, ruleset)
        if again.actions:
            raise FirewallError('%s: after %s the table still differs (%s); another tool may be rewriting it at the '
                                'same time. Re-run.' % (backend.family, backend.restore, '; '.join(again.actions)))
        if drop_table and _empty_builtin(after):
            table_family = 'ip' if backend.family == 'ipv4' else 'ip6'
            rc, out, err = runner.run(['nft', 'delete', 'table', table_family, 'filter'])
            if rc != 0:
                result['messages'].append('%s: the empty filter table this layer created could not be deleted '
                                          '(nft delete table %s filter: %s)' % (backend.family, table_family,
                                                                                (err or out).strip()))
    return result
