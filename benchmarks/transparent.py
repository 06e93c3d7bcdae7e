"""Benchmark a transparent job against an explicit one: create + attach + the job's first request.

    python3 benchmarks/transparent.py --proxy pi-dispatch-egress-proxy --gateway pi-dispatch-egress-gateway \\
        --url https://api.provider.test/ --rounds 10

Needs a deployed egress layer with the gateway (``egress_gateway_enabled: true``) and a URL the
allowlist covers that answers (any HTTP status counts as an answer). Each round makes one job of
each mode, in alternating order (explicit first in even rounds, transparent first in odd ones), so
a drift of the machine falls on both alike:

* ``create``: ``create_job_network`` (the network, the proxy attach; for a transparent job also the
  gateway attach and its applied file);
* ``first request``: ``docker run --rm`` of the tools image on that network running one curl of
  ``--url`` (the explicit job with the proxy variables, the transparent one with none: its name
  resolves through the gateway);
* ``total``: both.

Then the teardown (not timed). Prints p50 and p90 of each, and the ratios transparent / explicit of
the p50s, then the transparent create in phases: the network and the proxy attach, the gateway attach,
and its configure (the network's file applied: through the gateway's control socket, or, for a gateway
without one, ``put_archive`` + ``docker exec gatewayd apply``; ``via`` says which). Asserts nothing.
Everything it made is removed at the end, also on Ctrl-C.
"""

import argparse
import os
import statistics
import sys
import time

import _collection  # noqa: E402  (benchmarks/_collection.py, beside this file)


def _pct(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def one_job(jn, client, mode, job_id, args):
    t0 = time.perf_counter()
    net = jn.create_job_network(client, job_id, proxy_name=args.proxy, mode=mode, gateway_name=args.gateway,
                                shard_bound=0)
    t1 = time.perf_counter()
    run = dict(network=net.network, environment=net.env, detach=True)
    if mode == jn.TRANSPARENT:
        run.update(dns=[net.dns], cap_drop=['NET_RAW'])
    job = client.containers.run(args.image, ['curl', '-sS', '-k', '-o', '/dev/null', '-w', '%{http_code}',
                                             '--max-time', '20', args.url], name=net.container, **run)
    job.wait(timeout=60)
    t2 = time.perf_counter()
    out = job.logs().decode('utf-8', 'replace')
    job.remove(force=True)
    code = out.strip()[-3:]
    if not code.isdigit() or code == '000':
        raise SystemExit('%s job %s: no answer from %s (%r)' % (mode, job_id, args.url, out))
    jn.teardown_job_network(client, job_id, proxy_name=args.proxy, gateway_name=args.gateway)
    return t1 - t0, t2 - t1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n', maxsplit=1)[0])
    ap.add_argument('--proxy', default='pi-dispatch-egress-proxy')
    ap.add_argument('--gateway', default='pi-dispatch-egress-gateway')
    ap.add_argument('--url', required=True, help='a URL the allowlist covers, which answers')
    ap.add_argument('--image', default='pi-dispatch-egress-tools:test', help='an image with curl')
    ap.add_argument('--rounds', type=int, default=10)
    args = ap.parse_args()
    _collection.expose()
    import docker
    from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as jn

    from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import transparent as tp

    client = docker.from_env(timeout=120)
    phases = dict(attach=[], configure=[])
    via = set()

    def timed(key, fn):
        def wrap(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                phases[key].append(time.perf_counter() - t)
        return wrap
    tp.connect_proxy = timed('attach', tp.connect_proxy)  # in transparent.py: the gateway's attach only
    tp.configure = timed('configure', tp.configure)
    control_socket = tp.control_socket

    def which(c, name):
        path = control_socket(c, name)
        via.add('control socket' if path else 'docker exec')
        return path
    tp.control_socket = which
    times = {jn.EXPLICIT: dict(create=[], request=[], total=[]), jn.TRANSPARENT: dict(create=[], request=[], total=[])}
    made = []
    try:
        for i in range(args.rounds):
            order = [jn.EXPLICIT, jn.TRANSPARENT] if i % 2 == 0 else [jn.TRANSPARENT, jn.EXPLICIT]
            for mode in order:
                job_id = 'bench27-%d-%s-%d' % (os.getpid(), mode[0], i)
                made.append(job_id)
                create, request = one_job(jn, client, mode, job_id, args)
                times[mode]['create'].append(create)
                times[mode]['request'].append(request)
                times[mode]['total'].append(create + request)
    finally:
        for job_id in made:
            try:
                client.api.remove_container(jn.container_name(job_id), force=True)
            except Exception:
                pass
            try:
                jn.teardown_job_network(client, job_id, proxy_name=args.proxy, gateway_name=args.gateway)
            except Exception as exc:
                print('cleanup of %s: %s' % (job_id, exc), file=sys.stderr)
    print('%d rounds, interleaved; seconds (p50 / p90)' % args.rounds)
    print('%-14s %-18s %-18s %s' % ('', 'explicit', 'transparent', 'ratio of p50s'))
    for part, label in (('create', 'create+attach'), ('request', 'first request'), ('total', 'total')):
        e, t = times[jn.EXPLICIT][part], times[jn.TRANSPARENT][part]
        print('%-14s %.3f / %.3f      %.3f / %.3f      %.2f' % (
            label, statistics.median(e), _pct(e, 0.9), statistics.median(t), _pct(t, 0.9),
            statistics.median(t) / statistics.median(e)))
    creates = times[jn.TRANSPARENT]['create']
    rest = [c - a - f for c, a, f in zip(creates, phases['attach'], phases['configure'])]
    print('transparent create in phases (p50 / p90), configure via %s:' % ', '.join(sorted(via)))
    for label, values in (('network + proxy attach + inspect', rest), ('gateway attach', phases['attach']),
                          ('configure (file + apply)', phases['configure'])):
        if values:
            print('  %-34s %.3f / %.3f' % (label, statistics.median(values), _pct(values, 0.9)))


if __name__ == '__main__':
    main()
