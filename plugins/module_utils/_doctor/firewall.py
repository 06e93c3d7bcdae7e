# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The doctor's host-firewall lines: the layer is present and current, and a live gateway probe.

* **Presence** (``firewall.current`` / ``jump_missing`` / ``stale`` / ``off``
  / ``unchecked``): the layer's chains and jumps are read with iptables-save
  and compared with what ``egress_firewall`` would write now, recomputed from
  the daemon with the parameters the layer recorded in its own comment rule
  (:func:`_firewall.currency`).
* **The probe** (``firewall.probe_silent`` / ``probe_answered`` /
  ``probe_leaks`` / ``probe_notrun``): a throwaway job network from the job
  pool, ``pi-job-doctor-<pid>-fw-net``, a listener this process opens on that
  network's gateway address (the host), and a probe container
  ``pi-dispatch-egress-probe-firewall-<pid>`` that dials it, bounded. With the
  layer on nothing may answer; with it off the line is a warning that names
  ``egress_firewall_enabled``.
* **Leftovers** (``firewall.leftover`` / ``firewall.cleanup``): a probe
  network and probe a killed doctor left (its pid dead, the daemon local).

The catalogue rows are in ``_doctor_lines.LINES`` (group ``firewall``);
``docs/doctor.md`` has one row per id.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._firewall import host as _fw_host
from ansible_collections.pi_dispatch.egress.plugins.module_utils._firewall import params as _fw_params
from ansible_collections.pi_dispatch.egress.plugins.module_utils._firewall import rules as _fw_rules
from ansible_collections.pi_dispatch.egress.plugins.module_utils._firewall import table as _fw_table
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import lifecycle as _jobnet_lifecycle
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import names as _jobnet_names
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import pool as _jobnet_pool
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.containers import run_container
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.context import Check, DoctorContext
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.lines import Line
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.names import (
    LABEL, daemon_locality, pid_alive, probe_name)

DEFAULTS = dict(enabled=True, chain_prefix=_fw_params.DEFAULT_PREFIX, probe=True, probe_timeout=3)
PROBE_NET_RE = re.compile(r'^pi-job-doctor-(\d+)-fw-net$')
MARK = 'PIDOCTOR-FW'
VARIABLE = 'egress_firewall_enabled'
FIX_ON = 'set %s: true and run ansible-playbook pi_dispatch.egress.site (docs/firewall.md)' % VARIABLE
FIX_RERUN = 'ansible-playbook pi_dispatch.egress.site -e %s=true (puts the layer back as it should be)' % VARIABLE


def probe_job_id(pid: int) -> str:
    return 'doctor-%d-fw' % int(pid)


def probe_network_name(pid: int) -> str:
    return _jobnet_names.network_name(probe_job_id(pid))


def probe_script(url: str, timeout: int) -> str:
    """One bounded direct connection (no proxy), then a parseable trailer: MARK rc code error."""
    return ("curl -sS --noproxy '*' --connect-timeout %d --max-time %d -o /dev/null -w '%%{http_code}' '%s' "
            ">/tmp/o 2>/tmp/e; rc=$?; echo \"%s $rc $(cat /tmp/o) $(head -c 200 /tmp/e | tr '\\n' ' ')\"\n"
            % (int(timeout), int(timeout) + 2, url, MARK))


def parse_probe(text: Optional[str]) -> Optional[Dict[str, Any]]:
    """dict(rc, code, error) from the probe's output, or None."""
    for raw in (text or '').splitlines():
        if raw.startswith(MARK + ' '):
            words = raw.split(None, 3)
            if len(words) < 3 or not words[1].lstrip('-').isdigit():
                return None
            code = int(words[2]) if words[2].isdigit() else 0
            error = words[3].strip() if len(words) > 3 else ''
            if not words[2].isdigit():
                error = ' '.join(words[2:]).strip()
            return dict(rc=int(words[1]), code=code, error=error)
    return None


def classify_probe(result: Optional[Dict[str, Any]], why: Optional[str], hits: int, installed: bool, target: str,
                   net: str, timeout: int = DEFAULTS['probe_timeout']) -> Line:
    """The probe line. Pure.

    ``result``: :func:`parse_probe` output or None (then ``why``); ``hits``:
    connections the listener accepted; ``installed``: whether the layer's
    chains are on this host. Answered = the listener saw a connection, curl
    got an HTTP code, or the connection was refused (packets reached the host).
    """
    if result is None and not hits:
        return Line('firewall.probe_notrun', 'notrun', 'Job network gateway probe did not run (%s)' % why)
    answered = bool(hits) or (result is not None and (result['code'] or result['rc'] == 7))
    if answered:
        how = 'the listener accepted %d connection(s)' % hits if hits else (
            'HTTP %d' % result['code'] if result['code'] else 'connection refused: packets reached the host')
        if installed:
            return Line('firewall.probe_leaks', 'fail',
                        'Job network gateway answered although the host firewall layer is installed (%s on %s: %s)'
                        % (target, net, how),
                        fix='iptables-save | grep -n %s; a rule above the layer\'s jump may accept it; %s'
                            % (_fw_params.DEFAULT_PREFIX, FIX_RERUN))
        return Line('firewall.probe_answered', 'warn',
                    'Job network gateway answered (%s on %s: %s): every service on 0.0.0.0 of this host answers '
                    'every job; the host firewall layer is off (%s)' % (target, net, how, VARIABLE), fix=FIX_ON)
    if result['rc'] == 28:
        return Line('firewall.probe_silent', 'ok',
                    'Job network gateway answers nothing (%s on %s, where the doctor listened: no answer within %ss)'
                    % (target, net, timeout))
    return Line('firewall.probe_notrun', 'notrun', 'Job network gateway probe did not run (curl exit %d%s)'
                % (result['rc'], ': ' + result['error'] if result['error'] else ''))


def presence_line(states: Dict[str, Tuple[str, List[str]]], prefix: str,
                  families: Dict[str, str]) -> Tuple[Line, bool]:
    """The presence line from each family's (state, details). Pure.

    ``states``: family -> (state, details) for the families read;
    ``families``: family -> 'variant' text for the message.
    """
    v4 = states.get('ipv4', ('absent', []))
    if all(state == 'absent' for state, _d in states.values()):
        return Line('firewall.off', 'notrun',
                    'Host firewall layer is not installed (no %s chains; %s is false or was never applied)'
                    % (prefix, VARIABLE), fix=FIX_ON), False
    missing = ['%s %s' % (family, d) for family, (state, details) in sorted(states.items())
               if state == 'jump-missing' for d in details]
    if missing:
        return Line('firewall.jump_missing', 'fail',
                    'Host firewall layer: the jump %s is missing, so its chain is there and nothing reaches it (a '
                    'dockerd restart re-creates DOCKER-USER; a firewall reload flushes INPUT)' % ', '.join(missing),
                    fix=FIX_RERUN), True
    stale = ['%s: %s' % (family, '; '.join(details) or state) for family, (state, details) in sorted(states.items())
             if state in ('stale',) or (family == 'ipv4' and state == 'absent')]
    if stale:
        return Line('firewall.stale', 'warn',
                    'Host firewall layer is not current (%s)' % ' | '.join(stale), fix=FIX_RERUN), True
    notes = [d for _f, (state, details) in sorted(states.items()) if state == 'current' for d in details]
    shown = ', '.join('%s %s' % (family, families.get(family, '')) for family in sorted(states)
                      if states[family][0] == 'current')
    return Line('firewall.current', 'ok',
                'Host firewall layer present and current (%s chains and their jumps from INPUT and DOCKER-USER match '
                'what egress_firewall would write; %s%s)' % (prefix, shown, '; ' + '; '.join(notes) if notes else '')
                ), v4[0] != 'absent'


class FirewallDoctor(object):
    """The daemon and host side, over the run's context ``ctx``; ``options``: the firewall options dict."""

    def __init__(self, ctx: DoctorContext, options: Optional[dict] = None, runner: Any = None) -> None:
        self.ctx = ctx
        self.options = dict(DEFAULTS, **(options or {}))
        self.prefix = self.options['chain_prefix']
        self.runner = runner or _fw_host.Runner()

    def _line(self, line_id: str, status: str, message: str, fix: Optional[str] = None) -> Line:
        return Line(line_id, status, message, fix=fix)

    def local(self) -> bool:
        return daemon_locality(self.ctx.docker_host, self.ctx.environ)[0]

    def run(self) -> List[Line]:
        lines, rest = self.split()
        return lines + (rest() if rest is not None else [])

    def split(self) -> Tuple[List[Line], Optional[Callable[[], List[Line]]]]:
        """(the sweep's and the presence lines, read now; the gateway probe still to run, or None).

        The doctor reads the presence before its canary makes any network (a network outside the pool
        created since reads as stale) and runs the probe, on its own job network from the pool, beside
        the canary; its line follows the presence line in the report either way.
        """
        if not self.options['enabled']:
            return [], None
        lines = []
        if not self.local():
            return [self._line('firewall.unchecked', 'notrun', 'Host firewall layer could not be checked (the daemon '
                               'is not a unix socket on this host, and the layer is the daemon host\'s)')], None
        lines.extend(self.sweep())
        line, installed = self.presence()
        lines.append(line)
        if not self.options['probe']:
            return lines, None
        return lines, lambda: [self.probe(installed)]

    # --- presence -------------------------------------------------------------------------------
    def presence(self) -> Tuple[Line, bool]:
        try:
            _fw_params.validate_prefix(self.prefix)
            networks = self.ctx.client.api.networks()
        except _fw_params.FirewallError as exc:
            return self._line('firewall.unchecked', 'notrun', 'Host firewall layer could not be checked (%s)'
                              % exc), False
        except Exception as exc:
            return self._line('firewall.unchecked', 'notrun', 'Host firewall layer could not be checked (listing '
                              'networks: %s)' % dc.api_message(exc)), False
        bridges = [b for b in (_fw_rules.bridge_of(n) for n in networks) if b]
        states, variants = {}, {}
        for family in _fw_params.FAMILIES:
            backend, why = _fw_host.detect(self.runner, family)
            if backend is None:
                if family == 'ipv4':
                    return self._line('firewall.unchecked', 'notrun', 'Host firewall layer could not be checked '
                                      '(%s)' % why), False
                continue
            try:
                table = _fw_table.parse_save(_fw_host.read_table(self.runner, backend)).get('filter')
            except _fw_params.FirewallError as exc:
                return self._line('firewall.unchecked', 'notrun', 'Host firewall layer could not be checked (%s)'
                                  % ' '.join(str(exc).split())), False
            variants[family] = backend.variant
            if table is None or not any(c in table.chains for c in _fw_params.chain_names(self.prefix).values()):
                states[family] = ('absent', [])
                continue
            params = _fw_table.present_params(table, self.prefix)
            if params is None:
                states[family] = ('stale', ['%s-INPUT has no parameters comment: it was not written by this '
                                            'version of egress_firewall' % self.prefix])
                continue
            try:
                ports = _fw_params.endpoint_ports(self.ctx.deploy_dir) if params['endpoints'] else []
                ruleset, _notes = _fw_rules.compute(networks, family, table, self.prefix, params['pool'],
                                                    params['networks'], params['upstream'], params['ports'], ports,
                                                    params['endpoints'], params['created_table'])
            except _fw_params.FirewallError as exc:
                states[family] = ('stale', [' '.join(str(exc).split())])
                continue
            states[family] = _fw_table.currency(table, ruleset, bridges)
        if states.get('ipv6', ('absent',))[0] == 'absent' and 'ipv6' in states and states['ipv4'][0] != 'absent':
            del states['ipv6']  # ipv6: false, or a host without IPv6 tables: not a drift
        return presence_line(states, self.prefix, variants)

    # --- the probe -------------------------------------------------------------------------------
    def probe(self, installed: bool) -> Line:
        ctx = self.ctx
        client = ctx.client
        name = probe_network_name(ctx.pid)
        probe = probe_name('firewall', ctx.pid)
        timeout = int(self.options['probe_timeout'])
        try:
            if dc.get_image(client, ctx.probe_image) is None:
                return self._line('firewall.probe_notrun', 'notrun', 'Job network gateway probe did not run (the '
                                  'probe image %s is not on this daemon)' % ctx.probe_image)
        except dc.EngineError as exc:
            return self._line('firewall.probe_notrun', 'notrun', 'Job network gateway probe did not run (%s)' % exc)
        listener = None
        created = False
        try:
            try:
                gateway = self._create_network(name)
                created = True
            except Exception as exc:
                return self._line('firewall.probe_notrun', 'notrun', 'Job network gateway probe did not run '
                                  '(creating %s: %s)' % (name, ' '.join(str(exc).split())),
                                  fix='ansible-playbook pi_dispatch.egress.gc frees the pool')
            try:
                listener = Listener(gateway)
            except (OSError, socket.error) as exc:
                return self._line('firewall.probe_notrun', 'notrun', 'Job network gateway probe did not run '
                                  '(listening on %s: %s)' % (gateway, exc))
            target = '%s:%d' % (gateway, listener.port)
            results = {}
            run_container(ctx, 'firewall', probe, probe_script('http://%s/' % target, timeout), name, results,
                          timeout + 2 + ctx.start_grace)
            text, why = results.get('firewall', (None, 'it did not finish'))
            listener.stop()
            result = parse_probe(text) if text is not None else None
            if text is not None and result is None:
                why = 'the probe printed no result (%s)' % (' '.join(text.split())[-200:] or 'no output')
            line = classify_probe(result, why, listener.hits, installed, target, name, timeout)
            if line.id == 'firewall.probe_leaks':
                line.fix = line.fix.replace(_fw_params.DEFAULT_PREFIX, self.prefix)
            return line
        finally:
            if listener is not None:
                listener.stop()
            self._teardown(name, probe, created)

    def _create_network(self, name: str) -> str:
        """Create the probe's job network from the pool (a few tries when another creator wins a subnet)."""
        from docker.types import IPAMConfig, IPAMPool
        ctx = self.ctx
        labels = _jobnet_names.job_labels(probe_job_id(ctx.pid))
        labels[LABEL] = str(ctx.pid)
        last = None
        for _attempt in range(_jobnet_lifecycle.CREATE_ATTEMPTS):
            subnet = _jobnet_pool.plan_subnet(ctx.client, ctx.job_pool, ctx.job_prefix)
            try:
                ctx.client.api.create_network(name, driver='bridge', internal=True, labels=labels,
                                              ipam=IPAMConfig(pool_configs=[IPAMPool(subnet=str(subnet))]))
            except Exception as exc:
                last = exc
                if 'overlap' in dc.api_message(exc).lower():
                    continue
                raise dc.EngineError(dc.api_message(exc))
            attrs = ctx.client.api.inspect_network(name)
            for cfg in (attrs.get('IPAM') or {}).get('Config') or []:
                if cfg.get('Gateway'):
                    return cfg['Gateway'].split('/')[0]
            return str(next(subnet.hosts()))
        raise dc.EngineError('every subnet tried overlapped another network (%s)' % dc.api_message(last))

    def _teardown(self, name: str, probe: str, created: bool) -> None:
        client = self.ctx.client
        dc.remove_quietly(client.api, probe)
        if created:
            try:
                client.api.remove_network(name)
            except Exception as exc:
                if not dc.is_not_found(exc):
                    self.ctx.actions.append('the firewall probe network %s could not be removed: %s'
                                            % (name, dc.api_message(exc)))

    # --- leftovers of a killed run -----------------------------------------------------------------
    def sweep(self) -> List[Line]:
        ctx = self.ctx
        try:
            nets = ctx.client.api.networks(filters={'name': 'pi-job-doctor-'})
        except Exception:
            return []  # the main sweep reports a listing that fails
        lines = []
        for net in sorted(nets, key=lambda n: n.get('Name') or ''):
            match = PROBE_NET_RE.match(net.get('Name') or '')
            if not match:
                continue
            pid = int(match.group(1))
            if pid == ctx.pid or pid_alive(pid):
                continue
            name, probe = net['Name'], probe_name('firewall', pid)
            if ctx.check_mode:
                lines.append(self._line('firewall.leftover', 'warn', 'Firewall probe: %s (and %s) would be removed, '
                                        'left by an EARLIER doctor run; check mode sweeps nothing' % (name, probe),
                                        fix='run doctor without --check'))
                continue
            try:
                ctx.client.api.remove_container(probe, force=True)
            except Exception as exc:
                if not dc.is_not_found(exc):
                    lines.append(self._line('firewall.cleanup', 'warn', 'Firewall probe: %s could not be removed (%s)'
                                            % (probe, dc.api_message(exc)), fix='docker rm -f %s' % probe))
                    continue
            try:
                ctx.client.api.remove_network(name)
            except Exception as exc:
                if not dc.is_not_found(exc):
                    lines.append(self._line('firewall.cleanup', 'warn', 'Firewall probe: %s could not be removed (%s)'
                                            % (name, dc.api_message(exc)),
                                            fix='docker network inspect %s, then docker network rm %s' % (name, name)))
                    continue
            ctx.actions.append('removed leftover firewall probe network %s' % name)
            lines.append(self._line('firewall.leftover', 'ok', 'Firewall probe: removed %s (and %s), left by an '
                                    'EARLIER doctor run' % (name, probe)))
        return lines


class Listener(object):
    """A TCP listener on ``address``:ephemeral in this process, counting accepted connections (bounded)."""

    def __init__(self, address: str, lifetime: float = 120) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((address, 0))
        self.sock.listen(8)
        self.sock.settimeout(0.5)
        self.port = self.sock.getsockname()[1]
        self.hits = 0
        self._stop = threading.Event()
        self._deadline = time.monotonic() + lifetime
        self._thread = threading.Thread(target=self._serve)
        self._thread.daemon = True
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set() and time.monotonic() < self._deadline:
            try:
                conn, _peer = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self.hits += 1
            try:
                conn.sendall(b'HTTP/1.0 200 OK\r\nContent-Length: 12\r\n\r\nPIDOCTOR-FW\n')
            except OSError:
                pass
            conn.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)
        try:
            self.sock.close()
        except OSError:
            pass


class FirewallCheck(Check):
    """Every firewall line for one doctor run, with the options in ``ctx.firewall``.

    ``split(ctx)`` is the same in two steps (``FirewallDoctor.split``): the doctor reads the presence
    before its canary and runs the probe beside it.
    """

    def lines(self, ctx: DoctorContext) -> List[Line]:
        return FirewallDoctor(ctx, ctx.firewall).run()

    def split(self, ctx: DoctorContext) -> Tuple[List[Line], Optional[Callable[[], List[Line]]]]:
        return FirewallDoctor(ctx, ctx.firewall).split()
