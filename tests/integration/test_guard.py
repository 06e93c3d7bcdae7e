"""The proxy is never a bridge (issue 12), its container is hardened and cannot drift, and a step
that cuts jobs needs consent (issue 17), on the real engine.

A proxy of this file's own (``pi-dispatch-egress-proxy-guard<suffix>``) shares the session's
internal upstream network and fake upstream. Before it is deployed, a *peer* job network from the
job pool holds another job's server (the fake upstream image, alias ``peer.forge.test``), and a
*client* job network from the pool holds the client. The proxy's extra hosts point listed names
(``.forge.test`` is listed) at that peer, at the peer network's gateway, at the upstream network's
gateway, at the host (``host-gateway``) and at a private address nobody opened. Only the session's
upstream subnet (the fake's) is in ``egress_private_destinations``.

No packet leaves the machine: every network here is ``--internal``, and the refused addresses are
never connected to (squid refuses before it connects; the test asserts squid's own 403).
"""

import ipaddress
import json
import os
import time

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import venue as _venue
from conftest import (TUNNEL_SCRIPT, EgressEnv, SUFFIX, TOOLS_IMAGE, create_pool_network, run_playbook, tls_attempt,
                      _remove_container, _remove_network)

from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import decisions as _decisions

pytestmark = pytest.mark.integration

PROXY = 'pi-dispatch-egress-proxy-guard' + SUFFIX
PEER_NET = 'pi-job-guardpeer%s-net' % SUFFIX.replace('-', '')
CLIENT_NET = 'pi-job-guardcli%s-net' % SUFFIX.replace('-', '')
PEER = 'pi-egress-guard-peer' + SUFFIX
CLIENT = 'pi-egress-guard-client' + SUFFIX
# A private address outside egress_private_destinations (the upstream subnet the tests open), never
# connected to: the first of these outside that subnet. Docker's default pools hand out
# 192.168.0.0/16 too, so a fixed one can fall inside the opened upstream network.
LAN_CANDIDATES = ('192.168.77.10', '10.250.77.10', '172.16.77.10')


def lan_address(opened):
    net = ipaddress.ip_network(opened)
    return next(a for a in LAN_CANDIDATES if ipaddress.ip_address(a) not in net)


LABEL = {'io.pi-dispatch.egress.test': 'guard'}


def _gateway(client, name):
    import ipaddress
    net = client.networks.get(name)
    net.reload()
    config = net.attrs['IPAM']['Config'][0]
    # A network made with only a subnet has no Gateway key: Docker takes the first address.
    gateway = config.get('Gateway') or str(next(ipaddress.ip_network(config['Subnet']).hosts()))
    return gateway, config['Subnet']


def _pool_network(client, name):
    create_pool_network(client, name, labels=dict(LABEL))
    return _gateway(client, name)


class GuardWorld(EgressEnv):
    def __init__(self, env, deploy_dir):
        super(GuardWorld, self).__init__(env.client, deploy_dir)
        self.proxy = PROXY
        self.proxy_url = 'http://%s:3128' % PROXY
        self.client_container = CLIENT
        self.upstream_net = env.upstream_net
        self.upstream_subnet = _gateway(env.client, env.upstream_net)[1]

    def vars(self, **more):
        out = {
            'egress_deploy_dir': self.deploy_dir,
            'egress_proxy_name': PROXY,
            'egress_proxy_upstream_network': self.upstream_net,
            'egress_proxy_network_internal': True,
            'egress_allowlist_seed': self.allowlist,
            'egress_proxy_install_debootstrap': False,
            'egress_proxy_extra_hosts': self.extra_hosts,
            'egress_private_destinations': [self.upstream_subnet],
            'egress_proxy_gc_at_start': False,
        }
        out.update(more)
        return out

    def site(self, check=False, **more):
        return run_playbook('playbooks/site.yml', self.vars(**more), check=check)

    def attach(self):
        for name in (PEER_NET, CLIENT_NET):
            net = self.client.networks.get(name)
            net.reload()
            if PROXY not in [c['Name'] for c in (net.attrs.get('Containers') or {}).values()]:
                net.connect(PROXY)

    def wait_served(self, tries=30):
        """Bounded (30 tries, each at most 3 s plus 1 s): the client reaches the fake provider through the proxy.

        After the proxy is replaced and attached again, Podman 4.3's aardvark-dns (1.4) can leave the
        client's network without an answer for tens of seconds (measured here: up to 29 s, then it
        answers; aardvark-dns tore down every listener on each reload before 1.11,
        containers/aardvark-dns#389). The tests that follow assert what squid answers, so they start
        from a proxy the client reaches (docs/podman.md).
        """
        r = {}
        for _attempt in range(tries):
            r = self.curl(['https://api.provider.test/'], timeout=3)
            if r['code'] == 401:
                return r
            time.sleep(1)
        raise AssertionError('the client never reached the fake provider through %s: %s' % (PROXY, r['raw']))

    def inspect(self):
        return self.client.api.inspect_container(PROXY)

    def peer_requests(self):
        logs = self.client.api.logs(PEER).decode('utf-8', 'replace')
        return [line for line in logs.splitlines() if '"GET ' in line or '"CONNECT ' in line]


@pytest.fixture(scope='module')
def world(egress_env, tmp_path_factory):
    client = egress_env.client
    for name in (CLIENT, PEER, PROXY):
        _remove_container(client, name)
    for name in (PEER_NET, CLIENT_NET):
        _remove_network(client, name)
    w = GuardWorld(egress_env, str(tmp_path_factory.mktemp('guard') / 'egress'))
    try:
        peer_gw, _peer_subnet = _pool_network(client, PEER_NET)
        _pool_network(client, CLIENT_NET)
        api = client.api
        peer = api.create_container(
            TOOLS_IMAGE, ['python3', '/usr/local/bin/fake_upstream.py'], name=PEER, detach=True, labels=dict(LABEL),
            host_config=api.create_host_config(network_mode=PEER_NET),
            networking_config=api.create_networking_config({
                PEER_NET: api.create_endpoint_config(aliases=['peer.forge.test'])}))
        api.start(peer['Id'])
        peer_ip = api.inspect_container(PEER)['NetworkSettings']['Networks'][PEER_NET]['IPAddress']
        up_gw, _up_subnet = _gateway(client, egress_env.upstream_net)
        w.addresses = dict(peer=peer_ip, peer_gw=peer_gw, up_gw=up_gw)
        # The host: Docker's host-gateway; Podman (which refuses host-gateway, test_podman.py) maps its own
        # name for the host, host.containers.internal, to the gateway of the proxy's network (netavark, rootful).
        host = up_gw if egress_env.venue.is_podman else 'host-gateway'
        w.extra_hosts = ['peerip.forge.test:%s' % peer_ip, 'jobgw.forge.test:%s' % peer_gw,
                         'upgw.forge.test:%s' % up_gw, 'hostgw.forge.test:%s' % host,
                         'lan.forge.test:%s' % lan_address(egress_env.upstream_subnet)]
        rc, out, _recap = w.site()
        assert rc == 0, out[-6000:]
        w.first_output = out
        w.attach()
        client.containers.run(TOOLS_IMAGE, ['sleep', 'infinity'], name=CLIENT, detach=True, network=CLIENT_NET,
                              labels=dict(LABEL))
        w.wait_served()
        yield w
    finally:
        for name in (CLIENT, PEER, PROXY):
            _remove_container(client, name)
        for name in (PEER_NET, CLIENT_NET):
            _remove_network(client, name)


def _refused_by_squid(r):
    return r['connect'] == 403 or (r['code'] == 403 and 'X-Squid-Error: ERR_ACCESS_DENIED' in r['headers'])


def test_the_allowed_path_through_an_opened_private_range(world):
    r = world.curl(['https://api.provider.test/v1/messages'])
    assert (r['connect'], r['code']) == (200, 401), r['raw']


@pytest.mark.parametrize('name', ['peer.forge.test', 'peerip.forge.test'])
def test_a_listed_name_never_leads_to_another_job(world, name):
    before = len(world.peer_requests())
    r = world.curl(['https://%s/' % name])
    assert r['connect'] == 403, r['raw']
    plain = world.curl(['http://%s/' % name])
    assert _refused_by_squid(plain), plain['raw']
    assert 'X-Fake-Upstream' not in r['raw'] + plain['raw']
    assert len(world.peer_requests()) == before, world.peer_requests()


@pytest.mark.parametrize('name', ['jobgw.forge.test', 'upgw.forge.test', 'hostgw.forge.test', 'lan.forge.test'])
def test_a_listed_name_never_leads_to_the_host_or_an_unopened_private_range(world, name):
    r = world.curl(['https://%s/' % name])
    # squid's own refusal (403), not a connection attempt (503 ERR_CONNECT_FAIL)
    assert r['connect'] == 403, r['raw']
    plain = world.curl(['http://%s/' % name])
    assert _refused_by_squid(plain), plain['raw']
    assert 'ERR_CONNECT_FAIL' not in r['raw'] + plain['raw']


def test_the_guard_names_what_it_refuses(world):
    with open(os.path.join(world.deploy_dir, 'egress-guard.conf')) as handle:
        text = handle.read()
    assert '# Opened private ranges: %s' % world.upstream_subnet in text
    assert world.addresses['up_gw'] in text        # the upstream gateway stays refused inside the opened range
    assert '10.47.0.0/16' in text                   # the job pool
    assert 'Guard: opened %s' % world.upstream_subnet in world.first_output


def _decided(world, reason, seen, tries=20):
    """The decision records of ``reason`` beyond the first ``seen``, waited for (bounded: 20 x 0.25 s)."""
    found = []
    for _attempt in range(tries):
        records, _problems, _warnings = _decisions.read_records(os.path.join(world.deploy_dir, 'decisions'))
        found = [r for r in records if r.get('reason') == reason][seen:]
        if found:
            return found
        time.sleep(0.25)
    return found


def _count(world, reason):
    records, _problems, _warnings = _decisions.read_records(os.path.join(world.deploy_dir, 'decisions'))
    return len([r for r in records if r.get('reason') == reason])


# Issue 42, item 12. squid 6.13 parses a CONNECT authority before any ACL sees it (%[^:]:%d): what its
# parse leaves of these (a '[', an '@', a '_', an edge hyphen) is under the listed .forge.test, and
# [[www.forge.test]]:1337 even becomes port 443. Each is refused before policy, reason "authority".
# (u:p@www.forge.test:443 is read as host "u", which is not listed: refused as unlisted, measured.)
MALFORMED_AUTHORITIES = [('[[www.forge.test]]:1337', 'authority'), ('[www.forge.test:443', 'authority'),
                         ('u@www.forge.test:443', 'authority'), ('a_b.forge.test:443', 'authority'),
                         ('-x.forge.test:443', 'authority'), ('x-.forge.test:443', 'authority'),
                         ('u:p@www.forge.test:443', 'unlisted')]


@pytest.mark.parametrize('target, reason', MALFORMED_AUTHORITIES)
def test_a_malformed_connect_authority_is_refused_before_policy(world, target, reason):
    seen = _count(world, reason)
    result, reached = tls_attempt(world, CLIENT, target, 'www.forge.test')
    assert (result['connect'] or '').startswith('HTTP/1.1 403') and not reached, result
    decided = _decided(world, reason, seen)
    assert [(r['verdict'], r['reason']) for r in decided] == [('refused', reason)], decided


# What squid rewrites to the listed host:port itself (h:443:1, h:0443, h: and h all become h:443, measured)
# no ACL can tell from the canonical form: every component after squid's parse (the rules, the TLS name
# check, the decision log) reads the one canonical authority, so none reads it differently.
@pytest.mark.parametrize('target', ['api.provider.test:443:1', 'api.provider.test:0443', 'api.provider.test:',
                                    'API.provider.test:443'])
def test_an_authority_squid_rewrites_to_the_listed_host_is_read_the_same_by_every_component(world, target):
    seen = _count(world, 'sni_ok')
    result, reached = tls_attempt(world, CLIENT, target, 'api.provider.test')
    assert result['connect'].startswith('HTTP/1.1 200') and result['answer'] == 'HTTP/1.0 401 Unauthorized', result
    assert reached
    decided = _decided(world, 'sni_ok', seen)
    assert [(r['host'], r['port']) for r in decided] == [('api.provider.test', 443)], decided


def test_the_container_is_hardened(world):
    if world.venue.is_podman:
        pytest.skip("Docker's inspect spelling; test_podman.py checks the same hardening in Podman's")
    host = world.inspect()['HostConfig']
    assert host['CapDrop'] == ['ALL'] and not host['CapAdd']
    assert host['ReadonlyRootfs'] is True
    assert host['SecurityOpt'] == ['no-new-privileges:true']
    assert host['Sysctls'] == {'net.ipv4.ip_forward': '0', 'net.ipv6.conf.all.forwarding': '0'}
    assert host['Memory'] == 512 * 1024 ** 2 and host['MemorySwap'] == host['Memory']
    assert host['PidsLimit'] == 256
    assert host['LogConfig'] == {'Type': 'json-file', 'Config': {'max-size': '10m', 'max-file': '3'}}
    assert set(host['Tmpfs']) == {'/tmp', '/run/squid'}
    container = world.client.containers.get(PROXY)
    rc, out = container.exec_run(['sh', '-c', 'cat /proc/sys/net/ipv4/ip_forward; grep CapEff /proc/1/status; '
                                  'touch /etc/x 2>&1; echo touch=$?'])
    out = out.decode()
    assert out.splitlines()[0] == '0', out
    assert 'CapEff:\t0000000000000000' in out and 'touch=1' in out, out


def test_a_job_cannot_route_through_the_proxy_into_another_job_network(world):
    """Two containers that may set routes (NET_ADMIN) point each other's subnet at the proxy's address:
    with forwarding on in the proxy's namespace the packets would cross; they must not."""
    settings = world.inspect()['NetworkSettings']['Networks']
    client_net = world.client.networks.get(CLIENT_NET).attrs['IPAM']['Config'][0]['Subnet']
    peer_net = world.client.networks.get(PEER_NET).attrs['IPAM']['Config'][0]['Subnet']
    names = ['pi-egress-guard-route-a' + SUFFIX, 'pi-egress-guard-route-b' + SUFFIX]
    try:
        listener = world.client.containers.run(
            TOOLS_IMAGE, ['sh', '-c', 'ip route add %s via %s && timeout 20 nc -l 8099 </dev/null; '
                          'echo done' % (client_net, settings[PEER_NET]['IPAddress'])],
            name=names[1], detach=True, network=PEER_NET, cap_add=['NET_ADMIN'], labels=dict(LABEL))
        time.sleep(1)
        listener.reload()
        target = listener.attrs['NetworkSettings']['Networks'][PEER_NET]['IPAddress']
        out = world.client.containers.run(
            TOOLS_IMAGE, ['sh', '-c', 'ip route add %s via %s && echo hi | timeout 5 nc -w 3 %s 8099; echo rc=$?'
                          % (peer_net, settings[CLIENT_NET]['IPAddress'], target)],
            name=names[0], network=CLIENT_NET, cap_add=['NET_ADMIN'], labels=dict(LABEL), remove=False)
        out = out.decode()
        assert 'rc=0' not in out, out
        listener.reload()
        assert 'hi' not in world.client.api.logs(names[1]).decode(), 'a packet crossed the proxy'
    finally:
        for name in names:
            _remove_container(world.client, name)


def test_a_reload_of_new_private_ranges_keeps_open_tunnels(world):
    started = world.inspect()['State']['StartedAt']
    container = world.client.containers.get(CLIENT)
    container.exec_run(['rm', '-f', '/tmp/g-tunnel-open', '/tmp/g-tunnel-go', '/tmp/g-tunnel-result'])
    container.exec_run(['python3', '-c', TUNNEL_SCRIPT, PROXY, 'api.provider.test', '443', '/tmp/g-tunnel'],
                       detach=True)
    assert '200' in _wait_file(world, '/tmp/g-tunnel-open')
    # 198.18.0.0/15 (benchmarking) is opened in addition: nothing resolves there, no traffic goes there.
    reconfigures = world.client.api.logs(PROXY).decode('utf-8', 'replace').count('Reconfiguring Squid Cache')
    rc, out, recap = world.site(egress_private_destinations=[world.upstream_subnet, '198.18.0.0/15'])
    assert rc == 0, out[-4000:]
    with open(os.path.join(world.deploy_dir, 'egress-guard.conf')) as handle:
        assert '# Opened private ranges: 198.18.0.0/15, %s' % world.upstream_subnet in handle.read() or \
            '# Opened private ranges: %s, 198.18.0.0/15' % world.upstream_subnet in open(handle.name).read()
    logs = world.client.api.logs(PROXY).decode('utf-8', 'replace')
    # one reload: the proxy's squid and its TLS name check, which reads the changed guard too
    assert logs.count('Reconfiguring Squid Cache') == reconfigures + 2, logs[-3000:]
    assert world.inspect()['State']['StartedAt'] == started
    container.exec_run(['touch', '/tmp/g-tunnel-go'])
    result = _wait_file(world, '/tmp/g-tunnel-result')
    assert ' 401 ' in result.splitlines()[0] and 'X-Fake-Upstream' in result, result
    rc, out, recap = world.site()
    assert rc == 0, out[-4000:]


def test_a_refused_private_range_changes_nothing(world):
    path = os.path.join(world.deploy_dir, 'egress-guard.conf')
    before = open(path).read()
    rc, out, _recap = world.site(egress_private_destinations=['10.47.0.0/24'])
    assert rc != 0
    assert 'egress_private_destinations[0]' in out and 'job-network pool' in out, out[-3000:]
    assert open(path).read() == before


def test_drift_needs_consent_while_jobs_are_attached(world):
    started = world.inspect()['State']['StartedAt']
    rc, out, _recap = world.site(egress_proxy_health_interval=7)
    assert rc != 0
    assert 'would cut 2 jobs' in out and 'egress_proxy_allow_cut_jobs' in out, out[-3000:]
    assert 'health check timing' in out
    assert world.inspect()['State']['StartedAt'] == started


def test_a_proxy_changed_by_hand_is_reported_and_replaced(world):
    """Recreate the proxy by hand with default capabilities, another log config and health interval."""
    attrs = world.inspect()
    client = world.client
    mounts = [m for m in attrs['Mounts'] if m['Type'] == 'bind']
    _remove_container(client, PROXY)
    from docker.types import LogConfig, Mount
    client.containers.create(
        attrs['Config']['Image'], name=PROXY, detach=True, network=world.upstream_net,
        mounts=[Mount(target=m['Destination'], source=m['Source'], type='bind', read_only=True) for m in mounts],
        labels={'io.pi-dispatch.egress.role': 'proxy'}, extra_hosts=attrs['HostConfig']['ExtraHosts'],
        restart_policy={'Name': 'unless-stopped'},
        healthcheck=dict(test=attrs['Config']['Healthcheck']['Test'], interval=9 * 10 ** 9),
        log_config=LogConfig(type='json-file', config={'max-size': '1m'})).start()
    rc, out, recap = world.site()
    assert rc == 0 and recap.get('changed', 0) >= 1, out[-4000:]
    flat = ' '.join(out.split())  # Ansible wraps long report lines
    for needle in ('capabilities dropped', 'log config', 'health check timing', 'read-only root file system'):
        assert needle in flat, out[-5000:]
    # In Docker's words on both engines (Podman spells capabilities and log options its own way).
    host = _venue.container_attrs(client, world.inspect())['HostConfig']
    wanted_log = {'max-size': '10MB'} if world.venue.is_podman else {'max-size': '10m', 'max-file': '3'}
    assert host['CapDrop'] == ['ALL'] and host['LogConfig']['Config'] == wanted_log
    rc, out, recap = world.site()
    assert rc == 0 and recap.get('changed') == 0, out[-4000:]
    world.attach()
    world.wait_served()


def test_a_file_saved_by_rename_is_detected_and_remounted(world):
    path = os.path.join(world.deploy_dir, 'egress-allowlist.conf')
    r = world.curl(['http://plain.test/'])
    assert r['code'] == 401, r['raw']
    # sed -i saves by rename: a new inode the single-file mount never sees.
    os.system('sed -i "/^plain.test/d" %s' % path)
    stale = world.curl(['http://plain.test/'])
    assert stale['code'] == 401, 'the running proxy still reads the old inode: %s' % stale['raw']
    rc, out, _recap = world.site(egress_proxy_allow_cut_jobs=True)
    assert rc == 0, out[-4000:]
    assert 'was replaced on disk (saved by rename' in out, out[-4000:]
    world.attach()
    world.wait_served()
    for _attempt in range(10):
        gone = world.curl(['http://plain.test/'], timeout=3)
        if gone['code'] == 403:
            break
        time.sleep(1)
    assert gone['code'] == 403 and 'ERR_ACCESS_DENIED' in gone['headers'], gone['raw']
    rc, out, recap = world.site()
    assert rc == 0 and recap.get('changed') == 0, out[-4000:]


def test_the_log_is_rotated_at_the_configured_size(world):
    rc, out, _recap = world.site(egress_proxy_log_max_size='16k', egress_proxy_log_max_file=2,
                                 egress_proxy_allow_cut_jobs=True)
    assert rc == 0, out[-4000:]
    world.attach()
    world.wait_served()
    log_path = world.inspect()['LogPath']
    # Bounded: 300 denied requests (each logs one access line), at most 60 s.
    world.exec_client(['sh', '-c', 'for i in $(seq 1 300); do curl -s -m 2 -o /dev/null -x %s http://denied.test/'
                       '$i; done' % world.proxy_url], timeout=60)
    if world.venue.is_podman:
        # Podman keeps one file (k8s-file, no max-file) and cuts it at max-size, read 1000-based.
        assert not os.path.exists(log_path + '.1'), os.listdir(os.path.dirname(log_path))
        assert 0 < os.path.getsize(log_path) <= 16 * 1000 + 4096
        assert 'denied.test' in world.client.api.logs(PROXY, tail=50).decode('utf-8', 'replace')
        return
    assert os.path.exists(log_path + '.1'), os.listdir(os.path.dirname(log_path))
    assert os.path.getsize(log_path) <= 16 * 1024 + 4096
    assert json.loads(open(log_path + '.1').readline())['stream'] in ('stdout', 'stderr')


def _wait_file(world, path, tries=60):
    for _attempt in range(tries):
        rc, out = world.exec_client(['cat', path], timeout=5)
        if rc == 0 and out.strip():
            return out
        time.sleep(0.5)
    raise AssertionError('%s never appeared in the client container' % path)
