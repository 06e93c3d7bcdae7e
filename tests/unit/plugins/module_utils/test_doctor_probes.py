"""The doctor's model-endpoint probes, overlay lines and isolation check: pure decisions, tables of cases."""

import subprocess

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import isolation as _doctor_isolation
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import lines as _doctor_lines
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import names as _doctor_names
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import overlay as _doctor_overlay
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import probes as _doctor_probes
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import sweep as _doctor_sweep
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import tls as _doctor_tls
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import endpoints as _endpoints

EP = _endpoints.Endpoint('m1', 'models.test', 11434, 1)
EP6 = _endpoints.Endpoint('v6', 'fd00::5', 8080, 1)


def result(connect=0, code=0, rc=0, squid_error=None, error=''):
    return dict(connect=connect, code=code, rc=rc, squid_error=squid_error, error=error)


# --- the port-exact target ---------------------------------------------------------------------------

@pytest.mark.parametrize('port, declared, expect', [
    (11434, [11434], 11435),
    (11434, [11434, 11435, 11436], 11437),
    (79, [79], 81),             # never 80
    (442, [442], 444),          # never 443
    (65535, [65535], 65534),    # nothing above: the nearest below
    (65534, [65534, 65535], 65533),
    (1, [1], 2),
])
def test_next_undeclared_port(port, declared, expect):
    assert _doctor_probes.next_undeclared_port(port, declared) == expect


def test_endpoint_targets_name_and_ipv6():
    other = _endpoints.Endpoint('m2', 'models.test', 11435, 1)
    targets = _doctor_probes.endpoint_targets(EP, [EP, other])
    assert targets == [('tunnel', 'http://models.test:11434/v1/models', True),
                       ('port', 'http://models.test:11436/', True),
                       ('plain', 'http://models.test:11434/v1/models', False)]
    assert _doctor_probes.endpoint_targets(EP6, [EP6])[1] == ('port', 'http://[fd00::5]:8081/', True)
    assert _doctor_probes.endpoint_targets(EP6, [EP6])[0][1] == 'http://[fd00::5]:8080/v1/models'


def test_endpoint_probe_names_are_swept_by_pid():
    name = _doctor_names.endpoint_probe_name('tunnel', 'mac-ollama-2', 77)
    assert name == 'pi-dispatch-egress-probe-endpoint-tunnel-mac-ollama-2-77'
    assert _doctor_names.probe_pid(name) == 77


def test_probe_script_tunnel_flag():
    assert ' -p ' in _doctor_probes.probe_script('http://m:1/v1/models', 'http://p:3128', 5, tunnel=True)
    assert ' -p ' not in _doctor_probes.probe_script('http://m:1/v1/models', 'http://p:3128', 5)


# --- classification tables ----------------------------------------------------------------------------

@pytest.mark.parametrize('case, res, expect, words', [
    ('200 through the tunnel', result(200, 200), ('endpoint.tunnel', 'ok'), ': 200)'),
    ('server wants a key (401)', result(200, 401), ('endpoint.tunnel', 'ok'), 'wants a key'),
    ('server wants a key (403)', result(200, 403), ('endpoint.tunnel', 'ok'), 'wants a key'),
    ('server 404', result(200, 404), ('endpoint.tunnel_fails', 'warn'), 'answered 404'),
    ('stuck: timeout in the tunnel', result(200, 0, rc=28), ('endpoint.tunnel_fails', 'warn'), 'stuck or busy'),
    ('TLS server closes plain', result(200, 0, rc=52), ('endpoint.tunnel_fails', 'warn'), 'TLS'),
    ('proxy 503: nothing answered', result(503), ('endpoint.tunnel_fails', 'warn'), 'nothing answered'),
    ('proxy 403: rules', result(403), ('endpoint.tunnel_fails', 'warn'), 'rules do not allow'),
    ('proxy other', result(502), ('endpoint.tunnel_fails', 'warn'), 'answered 502'),
    ('no answer at all', result(0, 0, rc=28), ('endpoint.notrun', 'notrun'), 'no answer'),
    ('no reading', None, ('endpoint.notrun', 'notrun'), 'could not start'),
])
def test_classify_endpoint_tunnel(case, res, expect, words):
    line = _doctor_probes.classify_endpoint_tunnel(EP, res, 15, why_not='the container could not start')
    assert (line.id, line.status) == expect, case
    assert words in line.message, (case, line.message)
    assert 'm1' in line.message
    if line.status in ('warn', 'fail'):
        assert line.fix, case


@pytest.mark.parametrize('case, res, expect', [
    ("proxy's 403", result(403), ('endpoint.port_exact', 'ok')),
    ('tunnel opened', result(200, 200), ('endpoint.port_leaks', 'warn')),
    ('503: tried to connect', result(503), ('endpoint.port_leaks', 'warn')),
    ('no answer', result(0, 0, rc=7), ('endpoint.notrun', 'notrun')),
    ('no reading', None, ('endpoint.notrun', 'notrun')),
])
def test_classify_endpoint_port(case, res, expect):
    line = _doctor_probes.classify_endpoint_port(EP, 'http://models.test:11435/', res, why_not='x')
    assert (line.id, line.status) == expect, case
    if line.status != 'notrun':
        assert 'models.test:11435' in line.message


def test_classify_endpoint_port_without_a_free_port_is_not_run():
    line = _doctor_probes.classify_endpoint_port(EP, None, None)
    assert (line.id, line.status) == ('endpoint.notrun', 'notrun')


@pytest.mark.parametrize('case, res, expect', [
    ("squid's refusal", result(code=403, squid_error='ERR_ACCESS_DENIED 0'), ('endpoint.plain', 'ok')),
    ('403 from the server, not squid', result(code=403), ('endpoint.plain_leaks', 'warn')),
    ('forwarded: 200', result(code=200), ('endpoint.plain_leaks', 'warn')),
    ('squid other error', result(code=503, squid_error='ERR_CONNECT_FAIL 111'), ('endpoint.plain_leaks', 'warn')),
    ('no answer', result(rc=28), ('endpoint.notrun', 'notrun')),
])
def test_classify_endpoint_plain(case, res, expect):
    line = _doctor_probes.classify_endpoint_plain(EP, res)
    assert (line.id, line.status) == expect, case


# --- overlay and allowlist -----------------------------------------------------------------------------

MODELS = '''// overlay
{
  "providers": {
    "local-ollama": {
      "baseUrl": "http://models.test:11434/v1",
      "api": "openai-completions",
      "apiKey": "$PI_DISPATCH_KEYLESS",
      "models": [{"id": "qwen", "compat": {"maxTokensField": "max_tokens"}},],
    },
    "loop": {"baseUrl": "http://127.0.0.1:8080/v1", "api": "openai-completions", "apiKey": "K",
             "models": [{"id": "x"}]},
  },
}
'''


def ids(lines):
    return [(line.id, line.status) for line in lines]


def test_overlay_nothing_given_says_not_run_and_checks_the_allowlist():
    lines = _doctor_overlay.overlay_lines(None, None, None, [], ['api.provider.test', '.forge.test'])
    assert ids(lines) == [('overlay.allowlist_ok', 'ok'), ('overlay.none', 'notrun')]


@pytest.mark.parametrize('entry', ['host.docker.internal', 'host.containers.internal', '.internal',
                                   '.docker.internal'])
def test_overlay_allowlist_opening_the_host_warns(entry):
    lines = _doctor_overlay.overlay_lines(None, None, None, [], ['api.provider.test', entry])
    assert ids(lines)[0] == ('overlay.allowlist', 'warn')
    assert entry in lines[0].message and 'declare' in lines[0].fix


def test_overlay_allowlist_unreadable_warns():
    lines = _doctor_overlay.overlay_lines(None, None, None, [], None,
                                          allowlist_problem='/d/a.conf could not be checked')
    assert ids(lines)[0] == ('overlay.allowlist_unread', 'warn')


def test_overlay_missing_file_warns():
    lines = _doctor_overlay.overlay_lines('/o/models.json', None, None, [], [])
    assert ids(lines)[-1] == ('overlay.missing', 'warn')
    assert '/o/models.json' in lines[-1].message


def test_overlay_refused_file_fails():
    lines = _doctor_overlay.overlay_lines('/o/models.json', '{"providers": [}', None, [], [])
    assert ids(lines)[-1] == ('overlay.parse', 'fail')


def test_overlay_models_against_endpoints():
    ep = _endpoints.Endpoint('ollama', 'models.test', 11434, 1, keyless=True)
    lines = _doctor_overlay.overlay_lines('/o/models.json', MODELS, None, [ep], [])
    got = ids(lines)
    assert ('overlay.uses', 'ok') in got
    assert ('overlay.keyless', 'ok') in got
    assert ('overlay.loopback', 'warn') in got
    for line in lines:
        assert line.id in _doctor_lines.LINE_IDS
        if line.status in ('warn', 'fail'):
            assert line.fix


def test_overlay_keyless_refused_when_the_endpoint_is_not_keyless():
    ep = _endpoints.Endpoint('ollama', 'models.test', 11434, 1, keyless=False)
    lines = _doctor_overlay.overlay_lines('/o/models.json', MODELS, None, [ep], [])
    assert ('overlay.keyless_refused', 'fail') in ids(lines)


# --- isolation ---------------------------------------------------------------------------------------------

TARGETS = dict(proxy='http://p:3128/', peer_name='http://pb:3128/', peer_address='http://10.47.0.14:3128/',
               proxy_other='http://10.47.0.10:3128/')


def fake_curl_run(tmp_path, behaviour):
    """Run isolation_script with a fake curl on PATH: behaviour maps URL -> (http_code, exit)."""
    bindir = tmp_path / 'bin'
    bindir.mkdir()
    cases = ''.join("    *'%s'*) printf '%s'; exit %d;;\n" % (url, code, rc) for url, (code, rc) in behaviour.items())
    (bindir / 'curl').write_text('#!/bin/sh\ncase "$*" in\n%s    *) printf 000; exit 28;;\nesac\n' % cases)
    (bindir / 'curl').chmod(0o755)
    (bindir / 'sleep').write_text('#!/bin/sh\nexit 0\n')
    (bindir / 'sleep').chmod(0o755)
    script = _doctor_isolation.isolation_script(TARGETS, timeout=1, settle=0).replace('/tmp/', str(tmp_path) + '/')
    out = subprocess.run(['sh', '-c', script], env={'PATH': '%s:/usr/bin:/bin' % bindir}, capture_output=True,
                         text=True, timeout=30, check=False)
    return _doctor_isolation.parse_isolation_output(out.stdout)


def test_isolation_script_runs_and_parses(tmp_path):
    parsed = fake_curl_run(tmp_path, {'http://p:3128/': ('400', 0), 'http://pb:3128/': ('000', 6)})
    assert parsed['proxy'] == dict(code=400, rc=0, error='')
    assert parsed['peer_name']['rc'] == 6 and parsed['peer_name']['code'] == 0
    assert parsed['peer_address']['rc'] == 28
    assert parsed['proxy_other']['rc'] == 28


def test_parse_isolation_output_needs_every_check():
    assert _doctor_isolation.parse_isolation_output('PIDOCTOR-ISO proxy 400 0 \n') is None
    assert _doctor_isolation.parse_isolation_output('') is None


@pytest.mark.parametrize('check, expect', [
    (dict(code=400, rc=0, error=''), True),
    (dict(code=0, rc=7, error='Could not connect to server'), True),   # refused: packets got there
    (dict(code=0, rc=28, error='Connection timed out'), False),         # dropped
    (dict(code=0, rc=6, error='Could not resolve host'), False),
    # exit 7 without a route (Docker 26+ internal networks): the packet never left the peer
    (dict(code=0, rc=7, error='* Immediate connect fail for 10.47.0.13: Network is unreachable '
                              'curl: (7) Failed to connect to 10.47.0.13 port 3128 after 0 ms'), False),
    (dict(code=0, rc=7, error='* connect to 10.47.0.13 port 3128 failed: No route to host'), False),
    (dict(code=0, rc=7, error='* connect to 10.47.0.13 port 3128 from 10.47.0.6 port 40000 failed: '
                              'Connection refused curl: (7) Failed to connect'), True),
])
def test_reached(check, expect):
    assert _doctor_isolation.reached(check) is expect


def peers(a_result, b_result):
    return [dict(peer='pa', net='na', other='pb', targets=TARGETS, result=a_result, why=None),
            dict(peer='pb', net='nb', other='pa', targets=TARGETS, result=b_result, why=None)]


ISOLATED = dict(proxy=dict(code=400, rc=0, error=''), peer_name=dict(code=0, rc=28, error=''),
                peer_address=dict(code=0, rc=28, error=''), proxy_other=dict(code=0, rc=28, error=''))


@pytest.mark.parametrize('case, a, b, expect', [
    ('isolated', ISOLATED, ISOLATED, ('isolation.peers', 'ok')),
    ('peer address refused: reached', dict(ISOLATED, peer_address=dict(code=0, rc=7, error='')), ISOLATED,
     ('isolation.leaks', 'fail')),
    ("proxy's other address answered", ISOLATED, dict(ISOLATED, proxy_other=dict(code=400, rc=0, error='')),
     ('isolation.leaks', 'fail')),
    ('name resolves and answers', dict(ISOLATED, peer_name=dict(code=200, rc=0, error='')), ISOLATED,
     ('isolation.leaks', 'fail')),
    ('proxy unreached', ISOLATED, dict(ISOLATED, proxy=dict(code=0, rc=28, error='timed out')),
     ('isolation.proxy_unreached', 'fail')),
    ('no reading', None, ISOLATED, ('isolation.notrun', 'notrun')),
])
def test_classify_isolation(case, a, b, expect):
    line = _doctor_isolation.classify_isolation(peers(a, b))
    assert (line.id, line.status) == expect, case
    if line.status == 'fail':
        assert line.fix
    if expect[0] == 'isolation.leaks':
        assert 'reached' in line.message


def test_peer_address_is_the_last_usable():
    assert _doctor_isolation.peer_address('10.47.0.8/29') == '10.47.0.14'
    assert _doctor_isolation.peer_address('10.47.0.8/29', 'b') == '10.47.0.13'
    assert _doctor_names.isolation_network_name(12, 'a') == 'pi-job-doctor-12-a-net'
    assert _doctor_names.parse_doctor_network(_doctor_names.isolation_network_name(12, 'b')) == 12
    assert _doctor_names.probe_pid(_doctor_names.peer_name('a', 12)) == 12


@pytest.mark.parametrize('probe, net, expect', [
    ('pi-dispatch-egress-probe-peer-a-12', 'pi-job-doctor-12-a-net', True),
    ('pi-dispatch-egress-probe-peer-b-12', 'pi-job-doctor-12-a-net', False),
    ('pi-dispatch-egress-probe-deny-12', 'pi-job-doctor-12-a-net', False),
    ('pi-dispatch-egress-probe-deny-12', 'pi-dispatch-egress-doctor-12', True),
    ('pi-dispatch-egress-probe-endpoint-tunnel-m1-12', 'pi-dispatch-egress-doctor-12', True),
    ('pi-dispatch-egress-probe-peer-a-12', 'pi-dispatch-egress-doctor-12', False),
    ('pi-dispatch-egress-probe-deny-13', 'pi-dispatch-egress-doctor-12', False),
])
def test_probe_of_network(probe, net, expect):
    assert _doctor_sweep.probe_of_network(probe, net, 12) is expect


# --- the TLS name check's probes (issue 25) -----------------------------------------------------------

@pytest.mark.parametrize('fn, res, expect', [
    ('sni', result(connect=200, code=0, rc=35, error='SSL connect error'), ('canary.sni', 'ok')),
    ('sni', result(connect=200, code=0, rc=56), ('canary.sni', 'ok')),
    ('sni', result(connect=200, code=401), ('canary.sni_leaks', 'fail')),
    ('sni', result(connect=200, code=200), ('canary.sni_leaks', 'fail')),
    ('sni', result(connect=403), ('canary.notrun', 'notrun')),
    ('sni', result(connect=503), ('canary.notrun', 'notrun')),
    ('sni', result(connect=0, rc=28, error='timeout'), ('canary.notrun', 'notrun')),
    ('sni', None, ('canary.notrun', 'notrun')),
    ('tunnel_plain', result(connect=200, code=0, rc=52), ('canary.tunnel_plain', 'ok')),
    ('tunnel_plain', result(connect=200, code=400), ('canary.tunnel_plain_leaks', 'fail')),
    ('tunnel_plain', result(connect=200, code=404), ('canary.tunnel_plain_leaks', 'fail')),
    ('tunnel_plain', result(connect=403), ('canary.notrun', 'notrun')),
    ('tunnel_plain', None, ('canary.notrun', 'notrun')),
])
def test_tls_check_probes(fn, res, expect):
    if fn == 'sni':
        line = _doctor_tls.classify_tls_check('sni', 'api.provider.test', 'denied.test', res,
                                              why_not='it did not start')
    else:
        line = _doctor_tls.classify_tls_check('tunnel_plain', 'api.provider.test', 'denied.test', res,
                                              why_not='it did not start')
    assert (line.id, line.status) == expect, line
    assert 'api.provider.test' in line.message or line.status == 'notrun'
    if line.status == 'fail':
        assert 'egress_upgrade_refresh_rules=true' in line.fix


def test_the_sni_probe_tunnels_to_the_provider_with_a_hello_for_the_deny_host():
    script = _doctor_probes.probe_script('https://denied.test/', 'http://proxy:3128', 5,
                                         connect_to='denied.test:443:api.provider.test:443')
    assert "--connect-to 'denied.test:443:api.provider.test:443' 'https://denied.test/'" in script
    plain = _doctor_probes.probe_script('http://api.provider.test:443/', 'http://proxy:3128', 5, tunnel=True)
    assert "-p 'http://api.provider.test:443/'" in plain and '--connect-to' not in plain
