"""Benchmark the bytes of many tunnels at once: ours (the TLS name check) / a plain squid / direct.

    python3 benchmarks/tunnels.py [--tunnels 64] [--mib 8] [--runs 3] [--rounds 200]
                                  [--image pi-dispatch-egress-proxy:latest] [--peek-conf LABEL=FILE ...]
                                  [--rules-file LABEL=FILE ...]

Builds a small world of its own on this machine's engine (names carry this process's pid): an
``--internal`` network, a bulk TLS server of the test tools image answering as ``bulk.test`` (a
forking Python server: ``GET /<n>`` is answered with ``n`` bytes, each connection in its own process),
a client, and two proxies from the same proxy image: ``ours``, the packaged rules (version 3: every
tunnel to 443 through the TLS name check, the second squid of the image on 127.0.0.1:3129), and
``plain``, the same rules without the cache_peer block (a plain squid on the same base: squid tunnels
directly, as before the check). ``--peek-conf LABEL=FILE`` adds a proxy ``LABEL`` with the packaged
rules whose TLS name check reads FILE instead of the image's peek.conf (mounted over
/etc/squid/peek.conf), to measure a change of the check before building an image with it;
``--rules-file LABEL=FILE`` adds a proxy ``LABEL`` whose squid reads FILE instead of the packaged rules
(the same allowlist ``bulk.test``, guard and endpoints includes), to measure another arrangement.

Bulk: each run starts ``--tunnels`` curl processes at once on each path (the paths in turn, their
order reversed every other run, so drift falls on all alike); each opens a CONNECT tunnel (none for
``direct``), a TLS session inside it with ``bulk.test`` and downloads ``--mib`` MiB. The rate is all the
bytes over the wall time of the batch. Prints each run's MB/s, the medians and the ratios ours / plain
and ours / direct (issue 43's goal: ours / plain >= 0.95).

New connections (``--rounds``, 0 to skip): the same world, one new connection per request through
each proxy, interleaved (CONNECT, TLS handshake with the SNI, GET, first bytes of the answer): p50 and
p90 in ms and the ratio to ``plain`` (goal: <= 1.10). benchmarks/tls_check.py measures the same
against the fake upstream.

Bounded: at most 256 tunnels of at most 64 MiB, 10 runs and 2000 rounds; every curl gives up after
120 s and every batch after 300 s. Asserts nothing; removes everything it made, also on Ctrl-C.
Traffic stays on the internal network (``.test`` names, nothing leaves the machine).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import _collection  # noqa: E402  (benchmarks/_collection.py, beside this file)

_collection.expose()
import docker  # noqa: E402

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import endpoints as _endpoints  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import guard as _guard  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import rules as _rules  # noqa: E402

TOOLS_IMAGE = 'pi-dispatch-egress-tools:test'
HOST = 'bulk.test'
PEEK_CONF = '/etc/squid/peek.conf'

# The bulk server: TLS on 443 with a certificate made at start; each connection in a forked process (its
# own interpreter, so 64 sessions encrypt on every core), answering GET /<n> with n bytes.
SERVER = r'''
import os, socket, ssl, subprocess
os.makedirs('/tmp/bulk', exist_ok=True)
subprocess.run(['openssl', 'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '2', '-subj', '/CN=bulk.test',
                '-keyout', '/tmp/bulk/key.pem', '-out', '/tmp/bulk/cert.pem'], check=True,
               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain('/tmp/bulk/cert.pem', '/tmp/bulk/key.pem')
block = memoryview(os.urandom(262144))
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(('', 443))
srv.listen(512)


def serve(conn):
    conn.settimeout(120)
    tls = ctx.wrap_socket(conn, server_side=True)
    head = b''
    while b'\r\n\r\n' not in head and len(head) < 8192:
        data = tls.recv(4096)
        if not data:
            return
        head += data
    target = head.split(b' ')[1] if head.count(b' ') >= 2 else b'/'
    left = int(target.strip(b'/')) if target.strip(b'/').isdigit() else 0
    tls.sendall(b'HTTP/1.0 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n' % left)
    while left:
        n = min(left, len(block))
        tls.sendall(block[:n])
        left -= n
    tls.close()


print('ready', flush=True)
while True:
    conn, _peer = srv.accept()
    if os.fork() == 0:
        srv.close()
        try:
            serve(conn)
        except Exception:
            pass
        os._exit(0)
    conn.close()
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
'''

# Bulk: argv tunnels, bytes, runs, then the paths (a proxy's name, or "direct").
BULK = r'''
import json, subprocess, sys, time
tunnels, size, runs = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
paths = sys.argv[4:]
rates = dict((p, []) for p in paths)
for run in range(runs):
    for path in (paths if run % 2 == 0 else list(reversed(paths))):
        cmd = ['curl', '-sk', '--max-time', '120', '-o', '/dev/null', '-w', '%{http_code} %{size_download}']
        if path != 'direct':
            cmd += ['-x', 'http://%s:3128' % path]
        cmd.append('https://bulk.test/%d' % size)
        start = time.perf_counter()
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE) for _ in range(tunnels)]
        got = 0
        for proc in procs:
            out, _err = proc.communicate(timeout=max(1, 300 - (time.perf_counter() - start)))
            words = out.decode().split()
            if proc.returncode != 0 or words[:1] != ['200'] or int(words[1]) != size:
                sys.exit('a tunnel through %s failed: curl exit %s, %r' % (path, proc.returncode, out))
            got += int(words[1])
        rates[path].append(got / (time.perf_counter() - start) / 1e6)
print(json.dumps(rates))
'''

# New connections: argv rounds, then the proxies.
CONNECT = r'''
import json, socket, ssl, sys, time
rounds = int(sys.argv[1]); proxies = sys.argv[2:]
times = dict((p, []) for p in proxies)
ctx = ssl._create_unverified_context()
for i in range(rounds):
    for proxy in (proxies if i % 2 == 0 else list(reversed(proxies))):
        start = time.perf_counter()
        s = socket.create_connection((proxy, 3128), timeout=10)
        s.sendall(b"CONNECT bulk.test:443 HTTP/1.1\r\nHost: bulk.test:443\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            data = s.recv(1)
            if not data:
                sys.exit("%s closed the tunnel: %r" % (proxy, head))
            head += data
        if not head.startswith(b"HTTP/1.1 200"):
            sys.exit("%s answered %r" % (proxy, head))
        t = ctx.wrap_socket(s, server_hostname="bulk.test")
        t.sendall(b"GET /0 HTTP/1.0\r\nHost: bulk.test\r\n\r\n")
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


def bounded(value, low, high, what):
    if not low <= value <= high:
        sys.exit('%s must be between %d and %d, not %d' % (what, low, high, value))
    return value


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--tunnels', type=int, default=64)
    parser.add_argument('--mib', type=int, default=8)
    parser.add_argument('--runs', type=int, default=3)
    parser.add_argument('--rounds', type=int, default=200, help='new connections through each proxy; 0 skips')
    parser.add_argument('--image', default='pi-dispatch-egress-proxy:latest')
    parser.add_argument('--peek-conf', action='append', default=[], metavar='LABEL=FILE',
                        help='also measure the packaged rules with FILE as the TLS name check\'s peek.conf')
    parser.add_argument('--rules-file', action='append', default=[], metavar='LABEL=FILE',
                        help='also measure a proxy whose squid reads FILE instead of the packaged rules')
    args = parser.parse_args()
    bounded(args.tunnels, 1, 256, '--tunnels')
    bounded(args.mib, 1, 64, '--mib')
    bounded(args.runs, 1, 10, '--runs')
    bounded(args.rounds, 0, 2000, '--rounds')
    variants = []
    for option, kind, specs in (('--peek-conf', 'peek', args.peek_conf), ('--rules-file', 'rules', args.rules_file)):
        for spec in specs:
            label, sep, path = spec.partition('=')
            if (not sep or not label.replace('-', '').isalnum()
                    or label in ['ours', 'plain', 'direct'] + [v[0] for v in variants]):
                sys.exit('%s %r: give LABEL=FILE with a LABEL of letters, digits and dashes, other than ours, '
                         'plain, direct and the other labels' % (option, spec))
            if not os.path.isfile(path):
                sys.exit('%s %s: %s is not a file' % (option, label, path))
            variants.append((label, kind, os.path.abspath(path)))

    client = docker.from_env(timeout=120)
    api = client.api
    tag = 'pi-egress-bench-tunnels-%d' % os.getpid()
    folder = tempfile.mkdtemp(prefix=tag + '-')
    os.chmod(folder, 0o755)
    made = []
    net = client.networks.create(tag, driver='bridge', internal=True)
    try:
        net.reload()
        subnet = net.attrs['IPAM']['Config'][0]['Subnet']
        files = {
            'allowlist': HOST + '\n',
            'guard': _guard.render(opened=[_guard.ipaddress.ip_network(subnet)]),
            'endpoints': _endpoints.render_include([]),
            'ours': _rules.packaged_rules(),
            'plain': without_check(_rules.packaged_rules()),
        }
        for index, (label, kind, path) in enumerate(variants):
            with open(path) as handle:
                files['%s-%d' % (kind, index)] = handle.read()
        for name, text in files.items():
            with open(os.path.join(folder, name), 'w') as handle:
                handle.write(text)
            os.chmod(os.path.join(folder, name), 0o644)

        def start(image, command, name, aliases=(), binds=None, tmpfs=None):
            made_id = api.create_container(
                image, command, name=name,
                host_config=api.create_host_config(network_mode=tag, binds=binds or {}, tmpfs=tmpfs or {}),
                networking_config=api.create_networking_config({tag: api.create_endpoint_config(
                    aliases=list(aliases))}))['Id']
            made.append(made_id)
            api.start(made_id)
            return made_id

        server = start(TOOLS_IMAGE, ['python3', '-c', SERVER], tag + '-bulk', aliases=[HOST])
        proxies = []
        paths = [('ours', 'ours', None), ('plain', 'plain', None)]
        for i, (label, kind, _path) in enumerate(variants):
            paths.append((label, 'ours', 'peek-%d' % i) if kind == 'peek' else (label, 'rules-%d' % i, None))
        for label, rules, peek in paths:
            binds = {os.path.join(folder, rules): {'bind': _rules.CONTAINER_RULES, 'mode': 'ro'},
                     os.path.join(folder, 'allowlist'): {'bind': _rules.CONTAINER_ALLOWLIST, 'mode': 'ro'},
                     os.path.join(folder, 'guard'): {'bind': _rules.CONTAINER_GUARD, 'mode': 'ro'},
                     os.path.join(folder, 'endpoints'): {'bind': _rules.CONTAINER_ENDPOINTS, 'mode': 'ro'}}
            if peek:
                binds[os.path.join(folder, peek)] = {'bind': PEEK_CONF, 'mode': 'ro'}
            name = '%s-%s' % (tag, label)
            start(args.image, ['squid', '-N', '-f', _rules.CONTAINER_RULES], name, binds=binds,
                  tmpfs={'/run/squid': 'uid=13,gid=13', '/tmp': ''})
            proxies.append((label, name))
        runner = client.containers.get(start(TOOLS_IMAGE, ['sleep', '1800'], tag + '-client'))
        deadline = time.monotonic() + 30
        while 'ready' not in api.logs(server).decode('utf-8', 'replace'):
            if time.monotonic() > deadline:
                sys.exit('the bulk server did not start: %s' % api.logs(server).decode('utf-8', 'replace')[-2000:])
            time.sleep(0.2)
        time.sleep(2)  # squid (and the check) start
        names = [name for _label, name in proxies]
        rc, out = runner.exec_run(['python3', '-c', CONNECT, '3'] + names)  # warm up every proxy
        if rc != 0:
            sys.exit('the warm-up failed: %s' % out.decode('utf-8', 'replace')[-2000:])
        times = None
        if args.rounds:
            rc, out = runner.exec_run(['python3', '-c', CONNECT, str(args.rounds)] + names)
            if rc != 0:
                sys.exit('the new connections failed: %s' % out.decode('utf-8', 'replace')[-2000:])
            times = json.loads(out.decode().strip().splitlines()[-1])
        rc, out = runner.exec_run(['python3', '-c', BULK, str(args.tunnels), str(args.mib * 1048576),
                                   str(args.runs)] + names + ['direct'])
        if rc != 0:
            sys.exit('the bulk measure failed: %s' % out.decode('utf-8', 'replace')[-2000:])
        rates = json.loads(out.decode().strip().splitlines()[-1])
    finally:
        for made_id in made:
            try:
                api.remove_container(made_id, force=True)
            except docker.errors.APIError:
                pass
        net.remove()

    engine = client.version()
    print('engine: Docker %s; image %s; %d CPUs' % (engine.get('Version'), args.image, os.cpu_count() or 0))
    labels = dict((name, label) for label, name in proxies)
    labels['direct'] = 'direct'
    plain = statistics.median(rates[proxies[1][1]])
    direct = statistics.median(rates['direct'])
    print('%d tunnels x %d MiB at once, %d runs (TLS inside every tunnel)' % (args.tunnels, args.mib, args.runs))
    print('%-10s %12s %10s %10s   %s' % ('path', 'median MB/s', '/ plain', '/ direct', 'each run'))
    for name in [n for _l, n in proxies] + ['direct']:
        median = statistics.median(rates[name])
        runs = ' '.join('%.0f' % r for r in rates[name])
        print('%-10s %12.1f %10.2f %10.2f   %s' % (labels[name], median, median / plain, median / direct, runs))
    if times:
        base = times[proxies[1][1]]
        print('%d new connections through each proxy, interleaved' % args.rounds)
        print('%-10s %10s %10s %10s %10s' % ('path', 'p50 ms', 'p90 ms', 'p50/plain', 'p90/plain'))
        for label, name in proxies:
            values = times[name]
            print('%-10s %10.2f %10.2f %10.2f %10.2f' % (
                label, pct(values, 0.5) * 1000, pct(values, 0.9) * 1000,
                pct(values, 0.5) / pct(base, 0.5), pct(values, 0.9) / pct(base, 0.9)))


if __name__ == '__main__':
    main()
