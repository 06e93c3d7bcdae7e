"""The long run of the property tests of the parsers that see untrusted bytes (issue 42).

    python3 benchmarks/fuzz.py [--examples 20000] [--files tests/unit/repo/test_interceptor_properties.py ...]

Every test run runs them bounded (the ``ci`` profile of tests/unit/conftest.py: 150 examples each, seconds);
this runs the same tests under the ``fuzz`` profile with --examples examples per test, and prints per file the
tests run, the examples asked per test, the seconds and the examples per second, then pytest's own verdict. A
failure prints the smallest failing example hypothesis found. Touches no daemon; sends nothing anywhere.
"""

import argparse
import glob
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_FILES = sorted(set(glob.glob(os.path.join(ROOT, 'tests', 'unit', '**', 'test_*propert*.py'), recursive=True)
                           + glob.glob(os.path.join(ROOT, 'tests', 'unit', '**', 'test_*fuzz*.py'), recursive=True)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--examples', type=int, default=20000)
    parser.add_argument('--files', nargs='*', default=DEFAULT_FILES)
    args = parser.parse_args()
    env = dict(os.environ, PI_EGRESS_HYPOTHESIS_PROFILE='fuzz', PI_EGRESS_FUZZ_EXAMPLES=str(args.examples))
    failed = 0
    print('%-62s %6s %9s %9s %12s' % ('file', 'tests', 'examples', 'seconds', 'examples/s'))
    for path in args.files:
        start = time.monotonic()
        proc = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', path], cwd=ROOT,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
        seconds = time.monotonic() - start
        tests = proc.stdout.count('PASSED') or sum(int(w) for w in _counts(proc.stdout))
        print('%-62s %6d %9d %9.1f %12.0f' % (os.path.relpath(path, ROOT), tests, args.examples, seconds,
                                              tests * args.examples / seconds if seconds else 0))
        if proc.returncode != 0:
            failed += 1
            print(proc.stdout[-6000:])
    print('%d file(s), %d failed' % (len(args.files), failed))
    return 1 if failed else 0


def _counts(output):
    for line in output.splitlines()[-3:]:
        for word, nxt in zip(line.split(), line.split()[1:]):
            if nxt.rstrip(',') in ('passed', 'failed') and word.isdigit():
                yield int(word)


if __name__ == '__main__':
    sys.exit(main())
