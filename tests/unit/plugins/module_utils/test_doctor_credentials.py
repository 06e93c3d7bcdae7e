"""The doctor's credential check (_doctor/credentials.py): probe paths, the canary's script, its lines.

Pure logic and a real ``sh`` running the canary's script against a stub ``curl``; no daemon. The daemon
part of :class:`CredentialsCheck` (the canary itself) is never reached: every case ends before it.
"""

import base64
import json
import os
import shlex
import stat

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import credentials as _dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.context import DoctorContext
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.lines import Line
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import credentials as _credentials
from ansible_collections.pi_dispatch.egress.tests.unit.plugins.module_utils.fakes import EngineClient as FakeClient

INTERCEPTOR = 'pi-dispatch-egress-interceptor'
PROXY = 'pi-dispatch-egress-proxy'
TOKEN = '0123456789abcdef0123456789abcdef'
SECRET = 'sk-REAL-doctor-test-secret-4711'
OTHER_SECRET = 'ghp_REALdoctortestsecret0815'


def cred(name='anthropic', host='api.anthropic.com', env='ANTHROPIC_API_KEY', scheme='header', header='x-api-key',
         secret_file=None):
    return _credentials.Credential(name, host, 443, env, scheme, header,
                                   secret_file or '/etc/pi-dispatch/secrets/%s' % name)


ANTHROPIC = cred()
FORGE = cred('forge', 'api.github.com', 'GH_TOKEN', 'bearer', 'authorization')
REGISTRY = cred('registry', 'registry.example.com', 'REGISTRY_PASSWORD', 'basic', 'authorization')
ANTHROPIC_BEARER = cred('anthropic-b', 'api.anthropic.com', 'ANTHROPIC_AUTH_TOKEN', 'bearer', 'authorization')


def placeholder(c):
    return _credentials.placeholder(c.name, TOKEN)


# --- check_probe_paths --------------------------------------------------------------------------

@pytest.mark.parametrize('paths, expected', [
    (None, {}),
    ({}, {}),
    ({'anthropic': '/v1/models'}, {'anthropic': '/v1/models'}),
    ({'forge': '/user'}, {'forge': '/user'}),
    ({'x': '/a/b?x=1&y=2'}, {'x': '/a/b?x=1&y=2'}),
    ({'x': '/'}, {'x': '/'}),
    ({'x': '/v1/models?limit=1', 'y': '/user'}, {'x': '/v1/models?limit=1', 'y': '/user'}),
    ({'x': '/a%20b/~c:d@e'}, {'x': '/a%20b/~c:d@e'}),
    ({'x': '/' + 'a' * 255}, {'x': '/' + 'a' * 255}),
], ids=['none', 'empty', 'v1-models', 'user', 'query', 'root', 'two', 'escapes', '256-chars'])
def test_check_probe_paths_good(paths, expected):
    assert _dc.check_probe_paths(paths) == expected


@pytest.mark.parametrize('path', [
    'v1/models',
    '',
    '/v1/ models',
    "/v1/'models",
    '/v1/"models',
    '/v1/`id`',
    '/v1/$(id)',
    '/v1/models\n',
    '/v1/models\n/x',
    '/v1/\tmodels',
    '/' + 'a' * 256,
    None,
    42,
    ['/v1/models'],
    b'/v1/models',
], ids=['no-slash', 'empty', 'space', 'quote', 'double-quote', 'backtick', 'command-substitution',
        'trailing-newline', 'inner-newline', 'tab', '257-chars', 'none', 'int', 'list', 'bytes'])
def test_check_probe_paths_refused(path):
    with pytest.raises(ValueError) as info:
        _dc.check_probe_paths({'good': '/v1/models', 'bad-cred': path})
    message = str(info.value)
    assert 'credentials_probe_paths[bad-cred]' in message
    assert repr(path) in message


# --- elsewhere_target --------------------------------------------------------------------------

@pytest.mark.parametrize('creds, expected', [
    ([ANTHROPIC], (ANTHROPIC, 'api.anthropic.com', 'url')),
    ([ANTHROPIC, FORGE], (ANTHROPIC, 'api.github.com', 'header')),
    ([FORGE, ANTHROPIC], (FORGE, 'api.anthropic.com', 'header')),
    ([ANTHROPIC, ANTHROPIC_BEARER], (ANTHROPIC, 'api.anthropic.com', 'url')),
    ([ANTHROPIC, ANTHROPIC_BEARER, FORGE], (ANTHROPIC, 'api.github.com', 'header')),
    ([ANTHROPIC, ANTHROPIC_BEARER, FORGE, REGISTRY], (ANTHROPIC, 'api.github.com', 'header')),
], ids=['one', 'two-hosts', 'two-hosts-reversed', 'one-host-two-headers', 'same-host-then-other',
        'first-other-host-wins'])
def test_elsewhere_target(creds, expected):
    assert _dc.elsewhere_target(creds) == expected


# --- probe_script, run by sh against a stub curl ------------------------------------------------

STUB = r'''#!/bin/sh
# A stub curl: records what it was asked, answers from the table below.
dump=; out=; fmt=; url=; cacert=
while [ $# -gt 0 ]; do
  case "$1" in
    -D) dump=$2; shift 2;;
    -o) out=$2; shift 2;;
    -w) fmt=$2; shift 2;;
    -H) printf '%%s\n' "$2" >> "%(dir)s/headers.pending"; shift 2;;
    --cacert) cacert=$2; shift 2;;
    --max-time) shift 2;;
    -s) shift;;
    *) url=$1; shift;;
  esac
done
if [ -f "%(dir)s/headers.pending" ]; then
  while IFS= read -r header; do
    printf '%%s\t%%s\n' "$url" "$header" >> "%(dir)s/headers"
  done < "%(dir)s/headers.pending"
  rm -f "%(dir)s/headers.pending"
fi
printf '%%s\t%%s\t%%s\n' "$url" "$cacert" "$fmt" >> "%(dir)s/calls"
code=404; rc=0; wout=yes; body='no such path'
case "$url" in
%(cases)s
esac
if [ "$rc" != 0 ]; then
  [ "$wout" = yes ] && printf '000 000'
  exit "$rc"
fi
[ -n "$dump" ] && printf 'HTTP/1.1 %%s Canned\r\nx-stub: yes\r\n\r\n' "$code" > "$dump"
[ -n "$out" ] && printf '%%s\n' "$body" > "$out"
[ -n "$fmt" ] && printf '%%s 200' "$code"
exit 0
'''


def write_stub(folder, answers):
    """A stub curl in ``folder/bin``; ``answers`` maps a URL to (code, body, rc, writes -w output)."""
    bin_dir = folder / 'bin'
    bin_dir.mkdir()
    cases = '\n'.join('  %s) code=%d; body=%s; rc=%d; wout=%s;;'
                      % (shlex.quote(url), code, shlex.quote(body), rc, 'yes' if wout else 'no')
                      for url, (code, body, rc, wout) in answers.items())
    path = bin_dir / 'curl'
    path.write_text(STUB % dict(dir=str(folder), cases=cases))
    path.chmod(0o755)
    return bin_dir


def run_probe(tmp_path, creds, answers, paths=None, subprocess_env=None):
    """(output, {url: [headers]}, [(url, cacert, fmt)]) of the canary's script run by sh."""
    import subprocess
    bin_dir = write_stub(tmp_path, answers)
    out_dir = tmp_path / 'out'
    out_dir.mkdir()
    script = _dc.probe_script(creds, paths or {}, 7)
    assert '/tmp/' in script
    # The script keeps its files in the container's /tmp; here they go to this test's own folder.
    script = script.replace('/tmp/', '%s/' % out_dir)
    env = dict(PATH='%s:%s' % (bin_dir, os.environ.get('PATH', '/usr/bin:/bin')), SSL_CERT_FILE='/ca/doctor.pem')
    env.update((c.env, placeholder(c)) for c in creds)
    env.update(subprocess_env or {})
    done = subprocess.run(['sh', '-c', script], env=env, capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    headers = {}
    if (tmp_path / 'headers').exists():
        for row in (tmp_path / 'headers').read_text().splitlines():
            url, header = row.split('\t', 1)
            headers.setdefault(url, []).append(header)
    calls = [tuple(row.split('\t')) for row in (tmp_path / 'calls').read_text().splitlines()]
    return done.stdout.decode(), headers, calls


def refusal(why):
    return _dc.REFUSAL + why


def basic(c):
    return 'Basic %s' % base64.b64encode(('pi-doctor:%s' % placeholder(c)).encode()).decode()


ELSEWHERE_ONE = 'https://api.anthropic.com/v1/models?pi_doctor=%s' % placeholder(ANTHROPIC)

PROBE_CASES = [
    ('one-header-credential',
     [ANTHROPIC], {},
     {'https://api.anthropic.com/v1/models': (200, '{"data": []}', 0, True),
      ELSEWHERE_ONE: (403, refusal('placeholder-elsewhere'), 0, True)},
     {('swap', 0): (0, 200, 200, None), ('elsewhere', 0): (0, 403, 200, 'placeholder-elsewhere')},
     {'https://api.anthropic.com/v1/models': ['x-api-key: %s' % placeholder(ANTHROPIC)]}),
    ('one-bearer-credential-own-path',
     [FORGE], {'forge': '/user'},
     {'https://api.github.com/user': (200, '{"login": "x"}', 0, True),
      'https://api.github.com/user?pi_doctor=%s' % placeholder(FORGE):
          (403, refusal('placeholder-elsewhere'), 0, True)},
     {('swap', 0): (0, 200, 200, None), ('elsewhere', 0): (0, 403, 200, 'placeholder-elsewhere')},
     {'https://api.github.com/user': ['authorization: Bearer %s' % placeholder(FORGE)]}),
    ('one-basic-credential-path-with-query',
     [REGISTRY], {'registry': '/v2/?x=1'},
     {'https://registry.example.com/v2/?x=1': (302, 'moved', 0, True),
      'https://registry.example.com/v2/?x=1&pi_doctor=%s' % placeholder(REGISTRY):
          (403, refusal('placeholder-elsewhere'), 0, True)},
     {('swap', 0): (0, 302, 200, None), ('elsewhere', 0): (0, 403, 200, 'placeholder-elsewhere')},
     {'https://registry.example.com/v2/?x=1': ['authorization: %s' % basic(REGISTRY)]}),
    ('two-hosts-elsewhere-in-header',
     [ANTHROPIC, FORGE], {'forge': '/user'},
     {'https://api.anthropic.com/v1/models': (200, 'ok', 0, True),
      'https://api.github.com/user': (401, 'bad credentials', 0, True)},
     # the stub answers the forge URL twice (swap and elsewhere): both 401, no refusal
     {('swap', 0): (0, 200, 200, None), ('swap', 1): (0, 401, 200, None), ('elsewhere', 0): (0, 401, 200, None)},
     {'https://api.anthropic.com/v1/models': ['x-api-key: %s' % placeholder(ANTHROPIC)],
      # the misplaced placeholder goes in forge's header, written in forge's scheme (bearer)
      'https://api.github.com/user': ['authorization: Bearer %s' % placeholder(FORGE),
                                      'authorization: Bearer %s' % placeholder(ANTHROPIC)]}),
    ('two-hosts-bearer-placeholder-in-other-header',
     [FORGE, ANTHROPIC], {},
     {'https://api.github.com/v1/models': (404, 'not found', 0, True),
      'https://api.anthropic.com/v1/models': (403, refusal('placeholder-elsewhere'), 0, True)},
     # the stub answers anthropic's URL the same way twice: its swap probe too is refused
     {('swap', 0): (0, 404, 200, None), ('swap', 1): (0, 403, 200, 'placeholder-elsewhere'),
      ('elsewhere', 0): (0, 403, 200, 'placeholder-elsewhere')},
     {'https://api.github.com/v1/models': ['authorization: Bearer %s' % placeholder(FORGE)],
      'https://api.anthropic.com/v1/models': ['x-api-key: %s' % placeholder(ANTHROPIC),
                                              'x-api-key: %s' % placeholder(FORGE)]}),
    ('refusal-reason-parsed',
     [ANTHROPIC], {},
     {'https://api.anthropic.com/v1/models': (502, refusal('secret-unavailable') + ' (see the logs)', 0, True),
      ELSEWHERE_ONE: (404, 'not found', 0, True)},
     {('swap', 0): (0, 502, 200, 'secret-unavailable'), ('elsewhere', 0): (0, 404, 200, None)},
     {'https://api.anthropic.com/v1/models': ['x-api-key: %s' % placeholder(ANTHROPIC)]}),
    ('curl-fails-with-write-out',
     [ANTHROPIC], {},
     {'https://api.anthropic.com/v1/models': (0, '', 7, True),
      ELSEWHERE_ONE: (0, '', 28, True)},
     {('swap', 0): (7, 0, 0, None), ('elsewhere', 0): (28, 0, 0, None)},
     {'https://api.anthropic.com/v1/models': ['x-api-key: %s' % placeholder(ANTHROPIC)]}),
]


@pytest.mark.parametrize('creds, paths, answers, results, headers', [case[1:] for case in PROBE_CASES],
                         ids=[case[0] for case in PROBE_CASES])
def test_probe_script_runs(tmp_path, creds, paths, answers, results, headers):
    output, got_headers, calls = run_probe(tmp_path, creds, answers, paths)
    assert _dc.parse_results(output) == results
    assert got_headers == headers
    # every probe: the deployment CA, the write-out the result line needs
    assert len(calls) == len(creds) + 1
    assert all(cacert == '/ca/doctor.pem' and fmt == '%{http_code} %{http_connect}' for _u, cacert, fmt in calls)
    assert [url for url, _c, _f in calls][-1] in answers
    # the environment is dumped first, placeholders and all, for the search on the host
    environment = output.split('--- environment\n', 1)[1]
    for c in creds:
        assert '%s=%s' % (c.env, placeholder(c)) in environment
    # each answer the probe got is kept in the output (headers and body)
    for url, (code, body, rc, _w) in answers.items():
        if rc == 0:
            assert body in output
            assert 'HTTP/1.1 %d Canned' % code in output


def test_probe_script_elsewhere_in_url_carries_the_placeholder(tmp_path):
    answers = {ELSEWHERE_ONE: (403, refusal('placeholder-elsewhere'), 0, True)}
    output, headers, calls = run_probe(tmp_path, [ANTHROPIC], answers)
    assert calls[-1][0] == ELSEWHERE_ONE
    # the misplaced probe sends no header: the placeholder travels in the URL only
    assert ELSEWHERE_ONE not in headers


def test_probe_script_writes_only_its_own_files(tmp_path):
    _dc.probe_script([ANTHROPIC, FORGE], {}, 5)  # pure: nothing written
    script = _dc.probe_script([ANTHROPIC, FORGE], {'forge': '/user'}, 5)
    assert '--max-time 5 ' in script
    for tag in ('swap-0', 'swap-1', 'elsewhere-0'):
        assert '-D /tmp/%s.h -o /tmp/%s.b' % (tag, tag) in script
    assert script.startswith('echo "--- environment"; env | sort; ')
    # no secret file is named in what runs in the job
    assert ANTHROPIC.secret_file not in script and FORGE.secret_file not in script


def test_probe_script_curl_fails_without_write_out(tmp_path):
    """curl printing no write-out at all (killed, or missing): the result line still parses, as 000 000."""
    output, _h, _c = run_probe(tmp_path, [ANTHROPIC], {
        'https://api.anthropic.com/v1/models': (0, '', 7, False),
        ELSEWHERE_ONE: (403, refusal('placeholder-elsewhere'), 0, True)})
    assert _dc.parse_results(output)[('swap', 0)] == (7, 0, 0, None)


def test_probe_path_with_dollar_is_refused():
    """The path goes inside sh double quotes, so $NAME would be expanded: $ is refused."""
    for path in ('/v1/$HOME', '/v1/models?k=$ANTHROPIC_API_KEY', '/${PATH}'):
        with pytest.raises(ValueError) as info:
            _dc.check_probe_paths({'anthropic': path})
        assert 'credentials_probe_paths[anthropic]' in str(info.value) and 'or $' in str(info.value)


# --- parse_results ------------------------------------------------------------------------------

M = _dc.MARK


@pytest.mark.parametrize('text, expected', [
    ('', {}),
    ('junk\n--- environment\nPATH=/bin', {}),
    ('%s swap 0 0 200 200 -' % M, {('swap', 0): (0, 200, 200, None)}),
    ('%s elsewhere 0 0 403 200 placeholder-elsewhere' % M, {('elsewhere', 0): (0, 403, 200, 'placeholder-elsewhere')}),
    ('%s swap 3 7 000 000 -' % M, {('swap', 3): (7, 0, 0, None)}),
    ('   %s swap 1 0 401 200 -   \r' % M, {('swap', 1): (0, 401, 200, None)}),
    ('\t%s swap 1 0 204 200 -' % M, {('swap', 1): (0, 204, 200, None)}),
    ('%s swap 0 0 200 200' % M, {}),
    ('%s swap 0 0 200 200 - extra' % M, {}),
    ('%s swap 0 0 200 -' % M, {}),
    ('%s swap 0 7  -' % M, {}),
    ('%s swap 0 0 20 200 -' % M, {}),
    ('%s swap x 0 200 200 -' % M, {}),
    ('%s other 0 0 200 200 -' % M, {}),
    ('%s swap 0 0 200 200 Secret-Unavailable' % M, {}),
    ('say %s swap 0 0 200 200 -' % M, {}),
    ('%sX swap 0 0 200 200 -' % M, {}),
    ('%s  swap 0 0 200 200 -' % M, {}),
    ('%s swap 0 0 200 200 -\n%s swap 0 0 401 200 -' % (M, M), {('swap', 0): (0, 401, 200, None)}),
    ('x\n%s swap 0 0 200 200 -\n==> /tmp/swap-0.b <==\n%s elsewhere 0 0 403 200 placeholder-elsewhere\n' % (M, M),
     {('swap', 0): (0, 200, 200, None), ('elsewhere', 0): (0, 403, 200, 'placeholder-elsewhere')}),
], ids=['empty', 'junk', 'swap-ok', 'elsewhere-refused', 'curl-failed', 'whitespace-around', 'leading-tab',
        'too-few-fields', 'too-many-fields', 'one-code-missing', 'write-out-empty', 'two-digit-code',
        'index-not-number', 'unknown-kind', 'reason-uppercase', 'text-before-mark', 'mark-glued', 'double-space',
        'last-one-wins', 'mixed-with-output'])
def test_parse_results(text, expected):
    assert _dc.parse_results(text) == expected


# --- swap_line and elsewhere_line ---------------------------------------------------------------

# (id, result, line id, status, words in the message, words in the fix)
SWAP_CASES = [
    ('not-run', None, 'credentials.notrun', 'notrun', ['did not run'], None),
    ('secret-unavailable', (0, 502, 200, 'secret-unavailable'), 'credentials.swap_refused', 'fail',
     ['secret-unavailable', 'https://api.anthropic.com/v1/models'],
     ['cannot read the secret file', 'docker inspect my-interceptor']),
    ('unknown-placeholder', (0, 403, 200, 'unknown-placeholder'), 'credentials.swap_refused', 'fail',
     ['unknown-placeholder'], ['credentials/jobs mount']),
    ('other-refusal', (0, 403, 200, 'header-mismatch'), 'credentials.swap_refused', 'fail',
     ['header-mismatch'], ['docker logs --tail 30 my-interceptor names the refusal']),
    ('refusal-with-200', (0, 200, 200, 'placeholder-elsewhere'), 'credentials.swap_refused', 'fail',
     ['placeholder-elsewhere'], ['docker logs --tail 30 my-interceptor']),
    ('401', (0, 401, 200, None), 'credentials.swap_rejected', 'fail',
     ['HTTP 401', '/etc/pi-dispatch/secrets/anthropic'], ['/etc/pi-dispatch/secrets/anthropic', 'my-interceptor']),
    ('403', (0, 403, 200, None), 'credentials.swap_rejected', 'fail', ['HTTP 403'], None),
    ('407', (0, 407, 200, None), 'credentials.swap_rejected', 'fail', ['HTTP 407'], None),
    ('curl-failed', (7, 0, 0, None), 'credentials.swap_unreached', 'warn',
     ['curl exit 7', 'CONNECT answered nothing'], ['docker logs --tail 30 my-interceptor', 'api.anthropic.com']),
    ('curl-failed-after-connect', (28, 0, 200, None), 'credentials.swap_unreached', 'warn',
     ['curl exit 28', 'CONNECT answered 200'], None),
    ('curl-failed-with-code', (56, 200, 200, None), 'credentials.swap_unreached', 'warn', ['curl exit 56'], None),
    ('code-0', (0, 0, 403, None), 'credentials.swap_unreached', 'warn', ['CONNECT answered 403'], None),
    ('200', (0, 200, 200, None), 'credentials.swap', 'ok', ['swapped', 'HTTP 200'], None),
    ('204', (0, 204, 200, None), 'credentials.swap', 'ok', ['HTTP 204'], None),
    ('302', (0, 302, 200, None), 'credentials.swap', 'ok', ['HTTP 302'], None),
    ('404', (0, 404, 200, None), 'credentials.swap_unproven', 'warn', ['HTTP 404', 'not that the provider'],
     ['doctor_credentials_probe_paths[anthropic]', 'api.anthropic.com']),
    ('500', (0, 500, 200, None), 'credentials.swap_unproven', 'warn', ['HTTP 500'], None),
]


@pytest.mark.parametrize('result, line_id, status, said, fixed', [case[1:] for case in SWAP_CASES],
                         ids=[case[0] for case in SWAP_CASES])
def test_swap_line(result, line_id, status, said, fixed):
    line = _dc.swap_line(ANTHROPIC, '/v1/models', result, 'my-interceptor')
    assert isinstance(line, Line)
    assert (line.id, line.status) == (line_id, status)
    assert 'anthropic' in line.message
    if result is not None:
        assert 'api.anthropic.com' in line.message
    for word in said:
        assert word in line.message
    for word in fixed or []:
        assert word in line.fix
    if status == 'ok':
        assert line.fix is None
    elif status in ('fail', 'warn'):
        assert line.fix
    assert '<interceptor>' not in (line.fix or '')


@pytest.mark.parametrize('where, said', [('header', 'in the header of api.github.com'),
                                         ('url', 'in the URL of api.github.com')], ids=['header', 'url'])
@pytest.mark.parametrize('result, line_id, status, words', [
    (None, 'credentials.notrun', 'notrun', ['did not run']),
    ((0, 403, 200, 'placeholder-elsewhere'), 'credentials.elsewhere', 'ok', ['placeholder-elsewhere', 'HTTP 403']),
    ((7, 0, 0, 'placeholder-elsewhere'), 'credentials.elsewhere', 'ok', ['placeholder-elsewhere']),
    ((0, 403, 200, 'unknown-placeholder'), 'credentials.elsewhere_passed', 'fail',
     ['refused as unknown-placeholder', 'HTTP 403']),
    ((0, 200, 200, None), 'credentials.elsewhere_passed', 'fail', ['answered by the host', 'HTTP 200']),
    ((0, 401, 200, None), 'credentials.elsewhere_passed', 'fail', ['HTTP 401']),
    ((7, 0, 0, None), 'credentials.elsewhere_unreached', 'warn', ['curl exit 7', 'CONNECT answered nothing']),
    ((28, 200, 200, None), 'credentials.elsewhere_unreached', 'warn', ['curl exit 28', 'CONNECT answered 200']),
    ((0, 0, 403, None), 'credentials.elsewhere_unreached', 'warn', ['CONNECT answered 403']),
], ids=['not-run', 'refused-elsewhere', 'refused-elsewhere-curl-failed', 'other-refusal', 'passed-200', 'passed-401',
        'curl-failed', 'curl-failed-with-code', 'code-0'])
def test_elsewhere_line(result, line_id, status, words, where, said):
    line = _dc.elsewhere_line(ANTHROPIC, 'api.github.com', where, result, 'my-interceptor')
    assert (line.id, line.status) == (line_id, status)
    assert 'anthropic' in line.message
    if result is not None:
        assert said in line.message
    for word in words:
        assert word in line.message
    if status in ('fail', 'warn'):
        assert 'my-interceptor' in line.fix
    else:
        assert line.fix is None


# --- seen_lines ---------------------------------------------------------------------------------

HOSTS = ['api.github.com', 'api.anthropic.com', 'api.anthropic.com']


@pytest.mark.parametrize('text, secrets, expected', [
    ('', {}, [('credentials.secret_unseen', 'ok')]),
    ('env\nANTHROPIC_API_KEY=%s\n' % placeholder(ANTHROPIC), {'anthropic': SECRET, 'forge': OTHER_SECRET},
     [('credentials.secret_unseen', 'ok')]),
    ('x-upstream: %s' % SECRET[:-1], {'anthropic': SECRET}, [('credentials.secret_unseen', 'ok')]),
    ('anything', {'anthropic': '', 'forge': OTHER_SECRET}, [('credentials.secret_unseen', 'ok')]),
    ('ANTHROPIC_API_KEY=%s\n' % SECRET, {'anthropic': SECRET, 'forge': OTHER_SECRET},
     [('credentials.secret_seen', 'fail')]),
    ('body: {"token": "%s"} and %s' % (OTHER_SECRET, SECRET), {'forge': OTHER_SECRET, 'anthropic': SECRET},
     [('credentials.secret_seen', 'fail'), ('credentials.secret_seen', 'fail')]),
    ('https://h/?api_key=%s' % SECRET, {'anthropic': SECRET}, [('credentials.secret_seen', 'fail')]),
], ids=['nothing', 'placeholders-only', 'prefix-only', 'empty-secret-ignored', 'one-of-two-seen', 'both-seen',
        'seen-in-url'])
def test_seen_lines(text, secrets, expected):
    lines = _dc.seen_lines(text, secrets, HOSTS)
    assert [(line.id, line.status) for line in lines] == expected
    dumped = json.dumps([line.as_dict() for line in lines])
    for secret in secrets.values():
        if secret:
            assert secret not in dumped
    if expected[0][0] == 'credentials.secret_unseen':
        assert 'api.anthropic.com, api.github.com answered' in lines[0].message
        assert '(%d secrets searched for, on the host)' % len(secrets) in lines[0].message
    else:
        seen = sorted(name for name, secret in secrets.items() if secret and secret in text)
        assert [name for line in lines for name in secrets if 'secret of %s ' % name in line.message] == seen
        assert all(line.fix for line in lines)


# --- CredentialsCheck without a daemon ----------------------------------------------------------

class NotFound(Exception):
    pass


class FakeAPI(object):
    def __init__(self, containers=None, error=None):
        self.containers = containers or {}
        self.error = error
        self.inspected = []

    def inspect_container(self, name):
        self.inspected.append(name)
        if self.error:
            raise Exception(self.error)
        if name not in self.containers:
            raise NotFound('No such container: %s' % name)
        return self.containers[name]


@pytest.fixture
def no_canary(monkeypatch):
    """The missing-container error is NotFound; the canary (it needs a daemon) must never be reached."""
    monkeypatch.setattr(dc, 'is_not_found', lambda exc: isinstance(exc, NotFound))

    def canary(*_args, **_kwargs):
        raise AssertionError('the canary was reached')
    monkeypatch.setattr(_dc.CredentialsCheck, 'canary', staticmethod(canary))
    if os.geteuid() != 0:  # the secret must be owned by root (uid 0): here, by whoever runs the tests
        check = _credentials.check_secret
        monkeypatch.setattr(_credentials, 'check_secret',
                            lambda c, path_override=None, owner_uid=os.geteuid(): check(c, path_override, owner_uid))


RUNNING = {'State': {'Running': True, 'Paused': False, 'Status': 'running'}}
EXITED = {'State': {'Running': False, 'Paused': False, 'Status': 'exited'}}
PAUSED = {'State': {'Running': True, 'Paused': True, 'Status': 'paused'}}


def declare(folder, secret_mode=0o600, secret=SECRET, write_secret=True):
    """A valid declaration in ``folder`` (one credential), its secret file written as asked; the secret's path."""
    secrets = folder / 'secrets'
    secrets.mkdir()
    secret_file = secrets / 'anthropic'
    if write_secret:
        secret_file.write_text(secret + '\n')
        secret_file.chmod(secret_mode)
    forge_file = secrets / 'forge'
    forge_file.write_text(OTHER_SECRET + '\n')
    forge_file.chmod(0o600)
    (folder / _credentials.FILE_NAME).write_text(json.dumps({'version': 1, 'credentials': [
        dict(name='anthropic', host='api.anthropic.com', port=443, env='ANTHROPIC_API_KEY', scheme='header',
             header='x-api-key', secret_file=str(secret_file)),
        dict(name='forge', host='api.github.com', port=443, env='GH_TOKEN', scheme='bearer',
             secret_file=str(forge_file)),
    ]}))
    return str(secret_file)


_RUNNING_PROXY = object()  # context()'s default: a running proxy (None is a missing one)


def context(folder, api, proxy=_RUNNING_PROXY, check_mode=False, interceptor=''):
    """A context whose proxy inspect is ``proxy`` (None: there is no proxy container)."""
    attrs = RUNNING if proxy is _RUNNING_PROXY else proxy
    return DoctorContext(client=FakeClient(api), proxy=PROXY, deploy_dir=str(folder) if folder else folder,
                         probe_image='x', pid=123, environ={}, attrs=attrs, check_mode=check_mode,
                         credentials_interceptor=interceptor)


def summary(lines):
    return [(line.id, line.status) for line in lines]


def assert_no_secret(lines):
    dumped = json.dumps([line.as_dict() for line in lines]) + repr(lines)
    assert SECRET not in dumped and OTHER_SECRET not in dumped


@pytest.mark.parametrize('make', [
    lambda folder: None,
    lambda folder: (folder / 'egress-allowlist.conf').write_text('api.anthropic.com\n'),
    lambda folder: (folder / _credentials.FILE_NAME).write_text(_credentials.EMPTY_DECLARATION),
    lambda folder: (folder / _credentials.FILE_NAME).write_text('{"version": 1, "credentials": []}'),
], ids=['no-declaration', 'allowlist-only', 'empty-declaration', 'empty-declaration-compact'])
def test_check_nothing_declared(tmp_path, no_canary, make):
    make(tmp_path)
    api = FakeAPI({INTERCEPTOR: RUNNING})
    assert _dc.CredentialsCheck().lines(context(tmp_path, api)) == []
    assert api.inspected == []


def test_check_no_deploy_dir(no_canary):
    assert _dc.CredentialsCheck().lines(context(None, FakeAPI())) == []


@pytest.mark.parametrize('make, words', [
    (lambda folder: (folder / _credentials.FILE_NAME).write_text('{"version": 1, "credentials": [}'), []),
    (lambda folder: (folder / _credentials.FILE_NAME).write_text('{"version": 2, "credentials": []}'),
     ['"version"']),
    (lambda folder: (folder / _credentials.FILE_NAME).write_text(json.dumps({'version': 1, 'credentials': [
        dict(name='anthropic', host='*.anthropic.com', port=443, env='ANTHROPIC_API_KEY', scheme='header',
             header='x-api-key', secret_file='/etc/pi-dispatch/secrets/anthropic')]})), ['wildcard', 'anthropic']),
    (lambda folder: (folder / _credentials.FILE_NAME).write_text(json.dumps({'version': 1, 'credentials': [
        dict(name='anthropic', host='api.anthropic.com', port=443, env='ANTHROPIC_API_KEY', scheme='header',
             secret_file='/etc/pi-dispatch/secrets/anthropic')]})), ['"header"', 'is required']),
    (lambda folder: (folder / _credentials.FILE_NAME).symlink_to(folder / 'nowhere.json'), ['symlink']),
    (lambda folder: (folder / _credentials.FILE_NAME).mkdir(), ['not a regular file']),
], ids=['malformed-json', 'other-version', 'wildcard-host', 'header-missing', 'dangling-symlink', 'a-folder'])
def test_check_declaration_refused(tmp_path, no_canary, make, words):
    make(tmp_path)
    api = FakeAPI({INTERCEPTOR: RUNNING})
    lines = _dc.CredentialsCheck().lines(context(tmp_path, api))
    path = str(tmp_path / _credentials.FILE_NAME)
    assert summary(lines) == [('credentials.declaration_refused', 'fail')]
    assert path in lines[0].message and path in lines[0].fix
    assert '\n' not in lines[0].message
    for word in words:
        assert word in lines[0].message
    assert api.inspected == []


# (id, interceptor's inspect or None, proxy's inspect, check mode, lines, the setup line's reason)
STATE_CASES = [
    ('interceptor-missing', None, RUNNING, False,
     [('credentials.interceptor_missing', 'fail'), ('credentials.setup', 'notrun')], 'the interceptor is not running'),
    ('interceptor-exited', EXITED, RUNNING, False,
     [('credentials.interceptor_stopped', 'fail'), ('credentials.setup', 'notrun')], 'the interceptor is not running'),
    ('interceptor-paused', PAUSED, RUNNING, False,
     [('credentials.interceptor_stopped', 'fail'), ('credentials.setup', 'notrun')], 'the interceptor is not running'),
    ('interceptor-no-state', {}, RUNNING, False,
     [('credentials.interceptor_stopped', 'fail'), ('credentials.setup', 'notrun')], 'the interceptor is not running'),
    ('proxy-stopped', RUNNING, EXITED, False,
     [('credentials.interceptor', 'ok'), ('credentials.setup', 'notrun')], 'the proxy is not running'),
    ('proxy-missing', RUNNING, None, False,
     [('credentials.interceptor', 'ok'), ('credentials.setup', 'notrun')], 'the proxy is not running'),
    ('proxy-paused', RUNNING, PAUSED, False,
     [('credentials.interceptor', 'ok'), ('credentials.setup', 'notrun')], 'the proxy is not running'),
    ('check-mode', RUNNING, RUNNING, True,
     [('credentials.interceptor', 'ok'), ('credentials.setup', 'notrun')], 'check mode creates nothing'),
    ('check-mode-before-proxy', None, None, True,
     [('credentials.interceptor_missing', 'fail'), ('credentials.setup', 'notrun')], 'check mode creates nothing'),
    ('proxy-before-interceptor', None, EXITED, False,
     [('credentials.interceptor_missing', 'fail'), ('credentials.setup', 'notrun')], 'the proxy is not running'),
]


@pytest.mark.parametrize('interceptor, proxy, check_mode, expected, why', [case[1:] for case in STATE_CASES],
                         ids=[case[0] for case in STATE_CASES])
def test_check_interceptor_and_setup(tmp_path, no_canary, interceptor, proxy, check_mode, expected, why):
    declare(tmp_path)
    api = FakeAPI({} if interceptor is None else {INTERCEPTOR: interceptor})
    lines = _dc.CredentialsCheck().lines(context(tmp_path, api, proxy=proxy, check_mode=check_mode))
    assert summary(lines) == expected
    assert api.inspected == [INTERCEPTOR]
    assert INTERCEPTOR in lines[0].message
    if lines[0].status == 'ok':
        assert '2 credentials bound: anthropic on api.anthropic.com, forge on api.github.com' in lines[0].message
    elif interceptor is None:
        assert lines[0].fix == 'run site.yml (the proxy role runs the interceptor)'
    else:
        assert lines[0].fix == 'docker start %s' % INTERCEPTOR
        assert '(%s is %s)' % (INTERCEPTOR, interceptor.get('State', {}).get('Status', 'not running')) \
            in lines[0].message
    assert lines[-1].message == 'Credential canary could not be set up (%s), so no probe ran' % why
    assert_no_secret(lines)


def test_check_named_interceptor(tmp_path, no_canary):
    declare(tmp_path)
    api = FakeAPI({'my-interceptor': RUNNING})
    lines = _dc.CredentialsCheck().lines(context(tmp_path, api, check_mode=True, interceptor='my-interceptor'))
    assert summary(lines) == [('credentials.interceptor', 'ok'), ('credentials.setup', 'notrun')]
    assert api.inspected == ['my-interceptor']
    assert 'my-interceptor' in lines[0].message


def test_check_interceptor_unread(tmp_path, no_canary):
    declare(tmp_path)
    api = FakeAPI(error='permission denied on the socket')
    lines = _dc.CredentialsCheck().lines(context(tmp_path, api))
    assert summary(lines) == [('credentials.interceptor_unread', 'warn'), ('credentials.setup', 'notrun')]
    assert 'permission denied on the socket' in lines[0].message
    assert lines[-1].message == ('Credential canary could not be set up (the interceptor is not running), '
                                 'so no probe ran')


# (id, secret file mode, write it, words of the rule)
SECRET_CASES = [
    ('mode-0644', 0o644, True, 'open to group or others (mode 0644)'),
    ('mode-0640', 0o640, True, 'open to group or others (mode 0640)'),
    ('mode-0604', 0o604, True, 'open to group or others (mode 0604)'),
    ('missing', 0o600, False, 'does not exist'),
]


@pytest.mark.parametrize('proxy, check_mode, why', [
    (RUNNING, False, 'a secret cannot be used, so the job-network API refuses the job'),
    (EXITED, False, 'the proxy is not running'),
    (RUNNING, True, 'check mode creates nothing'),
], ids=['running', 'proxy-stopped', 'check-mode'])
@pytest.mark.parametrize('mode, write, rule', [case[1:] for case in SECRET_CASES], ids=[c[0] for c in SECRET_CASES])
def test_check_secret_unusable(tmp_path, no_canary, mode, write, rule, proxy, check_mode, why):
    secret_file = declare(tmp_path, secret_mode=mode, write_secret=write)
    api = FakeAPI({INTERCEPTOR: RUNNING})
    lines = _dc.CredentialsCheck().lines(context(tmp_path, api, proxy=proxy, check_mode=check_mode))
    assert summary(lines) == [('credentials.interceptor', 'ok'), ('credentials.secret_unusable', 'fail'),
                              ('credentials.setup', 'notrun')]
    unusable = lines[1]
    assert '"anthropic"' in unusable.message and 'forge' not in unusable.message
    assert secret_file in unusable.message and rule in unusable.message
    assert secret_file in unusable.fix and 'mode 0600' in unusable.fix
    assert lines[-1].message == 'Credential canary could not be set up (%s), so no probe ran' % why
    assert_no_secret(lines)
    if write:
        assert stat.S_IMODE(os.stat(secret_file).st_mode) == mode  # the doctor changes nothing


def test_check_secret_holds_a_placeholder(tmp_path, no_canary):
    secret_file = declare(tmp_path, secret=placeholder(ANTHROPIC))
    lines = _dc.CredentialsCheck().lines(context(tmp_path, FakeAPI({INTERCEPTOR: RUNNING})))
    assert summary(lines) == [('credentials.interceptor', 'ok'), ('credentials.secret_unusable', 'fail'),
                              ('credentials.setup', 'notrun')]
    assert secret_file in lines[1].message and 'holds a placeholder' in lines[1].message
    assert placeholder(ANTHROPIC) not in json.dumps([line.as_dict() for line in lines])


def test_check_all_usable_reaches_the_canary_only_then(tmp_path, monkeypatch, no_canary):
    """With everything in place the check hands over to the canary (stubbed here: it needs a daemon)."""
    declare(tmp_path)
    seen = []

    def canary(ctx, creds, interceptor):
        seen.append(([c.name for c in creds], interceptor))
        return [Line('credentials.setup', 'notrun', 'Credential canary could not be set up (stub), so no probe ran')]
    monkeypatch.setattr(_dc.CredentialsCheck, 'canary', staticmethod(canary))
    lines = _dc.CredentialsCheck().lines(context(tmp_path, FakeAPI({INTERCEPTOR: RUNNING})))
    assert summary(lines) == [('credentials.interceptor', 'ok'), ('credentials.setup', 'notrun')]
    assert seen == [(['anthropic', 'forge'], INTERCEPTOR)]
