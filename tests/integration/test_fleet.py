"""Fleet operations on a fleet: three hosts, each with its own Docker Engine, reached over SSH.

The fleet (tests/integration/fleet.py) is engine-a, engine-b and engine-c. ``site.yml`` deploys
all three in one play. Then, in file order:

1. a host whose Python lacks the Docker SDK fails the host check with the fix, not a traceback;
2. ``upgrade.yml`` with ``serial: 1`` and ``max_fail_percentage: 0`` refreshes the rules from a
   staged file; engine-b's staged file is one squid refuses, so its new proxy does not become
   healthy: engine-b is rolled back to a working proxy on its old rules, the rollout stops,
   engine-a stays upgraded, engine-c is not reached, and the summary (table and JSON) says so;
   each host's state is read from its own engine;
3. the fault fixed, the same command finishes the rollout;
4. ``doctor.yml`` across the fleet with engine-c's proxy stopped and a fourth inventory host
   that does not exist: one report, every host's lines, a non-zero exit;
5. ``site.yml --check --diff`` reports each host's drift (a hand-edited rules file, a stopped
   proxy, a proxy setting changed by hand) and changes nothing.

Every probe targets .test names served by a fake upstream inside each host's engine, on its
``--internal`` upstream network; the fleet network itself is ``--internal``.
"""

import json
import os
import re

import pytest

from conftest import ROOT, ansible_env, docker

import fleet as fleetlib

pytestmark = pytest.mark.integration

HOSTS = ['engine-a', 'engine-b', 'engine-c']
DEPLOY = '/opt/pi-dispatch/egress'
RULES = DEPLOY + '/deploy/egress-proxy.conf'
STAGED = '/root/staged-egress-proxy.conf'
PROXY = 'pi-dispatch-egress-proxy'
MARK = '# fleet rollout 2: staged by the fleet test\n'
BROKEN_LINE = 'http_access allow pi_no_such_acl\n'
REPORT_DIR = os.environ.get('PI_DOCTOR_REPORT_DIR')


class World(object):
    def __init__(self, fleet, tmp):
        self.fleet = fleet
        self.tmp = tmp
        self.env = ansible_env()

    def play(self, playbook, extra, **kwargs):
        return fleetlib.run_playbook(ROOT, kwargs.pop('inventory', self.fleet.inventory), playbook, extra,
                                     self.env, **kwargs)

    def read(self, host, path):
        rc, out = self.fleet.exec(host, ['cat', path])
        assert rc == 0, out
        return out

    def write(self, host, path, text):
        rc, out = self.fleet.exec(host, ['sh', '-c', 'cat > "$0"', path], stdin=text)
        assert rc == 0, out

    def backups(self, host):
        rc, out = self.fleet.exec(host, ['sh', '-c', 'ls -1 %s.bak-* 2>/dev/null || true' % RULES])
        return [line for line in out.splitlines() if line.strip()]

    def proxy(self, host):
        return self.fleet.engine(host).api.inspect_container(PROXY)


@pytest.fixture(scope='module')
def world(tmp_path_factory):
    client = docker.from_env(timeout=600)
    for image in (fleetlib.FLEET_IMAGE, fleetlib.PROXY_IMAGE, fleetlib.TOOLS_IMAGE, fleetlib.BASE_IMAGE):
        try:
            client.images.get(image)
        except docker.errors.ImageNotFound:
            pytest.fail('Image %s is missing. Build it with: ansible-playbook tests/images/build.yml '
                        '(./run test does).' % image)
    fleet = fleetlib.Fleet(client, str(tmp_path_factory.mktemp('fleet')), HOSTS)
    fleet.start()
    w = World(fleet, str(tmp_path_factory.mktemp('fleet-out')))
    try:
        rc, out, recap = w.play('playbooks/site.yml', fleetlib.site_vars())
        assert rc == 0, out[-6000:]
        assert sorted(recap) == HOSTS and all(r['failed'] == 0 for r in recap.values()), recap
        w.packaged = w.read('engine-a', RULES)
        yield w
    finally:
        fleet.remove()


def test_site_deploys_every_host_on_its_own_engine(world):
    for host in HOSTS:
        state = world.proxy(host)['State']
        assert state['Running'] is True and state['Health']['Status'] == 'healthy', (host, state)
        assert world.read(host, RULES) == world.packaged
    ids = set(world.proxy(host)['Id'] for host in HOSTS)
    assert len(ids) == 3  # three engines, three proxies


def test_a_host_without_the_docker_sdk_fails_the_host_check_with_the_fix(world):
    rc, out, recap = world.play('playbooks/site.yml', dict(fleetlib.site_vars(),
                                ansible_python_interpreter='/opt/nosdk/bin/python'), check=True, limit='engine-a')
    assert rc != 0
    assert recap['engine-a']['failed'] == 1
    assert 'the Docker SDK for Python is missing from /opt/nosdk/bin/python on this host' in out, out[-3000:]
    assert 'apt-get install python3-docker' in out
    assert 'Traceback' not in out, out[-3000:]
    assert 'Check this host' in out  # it was the host check that stopped it, before any egress module


def test_rollout_stops_at_the_host_that_fails_and_rolls_it_back(world):
    world.before_c = world.proxy('engine-c')['Id']
    for host in HOSTS:
        world.write(host, STAGED, world.packaged + MARK + (BROKEN_LINE if host == 'engine-b' else ''))
    summary = os.path.join(world.tmp, 'summary-1.json')
    rc, out, recap = world.play('playbooks/upgrade.yml', dict(
        egress_hosts='egress', egress_upgrade_serial=1, egress_upgrade_max_fail_percentage=0,
        egress_upgrade_refresh_rules=True, egress_upgrade_rules_source=STAGED,
        egress_proxy_install_debootstrap=False,  # the upgrade runs the image step, as site.yml does
        egress_upgrade_summary_json=summary))
    _keep(out, 'upgrade-fleet.log')
    assert rc != 0, out[-6000:]
    assert 'engine-c' not in recap or recap['engine-c']['ok'] == 0, recap
    # engine-a: upgraded, its old rules kept as the one backup, the proxy healthy on the new rules
    assert world.read('engine-a', RULES) == world.packaged + MARK
    backups = world.backups('engine-a')
    assert len(backups) == 1 and world.read('engine-a', backups[0]) == world.packaged
    # engine-b: rolled back to its old rules (the backup kept), a working proxy on them
    assert world.read('engine-b', RULES) == world.packaged, out[-6000:]
    backups = world.backups('engine-b')
    assert len(backups) == 1 and world.read('engine-b', backups[0]) == world.packaged
    # engine-c: not reached, nothing written, the same proxy
    assert world.read('engine-c', RULES) == world.packaged
    assert world.backups('engine-c') == []
    assert world.proxy('engine-c')['Id'] == world.before_c
    for host in HOSTS:
        state = world.proxy(host)['State']
        assert state['Running'] is True and state['Health']['Status'] == 'healthy', (host, state)
    with open(summary) as handle:
        rows = dict((row['host'], row) for row in json.load(handle)['hosts'])
    assert [rows[h]['outcome'] for h in HOSTS] == ['upgraded', 'rolled back', 'not reached'], rows
    table = out[out.rfind('Summary of the egress upgrade'):]
    for host, outcome in (('engine-a', 'upgraded'), ('engine-b', 'rolled back'), ('engine-c', 'not reached')):
        assert any(host in line and outcome in line for line in table.splitlines()), table[:3000]


def test_rerun_after_the_fault_is_fixed_finishes_the_rollout(world):
    world.write('engine-b', STAGED, world.packaged + MARK)
    summary = os.path.join(world.tmp, 'summary-2.json')
    rc, out, _recap = world.play('playbooks/upgrade.yml', dict(
        egress_hosts='egress', egress_upgrade_serial=1, egress_upgrade_max_fail_percentage=0,
        egress_upgrade_refresh_rules=True, egress_upgrade_rules_source=STAGED,
        egress_proxy_install_debootstrap=False,  # the upgrade runs the image step, as site.yml does
        egress_upgrade_summary_json=summary))
    assert rc == 0, out[-6000:]
    for host in HOSTS:
        assert world.read(host, RULES) == world.packaged + MARK, host
        state = world.proxy(host)['State']
        assert state['Running'] is True and state['Health']['Status'] == 'healthy', (host, state)
    assert len(world.backups('engine-a')) == 1  # nothing more to refresh there
    with open(summary) as handle:
        rows = dict((row['host'], row) for row in json.load(handle)['hosts'])
    assert rows['engine-a']['outcome'] == 'unchanged', rows
    assert rows['engine-b']['outcome'] == 'upgraded' and rows['engine-c']['outcome'] == 'upgraded', rows


def test_doctor_across_the_fleet_gives_one_report_with_the_broken_and_the_unreachable_host(world):
    world.fleet.engine('engine-c').api.stop(PROXY, timeout=10)
    # a fourth host on the (internal) fleet network that nothing answers: nothing leaves the machine
    inventory = world.fleet.write_inventory(
        extra_hosts=['engine-gone ansible_host=%s' % world.fleet.unused_address()],
        path=os.path.join(world.tmp, 'inventory-with-gone.ini'))
    report = os.path.join(world.tmp, 'doctor-fleet.json')
    rc, out, recap = world.play('playbooks/doctor.yml', fleetlib.doctor_vars(egress_doctor_report_json=report),
                                inventory=inventory)
    _keep(out, 'doctor-fleet.log')
    print(out[out.find('Fleet report of the egress doctor'):][:6000])  # the report, for the record
    assert rc != 0, out[-6000:]
    # kept in the play as a row (its connection failure ignored there), not a crash
    assert recap['engine-gone']['failed'] == 0 and recap['engine-gone']['ignored'] == 1, recap
    with open(report) as handle:
        doc = json.load(handle)
    rows = dict((row['host'], row) for row in doc['hosts'])
    assert sorted(rows) == sorted(HOSTS + ['engine-gone'])
    assert rows['engine-a']['status'] == 'ok' and rows['engine-b']['status'] == 'ok', rows
    assert rows['engine-c']['status'] == 'fail', rows['engine-c']
    assert rows['engine-c']['failed_lines'], rows['engine-c']
    assert rows['engine-gone']['status'] == 'unreachable', rows['engine-gone']
    assert 'ssh' in rows['engine-gone']['reason'].lower(), rows['engine-gone']  # the connection's own message
    assert doc['failed'] is True
    assert doc['totals']['hosts'] == {'ok': 2, 'fail': 1, 'unreachable': 1, 'not run': 0}, doc['totals']
    # each reached host's own lines are in the one report: the canary reached the provider on a and b
    for host in ('engine-a', 'engine-b'):
        ids = [line['id'] for line in rows[host]['lines']]
        assert any(i.startswith('canary.') for i in ids), ids
    assert '== engine-c: fail ==' in out and '== engine-gone: unreachable ==' in out, out[-6000:]
    world.fleet.engine('engine-c').api.start(PROXY)


def test_site_check_diff_reports_each_hosts_drift_and_changes_nothing(world):
    edited = world.read('engine-a', RULES) + '# hand edit on engine-a\n'
    world.write('engine-a', RULES, edited)
    world.fleet.engine('engine-b').api.stop(PROXY, timeout=10)
    engine_c = world.fleet.engine('engine-c')
    engine_c.api.update_container(PROXY, mem_limit='1g', memswap_limit='1g')
    before = dict((host, world.proxy(host)) for host in HOSTS)
    rc, out, recap = world.play('playbooks/site.yml', fleetlib.site_vars(), check=True)
    _keep(out, 'site-drift.log')
    assert rc == 0, out[-6000:]
    drift = dict((host, _drift_of(out, host)) for host in HOSTS)
    assert 'differs from the packaged copy' in drift['engine-a']['rules'], drift
    # the diff of the rules file, from the folder's copy to the packaged one: the edit is a removal
    shown = out[out.find('Show how the rules differ'):]
    assert '-# hand edit on engine-a' in shown, shown[:3000]
    assert drift['engine-a']['proxy'] == 'as wanted', drift
    assert drift['engine-b']['proxy'].startswith('would start'), drift
    assert drift['engine-c']['proxy'].startswith('would ') and 'memory' in drift['engine-c']['proxy'], drift
    assert recap['engine-b']['changed'] >= 1 and recap['engine-c']['changed'] >= 1, recap
    # nothing changed: the edit is there, b is still stopped, c still has the hand-set memory
    assert world.read('engine-a', RULES) == edited
    after = dict((host, world.proxy(host)) for host in HOSTS)
    for host in HOSTS:
        assert after[host]['Id'] == before[host]['Id'], host
    assert after['engine-b']['State']['Running'] is False
    assert after['engine-c']['HostConfig']['Memory'] == 1024 ** 3


def _keep(out, name):
    """The play's output into $PI_DOCTOR_REPORT_DIR (when set), for the record."""
    if REPORT_DIR:
        with open(os.path.join(REPORT_DIR, name), 'w') as handle:
            handle.write(out)


def _drift_of(out, host):
    """The 'rules:' and 'proxy:' lines of ``host``'s drift report in the play output (YAML, wrapped)."""
    start = out.find('Drift of %s (' % host)
    assert start >= 0, out[-6000:]
    flat = ' '.join(out[start:start + 3000].split())
    found = re.search(r"- '?rules: (.*?)'? - '?proxy: (.*?)'?(?: ok:| TASK| PLAY| - |$)", flat)
    assert found, flat
    return dict(rules=found.group(1), proxy=found.group(2))
