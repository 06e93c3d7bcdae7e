"""The credential interceptor's pure logic (roles/proxy/files/interceptor/pi_interceptor.py), without mitmproxy.

The addon is loaded from its file as a module; only the part above the mitmproxy glue is exercised: the
decision on a request (:func:`decide`) and its record, the response redaction, the secret file's rules and
its cache, the per-job placeholder records and the interceptor's configuration. No socket, no container.
"""

import base64
import importlib.util
import json
import os
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PROGRAM = os.path.join(ROOT, 'roles', 'proxy', 'files', 'interceptor', 'pi_interceptor.py')


def _load_addon():
    spec = importlib.util.spec_from_file_location('pi_interceptor', PROGRAM)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


addon = _load_addon()


def test_the_addon_loads_without_mitmproxy():
    assert os.path.isfile(PROGRAM)
    assert hasattr(addon, 'decide') and hasattr(addon, 'Interceptor')


# --- decide ------------------------------------------------------------------------------------------------

API, OTHER, FORGE = 'api.provider.test', 'other.provider.test', 'forge.test'
CREDS = [
    addon.Credential('anthropic', API, 443, 'header', 'x-api-key', '/run/pi-secrets/anthropic'),
    addon.Credential('other', OTHER, 443, 'bearer', 'authorization', '/run/pi-secrets/other'),
    addon.Credential('forge', FORGE, 443, 'basic', 'authorization', '/run/pi-secrets/forge'),
]
SECRET = {'anthropic': 'sk-ant-REAL-4f3c2a1b9e', 'other': 'oth-REAL-77aa99cc', 'forge': 'ghp_REALforge0001'}

# job-a's placeholders, job-b's, and one of the right shape that nobody was issued
PH_A = 'pi-placeholder-anthropic-' + '0a' * 16
PH_O = 'pi-placeholder-other-' + '0b' * 16
PH_F = 'pi-placeholder-forge-' + '0c' * 16
PH_A_JOB_B = 'pi-placeholder-anthropic-' + '1d' * 16
PH_O_JOB_B = 'pi-placeholder-other-' + '1e' * 16
PH_UNISSUED = 'pi-placeholder-anthropic-' + 'f7' * 16
JOBS = types.SimpleNamespace(by_placeholder={
    PH_A: ('job-a', 'anthropic'), PH_O: ('job-a', 'other'), PH_F: ('job-a', 'forge'),
    PH_A_JOB_B: ('job-b', 'anthropic'), PH_O_JOB_B: ('job-b', 'other'),
})
PLACEHOLDERS = [PH_A, PH_O, PH_F, PH_A_JOB_B, PH_O_JOB_B, PH_UNISSUED]
CLIENT = '10.70.0.5'
PATH = '/v1/messages?m=marker-5d1e'
RECORD_KEYS = {'time', 'event', 'reason', 'credential', 'job', 'client', 'host', 'port', 'method', 'swapped'}
_SAME = object()


def basic(user, password):
    return 'Basic ' + base64.b64encode(('%s:%s' % (user, password)).encode('utf-8')).decode('ascii')


def make_request(host=API, method='GET', port=443, sni=_SAME, host_header=_SAME, headers=(), path=PATH, body=b'',
                 authority='', http_version='HTTP/1.1'):
    return addon.Request(method, host, port, host if sni is _SAME else sni,
                         host if host_header is _SAME else host_header, headers, path, body,
                         authority=authority, http_version=http_version)


def secrets_but(*broken):
    """A secret_of that answers every credential's secret, except ``broken`` ones (SecretError)."""
    def secret_of(cred):
        if cred.name in broken:
            raise addon.SecretError('%s cannot be read (No such file or directory)' % cred.secret)
        return SECRET[cred.name]
    return secret_of


def test_the_placeholders_of_the_table_have_the_shape_the_addon_scans_for():
    for value in PLACEHOLDERS:
        assert addon.PLACEHOLDER_RE.fullmatch(value), value
    assert len(set(PLACEHOLDERS)) == len(PLACEHOLDERS)
    assert PH_UNISSUED not in JOBS.by_placeholder


# (id, request pieces (+ 'broken': credentials whose secret raises), client job, refused reason or None,
#  swapped credentials, (header name, [its values after the swap]) or None when decision.headers is None)
DECISIONS = [
    # swapped, one per scheme and form
    ('header-scheme', dict(headers=[('x-api-key', PH_A)]), 'job-a', None, ['anthropic'],
     ('x-api-key', [SECRET['anthropic']])),
    ('header-name-case', dict(headers=[('X-Api-Key', PH_A)]), 'job-a', None, ['anthropic'],
     ('x-api-key', [SECRET['anthropic']])),
    ('bearer', dict(host=OTHER, headers=[('Authorization', 'Bearer ' + PH_O)]), 'job-a', None, ['other'],
     ('authorization', ['Bearer ' + SECRET['other']])),
    ('bearer-lowercase', dict(host=OTHER, headers=[('authorization', 'bearer ' + PH_O)]), 'job-a', None, ['other'],
     ('authorization', ['bearer ' + SECRET['other']])),
    ('basic-username-kept', dict(host=FORGE, headers=[('Authorization', basic('alice', PH_F))]), 'job-a', None,
     ['forge'], ('authorization', [basic('alice', SECRET['forge'])])),
    ('basic-empty-username', dict(host=FORGE, headers=[('authorization', basic('', PH_F))]), 'job-a', None,
     ['forge'], ('authorization', [basic('', SECRET['forge'])])),
    ('host-header-with-443', dict(host_header=API + ':443', headers=[('x-api-key', PH_A)]), 'job-a', None,
     ['anthropic'], ('x-api-key', [SECRET['anthropic']])),
    ('host-header-uppercase', dict(host_header='API.Provider.TEST', headers=[('x-api-key', PH_A)]), 'job-a', None,
     ['anthropic'], ('x-api-key', [SECRET['anthropic']])),
    ('http2-authority-is-the-bound-host', dict(http_version='HTTP/2.0', authority=API, headers=[('x-api-key', PH_A)]),
     'job-a', None, ['anthropic'], ('x-api-key', [SECRET['anthropic']])),
    ('http2-authority-with-its-port', dict(http_version='HTTP/2.0', authority=API + ':443',
                                           headers=[('x-api-key', PH_A)]),
     'job-a', None, ['anthropic'], ('x-api-key', [SECRET['anthropic']])),
    # refused: a placeholder from a client whose job nothing names (issue 42, item 2)
    ('client-job-unknown', dict(headers=[('x-api-key', PH_A_JOB_B)]), None, 'job-unknown', [], None),
    ('client-job-unknown-own-shape', dict(host=OTHER, headers=[('Authorization', 'Bearer ' + PH_O)]), None,
     'job-unknown', [], None),
    ('client-job-unknown-nothing-to-swap', dict(headers=[('accept', '*/*')]), None, None, [], None),
    ('same-header-twice', dict(headers=[('x-api-key', PH_A), ('X-API-KEY', PH_A)]), 'job-a', None, ['anthropic'],
     ('x-api-key', [SECRET['anthropic'], SECRET['anthropic']])),
    ('nothing-to-swap', dict(headers=[('accept', 'application/json')], body=b'{"q": 1}'), 'job-a', None, [],
     None),
    ('unbound-secret-unavailable-is-ignored', dict(headers=[('x-api-key', PH_A)], broken=('forge',)), 'job-a',
     None, ['anthropic'], ('x-api-key', [SECRET['anthropic']])),
    # refused: the method
    ('trace', dict(method='TRACE', headers=[('x-api-key', PH_A)]), 'job-a', 'trace', [], None),
    ('track-lowercase', dict(method='track'), 'job-a', 'trace', [], None),
    ('trace-comes-first', dict(method='TRACE', sni='elsewhere.test', headers=[('x-api-key', SECRET['anthropic'])]),
     'job-a', 'trace', [], None),
    # refused: a request target that is not origin-form (issue 42, item 1): the request line names a host
    ('absolute-form-other-host', dict(path='https://other.provider.test/v1/messages', authority=OTHER,
                                      headers=[('x-api-key', PH_A)]), 'job-a', 'request-target', [], None),
    ('absolute-form-bound-host', dict(path='https://api.provider.test/v1/messages', authority=API,
                                      headers=[('x-api-key', PH_A)]), 'job-a', 'request-target', [], None),
    ('absolute-form-http-scheme', dict(path='http://attacker.test/x', authority='attacker.test',
                                       headers=[('x-api-key', PH_A)]), 'job-a', 'request-target', [], None),
    ('absolute-form-path-looks-origin', dict(path='/v1/messages', authority='other.provider.test:443',
                                             headers=[('x-api-key', PH_A)]), 'job-a', 'request-target', [], None),
    ('authority-form-connect', dict(method='CONNECT', path='', authority=OTHER + ':443',
                                    headers=[('x-api-key', PH_A)]), 'job-a', 'request-target', [], None),
    ('asterisk-form', dict(method='OPTIONS', path='*', headers=[('x-api-key', PH_A)]), 'job-a', 'request-target',
     [], None),
    ('no-leading-slash', dict(path='v1/messages', headers=[('x-api-key', PH_A)]), 'job-a', 'request-target', [],
     None),
    ('empty-path', dict(path='', headers=[('x-api-key', PH_A)]), 'job-a', 'request-target', [], None),
    ('target-before-the-real-key', dict(path='https://other.provider.test/', authority=OTHER,
                                        headers=[('x-api-key', SECRET['anthropic'])]), 'job-a', 'request-target',
     [], None),
    ('http2-authority-other-host', dict(http_version='HTTP/2.0', authority=OTHER, headers=[('x-api-key', PH_A)]),
     'job-a', 'host-sni-mismatch', [], None),
    ('http2-authority-other-port', dict(http_version='HTTP/2.0', authority=API + ':8443',
                                        headers=[('x-api-key', PH_A)]), 'job-a', 'host-sni-mismatch', [], None),
    # refused: a Host that is not exactly the bound host and port, in canonical form
    ('host-header-other-port', dict(host_header=API + ':8443', headers=[('x-api-key', PH_A)]), 'job-a',
     'host-sni-mismatch', [], None),
    ('host-header-port-leading-zero', dict(host_header=API + ':0443', headers=[('x-api-key', PH_A)]), 'job-a',
     'host-sni-mismatch', [], None),
    ('host-header-two-ports', dict(host_header=API + ':443:1', headers=[('x-api-key', PH_A)]), 'job-a',
     'host-sni-mismatch', [], None),
    ('host-header-empty-port', dict(host_header=API + ':', headers=[('x-api-key', PH_A)]), 'job-a',
     'host-sni-mismatch', [], None),
    ('host-header-userinfo', dict(host_header='user@' + API, headers=[('x-api-key', PH_A)]), 'job-a',
     'host-sni-mismatch', [], None),
    ('host-header-trailing-dot', dict(host_header=API + '.', headers=[('x-api-key', PH_A)]), 'job-a',
     'host-sni-mismatch', [], None),
    ('host-header-bracketed-name', dict(host_header='[' + API + ']', headers=[('x-api-key', PH_A)]), 'job-a',
     'host-sni-mismatch', [], None),
    ('host-header-twice', dict(headers=[('Host', API), ('host', OTHER), ('x-api-key', PH_A)]), 'job-a',
     'host-sni-mismatch', [], None),
    ('http2-host-header-differs-from-authority',
     dict(http_version='HTTP/2.0', authority=API, headers=[('host', OTHER), ('x-api-key', PH_A)]),
     'job-a', 'host-sni-mismatch', [], None),
    ('host-header-twice-same', dict(headers=[('Host', API), ('Host', API), ('x-api-key', PH_A)]), 'job-a',
     'host-sni-mismatch', [], None),
    # refused: host, SNI and binding
    ('host-header-differs', dict(host_header=OTHER, headers=[('x-api-key', PH_A)]), 'job-a', 'host-sni-mismatch',
     [], None),
    ('host-header-missing', dict(host_header='', headers=[('x-api-key', PH_A)]), 'job-a', 'host-sni-mismatch',
     [], None),
    ('sni-differs', dict(sni=OTHER, headers=[('x-api-key', PH_A)]), 'job-a', 'host-sni-mismatch', [], None),
    ('sni-empty', dict(sni='', headers=[('x-api-key', PH_A)]), 'job-a', 'host-sni-mismatch', [], None),
    ('host-nobody-is-bound-to', dict(host='unbound.provider.test', headers=[('x-api-key', PH_A)]), 'job-a',
     'host-sni-mismatch', [], None),
    ('bound-host-other-port', dict(port=8443, headers=[('x-api-key', PH_A)]), 'job-a', 'host-sni-mismatch', [],
     None),
    # refused: the secret file
    ('bound-secret-unavailable', dict(headers=[('x-api-key', PH_A)], broken=('anthropic',)), 'job-a',
     'secret-unavailable', [], None),
    ('bound-secret-unavailable-without-credential', dict(broken=('anthropic',)), 'job-a', 'secret-unavailable',
     [], None),
    # refused: a real secret anywhere
    ('real-in-declared-header', dict(headers=[('x-api-key', SECRET['anthropic'])]), 'job-a', 'real-credential',
     [], None),
    ('real-in-another-header', dict(headers=[('x-forwarded-key', 'k=' + SECRET['anthropic'])]), 'job-a',
     'real-credential', [], None),
    ('real-in-url', dict(path='/v1/messages?key=' + SECRET['anthropic']), 'job-a', 'real-credential', [], None),
    ('real-in-body', dict(method='POST', body=('{"key": "%s"}' % SECRET['anthropic']).encode()), 'job-a',
     'real-credential', [], None),
    ('real-inside-basic', dict(host=FORGE, headers=[('Authorization', basic('alice', SECRET['forge']))]), 'job-a',
     'real-credential', [], None),
    ('real-of-another-credential', dict(headers=[('x-api-key', PH_A), ('x-note', SECRET['other'])]), 'job-a',
     'real-credential', [], None),
    ('real-before-placeholders', dict(headers=[('x-api-key', PH_UNISSUED)], body=SECRET['forge'].encode()),
     'job-a', 'real-credential', [], None),
    # refused: a placeholder in the wrong place, to the wrong host, unknown or another job's
    ('placeholder-in-url', dict(path='/v1/messages?key=' + PH_A), 'job-a', 'placeholder-elsewhere', [], None),
    ('placeholder-in-body', dict(method='POST', body=('key=%s&x=yz' % PH_A).encode()), 'job-a',
     'placeholder-elsewhere', [], None),
    ('placeholder-in-another-header', dict(headers=[('x-forwarded-key', PH_A)]), 'job-a', 'placeholder-elsewhere',
     [], None),
    ('placeholder-in-authorization-of-header-scheme', dict(headers=[('authorization', 'Bearer ' + PH_A)]), 'job-a',
     'placeholder-elsewhere', [], None),
    ('other-placeholder-to-api-host', dict(headers=[('authorization', 'Bearer ' + PH_O)]), 'job-a',
     'placeholder-elsewhere', [], None),
    ('other-placeholder-in-x-api-key', dict(headers=[('x-api-key', PH_O)]), 'job-a', 'placeholder-elsewhere', [],
     None),
    ('unknown-placeholder', dict(headers=[('x-api-key', PH_UNISSUED)]), 'job-a', 'unknown-placeholder', [], None),
    ('unknown-placeholder-without-client-job', dict(headers=[('x-api-key', PH_UNISSUED)]), None,
     'unknown-placeholder', [], None),
    ('placeholder-of-another-job', dict(headers=[('x-api-key', PH_A_JOB_B)]), 'job-a',
     'placeholder-of-another-job', [], None),
    ('extra-text-around-placeholder', dict(headers=[('x-api-key', 'foo ' + PH_A)]), 'job-a',
     'placeholder-elsewhere', [], None),
    ('placeholder-with-suffix', dict(headers=[('x-api-key', PH_A + '0')]), 'job-a', 'placeholder-elsewhere', [],
     None),
    ('one-good-one-padded', dict(headers=[('x-api-key', PH_A), ('x-api-key', PH_A + ' ')]), 'job-a',
     'placeholder-elsewhere', [], None),
    ('bearer-scheme-word-token', dict(host=OTHER, headers=[('Authorization', 'Token ' + PH_O)]), 'job-a',
     'placeholder-elsewhere', [], None),
    ('bearer-without-scheme-word', dict(host=OTHER, headers=[('Authorization', PH_O)]), 'job-a',
     'placeholder-elsewhere', [], None),
    ('bearer-placeholder-twice', dict(host=OTHER, headers=[('Authorization', 'Bearer %s %s' % (PH_O, PH_O))]),
     'job-a', 'placeholder-elsewhere', [], None),
    ('basic-not-base64', dict(host=FORGE, headers=[('Authorization', 'Basic ' + PH_F)]), 'job-a',
     'placeholder-elsewhere', [], None),
    ('basic-as-bearer', dict(host=FORGE, headers=[('Authorization', 'Bearer ' + PH_F)]), 'job-a',
     'placeholder-elsewhere', [], None),
]


def _decide(spec, client_job):
    spec = dict(spec)
    secret_of = secrets_but(*spec.pop('broken', ()))
    request = make_request(**spec)
    return request, addon.decide(request, CREDS, JOBS, secret_of, client_job)


@pytest.mark.parametrize('spec, client_job, reason, swapped, header',
                         [row[1:] for row in DECISIONS], ids=[row[0] for row in DECISIONS])
def test_decide(spec, client_job, reason, swapped, header):
    request, decision = _decide(spec, client_job)
    assert decision.refused == reason
    assert decision.swapped == swapped
    if header is None:
        assert decision.headers is None
    else:
        name, values = header
        assert [v for n, v in decision.headers if n.lower() == name] == values
        # the other headers travel unchanged, in their order and spelling
        assert [n for n, _v in decision.headers] == [n for n, _v in request.headers]
        assert [(n, v) for n, v in decision.headers if n.lower() != name] == \
            [(n, v) for n, v in request.headers if n.lower() != name]

    record = decision.record(request, CLIENT)
    assert set(record) == RECORD_KEYS
    assert record['event'] == ('refused' if reason else 'swapped')
    assert (record['reason'], record['client'], record['swapped']) == (reason, CLIENT, swapped)
    assert (record['host'], record['port'], record['method']) == (request.host, request.port, request.method)
    text = json.dumps(record)
    for value in list(SECRET.values()) + PLACEHOLDERS:
        assert value not in text
    for name, value in request.headers:
        if name.lower() != 'host':   # the host is in the record by design
            assert value not in text
    if request.path:
        assert request.path not in text
    if request.body:
        assert request.body.decode('latin-1') not in text


def test_decide_does_not_change_the_request_headers():
    request = make_request(headers=[('x-api-key', PH_A)])
    decision = addon.decide(request, CREDS, JOBS, secrets_but(), 'job-a')
    assert decision.headers == [('x-api-key', SECRET['anthropic'])]
    assert request.headers == [('x-api-key', PH_A)]


def test_a_swap_keeps_every_other_header_in_place():
    headers = [('Accept', '*/*'), ('X-Api-Key', PH_A), ('User-Agent', 'ua/1'), ('x-trace', 'abc')]
    decision = addon.decide(make_request(headers=headers), CREDS, JOBS, secrets_but(), 'job-a')
    assert decision.headers == [('Accept', '*/*'), ('X-Api-Key', SECRET['anthropic']), ('User-Agent', 'ua/1'),
                                ('x-trace', 'abc')]


# (id, request pieces, client job, decision.job, decision.credential)
JOB_AND_CREDENTIAL = [
    ('swapped-names-client-job', dict(headers=[('x-api-key', PH_A)]), 'job-a', 'job-a', None),
    ('unknown-client-job-names-placeholder-job', dict(headers=[('x-api-key', PH_A_JOB_B)]), None, 'job-b',
     'anthropic'),
    ('request-target', dict(path='https://other.provider.test/'), 'job-a', 'job-a', None),
    ('nothing-swapped-keeps-client-job', dict(), 'job-a', 'job-a', None),
    ('trace', dict(method='TRACE'), 'job-a', 'job-a', None),
    ('host-sni-mismatch', dict(sni=OTHER), 'job-a', 'job-a', None),
    ('secret-unavailable', dict(broken=('anthropic',)), 'job-a', 'job-a', 'anthropic'),
    ('real-credential', dict(headers=[('x', SECRET['other'])]), 'job-a', 'job-a', 'other'),
    ('unknown-placeholder', dict(headers=[('x-api-key', PH_UNISSUED)]), 'job-a', 'job-a', None),
    ('another-job', dict(headers=[('x-api-key', PH_A_JOB_B)]), 'job-a', 'job-a', 'anthropic'),
    ('elsewhere-own-placeholder', dict(path='/?k=' + PH_A), 'job-a', 'job-a', 'anthropic'),
    ('elsewhere-wrong-host-without-client-job', dict(headers=[('authorization', 'Bearer ' + PH_O_JOB_B)]), None,
     'job-b', 'other'),
]


@pytest.mark.parametrize('spec, client_job, job, credential',
                         [row[1:] for row in JOB_AND_CREDENTIAL], ids=[row[0] for row in JOB_AND_CREDENTIAL])
def test_decide_names_the_job_and_the_credential(spec, client_job, job, credential):
    _request, decision = _decide(spec, client_job)
    assert (decision.job, decision.credential) == (job, credential)


def test_a_refusal_is_recorded_under_the_clients_job_when_it_is_known():
    # job-a sends job-b's "other" placeholder to api.provider.test: the refusal names job-a, the sender.
    _request, decision = _decide(dict(headers=[('authorization', 'Bearer ' + PH_O_JOB_B)]), 'job-a')
    assert decision.refused in ('placeholder-elsewhere', 'placeholder-of-another-job')
    assert decision.job == 'job-a'


def test_a_placeholder_as_the_basic_username_is_refused():
    _request, decision = _decide(dict(host=FORGE, headers=[('Authorization', basic(PH_F, 'x-oauth-basic'))]),
                                 'job-a')
    assert decision.refused == 'placeholder-elsewhere'


def test_a_real_secret_inside_a_latin1_basic_value_is_refused():
    value = 'Basic ' + base64.b64encode(('j\xf6e:' + SECRET['forge']).encode('latin-1')).decode('ascii')
    _request, decision = _decide(dict(host=FORGE, headers=[('Authorization', value)]), 'job-a')
    assert decision.refused == 'real-credential'


# --- redact -----------------------------------------------------------------------------------------------

# (id, data, pairs, redacted, count)
REDACTIONS = [
    ('none', b'{"ok": true}', [('anthropic', 'sk-1')], b'{"ok": true}', 0),
    ('no-pairs', b'sk-1 sk-1', [], b'sk-1 sk-1', 0),
    ('empty-data', b'', [('anthropic', 'sk-1')], b'', 0),
    ('one', b'key=sk-1;', [('anthropic', 'sk-1')], b'key=[redacted:anthropic];', 1),
    ('repeated', b'sk-1 sk-1\nsk-1', [('anthropic', 'sk-1')],
     b'[redacted:anthropic] [redacted:anthropic]\n[redacted:anthropic]', 3),
    ('two-secrets', b'a=sk-1 b=gh-2 c=sk-1', [('anthropic', 'sk-1'), ('forge', 'gh-2')],
     b'a=[redacted:anthropic] b=[redacted:forge] c=[redacted:anthropic]', 3),
    ('adjacent', b'sk-1sk-1', [('anthropic', 'sk-1')], b'[redacted:anthropic][redacted:anthropic]', 2),
    ('only-the-secret', b'gh-2', [('anthropic', 'sk-1'), ('forge', 'gh-2')], b'[redacted:forge]', 1),
]


@pytest.mark.parametrize('data, pairs, redacted, count', [r[1:] for r in REDACTIONS], ids=[r[0] for r in REDACTIONS])
def test_redact(data, pairs, redacted, count):
    assert addon.redact(data, pairs) == (redacted, count)


# Derived forms (issue 42, item 4): a response carries the secret escaped, or the Basic value made from it.
# (id, secret, forms derived_forms must include)
DERIVED = [
    ('plain-token', 'sk-ant-REAL-4f3c', ['sk-ant-REAL-4f3c']),
    ('percent-encoded', 'a/b+c=d', ['a/b+c=d', 'a%2Fb%2Bc%3Dd', 'a%2fb%2bc%3dd']),
    ('json-escaped', 'k"e\\y/1', ['k"e\\y/1', 'k\\"e\\\\y/1', 'k\\"e\\\\y\\/1']),
]


@pytest.mark.parametrize('secret, forms', [r[1:] for r in DERIVED], ids=[r[0] for r in DERIVED])
def test_derived_forms(secret, forms):
    derived = addon.derived_forms(secret)
    assert derived[0] == secret and len(derived) == len(set(derived))
    for form in forms:
        assert form in derived


def test_the_percent_and_json_forms_decode_back_to_the_secret():
    from urllib.parse import unquote
    secret = 'x"y\\z/%+ &?#'.replace(' ', '')
    for form in addon.derived_forms(secret):
        assert unquote(form) == secret or json.loads('"%s"' % form) == secret


# (id, response body, secrets, made header values, redacted body)
REDACTED_FORMS = [
    ('percent-in-a-redirect', b'Location: /cb?token=a%2Fb%2Bc', [('forge', 'a/b+c')], [],
     b'Location: /cb?token=[redacted:forge]'),
    ('json-escaped-echo', b'{"key": "s\\/1"}', [('other', 's/1')], [], b'{"key": "[redacted:other]"}'),
    ('basic-value-echoed', b'{"authorization": "Basic YWxpY2U6Z2hwX1JFQUw="}', [('forge', 'ghp_REAL')],
     [("forge", "Basic YWxpY2U6Z2hwX1JFQUw=")], b'{"authorization": "[redacted:forge]"}'),
    ('basic-token-alone', b'seen YWxpY2U6Z2hwX1JFQUw= once', [('forge', 'ghp_REAL')],
     [('forge', 'Basic YWxpY2U6Z2hwX1JFQUw=')], b'seen [redacted:forge] once'),
    ('secret-inside-longer-form-is-one-redaction', b'x=sk%2F1', [('a', 'sk/1'), ('b', 'sk')], [],
     b'x=[redacted:a]'),
]


@pytest.mark.parametrize('body, secrets, made, redacted', [r[1:] for r in REDACTED_FORMS],
                         ids=[r[0] for r in REDACTED_FORMS])
def test_redaction_pairs_cover_the_derived_forms(body, secrets, made, redacted):
    pairs = addon.redaction_pairs(secrets, made)
    assert addon.redact(body, pairs)[0] == redacted


def test_a_basic_swap_reports_the_value_it_made():
    _request, decision = _decide(dict(host=FORGE, headers=[('Authorization', basic('alice', PH_F))]), 'job-a')
    assert decision.made == [('forge', basic('alice', SECRET['forge']))]
    _request, decision = _decide(dict(headers=[('x-api-key', PH_A)]), 'job-a')
    assert decision.made == []


# --- client_address: X-Pi-Client as squid names the job ------------------------------------------------------

@pytest.mark.parametrize('values, address', [
    (['10.70.0.5'], '10.70.0.5'),
    ([' 10.70.0.5 '], '10.70.0.5'),
    (['fd00::5'], 'fd00::5'),
    (['-'], None),
    ([''], None),
    (['10.70.0.5, 10.70.0.6'], None),
    (['10.70.0.5', '10.70.0.6'], None),
    ([], None),
    (['job-a'], None),
    (['10.70.0.256'], None),
])
def test_client_address(values, address):
    assert addon.client_address(values) == address


# --- read_secret_file -------------------------------------------------------------------------------------

# (id, file content (bytes), the secret or None, a piece of the refusal)
SECRET_FILES = [
    ('plain', b'sk-ant-abc123', 'sk-ant-abc123', None),
    ('trailing-newline', b'sk-ant-abc123\n', 'sk-ant-abc123', None),
    ('trailing-crlf', b'sk-ant-abc123\r\n', 'sk-ant-abc123', None),
    ('printable-punctuation', b'!~a:b/c+d=e', '!~a:b/c+d=e', None),
    ('at-the-size-limit', b'A' * 8192, 'A' * 8192, None),
    ('empty', b'', None, 'is empty or larger'),
    ('only-newline', b'\n', None, 'printable ASCII'),
    ('only-crlf', b'\r\n', None, 'printable ASCII'),
    ('two-newlines', b'SEKRETMARK\n\n', None, 'printable ASCII'),
    ('space-inside', b'SEKRET MARK', None, 'printable ASCII'),
    ('tab-inside', b'SEKRET\tMARK', None, 'printable ASCII'),
    ('control-char', b'SEKRET\x01MARK', None, 'printable ASCII'),
    ('del-char', b'SEKRET\x7fMARK', None, 'printable ASCII'),
    ('newline-inside', b'SEKRET\nMARK', None, 'printable ASCII'),
    ('non-ascii', 'SEKRET\u00e9MARK'.encode('utf-8'), None, 'printable ASCII'),
    ('too-big', b'S' * 8193, None, 'larger than 8192 bytes'),
    ('too-big-with-newline', b'S' * 8192 + b'\n', None, 'larger than 8192 bytes'),
]


@pytest.mark.parametrize('content, value, refusal', [r[1:] for r in SECRET_FILES], ids=[r[0] for r in SECRET_FILES])
def test_read_secret_file(tmp_path, content, value, refusal):
    path = str(tmp_path / 'secret')
    with open(path, 'wb') as handle:
        handle.write(content)
    if value is not None:
        assert addon.read_secret_file(path) == value
        return
    with pytest.raises(addon.SecretError) as info:
        addon.read_secret_file(path)
    message = str(info.value)
    assert refusal in message and path in message
    stripped = content.strip()
    if stripped:
        assert stripped.decode('latin-1') not in message
        for piece in (b'SEKRET', b'MARK', b'SSSS'):
            assert piece.decode() not in message


def _symlink(tmp_path):
    target = tmp_path / 'real'
    target.write_bytes(b'SEKRETMARK\n')
    os.symlink(str(target), str(tmp_path / 'secret'))


def _directory(tmp_path):
    (tmp_path / 'secret').mkdir()


def _missing(tmp_path):
    pass


@pytest.mark.parametrize('make, refusal', [
    (_symlink, 'is not a regular file'),
    (_directory, 'is not a regular file'),
    (_missing, 'cannot be read (No such file or directory)'),
], ids=['symlink', 'directory', 'missing'])
def test_read_secret_file_refuses_what_is_not_a_regular_file(tmp_path, make, refusal):
    make(tmp_path)
    path = str(tmp_path / 'secret')
    with pytest.raises(addon.SecretError) as info:
        addon.read_secret_file(path)
    assert str(info.value) == '%s %s' % (path, refusal)
    assert 'SEKRET' not in str(info.value)


# --- Secrets: the cache -----------------------------------------------------------------------------------

class CountingReader(object):
    def __init__(self):
        self.calls = 0

    def __call__(self, path):
        self.calls += 1
        return addon.read_secret_file(path)


def _write(path, content):
    with open(path, 'wb') as handle:
        handle.write(content)


def test_secrets_reads_once_while_nothing_changes(tmp_path):
    path = str(tmp_path / 'anthropic')
    _write(path, b'sk-first\n')
    reader = CountingReader()
    secrets = addon.Secrets(reader)
    assert [secrets.get(path) for _index in range(5)] == ['sk-first'] * 5
    assert reader.calls == 1


def test_secrets_reads_a_replaced_file_again(tmp_path):
    path = str(tmp_path / 'anthropic')
    _write(path, b'sk-first\n')
    reader = CountingReader()
    secrets = addon.Secrets(reader)
    assert secrets.get(path) == 'sk-first'
    new = str(tmp_path / 'anthropic.new')
    _write(new, b'sk-other\n')   # the same size: only the inode tells them apart
    os.replace(new, path)
    assert secrets.get(path) == 'sk-other'
    assert secrets.get(path) == 'sk-other'
    assert reader.calls == 2


def test_secrets_reads_a_file_rewritten_in_place_again(tmp_path):
    path = str(tmp_path / 'anthropic')
    _write(path, b'sk-first\n')
    reader = CountingReader()
    secrets = addon.Secrets(reader)
    assert secrets.get(path) == 'sk-first'
    inode = os.stat(path).st_ino
    _write(path, b'sk-rotated-longer\n')
    assert os.stat(path).st_ino == inode
    assert secrets.get(path) == 'sk-rotated-longer'
    assert secrets.get(path) == 'sk-rotated-longer'
    assert reader.calls == 2


def test_secrets_refuses_a_file_that_went_away(tmp_path):
    path = str(tmp_path / 'anthropic')
    _write(path, b'sk-first\n')
    secrets = addon.Secrets()
    assert secrets.get(path) == 'sk-first'
    os.remove(path)
    with pytest.raises(addon.SecretError):
        secrets.get(path)


def test_secrets_keeps_separate_paths_apart(tmp_path):
    one, two = str(tmp_path / 'one'), str(tmp_path / 'two')
    _write(one, b'sk-one')
    _write(two, b'sk-two')
    secrets = addon.Secrets()
    assert (secrets.get(one), secrets.get(two), secrets.get(one)) == ('sk-one', 'sk-two', 'sk-one')


# --- Jobs -------------------------------------------------------------------------------------------------

def _record(folder, name, record):
    with open(os.path.join(str(folder), name), 'w') as handle:
        handle.write(record if isinstance(record, str) else json.dumps(record))


@pytest.fixture
def jobs_folder(tmp_path):
    folder = tmp_path / 'jobs'
    folder.mkdir()
    _record(folder, 'job-a.json', {'job': 'job-a', 'subnets': ['10.70.0.0/24', 'fd70:a::/64'],
                                   'placeholders': {'anthropic': PH_A, 'other': PH_O}})
    _record(folder, 'job-b.json', {'job': 'job-b', 'subnets': ['10.70.1.0/24'],
                                   'placeholders': {'anthropic': PH_A_JOB_B}})
    _record(folder, 'job-c.txt', {'job': 'job-c', 'subnets': ['10.70.2.0/24'], 'placeholders': {'forge': PH_F}})
    _record(folder, 'broken.json', '{"job": "job-d", ')
    _record(folder, 'list.json', '[1, 2]')
    _record(folder, 'no-job.json', {'subnets': ['10.70.3.0/24'], 'placeholders': {'other': PH_O_JOB_B}})
    with open(os.path.join(str(folder), 'binary.json'), 'wb') as handle:
        handle.write(b'\xff\xfe{}')
    return folder


def test_jobs_reads_every_json_record_and_ignores_the_rest(jobs_folder):
    jobs = addon.Jobs(str(jobs_folder))
    jobs.refresh()
    assert jobs.by_placeholder == {PH_A: ('job-a', 'anthropic'), PH_O: ('job-a', 'other'),
                                   PH_A_JOB_B: ('job-b', 'anthropic')}
    assert sorted(set(job for _net, job in jobs.by_network)) == ['job-a', 'job-b']


@pytest.mark.parametrize('address, job', [
    ('10.70.0.5', 'job-a'),
    ('10.70.0.255', 'job-a'),
    ('10.70.1.9', 'job-b'),
    ('fd70:a::5', 'job-a'),
    ('FD70:A:0:0::1', 'job-a'),
    ('fd70:b::5', None),
    ('10.70.2.5', None),     # job-c's record is not a .json file
    ('10.70.3.5', None),     # a record without a job
    ('192.0.2.1', None),
    ('not-an-address', None),
    ('', None),
])
def test_jobs_job_of(jobs_folder, address, job):
    jobs = addon.Jobs(str(jobs_folder))
    jobs.refresh()
    assert jobs.job_of(address) == job


def test_jobs_forgets_a_removed_record(jobs_folder):
    jobs = addon.Jobs(str(jobs_folder))
    jobs.refresh()
    assert jobs.job_of('10.70.1.9') == 'job-b'
    os.remove(os.path.join(str(jobs_folder), 'job-b.json'))
    assert jobs.job_of('10.70.1.9') == 'job-b'   # until the next refresh
    jobs.refresh()
    assert jobs.job_of('10.70.1.9') is None
    assert PH_A_JOB_B not in jobs.by_placeholder
    assert jobs.job_of('10.70.0.5') == 'job-a'


def test_jobs_learns_a_new_record(jobs_folder):
    jobs = addon.Jobs(str(jobs_folder))
    jobs.refresh()
    _record(jobs_folder, 'job-e.json', {'job': 'job-e', 'subnets': ['10.70.9.0/24'], 'placeholders': {}})
    jobs.refresh()
    assert jobs.job_of('10.70.9.1') == 'job-e'


def test_jobs_with_a_missing_folder_is_empty(tmp_path, jobs_folder):
    missing = addon.Jobs(str(tmp_path / 'nowhere'))
    missing.refresh()
    assert (missing.by_placeholder, missing.by_network, missing.job_of('10.70.0.5')) == ({}, [], None)
    # a folder that goes away empties what was known
    jobs = addon.Jobs(str(jobs_folder))
    jobs.refresh()
    assert jobs.by_placeholder
    for name in os.listdir(str(jobs_folder)):
        os.remove(os.path.join(str(jobs_folder), name))
    os.rmdir(str(jobs_folder))
    jobs.refresh()
    assert (jobs.by_placeholder, jobs.by_network) == ({}, [])


# --- load_config ------------------------------------------------------------------------------------------

def test_load_config_reads_version_1():
    text = json.dumps({'version': 1, 'credentials': [
        {'name': 'anthropic', 'host': 'API.Provider.test', 'port': 443, 'scheme': 'header', 'header': 'X-Api-Key',
         'secret': '/run/pi-secrets/anthropic'},
        {'name': 'forge', 'host': 'forge.test', 'port': '443', 'scheme': 'basic', 'header': 'authorization',
         'secret': '/run/pi-secrets/forge'}]})
    creds = addon.load_config(text)
    assert [(c.name, c.host, c.port, c.scheme, c.header, c.secret) for c in creds] == [
        ('anthropic', 'api.provider.test', 443, 'header', 'x-api-key', '/run/pi-secrets/anthropic'),
        ('forge', 'forge.test', 443, 'basic', 'authorization', '/run/pi-secrets/forge')]
    assert addon.load_config('{"version": 1, "credentials": []}') == []


@pytest.mark.parametrize('text', [
    '{"version": 2, "credentials": []}',
    '{"version": 0, "credentials": []}',
    '{"version": "1", "credentials": []}',
    '{"credentials": []}',
    '{"version": 1}',
    '{"version": 1, "credentials": {}}',
    '[{"version": 1, "credentials": []}]',
    'not json',
], ids=['version-2', 'version-0', 'version-string', 'no-version', 'no-credentials', 'credentials-object',
        'top-level-list', 'not-json'])
def test_load_config_refuses_other_shapes(text):
    with pytest.raises(ValueError):
        addon.load_config(text)
