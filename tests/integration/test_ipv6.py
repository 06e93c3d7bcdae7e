"""IPv6 parity on the real engine (issue 25): what holds for IPv4 holds for IPv6.

A second deployment, made by ``site.yml`` like the session's, whose upstream network has IPv6 (a ULA
/64, ``--internal``): its fake upstream answers on IPv6 at a fixed address, which the allowlist opens
with ``egress_private_destinations`` like the session opens its IPv4 upstream. The proxy's
``/etc/hosts`` (``egress_proxy_extra_hosts``) gives listed names IPv6 answers only: the fake's address,
loopback, link-local, unique local, IPv4-mapped loopback, the AWS metadata address and the NAT64 and
6to4 forms of private, loopback and metadata addresses (issue 42), each next to an IPv4 twin. A
client on a job network (the engine's job networks are IPv4, as the job-network API makes them) asks
for each, and the answer and the decision log's line are asserted.
"""

import json
import os
import random
import time

import pytest

docker = pytest.importorskip('docker')
from docker.types import IPAMConfig, IPAMPool  # noqa: E402

from conftest import (  # noqa: E402
    FAKE_ALIASES, SUFFIX, TOOLS_IMAGE, EgressEnv, create_pool_network, _remove_container, _remove_network,
    _wait_fake_ready, _wait_path_ready, tls_attempt)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import decisions as _decisions  # noqa: E402

pytestmark = pytest.mark.integration

# name -> the only address the proxy's /etc/hosts gives it; each IPv6 answer has an IPv4 twin
V6_HOSTS = {
    'v6loop.test': '::1', 'v4loop.test': '127.0.0.1',
    'v6linklocal.test': 'fe80::1', 'v4linklocal.test': '169.254.1.1',
    'v6ula.test': 'fd12:3456::5', 'v4private.test': '10.99.0.5',
    'v6mapped.test': '::ffff:127.0.0.1',
    'v6meta.test': 'fd00:ec2::254', 'v4meta.test': '169.254.169.254',
    'v6unspec.test': '::0', 'v4unspec.test': '0.0.0.0',
    # issue 42: NAT64 (64:ff9b::/96) and 6to4 (2002::/16) forms embed an IPv4 address and are judged by it
    'v6nat64.test': '64:ff9b::a63:5', 'v66to4.test': '2002:a63:5::1',
    'v6nat64loop.test': '64:ff9b::7f00:1', 'v6nat64meta.test': '64:ff9b::a9fe:a9fe',
    'v66to4loop.test': '2002:7f00:1::1', 'v6nat64local.test': '64:ff9b:1::a63:5',
}
TWINS = [('v6loop.test', 'v4loop.test'), ('v6linklocal.test', 'v4linklocal.test'), ('v6ula.test', 'v4private.test'),
         ('v6mapped.test', 'v4loop.test'), ('v6meta.test', 'v4meta.test'), ('v6unspec.test', 'v4unspec.test'),
         ('v6nat64.test', 'v4private.test'), ('v66to4.test', 'v4private.test'), ('v6nat64loop.test', 'v4loop.test'),
         ('v6nat64meta.test', 'v4meta.test'), ('v66to4loop.test', 'v4loop.test'),
         ('v6nat64local.test', 'v4private.test')]


class V6Env(EgressEnv):
    def __init__(self, client, deploy_dir):
        super(V6Env, self).__init__(client, deploy_dir)
        self.proxy = 'pi-dispatch-egress-proxy-v6' + SUFFIX
        self.proxy_url = 'http://%s:3128' % self.proxy
        self.upstream_net = 'pi-dispatch-egress-out-v6' + SUFFIX
        self.fake = 'pi-egress-fake-v6' + SUFFIX
        self.job_net = 'pi-egress-client-net-v6' + SUFFIX
        self.client_container = 'pi-egress-client-v6' + SUFFIX
        self.v6_subnet = 'fd47:25:%x::/64' % random.randint(1, 0xffff)
        self.fake_v6 = self.v6_subnet.split('/')[0] + '10'
        self.allowlist = [{'host': 'v6.provider.test', 'comment': 'the fake, on IPv6 only'}] + [
            {'host': name} for name in sorted(V6_HOSTS)]

    def site_vars(self, **more):
        extra = super(V6Env, self).site_vars(**more)
        extra['egress_private_destinations'] = extra['egress_private_destinations'] + [self.v6_subnet]
        extra['egress_proxy_extra_hosts'] = ['v6.provider.test:%s' % self.fake_v6] + [
            '%s:%s' % item for item in sorted(V6_HOSTS.items())]
        extra.update(more)
        return extra


@pytest.fixture(scope='module')
def v6env(engine, tmp_path_factory):
    client = engine
    env = V6Env(client, str(tmp_path_factory.mktemp('deploy-v6') / 'egress'))
    for name in (env.client_container, env.fake, env.proxy):
        _remove_container(client, name)
    for name in (env.job_net, env.upstream_net):
        _remove_network(client, name)
    client.networks.create(env.upstream_net, driver='bridge', internal=True, enable_ipv6=True,
                           labels={'io.pi-dispatch.egress.network': 'upstream'},
                           ipam=IPAMConfig(pool_configs=[IPAMPool(subnet=env.v6_subnet)]))
    env.upstream_subnet = None   # nothing but the IPv6 /64 is opened
    try:
        api = client.api
        fake = api.create_container(
            TOOLS_IMAGE, ['python3', '/usr/local/bin/fake_upstream.py'], name=env.fake, detach=True,
            labels={'io.pi-dispatch.egress.test': 'fake-upstream-v6'},
            host_config=api.create_host_config(network_mode=env.upstream_net),
            networking_config=api.create_networking_config({
                env.upstream_net: api.create_endpoint_config(aliases=FAKE_ALIASES, ipv6_address=env.fake_v6)}))
        api.start(fake['Id'])
        _wait_fake_ready(client, env.fake)
        rc, out, _recap = env.site()
        if rc != 0:
            pytest.fail('site.yml (IPv6 upstream) failed (rc=%s):\n%s' % (rc, out[-6000:]))
        create_pool_network(client, env.job_net, labels={'io.pi-dispatch.egress.test': 'client-net'})
        client.networks.get(env.job_net).connect(env.proxy)
        client.containers.run(TOOLS_IMAGE, ['sleep', 'infinity'], name=env.client_container, detach=True,
                              network=env.job_net, labels={'io.pi-dispatch.egress.test': 'client'})
        _wait_path_ready(env, url='https://v6.provider.test/')
        yield env
    finally:
        for name in (env.client_container, env.fake, env.proxy):
            _remove_container(client, name)
        for name in (env.job_net, env.upstream_net):
            _remove_network(client, name)


def _last_decision(env, host):
    records, _problems, _warnings = _decisions.read_records(os.path.join(env.deploy_dir, 'decisions'))
    found = [r for r in records if r.get('host') == host]
    assert found, 'no decision line for %s' % host
    return found[-1]


def test_the_fake_answers_on_ipv6_only_through_the_proxy(v6env):
    proxy = v6env.client.api.inspect_container(v6env.proxy)['NetworkSettings']['Networks'][v6env.upstream_net]
    assert proxy['GlobalIPv6Address'], 'the proxy has no IPv6 address on %s' % v6env.upstream_net
    result, reached = tls_attempt(v6env, v6env.client_container, 'v6.provider.test:443', 'v6.provider.test',
                                  upstream=v6env.fake)
    assert result['answer'] == 'HTTP/1.0 401 Unauthorized' and reached, result
    assert _last_decision(v6env, 'v6.provider.test')['reason'] == 'sni_ok'


@pytest.mark.parametrize('sni, reason', [('denied.test', 'sni_mismatch'), ('-', 'no_sni')])
def test_the_sni_rules_hold_over_ipv6(v6env, sni, reason):
    result, reached = tls_attempt(v6env, v6env.client_container, 'v6.provider.test:443', sni, upstream=v6env.fake)
    assert 'HTTP/1.1 200' in result['connect'] and result['error'] and not reached, result
    line = _last_decision(v6env, 'v6.provider.test')
    assert (line['verdict'], line['reason']) == ('refused', reason), line


def test_plain_bytes_over_ipv6_are_cut(v6env):
    result, reached = tls_attempt(v6env, v6env.client_container, 'v6.provider.test:443', '-', mode='plain',
                                  upstream=v6env.fake)
    assert not reached and not (result['answer'] or '').startswith('HTTP/'), result
    assert _last_decision(v6env, 'v6.provider.test')['reason'] == 'not_tls'


@pytest.mark.parametrize('v6, v4', TWINS)
def test_an_ipv6_answer_in_a_refused_range_is_refused_as_its_ipv4_twin(v6env, v6, v4):
    outcomes = {}
    for name in (v6, v4):
        tunnel = v6env.curl(['https://%s/' % name])
        plain = v6env.curl(['http://%s/' % name])
        outcomes[name] = (tunnel['connect'], plain['code'], _last_decision(v6env, name)['reason'])
    assert outcomes[v6] == outcomes[v4] == (403, 403, 'guard'), outcomes


@pytest.mark.parametrize('literal', ['[::1]', '[fd00:ec2::254]', '[::ffff:127.0.0.1]', '[fe80::1]', 'fake'])
def test_an_ipv6_literal_is_refused_unless_listed_like_an_unlisted_ipv4_literal(v6env, literal):
    # the allowlist takes no IPv6 literal (egress_allowlist refuses one with its fix: a model endpoint),
    # so every IPv6 literal is an unlisted host: refused before anything is resolved or connected
    literal = '[%s]' % v6env.fake_v6 if literal == 'fake' else literal
    result, reached = tls_attempt(v6env, v6env.client_container, '%s:443' % literal, '-', upstream=v6env.fake)
    assert result['connect'].startswith('HTTP/1.1 403') and not reached, result
    v4 = v6env.curl(['https://169.254.169.254/'])
    assert v4['connect'] == 403


# Issue 42, item 13. squid's http_port 3128 listens on IPv6 too ([::]:3128). A client the engine knows by
# its IPv4 address that came from an IPv6 address (a link-local fe80::) would be a second client: not
# named by its job, with a second connection allowance. Measured on Docker 20.10: the job network gives
# neither the job nor the proxy's interface on it an IPv6 address (IPv6 is disabled on interfaces of an
# IPv4-only network), so a job cannot come from fe80:: here; the rules refuse any IPv6 client but the
# proxy's own loopback all the same (reason ipv6_client), which the fake, on the IPv6 upstream network,
# shows over the proxy's unique local and its link-local address.
V6_CLIENT = r'''
import json, socket, sys
out = []
for host in sys.argv[1:]:
    try:
        info = socket.getaddrinfo(host, 3128, 0, socket.SOCK_STREAM)[0]
        s = socket.socket(info[0], socket.SOCK_STREAM)
        s.settimeout(8)
        s.connect(info[4])
        s.sendall(b"CONNECT v6.provider.test:443 HTTP/1.1\r\nHost: v6.provider.test:443\r\n\r\n")
        head = b""
        while b"\r\n" not in head:
            chunk = s.recv(1)
            if not chunk:
                break
            head += chunk
        out.append([host, s.getsockname()[0], head.split(b"\r\n")[0].decode("latin-1")])
        s.close()
    except Exception as exc:
        out.append([host, None, "%s: %s" % (type(exc).__name__, exc)])
print(json.dumps(out))
'''


def _inet6(env, container):
    """The IPv6 addresses of ``container`` by interface (from /proc/net/if_inet6), loopback left out."""
    rc, out = env.client.containers.get(container).exec_run(['cat', '/proc/net/if_inet6'])
    assert rc == 0, out
    found = {}
    for line in out.decode().splitlines():
        words = line.split()
        if len(words) == 6 and words[5] != 'lo':
            found.setdefault(words[5], []).append(':'.join(words[0][i:i + 4] for i in range(0, 32, 4)))
    return found


def test_a_job_network_carries_no_ipv6_and_an_ipv6_client_is_refused(v6env):
    api = v6env.client.api
    networks = api.inspect_container(v6env.proxy)['NetworkSettings']['Networks']
    job_mac = networks[v6env.job_net]['MacAddress']
    rc, out = v6env.client.containers.get(v6env.proxy).exec_run(
        ['sh', '-c', 'grep -l %s /sys/class/net/*/address' % job_mac])
    job_if = out.decode().strip().split('/')[-2]
    assert rc == 0 and job_if, out
    proxy_v6 = _inet6(v6env, v6env.proxy)
    assert job_if not in proxy_v6, proxy_v6               # no fe80:: on the proxy's side of the job network
    assert _inet6(v6env, v6env.client_container) == {}     # the job has no IPv6 address at all
    # the mechanism, from an IPv6 source: the fake on the IPv6 upstream network
    upstream = networks[v6env.upstream_net]
    link_local = [a for a in proxy_v6.get(_upstream_if(v6env, upstream['MacAddress']), []) if a.startswith('fe80')]
    assert link_local, proxy_v6
    targets = [upstream['IPAddress'], upstream['GlobalIPv6Address'], '%s%%eth0' % link_local[0]]
    rc, out = v6env.client.containers.get(v6env.fake).exec_run(['python3', '-c', V6_CLIENT] + targets)
    assert rc == 0, out
    answers = json.loads(out.decode().strip().splitlines()[-1])
    assert [a[2][:12] for a in answers] == ['HTTP/1.1 200', 'HTTP/1.1 403', 'HTTP/1.1 403'], answers
    # squid writes a refusal's line as it happens, through its log daemon: wait for both (bounded), not one read.
    deadline = time.monotonic() + 15
    while True:
        records, _problems, _warnings = _decisions.read_records(os.path.join(v6env.deploy_dir, 'decisions'))
        refused = [r for r in records if r.get('reason') == 'ipv6_client']
        if len(refused) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(refused) == 2 and all(r['verdict'] == 'refused' for r in refused), refused


def _upstream_if(env, mac):
    rc, out = env.client.containers.get(env.proxy).exec_run(['sh', '-c', 'grep -l %s /sys/class/net/*/address' % mac])
    assert rc == 0, out
    return out.decode().strip().split('/')[-2]
