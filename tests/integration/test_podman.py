"""The Podman venue (docs/podman.md): what differs from the Docker Engine, each difference pinned here.

``./run gate podman`` runs this file, with the engine-neutral suites (policy probes, site.yml twice,
job networks, model endpoints), against Debian's own Podman through its Docker-compatible API
(``DOCKER_HOST=unix://.../podman.sock``). The Docker integration gate leaves this file out;
run alone against Docker, every test here is skipped as not this venue.
"""

import os

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as _jobnet
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import venue as _venue

from conftest import TOOLS_IMAGE, _remove_container

LABEL = {'io.pi-dispatch.egress.test': 'podman'}

# The gate says which engine it started; a run that reaches another one must fail, not skip.
WANTED = os.environ.get('PI_EGRESS_IT_ENGINE', '')


@pytest.fixture(scope='module')
def podman_env(egress_env):
    if WANTED != 'podman':
        if not egress_env.venue.is_podman:
            pytest.skip('not the Podman venue (./run gate podman runs this file)')
    assert egress_env.venue.is_podman, 'PI_EGRESS_IT_ENGINE=podman but the engine is %s' % egress_env.venue.describe()
    return egress_env


def _proxy_sh(env, script):
    rc, out = env.client.containers.get(env.proxy).exec_run(['sh', '-c', script])
    return rc, out.decode('utf-8', 'replace')


def test_the_engine_names_itself_podman(podman_env):
    venue = podman_env.venue
    assert venue.kind == _venue.PODMAN
    assert _venue.version_tuple(venue.version) >= (4, 3), venue.describe()
    assert venue.host_alias == 'host.containers.internal'


def test_the_proxy_is_hardened_as_on_docker(podman_env):
    """Same hardening, Podman's spelling: every capability gone, no forwarding, read-only root, and no
    writable place that may execute (Podman mounts /run and /var/tmp on a read-only container itself)."""
    rc, out = _proxy_sh(podman_env, 'grep CapEff /proc/1/status; cat /proc/sys/net/ipv4/ip_forward; '
                                    'touch /etc/x 2>/dev/null; echo touch=$?; ulimit -n; stat -c %u /run/squid; '
                                    'grep " tmpfs " /proc/mounts')
    assert rc == 0, out
    assert 'CapEff:\t0000000000000000' in out, out
    lines = out.splitlines()
    assert lines[1] == '0', out
    assert 'touch=1' in out and '16384' in lines, out
    assert lines[4] == '13', 'squid\'s pid folder must belong to the proxy user (tmpfs U):\n' + out
    mounts = dict((line.split()[1], line.split()[3].split(',')) for line in lines if ' tmpfs ' in line)
    for path in ('/tmp', '/run', '/run/squid', '/var/tmp'):
        assert path in mounts, out
        assert 'noexec' in mounts[path] and 'nosuid' in mounts[path], (path, out)
    attrs = _venue.container_attrs(podman_env.client, podman_env.client.api.inspect_container(podman_env.proxy))
    host = attrs['HostConfig']
    assert host['CapDrop'][0] == 'ALL' and host['SecurityOpt'] == ['no-new-privileges:true']
    # Podman reads max-size 1000-based and shows it in its own words: 10m is 10MB (one file, no max-file).
    assert host['LogConfig']['Config'] == {'max-size': '10MB'}, host['LogConfig']
    # No host-gateway mapping (Podman 4.3 would write it literally); Podman names the host itself.
    assert 'host.docker.internal:host-gateway' not in (host.get('ExtraHosts') or [])
    rc, hosts = _proxy_sh(podman_env, 'cat /etc/hosts')
    assert rc == 0 and 'host.containers.internal' in hosts and 'host-gateway' not in hosts, hosts


def test_a_second_deploy_reads_podman_inspect_as_no_change(podman_env):
    """Podman reports what it applied in its own words (RLIMIT_NOFILE, no-new-privileges, CapDrop as the
    default set, tmpfs with rprivate/tmpcopyup, no log options): none of it may read as drift."""
    rc, out, recap = podman_env.site()
    assert rc == 0, out[-3000:]
    assert recap.get('changed') == 0, out[-4000:]


def test_a_stopped_job_container_blocks_teardown_by_name_and_nothing_changes(podman_env):
    """Podman refuses to remove a network a stopped container is on; the teardown names it first."""
    client = podman_env.client
    job = 'pm-stopped-%d' % os.getpid()
    name = _jobnet.container_name(job)
    _remove_container(client, name)
    net = _jobnet.create_job_network(client, job, proxy_name=podman_env.proxy)
    try:
        client.containers.create(TOOLS_IMAGE, ['true'], name=name, network=net.network, labels=dict(LABEL))
        with pytest.raises(_jobnet.EngineError) as raised:
            _jobnet.teardown_job_network(client, job, proxy_name=podman_env.proxy)
        assert name in str(raised.value) and 'Nothing was changed' in str(raised.value)
        assert client.networks.get(net.network)
        _remove_container(client, name)
        done = _jobnet.teardown_job_network(client, job, proxy_name=podman_env.proxy)
        assert done['changed'] is True
        assert not client.networks.list(names=[net.network])
    finally:
        _remove_container(client, name)
        try:
            _jobnet.teardown_job_network(client, job, proxy_name=podman_env.proxy)
        except _jobnet.EngineError:
            pass


def test_an_operator_host_gateway_is_refused_and_nothing_changes(podman_env):
    """Podman 4.3 would write host-gateway into the proxy's /etc/hosts as an address (squid then resolves the
    name by DNS instead): the deploy refuses it, naming the entry and host.containers.internal."""
    before = podman_env.client.api.inspect_container(podman_env.proxy)['Id']
    rc, out, _recap = podman_env.site(egress_proxy_extra_hosts=['loopback.test:127.0.0.1', 'gw.test:host-gateway'])
    assert rc != 0, out[-3000:]
    assert 'gw.test:host-gateway' in out and 'host.containers.internal' in out and 'Nothing was changed' in out
    assert podman_env.client.api.inspect_container(podman_env.proxy)['Id'] == before
