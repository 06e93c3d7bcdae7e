# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The doctor's transparent check: the gateway, the opt-ins set to ``true``, and a transparent canary.

Runs only when the run names a gateway (``egress_canary``'s ``gateway_name``, the doctor role's
``doctor_gateway_name``). The canary makes a real transparent job network
``pi-job-doctor-<pid>-t-net`` with the job-network API (opted in to ``transparent_port``, when one is
given), and runs one probe container on it with **no proxy variable** and the gateway as its resolver:

* ``https://<provider>/`` and ``http://<provider>/`` must be answered (through the gateway's relays
  and squid);
* ``https://<deny>/`` and a unique name below the deny host must not resolve, and the gateway must
  have answered that NXDOMAIN itself (its ``dns-nxdomain`` count for the network; the gateway never
  sends an uncovered name anywhere);
* TCP 22 (23 when ``transparent_port`` is on 22) and UDP 123 to the provider (not opted in) must not
  connect, and the gateway's drop counter for the network must have grown;
* ``transparent_port`` (``host:port``, opted in for this network only) must connect.

Everything it made is removed at the end of the run (the job network through the API's teardown).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.containers import run_job_probe
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.context import Check, DoctorContext
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.lines import Line
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.names import probe_name
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import lifecycle as _lifecycle
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import teardown as _teardown
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import transparent as _transparent

# What the probe container runs: one line per probe, "<probe> <curl exit> <connect seconds> <http code>".
# ``tcp`` dials a port no opt-in of the canary's network opens (22, or 23 when transparent_port is on 22).
PROBES = ('https', 'http', 'deny', 'dns', 'tcp', 'udp123', 'port')


def drop_port(port_target: Optional[str]) -> int:
    """The TCP port the drop probe dials: 22, unless the canary opts 22 in (then 23)."""
    return 23 if port_target and port_target.rpartition(':')[2] == '22' else 22


def canary_job_id(pid: int) -> str:
    return 'doctor-%d-t' % pid


def probe_script(provider: str, deny: str, unique: str, port_target: Optional[str], timeout: int) -> str:
    """The probe container's sh script (curl only, as the explicit canary's)."""
    def one(probe: str, url: str, t: int = timeout) -> str:
        return ("curl -sk -o /dev/null --max-time %d -w '%%{time_connect} %%{http_code}' '%s' > /tmp/o 2>/dev/null "
                "</dev/null; echo \"%s $? $(cat /tmp/o)\"" % (t, url, probe))
    steps = [
        one('https', 'https://%s/' % provider),
        one('http', 'http://%s/' % provider),
        one('deny', 'https://%s/' % deny),
        one('dns', 'https://%s.%s/' % (unique, deny)),
        one('tcp', 'telnet://%s:%d' % (provider, drop_port(port_target)), min(timeout, 4)),
        one('udp123', 'tftp://%s:123/pi-doctor' % provider, min(timeout, 4)),
    ]
    if port_target:
        steps.append(one('port', 'telnet://%s' % port_target, min(timeout, 4)))
    return '; '.join(steps)


def parse_probe_lines(text: str) -> Dict[str, Tuple[int, float, int]]:
    """probe -> (curl exit, connect seconds, http code), from the script's output (other lines ignored)."""
    out = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) == 4 and words[0] in PROBES:
            try:
                out[words[0]] = (int(words[1]), float(words[2]), int(words[3]))
            except ValueError:
                continue
    return out


def classify(results: Dict[str, Tuple[int, float, int]], provider: str, deny: str, unique: str,
             port_target: Optional[str], nxdomain_counted: int, dropped: int) -> List[Line]:
    """The canary's lines from the probes and the gateway's counts (pure)."""
    lines = []

    def missing(probe: str) -> bool:
        if probe in results:
            return False
        lines.append(Line('transparent.notrun', 'notrun',
                          'Transparent canary probe %s did not run (the probe printed no result for it)' % probe))
        return True

    for probe, scheme in (('https', 'https'), ('http', 'http')):
        if missing(probe):
            continue
        code, _connect, http = results[probe]
        if http > 0:
            lines.append(Line('transparent.%s' % probe, 'ok',
                              'Transparent job reaches %s://%s/ with no proxy variable (HTTP %d, through the gateway '
                              'and the proxy)' % (scheme, provider, http)))
        else:
            lines.append(Line('transparent.%s_unreached' % probe, 'warn',
                              'Transparent job does not reach %s://%s/ (curl exit %d)' % (scheme, provider, code),
                              fix='docker logs --tail 30 <gateway>; the explicit canary above says whether the proxy '
                                  'reaches it'))
    if not missing('deny'):
        code, _connect, http = results['deny']
        if http == 0 and code == 6:
            lines.append(Line('transparent.deny', 'ok',
                              'Transparent job cannot resolve the unlisted %s, so it reaches nothing there' % deny))
        else:
            lines.append(Line('transparent.deny_leaks', 'fail',
                              'Transparent job resolves or reaches the unlisted %s (curl exit %d, HTTP %d)'
                              % (deny, code, http),
                              fix='the gateway answers a name the allowlist does not cover: compare its '
                                  'egress-allowlist.conf mount with the deployment folder'))
    if not missing('dns'):
        code, _connect, http = results['dns']
        name = '%s.%s' % (unique, deny)
        if code == 6 and nxdomain_counted > 0:
            lines.append(Line('transparent.dns', 'ok',
                              'Transparent job gets NXDOMAIN for %s from the gateway itself, which sends no '
                              'uncovered name anywhere (%d answered so)' % (name, nxdomain_counted)))
        else:
            lines.append(Line('transparent.dns_leaks', 'fail',
                              'Transparent job\'s lookup of %s was not answered NXDOMAIN by the gateway (curl exit '
                              '%d; gateway NXDOMAIN count %d): a DNS label may leave' % (name, code, nxdomain_counted),
                              fix='check the job got --dns <gateway> (run_args) and docker logs <gateway>'))
    if not missing('tcp') and not missing('udp123'):
        t_code, t_connect, _h = results['tcp']
        tcp = drop_port(port_target)
        if t_connect == 0 and dropped > 0:
            lines.append(Line('transparent.drop', 'ok',
                              'Transparent job\'s TCP %d and UDP 123, not opted in, go nowhere: the gateway dropped '
                              '%d packets of its network' % (tcp, dropped)))
        else:
            lines.append(Line('transparent.drop_leaks', 'fail',
                              'Transparent job\'s ports that are not opted in are not dropped (TCP %d connected: %s; '
                              'gateway drops %d)' % (tcp, 'yes' if t_connect > 0 else 'no', dropped),
                              fix='docker exec <gateway> iptables -S: the network\'s PIGW- chain must end in DROP'))
    if port_target and not missing('port'):
        code, connect, _h = results['port']
        if connect > 0:
            lines.append(Line('transparent.port', 'ok',
                              'Transparent job reaches the opted-in %s through the gateway' % port_target))
        else:
            lines.append(Line('transparent.port_unreached', 'warn',
                              'Transparent job does not reach the opted-in %s (curl exit %d)' % (port_target, code),
                              fix='the name must resolve, outside the guard\'s ranges, from the gateway'))
    return lines


def wide_lines(status: Dict[str, Any]) -> List[Line]:
    """A warning per transparent job network whose project opened a protocol towards any name."""
    out = []
    for net in status.get('networks') or []:
        wide = [key for key, value in sorted(((net.get('optins') or {}).get('tcp') or {}).items()) if value is True]
        wide += ['udp/%s' % key for key, value in sorted(((net.get('optins') or {}).get('udp') or {}).items())
                 if value is True]
        if wide:
            out.append(Line('transparent.wide', 'warn',
                            'Transparent job network %s opens %s towards every name its resolver answers (%s)'
                            % (net.get('network'), ', '.join('tcp/%s' % w if '/' not in w else w for w in wide),
                               net.get('policy') or 'its project policy'),
                            fix='name the hosts instead of true, e.g. ssh: [github.com] (docs/transparent.md)'))
    return out


class TransparentCheck(Check):
    """The gateway, its networks' opt-ins, and the transparent canary (none of it without a gateway name)."""

    def lines(self, ctx: DoctorContext) -> List[Line]:
        if not ctx.gateway:
            return []
        try:
            attrs = dc.read('Inspecting %s' % ctx.gateway, lambda: ctx.client.api.inspect_container(ctx.gateway),
                            missing=True)
        except dc.EngineError as exc:
            return [Line('transparent.gateway_unread', 'warn',
                         'Egress gateway %s could not be inspected or read (%s)' % (ctx.gateway, exc))]
        if attrs is None:
            return [Line('transparent.gateway_missing', 'fail',
                         'Egress gateway missing: there is no container %s, so every transparent job is refused'
                         % ctx.gateway, fix='run site.yml with egress_gateway_enabled: true')]
        state = attrs.get('State') or {}
        if not state.get('Running') or state.get('Paused'):
            return [Line('transparent.gateway_stopped', 'fail',
                         'Egress gateway stopped (%s is %s), so every transparent job is refused'
                         % (ctx.gateway, state.get('Status', 'not running')), fix='docker start %s' % ctx.gateway)]
        try:
            status = _transparent.status(ctx.client, ctx.gateway)
        except dc.EngineError as exc:
            return [Line('transparent.gateway_unread', 'warn',
                         'Egress gateway %s could not be inspected or read (%s)' % (ctx.gateway, exc),
                         fix='docker logs --tail 30 %s' % ctx.gateway)]
        dropped = sum(c.get('packets', 0) for c in (status.get('dropped') or {}).values())
        out = [Line('transparent.gateway', 'ok',
                    'Egress gateway running (%s), serving %d transparent job networks; %d packets dropped so far'
                    % (ctx.gateway, len(status.get('networks') or []), dropped))]
        out += wide_lines(status)
        if ctx.check_mode:
            return out + [Line('transparent.setup', 'notrun',
                               'Transparent canary could not be set up (check mode creates nothing), so no probe ran')]
        if not ctx.proxy_running:
            return out + [Line('transparent.setup', 'notrun',
                               'Transparent canary could not be set up (the proxy is not running), so no probe ran')]
        return out + self.canary(ctx)

    @staticmethod
    def canary(ctx: DoctorContext) -> List[Line]:
        job_id = canary_job_id(ctx.pid)
        unique = 'pi-doctor-%d-%d' % (ctx.pid, int(time.time()))
        name = probe_name('transparent', ctx.pid)
        policy_dir = tempfile.mkdtemp(prefix='pi-doctor-transparent-')
        policy = None
        if ctx.transparent_port:
            host, _sep, port = ctx.transparent_port.rpartition(':')
            policy = os.path.join(policy_dir, 'config.yaml')
            with open(policy, 'w') as handle:
                handle.write('egress:\n  allow:\n    tcp_ports: [{port: %d, hosts: [%s]}]\n' % (int(port), host))
        try:
            try:
                if policy:
                    # The doctor's own policy, written just now in its private folder from the operator's
                    # doctor_transparent_port: approved there, so the operator's approvals stay untouched.
                    shown = _transparent.approve_optins(policy, deploy_dir=policy_dir, check_mode=True)
                    _transparent.approve_optins(policy, shown['digest'], deploy_dir=policy_dir)
                net = _lifecycle.create_job_network(ctx.client, job_id, proxy_name=ctx.proxy, pool=ctx.job_pool,
                                                    mode=_transparent.TRANSPARENT, project_policy=policy,
                                                    gateway_name=ctx.gateway, shard_bound=0, deploy_dir=policy_dir)
            except Exception as exc:  # JobNetError, EngineError: say it, run nothing
                why = ' '.join(str(exc).split())
                return [Line('transparent.setup', 'notrun',
                             'Transparent canary could not be set up (%s), so no probe ran' % why)]
            ctx.actions.append('created %s' % net.network)
            script = probe_script(ctx.provider_host, ctx.deny_host, unique, ctx.transparent_port, ctx.probe_timeout)
            text, why = run_job_probe(ctx, 'transparent', name, script, net.network, {'HOME': '/tmp'},
                                      ctx.probe_timeout * 7 + ctx.start_grace, dns=[net.dns])
            if text is None:
                return [Line('transparent.setup', 'notrun',
                             'Transparent canary could not be set up (%s), so no probe ran' % why)]
            try:
                status = _transparent.status(ctx.client, ctx.gateway)
            except dc.EngineError:
                status = {}
            chain = _transparent.chain_name(net.subnet)
            dropped = ((status.get('dropped') or {}).get(chain) or {}).get('packets', 0)
            nxdomain = (status.get('refused') or {}).get('%s dns-nxdomain' % net.network, 0)
            return classify(parse_probe_lines(text), ctx.provider_host, ctx.deny_host, unique, ctx.transparent_port,
                            nxdomain, dropped)
        finally:
            try:
                _teardown.teardown_job_network(ctx.client, job_id, proxy_name=ctx.proxy, gateway_name=ctx.gateway)
            except Exception:
                pass  # job_network_gc sweeps pi-job-doctor-<pid>-t-net later
            shutil.rmtree(policy_dir, ignore_errors=True)
