"""Benchmark the TLS name check: new-connection latency through the proxy with it, and without it.

    python3 benchmarks/tls_check.py [--rounds 200] [--image pi-dispatch-egress-proxy:latest]

Builds a small world of its own on this machine's engine (names carry this process's pid): an
``--internal`` network, the fake upstream (the test tools image) answering as ``api.provider.test``,
a client, and two proxies from the same proxy image, one with the packaged rules (version 3: every
tunnel to 443 through the TLS name check) and one with the same rules without the cache_peer block
(version 2's path: squid tunnels directly). The client opens a new connection per request, CONNECT,
TLS handshake with the SNI, GET, first bytes of the answer, alternating between the two proxies
(interleaved, so drift falls on both alike). Prints p50 and p90 in ms for each and the ratio with /
without. The goal of issue 25 is at most 1.10. Asserts nothing; removes everything it made, also
on Ctrl-C. Traffic stays on the internal network.
"""

import argparse
import json
import os
import sys
import tempfile
import time

import _collection  # noqa: E402  (benchmarks/_collection.py, beside this file)

_collection.expose()
import docker  # noqa: E402

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import endpoints as _endpoints
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import guard as _guard  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import rules as _rules  # noqa: E402

TOOLS_IMAGE = 'pi-dispatch-egress-tools:test'
CLIENT = r'''
import json, socket, ssl, sys, time
rounds = int(sys.argv[1]); proxies = sys.argv[2:]
times = dict((p, []) for p in proxies)
ctx = ssl._create_unverified_context()
for i in range(rounds):
    for proxy in (proxies if i % 2 == 0 else list(reversed(proxies))):
        start = time.perf_counter()
        s = socket.create_connection((proxy, 3128), timeout=10)
        s.sendall(b"CONNECT api.provider.test:443 HTTP/1.1\r\nHost: api.provider.test:443\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            head += s.recv(1)
        t = ctx.wrap_socket(s, server_hostname="api.provider.test")
        t.sendall(b"GET /v1/bench HTTP/1.0\r\nHost: api.provider.test\r\n\r\n")
        t.recv(64)
        times[proxy].append(time.perf_counter() - start)
        t.close()
print(json.dumps(times))
'''


def pct(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def without_check(rules):
    """The packaged rules minus the block that sends tunnels to 443 through the check."""
    keep = []
    for line in rules.splitlines():
        if line.split()[:1] in (['cache_peer'], ['cache_peer_access'], ['never_direct']):
            continue
        keep.append(line)
    return '\n'.join(keep) + '\n'


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--rounds', type=int, default=200)
    parser.add_argument('--image', default='pi-dispatch-egress-proxy:latest')
    args = parser.parse_args()
    client = docker.from_env(timeout=120)
    api = client.api
    tag = 'pi-egress-bench-tls-%d' % os.getpid()
    folder = tempfile.mkdtemp(prefix=tag + '-')
    made = []
    net = client.networks.create(tag, driver='bridge', internal=True)
    try:
        net.reload()
        subnet = net.attrs['IPAM']['Config'][0]['Subnet']
        files = {
            'allowlist': 'api.provider.test\n',
            'guard': _guard.render(opened=[_guard.ipaddress.ip_network(subnet)]),
            'endpoints': _endpoints.render_include([]),
            'with': _rules.packaged_rules(),
            'without': without_check(_rules.packaged_rules()),
        }
        for name, text in files.items():
            with open(os.path.join(folder, name), 'w') as handle:
                handle.write(text)
            os.chmod(os.path.join(folder, name), 0o644)
        fake = api.create_container(
            TOOLS_IMAGE, ['python3', '/usr/local/bin/fake_upstream.py'], name=tag + '-fake',
            host_config=api.create_host_config(network_mode=tag),
            networking_config=api.create_networking_config({tag: api.create_endpoint_config(
                aliases=['api.provider.test'])}))
        made.append(fake['Id'])
        api.start(fake['Id'])
        proxies = []
        for kind in ('with', 'without'):
            name = '%s-%s' % (tag, kind)
            binds = {os.path.join(folder, kind): {'bind': _rules.CONTAINER_RULES, 'mode': 'ro'},
                     os.path.join(folder, 'allowlist'): {'bind': _rules.CONTAINER_ALLOWLIST, 'mode': 'ro'},
                     os.path.join(folder, 'guard'): {'bind': _rules.CONTAINER_GUARD, 'mode': 'ro'},
                     os.path.join(folder, 'endpoints'): {'bind': _rules.CONTAINER_ENDPOINTS, 'mode': 'ro'}}
            proxy = api.create_container(
                args.image, ['squid', '-N', '-f', _rules.CONTAINER_RULES], name=name,
                host_config=api.create_host_config(network_mode=tag, binds=binds,
                                                   tmpfs={'/run/squid': 'uid=13,gid=13', '/tmp': ''}))
            made.append(proxy['Id'])
            api.start(proxy['Id'])
            proxies.append(name)
        probe = api.create_container(TOOLS_IMAGE, ['sleep', '900'], name=tag + '-client',
                                     host_config=api.create_host_config(network_mode=tag))
        made.append(probe['Id'])
        api.start(probe['Id'])
        time.sleep(3)  # squid (and the check) start; the fake upstream binds its ports
        runner = client.containers.get(probe['Id'])
        rc, out = runner.exec_run(['python3', '-c', CLIENT, '3'] + proxies)    # warm up both
        if rc != 0:
            sys.exit('the warm-up failed: %s' % out.decode('utf-8', 'replace')[-2000:])
        rc, out = runner.exec_run(['python3', '-c', CLIENT, str(args.rounds)] + proxies)
        if rc != 0:
            sys.exit('the measurement failed: %s' % out.decode('utf-8', 'replace')[-2000:])
        times = json.loads(out.decode().strip().splitlines()[-1])
    finally:
        for cid in made:
            try:
                api.remove_container(cid, force=True)
            except docker.errors.APIError:
                pass
        net.remove()
    engine = client.version()
    print('engine: Docker %s; image %s; %d new connections through each proxy, interleaved'
          % (engine.get('Version'), args.image, args.rounds))
    print('%-34s %10s %10s' % ('path', 'p50 ms', 'p90 ms'))
    rows = []
    for name, label in ((proxies[0], 'with the TLS name check (rules 3)'),
                        (proxies[1], 'without it (squid tunnels directly)')):
        rows.append((pct(times[name], 0.5) * 1000, pct(times[name], 0.9) * 1000))
        print('%-34s %10.2f %10.2f' % (label, rows[-1][0], rows[-1][1]))
    print('ratio with / without: p50 %.2f, p90 %.2f' % (rows[0][0] / rows[1][0], rows[0][1] / rows[1][1]))


if __name__ == '__main__':
    main()
