"""The TLS name check on the real engine (issue 25): every tunnel to 443 is what its CONNECT claims.

The session's proxy runs the packaged rules (version 3): a tunnel to port 443 that the rules allow goes
through the image's TLS name check (a second squid on 127.0.0.1:3129, roles/proxy/files/peek.conf),
which peeks at the client's ClientHello and splices only when its SNI names the CONNECT's host. A
client on the job network sends hand-made CONNECTs and ClientHellos (Python's ssl, no verification:
the fake upstream's certificate is self-signed) and the fake upstream's own log says whether anything
reached it: each attempt asks for a path of its own, so "not in the log" means the request never
arrived. Every socket has a timeout; nothing leaves the machine.
"""

import time

import pytest

docker = pytest.importorskip('docker')

from conftest import listed_entry, tls_attempt  # noqa: E402

pytestmark = pytest.mark.integration


def _try(env, target, sni, mode='tls', upstream=None):
    """One attempt from the job network's client; returns (result, whether the upstream logged its path).

    ``upstream``: the container whose log tells whether the request arrived (the fake upstream).
    """
    return tls_attempt(env, env.client_container, target, sni, mode=mode, upstream=upstream)


def test_an_sni_that_the_connect_does_not_name_is_cut_and_reaches_nothing(egress_env):
    # CONNECT to the listed provider, ClientHello for a name that is not listed (domain fronting)
    result, logged = _try(egress_env, 'api.provider.test:443', 'denied.test')
    assert 'HTTP/1.1 200' in result['connect'], result
    assert result['answer'] in (None, '') and result['error'], result
    assert not logged, 'the fronted request reached the upstream: %s' % result
    # and for a name that is listed, but is not the CONNECT's host: still cut
    result, logged = _try(egress_env, 'api.provider.test:443', 'www.forge.test')
    assert result['error'] and not logged, result


def test_a_hello_without_sni_to_a_name_is_cut(egress_env):
    result, logged = _try(egress_env, 'api.provider.test:443', '-')
    assert 'HTTP/1.1 200' in result['connect'] and result['error'] and not logged, result


@pytest.mark.parametrize('sni', ['api.provider.test', 'API.PROVIDER.TEST', 'api.provider.test.'])
def test_the_name_of_the_connect_passes_in_any_case_and_with_a_trailing_dot(egress_env, sni):
    result, logged = _try(egress_env, 'api.provider.test:443', sni)
    assert result['answer'] == 'HTTP/1.0 401 Unauthorized' and logged, result


def test_a_subdomain_under_a_listed_domain_passes(egress_env):
    result, logged = _try(egress_env, 'www.forge.test:443', 'www.forge.test')
    assert result['answer'] == 'HTTP/1.0 401 Unauthorized' and logged, result


def test_a_denied_host_is_still_squids_403_with_no_tls_at_all(egress_env):
    result, logged = _try(egress_env, 'denied.test:443', 'denied.test')
    assert result['connect'].startswith('HTTP/1.1 403'), result
    assert result['answer'] is None and not logged, result


@pytest.fixture
def ip_listed(egress_env):
    """The fake upstream's address on the allowlist for the test."""
    with listed_entry(egress_env, egress_env.fake_ip()) as address:
        yield address


@pytest.fixture
def plain_443(egress_env):
    """A plain HTTP server on port 443 (no TLS) under a listed name: ``plain443.test``."""
    client, name = egress_env.client, 'pi-egress-plain443' + egress_env.suffix
    api = client.api
    try:
        api.remove_container(name, force=True)
    except docker.errors.NotFound:
        pass
    created = api.create_container(
        egress_env.tools_image, ['python3', '-u', '-m', 'http.server', '443'], name=name, detach=True,
        labels={'io.pi-dispatch.egress.test': 'plain-443'},
        host_config=api.create_host_config(network_mode=egress_env.upstream_net),
        networking_config=api.create_networking_config({
            egress_env.upstream_net: api.create_endpoint_config(aliases=['plain443.test'])}))
    api.start(created['Id'])
    try:
        deadline = time.monotonic() + 20
        while 'Serving HTTP' not in api.logs(name).decode('utf-8', 'replace') and time.monotonic() < deadline:
            time.sleep(0.2)
        with listed_entry(egress_env, 'plain443.test'):
            yield name
    finally:
        api.remove_container(name, force=True)


def test_plain_bytes_through_a_tunnel_to_443_are_refused(egress_env, plain_443):
    result, logged = _try(egress_env, 'plain443.test:443', '-', mode='plain', upstream=plain_443)
    assert 'HTTP/1.1 200' in result['connect'], result
    assert not (result['answer'] or '').startswith('HTTP/1.0 404'), result     # not the plain server's answer
    assert not logged, 'plain HTTP reached a plain server on 443 through the tunnel: %s' % result


def test_a_listed_ip_literal_without_sni_passes_and_with_another_name_is_cut(egress_env, ip_listed):
    result, logged = _try(egress_env, '%s:443' % ip_listed, '-')
    assert result['answer'] == 'HTTP/1.0 401 Unauthorized' and logged, result
    result, logged = _try(egress_env, '%s:443' % ip_listed, 'denied.test')
    assert result['error'] and not logged, result


def test_tunnels_to_other_ports_are_not_peeked(egress_env):
    """A declared model endpoint keeps its plain tunnel (test_model_endpoints declares one on 8443); here the
    check's own port is closed to jobs: 3129 listens on the proxy's loopback only."""
    rc, out = egress_env.exec_client(['sh', '-c', 'nc -z -w 2 %s 3129; echo rc=$?' % egress_env.proxy], timeout=10)
    assert 'rc=0' not in out, out
