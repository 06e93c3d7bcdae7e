"""Benchmark a bound host (TLS terminated by the credential interceptor, the placeholder swapped) against an
unbound one (spliced by squid, never terminated), through the same proxy, from the same job.

    python3 benchmarks/credentials.py --rounds 20 --download-mb 8

Builds the credential world of tests/integration/credentials_world.py (site.yml with two credentials bound
to a fake provider; the images from tests/images/build.yml must be on the daemon), creates one job network
with ``credentials_dir`` and runs one job container that measures, alternating bound and unbound in every
round so a drift of the machine falls on both alike:

* ``new connection``: a fresh CONNECT through squid, the TLS handshake and one small request answered
  (on the bound host: the key header carries the job's placeholder, swapped for the secret);
* ``download``: one request for ``--download-mb`` MiB on a fresh connection, as MiB/s;
* ``one connection``: ``--keepalive`` requests (16 KiB answers) one after the other on one kept-alive
  connection, as requests per second (what a handshake costs no longer counts: the interceptor's work per
  request does).

Prints p50 and p90 of each (p50 and p10 for rates) and the ratios bound / unbound of the p50s.
Asserts nothing. Everything it made is removed at the end, also on Ctrl-C.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile

import _collection  # noqa: E402  (benchmarks/_collection.py, beside this file)

# Runs in the job container: the proxy variables and the key come from its environment, as a job's would.
# TLS is not verified here (the unbound host's certificate is the fake provider's test CA's), so both sides
# pay the same client work.
JOB = r'''
import json, os, socket, ssl, sys, time
rounds, size, KEEPALIVE = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
proxy = os.environ["HTTPS_PROXY"].split("//")[1].rstrip("/")
phost, pport = proxy.rsplit(":", 1)
key = os.environ["ANTHROPIC_API_KEY"]
ctx = ssl._create_unverified_context()

def fetch(host, path):
    t0 = time.perf_counter()
    s = socket.create_connection((phost, int(pport)), timeout=30)
    s.sendall(("CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\n\r\n" % (host, host)).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    t = ctx.wrap_socket(s, server_hostname=host)
    t.sendall(("GET %s HTTP/1.1\r\nHost: %s\r\nx-api-key: %s\r\nConnection: close\r\n\r\n"
               % (path, host, key)).encode())
    got = 0
    while True:
        chunk = t.recv(262144)
        if not chunk:
            break
        got += len(chunk)
    return time.perf_counter() - t0, got

def keepalive(host, count):
    """``count`` small requests one after the other on one kept-alive connection: requests per second."""
    s = socket.create_connection((phost, int(pport)), timeout=30)
    s.sendall(("CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\n\r\n" % (host, host)).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    t = ctx.wrap_socket(s, server_hostname=host)
    # /bytes/16384, not /bench: the fake provider writes a small answer's head and body apart without
    # TCP_NODELAY, so on a kept-alive connection every small answer waits ~40 ms for a delayed ACK (on both
    # sides alike, measured direct too); 16 KiB fill whole segments and never wait.
    request = ("GET /bytes/16384 HTTP/1.1\r\nHost: %s\r\nx-api-key: %s\r\n\r\n" % (host, key)).encode()
    buf = b""
    t0 = time.perf_counter()
    for _ in range(count):
        t.sendall(request)
        while b"\r\n\r\n" not in buf:
            buf += t.recv(65536)
        head, _sep, buf = buf.partition(b"\r\n\r\n")
        length = [int(l.split(b":", 1)[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")]
        if not head.startswith(b"HTTP/1.1 200") or len(length) != 1:
            raise SystemExit("%s: %r" % (host, head.split(b"\r\n")[0]))
        while len(buf) < length[0]:
            buf += t.recv(65536)
        buf = buf[length[0]:]
    seconds = time.perf_counter() - t0
    t.close()
    return count / seconds

out = dict(bound=dict(connect=[], download=[], keepalive=[]), unbound=dict(connect=[], download=[], keepalive=[]))
hosts = dict(bound="api.provider.test", unbound="unbound.provider.test")
for i in range(rounds):
    for side in (("bound", "unbound") if i % 2 == 0 else ("unbound", "bound")):
        out[side]["connect"].append(fetch(hosts[side], "/bench")[0])
        out[side]["keepalive"].append(keepalive(hosts[side], KEEPALIVE))
        seconds, got = fetch(hosts[side], "/bytes/%d" % size)
        if got < size:
            raise SystemExit("%s: %d of %d bytes" % (side, got, size))
        out[side]["download"].append(size / 1048576.0 / seconds)
print(json.dumps(out))
'''


def _pct(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n', maxsplit=1)[0])
    ap.add_argument('--rounds', type=int, default=20)
    ap.add_argument('--download-mb', type=int, default=8)
    ap.add_argument('--keepalive', type=int, default=50, help='requests per round on one kept-alive connection')
    args = ap.parse_args()
    _collection.expose()
    sys.path.insert(0, os.path.join(_collection.ROOT, 'tests', 'integration'))
    import docker
    import credentials_world as world_mod
    from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as jn

    client = docker.from_env(timeout=120)
    job_id = 'bench28-%d' % os.getpid()
    world = world_mod.build(client, tempfile.mkdtemp(prefix='pi-egress-bench28-'))
    try:
        net = jn.create_job_network(client, job_id, proxy_name=world_mod.PROXY, routes=[],
                                    credentials_dir=world.deploy_dir, shard_bound=0)
        out = client.containers.run(
            world_mod.TOOLS_IMAGE,
            ['python3', '-c', JOB, str(args.rounds), str(args.download_mb * 1048576), str(args.keepalive)],
            name=net.container, network=net.network, environment=net.env, labels=world_mod.LABEL, remove=True)
        times = json.loads(out.decode().strip().splitlines()[-1])
    finally:
        try:
            client.api.remove_container(jn.container_name(job_id), force=True)
        except Exception:
            pass
        try:
            jn.teardown_job_network(client, job_id, proxy_name=world_mod.PROXY, credentials_dir=world.deploy_dir)
        except Exception as exc:
            print('cleanup of %s: %s' % (job_id, exc), file=sys.stderr)
        world_mod.cleanup(client)
    print('%d rounds, interleaved; bound = terminated and swapped by the interceptor, unbound = spliced'
          % args.rounds)
    print('%-26s %-20s %-20s %s' % ('', 'bound (p50 / p90)', 'unbound (p50 / p90)', 'bound / unbound (p50)'))
    b, u = times['bound']['connect'], times['unbound']['connect']
    print('%-26s %.4f / %.4f      %.4f / %.4f      %.2f' % (
        'new connection, seconds', statistics.median(b), _pct(b, 0.9), statistics.median(u), _pct(u, 0.9),
        statistics.median(b) / statistics.median(u)))
    b, u = times['bound']['download'], times['unbound']['download']
    print('%-26s %.1f / %.1f          %.1f / %.1f          %.2f' % (
        'download %d MiB, MiB/s' % args.download_mb, statistics.median(b), _pct(b, 0.1), statistics.median(u),
        _pct(u, 0.1), statistics.median(b) / statistics.median(u)))
    b, u = times['bound']['keepalive'], times['unbound']['keepalive']
    print('%-26s %.1f / %.1f          %.1f / %.1f          %.2f' % (
        '%d on one connection, req/s' % args.keepalive, statistics.median(b), _pct(b, 0.1), statistics.median(u),
        _pct(u, 0.1), statistics.median(b) / statistics.median(u)))


if __name__ == '__main__':
    main()
