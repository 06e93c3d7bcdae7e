"""Racing dispatchers on the real engine (issue 24): twenty processes create at once, twenty tear down at
once, and a creator killed mid-way leaves nothing that gc.yml does not collect.

Each worker is its own process with its own Docker client (tests/integration/jobnet_worker.py), all
released at the same moment, the way dispatcher processes on one host call the job-network API. The
proxy is the session's (site.yml, fake upstream, --internal upstream network). Every job network,
shard and worker is removed in the ``finally``; every worker is bounded in time.
"""

import ipaddress
import math
import os
import signal
import subprocess
import sys

import pytest

docker = pytest.importorskip('docker')

import jobnet_worker  # noqa: E402
from conftest import run_playbook  # noqa: E402
from test_shards import _remove_jobs_and_shards as _cleanup  # noqa: E402

from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as jn  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import shards as _shards  # noqa: E402

PID = os.getpid()
CREATORS = 20
BOUND = 5


def _family_loads(client, proxy):
    return [(m.name, m.load) for m in jn.proxy_family(client, proxy)]


@pytest.fixture(scope='module')
def twenty(egress_env, tmp_path_factory):
    """Twenty job networks made by twenty processes at once, with a bound of 5 per proxy member."""
    client, proxy = egress_env.client, egress_env.proxy
    family = jn.proxy_family(client, proxy)
    assert [m.name for m in family] == [proxy], 'a shard is left from an earlier test: %s' % family
    before = family[0].load
    jobs = ['it24-%d-%02d' % (PID, i) for i in range(CREATORS)]
    folder = str(tmp_path_factory.mktemp('crowd'))
    try:
        results = jobnet_worker.crowd('create', jobs, proxy, BOUND, folder)
        yield dict(client=client, proxy=proxy, jobs=jobs, results=results, before=before, folder=folder)
    finally:
        _cleanup(client, proxy, jobs)


def test_twenty_creators_at_once_all_succeed(twenty):
    client, proxy, results = twenty['client'], twenty['proxy'], twenty['results']
    failed = [r for r in results if not r['ok']]
    assert failed == [], 'creators failed: %s' % failed
    subnets = [r['subnet'] for r in results]
    assert len(set(subnets)) == CREATORS, 'a subnet was handed out twice: %s' % sorted(subnets)
    pool = ipaddress.ip_network(jn.DEFAULT_POOL)
    assert all(ipaddress.ip_network(s).subnet_of(pool) for s in subnets)
    # every network carries exactly one member of the proxy family, the one the creator was told
    for result in results:
        attrs = client.api.inspect_network(result['network'])
        assert attrs['Internal'] is True
        assert _shards.family_on(attrs, proxy) == [result['proxy']], result
    # no member over its bound, and shards only where the members before them were full
    loads = _family_loads(client, proxy)
    assert all(load <= BOUND for _name, load in loads), loads
    expected_members = int(math.ceil((twenty['before'] + CREATORS) / float(BOUND)))
    assert len(loads) == expected_members, loads
    assert all(load == BOUND for _name, load in loads[:-1]), loads
    assert sum(load for _name, load in loads) == twenty['before'] + CREATORS


def test_twenty_teardowns_at_once_all_succeed(twenty):
    client, proxy, jobs = twenty['client'], twenty['proxy'], twenty['jobs']
    results = jobnet_worker.crowd('teardown', jobs, proxy, BOUND, twenty['folder'])
    failed = [r for r in results if not r['ok']]
    assert failed == [], 'teardowns failed: %s' % failed
    assert all('remove %s' % jn.network_name(job) in r['actions'] for job, r in zip(jobs, results))
    for job in jobs:
        assert jn.inspect_job_network(client, jn.network_name(job)) is None
    # every shard carried only these jobs, so every one went with its last job
    assert _family_loads(client, proxy) == [(proxy, twenty['before'])]


def test_a_creator_killed_mid_way_leaves_nothing_after_gc(egress_env, tmp_path):
    client, proxy = egress_env.client, egress_env.proxy
    assert [m.name for m in jn.proxy_family(client, proxy)] == [proxy]
    load = jn.proxy_family(client, proxy)[0].load
    first = 'it24k-%d-a' % PID
    killed = 'it24k-%d-b' % PID
    after = 'it24k-%d-c' % PID
    jobs = [first, killed, after]
    env = dict(os.environ, PYTHONPATH=jobnet_worker.collections_base())
    go = str(tmp_path / 'go')
    proc = None
    try:
        # the proxy full at a bound of load + 1, so the next create must start a shard
        assert jn.create_job_network(client, first, proxy_name=proxy, shard_bound=load + 1).proxy == proxy
        proc = subprocess.Popen([sys.executable, jobnet_worker.__file__, 'create-and-hang', killed, proxy,
                                 str(load + 1), go], stdout=subprocess.PIPE, env=env)
        assert proc.stdout.readline() == b'ready\n'
        open(go, 'w').close()
        assert proc.stdout.readline() == b'hanging\n'     # inside the lock: network made, shard started
        assert jn.inspect_job_network(client, jn.network_name(killed)) is not None
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        # the dead holder left the lock free: the next create goes through at once
        net = jn.create_job_network(client, after, proxy_name=proxy, shard_bound=0)
        assert net.proxy == proxy
        jn.teardown_job_network(client, after, proxy_name=proxy)
        leftovers = [m.name for m in jn.proxy_family(client, proxy) if m.is_shard]
        assert leftovers == [_shards.shard_name(proxy, 1)], 'the killed creator left no shard to collect?'
        rc, out, _recap = run_playbook('playbooks/gc.yml', {
            'egress_proxy_name': proxy, 'gc_min_age': 0, 'gc_id_prefix': 'it24k-%d-b' % PID})
        assert rc == 0, out[-4000:]
        assert jn.inspect_job_network(client, jn.network_name(killed)) is None, out[-4000:]
        assert [m.name for m in jn.proxy_family(client, proxy)] == [proxy], out[-4000:]
        assert jn.inspect_job_network(client, jn.network_name(first)) is not None   # a live job is kept
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        _cleanup(client, proxy, jobs)
