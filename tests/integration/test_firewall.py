"""The host firewall layer on the real engine and this machine's real iptables.

The firewall is shared with other people's tests on this machine, so every rule
here is scoped: a test-only chain prefix (``PIT<SUFFIX>``), a test-only pool
(``10.249.0.0/24``) and the networks this file created (``networks``). A
finalizer removes the layer (``state: absent`` through the Python API) even
when a test fails, and a listener this file started is stopped by its pid.

Traffic goes only to what this file started: a throwaway listener on 0.0.0.0
of this machine (a high port), the fake upstream's ``.test`` names through the
proxy, and the doctor with ``.test`` names. A real ``dockerd`` restart is NOT
exercised (other people's tests run on this daemon): what a restart does to
this layer (DOCKER-USER re-created without our jump) is simulated by deleting
our jump from DOCKER-USER.
"""

import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest

from conftest import SUFFIX, doctor_objects_left, run_playbook

docker = pytest.importorskip('docker')

from ansible_collections.pi_dispatch.egress.plugins.module_utils._firewall import host as fw_host  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils._firewall import rules as fw_rules  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils._firewall import table as fw_table  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as _jobnet  # noqa: E402


PREFIX = ('PIT' + re.sub(r'[^A-Z0-9]', '-', SUFFIX.upper()))[:19]
POOL = '10.249.0.0/24'
JOB_ID = 'fwt%s-gw' % re.sub(r'[^a-z0-9]', '', SUFFIX.lower())
ENDPOINT = {'id': 'fw-models', 'host': 'models.test', 'port': 8443, 'slots': 1, 'keyless': True}
REPORT_DIR = os.environ.get('PI_FW_REPORT_DIR', '/tmp/pi-fw-report%s' % SUFFIX)

# alone: the absent test compares the host's whole iptables-save, and Docker rewrites its own IPv4 FORWARD
# rules (the DOCKER-USER jump) whenever any network comes or goes: other workers' networks did show there.
pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason='the host firewall layer needs root'), pytest.mark.alone]


def report(name, text):
    os.makedirs(REPORT_DIR, exist_ok=True)
    with open(os.path.join(REPORT_DIR, name), 'w') as handle:
        handle.write(text)


def save(family='ipv4'):
    cmd = 'iptables-save' if family == 'ipv4' else 'ip6tables-save'
    return subprocess.run([cmd], stdout=subprocess.PIPE, check=True, timeout=30).stdout.decode()


def ours(text):
    return '\n'.join(line for line in text.splitlines() if PREFIX in line) + '\n'


def remove_layer():
    """The finalizer: state absent for the test prefix only (both families)."""
    return fw_host.converge([], fw_host.Runner(), state='absent', prefix=PREFIX)


class World(object):
    pass


def gateway_of(attrs):
    import ipaddress
    cfg = attrs['IPAM']['Config'][0]
    if cfg.get('Gateway'):
        return cfg['Gateway'].split('/')[0]
    return str(next(ipaddress.ip_network(cfg['Subnet']).hosts()))


def _free_port():
    sock = socket.socket()
    sock.bind(('0.0.0.0', 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


LISTENER = r'''
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('0.0.0.0', int(sys.argv[1]))); s.listen(16); s.settimeout(1)
import time; end = time.monotonic() + 1800
while time.monotonic() < end:
    try:
        c, a = s.accept()
    except socket.timeout:
        continue
    print('conn', a[0], flush=True)
    c.sendall(b'HTTP/1.0 200 OK\r\nContent-Length: 6\r\n\r\nFWTOK\n'); c.close()
'''


@pytest.fixture(scope='module')
def world(egress_env, tmp_path_factory):
    """A job network from the test pool with a job container, a listener on 0.0.0.0; cleaned up always."""
    client = egress_env.client
    w = World()
    w.env = egress_env
    remove_layer()  # a killed earlier run of this file (same prefix)
    w.container = _jobnet.container_name(JOB_ID)
    try:
        client.api.remove_container(w.container, force=True)
    except docker.errors.NotFound:
        pass
    try:
        _jobnet.teardown_job_network(client, JOB_ID, proxy_name=egress_env.proxy)
    except Exception:
        pass
    jn = _jobnet.create_job_network(client, JOB_ID, proxy_name=egress_env.proxy, pool=POOL, prefix=29)
    w.net = jn.network
    attrs = client.api.inspect_network(w.net)
    w.gateway = gateway_of(attrs)
    w.bridge = fw_rules.bridge_of(attrs)
    client.containers.run(egress_env.tools_image, ['sleep', '1800'], name=w.container, detach=True, network=w.net,
                          labels={'io.pi-dispatch.egress.test': 'firewall'})
    w.before = {'ipv4': save('ipv4'), 'ipv6': save('ipv6')}   # before any layer, with this file's network
    w.port = _free_port()
    w.log = str(tmp_path_factory.mktemp('fw') / 'listener.log')
    w.listener = subprocess.Popen([sys.executable, '-c', LISTENER, str(w.port)], stdout=open(w.log, 'w'),
                                  stderr=subprocess.STDOUT)
    time.sleep(0.5)
    try:
        yield w
    finally:
        remove_layer()
        if w.listener.poll() is None:
            os.kill(w.listener.pid, 15)
            w.listener.wait(10)
        try:
            client.api.remove_container(w.container, force=True)
        except docker.errors.NotFound:
            pass
        _jobnet.teardown_job_network(client, JOB_ID, proxy_name=egress_env.proxy)
        assert PREFIX not in save('ipv4') and PREFIX not in save('ipv6')
        # While attached, this file's network (outside the job pool) had its gateway in the destination
        # guard: render the guard again so the shared world is as the other files expect it.
        rc, out, _recap = egress_env.site(egress_proxy_gc_at_start=False)
        assert rc == 0, out[-3000:]


def dial(w, host=None):
    """From the job container, directly (no proxy), to the listener on its gateway: (curl rc, body)."""
    container = w.env.client.containers.get(w.container)
    script = "curl -sS --noproxy '*' --connect-timeout 3 --max-time 5 http://%s:%d/; echo \" rc=$?\"" % (
        host or w.gateway, w.port)
    rc, out = container.exec_run(['sh', '-c', script])
    text = out.decode('utf-8', 'replace')
    match = re.search(r' rc=(\d+)', text)
    return (int(match.group(1)) if match else -1), text


def layer_vars(w, **more):
    extra = dict(egress_firewall_enabled=True, egress_firewall_chain_prefix=PREFIX, egress_firewall_pool=POOL,
                 egress_firewall_networks=[w.net, w.env.job_net], egress_firewall_limit_upstream=True,
                 egress_proxy_gc_at_start=False)
    extra.update(more)
    return extra


def site(w, check=False, **more):
    return w.env.site(check=check, **layer_vars(w, **more))


def firewall_task_status(out):
    """'ok' or 'changed' of the firewall role's module task in a playbook's output."""
    index = out.find("TASK [pi_dispatch.egress.firewall : Write or remove the layer's chains and jumps]")
    assert index >= 0, out[-3000:]
    match = re.search(r'^(ok|changed|fatal|skipping): \[localhost\]', out[index:], re.M)
    return match.group(1) if match else None


def doctor(w, tmp_path, name, **more):
    json_path = tmp_path / ('%s.jsonl' % name)
    extra = {
        'egress_proxy_name': w.env.proxy, 'egress_deploy_dir': w.env.deploy_dir,
        'doctor_probe_image': w.env.tools_image, 'doctor_provider_host': 'api.provider.test',
        'doctor_deny_host': 'denied.test', 'doctor_listed_host': 'api.provider.test', 'doctor_probe_timeout': 5,
        'doctor_squid_mirror': False, 'egress_job_network_pool': POOL, 'egress_firewall_chain_prefix': PREFIX,
        'doctor_json_path': str(json_path),
    }
    extra.update(more)
    rc, out, _recap = run_playbook('playbooks/doctor.yml', extra, timeout=300)
    report('doctor-%s.log' % name, out)
    assert json_path.exists(), out[-4000:]
    lines = [json.loads(text) for text in json_path.read_text().splitlines() if text.strip()]
    return rc, out, dict((line['id'], line) for line in lines)


# --- both iptables variants, in a throwaway network namespace (touches nothing of the host) ------------------

@pytest.mark.parametrize('variant', ['legacy', 'nft'])
def test_both_variants_install_idempotent_absent_identical(variant):
    ns = 'pi-fwt%s-%s' % (re.sub(r'[^a-z0-9]', '', SUFFIX.lower()), variant)
    subprocess.run(['ip', 'netns', 'del', ns], stderr=subprocess.DEVNULL, check=False)
    subprocess.run(['ip', 'netns', 'add', ns], check=True)
    try:
        run = fw_host.Runner(netns=ns)
        run.run(['iptables-%s' % variant, '-N', 'DOCKER-USER'])
        run.run(['iptables-%s' % variant, '-A', 'DOCKER-USER', '-j', 'RETURN'])
        before = [run.run(['%s-%s-save' % (tool, variant)])[1] for tool in ('iptables', 'ip6tables')]
        nets = [dict(Name='pi-job-1-net', Id='a' * 64, Driver='bridge', IPAM={'Config': [{'Subnet': '10.47.0.0/29'}]}),
                dict(Name='pi-dispatch-egress-out', Id='b' * 64, Driver='bridge')]
        kwargs = dict(prefix=PREFIX, pool='10.47.0.0/16', base_ports=[80, 443], endpoint_port_list=[8443],
                      endpoints=True, variant=variant)
        first = fw_host.converge(nets, run, **kwargs)
        assert first['changed'] and first['families']['ipv4']['variant'] == variant
        assert not fw_host.converge(nets, run, **kwargs)['changed']
        check = fw_host.converge(nets, run, state='absent', prefix=PREFIX, variant=variant, check_mode=True)
        assert check['changed'] and PREFIX in run.run(['iptables-%s-save' % variant])[1]   # check mode changed nothing
        assert fw_host.converge(nets, run, state='absent', prefix=PREFIX, variant=variant)['changed']
        after = [run.run(['%s-%s-save' % (tool, variant)])[1] for tool in ('iptables', 'ip6tables')]
        assert fw_table.strip_counters(after[0]) == fw_table.strip_counters(before[0])
        if variant == 'legacy' and not before[1]:
            # iptables-legacy cannot unload a table: the IPv6 filter table the layer made stays, empty (documented).
            assert fw_table.strip_counters(after[1]) == ('*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n'
                                                         ':OUTPUT ACCEPT [0:0]\nCOMMIT\n')
        else:
            assert fw_table.strip_counters(after[1]) == fw_table.strip_counters(before[1])
    finally:
        subprocess.run(['ip', 'netns', 'del', ns], check=False)


# --- the real host ------------------------------------------------------------------------------------------

def test_gateway_answers_with_the_layer_off_and_not_with_it_on(world):
    w = world
    rc, text = dial(w)
    assert rc == 0 and 'FWTOK' in text, text          # --internal does not hide the host: it answered
    report('probe-before.txt', 'layer off: curl http://%s:%d/ from %s -> rc %d %r\n'
           % (w.gateway, w.port, w.container, rc, text))
    rc_site, out, _recap = site(w)
    assert rc_site == 0, out[-6000:]
    assert firewall_task_status(out) == 'changed', out[-3000:]
    seen_before = open(w.log).read().count('conn')
    rc, text = dial(w)
    assert rc == 28, text                              # dropped: a timeout, not a refusal
    assert open(w.log).read().count('conn') == seen_before   # the listener never saw it
    report('probe-after.txt', 'layer on: curl http://%s:%d/ from %s -> rc %d %r\n'
           % (w.gateway, w.port, w.container, rc, text))
    report('iptables-save-ours.txt', ours(save('ipv4')) + '# ip6tables-save\n' + ours(save('ipv6')))
    # Idempotent, and check mode + diff predicts no change.
    rc_site, out, _recap = site(w)
    assert rc_site == 0 and firewall_task_status(out) == 'ok', out[-3000:]
    rc_site, out, _recap = site(w, check=True)
    assert rc_site == 0 and firewall_task_status(out) == 'ok', out[-3000:]


def test_proxy_path_still_works_with_the_layer_on(world):
    w = world
    env = w.env
    assert PREFIX + '-INPUT' in save('ipv4')
    ok = env.curl(['https://api.provider.test/'])
    assert ok['code'] == 401, ok['raw']                # an allowed host through the proxy
    denied = env.curl(['https://denied.test/'])
    assert denied['connect'] == 403, denied['raw']
    extra = {'egress_deploy_dir': env.deploy_dir, 'egress_proxy_name': env.proxy, 'egress_model_endpoints': [ENDPOINT]}
    rc, out, _recap = run_playbook('playbooks/endpoints.yml', extra)
    assert rc == 0, out[-4000:]
    try:
        rc, out, _recap = site(w)
        assert rc == 0, out[-4000:]
        assert '--dports 80,443,8443 -j RETURN' in save('ipv4')    # the declared endpoint port is allowed
        model = env.curl(['https://models.test:8443/v1/models'])
        assert (model['rc'], model['connect'], model['code']) == (0, 200, 200), model['raw']
        # The proxy's own traffic off its upstream network: a host port that is not allowed is dropped.
        proxy = env.client.containers.get(env.proxy)
        up = gateway_of(env.client.api.inspect_network(env.upstream_net))
        rc, out = proxy.exec_run(['bash', '-c', 'timeout 4 bash -c "exec 3<>/dev/tcp/%s/%d" && echo open || echo '
                                                'rc=$?' % (up, w.port)])
        assert b'rc=124' in out, out                   # a timeout: dropped (the listener answers everyone else)
    finally:
        rc, out, _recap = run_playbook('playbooks/endpoints.yml', dict(extra, egress_model_endpoints=[]))
        assert rc == 0, out[-4000:]
        site(w)


def test_doctor_with_the_layer_on(world, tmp_path):
    rc, out, by_id = doctor(world, tmp_path, 'layer-on')
    assert rc == 0, out[-4000:]
    for line_id in ('canary.provider', 'canary.deny', 'canary.plain', 'isolation.peers', 'firewall.current',
                    'firewall.probe_silent'):
        assert by_id[line_id]['status'] == 'ok', (line_id, by_id.get(line_id), out[-3000:])
    assert not doctor_objects_left(world.env.client)


def test_restart_simulated_doctor_reports_the_missing_jump_and_site_restores_it(world, tmp_path):
    """What a dockerd restart does (DOCKER-USER re-created, our jump gone), simulated: a real restart is not run."""
    forward = PREFIX + '-FORWARD'
    subprocess.run(['iptables', '-w', '10', '-D', 'DOCKER-USER', '-j', forward], check=True)
    assert '-A DOCKER-USER -j %s' % forward not in save('ipv4')
    rc, out, by_id = doctor(world, tmp_path, 'jump-missing', doctor_firewall_probe=False)
    assert rc != 0                                     # a ✗ fails the play
    line = by_id['firewall.jump_missing']
    assert line['status'] == 'fail' and 'DOCKER-USER -> %s' % forward in line['message'], line
    rc, site_out, _recap = site(world)
    assert rc == 0 and firewall_task_status(site_out) == 'changed', site_out[-3000:]
    assert 'insert the jump DOCKER-USER -> %s (rule 1)' % forward in site_out
    table = fw_table.parse_save(save('ipv4'))['filter']
    assert table.rules['DOCKER-USER'][0] == '-A DOCKER-USER -j %s' % forward
    report('restart-recovery.txt', 'doctor after the jump was deleted:\n  %s %s\n  fix: %s\n\nsite.yml:\n%s\n' % (
        line['status'], line['message'], line['fix'],
        '\n'.join(x for x in site_out.splitlines() if 'jump' in x or PREFIX in x)))
    rc, out, by_id = doctor(world, tmp_path, 'restored', doctor_firewall_probe=False)
    assert by_id['firewall.current']['status'] == 'ok', out[-3000:]


def test_persistence_unit_restores_the_layer(world, tmp_path):
    """The restore files and unit the role writes bring the layer back on a table without it (a boot)."""
    persist, units = tmp_path / 'persist', tmp_path / 'units'
    units.mkdir()
    rc, out, _recap = site(world, egress_firewall_persist=True, egress_firewall_persist_dir=str(persist),
                           egress_firewall_unit_dir=str(units))
    assert rc == 0, out[-3000:]
    unit = (units / 'pi-dispatch-egress-firewall.service').read_text()
    assert 'After=docker.service' in unit and 'PartOf=docker.service' in unit
    written = ours(save('ipv4'))
    remove_layer()
    assert PREFIX not in save('ipv4')
    for line in unit.splitlines():
        if line.startswith('ExecStartPre=-'):
            subprocess.run(line.split('=', 1)[1][1:].split(), check=False, stderr=subprocess.DEVNULL)
        elif line.startswith('ExecStart='):
            subprocess.run(line.split('=', 1)[1].split(), check=True)
    assert ours(save('ipv4')) == written
    rc, out, _recap = site(world)
    assert rc == 0 and firewall_task_status(out) == 'ok', out[-3000:]


def test_absent_leaves_iptables_save_as_before(world, tmp_path):
    w = world
    rc, out, _recap = site(w, egress_firewall_state='absent')
    assert rc == 0 and firewall_task_status(out) == 'changed', out[-3000:]
    after = {'ipv4': save('ipv4'), 'ipv6': save('ipv6')}
    for family in ('ipv4', 'ipv6'):
        assert PREFIX not in after[family]
        before_t = fw_table.parse_save(w.before[family]).get('filter')
        after_t = fw_table.parse_save(after[family]).get('filter')
        for chain in ('INPUT', 'DOCKER-USER', 'FORWARD'):
            if before_t is not None and chain in before_t.chains:
                if chain == 'FORWARD' and family == 'ipv4':
                    continue   # Docker adds FORWARD rules for other people's networks as they come and go
                assert after_t.rules.get(chain) == before_t.rules.get(chain), (family, chain)
    # The whole save, minus counters, with lines of bridges this file did not make (other tests' networks
    # come and go on this shared daemon) left out on both sides.
    mine = {w.bridge}

    # Docker owns the IPv4 FORWARD chain and re-inserts its own "-j DOCKER-USER" jump at the top of it
    # whenever a network is created (the site runs above create canary networks), so the order of FORWARD
    # rules moves with other networks; this module never writes to the IPv4 FORWARD chain. That chain is
    # compared as a multiset (every rule still there, none added), every other line in order.
    def comparable(text, family):
        keep, forward = [], []
        for line in fw_table.strip_counters(text).splitlines():
            bridges = set(re.findall(r'br-[0-9a-f]{12}', line))
            if bridges - mine:
                continue
            if family == 'ipv4' and line.startswith('-A FORWARD '):
                forward.append(line)
                continue
            keep.append(line)
        return keep, sorted(forward)
    identical = {f: fw_table.strip_counters(w.before[f]) == fw_table.strip_counters(after[f]) for f in after}
    report('absent-compare.txt', 'byte-identical minus counters: %r\n' % identical)
    assert comparable(w.before['ipv6'], 'ipv6') == comparable(after['ipv6'], 'ipv6')
    assert comparable(w.before['ipv4'], 'ipv4') == comparable(after['ipv4'], 'ipv4')
    rc, text = dial(w)
    assert rc == 0 and 'FWTOK' in text, text          # off again: the gateway answers


def test_doctor_with_the_layer_off_says_answered(world, tmp_path):
    rc, out, by_id = doctor(world, tmp_path, 'layer-off')
    assert rc == 0, out[-4000:]
    assert by_id['firewall.off']['status'] == 'notrun'
    answered = by_id['firewall.probe_answered']
    assert answered['status'] == 'warn' and 'egress_firewall_enabled' in answered['message'], answered
    assert not doctor_objects_left(world.env.client)
