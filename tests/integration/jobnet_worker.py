"""One dispatcher process for the concurrency tests and benchmarks/jobnet_concurrency.py.

    python jobnet_worker.py create|teardown|create-and-hang <job id> <proxy> <shard bound> <go file>

It connects to the local daemon, prints ``ready``, waits (at most 120 s) until ``<go file>`` exists
so that every worker starts its call at the same moment, makes one job-network API call and prints
one JSON line: ``ok``, ``seconds`` (the call alone), and the result or the error with its
``retryable``. ``create-and-hang`` stops inside the create once the new shard it needed has started
(the daemon's lock held, the job's network made and not yet attached), prints ``hanging`` and sleeps
there until it is killed: the creator that dies mid-way.
"""

import json
import os
import sys
import time

import docker

from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as jn
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import shard_clone as _shard_clone


def collections_base():
    """The folder holding ``ansible_collections/`` as this process imported it (the workers' PYTHONPATH)."""
    path = os.path.abspath(jn.__file__)
    for _level in range(6):  # .../ansible_collections/pi_dispatch/egress/plugins/module_utils/jobnet.py
        path = os.path.dirname(path)
    return path


def crowd(mode, jobs, proxy, bound, folder, timeout=300):
    """Run one worker per job, all released at once; returns their JSON results in the jobs' order.

    Every worker is started and has connected before any is released (so the calls really overlap);
    each is bounded by ``timeout`` and killed by its pid when it overruns.
    """
    import subprocess
    go = os.path.join(folder, 'go-%s-%d' % (mode, time.time_ns()))
    env = dict(os.environ, PYTHONPATH=collections_base())
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), mode, job, proxy, str(bound), go],
                              stdout=subprocess.PIPE, env=env) for job in jobs]
    try:
        for proc in procs:
            line = proc.stdout.readline()
            if line != b'ready\n':
                raise RuntimeError('a worker did not start: %r' % line)
        open(go, 'w').close()
        results = []
        for proc in procs:
            out, _err = proc.communicate(timeout=timeout)
            lines = [x for x in out.decode('utf-8', 'replace').splitlines() if x.startswith('{')]
            results.append(json.loads(lines[-1]) if lines else dict(ok=False, error='no result (rc %s)'
                                                                    % proc.returncode))
        return results
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def main():
    mode, job, proxy, bound, go = sys.argv[1:6]
    client = docker.from_env(timeout=120)
    client.ping()
    if mode == 'create-and-hang':
        def hang(*_args, **_kwargs):
            sys.stdout.write('hanging\n')
            sys.stdout.flush()
            time.sleep(300)
        _shard_clone.wait_ready = hang
    sys.stdout.write('ready\n')
    sys.stdout.flush()
    deadline = time.monotonic() + 120
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.005)
    start = time.monotonic()
    try:
        if mode == 'teardown':
            done = jn.teardown_job_network(client, job, proxy_name=proxy)
            out = dict(ok=True, actions=done['actions'])
        else:
            net = jn.create_job_network(client, job, proxy_name=proxy, shard_bound=int(bound))
            out = dict(ok=True, network=net.network, subnet=net.subnet, proxy=net.proxy)
    except Exception as exc:  # reported to the test, which fails on it
        out = dict(ok=False, error='%s: %s' % (type(exc).__name__, exc), retryable=getattr(exc, 'retryable', None))
    out['seconds'] = time.monotonic() - start
    out['job'] = job
    sys.stdout.write(json.dumps(out) + '\n')
    sys.stdout.flush()


if __name__ == '__main__':
    main()
