"""egress-credentials.json contract, secret files, placeholders and the interceptor config."""
import json
import os

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import credentials as _credentials

PATH = '/d/egress-credentials.json'
UID = os.getuid()
SECRET = 'S3cretValue-do-not-leak_42'


def cred(**kw):
    base = dict(name='anthropic', host='api.anthropic.com', port=443, env='ANTHROPIC_API_KEY', scheme='header',
                header='x-api-key', secret_file='/etc/pi-dispatch/secrets/anthropic')
    base.update(kw)
    for key in [k for k, v in base.items() if v is Ellipsis]:
        del base[key]
    return base


def forge(**kw):
    base = dict(name='forge', host='github.com', port=443, env='GH_TOKEN', scheme='basic',
                secret_file='/etc/pi-dispatch/secrets/forge', header=Ellipsis)
    base.update(kw)
    return cred(**base)


def doc(*credentials, **top):
    data = dict(version=1, credentials=list(credentials))
    data.update(top)
    for key in [k for k, v in data.items() if v is Ellipsis]:
        del data[key]
    return json.dumps(data)


# --- accepted --------------------------------------------------------------------

# (id, text, listed, [(name, host, scheme, header)])
VALID = [
    ('empty', doc(), None, []),
    ('empty declaration constant', _credentials.EMPTY_DECLARATION, None, []),
    ('header scheme', doc(cred()), None, [('anthropic', 'api.anthropic.com', 'header', 'x-api-key')]),
    ('header name lowercased', doc(cred(header='X-Api-Key')), None,
     [('anthropic', 'api.anthropic.com', 'header', 'x-api-key')]),
    ('header scheme may use authorization', doc(cred(header='Authorization')), None,
     [('anthropic', 'api.anthropic.com', 'header', 'authorization')]),
    ('bearer default header', doc(cred(scheme='bearer', header=Ellipsis)), None,
     [('anthropic', 'api.anthropic.com', 'bearer', 'authorization')]),
    ('bearer explicit header', doc(cred(scheme='bearer', header='X-Auth')), None,
     [('anthropic', 'api.anthropic.com', 'bearer', 'x-auth')]),
    ('basic default header', doc(forge()), None, [('forge', 'github.com', 'basic', 'authorization')]),
    ('the brief example', doc(cred(), forge()), None,
     [('anthropic', 'api.anthropic.com', 'header', 'x-api-key'), ('forge', 'github.com', 'basic', 'authorization')]),
    ('sorted by name', doc(forge(name='zeta'), cred(name='alpha')), None,
     [('alpha', 'api.anthropic.com', 'header', 'x-api-key'), ('zeta', 'github.com', 'basic', 'authorization')]),
    ('same host other header', doc(cred(), cred(name='b', env='B', header='x-other')), None,
     [('anthropic', 'api.anthropic.com', 'header', 'x-api-key'), ('b', 'api.anthropic.com', 'header', 'x-other')]),
    ('same secret file twice', doc(forge(), forge(name='gh-api', host='api.github.com', env='GITHUB_TOKEN')), None,
     [('forge', 'github.com', 'basic', 'authorization'), ('gh-api', 'api.github.com', 'basic', 'authorization')]),
    ('listed callable says yes', doc(cred()), lambda host: host == 'api.anthropic.com',
     [('anthropic', 'api.anthropic.com', 'header', 'x-api-key')]),
    ('name 32 chars', doc(cred(name='a' * 32)), None, [('a' * 32, 'api.anthropic.com', 'header', 'x-api-key')]),
    ('env with underscore first', doc(cred(env='_KEY_2')), None,
     [('anthropic', 'api.anthropic.com', 'header', 'x-api-key')]),
    ('32 credentials', doc(*[cred(name='c%d' % i, env='E%d' % i, header='x-%d' % i) for i in range(32)]), None, None),
]


@pytest.mark.parametrize('name,text,listed,want', VALID, ids=[v[0] for v in VALID])
def test_valid(name, text, listed, want):
    result = _credentials.parse(text, PATH, listed=listed)
    if want is not None:
        assert [(c.name, c.host, c.scheme, c.header) for c in result] == want
    assert all(c.port == 443 for c in result)


def test_bytes_accepted_and_credential_fields():
    (first, second) = _credentials.parse(doc(cred(), forge()).encode('utf-8'))
    assert first.as_dict() == dict(name='anthropic', host='api.anthropic.com', port=443, env='ANTHROPIC_API_KEY',
                                   scheme='header', header='x-api-key',
                                   secret_file='/etc/pi-dispatch/secrets/anthropic')
    assert second.env == 'GH_TOKEN' and second.secret_file == '/etc/pi-dispatch/secrets/forge'
    assert first == _credentials.parse(doc(cred()))[0]
    assert first != second


# --- refused ---------------------------------------------------------------------

# (id, text, key, index, value-as-shown, words of the rule)
INVALID = [
    ('bad json', '{"version": 1,', None, None, None, 'not valid JSON'),
    ('NaN', '{"version": 1, "credentials": [{"port": NaN}]}', None, None, None, 'not valid JSON'),
    ('duplicate key', '{"version": 1, "version": 1, "credentials": []}', None, None, None, 'duplicate key'),
    ('bom', '\ufeff' + doc(), None, None, None, 'byte order mark'),
    ('non-utf8 bytes', b'{"version": 1, "credentials": ["\xff"]}', None, None, None, 'not UTF-8'),
    ('top not object', '[]', None, None, None, 'top level must be an object'),
    ('unknown top key', doc(extra=1), 'extra', None, '1', 'is not a key of the declaration'),
    ('version missing', doc(version=Ellipsis), 'version', None, None, 'is required'),
    ('version string', doc(version='1'), 'version', None, '"1"', 'must be an integer'),
    ('version bool', doc(version=True), 'version', None, 'true', 'must be an integer'),
    ('version 2', doc(version=2), 'version', None, '2', 'not a version this collection understands'),
    ('credentials missing', doc(credentials=Ellipsis), 'credentials', None, None, 'is required'),
    ('credentials object', doc(credentials={}), 'credentials', None, '{}', 'must be a list'),
    ('too many', doc(*[cred(name='c%d' % i, env='E%d' % i, header='x-%d' % i) for i in range(33)]),
     'credentials', None, '33', 'more than 32 credentials'),
    ('credential not object', doc('x'), None, 0, '"x"', 'must be an object'),
    ('unknown key', doc(cred(Header='x')), 'Header', 0, '"x"', 'is not a key of a credential'),
    ('name missing', doc(cred(name=Ellipsis)), 'name', 0, None, 'is required'),
    ('host missing', doc(cred(host=Ellipsis)), 'host', 0, None, 'is required'),
    ('port missing', doc(cred(port=Ellipsis)), 'port', 0, None, 'is required'),
    ('env missing', doc(cred(env=Ellipsis)), 'env', 0, None, 'is required'),
    ('scheme missing', doc(cred(scheme=Ellipsis)), 'scheme', 0, None, 'is required'),
    ('secret_file missing', doc(cred(secret_file=Ellipsis)), 'secret_file', 0, None, 'is required'),
    ('name uppercase', doc(cred(name='Anthropic')), 'name', 0, '"Anthropic"', '^[a-z][a-z0-9-]{0,31}$'),
    ('name digit first', doc(cred(name='1x')), 'name', 0, '"1x"', '^[a-z][a-z0-9-]{0,31}$'),
    ('name trailing newline', doc(cred(name='forge\n')), 'name', 0, '"forge\\n"', '^[a-z][a-z0-9-]{0,31}$'),
    ('name 33 chars', doc(cred(name='a' * 33)), 'name', 0, None, '^[a-z][a-z0-9-]{0,31}$'),
    ('name int', doc(cred(name=1)), 'name', 0, '1', 'must be a string'),
    ('name duplicate', doc(cred(), cred(env='OTHER', header='x-other')), 'name', 1, '"anthropic"',
     'already used by credential 0'),
    ('host uppercase', doc(cred(host='API.anthropic.com')), 'host', 0, '"API.anthropic.com"', 'uppercase'),
    ('host wildcard', doc(cred(host='*.anthropic.com')), 'host', 0, '"*.anthropic.com"', 'wildcard'),
    ('host leading dot', doc(cred(host='.anthropic.com')), 'host', 0, '".anthropic.com"', 'starts with a dot'),
    ('host trailing dot', doc(cred(host='api.anthropic.com.')), 'host', 0, None, 'ends with a dot'),
    ('host port', doc(cred(host='api.anthropic.com:443')), 'host', 0, None, 'has a port'),
    ('host ipv4', doc(cred(host='192.0.2.1')), 'host', 0, '"192.0.2.1"', 'no SNI for an IP literal'),
    ('host ipv6', doc(cred(host='2001:db8::1')), 'host', 0, '"2001:db8::1"', 'no SNI for an IP literal'),
    ('host bracketed ipv6', doc(cred(host='[2001:db8::1]')), 'host', 0, None, 'no SNI for an IP literal'),
    ('host numbers only', doc(cred(host='10.1')), 'host', 0, '"10.1"', 'no SNI for an IP literal'),
    ('host one label', doc(cred(host='anthropic')), 'host', 0, '"anthropic"', 'at least two labels'),
    ('host underscore', doc(cred(host='my_api.example.com')), 'host', 0, None, 'is not a DNS label'),
    ('host double dot', doc(cred(host='api..example.com')), 'host', 0, None, 'empty label'),
    ('host numeric last', doc(cred(host='api.123')), 'host', 0, '"api.123"', 'numeric label'),
    ('host label too long', doc(cred(host='a' * 64 + '.com')), 'host', 0, None, 'longer than 63'),
    ('host space', doc(cred(host='api .example.com')), 'host', 0, None, 'whitespace'),
    ('host non-ascii', doc(cred(host='bücher.example')), 'host', 0, None, 'non-ASCII'),
    ('host empty', doc(cred(host='')), 'host', 0, '""', 'must not be empty'),
    ('host int', doc(cred(host=1)), 'host', 0, '1', 'must be a string'),
    ('port 8443', doc(cred(port=8443)), 'port', 0, '8443', 'terminates TLS on 443 only'),
    ('port string', doc(cred(port='443')), 'port', 0, '"443"', 'must be an integer'),
    ('port bool', doc(cred(port=True)), 'port', 0, 'true', 'must be an integer'),
    ('port float', doc(cred(port=443.0)), 'port', 0, '443.0', 'must be an integer'),
    ('env lowercase', doc(cred(env='api_key')), 'env', 0, '"api_key"', '^[A-Z_][A-Z0-9_]{0,63}$'),
    ('env digit first', doc(cred(env='1KEY')), 'env', 0, '"1KEY"', '^[A-Z_][A-Z0-9_]{0,63}$'),
    ('env trailing newline', doc(cred(env='KEY\n')), 'env', 0, '"KEY\\n"', '^[A-Z_][A-Z0-9_]{0,63}$'),
    ('env 65 chars', doc(cred(env='A' * 65)), 'env', 0, None, '^[A-Z_][A-Z0-9_]{0,63}$'),
    ('env HTTPS_PROXY', doc(cred(env='HTTPS_PROXY')), 'env', 0, '"HTTPS_PROXY"', 'is reserved'),
    ('env SSL_CERT_FILE', doc(cred(env='SSL_CERT_FILE')), 'env', 0, '"SSL_CERT_FILE"', 'is reserved'),
    ('env PATH', doc(cred(env='PATH')), 'env', 0, '"PATH"', 'is reserved'),
    ('env duplicate', doc(cred(), forge(env='ANTHROPIC_API_KEY')), 'env', 1, '"ANTHROPIC_API_KEY"',
     'already used by credential 0 (name "anthropic")'),
    ('scheme unknown', doc(cred(scheme='token')), 'scheme', 0, '"token"', 'must be one of header, bearer, basic'),
    ('scheme uppercase', doc(cred(scheme='Bearer')), 'scheme', 0, '"Bearer"', 'must be one of'),
    ('header scheme without header', doc(cred(header=Ellipsis)), 'header', 0, None,
     'required when "scheme" is "header"'),
    ('header with colon', doc(cred(header='x-api-key:')), 'header', 0, '"x-api-key:"', '^[A-Za-z0-9-]{1,64}$'),
    ('header trailing newline', doc(cred(header='x-api-key\n')), 'header', 0, None, '^[A-Za-z0-9-]{1,64}$'),
    ('header empty', doc(cred(header='')), 'header', 0, '""', '^[A-Za-z0-9-]{1,64}$'),
    ('header 65 chars', doc(cred(header='x' * 65)), 'header', 0, None, '^[A-Za-z0-9-]{1,64}$'),
    ('header host', doc(cred(header='Host')), 'header', 0, '"Host"', 'frames or routes the request'),
    ('header cookie', doc(cred(header='cookie')), 'header', 0, '"cookie"', 'frames or routes the request'),
    ('header proxy-authorization', doc(forge(header='Proxy-Authorization')), 'header', 0, None,
     'frames or routes the request'),
    ('header content-length', doc(cred(header='content-length')), 'header', 0, None, 'frames or routes'),
    ('header null', doc(forge(header=None)), 'header', 0, 'null', 'must be a string'),
    ('host and header twice', doc(cred(), cred(name='b', env='B', header='X-API-KEY')), 'host', 1,
     '"api.anthropic.com"', 'with header "x-api-key" is already bound by credential 0'),
    ('two defaults on one host', doc(forge(), forge(name='b', env='B', scheme='bearer')), 'host', 1,
     '"github.com"', 'with header "authorization" is already bound by credential 0'),
    ('secret relative', doc(cred(secret_file='secrets/a')), 'secret_file', 0, '"secrets/a"', 'not an absolute path'),
    ('secret dotdot', doc(cred(secret_file='/etc/x/../a')), 'secret_file', 0, None, 'not a normalised path'),
    ('secret double slash', doc(cred(secret_file='/etc//a')), 'secret_file', 0, None, 'not a normalised path'),
    ('secret leading double slash', doc(cred(secret_file='//etc/a')), 'secret_file', 0, None, 'not a normalised'),
    ('secret trailing slash', doc(cred(secret_file='/etc/a/')), 'secret_file', 0, None, 'not a normalised path'),
    ('secret NUL', doc(cred(secret_file='/etc/a\u0000b')), 'secret_file', 0, None, 'NUL'),
    ('secret int', doc(cred(secret_file=1)), 'secret_file', 0, '1', 'must be a string'),
]


@pytest.mark.parametrize('name,text,key,index,shown,rule', INVALID, ids=[v[0] for v in INVALID])
def test_invalid(name, text, key, index, shown, rule):
    with pytest.raises(_credentials.CredentialsError) as info:
        _credentials.parse(text, PATH)
    message = str(info.value)
    count = len(info.value.problems)
    assert message.startswith('%s is refused (%d problem%s); nothing was changed:'
                              % (PATH, count, '' if count == 1 else 's'))
    assert info.value.path == PATH
    matching = [p for p in info.value.problems if rule in str(p)]
    assert matching, message
    problem = matching[0]
    text_of_problem = str(problem)
    assert problem.key == key
    assert problem.index == index
    assert text_of_problem.startswith(PATH)
    if key is not None:
        assert '"%s"' % key in text_of_problem
    if index is not None:
        assert 'credential %d (' % index in text_of_problem
        if problem.name:
            assert '(name %s)' % json.dumps(problem.name) in text_of_problem
    if shown is not None:
        assert shown in text_of_problem
    assert problem.fix and problem.fix in text_of_problem
    assert problem.as_dict()['message'] == text_of_problem


def test_table_size():
    assert len(INVALID) >= 30
    assert len(VALID) + len(INVALID) >= 40


def test_unlisted_host_refused():
    with pytest.raises(_credentials.CredentialsError) as info:
        _credentials.parse(doc(cred(), forge()), PATH, listed=lambda host: host == 'github.com')
    (problem,) = info.value.problems
    assert problem.key == 'host' and problem.index == 0 and problem.name == 'anthropic'
    assert 'egress-allowlist.conf' in problem.rule and 'list it in egress-allowlist.conf' in problem.fix


def test_every_problem_reported_at_once():
    with pytest.raises(_credentials.CredentialsError) as info:
        _credentials.parse(doc(cred(name='A', host='1.2.3.4', port='443', env='PATH', scheme='x', header='host',
                                    secret_file='rel', x=1)))
    assert sorted(p.key for p in info.value.problems) == ['env', 'header', 'host', 'name', 'port', 'scheme',
                                                          'secret_file', 'x']
    assert all('(no valid name)' not in str(p) for p in info.value.problems)  # a string name is still shown
    assert '(8 problems)' in str(info.value)


def test_no_valid_name_shown():
    with pytest.raises(_credentials.CredentialsError) as info:
        _credentials.parse(doc(cred(name=7)))
    assert 'credential 0 (no valid name)' in str(info.value.problems[0])


# --- load ------------------------------------------------------------------------

def test_load_missing_is_empty(tmp_path):
    assert _credentials.load(str(tmp_path)) == ([], str(tmp_path / 'egress-credentials.json'), False)


def test_load_reads_and_passes_listed(tmp_path):
    (tmp_path / 'egress-credentials.json').write_text(doc(cred(), forge()))
    creds, path, exists = _credentials.load(str(tmp_path))
    assert exists and path == str(tmp_path / 'egress-credentials.json')
    assert [c.name for c in creds] == ['anthropic', 'forge']
    with pytest.raises(_credentials.CredentialsError) as info:
        _credentials.load(str(tmp_path), listed=lambda host: False)
    assert len(info.value.problems) == 2 and info.value.path == path


def test_load_symlink_refused(tmp_path):
    real = tmp_path / 'real.json'
    real.write_text(doc())
    os.symlink(str(real), str(tmp_path / 'egress-credentials.json'))
    with pytest.raises(_credentials.CredentialsError) as info:
        _credentials.load(str(tmp_path))
    message = str(info.value)
    assert 'is a symlink' in message and 'replace the link' in message
    assert message.startswith(str(tmp_path / 'egress-credentials.json') + ' is refused (1 problem)')


def test_load_dangling_symlink_refused(tmp_path):
    os.symlink(str(tmp_path / 'nowhere'), str(tmp_path / 'egress-credentials.json'))
    with pytest.raises(_credentials.CredentialsError, match='is a symlink'):
        _credentials.load(str(tmp_path))


def test_load_too_large_refused(tmp_path):
    (tmp_path / 'egress-credentials.json').write_text(doc() + ' ' * (256 * 1024))
    with pytest.raises(_credentials.CredentialsError, match='larger than 262144 bytes'):
        _credentials.load(str(tmp_path))


def test_load_directory_refused(tmp_path):
    (tmp_path / 'egress-credentials.json').mkdir()
    with pytest.raises(_credentials.CredentialsError, match='not a regular file'):
        _credentials.load(str(tmp_path))


def test_load_invalid_names_file(tmp_path):
    (tmp_path / 'egress-credentials.json').write_bytes(b'\xff\xfe')
    with pytest.raises(_credentials.CredentialsError, match='not UTF-8') as info:
        _credentials.load(str(tmp_path))
    assert str(info.value).startswith(str(tmp_path / 'egress-credentials.json'))


# --- secret files ----------------------------------------------------------------

def _file(tmp_path, content, mode=0o600):
    path = tmp_path / 'secret'
    path.write_bytes(content)
    os.chmod(str(path), mode)
    return path


def _missing(tmp_path):
    return tmp_path / 'absent'


def _symlink(tmp_path):
    target = _file(tmp_path, SECRET.encode())
    link = tmp_path / 'link'
    os.symlink(str(target), str(link))
    return link


def _directory(tmp_path):
    path = tmp_path / 'dir'
    path.mkdir(mode=0o700)
    return path


# (id, make(tmp_path) -> path, owner_uid, words of the rule)
SECRET_REFUSED = [
    ('missing', _missing, UID, 'does not exist'),
    ('symlink', _symlink, UID, 'is a symlink'),
    ('directory', _directory, UID, 'not a regular file'),
    ('mode 0644', lambda t: _file(t, SECRET.encode(), 0o644), UID, 'open to group or others (mode 0644)'),
    ('mode 0640', lambda t: _file(t, SECRET.encode(), 0o640), UID, 'open to group or others'),
    ('owner mismatch', lambda t: _file(t, SECRET.encode()), UID + 12345, 'is owned by uid %d' % UID),
    ('empty', lambda t: _file(t, b''), UID, 'is 0 bytes'),
    ('only newline', lambda t: _file(t, b'\n'), UID, 'is empty'),
    ('only crlf', lambda t: _file(t, b'\r\n'), UID, 'is empty'),
    ('contains space', lambda t: _file(t, (SECRET + ' tail').encode()), UID, 'contains a space'),
    ('contains tab', lambda t: _file(t, (SECRET + '\tx').encode()), UID, 'control character'),
    ('two trailing newlines', lambda t: _file(t, (SECRET + '\n\n').encode()), UID, 'control character'),
    ('inner newline', lambda t: _file(t, (SECRET + '\nsecond').encode()), UID, 'control character'),
    ('DEL byte', lambda t: _file(t, (SECRET + '\x7f').encode()), UID, 'control character'),
    ('non-ascii', lambda t: _file(t, (SECRET + 'é').encode('utf-8')), UID, 'non-ASCII byte'),
    ('too big', lambda t: _file(t, b'a' * 8193), UID, 'is 8193 bytes, not 1 to 8192'),
    ('placeholder', lambda t: _file(t, _credentials.placeholder('anthropic', 'ab' * 16).encode()), UID,
     'holds a placeholder'),
]


@pytest.mark.parametrize('name,make,owner,rule', SECRET_REFUSED, ids=[v[0] for v in SECRET_REFUSED])
def test_secret_refused(tmp_path, name, make, owner, rule):
    path = str(make(tmp_path))
    content = None
    if os.path.isfile(path):
        with open(path, 'rb') as handle:
            content = handle.read().decode('utf-8', 'replace').strip()
    credential = _credentials.parse(doc(cred()))[0]
    message = _credentials.check_secret(credential, path_override=path, owner_uid=owner)
    assert message is not None
    assert rule in message
    assert 'credential "anthropic"' in message and path in message
    assert ';' in message.split(rule, 1)[1]  # a fix follows the rule
    with pytest.raises(ValueError) as info:
        _credentials.read_secret(path, owner_uid=owner)
    assert rule in str(info.value) and path in str(info.value)
    for text in (message, str(info.value)):
        if content:
            assert content not in text
            assert SECRET not in text


@pytest.mark.parametrize('content', [SECRET.encode(), (SECRET + '\n').encode(), (SECRET + '\r\n').encode(),
                                     b'!~' + bytes(range(0x21, 0x7f))],
                         ids=['bare', 'trailing newline', 'trailing crlf', 'every printable'])
def test_secret_ok(tmp_path, content):
    path = _file(tmp_path, content)
    credential = _credentials.Credential('forge', 'github.com', 443, 'GH_TOKEN', 'basic', 'authorization', str(path))
    assert _credentials.check_secret(credential, owner_uid=UID) is None
    value = _credentials.read_secret(str(path), owner_uid=UID)
    assert value == content.rstrip(b'\r\n').decode('ascii')


def test_secret_max_size_ok(tmp_path):
    path = _file(tmp_path, b'a' * 8192)
    assert _credentials.read_secret(str(path), owner_uid=UID) == 'a' * 8192


def test_check_secret_uses_declared_path(tmp_path):
    path = _file(tmp_path, SECRET.encode(), 0o644)
    credential = _credentials.parse(doc(cred(secret_file=str(path))))[0]
    message = _credentials.check_secret(credential, owner_uid=UID)
    assert 'chmod 0600' in message and 'chown root' in message and SECRET not in message


# --- placeholders, job env and the interceptor --------------------------------------

def test_placeholder_shape_and_uniqueness():
    values = {_credentials.placeholder('forge') for _index in range(200)}
    assert len(values) == 200
    for value in values:
        assert value.startswith('pi-placeholder-forge-') and len(value) == len('pi-placeholder-forge-') + 32
        assert _credentials.is_placeholder_shaped(value)
    assert _credentials.placeholder('forge', 'ab' * 16) == 'pi-placeholder-forge-' + 'ab' * 16


@pytest.mark.parametrize('text,shaped', [
    ('pi-placeholder-forge-0123456789abcdef0123456789abcdef', True),
    ('pi-placeholder-gh-api-0123456789abcdef0123456789abcdef', True),
    ('pi-placeholder-forge-', False),
    ('pi-placeholder--0123', False),
    ('pi-placeholder-forge-01 23', False),
    ('pi-placeholder-forge-0123456789ABCDEF0123456789ABCDEF', False),
    ('pi-placeholder-forge-0123456789abcdef0123456789abcde', False),
    ('pi-placeholder-forge-0123456789abcdef0123456789abcdef\n', False),
    ('xpi-placeholder-forge-0123', False),
    ('ghp_0123456789abcdef', False),
    ('', False),
    (None, False),
])
def test_is_placeholder_shaped(text, shaped):
    assert _credentials.is_placeholder_shaped(text) is shaped


@pytest.mark.parametrize('name,token', [('Forge', None), ('forge\n', None), ('forge', 'has space'), ('forge', 'abc123'),
                                        ('forge', 'AB' * 16), ('forge', 'ab' * 16 + '\n'), ('', None)])
def test_placeholder_refuses_bad_parts(name, token):
    with pytest.raises(ValueError):
        _credentials.placeholder(name, token)


def test_job_placeholders_fresh_per_call():
    creds = _credentials.parse(doc(cred(), forge()))
    first = _credentials.job_placeholders(creds, 'job-1')
    second = _credentials.job_placeholders(creds, 'job-1')
    assert sorted(first) == ['anthropic', 'forge']
    assert first['forge']['env'] == 'GH_TOKEN' and first['anthropic']['env'] == 'ANTHROPIC_API_KEY'
    for name in first:
        assert _credentials.is_placeholder_shaped(first[name]['placeholder'])
        assert first[name]['placeholder'] != second[name]['placeholder']
        assert 'job-1' not in first[name]['placeholder']


def test_job_env_includes_every_ca_variable():
    creds = _credentials.parse(doc(cred(), forge()))
    placeholders = _credentials.job_placeholders(creds, 'job-1')
    env = _credentials.job_env(placeholders, '/etc/pi-ca.pem')
    for var in _credentials.CA_ENV:
        assert env[var] == '/etc/pi-ca.pem'
    assert set(_credentials.CA_ENV) == {'NODE_EXTRA_CA_CERTS', 'SSL_CERT_FILE', 'REQUESTS_CA_BUNDLE',
                                        'GIT_SSL_CAINFO'}
    assert env['GH_TOKEN'] == placeholders['forge']['placeholder']
    assert env['ANTHROPIC_API_KEY'] == placeholders['anthropic']['placeholder']
    assert len(env) == 2 + len(_credentials.CA_ENV)


def test_job_env_refuses_relative_ca_path():
    with pytest.raises(ValueError):
        _credentials.job_env({}, 'ca.pem')


def test_reserved_env():
    for var in ('HTTP_PROXY', 'https_proxy', 'NO_PROXY', 'all_proxy', 'PATH', 'HOME') + _credentials.CA_ENV:
        assert var in _credentials.RESERVED_ENV


def test_interceptor_config_never_holds_the_secret(tmp_path):
    secret_path = _file(tmp_path, (SECRET + '\n').encode())
    creds = _credentials.parse(doc(cred(secret_file=str(secret_path)), forge()))
    assert _credentials.check_secret(creds[0], owner_uid=UID) is None
    config = _credentials.interceptor_config(creds, secrets_root='/run/pi-secrets')
    text = json.dumps(config)
    assert SECRET not in text
    assert config == {'version': 1, 'credentials': [
        {'name': 'anthropic', 'host': 'api.anthropic.com', 'port': 443, 'scheme': 'header', 'header': 'x-api-key',
         'secret': _credentials.secret_in_container(str(secret_path))},
        {'name': 'forge', 'host': 'github.com', 'port': 443, 'scheme': 'basic', 'header': 'authorization',
         'secret': _credentials.secret_in_container('/etc/pi-dispatch/secrets/forge')}]}
    # One mount per host folder, named by its digest: the file's own name is kept under it.
    assert config['credentials'][1]['secret'].startswith('/run/pi-secrets/')
    assert config['credentials'][1]['secret'].endswith('/forge')
    assert _credentials.secret_folder_in_container('/etc/a') != _credentials.secret_folder_in_container('/etc/b')
    assert _credentials.interceptor_config([]) == {'version': 1, 'credentials': []}


def test_constants():
    assert _credentials.FILE_NAME == 'egress-credentials.json'
    assert json.loads(_credentials.EMPTY_DECLARATION) == {'version': 1, 'credentials': []}
    assert _credentials.EMPTY_DECLARATION.endswith('\n')
    assert _credentials.SCHEMES == ('header', 'bearer', 'basic')
    assert (_credentials.MAX_SECRET_BYTES, _credentials.MAX_CREDENTIALS) == (8192, 32)
