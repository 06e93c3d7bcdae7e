"""The doctor's forge lines: https:// on 443 and listed, or a warning that names why (seed 000)."""

import os

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import doctor as _doctor
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import forge as _forge
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy.decisions import Matcher

LISTED = Matcher(['gitlab.example.com', '.forge.test', 'api.provider.test']).covers
TOKEN = 'glpat-SECRETSECRET0123456789'


@pytest.mark.parametrize('url, line_id, says', [
    ('https://gitlab.example.com', 'forge.ok', 'is https:// on 443 and its host is listed'),
    ('https://gitlab.example.com/', 'forge.ok', 'https://gitlab.example.com/'),
    ('https://gitlab.example.com:443/group', 'forge.ok', 'https://gitlab.example.com:443/group'),
    ('https://GitLab.Example.COM', 'forge.ok', 'listed'),
    ('https://code.forge.test', 'forge.ok', 'listed'),  # a leading-dot entry covers it
    ('https://forge.test', 'forge.ok', 'listed'),       # and the apex, as squid's .domain does
    ('http://gitlab.example.com', 'forge.http', 'git ignores HTTP_PROXY for an http:// remote'),
    ('http://gitlab.example.com:80', 'forge.http', 'on any port'),
    ('http://gitlab.example.com:8080', 'forge.http', 'http://gitlab.example.com:8080'),
    ('https://gitlab.example.com:8443', 'forge.port', 'on port 8443: the proxy refuses a CONNECT to any port but 443'),
    ('https://gitlab.example.com:80', 'forge.port', 'on port 80'),
    ('https://gitlab.unlisted.test', 'forge.unlisted', 'gitlab.unlisted.test is not in the allowlist'),
    ('https://notforge.test', 'forge.unlisted', 'notforge.test is not in the allowlist'),
    ('https://10.0.0.5', 'forge.unlisted', '10.0.0.5 is not in the allowlist'),
    ('ssh://git@gitlab.example.com/group', 'forge.unparsed', 'is not an http:// or https:// URL with a host'),
    ('gitlab.example.com', 'forge.unparsed', 'gitlab.example.com'),
    ('https://', 'forge.unparsed', 'https://'),
    ('https://gitlab.example.com:99999', 'forge.unparsed', 'not an http:// or https:// URL'),
])
def test_one_forge(url, line_id, says):
    lines = _forge.forge_lines({'GITLAB_URL': url}, LISTED)
    assert [line.id for line in lines] == [line_id]
    assert says in lines[0].message and 'GITLAB_URL' in lines[0].message
    assert '<' not in lines[0].message
    assert (lines[0].status == 'ok') == (line_id == 'forge.ok')
    assert (lines[0].fix is None) == (line_id == 'forge.ok')


@pytest.mark.parametrize('url', [
    'https://oauth2:%s@gitlab.example.com' % TOKEN,
    'http://oauth2:%s@gitlab.example.com' % TOKEN,
    'https://%s@gitlab.example.com:8443/x' % TOKEN,
    'https://%s@gitlab.unlisted.test' % TOKEN,
])
def test_a_token_in_a_forge_url_is_never_shown(url):
    lines = _forge.forge_lines({'FORGEJO_URL': url}, LISTED)
    for line in lines:
        assert TOKEN not in repr(line.as_dict()) and 'oauth2' not in line.message


def test_the_allowlist_unread_is_said_on_the_ok_line():
    lines = _forge.forge_lines({'GITLAB_URL': 'https://gitlab.unlisted.test'}, None, 'the allowlist is refused')
    assert [line.id for line in lines] == ['forge.ok']
    assert 'not compared with the allowlist (the allowlist is refused)' in lines[0].message


@pytest.mark.parametrize('given, environ, expected', [
    ({}, {}, {}),
    ({}, {'GITLAB_URL': 'https://g.test'}, {'GITLAB_URL': 'https://g.test'}),
    ({}, {'GITLAB_URL': 'https://g.test', 'FORGEJO_URL': 'http://f.test', 'OTHER_URL': 'x'},
     {'GITLAB_URL': 'https://g.test', 'FORGEJO_URL': 'http://f.test'}),
    ({}, {'GITLAB_URL': '  '}, {}),
    ({'forge': 'https://mine.test'}, {'GITLAB_URL': 'https://g.test'}, {'forge': 'https://mine.test'}),
    ({'forge': ''}, {}, {}),
])
def test_which_urls_are_checked(given, environ, expected):
    assert _forge.configured(given, environ) == expected


def test_several_forges_in_name_order():
    lines = _forge.forge_lines({'GITLAB_URL': 'http://g.forge.test', 'FORGEJO_URL': 'https://f.forge.test'}, LISTED)
    assert [line.id for line in lines] == ['forge.ok', 'forge.http']


def test_the_check_reads_the_deployment_allowlist(tmp_path):
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.context import DoctorContext
    deploy = tmp_path / 'egress'
    deploy.mkdir()
    (deploy / 'egress-allowlist.conf').write_text('# forges\n.forge.test\n')
    opts = _doctor.DoctorOptions('p', str(deploy), 'img', pid=7, environ={'GITLAB_URL': 'https://gl.forge.test'},
                                 forge_urls={})
    lines = _forge.ForgeCheck().lines(DoctorContext.build(object(), opts))
    assert [(line.id, line.status) for line in lines] == [('forge.ok', 'ok')]
    opts = _doctor.DoctorOptions('p', str(deploy), 'img', pid=7, environ={},
                                 forge_urls={'forge': 'https://gl.other.test'})
    lines = _forge.ForgeCheck().lines(DoctorContext.build(object(), opts))
    assert [(line.id, line.status) for line in lines] == [('forge.unlisted', 'warn')]
    os.remove(str(deploy / 'egress-allowlist.conf'))
    lines = _forge.ForgeCheck().lines(DoctorContext.build(object(), opts))
    assert lines[0].id == 'forge.ok' and 'could not be read' in lines[0].message


def test_no_forge_configured_no_line(tmp_path):
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.context import DoctorContext
    opts = _doctor.DoctorOptions('p', str(tmp_path), 'img', pid=7, environ={})
    assert _forge.ForgeCheck().lines(DoctorContext.build(object(), opts)) == []
