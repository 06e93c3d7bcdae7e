"""One redaction for every doctor line and the JSON report: userinfo in URLs, secret query parameters."""

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import redact as _redact

CASES = [
    ('http://user:secret@models.test:8080/v1', 'http://***@models.test:8080/v1'),
    ('https://token@github.test/org/repo.git', 'https://***@github.test/org/repo.git'),
    ('baseUrl http://u:p%40ss@h.test/v1, and more', 'baseUrl http://***@h.test/v1, and more'),
    ('http://a:b@c@d.test/', 'http://***@d.test/'),
    ('HTTP://USER:PW@H.TEST:1/', 'HTTP://***@H.TEST:1/'),
    ('http://h.test/v1?api_key=s3cr3t&model=x', 'http://h.test/v1?api_key=***&model=x'),
    ('http://h.test/?key=abc', 'http://h.test/?key=***'),
    ('http://h.test/?x=1&token=abc#frag', 'http://h.test/?x=1&token=***#frag'),
    ('http://h.test/?access_token=abc;secret=def', 'http://h.test/?access_token=***;secret=***'),
    ('http://h.test/?password=hunter2&apikey=k&API_KEY=K', 'http://h.test/?password=***&apikey=***&API_KEY=***'),
    ('http://h.test/?client_secret=x&refresh_token=y', 'http://h.test/?client_secret=***&refresh_token=***'),
    ('http://user:pw@h.test/?token=t', 'http://***@h.test/?token=***'),
    ("has baseUrl 'http://u:p@127.0.0.1:1/v1'", "has baseUrl 'http://***@127.0.0.1:1/v1'"),
    # nothing to redact: left exactly as it is
    ('http://models.test:8080/v1', 'http://models.test:8080/v1'),
    ('mail me at someone@example.test', 'mail me at someone@example.test'),
    ('http://h.test/?model=x&keyless=', 'http://h.test/?model=x&keyless='),
    ('user:password@ in the baseUrl of the provider', 'user:password@ in the baseUrl of the provider'),
    ('', ''),
    (None, None),
]


@pytest.mark.parametrize('text, want', CASES)
def test_redact(text, want):
    assert _redact.redact(text) == want


@pytest.mark.parametrize('text, _want', CASES)
def test_redact_is_idempotent(text, _want):
    once = _redact.redact(text)
    assert _redact.redact(once) == once
