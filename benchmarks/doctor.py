"""Benchmark the doctor: its wall time against the time of its single slowest probe.

    python3 benchmarks/doctor.py --proxy pi-dispatch-egress-proxy --deploy-dir /opt/pi-dispatch/egress \\
        --probe-image pi-dispatch-egress-tools:test --provider api.provider.test --deny denied.test --runs 5

Runs ``_doctor.Doctor.run()`` (proxy lines, sweep, the canary's three probes,
three probes per declared model endpoint and the two isolation peers with their
two job networks, all concurrently, then teardown; the checks that need no
canary fact beside it, at most 4 at a time) --runs times against a
running proxy and prints, per run and as a median, the doctor's wall time, the
slowest probe container's time and the ratio. The probes run concurrently, so
the ratio should stay close to 1 (run one after another they would take the
sum, which is printed too). The provider and deny hosts have no
default on purpose: on a machine without internet give .test names that a
fake upstream on the proxy's upstream network serves (tests/integration/conftest.py
builds such a world). Asserts nothing; everything the doctor creates it removes.
"""

import argparse
import statistics
import sys
import time

import _collection  # noqa: E402  (benchmarks/_collection.py, beside this file)

ROOT = _collection.ROOT


def _import_doctor():
    _collection.expose()
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import doctor as _doctor
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as _docker_client
    return _doctor, _docker_client


doctor_mod, dc = _import_doctor()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--proxy', default='pi-dispatch-egress-proxy')
    ap.add_argument('--deploy-dir', default='/opt/pi-dispatch/egress')
    ap.add_argument('--probe-image', required=True)
    ap.add_argument('--provider', required=True, help='provider host (a .test name without internet)')
    ap.add_argument('--deny', required=True, help='unlisted host that answers (a .test name without internet)')
    ap.add_argument('--listed', default=None, help='listed host for the plain probe (default: --provider)')
    ap.add_argument('--timeout', type=int, default=10, help='curl seconds per probe (default 10)')
    ap.add_argument('--runs', type=int, default=5)
    ap.add_argument('--no-isolation', action='store_true', help='skip the job-to-job isolation check')
    ap.add_argument('--no-mirror', action='store_true', help='skip the squid mirror check (an --internal upstream)')
    args = ap.parse_args()

    client = dc.connect(None, 60)
    rows = []
    for run in range(1, args.runs + 1):
        options = doctor_mod.DoctorOptions(args.proxy, args.deploy_dir, args.probe_image, provider_host=args.provider,
                                           deny_host=args.deny, listed_host=args.listed, probe_timeout=args.timeout,
                                           isolation=not args.no_isolation, squid_candidate=not args.no_mirror)
        doc = doctor_mod.Doctor(client, options)
        started = time.monotonic()
        lines = doc.run()
        wall = time.monotonic() - started
        # timings: one key per probe container, check.<name> per group of checks (issue 43), squid, total
        probes = dict((key, value) for key, value in doc.timings.items()
                      if key not in ('total', 'squid') and not key.startswith('check.'))
        checks = dict((key[len('check.'):], value) for key, value in doc.timings.items() if key.startswith('check.'))
        if not probes:
            print('run %d: no probe ran:' % run)
            print(doctor_mod.render_report(lines))
            return 1
        slowest = max(probes.values())
        counts = doctor_mod.summary(lines)
        rows.append((wall, slowest, sum(probes.values())))
        print('run %d: doctor %.2fs, slowest probe %.2fs (%s), ratio %.2f; probes %s; checks %s; %s' % (
            run, wall, slowest, max(probes, key=probes.get), wall / slowest,
            ', '.join('%s %.2fs' % item for item in sorted(probes.items())),
            ', '.join('%s %.2fs' % item for item in sorted(checks.items(), key=lambda kv: -kv[1]) if item[1] >= 0.05),
            ', '.join('%s=%d' % item for item in sorted(counts.items()))))
    wall = statistics.median(r[0] for r in rows)
    slowest = statistics.median(r[1] for r in rows)
    serial = statistics.median(r[2] for r in rows)
    print('median over %d runs: doctor %.2fs, slowest probe %.2fs, ratio %.2f '
          '(the probes one after another would take %.2fs, ratio %.2f)'
          % (len(rows), wall, slowest, wall / slowest, serial, serial / slowest))
    return 0


if __name__ == '__main__':
    sys.exit(main())
