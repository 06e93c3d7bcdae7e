"""The doctor's MCP lines and the MCP server endpoint's tunnel verdict (seed 000)."""

import json

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import doctor as _doctor
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import mcp as _dmcp
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import probes as _probes
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.context import DoctorContext
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import mcp as _mcp
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy.endpoints import Endpoint
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy.decisions import Matcher

EP = Endpoint('mcp-tls', 'models.test', 8443, 1)


def result(connect, code=0, rc=0):
    return dict(connect=connect, code=code, rc=rc, headers='', body='')


@pytest.mark.parametrize('probe, line_id, status, says', [
    (result(200, 200), 'endpoint.mcp_tunnel', 'ok', ': 200); an MCP server does not serve that path'),
    (result(200, 404), 'endpoint.mcp_tunnel', 'ok', ': 404)'),  # a model endpoint would warn on this
    (result(200, 405), 'endpoint.mcp_tunnel', 'ok', ': 405)'),
    (result(200, 401), 'endpoint.mcp_tunnel', 'ok', ': 401)'),
    (result(200, 0, 52), 'endpoint.mcp_tunnel', 'ok', 'closed the plain request, as a TLS server does'),
    (result(200, 0, 56), 'endpoint.mcp_tunnel', 'ok', 'as a TLS server does'),
    (result(200, 0, 28), 'endpoint.mcp_tunnel_fails', 'warn', 'no answer came within 15s'),
    (result(503), 'endpoint.mcp_tunnel_fails', 'warn', 'the proxy answered 503'),
    (result(403), 'endpoint.mcp_tunnel_fails', 'warn', 'the proxy answered 403'),
    (None, 'endpoint.notrun', 'notrun', 'did not run'),
])
def test_the_mcp_server_endpoint_tunnel_passes_on_any_answer(probe, line_id, status, says):
    line = _probes.classify_mcp_tunnel(EP, probe, 15, why_not='no probe')
    assert (line.id, line.status) == (line_id, status)
    assert says in line.message and line.message.startswith('MCP server endpoint mcp-tls'), line.message


@pytest.mark.parametrize('probe', [result(200, 404), result(200, 0, 52)])
def test_the_same_answers_from_a_model_endpoint_warn(probe):
    assert _probes.classify_endpoint_tunnel(EP, probe, 15).id == 'endpoint.tunnel_fails'


def _findings(servers):
    listed = Matcher(['mcp.example.com']).covers
    return _mcp.judge(_mcp.parse(json.dumps({'mcpServers': servers})), listed, [EP])


def test_mcp_lines_refused_runner_and_ok():
    lines = _dmcp.mcp_lines('/o/mcp.json', _findings({
        'bad': {'url': 'https://user:tok-SECRET@evil.test/mcp'}, 'py': {'command': 'uvx'},
        'docs': {'url': 'https://mcp.example.com/mcp'}}))
    assert [(line.id, line.status) for line in lines] == [('overlay.mcp_refused', 'fail'),
                                                          ('overlay.mcp_runner', 'warn')]
    assert 'MCP server bad (https://***@evil.test/mcp): evil.test is not listed' in lines[0].message
    assert 'tok-SECRET' not in lines[0].message and lines[0].fix
    assert 'runs uvx' in lines[1].message
    ok = _dmcp.mcp_lines('/o/mcp.json', _findings({'docs': {'url': 'https://mcp.example.com/mcp'},
                                                   'tls': {'url': 'https://models.test:8443/mcp'}}))
    assert [line.id for line in ok] == ['overlay.mcp_ok']
    assert 'docs (mcp.example.com is listed' in ok[0].message and 'tls (is the declared model endpoint mcp-tls' in \
        ok[0].message
    unread = _dmcp.mcp_lines('/o/mcp.json', None, '/o/mcp.json: "mcpServers" is a list')
    assert [(line.id, line.status) for line in unread] == [('overlay.mcp_unread', 'fail')]


@pytest.mark.parametrize('servers, models, expected', [
    ({'tls': {'url': 'https://models.test:8443/mcp'}}, set(), {'mcp-tls'}),
    ({'tls': {'url': 'https://models.test:8443/mcp'}}, {('models.test', 8443)}, set()),  # a model uses it too
    ({'tls': {'url': 'https://models.test:8443/mcp', 'enabled': False}}, set(), set()),
    ({'other': {'url': 'https://mcp.example.com/mcp'}}, set(), set()),
    ({}, set(), set()),
])
def test_which_endpoints_only_an_mcp_server_uses(servers, models, expected):
    assert _dmcp.mcp_only(_findings(servers), [EP], models) == expected


@pytest.mark.parametrize('text, expected', [
    (None, set()),
    ('{"providers": {"p": {"baseUrl": "http://models.test:8443/v1", "models": []}}}', {('models.test', 8443)}),
    ('{"providers": {"p": {"models": [{"id": "m", "baseUrl": "https://Models.TEST/v1"}]}}}', {('models.test', 443)}),
    ('{"providers": ', set()),
    ('// c\n{"providers": {"p": {"baseUrl": "http://a.test:1/v1",},},}', {('a.test', 1)}),
])
def test_model_addresses(text, expected):
    assert _dmcp.model_addresses(text) == expected


def test_the_check_reads_the_files_once_and_says_nothing_without_mcp_json(tmp_path):
    deploy = tmp_path / 'egress'
    deploy.mkdir()
    (deploy / 'egress-allowlist.conf').write_text('mcp.example.com\n')
    (deploy / 'model-endpoints.json').write_text(json.dumps({'version': 1, 'endpoints': [
        {'id': 'mcp-tls', 'host': 'models.test', 'port': 8443, 'slots': 1}]}))
    mcp = tmp_path / 'mcp.json'
    mcp.write_text('{"mcpServers": {"tls": {"url": "https://models.test:8443/mcp"}}}')
    ctx = DoctorContext.build(object(), _doctor.DoctorOptions('p', str(deploy), 'img', pid=7, environ={},
                                                              mcp_json=str(mcp)))
    assert _dmcp.mcp_only_endpoints(ctx) == {'mcp-tls'}
    mcp.write_text('{"mcpServers": []}')  # read once per run: the judgement stays the first one
    assert [line.id for line in _dmcp.McpCheck().lines(ctx)] == ['overlay.mcp_ok']
    none = DoctorContext.build(object(), _doctor.DoctorOptions('p', str(deploy), 'img', pid=7, environ={}))
    assert _dmcp.McpCheck().lines(none) == [] and _dmcp.mcp_only_endpoints(none) == set()
