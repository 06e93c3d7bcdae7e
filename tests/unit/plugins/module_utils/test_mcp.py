"""A job's mcp.json against the egress policy: read the way pi reads it, each server judged (seed 000)."""

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import mcp as _mcp
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy.endpoints import Endpoint
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy.decisions import Matcher

LISTED = Matcher(['mcp.example.com', '.tools.test', 'registry.npmjs.org']).covers
ENDPOINTS = [Endpoint('local-mcp', 'host.docker.internal', 8931, 1), Endpoint('gpu', '10.0.0.7', 8000, 2)]
SECRET = 'sk-mcp-SECRET-0123456789'


def one(text):
    servers = _mcp.parse(text)
    return _mcp.judge(servers, LISTED, ENDPOINTS)


@pytest.mark.parametrize('text, kinds, says', [
    # Reachable: listed, https, 443.
    ('{"mcpServers": {"docs": {"url": "https://mcp.example.com/mcp"}}}', ['listed'], 'mcp.example.com is listed'),
    ('{"mcpServers": {"docs": {"url": "https://MCP.Example.COM:443/mcp"}}}', ['listed'], 'listed'),
    ('{"mcpServers": {"t": {"url": "https://a.tools.test/mcp", "type": "streamable-http"}}}', ['listed'],
     'a.tools.test'),
    # Reachable: exactly a declared model endpoint (host and port), http or https.
    ('{"mcpServers": {"pw": {"url": "http://host.docker.internal:8931/mcp"}}}', ['endpoint'], 'local-mcp'),
    ('{"mcpServers": {"g": {"url": "https://10.0.0.7:8000/mcp"}}}', ['endpoint'], 'gpu (10.0.0.7:8000)'),
    # Refused: not listed, wrong port, http, not an endpoint's exact port.
    ('{"mcpServers": {"x": {"url": "https://evil.test/mcp"}}}', ['refused'], 'evil.test is not listed'),
    ('{"mcpServers": {"x": {"url": "https://mcp.example.com:8443/mcp"}}}', ['refused'], 'port 8443'),
    ('{"mcpServers": {"x": {"url": "http://mcp.example.com/mcp"}}}', ['refused'], 'is http://'),
    ('{"mcpServers": {"x": {"url": "http://host.docker.internal:8932/mcp"}}}', ['refused'],
     'host.docker.internal:8932 is not a declared model endpoint'),
    ('{"mcpServers": {"x": {"url": "ftp://mcp.example.com/"}}}', ['refused'], 'not an http:// or https:// URL'),
    ('{"mcpServers": {"x": {"url": "https://tools.test.evil.test/"}}}', ['refused'], 'is not listed'),
    # Switched off: not judged.
    ('{"mcpServers": {"x": {"url": "https://evil.test/", "enabled": false}}}', [], None),
    ('{"mcpServers": {"x": {"url": "https://evil.test/", "disabled": true}}}', [], None),
    # Run by the job: a runner needs its registry listed.
    ('{"mcpServers": {"fs": {"command": "npx", "args": ["-y", "@mcp/fs"]}}}', ['local'], 'runs in the job (npx)'),
    ('{"mcpServers": {"py": {"command": "uvx", "args": ["mcp-server-git"]}}}', ['runner'],
     'pypi.org, files.pythonhosted.org not listed'),
    ('{"mcpServers": {"py": {"command": "/usr/local/bin/uvx"}}}', ['runner'], 'runs uvx'),
    ('{"mcpServers": {"bin": {"command": "/opt/mcp/server", "args": []}}}', ['local'], 'in the job (server)'),
    # Read as pi reads it: comments, trailing commas, a byte order mark.
    ('// the job\'s servers\n{"mcpServers": {/* docs */ "docs": {"url": "https://mcp.example.com/mcp",},},}',
     ['listed'], 'listed'),
    ('\ufeff{"mcpServers": {"docs": {"url": "https://mcp.example.com/mcp"}}}', ['listed'], 'listed'),
    (b'\xef\xbb\xbf{"mcpServers": {"x": {"url": "https://evil.test/"}}}', ['refused'], 'evil.test'),
    # No servers at all.
    ('{}', [], None),
    ('{"mcpServers": {}}', [], None),
    # Several, in file order.
    ('{"mcpServers": {"a": {"url": "https://evil.test/"}, "b": {"url": "https://mcp.example.com/"}}}',
     ['refused', 'listed'], 'evil.test'),
])
def test_servers_judged(text, kinds, says):
    findings = one(text)
    assert [f.kind for f in findings] == kinds
    if says:
        assert says in str(findings[0]), str(findings[0])
    for finding in findings:
        assert finding.refused == (finding.kind == 'refused')
        assert bool(finding.fix) == (finding.kind in ('refused', 'runner'))


@pytest.mark.parametrize('text, says', [
    ('{"mcpServers": ', 'is not valid JSON'),
    ('{"mcpServers": {"a": {"url": "https://x.test/"}} /* never closed', 'never closed'),
    ('[]', 'the top level is a list'),
    ('{"mcpServers": []}', '"mcpServers" is a list'),
    ('{"mcpServers": {"a": "https://x.test/"}}', 'mcpServers.a is a string, not an object'),
    ('{"mcpServers": {"a": {"url": 7}}}', 'mcpServers.a.url is a number'),
    ('{"mcpServers": {"a": {"url": "https://x.test/", "enabled": "yes"}}}', 'mcpServers.a.enabled is a string'),
    ('{"mcpServers": {"a": {"command": "npx", "args": "-y pkg"}}}', 'mcpServers.a.args is a string, not a list'),
    ('{"mcpServers": {"a": {"url": "https://x.test/", "headers": []}}}', 'mcpServers.a.headers is a list'),
    ('{"mcpServers": {"a": {}}}', 'neither url nor command'),
    ('{"mcpServers": {"a": {"url": "https://x.test/", "command": "npx"}}}', 'both url and command'),
    ('{"mcpServers": {"a": {"url": "https://x.test/", "x": NaN}}}', 'is not valid JSON'),
    (b'\xff\xfe{}', 'is not UTF-8'),
])
def test_a_file_pi_would_not_read_is_refused_naming_where(text, says):
    with pytest.raises(_mcp.McpError) as info:
        _mcp.parse(text, '/job/mcp.json')
    assert str(info.value).startswith('/job/mcp.json') and says in str(info.value), str(info.value)


def test_a_secret_in_a_url_or_header_never_reaches_a_message():
    text = ('{"mcpServers": {"a": {"url": "https://user:%s@evil.test/mcp?api_key=%s", '
            '"headers": {"Authorization": "Bearer %s"}}}}' % (SECRET, SECRET, SECRET))
    findings = one(text)
    assert findings[0].refused
    assert SECRET not in str(findings[0]) and SECRET not in repr(findings[0].as_dict())


def test_load_refuses_a_symlink_and_a_missing_file(tmp_path):
    real = tmp_path / 'real.json'
    real.write_text('{"mcpServers": {}}')
    link = tmp_path / 'mcp.json'
    link.symlink_to(real)
    with pytest.raises(_mcp.McpError, match='is a symlink'):
        _mcp.load(str(link))
    with pytest.raises(_mcp.McpError, match='could not be read'):
        _mcp.load(str(tmp_path / 'missing.json'))
    assert _mcp.load(str(real)) == []
