# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The job-network API as a command line: for a dispatcher that is not Python.

Run it with the folder that holds ``ansible_collections/`` on ``PYTHONPATH``::

    python3 -m ansible_collections.pi_dispatch.egress.plugins.module_utils.jobnet_cli create JOB_ID

Each call prints exactly one JSON object on stdout and exits with a code that mirrors the API's
exceptions (:data:`EXIT_CODES`; docs/job-network-api.md, "The command line"). Nothing else is
printed on stdout; nothing of Ansible is imported, so a call costs one Python start and the
daemon's answers. Messages pass through the collection's redaction (a URL's userinfo is ``***``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable, Dict, List, Optional

from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common.redact import redact
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy.deployment import DEFAULT_DEPLOY_DIR

# One code per outcome; the order of ERRORS is the order the exceptions are matched (subclasses first).
EXIT_OK = 0
EXIT_INTERNAL = 1  # an unexpected exception: a bug, reported as JSON too
EXIT_USAGE = 2  # argparse's own code for a bad command line
EXIT_BAD_INPUT = 3  # JobNetError: a bad job id, pool, prefix or id prefix; nothing was changed
EXIT_POOL_EXHAUSTED = 4  # PoolExhausted: no free subnet of that size is left in the pool
EXIT_SHARD = 5  # ShardError: a proxy shard could not be chosen, made or removed
EXIT_ENGINE = 6  # EngineError: the daemon refused (for example another container is still on the network)
EXIT_UNAVAILABLE = 7  # EngineUnavailable: the daemon did not answer; retryable, nothing was decided
EXIT_REFUSED = 8  # preflight: the verdict does not admit the job (the proxy is missing or stopped)
EXIT_SWEEP_FAILED = 9  # sweep: it ran, and at least one network could not be removed (see "failed")

ERRORS = (
    (jobnet.EngineUnavailable, EXIT_UNAVAILABLE),
    (jobnet.PoolExhausted, EXIT_POOL_EXHAUSTED),
    (jobnet.ShardError, EXIT_SHARD),
    (jobnet.EngineError, EXIT_ENGINE),
    (jobnet.JobNetError, EXIT_BAD_INPUT),
)

EXIT_CODES = {
    EXIT_OK: 'done (preflight: admitted)',
    EXIT_INTERNAL: 'unexpected error (a bug: report it with the JSON)',
    EXIT_USAGE: 'bad command line',
    EXIT_BAD_INPUT: 'JobNetError: bad input, nothing changed',
    EXIT_POOL_EXHAUSTED: 'PoolExhausted: no free subnet left in the pool',
    EXIT_SHARD: 'ShardError: a proxy shard could not be chosen, made or removed',
    EXIT_ENGINE: 'EngineError: the daemon refused',
    EXIT_UNAVAILABLE: 'EngineUnavailable: the daemon did not answer (retry)',
    EXIT_REFUSED: 'preflight refused the job (proxy missing or stopped)',
    EXIT_SWEEP_FAILED: 'sweep ran; some networks could not be removed',
}

Result = Dict[str, Any]


def parser() -> argparse.ArgumentParser:
    """The command line: five commands and the connection options they share."""
    top = argparse.ArgumentParser(
        prog='python3 -m ansible_collections.pi_dispatch.egress.plugins.module_utils.jobnet_cli',
        description='One --internal network per job (job-network API %s). Prints one JSON object; exit codes: '
                    '%s.' % (jobnet.API_VERSION, '; '.join('%d %s' % kv for kv in sorted(EXIT_CODES.items()))))
    top.add_argument('--docker-host', default=None,
                     help='the daemon (unix:///var/run/docker.sock, tcp://...); '
                          'default: DOCKER_HOST, then the local socket')
    top.add_argument('--timeout', type=int, default=dc.DEFAULT_TIMEOUT, help='seconds per daemon call')
    top.add_argument('--proxy', default=jobnet.PROXY_NAME, help='the egress proxy container (default %(default)s)')
    top.add_argument('--gateway', default=jobnet.GATEWAY_NAME,
                     help='the gateway of transparent job networks (default %(default)s)')
    sub = top.add_subparsers(dest='command', required=True)

    create = sub.add_parser('create', help='create pi-job-<id>-net and attach the proxy (idempotent)')
    create.add_argument('job_id')
    create.add_argument('--pool', default=jobnet.DEFAULT_POOL)
    create.add_argument('--prefix', type=int, default=jobnet.DEFAULT_PREFIX)
    create.add_argument('--shard-bound', type=int, default=None,
                        help='job networks per proxy member (default: the proxy\'s own bound)')
    create.add_argument('--remote', action='store_true',
                        help='the daemon is on another host: do not read this host\'s routes')
    create.add_argument('--check', action='store_true', help='say what would be done, change nothing')
    create.add_argument('--mode', choices=jobnet.MODES, default=jobnet.EXPLICIT,
                        help='explicit (proxy variables) or transparent (the gateway; docs/transparent.md)')
    create.add_argument('--project-policy', default=None,
                        help='transparent: the project\'s .pi-container/config.yaml (seeded deny-all when missing)')
    create.add_argument('--deploy-dir', default=None,
                        help='transparent: the deployment folder that keeps the approved opt-ins (default '
                             '/opt/pi-dispatch/egress)')

    teardown = sub.add_parser('teardown', help='detach the proxy and remove pi-job-<id>-net (idempotent)')
    teardown.add_argument('job_id')
    teardown.add_argument('--check', action='store_true')

    check = sub.add_parser('preflight', help='the verdict before a job spends anything (one inspect)')
    check.add_argument('--disabled', action='store_true', help='the egress policy is off: admit, ask no daemon')
    check.add_argument('--mode', choices=jobnet.MODES, default=jobnet.EXPLICIT,
                       help='transparent: the gateway must run too')
    check.add_argument('--mcp-json', help='the job\'s mcp.json: each enabled MCP server must be one the proxy carries')
    check.add_argument('--deploy-dir', help='the deployment folder whose allowlist and model endpoints judge it')

    approve = sub.add_parser('approve-optins', help='approve what a project\'s opt-ins open now (no daemon is asked; '
                                                    'docs/transparent.md)')
    where = approve.add_mutually_exclusive_group(required=True)
    where.add_argument('--project', help='the project folder (its .pi-container/config.yaml)')
    where.add_argument('--policy', help='the policy file itself')
    approve.add_argument('--deploy-dir', default=DEFAULT_DEPLOY_DIR,
                         help='the deployment folder that keeps the approvals (default %(default)s)')
    how = approve.add_mutually_exclusive_group(required=True)
    how.add_argument('--digest', help='the digest of the policy you reviewed (the refusal names it); approve it')
    how.add_argument('--check', action='store_true', help='show what the policy opens, its digest and the diff; '
                                                          'approve nothing')

    sweep = sub.add_parser('sweep', help='remove the job networks a dead worker left behind')
    sweep.add_argument('--min-age', type=int, default=300, help='seconds a network must have lived')
    sweep.add_argument('--id-prefix', default='')
    sweep.add_argument('--remove-exited-jobs', action='store_true')
    sweep.add_argument('--check', action='store_true')
    return top


def _client(args: argparse.Namespace) -> Any:
    return dc.connect(args.docker_host, args.timeout)


def run_create(args: argparse.Namespace, connect: Callable[[argparse.Namespace], Any]) -> Result:
    net = jobnet.create_job_network(connect(args), args.job_id, proxy_name=args.proxy, pool=args.pool,
                                    prefix=args.prefix, routes=[] if args.remote else None,
                                    check_mode=args.check, shard_bound=args.shard_bound, mode=args.mode,
                                    project_policy=args.project_policy, gateway_name=args.gateway,
                                    deploy_dir=args.deploy_dir)
    return dict(net.as_dict(), run_args=net.run_args())


def run_approve(args: argparse.Namespace, connect: Callable[[argparse.Namespace], Any]) -> Result:
    """No daemon: the approval is a file in the deployment folder."""
    policy = args.policy or os.path.join(os.path.abspath(args.project), '.pi-container', 'config.yaml')
    return jobnet.approve_optins(policy, args.digest, deploy_dir=args.deploy_dir, check_mode=args.check)


def run_teardown(args: argparse.Namespace, connect: Callable[[argparse.Namespace], Any]) -> Result:
    return dict(jobnet.teardown_job_network(connect(args), args.job_id, proxy_name=args.proxy,
                                            check_mode=args.check, gateway_name=args.gateway))


def run_preflight(args: argparse.Namespace, connect: Callable[[argparse.Namespace], Any]) -> Result:
    # One inspect and no ping: the client is built only when the policy is on (lazy_client).
    client = jobnet.lazy_client(args.docker_host, args.timeout) if connect is _client else (lambda: connect(args))
    verdict = jobnet.preflight(client, proxy_name=args.proxy, enabled=not args.disabled,
                               docker_host=args.docker_host, mode=args.mode, gateway_name=args.gateway,
                               mcp_json=args.mcp_json, deploy_dir=args.deploy_dir)
    return dict(verdict.as_dict(), admitted=verdict.admitted)


def run_sweep(args: argparse.Namespace, connect: Callable[[argparse.Namespace], Any]) -> Result:
    return dict(jobnet.sweep(connect(args), min_age=args.min_age, remove_exited_jobs=args.remove_exited_jobs,
                             proxy_name=args.proxy, id_prefix=args.id_prefix, check_mode=args.check))


COMMANDS = {'create': run_create, 'teardown': run_teardown, 'preflight': run_preflight, 'sweep': run_sweep,
            'approve-optins': run_approve}


def exit_code(command: str, result: Result) -> int:
    """The code of a call that returned (no exception)."""
    if command == 'preflight' and not result['admitted']:
        return EXIT_UNAVAILABLE if result['verdict'] == jobnet.ENGINE_UNAVAILABLE else EXIT_REFUSED
    if command == 'sweep' and result.get('failed'):
        return EXIT_SWEEP_FAILED
    return EXIT_OK


def error_code(exc: BaseException) -> int:
    for kind, code in ERRORS:
        if isinstance(exc, kind):
            return code
    return EXIT_INTERNAL


def main(argv: Optional[List[str]] = None, out: Any = None,
         connect: Callable[[argparse.Namespace], Any] = _client) -> int:
    """Run one command; print its JSON on ``out`` (stdout); return the exit code."""
    out = out or sys.stdout
    args = parser().parse_args(argv)
    doc: Result = dict(command=args.command, api_version=jobnet.API_VERSION)
    try:
        result = COMMANDS[args.command](args, connect)
    except Exception as exc:  # every failure is one JSON object with its code, never a traceback
        code = error_code(exc)
        doc.update(ok=False, exit_code=code,
                   error=dict(type=type(exc).__name__, message=redact(str(exc)),
                              retryable=bool(getattr(exc, 'retryable', False))))
    else:
        code = exit_code(args.command, result)
        doc.update(ok=code == EXIT_OK, exit_code=code, result=result)
    out.write(redact(json.dumps(doc, sort_keys=True, default=str)) + '\n')
    out.flush()
    return code


if __name__ == '__main__':
    raise SystemExit(main())
