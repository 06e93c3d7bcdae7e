"""The allowlist parser and validator: a table of good and bad lines."""

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import allowlist as _allowlist

GOOD = [
    ('api.anthropic.com', 'api.anthropic.com'),
    ('.github.com', '.github.com'),
    ('registry.npmjs.org', 'registry.npmjs.org'),
    ('API.Anthropic.COM', 'api.anthropic.com'),          # lowercased as squid compares
    ('a.b', 'a.b'),
    ('x-y.example.org', 'x-y.example.org'),
    ('xn--bcher-kva.example', 'xn--bcher-kva.example'),  # punycode
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


# .internal (one label) is refused outright now: see test_one_label_internal_is_refused_not_just_warned.
@pytest.mark.parametrize('entry', ['host.docker.internal', 'host.containers.internal',
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


# --- Breadth: an entry that covers a whole public suffix, or a single label ---------------------

# (entry, what public_suffix_covered answers): every row is refused by parse().
TOO_BROAD = [
    ('com', 'com'),                            # a one-label ICANN TLD, bare
    ('.com', 'com'),                           # ... and as a dot-domain
    ('.COM', 'com'),                           # compared in lowercase
    ('org', 'org'),
    ('.uk', 'uk'),
    ('co.uk', 'co.uk'),                        # a two-label ICANN suffix
    ('.co.uk', 'co.uk'),
    ('.Co.UK', 'co.uk'),
    ('.com.au', 'com.au'),
    ('github.io', 'github.io'),                # PRIVATE section
    ('.github.io', 'github.io'),
    ('.s3.amazonaws.com', 's3.amazonaws.com'),  # PRIVATE, three labels
    ('s3.amazonaws.com', 's3.amazonaws.com'),
    ('.herokuapp.com', 'herokuapp.com'),
    ('.blogspot.com', 'blogspot.com'),
    ('.pages.dev', 'pages.dev'),
    ('.ck', 'ck'),                             # the TLD under the *.ck wildcard rule
    ('foo.ck', 'foo.ck'),                      # *.ck: every name directly under ck is a suffix
    ('.foo.ck', 'foo.ck'),
    ('foo.kawasaki.jp', 'foo.kawasaki.jp'),    # *.kawasaki.jp
    ('.xn--55qx5d.cn', 'xn--55qx5d.cn'),       # a punycode ICANN suffix (gongsi.cn)
    ('localhost', 'localhost'),                # one label, not in the PSL
    ('.localhost', 'localhost'),
    ('intranet', 'intranet'),
    ('.test', 'test'),                         # reserved, not in the PSL: refused as one label
    ('test', 'test'),
    ('.internal', 'internal'),
    ('.example', 'example'),
    ('.lan', 'lan'),
]

# (entry,): fine, below a suffix; public_suffix_covered answers None and parse() keeps them.
BELOW_A_SUFFIX = [
    'example.com',
    '.example.com',
    'api.example.com',
    'example.co.uk',
    '.example.co.uk',
    'user.github.io',
    '.user.github.io',
    'bucket.s3.amazonaws.com',
    'www.ck',                                  # !www.ck: the exception to *.ck
    '.www.ck',
    'bar.foo.ck',                              # one label below the wildcard suffix foo.ck
    'city.kawasaki.jp',                        # !city.kawasaki.jp
    '.forge.test',                             # two labels under the unknown .test
    'forge.test',
    'api.provider.test',
    'plain.test',
    'loopback.test',
    'a.b',                                     # an unknown TLD counts as one public label only
    'docker.internal',
    'host.docker.internal',
    'xn--bcher-kva.example',
    '203.0.113.7',                             # IPv4 literals as before
    '10.0.0.1',
    'registry.npmjs.org',
    '.github.com',
    'api.anthropic.com',
]


def test_breadth_tables_are_big_enough():
    assert len(TOO_BROAD) >= 20 and len(BELOW_A_SUFFIX) >= 10


@pytest.mark.parametrize('entry, suffix', TOO_BROAD)
def test_public_suffix_covered_names_the_suffix(entry, suffix):
    assert _allowlist.public_suffix_covered(entry) == suffix


@pytest.mark.parametrize('entry', BELOW_A_SUFFIX)
def test_public_suffix_covered_is_none_below_a_suffix(entry):
    assert _allowlist.public_suffix_covered(entry) is None


@pytest.mark.parametrize('entry, suffix', TOO_BROAD)
def test_too_broad_entries_are_refused_with_file_line_suffix_and_fix(entry, suffix):
    text = 'ok.example.com\n# comment\n%s   # too wide\nalso-ok.example.com\n' % entry
    result = _allowlist.parse(text, path='/d/egress-allowlist.conf')
    assert not result.ok
    assert len(result.errors) == 1, [str(e) for e in result.errors]
    err = result.errors[0]
    assert (err.path, err.lineno, err.text) == ('/d/egress-allowlist.conf', 3, entry.lower())
    assert suffix in err.reason
    assert err.fix == 'list the exact host (api.example.com) or your own domain (.yourdomain.tld)'
    message = str(err)
    assert message.startswith("/d/egress-allowlist.conf:3: %r: " % entry.lower())
    assert suffix in message and 'api.example.com' in message and '.yourdomain.tld' in message
    # The refused line is no entry; the good lines around it still are.
    assert result.hosts() == ['ok.example.com', 'also-ok.example.com']


@pytest.mark.parametrize('entry', BELOW_A_SUFFIX)
def test_entries_below_a_suffix_are_accepted(entry):
    result = _allowlist.parse('# header\n%s\n' % entry)
    assert result.errors == [], [str(e) for e in result.errors]
    assert result.hosts() == [entry.lower()]


def test_messages_say_public_suffix_or_one_label():
    result = _allowlist.parse('.co.uk\n.github.io\nlocalhost\n.test\n', path='/p')
    reasons = [e.reason for e in result.errors]
    assert reasons[0].startswith('covers the whole public suffix co.uk')
    assert reasons[1].startswith('covers the whole public suffix github.io')
    assert reasons[2].startswith('is the one-label suffix localhost')
    assert reasons[3].startswith('is the one-label suffix test')
    assert [e.lineno for e in result.errors] == [1, 2, 3, 4]


def test_one_label_internal_is_refused_not_just_warned():
    """.internal used to be only a warning (it covers host.docker.internal); now it is refused."""
    result = _allowlist.parse('api.anthropic.com\n.internal\n')
    assert not result.ok and result.hosts() == ['api.anthropic.com']
    assert result.errors[0].lineno == 2 and 'one-label suffix internal' in result.errors[0].reason


def test_the_integration_and_seed_allowlists_still_validate():
    """tests/integration ALLOWLIST, molecule's and the roles' default seed: none is refused."""
    hosts = ['api.provider.test', '.forge.test', 'plain.test', 'loopback.test', 'models.test',
             'api.anthropic.com', '.github.com', 'registry.npmjs.org']
    result = _allowlist.parse('\n'.join(hosts) + '\n')
    assert result.errors == [], [str(e) for e in result.errors]
    assert result.hosts() == hosts


@pytest.fixture
def without_psl(monkeypatch):
    """As if ``import publicsuffixlist`` had failed: the guard leaves None behind."""
    monkeypatch.setattr(_allowlist, 'publicsuffixlist', None)
    monkeypatch.setattr(_allowlist, 'PSL_IMPORT_ERROR', 'ModuleNotFoundError: No module named publicsuffixlist')
    monkeypatch.setattr(_allowlist, '_PSL', [])


def test_missing_package_raises_from_the_pure_function(without_psl):
    with pytest.raises(_allowlist.PublicSuffixListMissing) as info:
        _allowlist.public_suffix_covered('example.com')
    assert 'publicsuffixlist' in str(info.value) and 'pip install publicsuffixlist' in str(info.value)
    # One label and IPv4 literals need no list: they are still answered.
    assert _allowlist.public_suffix_covered('.test') == 'test'
    assert _allowlist.public_suffix_covered('203.0.113.7') is None


def test_missing_package_fails_the_check_never_accepts(without_psl):
    result = _allowlist.parse('# c\n.co.uk\nexample.com\n.test\n', path='/d/egress-allowlist.conf')
    assert not result.ok
    missing = [e for e in result.errors if 'publicsuffixlist' in e.reason]
    assert len(missing) == 1, [str(e) for e in result.errors]  # said once, at the first name it needed
    err = missing[0]
    assert (err.path, err.lineno) == ('/d/egress-allowlist.conf', 2)
    assert 'not installed' in err.reason
    assert 'pip install publicsuffixlist' in err.fix and 'on the target' in err.fix
    assert str(err).startswith('/d/egress-allowlist.conf:2: ')
    # The one-label rule needs no package and still refuses .test.
    assert any(e.lineno == 4 and 'one-label suffix test' in e.reason for e in result.errors)


def test_missing_package_leaves_an_empty_file_fine(without_psl):
    assert _allowlist.parse('# nothing listed\n').ok


def _run_module(monkeypatch, tmp_path, text):
    """Run egress_allowlist.main() on ``text``; return the keyword arguments of fail_json."""
    import json
    from ansible.module_utils import basic
    from ansible.module_utils.common.text.converters import to_bytes
    from ansible_collections.pi_dispatch.egress.plugins.modules import egress_allowlist

    path = tmp_path / 'egress-allowlist.conf'
    path.write_text(text)
    monkeypatch.setattr(basic, '_ANSIBLE_ARGS', to_bytes(json.dumps({'ANSIBLE_MODULE_ARGS': {'path': str(path)}})))
    monkeypatch.setattr(basic, '_ANSIBLE_PROFILE', 'legacy', raising=False)
    failed = {}

    def fail_json(self, **kwargs):
        failed.update(kwargs)
        raise SystemExit(1)

    monkeypatch.setattr(basic.AnsibleModule, 'fail_json', fail_json)
    with pytest.raises(SystemExit):
        egress_allowlist.main()
    return failed, str(path)


def test_module_refuses_a_public_suffix_naming_file_line_and_fix(monkeypatch, tmp_path):
    failed, path = _run_module(monkeypatch, tmp_path, 'api.anthropic.com\n.github.io\n')
    assert failed['msg'].startswith('The allowlist is refused; the running proxy keeps its last good file. ')
    assert "%s:2: '.github.io': covers the whole public suffix github.io" % path in failed['msg']
    assert 'list the exact host (api.example.com) or your own domain (.yourdomain.tld)' in failed['msg']
    assert [(p['line'], p['severity']) for p in failed['problems']] == [(2, 'error')]


def test_module_fails_with_missing_required_lib_when_the_package_is_absent(without_psl, monkeypatch, tmp_path):
    failed, _path = _run_module(monkeypatch, tmp_path, 'api.anthropic.com\n')
    assert 'publicsuffixlist' in failed['msg'] and 'pip install publicsuffixlist on the target' in failed['msg']
    assert 'Failed to import the required Python library (publicsuffixlist)' in failed['msg']
    assert 'keeps its last good file' in failed['msg']
    assert failed['exception'] and failed['problems'] == []


# ---------------------------------------------------------------- what the destination guard refuses (issue 25)

@pytest.mark.parametrize('entry, opened, words, fix', [
    ('127.0.0.1', None, 'always refuses (127.0.0.0/8', 'no setting opens 127.0.0.0/8'),
    ('169.254.169.254', None, 'always refuses (169.254.0.0/16', 'no setting opens'),
    ('0.0.0.0', None, 'always refuses (0.0.0.0/8', 'no setting opens'),
    ('100.100.100.200', None, 'always refuses (100.100.100.200/32', 'no setting opens'),
    ('10.47.0.9', ['10.0.0.0/8'], 'always refuses (10.47.0.0/16, the job-network pool', 'no setting opens'),
    ('10.1.2.3', None, 'non-public range 10.0.0.0/8', 'egress_private_destinations'),
    ('192.168.5.5', ['10.0.0.0/8'], 'non-public range 192.168.0.0/16', 'egress_private_destinations'),
    ('100.64.1.1', [], 'non-public range 100.64.0.0/10', 'model endpoint'),
])
def test_a_listed_address_the_guard_refuses_is_warned(entry, opened, words, fix):
    result = _allowlist.parse('api.anthropic.com\n%s\n' % entry, path='/d/egress-allowlist.conf', opened=opened)
    assert result.ok and result.hosts() == ['api.anthropic.com', entry]
    [warning] = result.warnings
    assert warning.lineno == 2 and words in warning.reason and fix in warning.fix, str(warning)
    assert str(warning).startswith('/d/egress-allowlist.conf:2:')


@pytest.mark.parametrize('entry, opened', [
    ('10.1.2.3', ['10.1.0.0/16']),          # opened by the operator
    ('10.1.2.3', ['not a cidr', '10.0.0.0/8']),
    ('8.8.8.8', None),                      # public
    ('93.184.216.34', []),
])
def test_a_listed_address_the_guard_lets_through_is_not_warned(entry, opened):
    result = _allowlist.parse(entry + '\n', opened=opened)
    assert result.ok and result.warnings == []


@pytest.mark.parametrize('entry, name', [
    ('metadata.google.internal', 'metadata.google.internal'),
    ('METADATA.GOOGLE.INTERNAL', 'metadata.google.internal'),
    ('.google.internal', 'metadata.google.internal'),
    ('metadata.goog', 'metadata.goog'),
    ('instance-data.ec2.internal', 'instance-data.ec2.internal'),
    ('.ec2.internal', 'instance-data.ec2.internal'),
    ('metadata.tencentyun.com', 'metadata.tencentyun.com'),
])
def test_a_cloud_metadata_name_is_warned(entry, name):
    result = _allowlist.parse(entry + '\n')
    assert result.ok
    [warning] = result.warnings
    assert 'cloud metadata service (%s)' % name in warning.reason and warning.fix == _allowlist.METADATA_FIX


@pytest.mark.parametrize('entry', ['metadata.example.com', 'google.internal.example', 'goog.example'])
def test_metadata_lookalikes_are_not_warned(entry):
    result = _allowlist.parse(entry + '\n')
    assert result.ok and result.warnings == []


def test_the_first_covering_wildcard_in_file_order_is_named():
    text = 'a.b.example.com\n.example.com\n.b.example.com\nx.b.example.com\n'
    result = _allowlist.parse(text)
    covered = sorted((w.lineno, w.reason) for w in result.warnings)
    assert covered == [(1, 'is already covered by .example.com on line 2'),
                       (3, 'is already covered by .example.com on line 2'),
                       (4, 'is already covered by .example.com on line 2')]


def test_coverage_in_a_large_file():
    """The coverage check walks each entry's parents (its speed: benchmarks/allowlist.py)."""
    lines = ['.d%d.example.com' % i for i in range(20000)] + ['h.d%d.example.com' % i for i in range(0, 20000, 1000)]
    result = _allowlist.parse('\n'.join(lines) + '\n')
    covered = sorted(w.lineno for w in result.warnings if 'covered by' in w.reason)
    assert result.ok and covered == list(range(20001, 20021))


@pytest.mark.parametrize('name, parents', [
    ('a.b.c', ['b.c', 'c']),
    ('api.provider.test', ['provider.test', 'test']),
    ('b.c', ['c']),
    ('localhost', []),
    ('x.y.z.w', ['y.z.w', 'z.w', 'w']),
])
def test_parent_domains_nearest_first(name, parents):
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import hostnames
    assert hostnames.parent_domains(name) == parents
