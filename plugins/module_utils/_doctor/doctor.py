# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The doctor: its options, the run that puts every check together, and the report.

:class:`Doctor` is a composer: it builds one :class:`_doctor.context.DoctorContext`
(the daemon client, the options, the pid, and the facts checks hand on) and
runs the checks, each a :class:`_doctor.context.Check` with one method,
``lines(ctx)``, in report order:

* ``canary.ProbeImageCheck``: the image the probes run;
* ``proxy.ProxyCheck`` (the container; leaves its inspect in ``ctx.attrs``),
  ``shards.ShardsCheck`` (the family; ``ctx.family``), ``proxy.RulesCheck``;
* ``sweep.SweepCheck``: what killed earlier runs left behind (run now,
  reported last);
* for a running proxy: ``proxy.GuardCheck``, ``proxy.IncludeCheck`` and
  ``squid.SquidCheck`` (in the background while the canary runs);
* ``canary.CanaryCheck``: the probes (``probes.py``, ``tls.py``) through the
  proxy and every running shard, with ``isolation.IsolationCheck`` beside them
  (its lines in ``ctx.isolation_lines``);
* ``route.RouteCheck``: the route to a model server on the host, per endpoint named by a host alias,
  from the runtime's measured table;
* ``overlay.OverlayCheck``, ``mcp.McpCheck`` (only when ``mcp_json`` is given),
  ``decisions.DecisionsCheck``, the isolation lines,
  ``firewall.FirewallCheck``, ``transparent.TransparentCheck``, ``credentials.CredentialsCheck``
  (only when a credential is declared), ``openshell.OpenShellCheck`` (only when ``openshell_policy``
  names a deployed OpenShell policy file or ``openshell_gateway`` a gateway), ``forge.ForgeCheck``
  (only when a forge URL is configured), then the sweep's lines.

The line catalogue is ``lines.py`` (:data:`LINES`, which ``docs/doctor.md`` is
checked against); the names of the doctor's objects are ``names.py``; the
probe containers are run by ``containers.py``.

The canary's own objects are ``pi-dispatch-egress-doctor-<pid>`` (an
``--internal`` network with the proxy attached), one
``pi-dispatch-egress-doctor-<pid>-shard-<n>`` per running shard (that shard
attached with the alias ``<proxy>``) and the probe containers
``pi-dispatch-egress-probe-<probe>-<pid>`` (``...-probe-shard-<n>-<probe>-<pid>``
through a shard). Every one of them is removed at the
end of the run that made it, or reported in that same run, so what a later
run finds was left by a killed run (the sweep).
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import jobpool as _jobpool
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets.pool import parse_pool
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.canary import CanaryCheck, ProbeImageCheck
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.context import Check, DoctorContext
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.credentials import (
    CredentialsCheck, check_probe_paths)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.decisions import DecisionsCheck
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.firewall import FirewallCheck
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.forge import ForgeCheck
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.isolation import IsolationCheck
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.mcp import McpCheck
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.lines import GROUPS, STATUSES, SYMBOLS, Line
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import off as _off
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.openshell import OpenShellCheck
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import openshell as _openshell
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.overlay import OverlayCheck
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.proxy import (
    GuardCheck, IncludeCheck, ProxyCheck, RulesCheck)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.route import RouteCheck
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.shards import ShardsCheck
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.squid import (
    SQUID_CANDIDATE_TIMEOUT, SquidCheck, squid_unfinished_line)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.sweep import SweepCheck
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.transparent import TransparentCheck

DEFAULT_PROVIDER_HOST = 'api.anthropic.com'
DEFAULT_DENY_HOST = 'example.com'
DEFAULT_PROBE_TIMEOUT = 10
DEFAULT_PROBE_START_GRACE = 20
DEFAULT_ENDPOINT_TIMEOUT = 15  # the seed: no answer within 15 s means the server is stuck or busy

# The checks that run while the canary runs (Doctor.run), at most MAX_WORKERS at a time: none reads a fact the
# canary leaves in the context, and none touches the canary's networks or probes (the canary's teardown leaves the
# probes of names.SELF_REMOVED to their checks). Not among them: the guard, which reads the proxy's /etc/hosts (the
# engine rewrites it while the proxy joins a network), so it runs before anything of this run is made; the decision
# log, read after the canary as before; and the firewall's presence, which compares the host's tables with the
# networks there are (a network outside the pool created since reads as stale), so it is read before this run makes
# any network; its gateway probe (firewall.FirewallCheck.split) runs after the canary, alone, as it always did: run
# beside the canary it once reported no probe line at all with the layer on (test_firewall, a fresh-clone CI run).
MAX_WORKERS = 4
BESIDE_CANARY = ('include', 'route', 'overlay', 'mcp', 'transparent', 'credentials', 'openshell', 'forge')


# --- the report ------------------------------------------------------------------------------------

def summary(lines: Iterable[Line]) -> Dict[str, int]:
    counts = dict((status, 0) for status in STATUSES)
    for line in lines:
        counts[line.status] += 1
    return counts


def render_report(lines: Sequence[Line], wall: Optional[float] = None) -> str:
    """The human report: lines grouped, each with its symbol, fixes under them, a summary; ``wall``: the run's
    seconds, said on a last line (``doctor run: 12.3 s``)."""
    out = []
    for group, title in GROUPS:
        members = [line for line in lines if line.group == group]
        if not members:
            continue
        out.append('%s:' % title)
        for line in members:
            shown = line.as_dict()  # redacted
            out.append(u'  %s %s' % (SYMBOLS[line.status], shown['message']))
            if shown['fix'] and line.status in ('warn', 'fail'):
                out.append(u'      fix: %s' % shown['fix'])
        out.append('')
    counts = summary(lines)
    out.append(u'%d checks: %d \u2713, %d \u26a0, %d \u2717, %d not run' % (
        len(lines), counts['ok'], counts['warn'], counts['fail'], counts['notrun']))
    if wall is not None:
        out.append(u'doctor run: %.1f s' % wall)
    return u'\n'.join(out) + u'\n'


def json_lines(lines: Iterable[Line]) -> str:
    """The same results, one JSON object per line (id, status, message, fix)."""
    return u''.join(json.dumps(line.as_dict(), sort_keys=True, ensure_ascii=False) + u'\n' for line in lines)


# --- options ---------------------------------------------------------------------------------------

class DoctorOptions(object):
    """What one doctor run checks, and how; everything but the daemon connection.

    ``proxy``: the proxy container; ``deploy_dir``: the deployment folder; ``probe_image``: the image the
    probe containers run (it needs sh and curl). ``pid`` (default: this process's) names the run's objects and
    ``environ`` (default: ``os.environ``) is read for DOCKER_HOST. ``isolation``, ``squid_candidate`` and
    ``sweep`` switch off the isolation check, the mirror check and the sweep of earlier runs' leftovers;
    ``firewall`` is ``firewall.py``'s options dict (None: its defaults). ``fallback_probe_image``: the image
    the probes run when ``probe_image`` is not on the daemon (the collection's own probe image, built locally
    by the doctor role), said in the ``canary.probe_image`` line. ``gateway``: the transparent gateway, whose
    check and canary run only when it is given (``transparent.py``); ``transparent_port``: ``host:port`` that
    canary opts in and must reach. ``credentials_interceptor``: the credential interceptor's container
    (``credentials.py``; its lines run when the deployment folder declares a credential);
    ``credentials_probe_paths``: credential name -> the path its canary probe asks the bound host.
    ``openshell_policy``: a deployed OpenShell policy file, compared with what the deployment folder's sources
    render (``openshell.py``; no line when unset). ``openshell_gateway``: dict(endpoint, sandbox, workspace,
    ca, cert, key, timeout) of an OpenShell gateway whose sandbox's effective policy is fetched and compared
    the same way (no line when unset). ``openshell_credential_provider``: the provider the job's policy binds
    every endpoint to, ``openshell_github_repository`` the GitHub job's own repository and
    ``openshell_project_policy`` its project's opt-ins, all rendered the same way for both comparisons.
    ``forge_urls``: name -> a forge's URL, checked to be https:// on 443 and listed (``forge.py``; empty:
    GITLAB_URL and FORGEJO_URL from ``environ``, no line when neither is set). ``mcp_json``: the overlay's
    mcp.json, each enabled server judged as the preflight judges a job's, and an endpoint only an MCP server
    uses probed as one (``mcp.py``; no line when unset).
    """

    def __init__(self, proxy: str, deploy_dir: Optional[str], probe_image: str,
                 provider_host: str = DEFAULT_PROVIDER_HOST, deny_host: str = DEFAULT_DENY_HOST,
                 listed_host: Optional[str] = None, probe_timeout: int = DEFAULT_PROBE_TIMEOUT,
                 start_grace: int = DEFAULT_PROBE_START_GRACE, docker_host: Optional[str] = None,
                 check_mode: bool = False, pid: Optional[int] = None, environ: Optional[Mapping[str, str]] = None,
                 endpoint_timeout: int = DEFAULT_ENDPOINT_TIMEOUT, models_json: Optional[str] = None,
                 isolation: bool = True, job_pool: str = _jobpool.DEFAULT_POOL,
                 job_prefix: int = _jobpool.DEFAULT_PREFIX, squid_candidate: bool = True, sweep: bool = True,
                 firewall: Optional[Dict[str, Any]] = None,
                 fallback_probe_image: Optional[str] = None, decision_log_dir: Optional[str] = None,
                 gateway: Optional[str] = None, transparent_port: Optional[str] = None,
                 credentials_interceptor: Optional[str] = None,
                 credentials_probe_paths: Optional[Dict[str, str]] = None,
                 openshell_policy: Optional[str] = None,
                 openshell_gateway: Optional[Dict[str, Any]] = None,
                 openshell_credential_provider: Optional[str] = None,
                 openshell_github_repository: Optional[str] = None,
                 openshell_project_policy: Optional[str] = None,
                 forge_urls: Optional[Dict[str, str]] = None, mcp_json: Optional[str] = None) -> None:
        self.proxy = proxy
        self.forge_urls = forge_urls
        self.mcp_json = mcp_json
        self.openshell_policy = openshell_policy
        self.openshell_gateway = openshell_gateway
        self.openshell_credential_provider = openshell_credential_provider
        self.openshell_github_repository = openshell_github_repository
        self.openshell_project_policy = openshell_project_policy
        self.credentials_interceptor = credentials_interceptor
        self.credentials_probe_paths = credentials_probe_paths
        self.gateway = gateway
        self.transparent_port = transparent_port
        self.decision_log_dir = decision_log_dir
        self.fallback_probe_image = fallback_probe_image
        self.deploy_dir = deploy_dir
        self.probe_image = probe_image
        self.provider_host = provider_host
        self.deny_host = deny_host
        self.listed_host = listed_host
        self.probe_timeout = probe_timeout
        self.start_grace = start_grace
        self.docker_host = docker_host
        self.check_mode = check_mode
        self.pid = pid
        self.environ = environ
        self.endpoint_timeout = endpoint_timeout
        self.models_json = models_json
        self.isolation = isolation
        self.job_pool = job_pool
        self.job_prefix = job_prefix
        self.squid_candidate = squid_candidate
        self.sweep = sweep
        self.firewall = firewall


# --- the run ---------------------------------------------------------------------------------------

def default_checks() -> Dict[str, Check]:
    """name -> check, every group of the doctor's checks (the canary runs the isolation check)."""
    isolation = IsolationCheck()
    return dict(probe_image=ProbeImageCheck(), proxy=ProxyCheck(), shards=ShardsCheck(), rules=RulesCheck(),
                sweep=SweepCheck(), guard=GuardCheck(), include=IncludeCheck(), squid=SquidCheck(),
                canary=CanaryCheck(isolation), isolation=isolation, overlay=OverlayCheck(),
                decisions=DecisionsCheck(), firewall=FirewallCheck(), transparent=TransparentCheck(),
                credentials=CredentialsCheck(), openshell=OpenShellCheck(), forge=ForgeCheck(),
                route=RouteCheck(), mcp=McpCheck())


class _Background(object):
    """One check's ``lines(ctx)`` in a daemon thread; ``join`` gives its lines (none if it did not finish)."""

    def __init__(self, check: Check, ctx: DoctorContext) -> None:
        self._out: List[Line] = []
        self._thread = threading.Thread(target=lambda: self._out.extend(check.lines(ctx)))
        self._thread.daemon = True
        self._thread.start()

    def join(self, timeout: float) -> List[Line]:
        self._thread.join(timeout)
        return list(self._out)


class Doctor(object):
    """Runs the sweep, the proxy checks, the canary and the rest against a daemon; collects lines and actions.

    ``checks`` (default :func:`default_checks`) may replace a group with another :class:`Check`.
    """

    def __init__(self, client: Any, options: DoctorOptions, checks: Optional[Dict[str, Check]] = None) -> None:
        self.ctx = DoctorContext.build(client, options)
        self.checks = default_checks() if checks is None else checks

    @property
    def actions(self) -> List[str]:
        return self.ctx.actions

    @property
    def timings(self) -> Dict[str, float]:
        return self.ctx.timings

    @property
    def pid(self) -> int:
        return self.ctx.pid

    def _timed(self, name: str, step: Optional[Callable[[], Any]] = None) -> Any:
        """``checks[name].lines(ctx)`` (or ``step()``, one step of it), timed in ``ctx.timings['check.<name>']``
        (the steps of one check add up)."""
        started = time.monotonic()
        try:
            return step() if step is not None else list(self.checks[name].lines(self.ctx))
        finally:
            key = 'check.' + name
            self.ctx.timings[key] = self.ctx.timings.get(key, 0.0) + time.monotonic() - started

    def run(self) -> List[Line]:
        """Every check in report order; the lines of the whole report.

        The checks of :data:`BESIDE_CANARY` run while the canary runs, at most :data:`MAX_WORKERS` at a time,
        each its lines collected and put in its place in the report (the order never depends on which ends
        first). The guard, the decision log and the firewall (its presence before the canary, its gateway probe
        after it) are not among them: see :data:`BESIDE_CANARY`.
        """
        ctx, checks = self.ctx, self.checks
        started = time.monotonic()
        lines = []
        for name in ('probe_image', 'proxy', 'shards', 'rules'):
            lines.extend(self._timed(name))
        leftovers = self._timed('sweep')  # swept before this run makes anything; reported last
        ctx.declared_endpoints()  # read once, for the guard, the canary and the overlay
        beside = [name for name in BESIDE_CANARY if name in checks and (name != 'include' or ctx.proxy_running)]
        squid = None
        if ctx.proxy_running:
            squid = _Background(checks['squid'], ctx)
            lines.extend(self._timed('guard'))  # before anything attaches the proxy to a network of this run
        # The firewall's presence is read before this run makes a network; its probe runs after the canary.
        firewall, firewall_probe = [], None
        split = getattr(checks.get('firewall'), 'split', None)
        if split is not None:
            firewall, firewall_probe = self._timed('firewall', lambda: split(ctx))
        with concurrent.futures.ThreadPoolExecutor(max_workers=MAX_WORKERS) as pool:
            futures = {name: pool.submit(self._timed, name) for name in beside}
            canary = self._timed('canary')  # through the shards that still serve when the proxy is down, or not run
            done = dict((name, future.result()) for name, future in futures.items())
        if squid is not None:
            lines.extend(done.pop('include', []))
            lines.extend(squid.join(SQUID_CANDIDATE_TIMEOUT + ctx.start_grace + 30) or
                         [squid_unfinished_line(ctx.proxy)])
        lines.extend(canary)
        for name in ('route', 'overlay', 'mcp'):
            lines.extend(done.get(name, []))
        if 'decisions' in checks:
            lines.extend(self._timed('decisions'))  # after the canary, whose own requests it leaves out
        lines.extend(ctx.isolation_lines)  # the canary ran the isolation check
        if split is None and 'firewall' in checks:
            firewall = self._timed('firewall')  # a check without split(): all of it after the canary
        if firewall_probe is not None:
            firewall = firewall + self._timed('firewall', firewall_probe)
        lines.extend(firewall)
        for name in ('transparent', 'credentials', 'openshell', 'forge'):
            lines.extend(done.get(name, []))
        lines.extend(leftovers)
        ctx.timings['total'] = time.monotonic() - started
        return lines


def check_canary_options(params: dict[str, Any]) -> None:
    """ValueError for egress_canary options that are wrong whatever the daemon holds (asked of nobody)."""
    for key in ('probe_timeout', 'probe_start_grace', 'endpoint_timeout'):
        if params[key] < 1:
            raise ValueError('%s must be at least 1 second, not %d' % (key, params[key]))
    parse_pool(params['job_network_pool'], params['job_network_prefix'], 'job_network_pool', 'job_network_prefix')
    for key in ('provider_host', 'deny_host', 'listed_host'):
        value = params[key]
        if value is not None and (not value or any(ch in value for ch in "/:'\" \t\n")):
            raise ValueError('%s %r is not a host name; give a bare name such as api.anthropic.com' % (key, value))
    port = params.get('transparent_port')
    if port:
        host, _sep, number = port.rpartition(':')
        if not host or not number.isdigit() or not 1 <= int(number) <= 65535 or \
                any(ch in host for ch in "/:'\" \t\n[]{},"):
            raise ValueError('transparent_port %r is not host:port; give e.g. github.com:22' % (port,))
        if int(number) in (53, 80, 443):
            raise ValueError('transparent_port %r is the gateway\'s own port; give an opt-in port such as 22' % port)
    check_probe_paths(params.get('credentials_probe_paths'))
    _openshell.check_options(params)


def openshell_gateway_options(params: dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The gateway the doctor fetches a sandbox's policy from (egress_canary's openshell_* options), or None."""
    if not params.get('openshell_gateway'):
        return None
    return dict(endpoint=params['openshell_gateway'], sandbox=params.get('openshell_sandbox'),
                workspace=params.get('openshell_workspace'), ca=params.get('openshell_gateway_ca'),
                cert=params.get('openshell_gateway_cert'), key=params.get('openshell_gateway_key'),
                timeout=float(params.get('openshell_gateway_timeout') or 30.0))


def canary_options(params: dict[str, Any], deploy_dir: str, check_mode: bool = False) -> DoctorOptions:
    """The doctor's options from egress_canary's parsed options."""
    p = params
    return DoctorOptions(
        p['proxy_name'], deploy_dir, p['probe_image'], provider_host=p['provider_host'],
        deny_host=p['deny_host'], listed_host=p['listed_host'], probe_timeout=p['probe_timeout'],
        start_grace=p['probe_start_grace'], docker_host=p['docker_host'], check_mode=check_mode,
        endpoint_timeout=p['endpoint_timeout'], models_json=p['models_json'], isolation=p['isolation'],
        job_pool=p['job_network_pool'], job_prefix=p['job_network_prefix'], sweep=p['sweep'],
        squid_candidate=p.get('squid_mirror', True),
        firewall=dict(enabled=p['firewall'], chain_prefix=p['firewall_chain_prefix'], probe=p['firewall_probe']),
        fallback_probe_image=p['fallback_probe_image'], decision_log_dir=p['decision_log_dir'],
        gateway=p.get('gateway_name'), transparent_port=p.get('transparent_port'),
        credentials_interceptor=p.get('credentials_interceptor_name'),
        credentials_probe_paths=check_probe_paths(p.get('credentials_probe_paths')),
        openshell_policy=p.get('openshell_policy'), openshell_gateway=openshell_gateway_options(p),
        openshell_credential_provider=p.get('openshell_credential_provider'),
        openshell_github_repository=p.get('openshell_github_repository'),
        openshell_project_policy=p.get('openshell_project_policy'),
        forge_urls=p.get('forge_urls') or {}, mcp_json=p.get('mcp_json'))


def canary_result(doctor: Doctor, lines: list[Line], check_mode: bool = False) -> dict[str, Any]:
    """egress_canary's result of a finished run: changed when it swept (or, in check mode, would sweep)."""
    would_sweep = check_mode and any(line.id == 'leftovers.would_sweep' for line in lines)
    return dict(
        changed=bool(doctor.actions) or would_sweep,
        lines=[line.as_dict() for line in lines],
        report=render_report(lines, wall=doctor.timings.get('total')),
        json_lines=json_lines(lines),
        summary=summary(lines),
        actions=doctor.actions,
        timings=dict((k, round(v, 3)) for k, v in doctor.timings.items()),
    )


def off_result(params: dict[str, Any]) -> dict[str, Any]:
    """egress_canary's result with the egress layer off (``enabled`` false): no engine was asked (``off.py``)."""
    lines = _off.off_lines(params)
    return dict(changed=False, lines=[line.as_dict() for line in lines], report=render_report(lines),
                json_lines=json_lines(lines), summary=summary(lines), actions=[], timings={})
