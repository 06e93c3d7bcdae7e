"""The allowlist parser and validator: a table of good and bad lines."""

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils import _allowlist

GOOD = [
    ('api.anthropic.com', 'api.anthropic.com'),
    ('.github.com', '.github.com'),
    ('registry.npmjs.org', 'registry.npmjs.org'),
    ('API.Anthropic.COM', 'api.anthropic.com'),          # lowercased as squid compares
    ('a.b', 'a.b'),
    ('x-y.example.org', 'x-y.example.org'),
    ('xn--bcher-kva.example', 'xn--bcher-kva.example'),  # punycode
    ('localhost', 'localhost'),                          # a bare single label is a name
    ('203.0.113.7', '203.0.113.7'),                      # an IPv4 literal listed as written
    ('api.provider.test   # trailing note', 'api.provider.test'),
    ('\tindented.example.com', 'indented.example.com'),
    ('crlf.example.com\r', 'crlf.example.com'),
    ('a' * 63 + '.example.com', 'a' * 63 + '.example.com'),
    ('1password.com', '1password.com'),                 # a label may start with a digit
    ('.' + '.'.join(['abcdefgh'] * 27), None),           # 243 characters: still fine
]

BAD = [
    ('https://api.anthropic.com', 'is a URL'),
    ('http://example.com/', 'is a URL'),
    ('api.anthropic.com:443', 'port'),
    ('example.com/path', 'path'),
    ('*.example.com', 'wildcard'),
    ('exa?ple.com', 'wildcard'),
    ('"example.com"', 'quote'),
    ("'example.com'", 'quote'),
    ('api.anthropic.com extra', 'space inside'),
    ('two words.com', 'space inside'),
    ('exa\x01mple.com', 'control character'),
    ('exa\x7fmple.com', 'control character'),
    ('bücher.example', 'non-ASCII'),
    ('.', 'lone dot'),
    ('..example.com', 'more than one dot'),
    ('example.com.', 'ends with a dot'),
    ('example..com', 'empty label'),
    ('a' * 64 + '.com', 'label longer than 63'),
    ('.'.join(['abcdefghi'] * 26), 'longer than 253'),
    ('-bad.example.com', 'not a hostname label'),
    ('bad-.example.com', 'not a hostname label'),
    ('under_score.example.com', 'not a hostname label'),
    ('example.123', 'numeric label'),
    ('1.2.3', 'numeric label'),
    ('.10.0.0.1', 'leading dot before an IP'),
    ('[::1]', 'bracketed'),
    ('::1', 'colon'),
    ('user@example.com', 'user information'),
    ('exam#ple.com', '# inside'),
    ('example.com;rm', 'not a hostname label'),
]


@pytest.mark.parametrize('line, expected', GOOD)
def test_good_lines_are_entries(line, expected):
    result = _allowlist.parse('# header\n' + line + '\n', path='/d/egress-allowlist.conf')
    assert result.errors == [], [str(e) for e in result.errors]
    assert len(result.entries) == 1
    lineno, entry = result.entries[0]
    assert lineno == 2
    if expected is not None:
        assert entry == expected


@pytest.mark.parametrize('line, reason', BAD)
def test_bad_lines_are_refused_with_file_line_and_text(line, reason):
    text = 'ok.example.com\n\n# comment\n' + line + '\nalso-ok.example.com\n'
    result = _allowlist.parse(text, path='/d/egress-allowlist.conf')
    assert not result.ok
    assert len(result.errors) == 1, [str(e) for e in result.errors]
    err = result.errors[0]
    assert err.lineno == 4
    assert err.path == '/d/egress-allowlist.conf'
    assert reason in err.reason, err.reason
    assert err.fix
    message = str(err)
    assert message.startswith('/d/egress-allowlist.conf:4: ')
    assert repr(line.strip(' \t').split(' ')[0])[1:-1][:5] in message
    # The good lines around the bad one are still read.
    assert result.hosts() == ['ok.example.com', 'also-ok.example.com']


def test_table_is_big_enough():
    assert len(GOOD) + len(BAD) >= 30


@pytest.mark.parametrize('text', ['', '\n', '# only a comment\n', '   \n\t\n', '#a\n  # b\n'])
def test_comments_and_blank_lines_only(text):
    result = _allowlist.parse(text)
    assert result.ok and result.entries == [] and result.warnings == []


def test_byte_order_mark_is_refused():
    result = _allowlist.parse('\ufeffapi.anthropic.com\n')
    assert not result.ok
    assert result.errors[0].lineno == 1 and 'byte order mark' in result.errors[0].reason


@pytest.mark.parametrize('entry', ['host.docker.internal', 'host.containers.internal', '.internal',
                                   '.docker.internal', '.containers.internal', 'HOST.DOCKER.INTERNAL'])
def test_entries_that_open_this_host_warn_and_point_to_model_endpoints(entry):
    result = _allowlist.parse('api.anthropic.com\n%s\n' % entry)
    assert result.ok
    opening = [w for w in result.warnings if 'opens this host' in w.reason]
    assert len(opening) == 1 and opening[0].lineno == 2
    assert 'model-endpoints.json' in opening[0].fix


@pytest.mark.parametrize('entry', ['internal.example.com', '.example.internal.com', 'docker.internal.example'])
def test_lookalikes_do_not_warn(entry):
    result = _allowlist.parse(entry + '\n')
    assert result.ok and result.warnings == []


def test_duplicate_and_covered_entries_warn():
    result = _allowlist.parse('.github.com\napi.github.com\n.github.com\nGITHUB.com\n')
    assert result.ok
    reasons = sorted((w.lineno, w.reason) for w in result.warnings)
    assert (3, 'repeats line 1') in reasons
    assert any(n == 2 and 'covered by .github.com on line 1' in r for n, r in reasons)
    assert any(n == 4 and 'covered by .github.com' in r for n, r in reasons)


def test_seed_renders_and_parses_back():
    text = _allowlist.render_seed([{'host': 'api.anthropic.com', 'comment': 'the provider'},
                                   {'host': '.github.com'}])
    result = _allowlist.parse(text)
    assert result.ok and result.hosts() == ['api.anthropic.com', '.github.com']
    assert 'api.anthropic.com  # the provider' in text


def test_problem_as_dict_names_everything():
    err = _allowlist.parse('http://x.test\n', path='/p').errors[0]
    d = err.as_dict()
    assert d['path'] == '/p' and d['line'] == 1 and d['text'] == 'http://x.test'
    assert d['message'] == str(err)
