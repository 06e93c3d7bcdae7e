# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The doctor's probe containers: run one to its end on a network, or run one probe's curl and parse it.

Shared by the canary (``canary.py``), the isolation check and the firewall
probe. Every container started is named in ``ctx.launched`` (the canary's
teardown removes them) and timed in ``ctx.timings`` under its key.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import rootless as _rootless
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import rules as _rules
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.context import DoctorContext
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.names import LABEL, probe_name
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.probes import (
    got_no_answer, parse_probe_output, probe_script, resolve_allowance)


def probe_env(ctx: DoctorContext) -> Tuple[str, Dict[str, str]]:
    """(the proxy's URL, the environment a probe gets): what a job gets (docs/job-networks.md)."""
    proxy_url = 'http://%s:%d' % (ctx.proxy, _rules.PROXY_PORT)
    # Uppercase proxy variables only.
    return proxy_url, {'HTTPS_PROXY': proxy_url, 'HTTP_PROXY': proxy_url, 'NO_PROXY': 'localhost,127.0.0.1,::1',
                       'NODE_USE_ENV_PROXY': '1', 'HOME': '/tmp'}


def job_identity(ctx: DoctorContext) -> Tuple[Optional[str], Optional[str]]:
    """(the user, the user namespace mode) a job's container gets on this venue, so a probe's pass is about what a
    job gets: on rootless Podman a job runs as its account's uid with ``--userns=keep-id`` (the seed's podman
    venue; docs/podman.md), and so does every probe; elsewhere (None, None), the image's own user."""
    try:
        ids = _rootless.engine_ids(ctx.client)
    except dc.EngineError:  # the create that follows says what the engine does not answer
        ids = None
    if ids is None:
        return None, None
    return '%d:%d' % (ids.uid, ids.gid), 'keep-id'


def job_host_config(ctx: DoctorContext, **kwargs: Any) -> Dict[str, Any]:
    """A probe's host config: ``kwargs`` and, on rootless Podman, ``keep-id``. The Docker SDK takes only ``host`` as
    ``userns_mode``, so the mode is set on the dict it builds; Podman's compat create reads it (measured on
    4.3.1: the probe's ``/proc/self/uid_map`` maps the account's uid to itself)."""
    config = ctx.client.api.create_host_config(**kwargs)
    _user, userns = job_identity(ctx)
    if userns:
        config['UsernsMode'] = userns
    return config


def run_container(ctx: DoctorContext, key: str, name: str, script: str, net: str, results: dict, wait: int,
                  address: Optional[str] = None) -> None:
    """Run one probe container to its end; results[key] = (output text, None) or (None, why)."""
    _proxy_url, env = probe_env(ctx)
    api = ctx.client.api
    started = time.monotonic()
    with ctx.lock:
        ctx.launched.append(name)
    try:
        try:
            endpoint = api.create_endpoint_config(ipv4_address=address) if address else \
                api.create_endpoint_config()
            created = api.create_container(
                ctx.probe_image, ['sh', '-c', script], name=name, detach=True, environment=env,
                labels={LABEL: str(ctx.pid)}, user=job_identity(ctx)[0],
                host_config=job_host_config(ctx, network_mode=net, security_opt=['no-new-privileges:true'],
                                            cap_drop=['ALL']),
                networking_config=api.create_networking_config({net: endpoint}))
            api.start(created['Id'])
        except Exception as exc:
            results[key] = (None, 'the container could not start: %s' % dc.api_message(exc))
            return
        try:
            api.wait(created['Id'], timeout=wait)
        except Exception:
            results[key] = (None, 'it did not finish within %ss' % wait)
            return
        logs = api.logs(created['Id'], stdout=True, stderr=True)
        text = logs.decode('utf-8', 'replace') if isinstance(logs, bytes) else str(logs)
        results[key] = (text, None)
    finally:
        ctx.timings[key] = time.monotonic() - started


def run_job_probe(ctx: DoctorContext, key: str, name: str, script: str, network: str, environment: Dict[str, str],
                  wait: int, dns: Optional[List[str]] = None, binds: Optional[List[str]] = None
                  ) -> Tuple[Optional[str], Optional[str]]:
    """Run one probe container on a job network made by the job-network API, as a job runs there (its own
    environment, every capability dropped), to its end, and remove it; (its output, None) or (None, why).

    Shared by the transparent and the credential canaries; timed in ``ctx.timings[key]``.
    """
    api = ctx.client.api
    with ctx.lock:
        ctx.launched.append(name)
    started = time.monotonic()
    try:
        created = api.create_container(
            ctx.probe_image, ['sh', '-c', script], name=name, detach=True, environment=environment,
            labels={LABEL: str(ctx.pid)}, user=job_identity(ctx)[0],
            host_config=job_host_config(ctx, network_mode=network, dns=dns, binds=binds, cap_drop=['ALL'],
                                        security_opt=['no-new-privileges:true']))
        api.start(created['Id'])
        api.wait(created['Id'], timeout=wait)
        return api.logs(created['Id'], stdout=True, stderr=True).decode('utf-8', 'replace'), None
    except Exception as exc:
        return None, 'the probe container: %s' % dc.api_message(exc)
    finally:
        ctx.timings[key] = time.monotonic() - started
        dc.remove_quietly(api, name)  # the sweep of a later run finds it by its label


def probe_wait(ctx: DoctorContext, timeout: int) -> int:
    """Seconds a curl probe's container may take: its curl, the start grace, and the retries of an unresolved proxy."""
    return timeout + ctx.start_grace + resolve_allowance(timeout)


def again_name(name: str, pid: int) -> str:
    """The fresh container's name for a probe run once more: ``-again`` before the pid, which stays last, so a
    killed run's is one of that run's probes to the next run's sweep (``names.probe_pid``)."""
    tail = '-%d' % int(pid)
    return name[:-len(tail)] + '-again' + tail if name.endswith(tail) else name + '-again'


def run_probe(ctx: DoctorContext, probe: str, url: str, net: str, results: dict, timeout: Optional[int] = None,
              tunnel: bool = False, name: Optional[str] = None, connect_to: Optional[str] = None) -> None:
    """One curl through the proxy in a probe container; results[probe] = (parsed output, None) or (None, why)."""
    timeout = ctx.probe_timeout if timeout is None else timeout
    proxy_url, _env = probe_env(ctx)
    name = name or probe_name(probe, ctx.pid)
    script = probe_script(url, proxy_url, timeout, tunnel=tunnel, connect_to=connect_to)
    raw = {}
    run_container(ctx, probe, name, script, net, raw, probe_wait(ctx, timeout))
    text, why = raw.get(probe, (None, 'it did not finish'))
    if text is not None and got_no_answer(parse_probe_output(text)):
        # No answer at all proves nothing either way. On Podman 4.3 a container that joined while aardvark-dns
        # reloaded for the others can stay unknown to it, and its lookups are never answered (the proxy's name,
        # or the proxy's own lookup after a restart; measured in the Podman gate: "Resolving timed out",
        # "Connection timed out"). Once more, from a fresh container; its result, whatever it is, is the probe's.
        raw = {}
        run_container(ctx, probe, again_name(name, ctx.pid), script, net, raw, probe_wait(ctx, timeout))
        text, why = raw.get(probe, (None, 'it did not finish'))
    if text is None:
        results[probe] = (None, why)
        return
    parsed = parse_probe_output(text)
    results[probe] = (parsed, None if parsed else 'the probe image printed no curl result (%s)'
                      % (' '.join(text.split())[-200:] or 'no output; does it have sh and curl?'))
