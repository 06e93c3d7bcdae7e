# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The host-firewall layer on this host: which iptables it has, reading and applying, converging.

The only I/O of the layer (``iptables -V``, ``iptables-save``,
``iptables-restore --noflush``, ``nft delete table``), all through a
:class:`Runner` so tests can point it at a throwaway network namespace.
:func:`converge` is the module's whole job: read and plan both families,
then apply each as one transaction and re-read it to prove it took.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._firewall.params import (
    DEFAULT_PREFIX,
    DEFAULT_UPSTREAM,
    FAMILIES,
    FirewallError,
    chain_names,
    validate_prefix,
)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._firewall.rules import (
    compute,
    empty,
    render_install,
)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._firewall.table import (
    Table,
    parse_save,
    plan,
    present_params,
)


# --------------------------------------------------------------------------
# The host's iptables (I/O through a Runner)
# --------------------------------------------------------------------------

class Runner(object):
    """Runs a command, optionally inside a network namespace (tests: ``ip netns exec <ns>``)."""

    def __init__(self, netns: Optional[str] = None, timeout: float = 30) -> None:
        self.netns = netns
        self.timeout = timeout

    def run(self, argv: Sequence[str], stdin: Optional[str] = None) -> Tuple[int, str, str]:
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


def parse_version(text: Optional[str]) -> Optional[str]:
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

    def __init__(self, family: str, variant: str, save: str, restore: str, version: str) -> None:
        self.family = family
        self.variant = variant
        self.save = save
        self.restore = restore
        self.version = version

    def as_dict(self) -> Dict[str, str]:
        return dict(family=self.family, variant=self.variant, version=self.version, save=self.save,
                    restore=self.restore)


def _binary(runner: Runner, name: str) -> Optional[str]:
    if runner.netns:
        return name  # resolved inside the namespace's exec, same PATH
    for folder in (os.environ.get('PATH') or '').split(os.pathsep) + ['/usr/sbin', '/sbin']:
        path = os.path.join(folder, name)
        if folder and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return shutil.which(name)


def detect(runner: Runner, family: str, variant: str = 'auto') -> Tuple[Optional[Backend], Optional[str]]:
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


def _permission_hint(text: Optional[str]) -> str:
    low = (text or '').lower()
    if 'permission denied' in low or 'you must be root' in low or 'operation not permitted' in low:
        return ' Run it as root (become: true).'
    return ''


def read_table(runner: Runner, backend: Backend) -> str:
    """The filter table as text (``iptables-save -t filter``); raises FirewallError naming the fix."""
    rc, out, err = runner.run([backend.save, '-t', 'filter'])
    if rc != 0:
        raise FirewallError('%s -t filter failed (rc %s): %s.%s'
                            % (backend.save, rc, (err or out).strip(), _permission_hint(err or out)))
    return out


def apply(runner: Runner, backend: Backend, script: str) -> None:
    """Feed ``script`` to ``iptables-restore --noflush`` (one atomic transaction per family)."""
    rc, out, err = runner.run([backend.restore, '-w', '10', '--noflush'], stdin=script)
    if rc != 0:
        raise FirewallError('%s --noflush failed (rc %s): %s.%s Nothing of this family was changed (the restore '
                            'is one transaction). The input was:\n%s'
                            % (backend.restore, rc, (err or out).strip(), _permission_hint(err or out), script))


# --------------------------------------------------------------------------
# Converging: both families, planned, then applied
# --------------------------------------------------------------------------

def _full_save_has_filter(runner: Runner, backend: Backend) -> bool:
    """Whether this family's filter table exists at all (``iptables-save`` without -t lists only existing ones)."""
    rc, out, _err = runner.run([backend.save])
    return rc != 0 or any(line.strip() == '*filter' for line in out.splitlines())


def _empty_builtin(table: Optional[Table]) -> bool:
    return (table is not None and all(not rules for rules in table.rules.values())
            and set(table.chains) <= {'INPUT', 'FORWARD', 'OUTPUT'}
            and all(policy == 'ACCEPT' for policy in table.chains.values()))


def converge(networks: Optional[List[Dict[str, Any]]], runner: Runner, state: str = 'present',
             prefix: str = DEFAULT_PREFIX, pool: Optional[str] = None, names: Optional[Sequence[str]] = None,
             upstream: Optional[str] = DEFAULT_UPSTREAM, base_ports: Optional[Sequence[int]] = None,
             endpoint_port_list: Optional[Sequence[int]] = None, endpoints: bool = False, ipv6: bool = True,
             variant: str = 'auto', check_mode: bool = False) -> Dict[str, Any]:
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
