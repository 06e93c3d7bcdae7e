# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The job-network API: one ``--internal`` network per job, as plain Python for a dispatcher.

Import it as::

    from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as _jobnet

Each job ``<id>`` gets the network ``pi-job-<id>-net``, which holds exactly
the job container ``pi-job-<id>`` and the egress proxy. A dispatcher (a
Python program that starts jobs) calls this API directly, with no Ansible
process per job; the modules ``job_network``, ``job_network_gc`` and
``egress_preflight`` are thin adapters over the same calls.

This file is the published surface: the names in ``__all__``, versioned by
:data:`API_VERSION` and documented in docs/job-network-api.md. It only
re-exports; the code lives in files of one concern each, which are internal
and may change in any release:

* ``_jobnets/names.py``: job ids, network and container names, labels, the
  job's proxy environment (pure);
* ``_jobnets/pool.py``: the subnet pool and picking a free subnet (from the
  subnets a client remembers of its daemon, not a listing per create);
* ``_jobnets/engine.py``: the Engine calls the others share, and how their
  failures read;
* ``_jobnets/lifecycle.py``: create; ``_jobnets/teardown.py``: teardown;
* ``_jobnets/transparent.py``: the transparent mode's part of both;
* ``_jobnets/gc.py``: the sweep (its pure decision table and its execution);
* ``_jobnets/preflight.py``: the verdict before a job starts.

The contracts (each function's docstring has the details):

* :func:`preflight` ``(client, proxy_name=PROXY_NAME, enabled=True)`` ->
  :class:`Verdict`. At most one container inspect; never raises for a daemon
  failure (that is the retryable ``engine-unavailable`` verdict). Start the
  job only when ``verdict.admitted``.
* :func:`create_job_network` ``(client, job_id, ..., shard_bound=None)``
  -> :class:`JobNetwork`. Creates the labelled ``--internal`` network on a
  free subnet of the pool and attaches the least-loaded member of the proxy
  family (the proxy, or a shard with the proxy's name as its alias; a new
  shard when all carry the bound: ``shard_bound``, else the proxy's, else
  DEFAULT_SHARD_BOUND); idempotent; leaves nothing behind
  when it fails.
  Raises JobNetError (bad input), PoolExhausted, EngineError,
  EngineUnavailable.
* :func:`teardown_job_network` ``(client, job_id, proxy_name=PROXY_NAME,
  check_mode=False)`` -> ``dict(changed, network, actions)``. Detaches the
  proxy and removes the network; refuses, changing nothing, while any other
  container is on it; idempotent. Raises JobNetError, EngineError,
  EngineUnavailable.
* :func:`plan_subnet` ``(client, pool=DEFAULT_POOL, prefix=DEFAULT_PREFIX,
  routes=None)`` -> ``ipaddress.IPv4Network``. The subnet create would pick
  now; read-only, nothing is reserved.
* :func:`sweep` / :func:`sweep_lines`: collect the job networks a dead
  worker left behind (and the proxy shards left empty), and report it.
* :func:`approve_optins` ``(project_policy, digest=None, deploy_dir=None,
  check_mode=False)`` -> ``dict``. The operator's consent to what a project's
  ``.pi-container/config.yaml`` opens now (the digest they reviewed), kept in
  the deployment folder: a transparent create refuses a policy that opens a
  port unless it is the approved one. No daemon is asked.
* :func:`proxy_family` ``(client, proxy_name=PROXY_NAME)``: the proxy and its shards,
  each with its state and the job networks it carries.
* :func:`lazy_client`, :func:`inspect_job_network`, :func:`read_host_routes`,
  :func:`pool_capacity`, :func:`parse_pool`, and the naming helpers
  :func:`validate_job_id`, :func:`validate_id_prefix`, :func:`network_name`,
  :func:`container_name`, :func:`looks_like_job_network`,
  :func:`job_id_from_network_name`, :func:`job_labels`, :func:`job_env`.
"""

from __future__ import annotations

from typing import Any, List

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common.docker_client import (
    EngineError,
    EngineUnavailable,
)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets.engine import (
    inspect_job_network,
)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets.gc import (
    KEEP_REASONS,
    sweep,
    sweep_lines,
)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets.lifecycle import (
    CREATE_ATTEMPTS,
    JobNetwork,
    create_job_network,
)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets.teardown import teardown_job_network
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets.transparent import (
    EXPLICIT,
    MODES,
    TRANSPARENT,
    TRANSPARENT_PREFIX,
    approve_optins,
)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy.gateway import GATEWAY_NAME
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets.names import (
    LABEL_CREATED,
    LABEL_JOB_ID,
    LABEL_OWNER_HOST,
    NO_PROXY,
    PROXY_PORT,
    JobNetError,
    container_name,
    job_env,
    job_id_from_network_name,
    job_labels,
    looks_like_job_network,
    network_name,
    validate_id_prefix,
    validate_job_id,
)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy.spec import PROXY_NAME
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy.jobpool import DEFAULT_POOL, DEFAULT_PREFIX
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets.pool import (
    PoolExhausted,
    parse_pool,
    plan_subnet,
    pool_capacity,
    read_host_routes,
)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import shards as _shards
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy.shards import (
    DEFAULT_BOUND as DEFAULT_SHARD_BOUND,
    ShardError,
)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets.preflight import (
    ADMIT,
    CREDENTIAL_UNAVAILABLE,
    CREDENTIAL_VERDICTS,
    ENGINE_UNAVAILABLE,
    GATEWAY_MISSING,
    GATEWAY_STOPPED,
    INTERCEPTOR_MISSING,
    INTERCEPTOR_STOPPED,
    MCP_SERVER_REFUSED,
    MCP_VERDICTS,
    TRANSPARENT_VERDICTS,
    PROXY_MISSING,
    PROXY_STOPPED,
    VERDICTS,
    Verdict,
    lazy_client,
    preflight,
)


def proxy_family(client: Any, proxy_name: str = PROXY_NAME) -> List[_shards.Member]:
    """The proxy (index 0, when it exists) and its shards by index, as ``Member`` objects.

    Read-only: one container inspect and one container listing. Raises EngineError /
    EngineUnavailable.
    """
    return _shards.members(client, proxy_name)


# MAJOR.MINOR of the names in __all__ (docs/job-network-api.md, "Versioning"). MINOR grows for
# additions an existing caller cannot notice (a new name, a new keyword argument whose default keeps
# today's behaviour, a new key or attribute in a result, a new sweep keep reason). MAJOR grows for
# anything else: a name removed or renamed, a parameter moved or its default changed, a result key
# or attribute removed, another exception class for a documented case, a new verdict, or another
# naming contract (pi-job-<id>-net, pi-job-<id>, the labels, the job's environment). Message texts
# are not part of the API.
# 2.0: create_job_network attaches the least-loaded member of the proxy family (the proxy or a
# shard, shard_bound=DEFAULT_SHARD_BOUND job networks each; 0 turns it off), JobNetwork.proxy names it.
# 3.0: shard_bound defaults to None: the bound the proxy carries (role variable
# egress_proxy_shard_bound), else DEFAULT_SHARD_BOUND, now 10 (was 50).
# 3.1: mode='transparent' (create_job_network's mode, project_policy and gateway_name; teardown's
# gateway_name; JobNetwork.mode, .dns, .gateway, .optins; preflight's mode and gateway_name).
# 3.2: credential placeholders (create_job_network's and teardown_job_network's credentials_dir;
# JobNetwork.ca_mounts, mounted by run_args; preflight's credentials_dir and interceptor_name, with
# CREDENTIAL_VERDICTS given only when credentials_dir is passed).
# 3.3: a job's MCP servers (preflight's mcp_json and deploy_dir, with MCP_VERDICTS given only when mcp_json
# is passed).
# 3.4: the operator approves a project's opt-ins (approve_optins; create_job_network's deploy_dir keeps the
# approvals): a transparent create refuses, with JobNetError as for any refused policy file, a policy that
# opens a port and is not the approved one (issue 42).
API_VERSION = '3.4'

__all__ = [
    'API_VERSION',
    # preflight
    'preflight', 'lazy_client', 'Verdict', 'VERDICTS', 'ADMIT', 'PROXY_STOPPED', 'PROXY_MISSING',
    'ENGINE_UNAVAILABLE', 'GATEWAY_MISSING', 'GATEWAY_STOPPED', 'TRANSPARENT_VERDICTS',
    'CREDENTIAL_UNAVAILABLE', 'INTERCEPTOR_MISSING', 'INTERCEPTOR_STOPPED', 'CREDENTIAL_VERDICTS',
    'MCP_SERVER_REFUSED', 'MCP_VERDICTS',
    # create and teardown
    'create_job_network', 'teardown_job_network', 'inspect_job_network', 'JobNetwork', 'CREATE_ATTEMPTS',
    # proxy shards
    'DEFAULT_SHARD_BOUND', 'proxy_family', 'ShardError',
    # the pool
    'plan_subnet', 'read_host_routes', 'pool_capacity', 'parse_pool', 'DEFAULT_POOL', 'DEFAULT_PREFIX',
    # the sweep
    'sweep', 'sweep_lines', 'KEEP_REASONS',
    # names, labels, environment
    'validate_job_id', 'validate_id_prefix', 'network_name', 'container_name', 'looks_like_job_network',
    'job_id_from_network_name', 'job_labels', 'job_env', 'PROXY_NAME', 'PROXY_PORT', 'NO_PROXY',
    'LABEL_JOB_ID', 'LABEL_CREATED', 'LABEL_OWNER_HOST',
    # transparent job networks
    'EXPLICIT', 'TRANSPARENT', 'MODES', 'TRANSPARENT_PREFIX', 'GATEWAY_NAME', 'approve_optins',
    # exceptions
    'JobNetError', 'PoolExhausted', 'EngineError', 'EngineUnavailable',
]
