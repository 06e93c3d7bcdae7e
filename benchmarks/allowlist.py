"""Benchmark allowlist validation: 1,000 / 10,000 / 100,000 entries through _allowlist.parse.

    python3 benchmarks/allowlist.py [--sizes 1000,10000,100000] [--repeat 3]

The file is realistic: exact hosts and leading-dot domains under a few hundred registrable domains
(so the Public Suffix List lookup and the coverage check both do real work), some IPv4 literals,
comments and blank lines; about half the entries lie under a listed leading-dot domain and about
1 % are TEST-NET addresses, both warned. Prints, per size, the best of
--repeat runs in seconds, the entries per second, and the ratio of time per entry to the smallest
size's (1.00 means linear). Asserts nothing; touches no daemon.
"""

import argparse
import time

import _collection  # noqa: E402  (benchmarks/_collection.py, beside this file)

ROOT = _collection.ROOT


def _import():
    _collection.expose()
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import allowlist as _allowlist
    return _allowlist


allowlist = _import()
TLDS = ('com', 'org', 'net', 'io', 'dev', 'co.uk', 'de', 'test')


def make(size):
    lines = ['# a generated allowlist of %d entries' % size, '']
    domains = max(10, size // 50)
    for i in range(size):
        domain = 'site%d.%s' % (i % domains, TLDS[i % len(TLDS)])
        if i < domains:
            lines.append('.%s' % domain if i % 2 else 'api.%s' % domain)
        elif i % 100 == 0:
            lines.append('www%d.%s' % (i, 'site1.%s' % TLDS[1]))       # covered by .site1.org
        elif i % 97 == 0:
            lines.append('198.51.%d.%d' % (i // 256 % 256, i % 256))   # TEST-NET-2: warned by the guard check
        else:
            lines.append('h%d.%s  # entry %d' % (i, domain, i))
    return '\n'.join(lines) + '\n'


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--sizes', default='1000,10000,100000')
    parser.add_argument('--repeat', type=int, default=3)
    args = parser.parse_args()
    sizes = [int(x) for x in args.sizes.split(',')]
    allowlist.parse('warm.example.com\n10.0.0.1\n')   # the Public Suffix List and the guard load once
    rows = []
    for size in sizes:
        text = make(size)
        best = None
        for _run in range(args.repeat):
            started = time.perf_counter()
            result = allowlist.parse(text)
            spent = time.perf_counter() - started
            best = spent if best is None else min(best, spent)
        rows.append((size, best, len(result.entries), len(result.warnings), len(result.errors)))
    header = ('entries', 'seconds', 'entries/s', 'per-entry', 'valid', 'warned', 'refused')
    print('%-10s %10s %12s %10s %10s %8s %8s' % header)
    base = rows[0][1] / rows[0][0]
    for size, spent, valid, warned, refused in rows:
        print('%-10d %10.3f %12.0f %10.2f %10d %8d %8d' % (size, spent, size / spent, (spent / size) / base, valid,
                                                           warned, refused))


if __name__ == '__main__':
    main()
