"""The preflight with a job's mcp.json (API 3.3): refused from the files before the daemon is asked."""

import json

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as jn

SECRET = 'sk-mcp-HEADER-SECRET-42'


class _Boom(object):
    """A client that fails on any use: a refusal from the files must never reach it."""

    def __getattr__(self, name):
        raise AssertionError('the daemon was asked (%s)' % name)


class _Running(object):
    class containers(object):  # noqa: N801 - the SDK's attribute
        calls = []

        @classmethod
        def get(cls, name):
            cls.calls.append(name)

            class _C(object):
                attrs = {'State': {'Status': 'running'}}
            return _C()


@pytest.fixture
def deploy(tmp_path):
    folder = tmp_path / 'egress'
    folder.mkdir()
    (folder / 'egress-allowlist.conf').write_text('# listed\nmcp.example.com\nregistry.npmjs.org\n')
    (folder / 'model-endpoints.json').write_text(json.dumps({'version': 1, 'endpoints': [
        {'id': 'local-mcp', 'host': 'host.docker.internal', 'port': 8931, 'slots': 1}]}))
    return folder


def _mcp(tmp_path, servers, raw=None):
    path = tmp_path / 'mcp.json'
    path.write_text(raw if raw is not None else json.dumps({'mcpServers': servers}))
    return str(path)


@pytest.mark.parametrize('servers, names', [
    ({'evil': {'url': 'https://evil.test/mcp'}}, ['evil']),
    ({'ok': {'url': 'https://mcp.example.com/mcp'}, 'port': {'url': 'https://mcp.example.com:8443/'}}, ['port']),
    ({'plain': {'url': 'http://mcp.example.com/mcp'}, 'near': {'url': 'http://host.docker.internal:8932/'}},
     ['plain', 'near']),
])
def test_an_unreachable_server_is_refused_by_name_and_the_daemon_is_not_asked(deploy, tmp_path, servers, names):
    v = jn.preflight(_Boom(), mcp_json=_mcp(tmp_path, servers), deploy_dir=str(deploy))
    assert v.verdict == jn.MCP_SERVER_REFUSED and not v.admitted and not v.retryable
    for name in names:
        assert "MCP server '%s'" % name in v.message
    assert 'The job was not started' in v.message
    assert jn.MCP_SERVER_REFUSED in jn.MCP_VERDICTS and jn.MCP_SERVER_REFUSED not in jn.VERDICTS


def test_reachable_servers_are_admitted_after_the_one_inspect(deploy, tmp_path):
    servers = {'docs': {'url': 'https://mcp.example.com/mcp', 'headers': {'Authorization': 'Bearer ' + SECRET}},
               'local': {'url': 'http://host.docker.internal:8931/mcp'},
               'off': {'url': 'https://evil.test/', 'enabled': False},
               'fs': {'command': 'npx', 'args': ['-y', '@mcp/fs']},
               'git': {'command': 'uvx', 'args': ['mcp-server-git']}}
    _Running.containers.calls = []
    v = jn.preflight(_Running(), mcp_json=_mcp(tmp_path, servers), deploy_dir=str(deploy))
    assert v.verdict == jn.ADMIT and _Running.containers.calls == ['pi-dispatch-egress-proxy']
    assert '2 MCP servers carried by the proxy' in v.message
    assert "MCP server 'git': runs uvx" in v.message and 'pypi.org' in v.message  # said, not refused
    assert SECRET not in v.message


@pytest.mark.parametrize('raw, says', [
    ('{"mcpServers": {"a": {"url": 9}}}', 'mcpServers.a.url is a number'),
    ('{"mcpServers": ', 'is not valid JSON'),
])
def test_a_file_pi_would_not_read_is_refused(deploy, tmp_path, raw, says):
    v = jn.preflight(_Boom(), mcp_json=_mcp(tmp_path, None, raw=raw), deploy_dir=str(deploy))
    assert v.verdict == jn.MCP_SERVER_REFUSED and says in v.message


def test_a_missing_allowlist_refuses_rather_than_guesses(tmp_path):
    v = jn.preflight(_Boom(), mcp_json=_mcp(tmp_path, {}), deploy_dir=str(tmp_path / 'nowhere'))
    assert v.verdict == jn.MCP_SERVER_REFUSED and 'could not be read' in v.message


def test_egress_off_admits_without_reading_the_file(tmp_path):
    v = jn.preflight(_Boom(), enabled=False, mcp_json=str(tmp_path / 'missing.json'))
    assert v.verdict == jn.ADMIT
