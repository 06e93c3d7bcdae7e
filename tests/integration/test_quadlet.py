"""The proxy as Quadlet units on Podman 5, run by systemd in a test host container (issue 29).

The host is ``pi-dispatch-egress-podmanhost:test`` (tests/images/podmanhost): Debian 13's own Podman
with Quadlet, systemd as PID 1, no network of its own (``--network none``; every container the test
starts is inside it). site.yml's roles deploy there over SSH with ``egress_proxy_units=quadlet``:
``egress_proxy`` writes the units, has systemd read them and starts the unit. The test reads the
container through Podman's Docker-compatible API (its socket mounted out of the host) and asks what a
deploy would ask: does it have the shape ``egress_proxy`` wants (``spec.differences``), is it healthy,
does squid answer a job, does it come back after a ``systemctl restart``, a killed container and a
reboot of the host, and does a new shape restart the unit only with consent, the job following it.
"""

import os
import subprocess
import time
from unittest import mock

import pytest

import fleet
from conftest import PROXY_IMAGE, ROOT, SUFFIX, TOOLS_IMAGE, ansible_env, docker
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import venue as _venue
from ansible_collections.pi_dispatch.egress.plugins.module_utils._podman import units_apply as _units
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import deploy as _deploy
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
# site.yml's and upgrade.yml's variables for the host: the proxy as Quadlet units.
SITE_VARS = {'egress_hosts': 'podmanhost', 'egress_deploy_dir': DEPLOY_DIR, 'egress_proxy_units': 'quadlet',
             'egress_proxy_network_internal': True, 'egress_proxy_install_debootstrap': False,
             'egress_allowlist_seed': [{'host': 'api.provider.test', 'comment': 'the provider (fake)'}]}
RULES = DEPLOY_DIR + '/deploy/egress-proxy.conf'
BROKEN_LINE = 'http_access allow pi_no_such_acl\n'  # squid refuses to start on it (test_upgrade.py)
JOB_NET = 'pi-job-quadlet-net'


def sh(argv, stdin=None, timeout=120):
    proc = subprocess.run(argv, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout,
                          check=False)
    return proc.returncode, proc.stdout.decode('utf-8', 'replace')


def in_host(command, timeout=120, host=HOST):
    return sh(['docker', 'exec', host, 'sh', '-c', command], timeout=timeout)


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
        # Nothing is pulled: the host's Podman loads the images (the base too, as egress_image looks for it).
        for image in (fleet.BASE_IMAGE, PROXY_IMAGE, TOOLS_IMAGE):
            save = subprocess.Popen(['docker', 'save', image], stdout=subprocess.PIPE)
            load = subprocess.run(['docker', 'exec', '-i', HOST, 'podman', 'load', '-q'], stdin=save.stdout,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300, check=False)
            save.stdout.close()
            assert save.wait(timeout=60) == 0 and load.returncode == 0, load.stdout[-2000:]
        yield host
    finally:
        sh(['docker', 'rm', '-f', '-v', HOST])


class Ansible(object):
    """The playbooks reach the host over SSH as root: ``sshd -i`` through ``docker exec`` (its network is none)."""

    def __init__(self, run_dir, host=HOST, site_vars=None):
        self.run_dir = str(run_dir)
        self.host, self.site_vars = host, dict(site_vars or SITE_VARS)
        self.key = os.path.join(self.run_dir, 'id_ed25519')
        self.inventory = os.path.join(self.run_dir, 'inventory.ini')
        subprocess.run(['ssh-keygen', '-q', '-t', 'ed25519', '-N', '', '-f', self.key], check=True, timeout=30)
        with open(self.key + '.pub') as handle:
            rc, out = sh(['docker', 'exec', '-i', host, 'sh', '-c', 'cat > /root/.ssh/authorized_keys && chmod 600 '
                          '/root/.ssh/authorized_keys'], stdin=handle.read().encode())
        assert rc == 0, out
        proxy_command = os.path.join(self.run_dir, 'sshd-through-exec')
        with open(proxy_command, 'w') as handle:
            handle.write('#!/bin/sh\nexec docker exec -i %s sh -c "mkdir -p /run/sshd && exec /usr/sbin/sshd -i"\n'
                         % host)
        os.chmod(proxy_command, 0o755)
        with open(self.inventory, 'w') as handle:
            handle.write('podmanhost ansible_user=root ansible_ssh_private_key_file=%s '
                         'ansible_python_interpreter=/usr/bin/python3 ansible_ssh_common_args=\'%s '
                         '-o ProxyCommand=%s\'\n' % (self.key, fleet.SSH_ARGS, proxy_command))
        fleet.install_publicsuffixlist(host)

    def run(self, playbook, **more):
        """Run one of the collection's playbooks on the host; (rc, output, the host's recap)."""
        rc, out, recap = fleet.run_playbook(ROOT, self.inventory, playbook, dict(self.site_vars, **more), ansible_env(),
                                            timeout=900)
        return rc, out, recap.get('podmanhost', {})

    def site(self, **more):
        return self.run('playbooks/site.yml', **more)

    def upgrade(self, **more):
        return self.run('playbooks/upgrade.yml', egress_upgrade_refresh_rules=True, egress_proxy_wait_timeout=25,
                        **more)


def wanted(params_deploy_dir=DEPLOY_DIR, memory='512m'):
    params = dict(name=PROXY, image='pi-dispatch-egress-proxy:latest', network=_spec.UPSTREAM_NETWORK,
                  network_internal=True, extra_hosts=[], health_interval=5, memory=memory, pids_limit=256,
                  nofile=16384, log_max_size='10m', log_max_file=3, scope='system', account=None, units_dir=None,
                  state='present', deploy_dir=params_deploy_dir, decision_log=True, decision_log_dir=None,
                  decision_log_max_size='10m', decision_log_keep=5)
    # The rules that say the log is written live in the host, not here: they are the packaged ones (version 3).
    with mock.patch.object(_deploy, 'rules_write_decision_log', lambda path: True):
        return _units.wanted_spec(params, _deployment.paths(params_deploy_dir))


def differences(host, memory='512m'):
    client = host.podman
    attrs = _venue.container_attrs(client, client.api.inspect_container(PROXY))
    image_id = client.images.get('localhost/' + PROXY_IMAGE).id
    return _spec.differences(wanted(memory=memory), _spec.observed(attrs), image_id)


def squid_answers_a_job(host):
    """A job container on an --internal network with the proxy on it: an unlisted name gets squid's refusal."""
    api = host.podman.api
    job_net = JOB_NET
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


@pytest.fixture(scope='module')
def ansible(podman_host, tmp_path_factory):
    return Ansible(tmp_path_factory.mktemp('podmanhost-ansible'))


def unit_file():
    rc, out = in_host('cat /etc/containers/systemd/%s.container' % PROXY)
    assert rc == 0, out
    return out


def journal():
    """The end of the proxy unit's journal, for a failure's message."""
    return '\n--- journalctl -u %s\n%s' % (SERVICE, in_host('journalctl -u %s --no-pager | tail -n 40' % SERVICE)[1])


def flat(out):
    """The play's output with its line wrapping undone (the callback wraps long messages at spaces)."""
    return ' '.join(out.split())


def host_clock():
    rc, out = in_host('date +%s')
    assert rc == 0, out
    return int(out.strip())


def starts_since(since):
    """How many times systemd started the proxy's unit since ``since`` (the host's clock, seconds)."""
    rc, out = in_host('journalctl -u %s -o cat --no-pager --since @%d' % (SERVICE, since))
    assert rc == 0, out
    return sum(1 for line in out.splitlines() if line.startswith('Started '))


def test_site_runs_the_proxy_as_quadlet_units_with_the_shape_egress_proxy_wants(podman_host, ansible):
    since = host_clock()
    rc, out, recap = ansible.site()
    assert rc == 0 and recap.get('failed') == 0, out[-6000:]
    # The decision log's folder is made (and given to the proxy user) before the units are written.
    assert ('Actions: create network %s (internal), create decision log folder %s/decisions, write units, create, '
            'start' % (_spec.UPSTREAM_NETWORK, DEPLOY_DIR)) in flat(out), out[-6000:]
    assert '%s/decisions:/var/log/pi-dispatch:rw' % DEPLOY_DIR in unit_file(), unit_file()
    assert starts_since(since) == 1  # the create and the start are one systemctl restart
    rc, out = in_host('systemctl is-active %s' % SERVICE)
    assert out.strip() == 'active', out + in_host('journalctl -u %s --no-pager | tail -30' % SERVICE)[1]
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
    # The unit carries the decision log as the engine path does (issue 44): squid wrote the refusal there.
    wait_for('the refusal in the decision log', lambda: (
        '"host":"denied.test"' in in_host('cat %s/decisions/*' % DEPLOY_DIR)[1] or 'not yet'))
    # The same play again changes nothing: the units are as written, the container as wanted.
    rc, out, recap = ansible.site()
    assert rc == 0 and recap.get('changed') == 0, out[-6000:]


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


def test_a_new_shape_rewrites_the_unit_and_restarts_it_only_with_consent(podman_host, ansible):
    """An attached job makes the restart a cut: refused without consent, and then no unit file is written;
    with consent one systemctl restart runs the new file and the job network follows the new container."""
    api = podman_host.podman.api
    first = podman_host.healthy_proxy()
    before = unit_file()
    for net in api.networks(names=[JOB_NET]):
        api.remove_network(net['Id'])
    api.create_network(JOB_NET, driver='bridge', internal=True)
    try:
        api.connect_container_to_network(PROXY, JOB_NET)
        rc, out, _recap = ansible.site(egress_proxy_memory='640m')
        assert rc != 0 and 'would cut 1 job attached to it (%s' % JOB_NET in flat(out), out[-6000:]
        assert unit_file() == before and podman_host.healthy_proxy() == first
        since = host_clock()
        rc, out, recap = ansible.site(egress_proxy_memory='640m', egress_proxy_allow_cut_jobs=True)
        assert rc == 0 and recap.get('failed') == 0, out[-6000:]
        assert 'Actions: write units, remove, create, start, reconnect' in flat(out), out[-6000:]
        assert starts_since(since) == 1  # one restart makes the new container
        assert '--memory=671088640' in unit_file() and '--memory=536870912' in before
        moved = podman_host.healthy_proxy()
        assert moved != first
        attrs = api.inspect_container(moved)
        assert attrs['Config']['Labels'].get('PODMAN_SYSTEMD_UNIT') == SERVICE
        assert JOB_NET in attrs['NetworkSettings']['Networks'], attrs['NetworkSettings']['Networks'].keys()
        assert differences(podman_host, memory='640m') == []
        rc, out = in_host('systemctl is-active %s' % SERVICE)
        assert out.strip() == 'active', out
    finally:
        try:
            api.disconnect_container_from_network(PROXY, JOB_NET, force=True)
        except docker.errors.APIError:
            pass
        api.remove_network(JOB_NET)


def test_an_upgrade_whose_proxy_fails_is_rolled_back_through_the_unit(podman_host, ansible):
    """upgrade.yml refreshes the rules and runs the unit in one step; squid refuses the new rules, so the
    old ones come back and the unit runs a healthy proxy on them again."""
    rc, old = in_host('cat %s' % RULES)
    assert rc == 0, old
    rc, out = sh(['docker', 'exec', '-i', HOST, 'sh', '-c', 'cat > /srv/pi-egress/broken.conf'],
                 stdin=(old + BROKEN_LINE).encode())
    assert rc == 0, out
    rc, out, _recap = ansible.upgrade(egress_upgrade_rules_source='/srv/pi-egress/broken.conf',
                                      egress_proxy_memory='640m')
    print(out[max(0, out.find('Summary of the egress upgrade') - 100):])  # the rollback, for the record
    assert rc != 0 and 'The proxy did not become healthy within 25s' in flat(out), out[-6000:]
    assert 'journalctl -u %s' % SERVICE in flat(out), out[-6000:]
    assert 'ROLLBACK: old rules restored from %s' % RULES in flat(out), out[-6000:]
    assert in_host('cat %s' % RULES)[1] == old
    podman_host.healthy_proxy()
    assert in_host('systemctl is-active %s' % SERVICE)[1].strip() == 'active'
    assert podman_host.podman.api.inspect_container(PROXY)['Config']['Labels'].get('PODMAN_SYSTEMD_UNIT') == SERVICE
    assert differences(podman_host, memory='640m') == []


def test_absent_stops_the_unit_and_removes_its_files_and_a_deploy_brings_both_back(podman_host, ansible):
    """``egress_proxy_state=absent`` stops the unit, then removes its files; the next deploy writes them again."""
    rc, out, recap = ansible.site(egress_proxy_state='absent', egress_proxy_memory='640m')
    assert rc == 0 and recap.get('failed') == 0, out[-6000:]
    assert 'Actions: remove, remove units' in flat(out), out[-6000:]
    rc, out = in_host('ls /etc/containers/systemd; systemctl is-active %s' % SERVICE)
    assert 'pi-dispatch' not in out.replace(SERVICE, '') and out.split()[-1] == 'inactive', out
    assert not podman_host.podman.api.containers(all=True, filters={'name': PROXY})
    since = host_clock()
    rc, out, recap = ansible.site(egress_proxy_memory='640m')
    assert rc == 0 and recap.get('failed') == 0, out[-6000:] + journal()
    assert 'Actions: write units, create, start' in flat(out), out[-6000:]
    assert starts_since(since) == 1
    podman_host.healthy_proxy()
    assert differences(podman_host, memory='640m') == []
