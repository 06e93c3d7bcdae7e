# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The doctor: its options, the run that puts every check together, and the report.

:class:`Doctor` makes the daemon calls (Docker SDK) through one mixin per
concern and assembles their lines in report order; the pieces are unit-tested
without a daemon:

* ``_doctor_lines``: the line catalogue (:data:`LINES`, one row per id, which
  ``docs/doctor.md`` is checked against) and the :class:`Line` model;
* ``_doctor_names``: the names of the doctor's own objects and the pid in them;
* ``_doctor_proxy`` and ``_doctor_squid``: the proxy, its rules, guard, mounts
  and include, and its squid package against the mirror;
* ``_doctor_probes``: the probe containers (the canary's three probes and three
  per declared model endpoint) and their verdicts;
* ``_doctor_shards``: the proxy's shards: the family lines, and the same probes
  through every running shard;
* ``_doctor_isolation``: two peers on two job networks;
* ``_doctor_overlay``: the overlay models.json and the allowlist (files only);
* ``_doctor_sweep``: what killed earlier runs left behind;
* ``_doctor_firewall``: the host firewall layer.

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

import json
import os
import threading
import time
from typing import Any

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import decisions as _decisions
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import firewall as _doctor_firewall
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import jobpool as _jobpool
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets.pool import parse_pool
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.decisions import decisions_line
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.isolation import (
    ISOLATION_CONNECT_TIMEOUT, IsolationMixin)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.lines import GROUPS, STATUSES, SYMBOLS, Line
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.names import (
    LABEL, NETWORK_PREFIX, endpoint_probe_name, network_name)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.overlay import OverlayMixin
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.probes import (
    ENDPOINT_PROBE_LABELS, ENDPOINT_PROBES, PROBES, ProbesMixin, endpoint_notrun_line, notrun_line)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.proxy import ProxyMixin, proxy_lines
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.squid import (
    SQUID_CANDIDATE_TIMEOUT, SquidMixin)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.shards import (
    ShardsMixin, probed_shards, shard_notrun_lines, shards_serving_line)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.sweep import SweepMixin

DEFAULT_PROVIDER_HOST = 'api.anthropic.com'
DEFAULT_DENY_HOST = 'example.com'
DEFAULT_PROBE_TIMEOUT = 10
DEFAULT_PROBE_START_GRACE = 20
DEFAULT_ENDPOINT_TIMEOUT = 15  # the seed: no answer within 15 s means the server is stuck or busy


# --- the report ------------------------------------------------------------------------------------

def summary(lines):
    counts = dict((status, 0) for status in STATUSES)
    for line in lines:
        counts[line.status] += 1
    return counts


def render_report(lines):
    """The human report: lines grouped, each with its symbol, fixes under them, a summary."""
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
    return u'\n'.join(out) + u'\n'


def json_lines(lines):
    """The same results, one JSON object per line (id, status, message, fix)."""
    return u''.join(json.dumps(line.as_dict(), sort_keys=True, ensure_ascii=False) + u'\n' for line in lines)


# --- options ---------------------------------------------------------------------------------------

class DoctorOptions(object):
    """What one doctor run checks, and how; everything but the daemon connection.

    ``proxy``: the proxy container; ``deploy_dir``: the deployment folder;
    ``probe_image``: the image the probe containers run (it needs sh and curl).
    ``pid`` (default: this process's) names the run's objects and ``environ``
    (default: ``os.environ``) is read for DOCKER_HOST. ``isolation``,
    ``squid_candidate`` and ``sweep`` switch off the isolation check, the
    mirror check and the sweep of earlier runs' leftovers; ``firewall`` is
    ``_doctor_firewall``'s options dict (None: its defaults). ``fallback_probe_image``: the image the
    probes run when ``probe_image`` is not on the daemon (the collection's own probe image, built
    locally by the doctor role), said in the ``canary.probe_image`` line.
    """

    def __init__(self, proxy, deploy_dir, probe_image, provider_host=DEFAULT_PROVIDER_HOST,
                 deny_host=DEFAULT_DENY_HOST, listed_host=None, probe_timeout=DEFAULT_PROBE_TIMEOUT,
                 start_grace=DEFAULT_PROBE_START_GRACE, docker_host=None, check_mode=False, pid=None,
                 environ=None, endpoint_timeout=DEFAULT_ENDPOINT_TIMEOUT, models_json=None, isolation=True,
                 job_pool=_jobpool.DEFAULT_POOL, job_prefix=_jobpool.DEFAULT_PREFIX, squid_candidate=True,
                 sweep=True, firewall=None, fallback_probe_image=None, decision_log_dir=None):
        self.proxy = proxy
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


# --- the daemon side -------------------------------------------------------------------------------

class Doctor(ProxyMixin, ShardsMixin, SquidMixin, ProbesMixin, IsolationMixin, OverlayMixin, SweepMixin):
    """Runs the sweep, the proxy checks, the canary and the rest against a daemon; collects lines and actions."""

    def __init__(self, client, options):
        self.client = client
        self.proxy = options.proxy
        self.deploy_dir = options.deploy_dir
        self.probe_image = options.probe_image
        self.fallback_probe_image = options.fallback_probe_image
        self.provider_host = options.provider_host
        self.deny_host = options.deny_host
        self.listed_host = options.listed_host or options.provider_host
        self.probe_timeout = int(options.probe_timeout)
        self.start_grace = int(options.start_grace)
        self.docker_host = options.docker_host
        self.check_mode = options.check_mode
        self.pid = os.getpid() if options.pid is None else int(options.pid)
        self.environ = os.environ if options.environ is None else options.environ
        self.endpoint_timeout = int(options.endpoint_timeout)
        self.models_json = options.models_json or None
        self.isolation_enabled = bool(options.isolation)
        self.job_pool = options.job_pool
        self.job_prefix = int(options.job_prefix)
        self.squid_candidate = bool(options.squid_candidate)
        self.sweep_enabled = bool(options.sweep)
        self.firewall = options.firewall
        self.decision_log_dir = options.decision_log_dir or os.path.join(options.deploy_dir or '',
                                                                         _decisions.DEFAULT_FOLDER)
        self.actions = []
        self.timings = {}
        self._launched = []
        self._lock = threading.Lock()
        self._endpoints = None   # the declared endpoints, once loaded
        self._endpoints_error = None

    # --- canary --------------------------------------------------------------------------------
    def canary(self, shards=(), through_proxy=True):
        """Create the throwaway networks, run every probe concurrently, tear down (always).

        The probes run through the proxy on ``pi-dispatch-egress-doctor-<pid>`` and, for each
        running shard in ``shards`` (``_shards.Member``), on ``...-shard-<n>`` with that shard
        attached under the proxy's name. ``through_proxy`` False (the proxy is down while shards
        still serve their jobs): only the shards' lanes run, and the proxy's own probes and the
        isolation check are said not to have run. Returns (canary lines, endpoint lines, isolation
        lines).
        """
        net = network_name(self.pid)
        jobs = self._endpoint_jobs()
        shards = probed_shards(shards)
        proxy_down = 'the proxy is not running'

        def unprobed(why):
            return [endpoint_notrun_line(endpoint, ENDPOINT_PROBE_LABELS[kind], why)
                    for _key, endpoint, kind, _url, _t in jobs]

        def not_set_up(why, fix=None):
            canary, endpoint_lines = shard_notrun_lines(shards, [(e, kind) for _k, e, kind, _u, _t in jobs], why)
            return ([Line('canary.setup', 'notrun', 'Egress canary could not be set up (%s), so no probe ran' % why,
                          fix=fix)] + canary, unprobed(why) + endpoint_lines, self._isolation_skipped(why))

        try:
            if dc.get_image(self.client, self.probe_image) is None:
                return not_set_up('the probe image %s is not on this daemon' % self.probe_image,
                                  fix='build the probe image like a job image (it needs sh and curl) and set '
                                      'doctor_probe_image')
        except dc.EngineError as exc:
            return not_set_up(str(exc))
        results = {}
        lines, endpoint_lines, isolation_lines = [], [], []
        created = False
        base_ok = True
        iso_thread = None
        iso_out = []
        lanes = []
        try:
            if self.isolation_enabled and through_proxy:
                iso_thread = threading.Thread(target=lambda: iso_out.extend(self.isolation()))
                iso_thread.daemon = True
                iso_thread.start()
            lanes, join_lanes = self.setup_lanes(shards)
            try:
                if not through_proxy:
                    base_ok = False
                    lines.extend(notrun_line(probe, proxy_down) for probe in PROBES)
                    endpoint_lines = unprobed(proxy_down)
                else:
                    self.client.api.create_network(net, driver='bridge', internal=True,
                                                   labels={LABEL: str(self.pid)})
                    created = True
                    self.client.api.connect_container_to_network(self.proxy, net)
            except Exception as exc:
                why = '%s %s: %s' % ('attaching the proxy to' if created else 'creating', net, dc.api_message(exc))
                lines.append(Line('canary.setup', 'notrun', 'Egress canary could not be set up (%s), so no '
                                                            'probe ran' % why,
                                  fix='docker network ls --filter name=%s; docker inspect %s'
                                      % (NETWORK_PREFIX, self.proxy)))
                endpoint_lines = unprobed(why)
                base_ok = False
            join_lanes()
            threads = []
            for probe, url in (sorted(self._targets().items()) if base_ok else ()):
                threads.append(threading.Thread(target=self._run_probe, args=(probe, url, net, results),
                                                kwargs=self._probe_options(probe)))
            for key, endpoint, kind, url, tunnel in (jobs if base_ok else ()):
                if url is None:
                    continue
                name = endpoint_probe_name(kind, endpoint.id, self.pid)
                threads.append(threading.Thread(target=self._run_probe, args=(key, url, net, results),
                                                kwargs=dict(timeout=self.endpoint_timeout, tunnel=tunnel,
                                                            name=name)))
            for lane in lanes:
                if lane.ready:
                    threads.extend(self.lane_threads(lane, jobs, results))
            for thread in threads:
                thread.daemon = True
                thread.start()
            longest = max([self.probe_timeout] + ([self.endpoint_timeout] if jobs and (base_ok or lanes) else []))
            deadline = time.monotonic() + longest + self.start_grace + 15
            for thread in threads:
                thread.join(max(0.0, deadline - time.monotonic()))
            if base_ok:
                lines.extend(self._classify(results))
                endpoint_lines = self._classify_endpoints(jobs, results)
            for lane in lanes:
                lane_canary, lane_endpoints = self.lane_lines(lane, jobs, results)
                lines.extend(lane_canary)
                endpoint_lines.extend(lane_endpoints)
        finally:
            if iso_thread is not None:
                iso_thread.join(ISOLATION_CONNECT_TIMEOUT * 2 + self.start_grace + 60)
                isolation_lines = list(iso_out) or [Line('isolation.notrun', 'notrun',
                                                         'Job-to-job isolation was not checked (it did not finish)')]
            elif not self.isolation_enabled:
                isolation_lines = self._isolation_skipped('doctor_isolation is false')
            else:
                isolation_lines = self._isolation_skipped(proxy_down)
            lines.extend(self.teardown(net, created, [(lane.net, lane.name) for lane in lanes]))
        return lines, endpoint_lines, isolation_lines

    # --- everything ------------------------------------------------------------------------------
    def choose_probe_image(self):
        """Run the probes from the fallback image when the probe image is missing and it is there.

        Returns the ``canary.probe_image`` line that says so, or None (the probe image is there, or
        neither is: the canary then says the probe image is missing, as before).
        """
        if not self.fallback_probe_image or self.fallback_probe_image == self.probe_image:
            return None
        if dc.get_image(self.client, self.probe_image) is not None:
            return None
        if dc.get_image(self.client, self.fallback_probe_image) is None:
            return None
        wanted, self.probe_image = self.probe_image, self.fallback_probe_image
        return Line('canary.probe_image', 'ok',
                    "Egress canary probes ran from %s, the collection's probe image, because %s is not on this "
                    "daemon: they prove the proxy, not the job image's own client stack" % (self.probe_image, wanted),
                    fix='build the job image (or set doctor_probe_image to it) to prove its clients too')

    def run(self):
        started = time.monotonic()
        lines = []
        try:
            image_line = self.choose_probe_image()
        except dc.EngineError:
            image_line = None  # the canary reads the image again and says what failed
        if image_line is not None:
            lines.append(image_line)
        attrs = self.proxy_attrs()
        lines.extend(proxy_lines(self.proxy, attrs))
        family, family_out = self.proxy_family()
        lines.extend(family_out)  # nothing without shards
        lines.append(self.rules_line())
        leftovers = self.sweep() if self.sweep_enabled else []
        running = attrs is not None and (attrs.get('State') or {}).get('Running') and \
            not (attrs.get('State') or {}).get('Paused')
        self.load_endpoints()
        if running:
            squid_out = []
            squid_thread = threading.Thread(target=lambda: squid_out.extend(self.squid_lines(attrs)))
            squid_thread.daemon = True
            squid_thread.start()
            lines.extend(self.guard_lines(attrs))
            lines.extend(self.include_lines(attrs))
            canary, endpoint_lines, isolation_lines = self.canary(family)
            squid_thread.join(SQUID_CANDIDATE_TIMEOUT + self.start_grace + 30)
            lines.extend(squid_out or [Line('proxy.squid_unread', 'warn',
                                            'Egress proxy squid: the package version inside %s could not be read '
                                            '(the check did not finish)' % self.proxy,
                                            fix='docker exec %s dpkg-query -W squid-common' % self.proxy)])
            lines.extend(canary)
            lines.extend(endpoint_lines)
        elif probed_shards(family):
            # The proxy is down, its shards are not: their jobs still have egress, so the checks that
            # prove the policy run through them (new jobs are refused until the proxy runs again).
            lines.append(shards_serving_line(self.proxy, probed_shards(family)))
            canary, endpoint_lines, isolation_lines = self.canary(family, through_proxy=False)
            lines.extend(canary)
            lines.extend(endpoint_lines)
        else:
            why = 'the proxy is not running'
            probed = [(endpoint, kind) for endpoint in sorted(self._endpoints or [], key=lambda e: e.id)
                      for kind in ENDPOINT_PROBES]
            shard_canary, shard_endpoints = shard_notrun_lines(probed_shards(family), probed, why)
            lines.extend(notrun_line(probe, why) for probe in PROBES)
            lines.extend(shard_canary)
            lines.extend(endpoint_notrun_line(endpoint, ENDPOINT_PROBE_LABELS[kind], why) for endpoint, kind in probed)
            lines.extend(shard_endpoints)
            isolation_lines = self._isolation_skipped('the proxy is not running')
        lines.extend(self.overlay())
        lines.append(decisions_line(self.decision_log_dir))
        lines.extend(isolation_lines)
        lines.extend(_doctor_firewall.lines_for(self, self.firewall))
        lines.extend(leftovers)
        self.timings['total'] = time.monotonic() - started
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


def canary_options(params: dict[str, Any], deploy_dir: str, check_mode: bool = False) -> DoctorOptions:
    """The doctor's options from egress_canary's parsed options."""
    p = params
    return DoctorOptions(
        p['proxy_name'], deploy_dir, p['probe_image'], provider_host=p['provider_host'],
        deny_host=p['deny_host'], listed_host=p['listed_host'], probe_timeout=p['probe_timeout'],
        start_grace=p['probe_start_grace'], docker_host=p['docker_host'], check_mode=check_mode,
        endpoint_timeout=p['endpoint_timeout'], models_json=p['models_json'], isolation=p['isolation'],
        job_pool=p['job_network_pool'], job_prefix=p['job_network_prefix'], sweep=p['sweep'],
        firewall=dict(enabled=p['firewall'], chain_prefix=p['firewall_chain_prefix'], probe=p['firewall_probe']),
        fallback_probe_image=p['fallback_probe_image'], decision_log_dir=p['decision_log_dir'])


def canary_result(doctor: Doctor, lines: list[Line], check_mode: bool = False) -> dict[str, Any]:
    """egress_canary's result of a finished run: changed when it swept (or, in check mode, would sweep)."""
    would_sweep = check_mode and any(line.id == 'leftovers.would_sweep' for line in lines)
    return dict(
        changed=bool(doctor.actions) or would_sweep,
        lines=[line.as_dict() for line in lines],
        report=render_report(lines),
        json_lines=json_lines(lines),
        summary=summary(lines),
        actions=doctor.actions,
        timings=dict((k, round(v, 3)) for k, v in doctor.timings.items()),
    )
