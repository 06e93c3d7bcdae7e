"""Model endpoints on the real proxy: declare, render in place, reconfigure (never restart).

The fake upstream answers as ``models.test`` on the --internal upstream network
(HTTPS on 8443, ``GET /v1/models`` -> 200). The declaration is written by
``playbooks/endpoints.yml`` from a variable and rendered by the
``model_endpoints`` module; what the job network's client gets is asserted.
"""

import os
import time

import pytest

from conftest import TUNNEL_SCRIPT, run_playbook

pytestmark = pytest.mark.integration

ENDPOINT = {'id': 'fake-models', 'host': 'models.test', 'port': 8443, 'slots': 1, 'keyless': True}


def _endpoints(env, endpoints, check=False):
    extra = {'egress_deploy_dir': env.deploy_dir, 'egress_proxy_name': env.proxy,
             'egress_model_endpoints': endpoints}
    return run_playbook('playbooks/endpoints.yml', extra, check=check)


def _started_at(env):
    return env.client.api.inspect_container(env.proxy)['State']['StartedAt']


def _wait_file(env, path, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rc, out = env.exec_client(['cat', path], timeout=5)
        if rc == 0 and out.strip():
            return out
        time.sleep(0.3)
    raise AssertionError('%s never appeared in the client container' % path)


def _denied_by_squid(result):
    return 'X-Squid-Error: ERR_ACCESS_DENIED' in result['headers']


@pytest.fixture
def declared(egress_env):
    """Declare models.test:8443 for the test, and always restore the empty declaration after it."""
    try:
        yield egress_env
    finally:
        rc, out, _recap = _endpoints(egress_env, [])
        assert rc == 0, out[-4000:]


def test_declare_render_reload_keeps_jobs(declared):
    env = declared
    include = os.path.join(env.deploy_dir, 'model-endpoints.conf')
    inode = os.stat(include).st_ino
    started = _started_at(env)

    # Before: nothing declared, the tunnel is the proxy's 403.
    before = env.curl(['https://models.test:8443/v1/models'])
    assert before['connect'] == 403, before['raw']

    # A long-lived tunnel (to a listed host on 443) is open across the reload.
    warm = env.curl(['https://api.provider.test/v1/messages'])
    assert (warm['connect'], warm['code']) == (200, 401), warm['raw']
    env.exec_client(['rm', '-f', '/tmp/h4-tunnel-open', '/tmp/h4-tunnel-go', '/tmp/h4-tunnel-result'])
    container = env.client.containers.get(env.client_container)
    container.exec_run(['python3', '-c', TUNNEL_SCRIPT, env.proxy, 'api.provider.test', '443', '/tmp/h4-tunnel'],
                       detach=True)
    assert '200' in _wait_file(env, '/tmp/h4-tunnel-open')

    # Check mode + diff: shows the include and the reload, changes nothing.
    rc, out, recap = _endpoints(env, [ENDPOINT], check=True)
    assert rc == 0, out[-4000:]
    assert 'acl pi_ep_fake_models_host dstdomain -n models.test' in out
    assert 'then squid -k reconfigure' in out
    assert 'dstdomain' not in open(include).read()

    rc, out, recap = _endpoints(env, [ENDPOINT])
    assert rc == 0, out[-4000:]
    assert 'squid -k reconfigure ran' in out, out[-4000:]

    # The declared host and port: a tunnel, and the model server answers.
    ok = env.curl(['https://models.test:8443/v1/models'])
    assert (ok['rc'], ok['connect'], ok['code']) == (0, 200, 200), ok['raw']
    assert '"port": 8443' in ok['body'], ok['raw']
    # The next port up: the proxy's 403.
    nxt = env.curl(['https://models.test:8444/v1/models'])
    assert nxt['connect'] == 403, nxt['raw']
    # A plain forward request to the declared port: squid's ERR_ACCESS_DENIED.
    plain = env.curl(['http://models.test:8443/v1/models'])
    assert plain['code'] == 403 and _denied_by_squid(plain), plain['raw']
    assert 'X-Fake-Upstream' not in plain['raw']

    # Reconfigured, not restarted; the include kept its inode.
    assert _started_at(env) == started
    assert os.stat(include).st_ino == inode
    # The tunnel opened before the reload still carries data after it.
    env.exec_client(['touch', '/tmp/h4-tunnel-go'])
    result = _wait_file(env, '/tmp/h4-tunnel-result')
    assert ' 401 ' in result.splitlines()[0] and 'X-Fake-Upstream' in result, result

    # A second run changes nothing and does not reload.
    rc, out, recap = _endpoints(env, [ENDPOINT])
    assert rc == 0 and recap.get('changed') == 0, out[-4000:]
    assert 'not needed' in out

    # Remove the endpoint, render, reload: refused again.
    rc, out, _recap = _endpoints(env, [])
    assert rc == 0, out[-4000:]
    gone = env.curl(['https://models.test:8443/v1/models'])
    assert gone['connect'] == 403, gone['raw']
    assert _started_at(env) == started
    assert os.stat(include).st_ino == inode


def test_invalid_declaration_changes_nothing(declared):
    env = declared
    include = os.path.join(env.deploy_dir, 'model-endpoints.conf')
    declaration = os.path.join(env.deploy_dir, 'model-endpoints.json')
    before = (open(include).read(), open(declaration).read())
    rc, out, _recap = _endpoints(env, [dict(ENDPOINT, host='127.0.0.1')])
    assert rc != 0
    assert 'endpoint 0 (id \\"fake-models\\")' in out or 'endpoint 0 (id "fake-models")' in out, out[-4000:]
    assert '127.0.0.1' in out
    assert (open(include).read(), open(declaration).read()) == before


def test_an_address_endpoint_opens_its_port_to_that_address_only(declared):
    """Issue 17.1: an endpoint declared by address is matched with ``dst -n``, port first.

    With ``dst <ip>`` squid resolved the requested name and let it through when any
    of its addresses was the endpoint's, so every name pointing there (listed or not)
    got a tunnel on that port. models.test and denied.test both resolve to the fake
    upstream's address here.
    """
    env = declared
    address = env.fake_ip()
    rc, out, _recap = _endpoints(env, [dict(ENDPOINT, id='fake-models-address', host=address)])
    assert rc == 0, out[-4000:]
    ok = env.curl(['https://%s:8443/v1/models' % address])
    assert (ok['connect'], ok['code']) == (200, 200), ok['raw']
    for name in ('models.test', 'denied.test'):
        r = env.curl(['https://%s:8443/v1/models' % name])
        assert r['connect'] == 403, (name, r['raw'])
        assert 'X-Fake-Upstream' not in r['raw'], (name, r['raw'])


def test_an_endpoint_on_port_80_of_a_listed_host_only_adds_a_tunnel(declared):
    """Issue 17.2: declaring plain.test:80 must not take plain HTTP to plain.test away."""
    env = declared
    rc, out, _recap = _endpoints(env, [dict(ENDPOINT, id='plain-models', host='plain.test', port=80)])
    assert rc == 0, out[-4000:]
    plain = env.curl(['http://plain.test/'])
    assert plain['rc'] == 0, plain['raw']
    assert plain['code'] == 401 and 'X-Fake-Upstream: http:80' in plain['headers'], plain['raw']
    tunnel = env.curl(['--proxytunnel', 'http://plain.test/'])
    assert (tunnel['connect'], tunnel['code']) == (200, 401), tunnel['raw']
    other = env.curl(['http://plain.test:8080/'])
    assert other['code'] == 403 and _denied_by_squid(other), other['raw']
