"""A test fleet: hosts with their own Docker Engine, reached over SSH like a real inventory.

Each host is a container of ``pi-dispatch-egress-fleethost:test`` (tests/images/fleethost) that
runs its own ``dockerd`` and ``sshd``. The playbooks reach it over SSH as root with a key made for
the run, and the collection's modules run on it, against its own engine. The test reads each
host's engine from outside through the socket the host's dockerd also listens on
(``<run dir>/<host>/docker.sock``), never through the host it is testing.

Every host gets what the collection needs on a target (docs/fleet.md): the Docker SDK for
Python (the image's python3-docker) and ``publicsuffixlist`` (copied from the controller's
virtualenv, as an operator's provisioning would install it), the proxy, base and tools images
(``docker save`` on this machine, ``docker load`` into the host's engine: nothing is pulled),
and, for the doctor, a fake upstream on the host's ``--internal`` upstream network.

The fleet network is ``--internal``: a fleet host reaches nothing outside this machine.
Used by tests/integration/test_fleet.py and benchmarks/fleet_upgrade.py.
"""

import json
import os
import subprocess
import time

import docker

FLEET_IMAGE = 'pi-dispatch-egress-fleethost:test'
PROXY_IMAGE = 'pi-dispatch-egress-proxy:latest'
TOOLS_IMAGE = 'pi-dispatch-egress-tools:test'
BASE_IMAGE = 'pi-dispatch-egress-base:trixie'
LABEL = {'io.pi-dispatch.egress.test': 'fleet'}
UPSTREAM = 'pi-dispatch-egress-out'
FAKE = 'pi-egress-fake'
FAKE_ALIASES = ['api.provider.test', 'plain.test', 'denied.test']
ALLOWLIST = [{'host': 'api.provider.test', 'comment': 'the provider (fake)'},
             {'host': 'plain.test', 'comment': 'plain http (fake)'}]
# Every capability but CAP_SYS_RESOURCE: this machine's bounding set lacks it, so --privileged
# cannot start; the host's dockerd needs the rest, without seccomp, AppArmor or masked paths.
SECURITY = ['--cap-add', 'ALL', '--cap-drop', 'SYS_RESOURCE', '--security-opt', 'seccomp=unconfined',
            '--security-opt', 'apparmor=unconfined', '--security-opt', 'systempaths=unconfined']
SSH_ARGS = ('-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o ConnectTimeout=5 '
            '-o ServerAliveInterval=15')


def install_publicsuffixlist(container):
    """Copy the controller's ``publicsuffixlist`` (requirements.txt pins it) into the host container's python3,
    as an operator's provisioning would install it (egress_allowlist needs it on the target)."""
    import publicsuffixlist
    psl = os.path.dirname(publicsuffixlist.__file__)
    site = subprocess.run(['docker', 'exec', container, 'python3', '-c', 'import sys; print([p for p in sys.path '
                           'if p.startswith("/usr/local/lib/python3") and p.endswith("dist-packages")][0])'],
                          stdout=subprocess.PIPE, check=True, timeout=60).stdout.decode().strip()
    subprocess.run(['docker', 'exec', container, 'mkdir', '-p', site], check=True, timeout=60)
    subprocess.run(['docker', 'cp', psl, '%s:%s/publicsuffixlist' % (container, site)], check=True, timeout=60)


class Fleet(object):
    """``names`` (inventory names, e.g. engine-a) as containers ``<prefix>-<name>``."""

    def __init__(self, client, run_dir, names, prefix='pi-egress-fleet'):
        self.client = client
        self.run_dir = run_dir
        self.names = list(names)
        self.prefix = prefix
        self.network = prefix + '-net'
        self.key = os.path.join(run_dir, 'id_ed25519')
        self.inventory = os.path.join(run_dir, 'inventory.ini')
        self.addresses = {}
        self.subnets = {}

    def container(self, name):
        return '%s-%s' % (self.prefix, name)

    def engine(self, name, timeout=120):
        """A client of ``name``'s own engine (through its socket in the run dir)."""
        return docker.DockerClient(base_url='unix://%s' % os.path.join(self.run_dir, name, 'docker.sock'),
                                   timeout=timeout)

    # --- building and removing ------------------------------------------------------------------

    def remove(self):
        for name in self.names:
            try:
                self.client.api.remove_container(self.container(name), force=True, v=True)
            except docker.errors.NotFound:
                pass
        try:
            self.client.api.remove_network(self.network)
        except docker.errors.NotFound:
            pass

    def start(self):
        self.remove()
        os.makedirs(self.run_dir, exist_ok=True)
        if not os.path.exists(self.key):
            subprocess.run(['ssh-keygen', '-q', '-t', 'ed25519', '-N', '', '-f', self.key], check=True, timeout=30)
        self.client.networks.create(self.network, driver='bridge', internal=True, labels=LABEL)
        for name in self.names:
            os.makedirs(os.path.join(self.run_dir, name), exist_ok=True)
            # the docker CLI, not the SDK: the SDK has no systempaths=unconfined (MaskedPaths/ReadonlyPaths)
            subprocess.run(['docker', 'run', '-d', '--name', self.container(name), '--hostname', name,
                            '--network', self.network, '--label', '%s=%s' % next(iter(LABEL.items())),
                            '-v', '%s:/run/fleet' % os.path.join(self.run_dir, name)] + SECURITY + [FLEET_IMAGE],
                           check=True, timeout=120, stdout=subprocess.DEVNULL)
        images = os.path.join(self.run_dir, 'images.tar')
        subprocess.run(['docker', 'save', '-o', images, BASE_IMAGE, PROXY_IMAGE, TOOLS_IMAGE], check=True, timeout=600)
        for name in self.names:
            self._provision(name, images)
        os.unlink(images)
        self.write_inventory()

    def _wait_engine(self, name, deadline_s=90):
        end = time.monotonic() + deadline_s
        last = None
        while time.monotonic() < end:
            try:
                self.engine(name, timeout=10).ping()
                return
            except Exception as exc:  # the socket is not there yet, or the daemon is starting
                last = exc
            time.sleep(1)
        log = self.exec(name, ['tail', '-20', '/var/log/dockerd.log'])[1]
        raise AssertionError('the engine of fleet host %s did not answer within %ds (%s):\n%s'
                             % (name, deadline_s, last, log))

    def _provision(self, name, images):
        container = self.client.containers.get(self.container(name))
        container.reload()
        self.addresses[name] = container.attrs['NetworkSettings']['Networks'][self.network]['IPAddress']
        with open(self.key + '.pub') as handle:
            pub = handle.read()
        self.exec(name, ['sh', '-c', 'cat > /root/.ssh/authorized_keys && chmod 600 /root/.ssh/authorized_keys'],
                  stdin=pub)
        install_publicsuffixlist(self.container(name))
        self._wait_engine(name)
        engine = self.engine(name, timeout=600)
        with open(images, 'rb') as handle:
            engine.images.load(handle)
        net = engine.networks.create(UPSTREAM, driver='bridge', internal=True,
                                     labels={'io.pi-dispatch.egress.network': 'upstream'})
        net.reload()
        self.subnets[name] = net.attrs['IPAM']['Config'][0]['Subnet']
        api = engine.api
        fake = api.create_container(
            TOOLS_IMAGE, ['python3', '/usr/local/bin/fake_upstream.py'], name=FAKE, detach=True, labels=LABEL,
            host_config=api.create_host_config(network_mode=UPSTREAM),
            networking_config=api.create_networking_config({UPSTREAM: api.create_endpoint_config(
                aliases=FAKE_ALIASES)}))
        api.start(fake['Id'])

    def exec(self, name, argv, stdin=None, timeout=60):
        proc = subprocess.run(['docker', 'exec', '-i', self.container(name)] + list(argv),
                              input=(stdin or '').encode(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout, check=False)
        return proc.returncode, proc.stdout.decode('utf-8', 'replace')

    # --- the inventory --------------------------------------------------------------------------

    def unused_address(self):
        """An address on the fleet network that no container holds (a host that cannot be reached)."""
        import ipaddress
        net = self.client.networks.get(self.network)
        subnet = ipaddress.ip_network(net.attrs['IPAM']['Config'][0]['Subnet'])
        return str(subnet.network_address + 250)

    def write_inventory(self, extra_hosts=None, path=None):
        """An INI inventory: group ``egress`` with every fleet host, plus ``extra_hosts`` lines."""
        lines = ['[egress]']
        for name in self.names:
            lines.append('%s ansible_host=%s egress_private_destinations=\'%s\''
                         % (name, self.addresses[name], json.dumps([self.subnets[name]])))
        lines += list(extra_hosts or [])
        lines += ['', '[egress:vars]', 'ansible_user=root', 'ansible_ssh_private_key_file=%s' % self.key,
                  "ansible_ssh_common_args='%s'" % SSH_ARGS, 'ansible_python_interpreter=/usr/bin/python3', '']
        path = path or self.inventory
        with open(path, 'w') as handle:
            handle.write('\n'.join(lines))
        return path


def site_vars(**more):
    extra = {
        'egress_hosts': 'egress',
        'egress_proxy_network_internal': True,
        'egress_allowlist_seed': ALLOWLIST,
        'egress_proxy_install_debootstrap': False,
    }
    extra.update(more)
    return extra


def doctor_vars(**more):
    extra = {
        'egress_hosts': 'egress',
        'doctor_probe_image': TOOLS_IMAGE,
        'doctor_provider_host': 'api.provider.test',
        'doctor_deny_host': 'denied.test',
        'doctor_listed_host': 'api.provider.test',
        'doctor_probe_timeout': 5,
        'doctor_probe_start_grace': 20,
        'doctor_squid_mirror': False,  # --internal upstreams: no mirror answers (test_proxy_image.py pins it)
    }
    extra.update(more)
    return extra


def run_playbook(root, inventory, playbook, extra_vars, env, check=False, limit=None, timeout=1200):
    """``ansible-playbook -i inventory``; returns (rc, output, recap per host)."""
    cmd = ['ansible-playbook', '-i', inventory, os.path.join(root, playbook), '-e', json.dumps(extra_vars)]
    if check:
        cmd += ['--check', '--diff']
    if limit:
        cmd += ['--limit', limit]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout, env=env,
                          cwd=root, check=False)
    out = proc.stdout.decode('utf-8', 'replace')
    recap = {}
    in_recap = False
    for line in out.splitlines():
        if line.startswith('PLAY RECAP'):
            in_recap = True
            continue
        if in_recap and ' : ok=' in line:
            host, counts = line.split(':', 1)
            recap[host.strip()] = dict((k, int(v)) for k, v in (item.split('=') for item in counts.split()))
    return proc.returncode, out, recap
