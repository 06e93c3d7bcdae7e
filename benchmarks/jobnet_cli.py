"""Benchmark one preflight three ways: the Python API in process, the command line, an Ansible module.

    python3 benchmarks/jobnet_cli.py [--calls 5] [--proxy pi-dispatch-egress-proxy]

Each way asks the local Docker Engine the same one question (inspect the proxy container) ``--calls``
times, one after another:

* ``api``: ``jobnet.preflight(jobnet.lazy_client())`` in this process (what a Python dispatcher pays);
* ``cli``: ``python3 -m ...module_utils.jobnet_cli preflight`` (what a dispatcher in any other
  language pays: one Python start, the imports, the inspect, the JSON);
* ``ansible``: ``ansible localhost -m pi_dispatch.egress.egress_preflight`` (Ansible's start-up, the
  module shipped and run, the same inspect).

Prints the median and the best wall time per call of each, and each one's ratio to the API's median.
The proxy need not exist (a missing one is answered with the same one inspect). Sends no traffic;
asserts nothing. The ``ansible`` row needs the collection installed where ANSIBLE_COLLECTIONS_PATH
points (``./run bootstrap`` does that); without it the row says why and is skipped.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import _collection  # noqa: E402  (benchmarks/_collection.py, beside this file)

BASE = _collection.expose()

from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet  # noqa: E402

MODULE = 'ansible_collections.pi_dispatch.egress.plugins.module_utils.jobnet_cli'


def _time(call, calls):
    times = []
    for _index in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--calls', type=int, default=5)
    parser.add_argument('--proxy', default=jobnet.PROXY_NAME)
    args = parser.parse_args()
    calls = max(1, min(args.calls, 50))  # bounded

    def api():
        verdict = jobnet.preflight(jobnet.lazy_client(), proxy_name=args.proxy)
        assert verdict.verdict != jobnet.ENGINE_UNAVAILABLE, verdict.message

    env = dict(os.environ, PYTHONPATH=BASE)

    def cli():
        out = subprocess.run([sys.executable, '-m', MODULE, '--proxy', args.proxy, 'preflight'], env=env,
                             capture_output=True, text=True, timeout=60, check=False)
        doc = json.loads(out.stdout)
        assert doc['command'] == 'preflight' and doc['exit_code'] in (0, 8), doc

    ansible = shutil.which('ansible')

    def module():
        out = subprocess.run([ansible, 'localhost', '-c', 'local', '-i', 'localhost,', '-m',
                              'pi_dispatch.egress.egress_preflight', '-a', 'proxy_name=%s' % args.proxy],
                             capture_output=True, text=True, timeout=120, check=False)
        assert 'SUCCESS' in out.stdout, out.stdout + out.stderr

    rows = [('api', api), ('cli', cli)]
    if ansible:
        rows.append(('ansible', module))
    results = {}
    for name, call in rows:
        call()  # warm: the first call pays the page cache
        results[name] = _time(call, calls)
    base = statistics.median(results['api'])
    print('preflight of %s, %d calls each (seconds per call)' % (args.proxy, calls))
    print('%-8s %10s %10s %12s' % ('way', 'median', 'best', 'x api'))
    for name, times in results.items():
        median = statistics.median(times)
        print('%-8s %10.4f %10.4f %12.1f' % (name, median, min(times), median / base))
    if not ansible:
        print('ansible: skipped (no ansible on PATH)')
    if 'ansible' in results:
        print('the command line costs %.0f%% of the Ansible module per call'
              % (100.0 * statistics.median(results['cli']) / statistics.median(results['ansible'])))


if __name__ == '__main__':
    main()
