"""What a client on a job network actually gets through the real proxy.

Every target is a ``.test`` name served by the fake upstream on an
``--internal`` upstream network: no packet leaves the machine.
"""

import pytest

pytestmark = pytest.mark.integration


def _denied_by_squid(result):
    return 'X-Squid-Error: ERR_ACCESS_DENIED' in result['headers']


def test_connect_to_listed_provider_on_443_reaches_upstream(egress_env):
    r = egress_env.curl(['https://api.provider.test/v1/messages'])
    assert r['rc'] == 0, r['raw']
    assert r['connect'] == 200, r['raw']
    # The provider's own answer (401, nothing spent), from the fake on 443.
    assert r['code'] == 401, r['raw']
    assert '"port": 443' in r['body'] and '"scheme": "https"' in r['body'], r['raw']


def test_connect_to_subdomain_of_dot_entry_is_allowed(egress_env):
    r = egress_env.curl(['https://www.forge.test/'])
    assert (r['rc'], r['connect'], r['code']) == (0, 200, 401), r['raw']


def test_unlisted_host_is_refused_and_never_resolved(egress_env):
    r = egress_env.curl(['https://denied.test/'])
    assert r['connect'] == 403, r['raw']
    assert r['rc'] != 0, r['raw']
    assert 'X-Fake-Upstream' not in r['raw']
    plain = egress_env.curl(['http://denied.test/'])
    assert plain['code'] == 403 and _denied_by_squid(plain), plain['raw']
    assert 'X-Fake-Upstream' not in plain['raw']
    ipcache = egress_env.squid_mgr('ipcache')
    assert 'api.provider.test' in ipcache  # the page lists what squid resolved ...
    assert 'denied.test' not in ipcache     # ... and the unlisted name is not among it


def test_connect_to_listed_host_on_other_port_is_refused(egress_env):
    r = egress_env.curl(['https://api.provider.test:8443/'])
    assert r['connect'] == 403, r['raw']
    assert 'X-Fake-Upstream' not in r['raw']


def test_plain_get_to_listed_host_on_80_reaches_upstream(egress_env):
    r = egress_env.curl(['http://plain.test/'])
    assert r['rc'] == 0, r['raw']
    assert r['code'] == 401 and 'X-Fake-Upstream: http:80' in r['headers'], r['raw']


@pytest.mark.parametrize('url', [
    'http://api.provider.test:443/',   # plain request for port 443 (https without a tunnel)
    'http://plain.test:8080/',          # plain request to another port
])
def test_plain_get_to_listed_host_on_other_port_gets_squid_403(egress_env, url):
    r = egress_env.curl([url])
    assert r['code'] == 403, r['raw']
    assert _denied_by_squid(r), r['raw']
    assert 'X-Fake-Upstream' not in r['raw']


def test_plain_https_url_through_proxy_is_refused(egress_env):
    # curl sends an https:// URL to the proxy as a plain GET when told not to tunnel.
    r = egress_env.curl(['--proxy-insecure', '-H', 'Host: api.provider.test', '--request-target',
                         'https://api.provider.test/', 'http://api.provider.test:443/'])
    assert r['code'] == 403 and _denied_by_squid(r), r['raw']


def test_listed_name_resolving_to_loopback_is_refused(egress_env):
    r = egress_env.curl(['https://loopback.test/'])
    assert r['connect'] == 403, r['raw']
    plain = egress_env.curl(['http://loopback.test/'])
    assert plain['code'] == 403 and _denied_by_squid(plain), plain['raw']


def test_ip_literal_is_refused(egress_env):
    ip = egress_env.fake_ip()
    r = egress_env.curl(['https://%s/' % ip])
    assert r['connect'] == 403, r['raw']
    plain = egress_env.curl(['http://%s/' % ip])
    assert plain['code'] == 403 and _denied_by_squid(plain), plain['raw']
    assert 'X-Fake-Upstream' not in plain['raw']


def test_client_without_proxy_reaches_nothing(egress_env):
    # By name: the job network's DNS knows only the proxy; the fake is elsewhere.
    r = egress_env.curl(['https://api.provider.test/'], proxy=False, timeout=5)
    assert r['rc'] != 0 and r['code'] == 0, r['raw']
    # By address: the internal job network has no route to the upstream network.
    ip = egress_env.fake_ip()
    r = egress_env.curl(['http://%s/' % ip], proxy=False, timeout=5)
    assert r['rc'] != 0 and r['code'] == 0, r['raw']


def test_proxy_logs_the_access_log_to_docker_logs(egress_env):
    egress_env.curl(['http://plain.test/logged-path'])
    logs = egress_env.client.api.logs(egress_env.proxy, tail=200).decode('utf-8', 'replace')
    assert 'http://plain.test/logged-path' in logs
