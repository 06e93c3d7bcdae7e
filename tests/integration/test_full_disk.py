"""A full deployment folder on the real engine (issue 24): a failed write keeps the last good file in force.

A proxy of its own (``pi-dispatch-egress-proxy-it-full``) is deployed by site.yml into a folder on a
small tmpfs, on the session's upstream network (the fake upstream answers ``models.test``). A job
network holds a client. With the endpoint ``m1`` declared and answering, the tmpfs is filled; then:

* ``endpoints.yml`` with a larger declaration (its JSON outside the folder) fails writing the include,
  and the include still holds ``m1``;
* ``upgrade.yml`` asked to refresh the (edited) rules fails and leaves no backup, the rules unchanged;
* after the disk is freed, an unrelated ``site.yml`` reloads, and ``m1`` still answers.

Everything (containers, networks, the mount) is removed in the ``finally``; every curl is bounded.
"""

import glob
import os
import shlex
import subprocess

import pytest

docker = pytest.importorskip('docker')

from conftest import TOOLS_IMAGE, run_playbook  # noqa: E402

from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as jn  # noqa: E402

pytestmark = pytest.mark.integration

M1 = {'id': 'm1', 'host': 'models.test', 'port': 8443, 'slots': 1, 'keyless': True}
MORE = [{'id': 'extra-%02d' % i, 'host': 'extra-%02d.models.test' % i, 'port': 9000 + i, 'slots': 1}
        for i in range(40)]


def _curl(container, proxy, url):
    script = ('curl -sS -k --max-time 8 --proxy http://%s:3128 -o /dev/null -w "%%{http_code} %%{http_connect}" '
              '%s 2>/dev/null' % (proxy, shlex.quote(url)))
    _rc, out = container.exec_run(['timeout', '12', 'sh', '-c', script])
    codes = (out or b'').decode('utf-8', 'replace').split()
    return tuple(int(c) for c in codes if c.isdigit())


def _fill(folder):
    """Write zeros into ``folder`` until the file system is full; returns the filler's path."""
    path = os.path.join(folder, 'filler')
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (65536, 1):
            for _block in range(100000):  # bounded: far more than the tmpfs holds
                try:
                    os.write(fd, b'\0' * size)
                except OSError:
                    break
    finally:
        os.close(fd)
    return path


@pytest.fixture(scope='module')
def full_world(egress_env, tmp_path_factory):
    client = egress_env.client
    mount = str(tmp_path_factory.mktemp('tmpfs'))
    subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=4m,mode=0755', 'tmpfs', mount], check=True)
    proxy = egress_env.proxy + '-full'
    job = 'it24full-%d' % os.getpid()
    world = dict(env=egress_env, client=client, mount=mount, deploy_dir=os.path.join(mount, 'egress'),
                 proxy=proxy, job=job, container=None,
                 declaration=str(tmp_path_factory.mktemp('declaration') / 'model-endpoints.json'))
    try:
        rc, out, _recap = run_playbook('playbooks/site.yml', egress_env.site_vars(
            egress_deploy_dir=world['deploy_dir'], egress_proxy_name=proxy))
        assert rc == 0, out[-6000:]
        net = jn.create_job_network(client, job, proxy_name=proxy, shard_bound=0)
        world['container'] = client.containers.run(TOOLS_IMAGE, ['sleep', 'infinity'], name=net.container,
                                                   detach=True, network=net.network)
        yield world
    finally:
        if world['container'] is not None:
            world['container'].remove(force=True)
        try:
            jn.teardown_job_network(client, job, proxy_name=proxy)
        except jn.EngineError:
            pass
        try:
            client.api.remove_container(proxy, force=True, v=True)
        except docker.errors.NotFound:
            pass
        subprocess.run(['umount', mount], check=False)


def _endpoints(world, endpoints):
    # The declaration lives outside the full folder (PI_MODEL_ENDPOINTS_FILE's case), so that what
    # fails is the write of the include the proxy reads.
    return run_playbook('playbooks/endpoints.yml', {'egress_deploy_dir': world['deploy_dir'],
                                                    'egress_proxy_name': world['proxy'],
                                                    'egress_model_endpoints_file': world['declaration'],
                                                    'egress_model_endpoints': endpoints})


def test_a_failed_write_on_a_full_disk_keeps_the_last_good_files(full_world):
    world = full_world
    env, proxy, container = world['env'], world['proxy'], world['container']
    include = os.path.join(world['deploy_dir'], 'model-endpoints.conf')
    rules = os.path.join(world['deploy_dir'], 'deploy', 'egress-proxy.conf')

    rc, out, _recap = _endpoints(world, [M1])
    assert rc == 0, out[-4000:]
    assert _curl(container, proxy, 'https://models.test:8443/v1/models') == (200, 200)
    with open(include) as handle:
        good_include = handle.read()
    assert 'models.test' in good_include
    # an edit of the operator's, so that a refresh has something to replace
    with open(rules, 'a') as handle:
        handle.write('# a local edit\n')
    with open(rules) as handle:
        edited_rules = handle.read()

    filler = _fill(world['mount'])
    try:
        # 1. a larger declaration fails, and the include squid reads still holds m1
        rc, out, _recap = _endpoints(world, [M1] + MORE)
        assert rc != 0, out[-4000:]
        assert 'No space left on device' in out and 'model-endpoints.conf' in out, out[-4000:]
        assert 'still holds its previous content' in out, out[-4000:]
        with open(include) as handle:
            assert handle.read() == good_include
        # 2. a refresh of the rules fails and leaves no backup behind
        rc, out, _recap = run_playbook('playbooks/upgrade.yml', env.site_vars(
            egress_deploy_dir=world['deploy_dir'], egress_proxy_name=proxy, egress_upgrade_refresh_rules=True,
            egress_upgrade_allow_cut_jobs=True))
        assert rc != 0, out[-4000:]
        assert glob.glob(rules + '.bak-*') == [], out[-4000:]
        with open(rules) as handle:
            assert handle.read() == edited_rules
        assert 'partial backup was removed' in out or 'removed again' in out, out[-4000:]
    finally:
        os.unlink(filler)

    # 3. the next, unrelated site.yml keeps m1 in force
    rc, out, _recap = run_playbook('playbooks/site.yml', env.site_vars(
        egress_deploy_dir=world['deploy_dir'], egress_proxy_name=proxy))
    assert rc == 0, out[-6000:]
    with open(include) as handle:
        assert handle.read() == good_include
    assert _curl(container, proxy, 'https://models.test:8443/v1/models') == (200, 200)
    # and so does any later reload, which reads the include again
    rc, out = world['client'].containers.get(proxy).exec_run(['squid', '-k', 'reconfigure'])
    assert rc == 0, out
    assert _curl(container, proxy, 'https://models.test:8443/v1/models') == (200, 200)
    assert _curl(container, proxy, 'https://denied.test/')[-1] == 403
