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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _import_jobnet():
    parts = ROOT.split(os.sep)
    if parts[-3:-1] == ['ansible_collections', 'pi_dispatch']:
        sys.path.insert(0, os.sep.join(parts[:-3]))
    else:
        import tempfile
        base = tempfile.mkdtemp(prefix='pi-egress-bench-')
        os.makedirs(os.path.join(base, 'ansible_collections', 'pi_dispatch'))
        os.symlink(ROOT, os.path.join(base, 'ansible_collections', 'pi_dispatch', 'egress'))
        sys.path.insert(0, base)
    from ansible_collections.pi_dispatch.egress.plugins.module_utils import _jobnet
    from ansible_collections.pi_dispatch.egress.plugins.module_utils import _jobnet_pool
    return _jobnet, _jobnet_pool


jn, jn_pool = _import_jobnet()  # the published API; the pool's pure allocator (raw SDK baseline) is internal
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--count', type=int, default=500, help='job networks alive at once (default 500)')
    ap.add_argument('--proxy', default=jn.PROXY_NAME, help='running container to attach (default %(default)s)')
    ap.add_argument('--raw-count', type=int, default=50, help='jobs for the raw-SDK comparison (default 50)')
    ap.add_argument('--sweep-count', type=int, default=200, help='leftovers for the sweep comparison (default 200)')
    ap.add_argument('--pool', default=jn.DEFAULT_POOL)
    args = ap.parse_args()
    if args.count < 1 or args.count > jn.pool_capacity(args.pool):
        ap.error('--count must be 1..%d (the pool holds that many /29s)' % jn.pool_capacity(args.pool))

    client = docker.from_env(timeout=120)
    if jn.preflight(client, proxy_name=args.proxy).verdict != jn.ADMIT:
        ap.error('--proxy %s is not a running container on this daemon' % args.proxy)
    prefix = 'bench5-%d-' % os.getpid()
    created = []
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    routes = jn.read_host_routes()
    try:
        # 1+2: our API, all alive at once
        create_t, teardown_t = [], []
        t0 = time.monotonic()
        for i in range(args.count):
            job = '%s%d' % (prefix, i)
            created.append(jn.network_name(job))
            s = time.monotonic()
            jn.create_job_network(client, job, proxy_name=args.proxy, pool=args.pool, routes=routes)
            create_t.append(time.monotonic() - s)
            if (i + 1) % 100 == 0:
                print('  %d created, last 100 median %.1f ms' % (i + 1, statistics.median(create_t[-100:]) * 1000),
                      flush=True)
        alive = sum(1 for n in client.api.networks() if n['Name'].startswith('pi-job-' + prefix))
        attached = sum(1 for n in client.api.inspect_container(args.proxy)['NetworkSettings']['Networks']
                       if n.startswith('pi-job-' + prefix))
        create_total = time.monotonic() - t0
        t0 = time.monotonic()
        for i in range(args.count):
            s = time.monotonic()
            jn.teardown_job_network(client, '%s%d' % (prefix, i), proxy_name=args.proxy)
            teardown_t.append(time.monotonic() - s)
        teardown_total = time.monotonic() - t0
        print('job networks alive at once: %d (proxy attached to %d); Docker default pools: %d networks '
              '-> %.1fx the default capacity; pool %s holds %d' % (
                  alive, attached, DOCKER_DEFAULT_POOL_CAPACITY, alive / DOCKER_DEFAULT_POOL_CAPACITY,
                  args.pool, jn.pool_capacity(args.pool)))
        print('create+attach (our API, %d networks growing to %d): %s; wall %.2f s' % (
            args.count, args.count, fmt(create_t), create_total))
        print('detach+remove (our API, from %d alive): %s; wall %.2f s' % (args.count, fmt(teardown_t),
                                                                           teardown_total), flush=True)

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
            jn.create_job_network(client, job, proxy_name=args.proxy, pool=args.pool, routes=routes)
            api_c.append(time.monotonic() - s)
            s = time.monotonic()
            jn.teardown_job_network(client, job, proxy_name=args.proxy)
            api_t.append(time.monotonic() - s)

        # 4: the sweep against sequential raw removals
        for i in range(args.sweep_count):
            job = '%sgc%d' % (prefix, i)
            created.append(jn.network_name(job))
            jn.create_job_network(client, job, proxy_name=args.proxy, pool=args.pool, routes=routes)
        s = time.monotonic()
        swept = jn.sweep(client, min_age=0, proxy_name=args.proxy, id_prefix=prefix + 'gc')
        sweep_s = time.monotonic() - s
        ids = []
        for i in range(args.sweep_count):
            job = '%sgr%d' % (prefix, i)
            created.append(jn.network_name(job))
            ids.append(jn.create_job_network(client, job, proxy_name=args.proxy, pool=args.pool,
                                             routes=routes).network_id)
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
        print('cleanup: %s' % ('nothing left' if not left else '%d network(s) could not be removed' % left))


if __name__ == '__main__':
    sys.exit(main())
