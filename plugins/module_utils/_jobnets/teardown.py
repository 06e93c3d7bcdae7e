# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""Job networks: tear one down (the gateway told to forget it, the proxy family detached, the network removed).

:func:`teardown_job_network` is the call a job runner makes after each job (split from ``lifecycle.py``,
which creates). Re-exported by ``jobnet.py``, the published job-network API (docs/job-network-api.md).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import lock as _jobnet_lock
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import credentials as _jobcreds
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import transparent as _transparent
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import rootless as _rootless
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import shards as _shards
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import shard_clone as _shard_clone
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy.gateway import GATEWAY_NAME
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common.docker_client import EngineError
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets.engine import (
    as_engine_error,
    client_memo,
    connection_failed,
    disconnect,
    inspect_job_network,
    proxy_on,
    remove_network,
    summary_name,
)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets.names import (
    network_name,
    ownership_problem,
    validate_job_id,
)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy.spec import PROXY_NAME
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets.pool import forget_subnet, subnet_of

# Every container state but running. A running container has an active endpoint, so the network's
# inspect names it already; leaving it out of the teardown's listing keeps the carrier's summary
# (every network the proxy or the shard carries) out of the answer.
_NOT_RUNNING = ['created', 'restarting', 'removing', 'paused', 'exited', 'dead']


def _configured_on(client: Any, memo: Dict[Any, Any], net_id: str, name: str) -> Tuple[List[Dict[str, Any]], bool]:
    """The containers configured on the network but not running, and True; (all of them, False) on a
    daemon that refuses the state filter (Podman knows no ``restarting`` or ``dead``), which the
    client then remembers."""
    if not memo.get('no-status-filter'):
        try:
            return client.api.containers(all=True, filters={'network': net_id, 'status': _NOT_RUNNING}), True
        except Exception as exc:
            if connection_failed(exc):
                raise as_engine_error('Listing the containers on %s failed' % name, exc)
            memo['no-status-filter'] = True
    try:
        return client.api.containers(all=True, filters={'network': net_id}), False
    except Exception as exc:
        raise as_engine_error('Listing the containers on %s failed' % name, exc)


def teardown_job_network(client: Any, job_id: str, proxy_name: str = PROXY_NAME,
                         check_mode: bool = False, gateway_name: str = GATEWAY_NAME,
                         credentials_dir: Optional[str] = None) -> Dict[str, Any]:
    """Detach the proxy (forced), then remove ``pi-job-<id>-net``.

    Refuses, changing nothing, while any container other than the proxy is
    still running on the network: stop and remove the job container first.
    Never removes a container. Returns dict(changed, network, actions).

    With ``credentials_dir`` (the deployment folder), the job's credential placeholders are forgotten
    too (the interceptor refuses them from then on), also when the network is already gone.

    Idempotent: a network that is not there returns changed=False. Raises
    JobNetError (bad job id), EngineError (a container, running or stopped,
    is still on the network; the network is another job's or foreign; the
    daemon refused) or EngineUnavailable (the daemon did not answer).
    """
    validate_job_id(job_id)
    name = network_name(job_id)
    attrs = inspect_job_network(client, name)
    if attrs is None:
        forgot = _jobcreds.forget(credentials_dir, job_id, check_mode)
        return dict(changed=bool(forgot), network=name, actions=forgot)
    problem = ownership_problem(attrs, job_id)
    if problem:
        raise EngineError("Network %s is not this job's: %s. Nothing was changed." % (name, problem))
    # A stopped or created container is configured on the network without an
    # active endpoint (so it is not in the inspect's Containers); removing the
    # network would leave it unable to start. The inspect names the running
    # ones, one filtered listing the others.
    memo = client_memo(client)
    configured, running_left_out = _configured_on(client, memo, attrs['Id'], name)
    listed = dict((summary_name(c), (c.get('State') or 'unknown').lower()) for c in configured)
    for cid, endpoint in (attrs.get('Containers') or {}).items():
        listed.setdefault((endpoint or {}).get('Name') or cid[:12], 'running' if running_left_out else 'endpoint')
    others = sorted('%s (%s)' % (n, st) for n, st in listed.items()
                    if not _shards.is_family_name(n, proxy_name) and n != gateway_name)
    if others:
        first = others[0].split(' ')[0]
        raise EngineError(
            "Network %s still has %s on it. Nothing was changed. Stop and remove the job "
            "container first (docker stop %s && docker rm %s), then tear the network down."
            % (name, ', '.join(others), first, first))
    # Every member of the proxy family on it: active endpoints and configured (stopped) members.
    carriers = sorted(set(_shards.family_on(attrs, proxy_name))
                      | set(n for n in listed if _shards.is_family_name(n, proxy_name))) or [proxy_name]
    gateway_on = gateway_name in listed or proxy_on(attrs, gateway_name)
    actions = (['detach %s' % gateway_name] if gateway_on else []) + \
        ['detach %s' % c for c in carriers if proxy_on(attrs, c)] + ['remove %s' % name]
    if check_mode:
        return dict(changed=True, network=name, actions=actions + _jobcreds.forget(credentials_dir, job_id, True))
    net_id = attrs['Id']
    detached, held = [], []
    if gateway_on:
        try:
            _transparent.forget(client, gateway_name, name)
        except EngineError:
            pass  # a stopped gateway: it forgets the network at its next start (gatewayd apply)
        # A running container's detach may be the last one holding rootless Podman 4's network: made under a
        # keeper there (_proxy/rootless.py), or the proxy would lose its route out.
        with _rootless.network_held(client, gateway_name, name, actions=held):
            if disconnect(client, gateway_name, net_id):
                detached.append(gateway_name)
    for carrier in carriers:
        try:
            with _rootless.network_held(client, carrier, name, actions=held):
                if disconnect(client, carrier, net_id):
                    detached.append(carrier)
        except EngineError as exc:
            raise EngineError("Detaching the proxy %s from %s failed: %s. The network is still there; "
                              "retry the teardown." % (carrier, name, exc))
        _shards.note(memo, proxy_name, carrier, name, attached=False)
    try:
        removed = remove_network(client, net_id)
    except EngineError as exc:
        raise EngineError(
            "Removing %s failed: %s. If it says the network has active endpoints, docker network "
            "inspect %s shows what is still on it; stop and remove that container, then retry."
            % (name, exc, name))
    forget_subnet(memo, subnet_of(attrs))
    done = held + ['detach %s' % c for c in detached] + (['remove %s' % name] if removed else [])
    done += _jobcreds.forget(credentials_dir, job_id)
    shards = [c for c in carriers if c != proxy_name]
    if shards:
        # A shard whose last job network this was goes too (the proxy itself always stays), under the
        # daemon's lock: a create on this host never picks a shard that is being removed.
        try:
            with _jobnet_lock.held(client, memo) as lock:
                for carrier in shards:
                    if _shard_clone.remove_if_empty(client, proxy_name, carrier):
                        done.append('remove the empty shard %s' % carrier)
                        _shards.note(memo, proxy_name, carrier, attached=False)
                        lock.changed()
        except EngineError:
            pass  # the sweep (job_network_gc) removes an empty shard later
    return dict(changed=bool(done), network=name, actions=done)
