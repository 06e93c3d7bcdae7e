"""The proxy as Quadlet units on Podman 5, run by systemd in a test host container (issue 29).

The host is ``pi-dispatch-egress-podmanhost:test`` (tests/images/podmanhost): Debian 13's own Podman
with Quadlet, systemd as PID 1, no network of its own (``--network none``; every container the test
starts is inside it). ``egress_podman_units`` renders the units here, from a deployment folder laid out
by ``egress_deployment``; both are copied into the host at the paths the units name, then systemd
starts the proxy. The test reads the container through Podman's Docker-compatible API (its socket
mounted out of the host) and asks what a deploy would ask: does it have the shape ``egress_proxy``
wants (``spec.differences``), is it healthy, does squid answer a job, and does it come back after a
``systemctl restart``, a killed container and a reboot of the host.
"""

import json
import os
import subprocess
import time

import pytest

from conftest import PROXY_IMAGE, SUFFIX, TOOLS_IMAGE, docker, run_playbook
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import venue as _venue
from ansible_collections.pi_dispatch.egress.plugins.module_utils._podman import units_apply as _units
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import spec as _spec

HOST_IMAGE = 'pi-dispatch-egress-podmanhost:test'
HOST = 'pi-egress-podmanhost' + SUFFIX
DEPLOY_DIR = '/srv/pi-egress/egress'  # inside the host: on its root file system, so it survives a reboot
PROXY = _spec.PROXY_NAME
SERVICE = PROXY + '.service'
# As the fleet hosts run (tests/integration/fleet.py): every capability but CAP_SYS_RESOURCE, which this
# machine's bounding set lacks, so --privileged cannot start. systemd needs the cgroup tree read-write.
RUN_ARGS = ['--cap-add', 'ALL', '--cap-drop', 'SYS_RESOURCE', '--security-opt', 'seccomp=unconfined',
            '--security-opt', 'apparmor=unconfined', '--security-opt', 'systempaths=unconfined',
            '--device', '/dev/fuse', '--device', '/dev/net/tun', '--cgroupns=host',
            '-v', '/sys/fs/cgroup:/sys/fs/cgroup:rw', '--tmpfs', '/run', '--tmpfs', '/run/lock', '--tmpfs', '/tmp',
            '--network', 'none', '-e', 'PODMAN_IGNORE_CGROUPSV1_WARNING=1',
            '--label', 'io.pi-dispatch.egress.test=quadlet']
PLAYBOOK = """
- name: Lay out a deployment folder and render the proxy's Quadlet units (test_quadlet.py)
  hosts: localhost
  gather_facts: false
  tasks:
    - name: The deployment folder, here, to be copied into the host
      pi_dispatch.egress.egress_deployment:
        deploy_dir: "{{ local_deploy }}"
        allowlist: [{host: api.provider.test, comment: the provider (fake)}]
    - name: The units, for the folder's path inside the host
      pi_dispatch.egress.egress_podman_units:
        deploy_dir: "%s"
        units_dir: "{{ local_units }}"
        network_internal: true
      register: units
    - name: Keep the result for the test
      ansible.builtin.copy:
        content: "{{ units | to_json }}"
        dest: "{{ result_path }}"
        mode: "0644"
""" % DEPLOY_DIR


def sh(argv, stdin=None, timeout=120):
    proc = subprocess.run(argv, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout,
                          check=False)
    return proc.returncode, proc.stdout.decode('utf-8', 'replace')


def in_host(command, timeout=120):
    return sh(['docker', 'exec', HOST, 'sh', '-c', command], timeout=timeout)


def wait_for(what, probe, deadline_s=90, every=1.0):
    end = time.monotonic() + deadline_s
    last = None
    while time.monotonic() < end:
        last = probe()
        if last is True:
            return
        time.sleep(every)
    raise AssertionError('%s: not within %ss (%s)' % (what, deadline_s, last))


def booted():
    rc, out = in_host('systemctl is-system-running', timeout=30)
    return out.strip() in ('running', 'degraded') or out.strip()


class PodmanHost(object):
    def __init__(self, client, sock_dir):
        self.client = client
        self.sock = os.path.join(sock_dir, 'podman.sock')
        self._api = None

    @property
    def podman(self):
        """A Docker SDK client of the host's Podman (its socket is mounted out of the host)."""
        if self._api is None:
            self._api = docker.DockerClient(base_url='unix://' + self.sock, timeout=120)
        return self._api

    def boot(self):
        wait_for('%s booted' % HOST, booted)
        rc, out = in_host('systemctl start podman.socket')
        assert rc == 0, out
        wait_for('the Podman socket', lambda: os.path.exists(self.sock) or 'no socket')

    def healthy_proxy(self):
        def probe():
            try:
                attrs = self.podman.api.inspect_container(PROXY)
            except docker.errors.NotFound:
                return 'no container'
            return ((attrs['State'].get('Health') or {}).get('Status') == 'healthy') or attrs['State'].get('Status')
        wait_for('%s healthy' % PROXY, probe)
        return self.podman.api.inspect_container(PROXY)['Id']


@pytest.fixture(scope='module')
def podman_host(engine, tmp_path_factory):
    try:
        engine.images.get(HOST_IMAGE)
    except docker.errors.ImageNotFound:
        pytest.fail('Image %s is missing. Build it with: ansible-playbook tests/images/build.yml (./run test does).'
                    % HOST_IMAGE)
    sock_dir = str(tmp_path_factory.mktemp('podmanhost-sock'))
    sh(['docker', 'rm', '-f', '-v', HOST])
    rc, out = sh(['docker', 'run', '-d', '--name', HOST] + RUN_ARGS + ['-v', '%s:/run/podman' % sock_dir, HOST_IMAGE])
    assert rc == 0, out
    try:
        host = PodmanHost(engine, sock_dir)
        host.boot()
        for image in (PROXY_IMAGE, TOOLS_IMAGE):  # nothing is pulled: the host's Podman loads the images
            save = subprocess.Popen(['docker', 'save', image], stdout=subprocess.PIPE)
            load = subprocess.run(['docker', 'exec', '-i', HOST, 'podman', 'load', '-q'], stdin=save.stdout,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300, check=False)
            save.stdout.close()
            assert save.wait(timeout=60) == 0 and load.returncode == 0, load.stdout[-2000:]
        yield host
    finally:
        sh(['docker', 'rm', '-f', '-v', HOST])


def render(tmp_path):
    """Run the playbook: (local deploy folder, local units folder, the module's result)."""
    playbook = tmp_path / 'quadlet.yml'
    playbook.write_text(PLAYBOOK)
    local_deploy, local_units, result = tmp_path / 'egress', tmp_path / 'units', tmp_path / 'units.json'
    rc, out, _recap = run_playbook(str(playbook), {'local_deploy': str(local_deploy), 'local_units': str(local_units),
                                                   'result_path': str(result)})
    assert rc == 0, out[-4000:]
    return local_deploy, local_units, json.loads(result.read_text())


def copy_into_host(local, inside):
    rc, out = in_host('mkdir -p %s' % inside)
    assert rc == 0, out
    tar = subprocess.Popen(['tar', '-C', str(local), '-cf', '-', '.'], stdout=subprocess.PIPE)
    rc, out = sh(['docker', 'exec', '-i', HOST, 'tar', '-C', inside, '-xf', '-'], stdin=tar.stdout.read())
    assert tar.wait(timeout=60) == 0 and rc == 0, out


def wanted(params_deploy_dir=DEPLOY_DIR):
    params = dict(name=PROXY, image='pi-dispatch-egress-proxy:latest', network=_spec.UPSTREAM_NETWORK,
                  network_internal=True, extra_hosts=[], health_interval=5, memory='512m', pids_limit=256,
                  nofile=16384, log_max_size='10m', log_max_file=3, scope='system', account=None, units_dir=None,
                  state='present', deploy_dir=params_deploy_dir)
    return _units.wanted_spec(params, _deployment.paths(params_deploy_dir))


def differences(host):
    client = host.podman
    attrs = _venue.container_attrs(client, client.api.inspect_container(PROXY))
    image_id = client.images.get('localhost/' + PROXY_IMAGE).id
    return _spec.differences(wanted(), _spec.observed(attrs), image_id)


def squid_answers_a_job(host):
    """A job container on an --internal network with the proxy on it: an unlisted name gets squid's refusal."""
    api = host.podman.api
    job_net = 'pi-job-quadlet-net'
    for net in api.networks(names=[job_net]):
        api.remove_network(net['Id'])
    api.create_network(job_net, driver='bridge', internal=True)
    try:
        api.connect_container_to_network(PROXY, job_net)
        # --cgroups=disabled: outside a systemd unit, crun cannot write the devices cgroup of this nested host
        # (cgroup v1: "write file devices.allow: Operation not permitted"); the client is only a test's curl.
        rc, out = in_host('podman run --rm --cgroups=disabled --network %s %s curl -sS -m 10 -o /dev/null -D - '
                          '-x http://%s:3128 https://denied.test/' % (job_net, TOOLS_IMAGE, PROXY), timeout=90)
        return out
    finally:
        try:
            api.disconnect_container_from_network(PROXY, job_net, force=True)
        except docker.errors.APIError:
            pass
        api.remove_network(job_net)


def test_the_units_run_the_proxy_with_the_shape_egress_proxy_wants(podman_host, tmp_path):
    local_deploy, local_units, result = render(tmp_path)
    assert result['changed'] and result['services'] == [SERVICE, 'pi-dispatch-egress-out-network.service']
    # A second render changes nothing (the same files).
    _deploy2, _units2, again = render(tmp_path)
    assert not again['changed'], again
    copy_into_host(local_deploy, DEPLOY_DIR)
    copy_into_host(local_units, '/etc/containers/systemd')
    rc, out = in_host('systemctl daemon-reload && systemctl start %s' % SERVICE, timeout=180)
    assert rc == 0, out + in_host('journalctl -u %s --no-pager | tail -30' % SERVICE)[1]
    podman_host.healthy_proxy()
    # Podman 5 names itself; the container systemd started has the shape egress_proxy wants, no difference.
    assert _venue.venue(podman_host.podman).is_podman
    assert differences(podman_host) == []
    labels = podman_host.podman.api.inspect_container(PROXY)['Config']['Labels']
    assert labels.get('PODMAN_SYSTEMD_UNIT') == SERVICE and labels.get(_spec.LABEL_ROLE) == 'proxy'
    net = podman_host.podman.api.inspect_network(_spec.UPSTREAM_NETWORK)
    assert net['Internal'] is True and net['Labels'].get(_spec.LABEL_NETWORK_ROLE) == 'upstream'
    # squid serves a job: an unlisted name is refused by squid itself.
    answer = squid_answers_a_job(podman_host)
    assert ' 403 ' in answer and 'ERR_ACCESS_DENIED' in answer, answer


def test_the_proxy_comes_back_after_a_restart_a_kill_and_a_reboot(podman_host):
    first = podman_host.healthy_proxy()
    rc, out = in_host('systemctl restart %s' % SERVICE, timeout=180)
    assert rc == 0, out
    restarted = podman_host.healthy_proxy()
    assert restarted != first  # systemd ran a new container (Quadlet runs it with --rm)
    rc, out = in_host('podman kill %s' % PROXY)
    assert rc == 0, out
    wait_for('systemd restarting the killed proxy', lambda: (
        in_host('systemctl show -p NRestarts --value %s' % SERVICE)[1].strip() == '1' or 'not yet'))
    assert podman_host.healthy_proxy() != restarted
    # A reboot of the host: the unit is enabled (WantedBy=multi-user.target), so systemd starts it at boot.
    rc, out = sh(['docker', 'restart', '-t', '30', HOST], timeout=120)
    assert rc == 0, out
    podman_host._api = None
    podman_host.boot()
    podman_host.healthy_proxy()
    rc, out = in_host('systemctl is-active %s; systemctl is-enabled %s' % (SERVICE, SERVICE))
    assert out.split() == ['active', 'generated'], out
    assert differences(podman_host) == []
