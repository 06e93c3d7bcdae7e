"""Benchmark concurrent job-network creators: create+attach p50/p90 with 1, 5 and 20 at once.

    python3 benchmarks/jobnet_concurrency.py --proxy pi-dispatch-egress-proxy [--rounds 3] [--bound 0]

Each level runs ``--rounds`` rounds; a round starts N dispatcher processes
(tests/integration/jobnet_worker.py, one Docker client each), releases them at the same moment,
and each times its own ``create_job_network`` call; then all N tear down at once, and the next
round starts. The levels are interleaved round by round (1, 5, 20, 1, 5, 20, ...) so that the
daemon's drift over the run falls on each level alike. Printed: per level, the count, failures,
p50 and p90 of create+attach in ms, and the ratio of each to the single creator's; and the wall
time of the slowest creator of a round (what the last of N waits).

``--bound`` is the shard bound the creates pass (0, the default: every network on the proxy, so
the figures are the lock and the daemon, not shard starts). Asserts nothing. Every job network
(``pi-job-benchc-<pid>-*-net``) and shard it made is removed at the end, also on Ctrl-C.
"""

import argparse
import os
import statistics
import sys
import tempfile

import _collection  # noqa: E402  (benchmarks/_collection.py, beside this file)

ROOT = _collection.ROOT


def _import():
    _collection.expose()
    sys.path.insert(0, os.path.join(ROOT, 'tests', 'integration'))
    from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as _jobnet
    import jobnet_worker
    return _jobnet, jobnet_worker


jn, worker = _import()
import docker  # noqa: E402


def pct(values, q):
    if not values:
        return float('nan')
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def cleanup(client, proxy, prefix):
    for net in client.api.networks(filters={'name': 'pi-job-' + prefix}):
        job = jn.job_id_from_network_name(net['Name'])
        if job and job.startswith(prefix):
            try:
                jn.teardown_job_network(client, job, proxy_name=proxy)
            except jn.EngineError as exc:
                print('cleanup: %s' % exc)
    for member in jn.proxy_family(client, proxy):
        if member.is_shard and not member.load:
            client.api.remove_container(member.name, force=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--proxy', default=jn.PROXY_NAME)
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--levels', default='1,5,20')
    parser.add_argument('--bound', type=int, default=0)
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(',')]
    client = docker.from_env(timeout=120)
    if client.api.inspect_container(args.proxy)['State']['Status'] != 'running':
        sys.exit('the proxy %s is not running' % args.proxy)
    prefix = 'benchc-%d-' % os.getpid()
    folder = tempfile.mkdtemp(prefix='pi-egress-benchc-')
    seconds = dict((n, []) for n in levels)
    walls = dict((n, []) for n in levels)
    failures = dict((n, []) for n in levels)
    try:
        for rnd in range(args.rounds):
            for n in levels:
                jobs = ['%s%d-%d-%02d' % (prefix, rnd, n, i) for i in range(n)]
                made = worker.crowd('create', jobs, args.proxy, args.bound, folder)
                for result in made:
                    if result['ok']:
                        seconds[n].append(result['seconds'])
                    else:
                        failures[n].append(result['error'])
                walls[n].append(max(r['seconds'] for r in made))
                gone = worker.crowd('teardown', jobs, args.proxy, args.bound, folder)
                failures[n].extend('teardown: ' + r['error'] for r in gone if not r['ok'])
    finally:
        cleanup(client, args.proxy, prefix)
    engine = client.version()
    print('engine: Docker %s (API %s); proxy %s; shard bound %d; %d rounds, levels interleaved'
          % (engine.get('Version'), engine.get('ApiVersion'), args.proxy, args.bound, args.rounds))
    header = ('creators', 'calls', 'failed', 'p50 ms', 'p90 ms', 'p50 x1', 'p90 x1', 'slowest ms')
    print('%-10s %6s %8s %10s %10s %9s %9s %14s' % header)
    base50, base90 = pct(seconds[levels[0]], 0.5), pct(seconds[levels[0]], 0.9)
    for n in levels:
        p50, p90 = pct(seconds[n], 0.5), pct(seconds[n], 0.9)
        print('%-10d %6d %8d %10.1f %10.1f %9.2f %9.2f %14.1f' % (
            n, len(seconds[n]) + len(failures[n]), len(failures[n]), p50 * 1000, p90 * 1000, p50 / base50,
            p90 / base90, statistics.median(walls[n]) * 1000))
    for n in levels:
        for error in failures[n][:3]:
            print('failure at %d: %s' % (n, error))


if __name__ == '__main__':
    main()
