"""Benchmark the decision log's reader: read, filter, count and replay 10,000 / 100,000 / 300,000 lines.

    python3 benchmarks/decisions.py [--sizes 10000,100000,300000] [--repeat 3]

The folder holds what a busy proxy writes (docs/decisions.md): two files per container, rotated, one
JSON line per decision in the image's format, across 200 jobs and 2,000 hosts, a third of them refused.
300,000 lines is about what one container keeps with the defaults (10m x 6 files, two squids). Prints,
per size, the best of --repeat runs of each step in seconds, the lines per second of the whole, and the
ratio of time per line to the smallest size's (1.00 means linear). Asserts nothing; touches no daemon.
"""

import argparse
import json
import os
import shutil
import tempfile
import time

import _collection  # noqa: E402  (benchmarks/_collection.py, beside this file)


def _import():
    _collection.expose()
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import decisions as _decisions
    return _decisions


decisions = _import()
REASONS = [('allowed', 'sni_ok'), ('allowed', 'listed'), ('refused', 'unlisted'), ('allowed', 'sni_ok'),
           ('refused', 'port'), ('allowed', 'endpoint')]


def write(folder, size):
    per_file = max(1, size // 6)
    start = 1796500000
    written = 0
    for index in range(6):
        kind = 'decisions' if index % 2 else 'tls-decisions'
        name = 'pi-dispatch-egress-proxy.%s.jsonl%s' % (kind, '' if index < 2 else '.%d' % (index // 2))
        with open(os.path.join(folder, name), 'w') as handle:
            for i in range(per_file):
                n = written + i
                verdict, reason = REASONS[n % len(REASONS)]
                handle.write(json.dumps(dict(
                    time=time.strftime('%Y-%m-%dT%H:%M:%S.000Z', time.gmtime(start + n)), proxy='p', check='tls',
                    job='job-%d' % (n % 200), network='pi-job-job-%d-net' % (n % 200), client='10.47.0.2',
                    method='CONNECT' if reason != 'listed' else 'GET', host='h%d.example.test' % (n % 2000),
                    port=443 if reason != 'listed' else 80, sni=None, verdict=verdict, reason=reason, status=200,
                    squid_status='TCP_TUNNEL', bytes_from_client=100, bytes_to_client=2000, duration_ms=5),
                    separators=(',', ':')) + '\n')
        written += per_file
    return written


def best(fn, repeat):
    times = []
    for _attempt in range(repeat):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return min(times), result


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--sizes', default='10000,100000,300000')
    ap.add_argument('--repeat', type=int, default=3)
    args = ap.parse_args()
    current = ['.example.test']
    candidate = ['h%d.example.test' % i for i in range(1000)]   # drops half the hosts
    print('%-8s %8s %8s %8s %8s %10s %9s %14s' % ('lines', 'read', 'select', 'count', 'replay', 'lines/s',
                                                  'per-line', 'newly refused'))
    base = None
    for size in [int(s) for s in args.sizes.split(',')]:
        folder = tempfile.mkdtemp(prefix='pi-egress-bench-decisions-')
        try:
            lines = write(folder, size)
            t_read, (records, _p, _w) = best(lambda: decisions.read_records(folder), args.repeat)
            t_select, picked = best(lambda: decisions.select(records, verdict='refused', host='.example.test'),
                                    args.repeat)
            t_count, _summary = best(lambda: decisions.summarize(picked), args.repeat)
            t_replay, replayed = best(lambda: decisions.replay(records, current, candidate), args.repeat)
        finally:
            shutil.rmtree(folder)
        total = t_read + t_select + t_count + t_replay
        per_line = total / lines
        base = base or per_line
        print('%-8d %8.3f %8.3f %8.3f %8.3f %10.0f %9.2f %14d' % (
            lines, t_read, t_select, t_count, t_replay, lines / total, per_line / base,
            len(replayed['newly_refused'])))


if __name__ == '__main__':
    main()
