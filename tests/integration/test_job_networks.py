"""Per-job networks on the real engine: create, isolation, teardown, the sweep, the preflight.

Uses the session fixture ``egress_env`` (tests/integration/conftest.py: a real squid
proxy deployed by site.yml). Job ids start with ``it5-`` and scratch containers with
``h5-`` so nothing here collides with anything else on the daemon. Every container and
network a test creates is removed in its ``finally``; every probe is bounded
(``nc -w``, a few tries at most).

For development without the full world, ``PI_EGRESS_IT_STANDIN=<container>`` uses that
running container as the "proxy" (any attachable container; port from
``PI_EGRESS_IT_STANDIN_PORT``, default 8080) and the local daemon directly.
"""

import os
import time
import types

import pytest

docker = pytest.importorskip('docker')

from conftest import _remove_container, _remove_network, ip_on, serving, tcp_reaches  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as jn  # noqa: E402

TOOLS_IMAGE = 'pi-dispatch-egress-tools:test'
PID = os.getpid()


@pytest.fixture(scope='module')
def world(request):
    standin = os.environ.get('PI_EGRESS_IT_STANDIN')
    if standin:
        client = docker.from_env(timeout=120)
        return types.SimpleNamespace(client=client, proxy=standin, tools_image=TOOLS_IMAGE,
                                     port=int(os.environ.get('PI_EGRESS_IT_STANDIN_PORT', '8080')))
    env = request.getfixturevalue('egress_env')
    return types.SimpleNamespace(client=env.client, proxy=env.proxy, tools_image=env.tools_image, port=3128)


class Scratch:
    """Tracks what a test creates and removes all of it."""

    def __init__(self, client):
        self.client = client
        self.containers = []
        self.jobs = []

    def job_network(self, world, job_id):
        self.jobs.append(job_id)
        return jn.create_job_network(world.client, job_id, proxy_name=world.proxy, proxy_port=world.port)

    def run(self, world, name, network, cmd=('sleep', '300'), start=True):
        self.containers.append(name)
        if start:
            return self.client.containers.run(world.tools_image, list(cmd), name=name, detach=True, network=network)
        return self.client.containers.create(world.tools_image, list(cmd), name=name, network=network)

    def cleanup(self):
        for name in self.containers:
            _remove_container(self.client, name)
        for job_id in self.jobs:
            _remove_network(self.client, jn.network_name(job_id))


@pytest.fixture
def scratch(world):
    s = Scratch(world.client)
    try:
        yield s
    finally:
        s.cleanup()


def test_create_is_internal_labelled_and_proxy_attached(world, scratch):
    job = 'it5-create-%d' % PID
    net = scratch.job_network(world, job)
    attrs = world.client.api.inspect_network(net.network)
    assert attrs['Internal'] is True
    assert attrs['Labels'][jn.LABEL_JOB_ID] == job
    assert jn.LABEL_CREATED in attrs['Labels'] and jn.LABEL_OWNER_HOST in attrs['Labels']
    assert ipaddress_in_pool(net.subnet)
    assert world.proxy in [c['Name'] for c in attrs['Containers'].values()]
    assert net.env['HTTPS_PROXY'] == 'http://%s:%d' % (world.proxy, world.port)
    # Idempotent: a second create changes nothing.
    again = jn.create_job_network(world.client, job, proxy_name=world.proxy, proxy_port=world.port)
    assert again.changed is False and again.subnet == net.subnet
    c = scratch.run(world, 'h5-job-%d' % PID, net.network)
    assert tcp_reaches(c, world.proxy, world.port), 'the job container did not reach the proxy'


def ipaddress_in_pool(subnet):
    import ipaddress
    return ipaddress.ip_network(subnet).subnet_of(ipaddress.ip_network(jn.DEFAULT_POOL))


def test_attach_failure_leaves_nothing(world):
    job = 'it5-noproxy-%d' % PID
    try:
        with pytest.raises(jn.EngineError) as exc:
            jn.create_job_network(world.client, job, proxy_name='h5-no-such-proxy-%d' % PID)
        assert 'nothing is left' in str(exc.value)
        assert jn.inspect_job_network(world.client, jn.network_name(job)) is None
    finally:
        _remove_network(world.client, jn.network_name(job))


def test_two_jobs_cannot_reach_each_other(world, scratch):
    a, b = 'it5-iso-a-%d' % PID, 'it5-iso-b-%d' % PID
    net_a, net_b = scratch.job_network(world, a), scratch.job_network(world, b)
    serve = ('python3', '/usr/local/bin/fake_upstream.py')
    ca = scratch.run(world, 'h5-iso-a-%d' % PID, net_a.network, serve)
    cb = scratch.run(world, 'h5-iso-b-%d' % PID, net_b.network, serve)
    ip_b = ip_on(world.client, cb.name, net_b.network)
    assert serving(cb, 80), 'peer B does not answer itself'
    assert tcp_reaches(ca, world.proxy, world.port) and tcp_reaches(cb, world.proxy, world.port)
    assert not tcp_reaches(ca, cb.name, 80, tries=2), 'A reached B by name'
    assert not tcp_reaches(ca, ip_b, 80, tries=2), 'A reached B by address %s' % ip_b
    assert tcp_reaches(cb, '127.0.0.1', 80), 'peer B stopped answering itself'


def test_teardown_removes_everything(world, scratch):
    job = 'it5-down-%d' % PID
    net = scratch.job_network(world, job)
    c = scratch.run(world, 'h5-down-%d' % PID, net.network)
    with pytest.raises(jn.EngineError):  # a container is still on it: refused, nothing changed
        jn.teardown_job_network(world.client, job, proxy_name=world.proxy)
    assert jn.inspect_job_network(world.client, net.network) is not None
    c.remove(force=True)
    done = jn.teardown_job_network(world.client, job, proxy_name=world.proxy)
    assert done['changed'] and done['actions'] == ['detach %s' % world.proxy, 'remove %s' % net.network]
    assert jn.inspect_job_network(world.client, net.network) is None
    proxy_nets = world.client.api.inspect_container(world.proxy)['NetworkSettings']['Networks']
    assert net.network not in proxy_nets
    assert jn.teardown_job_network(world.client, job, proxy_name=world.proxy)['changed'] is False


def test_sweep_after_a_killed_worker(world, scratch):
    orphan, running, stopped = ('it5-gc-orphan-%d' % PID, 'it5-gc-run-%d' % PID, 'it5-gc-stop-%d' % PID)
    for job in (orphan, running, stopped):
        scratch.job_network(world, job)
    scratch.run(world, jn.container_name(running), jn.network_name(running))
    cs = scratch.run(world, jn.container_name(stopped), jn.network_name(stopped), ('true',))
    cs.wait(timeout=30)
    prefix = 'it5-gc-'

    young = jn.sweep(world.client, min_age=3600, proxy_name=world.proxy, id_prefix=prefix)
    assert young['removed'] == [] and young['failed'] == []
    assert sorted(k['reason'] for k in young['kept']) == ['too-young'] * 3

    planned = jn.sweep(world.client, min_age=0, proxy_name=world.proxy, id_prefix=prefix, check_mode=True)
    assert [r['network'] for r in planned['removed']] == [jn.network_name(orphan)]
    assert jn.inspect_job_network(world.client, jn.network_name(orphan)) is not None  # check mode changed nothing

    time.sleep(1.1)
    result = jn.sweep(world.client, min_age=1, proxy_name=world.proxy, id_prefix=prefix)
    assert [r['network'] for r in result['removed']] == [jn.network_name(orphan)]
    assert result['removed'][0]['detached'] == [world.proxy]
    kept = dict((k['network'], k['reason']) for k in result['kept'])
    assert kept == {jn.network_name(running): 'job-running', jn.network_name(stopped): 'job-stopped'}
    assert result['failed'] == []
    assert jn.inspect_job_network(world.client, jn.network_name(orphan)) is None
    assert jn.inspect_job_network(world.client, jn.network_name(running)) is not None

    # With remove_exited_jobs the finished job's container goes first, then its network.
    again = jn.sweep(world.client, min_age=0, proxy_name=world.proxy, id_prefix=prefix, remove_exited_jobs=True)
    assert [r['network'] for r in again['removed']] == [jn.network_name(stopped)]
    assert again['removed'][0]['removed_containers'] == [jn.container_name(stopped)]
    assert [k['reason'] for k in again['kept']] == ['job-running']


def test_preflight_verdicts(world):
    client = world.client
    assert jn.preflight(client, proxy_name=world.proxy).verdict == jn.ADMIT
    scratch_name = 'h5-pf-%d' % PID
    try:
        c = client.containers.run(world.tools_image, ['sleep', '300'], name=scratch_name, detach=True,
                                  network_mode='none')
        assert jn.preflight(client, proxy_name=scratch_name).verdict == jn.ADMIT
        c.pause()
        v = jn.preflight(client, proxy_name=scratch_name)
        assert (v.verdict, v.state, v.retryable) == (jn.PROXY_STOPPED, 'paused', False)
        c.unpause()
        c.stop(timeout=1)
        v = jn.preflight(client, proxy_name=scratch_name)
        assert (v.verdict, v.state) == (jn.PROXY_STOPPED, 'exited')
    finally:
        _remove_container(client, scratch_name)
    v = jn.preflight(client, proxy_name=scratch_name)
    assert (v.verdict, v.retryable) == (jn.PROXY_MISSING, False)
    v = jn.preflight(jn.lazy_client('unix:///nonexistent.sock', 5), proxy_name=world.proxy)
    assert (v.verdict, v.retryable) == (jn.ENGINE_UNAVAILABLE, True)
    assert jn.preflight(jn.lazy_client('unix:///nonexistent.sock', 5), enabled=False).verdict == jn.ADMIT
