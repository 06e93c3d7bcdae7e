"""upgrade.yml on the real engine: an old-shape proxy refreshed, replaced, rolled back, and left alone.

The world here is this file's own, beside ``egress_env``'s: a deployment folder
and a proxy ``h6-egress-proxy`` made the way a deployment from before model
endpoints looked (rules without the include, two mounts), on egress_env's
upstream network (so the fake upstream answers it), and a client ``h6-client``
on an internal network ``h6-client-net`` with that proxy.

The old rules carry one designed difference that a client can observe: they
let a plain GET through to port 8080 of a listed host. The packaged rules
refuse it (squid's own 403), so "the new rules are in force" is measured from
the client, not read from a file.
"""

import glob
import os
import time

import pytest

from conftest import ROOT, _remove_container, _remove_network, docker, run_playbook

pytestmark = pytest.mark.integration

PROXY = 'h6-egress-proxy'
CLIENT = 'h6-client'
CLIENT_NET = 'h6-client-net'
LABEL = {'io.pi-dispatch.egress.test': 'h6-upgrade'}
INCLUDE = 'include /etc/pi-dispatch/model-endpoints.conf\n'
GUARD = 'include /etc/pi-dispatch/egress-guard.conf\n'
OLD_RULES = os.path.join(ROOT, 'molecule', 'upgrade', 'files', 'egress-proxy-old.conf')
ANCHOR = 'http_access allow CONNECT pi_port_443 pi_allowlist\n'
OLD_EXTRA = 'acl pi_port_8080 port 8080\nhttp_access allow !CONNECT pi_port_8080 pi_allowlist\n'
BROKEN_LINE = 'http_access allow pi_no_such_acl\n'
WAIT = 25

OLD_PROXY_PLAYBOOK = """---
- name: Make an old-shape proxy (two mounts) for the upgrade tests
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Old proxy
      pi_dispatch.egress.egress_proxy:
        name: "{{ h6_proxy }}"
        deploy_dir: "{{ h6_deploy_dir }}"
        network: "{{ h6_network }}"
        network_internal: true
        extra_hosts: [loopback.test:127.0.0.1]
        mount_endpoints: false
        wait_timeout: 60
        # conftest.run_playbook's consent, where the engine cannot hold the limits (./run gate podman-rootless)
        limits_unenforced_ok: "{{ egress_proxy_limits_unenforced_ok | default(false) }}"
"""

DEPLOYMENT_PLAYBOOK = """---
- name: Lay out a deployment folder for the upgrade tests
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Folder
      pi_dispatch.egress.egress_deployment:
        deploy_dir: "{{ h6_deploy_dir }}"
        allowlist: "{{ h6_allowlist }}"
"""


def _remove(client):
    for name in (CLIENT, PROXY):
        _remove_container(client, name)
    _remove_network(client, CLIENT_NET)


class World(object):
    def __init__(self, env, root):
        self.env = env
        self.client = env.client
        self.root = root
        self.deploy_dir = os.path.join(root, 'egress')
        self.rules = os.path.join(self.deploy_dir, 'deploy', 'egress-proxy.conf')
        self.old_rules = None
        self.packaged = None

    def upgrade_vars(self, **more):
        out = {
            'egress_deploy_dir': self.deploy_dir,
            'egress_proxy_name': PROXY,
            'egress_proxy_upstream_network': self.env.upstream_net,
            'egress_proxy_network_internal': True,
            'egress_proxy_extra_hosts': ['loopback.test:127.0.0.1'],
            'egress_proxy_wait_timeout': WAIT,
            'egress_upgrade_refresh_rules': True,
            'egress_private_destinations': [self.env.upstream_subnet],
        }
        out.update(more)
        return out

    def upgrade(self, **more):
        rc, out, recap = run_playbook('playbooks/upgrade.yml', self.upgrade_vars(**more))
        self.reattach_client()
        return rc, out, recap

    def reattach_client(self):
        """A replaced proxy keeps only job networks (pi-job-*-net); this test's client net is put back."""
        try:
            attrs = self.client.api.inspect_container(PROXY)
        except docker.errors.NotFound:
            return
        if CLIENT_NET not in attrs['NetworkSettings']['Networks']:
            self.client.networks.get(CLIENT_NET).connect(PROXY)

    def inspect(self):
        return self.client.api.inspect_container(PROXY)

    def mounts(self):
        return sorted(m['Destination'] for m in self.inspect()['Mounts'])

    def backups(self):
        return sorted(glob.glob(self.rules + '.bak-*'))

    def read_rules(self):
        with open(self.rules) as handle:
            return handle.read()

    def get(self, url):
        """A plain GET from the job network through the proxy: (status, who answered)."""
        container = self.client.containers.get(CLIENT)
        argv = ['timeout', '25', 'curl', '-sS', '-o', '/dev/null', '-D', '-', '--max-time', '10',
                '--proxy', 'http://%s:3128' % PROXY, '-w', 'CODE=%{http_code}\n', url]
        for _attempt in range(10):  # bounded: the proxy may just have come up
            _rc, out = container.exec_run(argv)
            text = (out or b'').decode('utf-8', 'replace')
            code = int(text.rsplit('CODE=', 1)[1].split()[0]) if 'CODE=' in text else 0
            if code:
                who = 'upstream' if 'X-Fake-Upstream' in text else 'squid' if 'X-Squid-Error' in text else '?'
                return code, who
            time.sleep(1)
        raise AssertionError('no answer from %s for %s: %s' % (PROXY, url, text))

    def wait_healthy(self, deadline_s=60):
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            state = self.inspect()['State']
            if (state.get('Health') or {}).get('Status') == 'healthy':
                return
            time.sleep(1)
        raise AssertionError('%s not healthy within %ss: %s' % (PROXY, deadline_s, self.inspect()['State']))


@pytest.fixture(scope='module')
def world(egress_env, tmp_path_factory):
    client = egress_env.client
    _remove(client)
    w = World(egress_env, str(tmp_path_factory.mktemp('h6-upgrade')))
    book = os.path.join(w.root, 'deployment.yml')
    with open(book, 'w') as handle:
        handle.write(DEPLOYMENT_PLAYBOOK)
    rc, out, _recap = run_playbook(book, {'h6_deploy_dir': w.deploy_dir, 'h6_allowlist': egress_env.allowlist})
    assert rc == 0, out[-4000:]
    # The folder's rules are the packaged copy; put the pre-#503 rules (the molecule upgrade scenario's
    # fixture, version 1 without its include) in their place, with the 8080 difference. That deployment
    # had neither the model-endpoints declaration and include nor the destination guard include.
    w.packaged = w.read_rules()
    assert INCLUDE in w.packaged and GUARD in w.packaged
    with open(OLD_RULES) as handle:
        old = handle.read()
    assert INCLUDE not in old and GUARD not in old and ANCHOR in old
    w.old_rules = old.replace(ANCHOR, OLD_EXTRA + ANCHOR, 1)
    with open(w.rules, 'w') as handle:
        handle.write(w.old_rules)
    for name in ('egress-guard.conf', 'model-endpoints.json', 'model-endpoints.conf'):
        os.unlink(os.path.join(w.deploy_dir, name))
    book = os.path.join(w.root, 'old-proxy.yml')
    with open(book, 'w') as handle:
        handle.write(OLD_PROXY_PLAYBOOK)
    try:
        rc, out, _recap = run_playbook(book, {'h6_proxy': PROXY, 'h6_deploy_dir': w.deploy_dir,
                                              'h6_network': egress_env.upstream_net})
        assert rc == 0, out[-4000:]
        client.networks.create(CLIENT_NET, driver='bridge', internal=True, labels=LABEL)
        client.networks.get(CLIENT_NET).connect(PROXY)
        client.containers.run(egress_env.tools_image, ['sleep', 'infinity'], name=CLIENT, detach=True,
                              network=CLIENT_NET, labels=LABEL)
        yield w
    finally:
        _remove(client)


def test_the_old_shape_lets_a_plain_get_to_8080_through(world):
    assert world.mounts() == ['/etc/pi-dispatch/egress-allowlist.conf', '/etc/squid/squid.conf']
    assert world.get('http://plain.test:8080/') == (401, 'upstream')
    assert world.get('http://plain.test/') == (401, 'upstream')


def test_without_consent_to_replace_nothing_is_written(world):
    before = world.inspect()['Id']
    rc, out, _recap = world.upgrade()
    assert rc != 0, out
    assert 'egress_upgrade_allow_replace' in out and 'nothing written' in out, out[-4000:]
    assert 'refused: localhost' in out
    assert world.read_rules() == world.old_rules
    assert world.backups() == []
    assert world.inspect()['Id'] == before
    assert world.get('http://plain.test:8080/') == (401, 'upstream')


def test_rules_squid_refuses_are_rolled_back(world):
    broken = os.path.join(world.root, 'broken-egress-proxy.conf')
    with open(broken, 'w') as handle:
        handle.write(world.packaged + BROKEN_LINE)
    rc, out, _recap = world.upgrade(egress_upgrade_allow_replace=True, egress_upgrade_rules_source=broken)
    print(out[max(0, out.find('Summary of the egress upgrade') - 100):])  # the rollback, for the record
    assert rc != 0
    assert 'did not become healthy' in out, out[-4000:]
    assert 'ROLLBACK: old rules restored from %s' % world.rules in out, out[-4000:]
    assert 'back in its old shape (2 mounts, without model-endpoints.conf)' in out, out[-4000:]
    assert 'rolled back: localhost' in out
    # old rules back, the backup kept with them, the old shape running and healthy on them
    assert world.read_rules() == world.old_rules
    backups = world.backups()
    assert len(backups) == 1
    with open(backups[0]) as handle:
        assert handle.read() == world.old_rules
    state = world.inspect()['State']
    assert state['Running'] is True and state['Health']['Status'] == 'healthy'
    assert world.mounts() == ['/etc/pi-dispatch/egress-allowlist.conf', '/etc/squid/squid.conf']
    assert world.get('http://plain.test:8080/') == (401, 'upstream')


def test_check_mode_shows_the_diff_and_the_backup_and_writes_nothing(world):
    before = world.inspect()['Id']
    backups = world.backups()
    rc, out, _recap = run_playbook('playbooks/upgrade.yml', world.upgrade_vars(egress_upgrade_allow_replace=True),
                                   check=True)
    assert rc == 0, out[-4000:]
    assert '+include /etc/pi-dispatch/model-endpoints.conf' in out and '-acl pi_port_8080 port 8080' in out
    assert '--- %s' % world.rules in out and 'packaged rules, version' in out
    assert world.rules + '.bak-' in out  # the backup it would make
    assert world.read_rules() == world.old_rules and world.backups() == backups
    assert world.inspect()['Id'] == before


def test_upgrade_refreshes_and_replaces_the_two_mount_proxy(world):
    backups_before = world.backups()
    rc, out, _recap = world.upgrade(egress_upgrade_allow_replace=True)
    assert rc == 0, out[-5000:]
    assert 'refreshed: localhost' in out and 'replaced: localhost' in out, out[-4000:]
    new = sorted(set(world.backups()) - set(backups_before))
    assert len(new) == 1
    with open(new[0]) as handle:
        assert handle.read() == world.old_rules
    assert world.read_rules() == world.packaged
    # the four files, and the decision log's folder the new rules write to (the old rules wrote none)
    assert world.mounts() == ['/etc/pi-dispatch/egress-allowlist.conf', '/etc/pi-dispatch/egress-guard.conf',
                              '/etc/pi-dispatch/model-endpoints.conf', '/etc/squid/squid.conf',
                              '/var/log/pi-dispatch']
    for name in ('egress-guard.conf', 'model-endpoints.json', 'model-endpoints.conf'):
        assert os.path.isfile(os.path.join(world.deploy_dir, name)), name  # the upgrade added it (create-only)
    world.wait_healthy()
    assert world.inspect()['State']['Running'] is True
    # the new rules are in force: 8080 is refused by squid, port 80 still passes
    assert world.get('http://plain.test:8080/') == (403, 'squid')
    assert world.get('http://plain.test/') == (401, 'upstream')


def test_a_second_run_changes_nothing(world):
    attrs = world.inspect()
    backups = world.backups()
    rc, out, recap = world.upgrade(egress_upgrade_allow_replace=True)
    assert rc == 0, out[-4000:]
    assert recap.get('changed') == 0, out[-4000:]
    assert 'left alone: localhost' in out
    after = world.inspect()
    assert (after['Id'], after['State']['StartedAt']) == (attrs['Id'], attrs['State']['StartedAt'])
    assert world.backups() == backups
    assert world.get('http://plain.test:8080/') == (403, 'squid')


JOB_NET = 'pi-job-h6cut-net'


def test_restart_that_would_cut_a_job_needs_consent(world):
    """A job network attached: the restart is refused (naming how many jobs) until the operator consents."""
    client = world.client
    try:
        client.networks.get(JOB_NET).remove()
    except docker.errors.NotFound:
        pass
    client.networks.create(JOB_NET, driver='bridge', internal=True, labels=LABEL)
    try:
        client.networks.get(JOB_NET).connect(PROXY)
        # The folder's rules differ from the package again (an operator's older copy).
        with open(world.rules, 'w') as handle:
            handle.write(world.packaged + '# an older copy\n')
        edited = world.read_rules()
        before = world.inspect()['State']['StartedAt']
        backups = world.backups()
        rc, out, _recap = world.upgrade(egress_upgrade_allow_replace=True)
        assert rc != 0, out[-4000:]
        assert 'would cut 1 job attached' in out and 'egress_upgrade_allow_cut_jobs' in out, out[-4000:]
        assert world.read_rules() == edited and world.backups() == backups  # nothing written
        assert world.inspect()['State']['StartedAt'] == before  # not restarted
        # With consent: refreshed with a backup, restarted, and the job network is still attached.
        rc, out, _recap = world.upgrade(egress_upgrade_allow_replace=True, egress_upgrade_allow_cut_jobs=True)
        assert rc == 0, out[-4000:]
        assert 'restarted: localhost' in out, out[-4000:]
        assert world.read_rules() == world.packaged
        assert len(world.backups()) == len(backups) + 1
        after = world.inspect()
        assert after['State']['StartedAt'] != before
        assert JOB_NET in after['NetworkSettings']['Networks']
        world.wait_healthy()
        assert world.get('http://plain.test/') == (401, 'upstream')
    finally:
        net = client.networks.get(JOB_NET)
        try:
            net.disconnect(PROXY, force=True)
        except docker.errors.APIError:
            pass
        net.remove()
