"""Where the cost of one job-network attach goes as job networks grow (issue 15).

    python3 benchmarks/attach_phases.py --checkpoints 0,100,200,300 --samples 5

Starts a stand-in proxy (a container of --image that only sleeps, like the proxy it holds one
network namespace) and a control container of the same image, then fills the daemon with
``--internal`` networks, each attached to the stand-in proxy. At every checkpoint it times
--samples fresh attaches, phase by phase:

- ``create``: the daemon-side ``docker network create --internal`` (IPAM, bridge, iptables
  isolation rules);
- ``connect``: ``docker network connect`` into the loaded proxy's namespace (veth, address,
  routes, the container's /etc/hosts and resolv.conf rewritten, DNS);
- ``connect_ctl``: the same connect into the control container, which holds no other job
  network: what the global state (networks and rules on the daemon) costs without the load of
  one namespace carrying every network;
- ``inspect``: one inspect of the loaded proxy (what every job start reads);
- ``disconnect`` and ``remove``: the teardown;

and it reads the state that could explain a growth: the lines of ``iptables-save``, the
seconds ``iptables-save`` takes, the seconds one ``iptables -C`` check takes (the daemon runs
several per network create), the bytes of the proxy's /etc/hosts, the number of interfaces in its
namespace.

``--per-container K`` lays the networks out the way proxy shards do: the filler networks go to
load containers holding at most K each, and the loaded proxy is held at K/2 networks (a typical
shard), so what grows with the networks on the daemon is seen apart from what grows with one
namespace.

No traffic is sent anywhere. Prints figures; asserts nothing. Everything it made carries the
name prefix ``pi-bench-phase-<pid>`` and is removed at the end, also on Ctrl-C.
"""

import argparse
import ipaddress
import os
import signal
import statistics
import subprocess
import sys
import time

import docker
from docker.types import IPAMConfig, IPAMPool


class Interrupted(Exception):
    pass


def _on_signal(signum, _frame):
    raise Interrupted('signal %d' % signum)


def timed(call):
    start = time.perf_counter()
    value = call()
    return time.perf_counter() - start, value


def iptables_state():
    start = time.perf_counter()
    out = subprocess.run(['iptables-save'], capture_output=True, text=True, timeout=60, check=True).stdout
    save_s = time.perf_counter() - start
    checks = []
    for _check in range(5):  # the kind of call the daemon makes for every rule it programs
        start = time.perf_counter()
        subprocess.run(['iptables', '--wait', '-t', 'filter', '-C', 'FORWARD', '-j', 'DOCKER-USER'],
                       capture_output=True, timeout=60, check=False)
        checks.append(time.perf_counter() - start)
    return len(out.splitlines()), save_s, statistics.median(checks)


def iptables_backend():
    out = subprocess.run(['iptables', '--version'], capture_output=True, text=True, timeout=60,
                         check=False).stdout.strip()
    return out or 'unknown'


class Bench(object):
    def __init__(self, client, image, pool):
        self.client = client
        self.image = image
        self.prefix = 'pi-bench-phase-%d' % os.getpid()
        self.subnets = ipaddress.ip_network(pool).subnets(new_prefix=29)
        self.networks = []
        self.containers = []

    def start(self, name):
        # On an internal network of its own first: a container in network mode "none" cannot be connected.
        home = self.network('home-%s' % name)
        container = self.client.containers.run(self.image, ['sleep', '3600'], name='%s-%s' % (self.prefix, name),
                                               detach=True, network=home.name, labels={'pi-bench': 'phase'})
        self.containers.append(container)
        return container

    def network(self, index):
        subnet = str(next(self.subnets))
        net = self.client.networks.create(
            '%s-%s-net' % (self.prefix, index), driver='bridge', internal=True, check_duplicate=True,
            ipam=IPAMConfig(pool_configs=[IPAMPool(subnet=subnet)]), labels={'pi-bench': 'phase'})
        self.networks.append(net)
        return net

    def cleanup(self):
        for container in self.containers:
            try:
                container.remove(force=True)
            except Exception:  # best effort: the final pass below lists by name
                pass
        for net in self.networks:
            try:
                net.remove()
            except Exception:
                pass
        for net in self.client.networks.list(filters={'label': 'pi-bench=phase'}):
            if net.name.startswith(self.prefix):
                try:
                    net.remove()
                except Exception:
                    pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
    ap.add_argument('--checkpoints', default='0,100,200,300')
    ap.add_argument('--samples', type=int, default=5)
    ap.add_argument('--image', default='pi-dispatch-egress-tools:test')
    ap.add_argument('--pool', default='10.213.0.0/16', help='where the benchmark networks take their /29s')
    ap.add_argument('--per-container', type=int, default=0,
                    help='spread the networks over containers holding at most this many each (shards); the '
                         'loaded proxy holds half of it (default 0: the one proxy holds every network)')
    args = ap.parse_args()
    checkpoints = sorted(int(n) for n in args.checkpoints.split(','))
    if args.samples < 1 or args.samples > 50 or checkpoints[-1] > 2000 or args.per_container < 0:
        sys.exit('--samples 1..50, checkpoints up to 2000, --per-container 0 or more')
    print('%s; %s' % (iptables_backend(), 'the loaded proxy holds every network' if not args.per_container else
                      'networks spread %d per container, the loaded proxy holds %d'
                      % (args.per_container, args.per_container // 2)))
    signal.signal(signal.SIGTERM, _on_signal)
    client = docker.from_env(timeout=120)
    bench = Bench(client, args.image, args.pool)
    rows = []
    try:
        proxy = bench.start('proxy')
        control = bench.start('control')
        loaded = 0
        holders = []  # (container, networks it holds) for --per-container
        if args.per_container:
            for _half in range(args.per_container // 2):
                bench.network(loaded).connect(proxy)
                loaded += 1
        for checkpoint in checkpoints:
            while loaded < checkpoint:
                if args.per_container:
                    if not holders or holders[-1][1] >= args.per_container:
                        holders.append([bench.start('load%d' % len(holders)), 0])
                    bench.network(loaded).connect(holders[-1][0])
                    holders[-1][1] += 1
                else:
                    bench.network(loaded).connect(proxy)
                loaded += 1
            phases = dict(create=[], connect=[], connect_ctl=[], inspect=[], disconnect=[], remove=[])
            for sample in range(args.samples):
                t, net = timed(lambda i=sample: bench.network(100000 + checkpoint * 100 + i))
                phases['create'].append(t)
                phases['connect'].append(timed(lambda n=net: n.connect(proxy))[0])
                phases['inspect'].append(timed(lambda: client.api.inspect_container(proxy.id))[0])
                phases['disconnect'].append(timed(lambda n=net: n.disconnect(proxy))[0])
                phases['connect_ctl'].append(timed(lambda n=net: n.connect(control))[0])
                net.disconnect(control)
                phases['remove'].append(timed(net.remove)[0])
                bench.networks.remove(net)
            rules, save_s, check_s = iptables_state()
            rc, hosts = proxy.exec_run(['cat', '/etc/hosts'])
            rc2, links = proxy.exec_run(['sh', '-c', 'ls /sys/class/net | wc -l'])
            row = dict(networks=max(checkpoint, loaded), rules=rules, save_ms=save_s * 1000, check_ms=check_s * 1000,
                       hosts_bytes=len(hosts or b''),
                       interfaces=int((links or b'0').strip() or 0))
            for key, values in phases.items():
                row[key] = statistics.median(values) * 1000
            rows.append(row)
            print('at %4d networks: create %6.0f ms  connect %6.0f ms  connect_ctl %6.0f ms  inspect %5.1f ms  '
                  'disconnect %6.0f ms  remove %6.0f ms | iptables-save %5d lines %5.0f ms, iptables -C %4.0f ms | '
                  'proxy /etc/hosts %6d B, %4d interfaces' % (
                      row['networks'], row['create'], row['connect'], row['connect_ctl'], row['inspect'],
                      row['disconnect'], row['remove'], rules, row['save_ms'], row['check_ms'], row['hosts_bytes'],
                      row['interfaces']), flush=True)
    except (KeyboardInterrupt, Interrupted) as exc:
        print('interrupted (%s); cleaning up' % exc)
    finally:
        bench.cleanup()
    if len(rows) >= 2:
        first, last = rows[0], rows[-1]
        print('\nratio at %d networks against %d (median of %d samples):'
              % (last['networks'], first['networks'], args.samples))
        for key in ('create', 'connect', 'connect_ctl', 'inspect', 'disconnect', 'remove', 'check_ms'):
            ratio = last[key] / max(first[key], 1e-6)
            print('  %-12s %6.0f ms -> %6.0f ms  x%.2f' % (key, first[key], last[key], ratio))


if __name__ == '__main__':
    main()
