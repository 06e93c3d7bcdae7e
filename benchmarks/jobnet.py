"""Benchmark per-job networks: capacity, create/teardown cost, our overhead vs raw SDK calls.

    python3 benchmarks/jobnet.py --count 500 --proxy pi-dispatch-egress-proxy

1. Creates --count job networks (job ids ``bench5-<pid>-<i>``) through
   ``_jobnet.create_job_network``, each with the proxy attached, all alive at
   once: proves the capacity against Docker's default address pools (31
   networks: 172.17-31.0.0/16 as /16s and 192.168.0.0/16 as /20s).
2. Tears every one down through ``_jobnet.teardown_job_network``.
3. Does the same --raw-count times with the bare SDK calls (create --internal
   with an explicit /29, connect; disconnect, remove) for the overhead ratio.
4. Leaves --sweep-count proxy-only networks and times one ``_jobnet.sweep``
   against the same number of sequential raw disconnect+remove.

With shards (issue 15), step 1 runs twice: the sharded layout (--shard-bound job networks per
proxy container, --count networks) and the single proxy (--single-count networks), each printing
create+attach and teardown p50/p90 per block of 100 and the ratio p50(last block) / p50(first
block). Steps 3 and 4 use the single proxy (shard_bound=0), as before.

Prints figures; asserts nothing. Everything it created is removed at the end,
also on Ctrl-C or SIGTERM (names are tracked, and a final pass removes any
``pi-job-bench5-<pid>-*-net`` left).
"""

import argparse
import os
import signal
import statistics
import sys
import time

import _collection  # noqa: E402  (benchmarks/_collection.py, beside this file)

ROOT = _collection.ROOT


def _import_jobnet():
    _collection.expose()
    from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as _jobnet
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import pool as _jobnet_pool
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._firewall import host as _firewall_host
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._fleet import host_check as _host_check
    return _jobnet, _jobnet_pool, (lambda: _host_check.iptables_variant(_firewall_host.Runner(timeout=10)))


# the published API; the pool's pure allocator (raw SDK baseline) is internal; the host's iptables
jn, jn_pool, iptables_variant = _import_jobnet()
import docker  # noqa: E402
from docker.types import IPAMConfig, IPAMPool  # noqa: E402

DOCKER_DEFAULT_POOL_CAPACITY = 15 + 16  # 172.17..31.0.0/16 at /16, 192.168.0.0/16 at /20


class Interrupted(Exception):
    pass


def _on_signal(signum, _frame):
    raise Interrupted('signal %d' % signum)


def fmt(values):
    if not values:
        return 'n/a'
    return 'median %.1f ms, p90 %.1f ms, total %.2f s (n=%d)' % (
        statistics.median(values) * 1000, sorted(values)[int(len(values) * 0.9) - 1 if len(values) > 1 else 0] * 1000,
        sum(values), len(values))


def cleanup(client, created, prefix, proxy):
    left = 0
    names = set(created)
    try:
        names |= set(n['Name'] for n in client.api.networks() if n['Name'].startswith('pi-job-' + prefix))
    except Exception as exc:  # keep going with what we tracked
        print('listing networks for cleanup failed: %s' % exc)
    for name in sorted(names):
        try:
            attrs = client.api.inspect_network(name)
        except docker.errors.NotFound:
            continue
        for cid in attrs.get('Containers') or {}:
            try:
                client.api.disconnect_container_from_network(cid, attrs['Id'], force=True)
            except docker.errors.APIError:
                pass
        try:
            client.api.remove_network(attrs['Id'])
        except docker.errors.APIError as exc:
            left += 1
            print('could not remove %s: %s' % (name, exc))
    return left


def alive_at_once(client, args, prefix, count, bound, routes, created):
    """Create ``count`` job networks (all alive), then tear them down in the same order. Returns the timings."""
    create_t, teardown_t = [], []
    for i in range(count):
        job = '%s%d' % (prefix, i)
        created.append(jn.network_name(job))
        s = time.monotonic()
        jn.create_job_network(client, job, proxy_name=args.proxy, pool=args.pool, routes=routes, shard_bound=bound)
        create_t.append(time.monotonic() - s)
        if (i + 1) % 100 == 0:
            print('  %d created, last 100 median %.1f ms' % (i + 1, statistics.median(create_t[-100:]) * 1000),
                  flush=True)
    alive = sum(1 for n in client.api.networks() if n['Name'].startswith('pi-job-' + prefix))
    family = [(m.name, m.load) for m in jn.proxy_family(client, args.proxy)]
    for i in range(count):
        s = time.monotonic()
        jn.teardown_job_network(client, '%s%d' % (prefix, i), proxy_name=args.proxy)
        teardown_t.append(time.monotonic() - s)
    return create_t, teardown_t, alive, family


def pct(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered))) - 1))]


def block_table(label, create_t, teardown_t, size=100):
    """Print p50/p90 per block of ``size`` jobs; return the ratios p50(last block) / p50(first block)."""
    print('%s, per block of %d jobs (ms):' % (label, size))
    print('  %-11s %9s %9s %11s %11s' % ('jobs', 'create p50', 'p90', 'teardown p50', 'p90'))
    blocks = [(i, create_t[i:i + size], teardown_t[i:i + size]) for i in range(0, len(create_t), size)]
    for start, c, t in blocks:
        row = (start + 1, start + len(c), statistics.median(c) * 1000, pct(c, 0.9) * 1000,
               statistics.median(t) * 1000, pct(t, 0.9) * 1000)
        print('  %5d-%-5d %9.0f %9.0f %11.0f %11.0f' % row)
    first, last = blocks[0], blocks[-1]
    return (statistics.median(last[1]) / statistics.median(first[1]),
            statistics.median(last[2]) / statistics.median(first[2]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--count', type=int, default=500, help='job networks alive at once (default 500)')
    ap.add_argument('--proxy', default=jn.PROXY_NAME, help='running container to attach (default %(default)s)')
    ap.add_argument('--raw-count', type=int, default=50, help='jobs for the raw-SDK comparison (default 50)')
    ap.add_argument('--sweep-count', type=int, default=200, help='leftovers for the sweep comparison (default 200)')
    ap.add_argument('--pool', default=jn.DEFAULT_POOL)
    ap.add_argument('--shard-bound', type=int, default=jn.DEFAULT_SHARD_BOUND,
                    help='job networks per proxy container in the sharded layout (default %(default)s)')
    ap.add_argument('--single-count', type=int, default=300,
                    help='job networks for the single-proxy layout beside it (0: skip; default 300: beyond that '
                         'one attach takes seconds)')
    args = ap.parse_args()
    if args.count < 1 or args.count > jn.pool_capacity(args.pool):
        ap.error('--count must be 1..%d (the pool holds that many /29s)' % jn.pool_capacity(args.pool))

    client = docker.from_env(timeout=120)
    if jn.preflight(client, proxy_name=args.proxy).verdict != jn.ADMIT:
        ap.error('--proxy %s is not a running container on this daemon' % args.proxy)
    if os.environ.get('DOCKER_HOST', 'unix:///var/run/docker.sock') == 'unix:///var/run/docker.sock':
        ipt = iptables_variant()
        where = '%s (Docker programs its rules with it: docs/job-networks.md, "The host\'s iptables")' % (
            ipt['version'] or ipt['why'])
    else:
        where = 'iptables not read: DOCKER_HOST names a daemon this host\'s iptables may not be'
    print('Docker Engine %s; %s' % (client.version().get('Version'), where), flush=True)
    prefix = 'bench5-%d-' % os.getpid()
    created = []
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    routes = jn.read_host_routes()
    try:
        # 1+2: our API, all alive at once: the sharded layout, then the single proxy beside it
        layouts = [('shards (bound %d)' % args.shard_bound, args.count, args.shard_bound)]
        if args.single_count:
            layouts.append(('single proxy', args.single_count, 0))
        ratios = []
        for label, count, bound in layouts:
            tag = 's%d-' % bound
            create_t, teardown_t, alive, family = alive_at_once(client, args, prefix + tag, count, bound, routes,
                                                                created)
            loads = [load for _name, load in family]
            print('%s: %d job networks alive at once; the family at the peak: the proxy and %d shard(s), '
                  '%d to %d job networks each' % (label, alive, len(family) - 1, min(loads), max(loads)))
            ratios.append((label, block_table(label, create_t, teardown_t)))
        for label, (create_ratio, teardown_ratio) in ratios:
            print('ratio p50(last block) / p50(first block), %s: create+attach %.2f, teardown %.2f' % (
                label, create_ratio, teardown_ratio))
        if not args.raw_count and not args.sweep_count:
            return 0

        # 3: raw SDK calls for the same work (explicit /29s from the same pool)
        raw_c, raw_t, api_c, api_t = [], [], [], []
        for i in range(args.raw_count):
            name = 'pi-job-%sraw%d-net' % (prefix, i)
            created.append(name)
            subnet = jn_pool.allocate_subnet(args.pool, 29, [])
            s = time.monotonic()
            net_id = client.api.create_network(name, driver='bridge', internal=True,
                                               ipam=IPAMConfig(pool_configs=[IPAMPool(subnet=str(subnet))]))['Id']
            client.api.connect_container_to_network(args.proxy, net_id)
            raw_c.append(time.monotonic() - s)
            s = time.monotonic()
            client.api.disconnect_container_from_network(args.proxy, net_id, force=True)
            client.api.remove_network(net_id)
            raw_t.append(time.monotonic() - s)
            job = '%sapi%d' % (prefix, i)
            created.append(jn.network_name(job))
            s = time.monotonic()
            jn.create_job_network(client, job, proxy_name=args.proxy, pool=args.pool, routes=routes,
                                  shard_bound=0)
            api_c.append(time.monotonic() - s)
            s = time.monotonic()
            jn.teardown_job_network(client, job, proxy_name=args.proxy)
            api_t.append(time.monotonic() - s)

        # 4: the sweep against sequential raw removals
        for i in range(args.sweep_count):
            job = '%sgc%d' % (prefix, i)
            created.append(jn.network_name(job))
            jn.create_job_network(client, job, proxy_name=args.proxy, pool=args.pool, routes=routes,
                                  shard_bound=0)
        s = time.monotonic()
        swept = jn.sweep(client, min_age=0, proxy_name=args.proxy, id_prefix=prefix + 'gc')
        sweep_s = time.monotonic() - s
        ids = []
        for i in range(args.sweep_count):
            job = '%sgr%d' % (prefix, i)
            created.append(jn.network_name(job))
            ids.append(jn.create_job_network(client, job, proxy_name=args.proxy, pool=args.pool,
                                             routes=routes, shard_bound=0).network_id)
        s = time.monotonic()
        for net_id in ids:
            client.api.disconnect_container_from_network(args.proxy, net_id, force=True)
            client.api.remove_network(net_id)
        raw_sweep_s = time.monotonic() - s

        print('per job, %d interleaved pairs with no other job network alive:' % args.raw_count)
        print('  raw SDK create+attach %s' % fmt(raw_c))
        print('  our API create+attach %s' % fmt(api_c))
        print('  raw SDK detach+remove %s' % fmt(raw_t))
        print('  our API detach+remove %s' % fmt(api_t))
        if raw_c and raw_t:
            print('  overhead ratio (median ours / median raw): create %.2f, teardown %.2f, whole job %.2f' % (
                statistics.median(api_c) / statistics.median(raw_c),
                statistics.median(api_t) / statistics.median(raw_t),
                (statistics.median(api_c) + statistics.median(api_t))
                / (statistics.median(raw_c) + statistics.median(raw_t))))
        print('sweep of %d leftover proxy-only networks: %.2f s (removed %d, kept %d, failed %d); '
              '%d sequential raw disconnect+remove: %.2f s; ratio %.2f' % (
                  args.sweep_count, sweep_s, len(swept['removed']), len(swept['kept']), len(swept['failed']),
                  args.sweep_count, raw_sweep_s, sweep_s / raw_sweep_s if raw_sweep_s else float('nan')))
        return 0
    except Interrupted as exc:
        print('interrupted (%s); cleaning up' % exc)
        return 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        left = cleanup(client, created, prefix, args.proxy)
        for member in jn.proxy_family(client, args.proxy):
            if member.is_shard and not member.load:
                client.api.remove_container(member.name, force=True)
        print('cleanup: %s' % ('nothing left' if not left else '%d network(s) could not be removed' % left))


if __name__ == '__main__':
    sys.exit(main())
