"""Benchmark the gateway's DNS answer to one transparent job while another job floods it with random names.

    python3 benchmarks/gateway_dns.py --rounds 200 --flood-seconds 20

Builds its own world on the real engine with the helpers of tests/integration/conftest.py (the world
tests/integration/test_transparent.py uses): an ``--internal`` upstream network, a fake DNS server on it
(the gateway's own upstream resolver; it answers NXDOMAIN to every name it is asked), site.yml with the
gateway enabled, a container on the upstream network carrying ``.test`` aliases (names the allowlist's
``.forge.test`` covers, answered by the engine's resolver of that network), and two transparent job
networks made by the job-network API (``project_policy=None``: plain jobs, nothing opted in), each with a
job container whose resolver is the gateway. The images from tests/images/build.yml must be on the daemon.

Job B sends single DNS queries (UDP, type A, no retry, 3 s to answer) and times each answer, ``--rounds``
rounds paced over the flood's length, on two paths: ``gw``, straight to the gateway's address on its network;
``job``, to the nameserver of the job's /etc/resolv.conf (on Docker the engine's resolver, 127.0.0.11 in
the job's namespace, which forwards to the gateway: what the job's libc really asks). Each round and path,
three names:

* ``cached``: ``api.provider.test`` (listed), which the gateway keeps per job network for RESOLVE_TTL (30 s):
  after the first round a cache hit, no lookup thread;
* ``miss``: a covered name that exists and was never asked before (one alias per round, path and phase), so the
  gateway's cache misses and the lookup runs on the thread pool under B's per-job share;
* ``nx``: a random covered name that does not exist (the gateway caches no negative answer): a lookup
  answered NXDOMAIN by the upstream resolver.

First idle, then while job A floods the gateway for ``--flood-seconds`` as fast as one process sends,
alternating random uncovered names (answered NXDOMAIN at once by the gateway) and random covered-looking
names under ``.forge.test`` (each one a lookup). Prints p50 / p90 of each kind idle vs flooded with the
ratio of the p50s, the flood's queries sent and answered, and the gateway's refusal counters for A.
Asserts nothing. Everything it made is removed at the end (also on Ctrl-C), unless ``--keep``.
Nothing leaves the machine: ``.test`` names on ``--internal`` networks, traffic only to the gateway.
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time

import _collection  # noqa: E402  (benchmarks/_collection.py, beside this file)

CACHED = 'api.provider.test'

# Job B: argv = the gateway's address, rounds, seconds between rounds, the 'miss' names (JSON: one list a
# path, one name a round), the 'cached' name. Each round asks the three names on both paths: 'gw' straight
# to the gateway's address, 'job' to the nameserver of the job's /etc/resolv.conf (the engine's resolver in
# the job's namespace, which forwards to the gateway: what the job's libc asks). One JSON line back:
# milliseconds per path and kind (None when no answer within 3 s) and the rcodes seen.
PROBE = r'''
import json, os, random, socket, struct, sys, time
gw, rounds, spacing, misses, cached = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), json.loads(sys.argv[4]), \
    sys.argv[5]
job = [line.split()[1] for line in open("/etc/resolv.conf") if line.startswith("nameserver")][0]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

def ask(server, name):
    qid = random.randrange(65536)
    q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    q += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0" + struct.pack(">HH", 1, 1)
    t0 = time.perf_counter()
    s.sendto(q, (server, 53))
    end = t0 + 3.0
    while True:
        left = end - time.perf_counter()
        if left <= 0:
            return None, "timeout"
        s.settimeout(left)
        try:
            data = s.recv(2048)
        except socket.timeout:
            return None, "timeout"
        if len(data) >= 12 and struct.unpack(">H", data[:2])[0] == qid:
            ms = (time.perf_counter() - t0) * 1000.0
            rcode, an = data[3] & 15, struct.unpack(">H", data[6:8])[0]
            return ms, "noerror/%d" % an if rcode == 0 else "rcode%d" % rcode

out = dict(rcodes={}, resolver=job)
start = time.monotonic()
for i in range(rounds):
    paths = (("gw", gw), ("job", job)) if i % 2 == 0 else (("job", job), ("gw", gw))
    for path, server in paths:
        for kind, name in (("cached", cached), ("miss", misses[path][i]),
                           ("nx", "nx%s.forge.test" % os.urandom(6).hex())):
            ms, rc = ask(server, name)
            key = "%s %s" % (path, kind)
            out.setdefault(key, []).append(ms)
            out["rcodes"]["%s %s" % (key, rc)] = out["rcodes"].get("%s %s" % (key, rc), 0) + 1
    wait = start + (i + 1) * spacing - time.monotonic()
    if wait > 0:
        time.sleep(wait)
print(json.dumps(out))
'''

# Job A: argv = gateway address, seconds, most queries, most per second (0: as fast as it sends). Sends
# random names, alternating uncovered and covered-looking, reads every answer that came back, then waits
# 2 s for the late ones. One JSON line back: queries sent, answers per kind and rcode, seconds sent for.
FLOOD = r'''
import json, os, socket, struct, sys, time
server, seconds, most, rate = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setblocking(False)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
kinds = {}
sent = dict(uncovered=0, covered=0)
got = {}

def drain():
    while True:
        try:
            data = s.recv(2048)
        except (BlockingIOError, InterruptedError):
            return
        if len(data) >= 12:
            qid = struct.unpack(">H", data[:2])[0]
            key = "%s rcode%d" % (kinds.pop(qid, "late"), data[3] & 15)
            got[key] = got.get(key, 0) + 1

start = time.monotonic()
n = 0
while n < most:
    now = time.monotonic()
    if now - start >= seconds:
        break
    if rate and n >= (now - start) * rate:
        time.sleep(0.001)
        drain()
        continue
    kind = "covered" if n % 2 else "uncovered"
    name = "%s.%s" % (os.urandom(8).hex(), "forge.test" if kind == "covered" else "flood-nowhere.test")
    qid = n & 0xFFFF
    q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    q += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0" + struct.pack(">HH", 1, 1)
    try:
        s.sendto(q, (server, 53))
    except (BlockingIOError, InterruptedError):
        drain()
        continue
    kinds[qid] = kind
    sent[kind] += 1
    n += 1
    if n % 64 == 0:
        drain()
took = time.monotonic() - start
end = time.monotonic() + 2.0
while time.monotonic() < end:
    drain()
    time.sleep(0.01)
print(json.dumps(dict(sent=sent, answered=got, seconds=took)))
'''


def _pct(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _last_json(output):
    for line in reversed(output.strip().splitlines()):
        if line.startswith('{'):
            return json.loads(line)
    raise SystemExit('no result from the job:\n%s' % output[-2000:])


def _exec(client, container, argv, timeout):
    rc, out = client.containers.get(container).exec_run(['timeout', str(int(timeout)), *argv])
    out = (out or b'').decode('utf-8', 'replace')
    if rc != 0:
        raise SystemExit('%s exited %s:\n%s' % (container, rc, out[-2000:]))
    return _last_json(out)


def _stats(client, gateway):
    rc, out = client.containers.get(gateway).exec_run(['cat', '/var/lib/pi-gateway/stats.json'])
    try:
        return json.loads(out.decode('utf-8', 'replace')) if rc == 0 else {}
    except ValueError:
        return {}


def _udp53_drops(client, gateway):
    """The gateway's UDP port-53 sockets (local address -> datagrams the kernel dropped on them, from
    /proc/net/udp in the gateway's network namespace) and its namespace's UDP RcvbufErrors."""
    rc, out = client.containers.get(gateway).exec_run(['cat', '/proc/net/udp', '/proc/net/snmp'])
    drops, rcvbuf, head = {}, 0, None
    for line in (out or b'').decode('utf-8', 'replace').splitlines() if rc == 0 else []:
        fields = line.split()
        if len(fields) > 12 and fields[1].endswith(':0035'):
            hexaddr = fields[1].split(':')[0]
            addr = '.'.join(str(int(hexaddr[i:i + 2], 16)) for i in (6, 4, 2, 0))
            drops[addr] = drops.get(addr, 0) + int(fields[-1])
        elif fields[:1] == ['Udp:'] and head is None:
            head = fields
        elif fields[:1] == ['Udp:'] and 'RcvbufErrors' in head:
            rcvbuf = int(fields[head.index('RcvbufErrors')])
    return drops, rcvbuf


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n', maxsplit=1)[0])
    ap.add_argument('--rounds', type=int, default=200, help='rounds of B (three lookups each) per phase')
    ap.add_argument('--flood-seconds', type=float, default=20.0, help="how long A floods (B's rounds fit inside)")
    ap.add_argument('--flood-max', type=int, default=2000000, help='the most queries A sends')
    ap.add_argument('--flood-rate', type=float, default=0.0, help='the most queries A sends per second (0: no cap)')
    ap.add_argument('--keep', action='store_true', help='leave the world running (prints how to remove it)')
    args = ap.parse_args()
    if args.rounds < 1 or args.flood_seconds < 5:
        raise SystemExit('--rounds must be >= 1 and --flood-seconds >= 5')
    os.environ.setdefault('PI_EGRESS_IT_SUFFIX', '-gwdns')
    _collection.expose()
    sys.path.insert(0, os.path.join(_collection.ROOT, 'tests', 'integration'))
    import docker
    import conftest as it
    from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as jn
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import gateway as gw

    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a kill cleans up as Ctrl-C does
    client = docker.from_env(timeout=120)
    tmp = tempfile.mkdtemp(prefix='pi-egress-bench-gwdns-')
    env = it.EgressEnv(client, os.path.join(tmp, 'egress'))
    gateway = 'pi-dispatch-egress-gateway' + it.SUFFIX
    dns = 'pi-egress-fakedns' + it.SUFFIX
    names = 'pi-egress-gwdns-names' + it.SUFFIX
    label = {'io.pi-dispatch.egress.test': 'bench-gateway-dns'}
    jobs = {'a': 'bench-gwdns-a', 'b': 'bench-gwdns-b'}
    misses = dict((phase, dict((path, ['m%d%s%s.forge.test' % (i, phase[0], path[0]) for i in range(args.rounds)])
                               for path in ('gw', 'job'))) for phase in ('idle', 'flood'))
    spacing = (args.flood_seconds - 3.0) / args.rounds
    result = {}
    try:
        for job in jobs.values():  # leftovers of a killed earlier run go first
            it._remove_container(client, jn.container_name(job))
            it._remove_network(client, jn.network_name(job))
        for name in (gateway, dns, names, env.proxy):
            it._remove_container(client, name)
        it._remove_network(client, env.upstream_net)
        env.upstream_subnet = it.create_upstream_network(client, env.upstream_net)
        client.containers.run(it.TOOLS_IMAGE, ['python3', '/usr/local/bin/fake_upstream.py', '--dns'], name=dns,
                              detach=True, network=env.upstream_net, labels=label)
        api = client.api
        made = api.create_container(
            it.TOOLS_IMAGE, ['sleep', 'infinity'], name=names, detach=True, labels=label,
            host_config=api.create_host_config(network_mode=env.upstream_net),
            networking_config=api.create_networking_config({env.upstream_net: api.create_endpoint_config(
                aliases=[CACHED] + [n for phase in misses.values() for names in phase.values() for n in names])}))
        api.start(made['Id'])
        it._wait_fake_ready(client, dns)
        dns_ip = it.ip_on(client, dns, env.upstream_net)
        print('site.yml with the gateway (about a minute) ...', flush=True)
        rc, out, _recap = env.site(egress_gateway_enabled=True, egress_gateway_name=gateway,
                                   egress_gateway_image=gw.GATEWAY_IMAGE, egress_gateway_dns=[dns_ip])
        if rc != 0:
            raise SystemExit('site.yml failed (rc=%s):\n%s' % (rc, out[-4000:]))
        nets = {}
        for key, job in jobs.items():
            net = jn.create_job_network(client, job, proxy_name=env.proxy, mode=jn.TRANSPARENT, project_policy=None,
                                        gateway_name=gateway, deploy_dir=env.deploy_dir)
            client.containers.run(it.TOOLS_IMAGE, ['sleep', '3600'], name=net.container, detach=True, labels=label,
                                  network=net.network, dns=[net.dns], cap_drop=['NET_RAW'])
            nets[key] = net
        probe_timeout = args.flood_seconds + args.rounds * 6 * 3 + 30
        warm_misses = json.dumps(dict(gw=['w1.forge.test'], job=['w2.forge.test']))
        warm = _exec(client, nets['b'].container, ['python3', '-c', PROBE, str(nets['b'].dns), '1', '0',
                                                   warm_misses, CACHED], 30)
        result['warm-up'] = warm['rcodes']

        result['idle'] = _exec(client, nets['b'].container, ['python3', '-c', PROBE, str(nets['b'].dns),
                                                             str(args.rounds), str(spacing),
                                                             json.dumps(misses['idle']), CACHED], probe_timeout)
        before = _stats(client, gateway)
        drops_before = _udp53_drops(client, gateway)
        flood = {}

        def run_flood():
            other = docker.from_env(timeout=120)
            try:
                flood['out'] = _exec(other, nets['a'].container, [
                    'python3', '-c', FLOOD, str(nets['a'].dns), str(args.flood_seconds), str(args.flood_max),
                    str(args.flood_rate)], args.flood_seconds + 30)
            except BaseException as exc:  # reported by the main thread
                flood['error'] = exc

        thread = threading.Thread(target=run_flood, daemon=True)
        thread.start()
        time.sleep(1.0)
        result['flood'] = _exec(client, nets['b'].container, ['python3', '-c', PROBE, str(nets['b'].dns),
                                                              str(args.rounds), str(spacing),
                                                              json.dumps(misses['flood']), CACHED], probe_timeout)
        thread.join(args.flood_seconds + 40)
        if 'error' in flood or 'out' not in flood:
            raise SystemExit('the flood did not finish: %s' % flood.get('error'))
        time.sleep(1.5)  # the gateway writes its counters at most once a second
        after = _stats(client, gateway)
        drops_after = _udp53_drops(client, gateway)
        result['drops'] = (dict((a, n - drops_before[0].get(a, 0)) for a, n in drops_after[0].items()),
                           drops_after[1] - drops_before[1])
        result['flood-job'] = flood['out']
        result['counters'] = dict((k, v - before.get(k, 0)) for k, v in sorted(after.items())
                                  if k.startswith(nets['a'].network + ' ') or k.startswith(nets['b'].network + ' '))
        dns_log = api.logs(dns).decode('utf-8', 'replace')
        result['upstream-queries'] = dns_log.count('dns query ')
    finally:
        if args.keep:
            print('kept: jobs %s, containers %s, network %s, deploy dir %s' % (
                ', '.join(jobs.values()), ', '.join((gateway, dns, names, env.proxy)), env.upstream_net, tmp))
        else:
            for job in jobs.values():
                try:
                    it._remove_container(client, jn.container_name(job))
                    jn.teardown_job_network(client, job, proxy_name=env.proxy, gateway_name=gateway)
                except Exception as exc:
                    print('cleanup of %s: %s' % (job, exc), file=sys.stderr)
                    it._remove_network(client, jn.network_name(job))
            try:
                gw.remove(client, gateway)  # state=absent: the container and its -nets volume
            except Exception as exc:
                print('cleanup of %s: %s' % (gateway, exc), file=sys.stderr)
            for name in (gateway, dns, names, env.proxy):
                it._remove_container(client, name)
            it._remove_network(client, env.upstream_net)
            shutil.rmtree(tmp, ignore_errors=True)
    _report(args, spacing, result)


def _report(args, spacing, result):
    print('%d rounds per phase, one round every %.0f ms; job A floods for %.0f s%s' % (
        args.rounds, spacing * 1000, args.flood_seconds,
        ' at most %.0f/s' % args.flood_rate if args.flood_rate else ' as fast as one process sends'))
    print("job B's DNS answer from the gateway, ms (p50 / p90), idle vs while A floods")
    print("'gw': asked at the gateway's address; 'job': asked at the job's resolv.conf nameserver (%s), "
          "which forwards to it" % result['idle']['resolver'])
    print('%-11s %-20s %-20s %-14s %s' % ('path name', 'idle', 'flooded', 'ratio of p50s', 'no answer (idle/flooded)'))
    for kind in ('gw cached', 'gw miss', 'gw nx', 'job cached', 'job miss', 'job nx'):
        idle = [v for v in result['idle'][kind] if v is not None]
        flood = [v for v in result['flood'][kind] if v is not None]
        lost = (len(result['idle'][kind]) - len(idle), len(result['flood'][kind]) - len(flood))
        if not idle or not flood:
            print('%-11s no answers' % kind)
            continue
        print('%-11s %7.2f / %-10.2f %7.2f / %-10.2f %-14.2f %d / %d' % (
            kind, statistics.median(idle), _pct(idle, 0.9), statistics.median(flood), _pct(flood, 0.9),
            statistics.median(flood) / statistics.median(idle), lost[0], lost[1]))
    print('answers B got: idle %s; flooded %s' % (json.dumps(result['idle']['rcodes'], sort_keys=True),
                                                  json.dumps(result['flood']['rcodes'], sort_keys=True)))
    out = result['flood-job']
    sent = sum(out['sent'].values())
    answered = sum(v for k, v in out['answered'].items())
    print('flood (job A): %d queries sent in %.1f s (%.0f/s; %s), %d answered (%s)' % (
        sent, out['seconds'], sent / max(out['seconds'], 1e-9), json.dumps(out['sent'], sort_keys=True), answered,
        json.dumps(out['answered'], sort_keys=True)))
    print("gateway counters during the flood: %s" % json.dumps(result['counters'], sort_keys=True))
    drops = json.dumps(result['drops'][0], sort_keys=True)
    print("datagrams the kernel dropped on the gateway's port-53 socket(s) during the flood (receive buffer "
          "full): %s; UDP RcvbufErrors in its namespace: %d" % (drops, result['drops'][1]))
    print('queries that reached the fake upstream resolver (whole run): %d' % result['upstream-queries'])


if __name__ == '__main__':
    main()
