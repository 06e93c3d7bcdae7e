"""Wall time of upgrade.yml across a fleet against one host (issue 14).

    python3 benchmarks/fleet_upgrade.py --hosts 3 --runs 2

Builds a test fleet (tests/integration/fleet.py: hosts with their own Docker Engine, reached over
SSH; every network --internal), deploys it with site.yml, then times, --runs times each:

- ``one host``: upgrade.yml limited to the first host;
- ``fleet serial=1``: upgrade.yml over every host, one per batch (the default rollout);
- ``fleet serial=N``: upgrade.yml over every host in one batch.

Every run refreshes the rules from a staged file with a new marker line, so each host does the
same work every time: a backup, the refresh, a proxy restart, the health wait. Prints the wall
times and the ratios fleet / one host; asserts nothing. The fleet (containers
``pi-bench-fleet-*`` and their network) is removed at the end, also on Ctrl-C.
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, 'tests', 'integration'))

import docker  # noqa: E402

import fleet as fleetlib  # noqa: E402

RULES = '/opt/pi-dispatch/egress/deploy/egress-proxy.conf'
STAGED = '/root/staged-egress-proxy.conf'


def ansible_env():
    env = dict(os.environ)
    env.update(ANSIBLE_NOCOLOR='1', ANSIBLE_LOCALHOST_WARNING='false',
               ANSIBLE_STDOUT_CALLBACK='ansible.builtin.default')
    return env


def stage(fleet, packaged, marker):
    for name in fleet.names:
        rc, out = fleet.exec(name, ['sh', '-c', 'cat > "$0"', STAGED], stdin=packaged + '# bench %s\n' % marker)
        if rc != 0:
            raise SystemExit('staging the rules on %s failed: %s' % (name, out))


def timed_upgrade(fleet, env, serial, limit=None):
    start = time.perf_counter()
    rc, out, _recap = fleetlib.run_playbook(ROOT, fleet.inventory, 'playbooks/upgrade.yml', dict(
        egress_hosts='egress', egress_upgrade_serial=serial, egress_upgrade_max_fail_percentage=0,
        egress_upgrade_refresh_rules=True, egress_upgrade_rules_source=STAGED,
        egress_proxy_install_debootstrap=False), env, limit=limit)
    seconds = time.perf_counter() - start
    if rc != 0:
        raise SystemExit('upgrade.yml failed (rc=%s):\n%s' % (rc, out[-4000:]))
    return seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--hosts', type=int, default=3)
    ap.add_argument('--runs', type=int, default=2)
    args = ap.parse_args()
    if not 2 <= args.hosts <= 6 or not 1 <= args.runs <= 5:
        ap.error('--hosts must be 2..6 and --runs 1..5 (each run restarts a proxy per host)')
    client = docker.from_env(timeout=600)
    run_dir = tempfile.mkdtemp(prefix='pi-bench-fleet-')
    names = ['engine-%s' % chr(ord('a') + i) for i in range(args.hosts)]
    fleet = fleetlib.Fleet(client, run_dir, names, prefix='pi-bench-fleet')
    env = ansible_env()
    try:
        print('building a fleet of %d hosts (own dockerd each, SSH) ...' % args.hosts, flush=True)
        start = time.perf_counter()
        fleet.start()
        rc, out, _recap = fleetlib.run_playbook(ROOT, fleet.inventory, 'playbooks/site.yml', fleetlib.site_vars(), env)
        if rc != 0:
            raise SystemExit('site.yml failed (rc=%s):\n%s' % (rc, out[-4000:]))
        print('fleet built and deployed in %.1f s' % (time.perf_counter() - start))
        packaged = fleet.exec(names[0], ['cat', RULES])[1]
        times = dict(one=[], serial1=[], serialN=[])
        marker = 0
        for _run in range(args.runs):
            for key, serial, limit in (('one', 1, names[0]), ('serial1', 1, None), ('serialN', args.hosts, None)):
                marker += 1
                stage(fleet, packaged, marker)
                times[key].append(timed_upgrade(fleet, env, serial, limit))
                print('  %-16s %6.1f s' % (key, times[key][-1]), flush=True)
        one = statistics.median(times['one'])
        print()
        print('upgrade.yml wall time (median of %d runs, %d hosts)' % (args.runs, args.hosts))
        print('  one host                 %6.1f s' % one)
        for key, label in (('serial1', 'fleet, serial=1'), ('serialN', 'fleet, serial=%d' % args.hosts)):
            value = statistics.median(times[key])
            print('  %-24s %6.1f s   ratio to one host %.2f   per host %.1f s'
                  % (label, value, value / one, value / args.hosts))
    finally:
        fleet.remove()
        shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == '__main__':
    main()
