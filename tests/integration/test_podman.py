"""The Podman venue (docs/podman.md): what differs from the Docker Engine, each difference pinned here.

``./run gate podman`` runs this file, with the engine-neutral suites (policy probes, site.yml twice,
job networks, model endpoints), against Debian's own Podman through its Docker-compatible API
(``DOCKER_HOST=unix://.../podman.sock``). The Docker integration gate leaves this file out;
run alone against Docker, every test here is skipped as not this venue.
"""

import os
import shlex
import subprocess
import time

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as _jobnet
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import venue as _venue
from ansible_collections.pi_dispatch.egress.plugins.module_utils._podman import units_apply as _units
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import spec as _spec

from conftest import PROXY_IMAGE, SUFFIX, TOOLS_IMAGE, _remove_container, _remove_network, run_playbook

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


# --- Podman 4.3's units: plain systemd services (egress_podman_units format=systemd) -------------------

GEN_PROXY = 'pi-egress-gen-proxy' + SUFFIX
GEN_NET = 'pi-egress-gen-out' + SUFFIX
GEN_JOB_NET = 'pi-egress-gen-job' + SUFFIX
UNITS_PLAYBOOK = """
- name: Render the proxy's systemd services for Podman 4.3 (test_podman.py)
  hosts: localhost
  gather_facts: false
  tasks:
    - name: The two services
      pi_dispatch.egress.egress_podman_units:
        deploy_dir: "{{ deploy_dir }}"
        name: "{{ proxy }}"
        image: "{{ image }}"
        network: "{{ net }}"
        network_internal: true
        units_dir: "{{ units_dir }}"
        format: systemd
"""


def unit_commands(path, key, runtime_dir):
    """The unit's ``key=`` command lines as systemd runs them: (failure ignored, argv), %t %n %% expanded."""
    unit = os.path.basename(path)
    commands = []
    with open(path) as handle:
        for line in handle.read().splitlines():
            if not line.startswith(key + '='):
                continue
            command = line.split('=', 1)[1]
            ignore = command.startswith('-')
            command = command.lstrip('-').replace('%%', '\0').replace('%t', runtime_dir).replace('%n', unit)
            commands.append((ignore, [word.replace('\0', '%') for word in shlex.split(command)]))
    assert commands, '%s has no %s=' % (path, key)
    return commands


def run_unit(path, key, runtime_dir):
    """Run the unit's ``key=`` lines in order, as systemd would (with the unit's environment); the outputs."""
    env = dict(os.environ, PODMAN_SYSTEMD_UNIT=os.path.basename(path))
    outputs = []
    for ignore, argv in unit_commands(path, key, runtime_dir):
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, timeout=120,
                              check=False)
        out = proc.stdout.decode('utf-8', 'replace')
        assert ignore or proc.returncode == 0, '%s %s failed (%d): %s' % (key, argv[:4], proc.returncode, out)
        outputs.append((proc.returncode, out))
    return outputs


def _healthy(client, name, deadline_s=60):
    end = time.monotonic() + deadline_s
    status = None
    while time.monotonic() < end:
        _venue.run_health_check(client, name)
        status = (client.api.inspect_container(name)['State'].get('Health') or {}).get('Status')
        if status == 'healthy':
            return
        time.sleep(1)
    raise AssertionError('%s not healthy within %ss (%s)' % (name, deadline_s, status))


def test_the_podman_43_services_start_the_proxy_egress_proxy_wants_and_stop_it(podman_env, tmp_path):
    """format=systemd: the commands of both services, run as systemd would run them on Podman 4.3, make the
    network (twice: 4.3's create has no --ignore), start a healthy proxy with no difference from the wanted
    shape, whose squid answers a job, and take it down again."""
    client = podman_env.client
    units_dir, runtime = tmp_path / 'units', tmp_path / 'run'
    runtime.mkdir()
    playbook = tmp_path / 'units.yml'
    playbook.write_text(UNITS_PLAYBOOK)
    rc, out, _recap = run_playbook(str(playbook), dict(deploy_dir=podman_env.deploy_dir, proxy=GEN_PROXY,
                                                       image=PROXY_IMAGE, net=GEN_NET, units_dir=str(units_dir)))
    assert rc == 0, out[-3000:]
    proxy_unit, net_unit = str(units_dir / (GEN_PROXY + '.service')), str(units_dir / (GEN_NET + '-network.service'))
    _remove_container(client, GEN_PROXY)
    for name in (GEN_JOB_NET, GEN_NET):
        _remove_network(client, name)
    try:
        first = run_unit(net_unit, 'ExecStart', str(runtime))
        again = run_unit(net_unit, 'ExecStart', str(runtime))
        assert first[0][0] == 0 and again[0][0] != 0, (first, again)  # the second create fails, and is ignored
        net = client.api.inspect_network(GEN_NET)
        assert net['Internal'] is True and net['Labels'].get(_spec.LABEL_NETWORK_ROLE) == 'upstream', net

        run_unit(proxy_unit, 'ExecStart', str(runtime))
        _healthy(client, GEN_PROXY)
        inspect = client.api.inspect_container(GEN_PROXY)
        assert inspect['Config']['Labels'].get('PODMAN_SYSTEMD_UNIT') == os.path.basename(proxy_unit)
        params = dict(name=GEN_PROXY, image=PROXY_IMAGE, network=GEN_NET, network_internal=True, extra_hosts=[],
                      health_interval=5, memory='512m', pids_limit=256, nofile=16384, log_max_size='10m',
                      log_max_file=3, scope='system', account=None, units_dir=None, state='present',
                      deploy_dir=podman_env.deploy_dir, format='systemd')
        wanted = _units.wanted_spec(params, _deployment.paths(podman_env.deploy_dir))
        image_id = client.images.get(wanted['image']).id
        attrs = _venue.container_attrs(client, inspect)
        assert _spec.differences(wanted, _spec.observed(attrs), image_id) == []

        client.api.create_network(GEN_JOB_NET, driver='bridge', internal=True)
        client.api.connect_container_to_network(GEN_PROXY, GEN_JOB_NET)
        # curl fails when the tunnel is refused (exit 56); the headers it printed are the answer.
        answer = client.containers.run(
            TOOLS_IMAGE, ['sh', '-c', 'curl -sS -m 20 -o /dev/null -D - -x http://%s:3128 https://denied.test/; '
                          'exit 0' % GEN_PROXY], network=GEN_JOB_NET, remove=True, labels=dict(LABEL),
            stderr=True).decode('utf-8', 'replace')
        assert ' 403 ' in answer and 'ERR_ACCESS_DENIED' in answer, answer
        client.api.disconnect_container_from_network(GEN_PROXY, GEN_JOB_NET, force=True)

        run_unit(proxy_unit, 'ExecStop', str(runtime))
        run_unit(proxy_unit, 'ExecStopPost', str(runtime))
        assert not [c for c in client.api.containers(all=True)
                    if GEN_PROXY in [name.lstrip('/') for name in c['Names']]]
    finally:
        _remove_container(client, GEN_PROXY)
        for name in (GEN_JOB_NET, GEN_NET):
            _remove_network(client, name)
