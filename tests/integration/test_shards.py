"""Proxy shards on the real engine (issue 15): with a small bound, jobs beyond it land on a shard.

Uses the session world ``egress_env`` (a real squid proxy deployed by site.yml, a fake upstream
under .test names on an --internal upstream network). The bound is set just above what the proxy
already carries, so two job networks go to the proxy and the third to a new shard
``<proxy>-shard-1``. Every job container, job network and shard is removed in the ``finally``;
every probe is bounded (curl --max-time, nc -w, a few tries at most).
"""

import json
import os
import shlex
import time

import pytest

docker = pytest.importorskip('docker')

from conftest import doctor_objects_left, ip_on, serving, tcp_reaches  # noqa: E402

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import files as _files  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as jn  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import reload as _reload  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import shards as _shards  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import shard_clone as _shard_clone  # noqa: E402

PID = os.getpid()


def _curl(container, proxy, url, timeout=10):
    """(rc, connect status, final status) of one bounded curl through ``proxy`` inside ``container``."""
    # stderr dropped: curl's own error text ("response 403") would read as a status
    script = ('curl -sS -k --max-time %d --proxy http://%s:3128 -o /dev/null -w "%%{http_code} %%{http_connect}" '
              '%s 2>/dev/null; echo " rc=$?"' % (timeout, proxy, shlex.quote(url)))
    _rc, out = container.exec_run(['timeout', str(timeout + 5), 'sh', '-c', script])
    words = (out or b'').decode('utf-8', 'replace').split()
    codes = [w for w in words if w.isdigit()]
    rc = [w for w in words if w.startswith('rc=')]
    return (int(rc[-1][3:]) if rc else -1, int(codes[1]) if len(codes) > 1 else 0,
            int(codes[0]) if codes else 0)


def _health_test_passes(client, container):
    """Run the container's own health test now (bounded by its timeout): True when squid answers it."""
    argv = _shard_clone.health_argv(client.api.inspect_container(container)['Config']['Healthcheck']['Test'])
    rc, _out = client.containers.get(container).exec_run(['timeout', '10'] + argv)
    return rc == 0


def _docker_says_healthy(client, container, limit=_shard_clone.SHARD_HEALTH_INTERVAL + 30):
    """Wait (bounded) for Docker's own verdict, which a shard gets at its first scheduled check."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        status = client.api.inspect_container(container)['State'].get('Health', {}).get('Status')
        if status == 'healthy':
            return status
        time.sleep(1)
    return status


def _remove_jobs_and_shards(client, proxy, jobs, containers=()):
    """Best-effort cleanup: the job containers, the jobs' networks, and every shard of ``proxy``."""
    for container in containers:
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            pass
    for job in jobs:
        try:
            jn.teardown_job_network(client, job, proxy_name=proxy)
        except jn.EngineError:
            pass
    for member in jn.proxy_family(client, proxy):
        if member.is_shard:
            client.api.remove_container(member.name, force=True)


@pytest.fixture
def sharded(egress_env):
    """Three job networks with a bound one above what the proxy carries: two on the proxy, one on a shard."""
    client, proxy = egress_env.client, egress_env.proxy
    family = jn.proxy_family(client, proxy)
    assert [m.name for m in family] == [proxy], 'a shard is left from an earlier test: %s' % family
    bound = family[0].load + 2
    jobs = ['it15-%d-%d' % (PID, i) for i in range(3)]
    containers = []
    try:
        nets = [jn.create_job_network(client, job, proxy_name=proxy, shard_bound=bound) for job in jobs]
        for job, net in zip(jobs, nets):
            # each job serves plain HTTP on 80, so "not reached" below is a real refusal, not an empty port
            serve = ['python3', '/usr/local/bin/fake_upstream.py']
            containers.append(client.containers.run(egress_env.tools_image, serve, name=net.container, detach=True,
                                                    network=net.network))
        yield dict(client=client, proxy=proxy, bound=bound, jobs=jobs, nets=nets, containers=containers,
                   shard=_shards.shard_name(proxy, 1), env=egress_env)
    finally:
        _remove_jobs_and_shards(client, proxy, jobs, containers)


def test_jobs_beyond_the_bound_land_on_a_shard_that_is_a_copy_of_the_proxy(sharded):
    client, proxy, shard = sharded['client'], sharded['proxy'], sharded['shard']
    assert [n.proxy for n in sharded['nets']] == [proxy, proxy, shard]
    family = jn.proxy_family(client, proxy)
    assert [(m.name, m.running) for m in family] == [(proxy, True), (shard, True)]
    assert family[1].job_networks == [sharded['nets'][2].network]
    # the job contract does not change: same environment, same name to dial
    assert sharded['nets'][2].env == sharded['nets'][0].env
    assert sharded['nets'][2].env['HTTPS_PROXY'] == 'http://%s:3128' % proxy
    # the shard is the proxy's shape: same image, mounts, hardening, health check
    p, s = client.api.inspect_container(proxy), client.api.inspect_container(shard)
    assert s['Image'] == p['Image']
    # admitted because squid answered its health test when run (not at Docker's first check, 30 s on)
    assert s['State']['Health']['Status'] in ('starting', 'healthy') and _health_test_passes(client, shard)
    assert sorted((m['Source'], m['Destination'], m['RW']) for m in s['Mounts']) == \
        sorted((m['Source'], m['Destination'], m['RW']) for m in p['Mounts'])
    for key in ('CapDrop', 'ReadonlyRootfs', 'SecurityOpt', 'Sysctls', 'Memory', 'PidsLimit', 'Tmpfs', 'LogConfig'):
        assert s['HostConfig'][key] == p['HostConfig'][key], key
    assert s['Config']['Cmd'] == p['Config']['Cmd']
    # the proxy's health check on the shards' own schedule (each check is a docker exec)
    assert s['Config']['Healthcheck'] == dict(p['Config']['Healthcheck'],
                                              Interval=_shard_clone.SHARD_HEALTH_INTERVAL * 10 ** 9)
    assert s['Config']['Labels'][_shards.LABEL_SHARD_OF] == proxy
    assert not s['HostConfig']['PortBindings']
    # on the job's network the shard answers to the proxy's name
    endpoint = s['NetworkSettings']['Networks'][sharded['nets'][2].network]
    assert proxy in (endpoint.get('Aliases') or [])


def test_a_job_on_the_shard_reaches_the_allowed_host_and_is_denied_the_rest(sharded):
    proxy = sharded['proxy']
    for container in (sharded['containers'][0], sharded['containers'][2]):
        rc, connect, code = _curl(container, proxy, 'https://api.provider.test/v1/messages')
        assert (rc, connect, code) == (0, 200, 401), container.name
        rc, connect, _code = _curl(container, proxy, 'https://denied.test/')
        assert connect == 403 and rc != 0, container.name
        rc, _connect, code = _curl(container, proxy, 'http://denied.test/')
        assert code == 403, container.name
    # each member writes the decision log under its own name, with the job it carries
    folder = os.path.join(sharded['env'].deploy_dir, 'decisions')
    for job, member in ((sharded['jobs'][0], proxy), (sharded['jobs'][2], sharded['shard'])):
        for name, host, reason in (('tls-decisions', 'api.provider.test', 'sni_ok'),
                                   ('decisions', 'denied.test', 'unlisted')):
            path = os.path.join(folder, '%s.%s.jsonl' % (member, name))
            found = []
            for _try in range(20):   # a tunnel's line is written as it closes
                with open(path) as handle:
                    found = [json.loads(line) for line in handle if job in line]
                if any(r['host'] == host and r['reason'] == reason for r in found):
                    break
                time.sleep(0.3)
            assert any(r['host'] == host and r['reason'] == reason and r['job'] == job for r in found), (path, found)


def test_jobs_cannot_reach_each_other_across_shards(sharded):
    client = sharded['client']
    on_proxy, on_shard = sharded['containers'][0], sharded['containers'][2]
    net_proxy, net_shard = sharded['nets'][0].network, sharded['nets'][2].network
    assert serving(on_proxy, 80), 'a job does not serve'
    assert serving(on_shard, 80), 'a job does not serve'
    proxy_ip, shard_ip = ip_on(client, on_proxy.name, net_proxy), ip_on(client, on_shard.name, net_shard)
    assert not tcp_reaches(on_shard, proxy_ip, 80), 'the job on the shard reached the other job'
    assert not tcp_reaches(on_proxy, shard_ip, 80), 'the job on the proxy reached the other job'
    assert not tcp_reaches(on_shard, on_proxy.name, 80), 'the job on the shard reached the other job by name'
    # neither reaches the other's carrier on the other network (squid listens there: a route would show)
    assert not tcp_reaches(on_shard, ip_on(client, sharded['proxy'], net_proxy), 3128)
    assert not tcp_reaches(on_proxy, ip_on(client, sharded['shard'], net_shard), 3128)
    # and each reaches its own carrier by the proxy's name
    assert tcp_reaches(on_shard, sharded['proxy'], 3128) and tcp_reaches(on_proxy, sharded['proxy'], 3128)


def test_a_reload_reaches_the_shard_and_the_jobs_survive_it(sharded):
    client, proxy, env = sharded['client'], sharded['proxy'], sharded['env']
    paths = _deployment.Layout(env.deploy_dir).paths
    with open(paths['allowlist']) as handle:
        before = handle.read()
    on_shard = sharded['containers'][2]
    assert _curl(on_shard, proxy, 'https://denied.test/')[1] == 403
    try:
        _files.write_in_place(paths['allowlist'], before + 'denied.test\n')
        record = _reload.reload_family(client, client.containers.get(proxy), paths)
        reconfigured = [(m['name'], m['reconfigured']) for m in record['members']]
        assert reconfigured == [(proxy, True), (sharded['shard'], True)]
        # the shard re-read the allowlist: the name it refused is now let through
        rc, connect, code = _curl(on_shard, proxy, 'https://denied.test/')
        assert (rc, connect, code) == (0, 200, 401)
    finally:
        _files.write_in_place(paths['allowlist'], before)
        _reload.reload_family(client, client.containers.get(proxy), paths)
    assert _curl(on_shard, proxy, 'https://denied.test/')[1] == 403
    # the jobs kept their networks and their carriers through both reloads
    family = jn.proxy_family(client, proxy)
    assert family[1].job_networks == [sharded['nets'][2].network]
    assert _curl(sharded['containers'][0], proxy, 'https://api.provider.test/v1/messages')[:2] == (0, 200)


def test_the_last_job_off_a_shard_removes_it_and_the_sweep_knows_shards(sharded):
    client, proxy, shard = sharded['client'], sharded['proxy'], sharded['shard']
    job = sharded['jobs'][2]
    sharded['containers'][2].remove(force=True)
    done = jn.teardown_job_network(client, job, proxy_name=proxy)
    assert done['actions'] == ['detach %s' % shard, 'remove %s' % jn.network_name(job),
                               'remove the empty shard %s' % shard]
    assert [m.name for m in jn.proxy_family(client, proxy)] == [proxy]
    # a stale job network left on a shard (a dead worker) is swept like one on the proxy
    again = jn.create_job_network(client, job, proxy_name=proxy, shard_bound=sharded['bound'])
    assert again.proxy == shard
    result = jn.sweep(client, min_age=0, proxy_name=proxy, id_prefix=job)
    assert [(e['network'], e['detached']) for e in result['removed']] == [(again.network, [shard])]
    assert result['removed_shards'] == [shard]
    assert [m.name for m in jn.proxy_family(client, proxy)] == [proxy]


def test_the_doctor_reports_both_members_and_runs_the_canary_through_the_shard(sharded, tmp_path):
    from test_doctor import run_doctor
    proxy, shard = sharded['proxy'], sharded['shard']
    # the family line reads Docker's status, which a new shard has from its first check on
    assert _docker_says_healthy(sharded['client'], shard) == 'healthy'
    rc, out, by_id, _lines = run_doctor(sharded['env'], tmp_path, 'shards', doctor_isolation=False)
    assert rc == 0, out[-4000:]
    family = by_id['proxy.shards']
    assert family['status'] == 'ok', family
    assert 'family of 2' in family['message'] and '%s (running, healthy' % proxy in family['message']
    assert '%s (running, healthy, 1 job network' % shard in family['message'], family
    for line_id in ('canary.provider', 'canary.deny', 'canary.plain', 'canary.sni', 'canary.tunnel_plain'):
        assert by_id[line_id]['status'] == 'ok', (line_id, by_id.get(line_id))
        assert shard not in by_id[line_id]['message']
    for line_id in ('canary.shard_provider', 'canary.shard_deny', 'canary.shard_plain', 'canary.shard_sni',
                    'canary.shard_tunnel_plain'):
        assert by_id[line_id]['status'] == 'ok', (line_id, by_id.get(line_id), out[-4000:])
        assert 'through %s' % shard in by_id[line_id]['message']
    assert '401' in by_id['canary.shard_provider']['message']
    assert 'proxy.shard_stopped' not in by_id and 'proxy.shard_health' not in by_id
    # the doctor's own networks and probes are gone; the shard still carries only its job network
    client = sharded['client']
    assert not doctor_objects_left(client)
    assert jn.proxy_family(client, proxy)[1].job_networks == [sharded['nets'][2].network]


def test_a_stopped_shard_is_a_failed_doctor_line(sharded, tmp_path):
    from test_doctor import run_doctor
    client, shard = sharded['client'], sharded['shard']
    client.api.stop(shard, timeout=5)
    rc, out, by_id, _lines = run_doctor(sharded['env'], tmp_path, 'shard-stopped', doctor_isolation=False)
    assert rc != 0
    line = by_id['proxy.shard_stopped']
    assert line['status'] == 'fail' and '%s is exited' % shard in line['message'], (line, out[-3000:])
    assert not [i for i in by_id if i.startswith('canary.shard_')]


def test_a_stopped_proxy_with_a_serving_shard_is_checked_through_the_shard(sharded, tmp_path):
    """Issue 24: the proxy down, its shard up: the shard's job keeps egress, so the doctor says so and
    proves the policy through the shard instead of skipping every check."""
    from test_doctor import run_doctor
    client, proxy, shard = sharded['client'], sharded['proxy'], sharded['shard']
    on_shard = sharded['containers'][2]
    client.api.stop(proxy, timeout=10)
    try:
        rc, out, by_id, lines = run_doctor(sharded['env'], tmp_path, 'proxy-stopped-shard-serving',
                                           doctor_isolation=False)
        assert rc != 0, out[-4000:]
        assert by_id['proxy.stopped']['status'] == 'fail'
        assert 'every new job is refused' in by_id['proxy.stopped']['message']
        serving = by_id['proxy.shards_serving']
        assert serving['status'] == 'warn' and '1 job network on %s still has egress' % shard in serving['message']
        for line_id in ('canary.shard_provider', 'canary.shard_deny', 'canary.shard_plain'):
            assert by_id[line_id]['status'] == 'ok', (line_id, by_id.get(line_id), out[-4000:])
            assert 'through %s' % shard in by_id[line_id]['message']
        base = [line for line in lines if line['id'] == 'canary.notrun']
        assert base and all('the proxy is not running' in line['message'] for line in base), lines
        assert not [line for line in lines if line['id'] in ('canary.provider', 'canary.deny', 'canary.plain')]
        # and what the line says is true: the job on the shard still reaches the provider, and only it
        assert _curl(on_shard, proxy, 'https://api.provider.test/v1/messages') == (0, 200, 401)
        assert _curl(on_shard, proxy, 'https://denied.test/')[1] == 403
        assert not doctor_objects_left(client)
    finally:
        client.api.start(proxy)
        deadline = time.monotonic() + 60
        while not _health_test_passes(client, proxy) and time.monotonic() < deadline:
            time.sleep(0.5)
    assert _curl(sharded['containers'][0], proxy, 'https://api.provider.test/v1/messages') == (0, 200, 401)


def test_a_replaced_proxy_replaces_its_shard_only_with_consent_and_the_shard_keeps_its_jobs(sharded):
    client, proxy, shard, env = sharded['client'], sharded['proxy'], sharded['shard'], sharded['env']
    shard_id = client.api.inspect_container(shard)['Id']
    # drift (another health interval): the proxy would be replaced, and its shard with it
    rc, out, _recap = env.site(egress_proxy_health_interval=7)
    assert rc != 0
    flat = ' '.join(out.split())
    assert 'would cut' in flat and 'egress_proxy_allow_cut_jobs' in flat, out[-3000:]
    assert client.api.inspect_container(shard)['Id'] == shard_id
    try:
        rc, out, _recap = env.site(egress_proxy_health_interval=7, egress_proxy_allow_cut_jobs=True)
        assert rc == 0, out[-4000:]
        attrs = client.api.inspect_container(shard)
        assert attrs['Id'] != shard_id                                   # a fresh copy of the new proxy
        assert attrs['Config']['Healthcheck']['StartPeriod'] == 7 * 10 ** 9    # the new proxy's start period
        assert attrs['Config']['Healthcheck']['Interval'] == _shard_clone.SHARD_HEALTH_INTERVAL * 10 ** 9
        assert _health_test_passes(client, shard)
        # its own job network is attached again, under the proxy's name
        net = sharded['nets'][2].network
        assert proxy in (attrs['NetworkSettings']['Networks'][net].get('Aliases') or [])
        assert [m.job_networks for m in jn.proxy_family(client, proxy) if m.is_shard] == [[net]]
        for container in (sharded['containers'][0], sharded['containers'][2]):
            assert _curl(container, proxy, 'https://api.provider.test/v1/messages') == (0, 200, 401), container.name
    finally:
        rc, out, _recap = env.site(egress_proxy_allow_cut_jobs=True)
        assert rc == 0, out[-4000:]
    restored = client.api.inspect_container(shard)['Config']['Healthcheck']
    assert restored['StartPeriod'] == client.api.inspect_container(proxy)['Config']['Healthcheck']['StartPeriod']
    assert restored['Interval'] == _shard_clone.SHARD_HEALTH_INTERVAL * 10 ** 9


def test_the_role_variable_sets_the_bound_every_dispatcher_follows(egress_env):
    """egress_proxy_shard_bound labels the proxy; a create that passes no bound follows it; removing the
    variable removes the label (the proxy is replaced both times, with consent)."""
    client, proxy, env = egress_env.client, egress_env.proxy, egress_env
    family = jn.proxy_family(client, proxy)
    assert [m.name for m in family] == [proxy], 'a shard is left from an earlier test: %s' % family
    bound = family[0].load + 1
    jobs = ['it15l-%d-%d' % (PID, i) for i in range(2)]
    try:
        rc, out, _recap = env.site(egress_proxy_shard_bound=bound, egress_proxy_allow_cut_jobs=True)
        assert rc == 0, out[-4000:]
        assert client.api.inspect_container(proxy)['Config']['Labels'][_shards.LABEL_SHARD_BOUND] == str(bound)
        nets = [jn.create_job_network(client, job, proxy_name=proxy) for job in jobs]   # no bound of their own
        assert [n.proxy for n in nets] == [proxy, _shards.shard_name(proxy, 1)]
    finally:
        _remove_jobs_and_shards(client, proxy, jobs)
        rc, out, _recap = env.site(egress_proxy_allow_cut_jobs=True)
        assert rc == 0, out[-4000:]
    assert _shards.LABEL_SHARD_BOUND not in client.api.inspect_container(proxy)['Config']['Labels']
