# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The doctor's canary: the probes through the proxy and its running shards, on throwaway networks.

:class:`ProbeImageCheck` picks the image the probes run (the fallback when the
probe image is missing). :class:`CanaryCheck` creates
``pi-dispatch-egress-doctor-<pid>`` with the proxy attached and one network per
running shard (``shards.setup_lanes``), runs every probe at once (the canary's
five and three per declared model endpoint, ``containers.run_probe``), runs the
isolation check beside them, classifies (``probes.py``, ``tls.py``) and tears
everything down. When the proxy is down and shards still serve, only the
shards' lanes run; when nothing runs, every probe is said not to have run.
Its lines are the canary's then the endpoints'; the isolation check's go to
``ctx.isolation_lines`` (the report has them further down).
"""

from __future__ import annotations

import threading
import time
from typing import List, Optional, Sequence, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import rootless as _rootless
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.containers import probe_wait, run_probe
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.context import Check, DoctorContext
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.isolation import (
    ISOLATION_CONNECT_TIMEOUT, isolation_skipped)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.lines import Line
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.mcp import mcp_only_endpoints
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.names import (
    LABEL, NETWORK_PREFIX, PEERS, SELF_REMOVED, endpoint_probe_name, network_name, peer_name, probe_name, probe_shard,
    shard_network_name)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.probes import (
    ENDPOINT_PROBE_LABELS, ENDPOINT_PROBES, PROBES, as_mcp, classify_deny, classify_endpoint_plain,
    classify_endpoint_port, classify_endpoint_tunnel, classify_mcp_tunnel, classify_plain, classify_provider,
    endpoint_notrun_line, endpoint_targets, notrun_line)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.shards import (
    ShardLane, probed_shards, setup_lanes, shard_notrun_lines, shard_setup_line, shards_serving_line, through_shard)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.tls import classify_tls_check

PROXY_DOWN = 'the proxy is not running'


class ProbeImageCheck(Check):
    """Run the probes from the fallback image when the probe image is missing and it is there.

    Its line is ``canary.probe_image`` (it switches ``ctx.probe_image``), or none: the probe image
    is there, or neither is (the canary then says the probe image is missing), or the daemon could
    not say (the canary reads the image again and says what failed).
    """

    def lines(self, ctx: DoctorContext) -> List[Line]:
        try:
            line = self._choose(ctx)
        except dc.EngineError:
            line = None
        return [line] if line is not None else []

    @staticmethod
    def _choose(ctx: DoctorContext) -> Optional[Line]:
        if not ctx.fallback_probe_image or ctx.fallback_probe_image == ctx.probe_image:
            return None
        if dc.get_image(ctx.client, ctx.probe_image) is not None:
            return None
        if dc.get_image(ctx.client, ctx.fallback_probe_image) is None:
            return None
        wanted, ctx.probe_image = ctx.probe_image, ctx.fallback_probe_image
        return Line('canary.probe_image', 'ok',
                    "Egress canary probes ran from %s, the collection's probe image, because %s is not on this "
                    "daemon: they prove the proxy, not the job image's own client stack" % (ctx.probe_image, wanted),
                    fix='build the job image (or set doctor_probe_image to it) to prove its clients too')


# --- what to probe and how to read it ------------------------------------------------------------------

def targets(ctx: DoctorContext) -> dict:
    """probe -> the URL the canary's probe asks for."""
    return dict(
        provider='https://%s/' % ctx.provider_host,
        deny='https://%s/' % ctx.deny_host,
        plain='http://%s:443/' % ctx.listed_host,
        sni='https://%s/' % ctx.deny_host,
        tunnel_plain='http://%s:443/' % ctx.provider_host,
    )


def probe_options(ctx: DoctorContext, probe: str) -> dict:
    """How a canary probe's curl differs from a plain ``curl --proxy URL``."""
    if probe == 'sni':
        return dict(connect_to='%s:443:%s:443' % (ctx.deny_host, ctx.provider_host))
    if probe == 'tunnel_plain':
        return dict(tunnel=True)
    return {}


def classify(ctx: DoctorContext, results: dict, prefix: str = '') -> List[Line]:
    """The canary's lines from ``results`` (keys ``<prefix><probe>``: a shard's lane has its prefix)."""
    lines = []
    for probe, fn, args in (('provider', classify_provider, (ctx.provider_host,)),
                            ('deny', classify_deny, (ctx.deny_host,)),
                            ('plain', classify_plain, (ctx.listed_host,)),
                            ('sni', classify_tls_check, ('sni', ctx.provider_host, ctx.deny_host)),
                            ('tunnel_plain', classify_tls_check, ('tunnel_plain', ctx.provider_host, ctx.deny_host))):
        parsed, why = results.get(prefix + probe, (None, 'it did not finish within %ss' % (
            probe_wait(ctx, ctx.probe_timeout) + 15)))
        lines.append(fn(*args + (parsed,), why_not=why))
    return lines


def endpoint_jobs(ctx: DoctorContext) -> list:
    """(key, endpoint, kind, url, tunnel) for every endpoint probe to run."""
    jobs = []
    declared = ctx.declared_endpoints() or []
    for endpoint in sorted(declared, key=lambda e: e.id):
        for kind, url, tunnel in endpoint_targets(endpoint, declared):
            jobs.append(('endpoint-%s-%s' % (kind, endpoint.id), endpoint, kind, url, tunnel))
    return jobs


def classify_endpoints(ctx: DoctorContext, jobs: list, results: dict, prefix: str = '',
                       container: Optional[str] = None) -> List[Line]:
    """The endpoint lines (keys ``<prefix><key>``); ``container`` (default the proxy) completes the fixes."""
    lines = []
    wait = probe_wait(ctx, ctx.endpoint_timeout) + 15
    mcp_only = mcp_only_endpoints(ctx)  # endpoints only an MCP server uses: any answer through the tunnel passes
    for key, endpoint, kind, url, _tunnel in jobs:
        parsed, why = results.get(prefix + key, (None, 'it did not finish within %ss' % wait))
        if kind == 'tunnel' and endpoint.id in mcp_only:
            lines.append(classify_mcp_tunnel(endpoint, parsed, ctx.endpoint_timeout, why_not=why))
        elif kind == 'tunnel':
            lines.append(classify_endpoint_tunnel(endpoint, parsed, ctx.endpoint_timeout, why_not=why))
        elif kind == 'port':
            lines.append(classify_endpoint_port(endpoint, url, parsed, why_not=why))
        else:
            lines.append(classify_endpoint_plain(endpoint, parsed, why_not=why))
        if endpoint.id in mcp_only:
            as_mcp(lines[-1])
    for line in lines:
        if line.fix and '<proxy>' in line.fix:
            line.fix = line.fix.replace('<proxy>', container or ctx.proxy)
    return lines


def lane_threads(ctx: DoctorContext, lane: ShardLane, jobs: list, results: dict) -> List[threading.Thread]:
    """The probe threads (not started) of a ready lane: the canary's probes and the endpoint probes."""
    threads = []
    for probe, url in sorted(targets(ctx).items()):
        threads.append(threading.Thread(target=run_probe, args=(ctx, lane.prefix + probe, url, lane.net, results),
                                        kwargs=probe_options(ctx, probe)))
    for key, _endpoint, _kind, url, tunnel in jobs:
        if url is None:
            continue
        threads.append(threading.Thread(target=run_probe, args=(ctx, lane.prefix + key, url, lane.net, results),
                                        kwargs=dict(timeout=ctx.endpoint_timeout, tunnel=tunnel)))
    return threads


def lane_lines(ctx: DoctorContext, lane: ShardLane, jobs: list, results: dict) -> Tuple[List[Line], List[Line]]:
    """(canary lines, endpoint lines) of one lane, named for its shard."""
    if not lane.ready:
        endpoint_lines = [through_shard(endpoint_notrun_line(endpoint, ENDPOINT_PROBE_LABELS[kind], lane.why),
                                        lane.name) for _key, endpoint, kind, _url, _tunnel in jobs]
        return [shard_setup_line(lane.name, lane.why)], endpoint_lines
    canary = [through_shard(line, lane.name) for line in classify(ctx, results, prefix=lane.prefix)]
    endpoint_lines = [through_shard(line, lane.name) for line in
                      classify_endpoints(ctx, jobs, results, prefix=lane.prefix, container=lane.name)]
    return canary, endpoint_lines


# --- teardown --------------------------------------------------------------------------------------

def teardown(ctx: DoctorContext, net: str, created: bool, shard_nets: Sequence[Tuple[str, str]] = ()) -> List[Line]:
    """Remove this run's probes and networks; a line for anything that would not go.

    ``shard_nets``: (network, shard) of every shard lane that was set up or tried (a network
    that is not there is fine).
    """
    lines = []
    stuck = {}
    # The isolation check removes its own peers, and the checks of SELF_REMOVED (which may run beside the canary)
    # their own probes: removing one of those here could cut it while it runs.
    others = set(peer_name(peer, ctx.pid) for peer in PEERS)
    others |= set(probe_name(probe, ctx.pid) for probe in SELF_REMOVED)
    with ctx.lock:
        names = [probe_name(probe, ctx.pid) for probe in PROBES] + \
            [name for name in ctx.launched if name not in others]
    for name in sorted(set(names)):
        try:
            ctx.client.api.remove_container(name, force=True)
        except Exception as exc:
            if not dc.is_not_found(exc):
                shard = probe_shard(name)
                stuck.setdefault(net if shard is None else shard_network_name(ctx.pid, shard), name)
    if created:
        lines.extend(_teardown_network(ctx, net, ctx.proxy, stuck.get(net)))
    for shard_net, shard in shard_nets:
        lines.extend(_teardown_network(ctx, shard_net, shard, stuck.get(shard_net)))
    return lines


def _teardown_network(ctx: DoctorContext, net: str, container: str, stuck: Optional[str]) -> List[Line]:
    """Detach ``container`` from this run's ``net`` and remove it, unless the probe ``stuck`` keeps it."""
    lines = []
    if stuck:
        lines.append(Line('canary.cleanup_kept', 'warn',
                          'Egress canary: %s is kept, because the probe %s could not be removed and the network '
                          'is the only way left to find it: docker rm -f %s' % (net, stuck, stuck),
                          fix='docker rm -f %s, then re-run doctor' % stuck))
        return lines
    try:
        # On rootless Podman 4 the proxy's detach may be the last one holding the account's network: made under
        # a keeper there (_proxy/rootless.py), or the proxy would lose its route out for every job.
        with _rootless.network_held(ctx.client, container, net, actions=ctx.actions):
            ctx.client.api.disconnect_container_from_network(container, net, force=True)
    except dc.EngineError as exc:
        lines.append(Line('canary.cleanup_keeper', 'warn',
                          'Egress canary: %s is kept with %s on it, because %s' % (net, container, exc),
                          fix='start any container on one of the account\'s networks, then re-run doctor, '
                              'which removes the network'))
        return lines
    except Exception:  # the removal below reports what matters
        pass
    try:
        ctx.client.api.remove_network(net)
    except Exception as exc:
        if not dc.is_not_found(exc):
            lines.append(Line('canary.cleanup_rm', 'warn',
                              'Egress canary: the network %s could not be removed: docker network rm %s (%s)'
                              % (net, net, dc.api_message(exc)),
                              fix='docker network inspect %s, remove what is on it, then docker network rm %s'
                                  % (net, net)))
    return lines


# --- the check -------------------------------------------------------------------------------------

class CanaryCheck(Check):
    """The canary and endpoint lines; runs ``isolation`` (a :class:`Check`) beside the probes.

    The isolation check's lines (or why it did not run) go to ``ctx.isolation_lines``.
    """

    def __init__(self, isolation: Check) -> None:
        self.isolation = isolation

    def lines(self, ctx: DoctorContext) -> List[Line]:
        if ctx.proxy_running:
            canary, endpoint_lines, ctx.isolation_lines = self._probe(ctx, ctx.family, through_proxy=True)
            return canary + endpoint_lines
        serving = probed_shards(ctx.family)
        if serving:
            # The proxy is down, its shards are not: their jobs still have egress, so the checks that
            # prove the policy run through them (new jobs are refused until the proxy runs again).
            first = shards_serving_line(ctx.proxy, serving)
            canary, endpoint_lines, ctx.isolation_lines = self._probe(ctx, ctx.family, through_proxy=False)
            return [first] + canary + endpoint_lines
        probed = [(endpoint, kind) for endpoint in sorted(ctx.declared_endpoints() or [], key=lambda e: e.id)
                  for kind in ENDPOINT_PROBES]
        shard_canary, shard_endpoints = shard_notrun_lines(serving, probed, PROXY_DOWN)
        ctx.isolation_lines = isolation_skipped(PROXY_DOWN)
        return ([notrun_line(probe, PROXY_DOWN) for probe in PROBES] + shard_canary +
                [endpoint_notrun_line(endpoint, ENDPOINT_PROBE_LABELS[kind], PROXY_DOWN) for endpoint, kind in probed]
                + shard_endpoints)

    def _probe(self, ctx: DoctorContext, shards: list, through_proxy: bool) -> Tuple[list, list, list]:
        """Create the throwaway networks, run every probe concurrently, tear down (always).

        The probes run through the proxy on ``pi-dispatch-egress-doctor-<pid>`` and, for each
        running shard in ``shards`` (``_shards.Member``), on ``...-shard-<n>`` with that shard
        attached under the proxy's name. ``through_proxy`` False (the proxy is down while shards
        still serve their jobs): only the shards' lanes run, and the proxy's own probes and the
        isolation check are said not to have run. Returns (canary lines, endpoint lines, isolation
        lines).
        """
        net = network_name(ctx.pid)
        jobs = endpoint_jobs(ctx)
        shards = probed_shards(shards)

        def unprobed(why: str) -> List[Line]:
            return [endpoint_notrun_line(endpoint, ENDPOINT_PROBE_LABELS[kind], why)
                    for _key, endpoint, kind, _url, _t in jobs]

        def not_set_up(why: str, fix: Optional[str] = None) -> Tuple[List[Line], List[Line], List[Line]]:
            canary, endpoint_lines = shard_notrun_lines(shards, [(e, kind) for _k, e, kind, _u, _t in jobs], why)
            return ([Line('canary.setup', 'notrun', 'Egress canary could not be set up (%s), so no probe ran' % why,
                          fix=fix)] + canary, unprobed(why) + endpoint_lines, isolation_skipped(why))

        try:
            if dc.get_image(ctx.client, ctx.probe_image) is None:
                return not_set_up('the probe image %s is not on this daemon' % ctx.probe_image,
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
            if ctx.isolation_enabled and through_proxy:
                iso_thread = threading.Thread(target=lambda: iso_out.extend(self.isolation.lines(ctx)))
                iso_thread.daemon = True
                iso_thread.start()
            lanes, join_lanes = setup_lanes(ctx, shards)
            try:
                if not through_proxy:
                    base_ok = False
                    lines.extend(notrun_line(probe, PROXY_DOWN) for probe in PROBES)
                    endpoint_lines = unprobed(PROXY_DOWN)
                else:
                    ctx.client.api.create_network(net, driver='bridge', internal=True, labels={LABEL: str(ctx.pid)})
                    created = True
                    ctx.client.api.connect_container_to_network(ctx.proxy, net)
            except Exception as exc:
                why = '%s %s: %s' % ('attaching the proxy to' if created else 'creating', net, dc.api_message(exc))
                lines.append(Line('canary.setup', 'notrun', 'Egress canary could not be set up (%s), so no '
                                                            'probe ran' % why,
                                  fix='docker network ls --filter name=%s; docker inspect %s'
                                      % (NETWORK_PREFIX, ctx.proxy)))
                endpoint_lines = unprobed(why)
                base_ok = False
            join_lanes()
            threads = []
            for probe, url in (sorted(targets(ctx).items()) if base_ok else ()):
                threads.append(threading.Thread(target=run_probe, args=(ctx, probe, url, net, results),
                                                kwargs=probe_options(ctx, probe)))
            for key, endpoint, kind, url, tunnel in (jobs if base_ok else ()):
                if url is None:
                    continue
                name = endpoint_probe_name(kind, endpoint.id, ctx.pid)
                threads.append(threading.Thread(target=run_probe, args=(ctx, key, url, net, results),
                                                kwargs=dict(timeout=ctx.endpoint_timeout, tunnel=tunnel, name=name)))
            for lane in lanes:
                if lane.ready:
                    threads.extend(lane_threads(ctx, lane, jobs, results))
            for thread in threads:
                thread.daemon = True
                thread.start()
            longest = max([ctx.probe_timeout] + ([ctx.endpoint_timeout] if jobs and (base_ok or lanes) else []))
            # A probe whose proxy name never resolved runs once more in a fresh container (run_probe).
            deadline = time.monotonic() + 2 * probe_wait(ctx, longest) + 15
            for thread in threads:
                thread.join(max(0.0, deadline - time.monotonic()))
            if base_ok:
                lines.extend(classify(ctx, results))
                endpoint_lines = classify_endpoints(ctx, jobs, results)
            for lane in lanes:
                lane_canary, lane_endpoints = lane_lines(ctx, lane, jobs, results)
                lines.extend(lane_canary)
                endpoint_lines.extend(lane_endpoints)
        finally:
            # The probes' teardown first, while the isolation check may still run: it never touches the peers
            # or their job networks (the isolation check's own teardown does).
            lines.extend(teardown(ctx, net, created, [(lane.net, lane.name) for lane in lanes]))
            if iso_thread is not None:
                iso_thread.join(ISOLATION_CONNECT_TIMEOUT * 2 + ctx.start_grace + 60)
                isolation_lines = list(iso_out) or [Line('isolation.notrun', 'notrun',
                                                         'Job-to-job isolation was not checked (it did not finish)')]
            elif not ctx.isolation_enabled:
                isolation_lines = isolation_skipped('doctor_isolation is false')
            else:
                isolation_lines = isolation_skipped(PROXY_DOWN)
        return lines, endpoint_lines, isolation_lines
