# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The host-firewall layer: the table that is there, and what it takes to make it the wanted one.

Pure. :func:`parse_save` reads ``iptables-save`` output into a
:class:`Table`; :func:`plan` compares it with a wanted ruleset and writes the
``iptables-restore --noflush`` input that makes them match, touching only
the layer's own chains and jumps; :func:`currency` is the doctor's reading
(absent, jump-missing, stale or current); :func:`present_params` reads back
the parameters an installed layer recorded.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._firewall.params import (
    FORWARD_HOOK,
    INPUT_HOOK,
    FirewallError,
    chain_names,
    parse_params,
)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._firewall.rules import Ruleset, ruleset_lines

# --------------------------------------------------------------------------
# iptables-save (pure)
# --------------------------------------------------------------------------

_COUNTERS_RE = re.compile(r'\[\d+:\d+\]')


class Table(object):
    """One table of iptables-save output: chains (name -> policy, in order) and rules per chain."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.chains = {}
        self.order = []
        self.rules = {}

    def add_chain(self, chain: str, policy: str) -> None:
        if chain not in self.chains:
            self.order.append(chain)
            self.rules.setdefault(chain, [])
        self.chains[chain] = policy


def parse_save(text: Optional[str]) -> Dict[str, Table]:
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


def strip_counters(text: Optional[str]) -> str:
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


def _target(rule: str) -> Optional[str]:
    words = rule.split()
    for flag in ('-j', '-g'):
        if flag in words[:-1]:
            return words[words.index(flag) + 1]
    return None


def _jump_target(rule: str) -> Optional[str]:
    words = rule.split()
    if len(words) == 4 and words[0] == '-A' and words[2] == '-j':
        return words[3]
    return None


def ours(table: Table, prefix: str) -> List[str]:
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


# --------------------------------------------------------------------------
# wanted vs present (pure)
# --------------------------------------------------------------------------

class Plan(object):
    """What :func:`plan` found: the actions, the iptables-restore input that does them, problems."""

    def __init__(self, family: str) -> None:
        self.family = family
        self.actions = []
        self.script_lines = []
        self.problems = []
        self.missing_jumps = []
        self.before = []
        self.after = []

    @property
    def changed(self) -> bool:
        return bool(self.actions)

    def script(self) -> str:
        if not self.script_lines:
            return ''
        return '*filter\n' + '\n'.join(self.script_lines) + '\nCOMMIT\n'


def plan(present: Optional[Table], ruleset: Ruleset) -> Plan:
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


# --------------------------------------------------------------------------
# The doctor's reading (pure)
# --------------------------------------------------------------------------

def currency(present: Optional[Table], ruleset: Ruleset, existing_bridges: Iterable[str] = ()) -> Tuple[str, List[str]]:
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


def _some(rules: Sequence[str], shown: int = 3) -> str:
    more = ' and %d more' % (len(rules) - shown) if len(rules) > shown else ''
    return '"%s"%s' % ('", "'.join(rules[:shown]), more)


def _vanished(rule: str, bridges_now: Set[str]) -> bool:
    """True for a per-network rule whose bridge no longer exists (harmless; gone at the next run)."""
    words = rule.split()
    for flag in ('-i', '-o'):
        if flag in words:
            iface = words[words.index(flag) + 1]
            if iface.startswith('br-') and iface not in bridges_now:
                return True
    return False


# --------------------------------------------------------------------------
# An installed layer's parameters (pure)
# --------------------------------------------------------------------------

def present_params(table: Optional[Table], prefix: str) -> Optional[Dict[str, Any]]:
    """The parameters comment of an installed layer (dict from :func:`parse_params`), or None."""
    chain = chain_names(prefix)['INPUT']
    for rule in (table.rules.get(chain, []) if table is not None else []):
        match = re.match(r'^-A \S+ -m comment --comment "(.*)"$', rule)
        if match:
            return parse_params(match.group(1))
    return None
