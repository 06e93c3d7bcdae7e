"""The openshell venue's translation (_openshell/translate.py): a table of entries, what each becomes, what is refused.

Every rendered policy is parsed by OpenShell's own SandboxPolicy message (the pinned ``openshell`` package), with
unknown fields refused, and its endpoints are read back from that message.
"""

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import readback as _readback
from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import schema as _schema
from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import translate as _translate
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import allowlist as _allowlist
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import endpoints as _endpoints

needs_schema = pytest.mark.skipif(not _schema.available(), reason='the openshell package (%s) is not installed'
                                  % _schema.REQUIREMENT)

PATH = '/d/egress-allowlist.conf'
EP_PATH = '/d/model-endpoints.json'

# The seed's allowlist (docs/egress.md of the dispatcher, "The hosts, and they are yours") and its endpoint.
SEED_ALLOWLIST = ('api.anthropic.com          # the provider: every turn of every job\n'
                  '.github.com                # your forge: the push and the pull request\n'
                  "registry.npmjs.org         # only when a job installs the serviced repo's own dependencies\n")
SEED_ENDPOINT = dict(id='mac-ollama', host='host.docker.internal', port=11434, slots=2, keyless=True)


def both(*hosts):
    """host:443 and host:80 for each host, as a listed host gets them."""
    return [(h, p) for h in hosts for p in (443, 80)]


def merged(*parts):
    out = {}
    for part in parts:
        out.update(part)
    return out


def _endpoints_of(items):
    return _endpoints.from_items(items) if items else []


def _render(text, items=(), opened=None, plain_http=True):
    allowlist = _allowlist.parse(text, PATH, opened=opened) if text is not None else None
    assert allowlist is None or allowlist.ok, [str(e) for e in allowlist.errors]
    return _translate.translate(allowlist, _endpoints_of(list(items)), opened=opened, plain_http=plain_http,
                                endpoints_path=EP_PATH)


def _admitted(policy):
    """{(host, port): allowed_ips} of a policy, read from the SandboxPolicy message it parses into."""
    message = _schema.parse(policy, 'the rendered policy')
    out = {}
    for rule in message.network_policies.values():
        assert [b.path for b in rule.binaries] == ['/**']
        for endpoint in rule.endpoints:
            assert endpoint.protocol == 'rest'
            assert endpoint.enforcement == _schema.sandbox_pb2.NETWORK_ENFORCEMENT_MODE_ENFORCE
            assert endpoint.access == _schema.sandbox_pb2.NETWORK_ACCESS_PRESET_FULL
            out[(endpoint.host, endpoint.port)] = list(endpoint.allowed_ips)
    return out


E_VLLM = dict(id='lan-vllm', host='192.168.1.20', port=8000, slots=4)

# (case, allowlist text, model endpoints, opened ranges, plain_http, {(host, port): allowed_ips})
TABLE = [
    ('seed: the provider', 'api.anthropic.com          # the provider\n', (), None, True,
     dict.fromkeys(both('api.anthropic.com'), [])),
    ('seed: the forge, a leading dot', '.github.com\n', (), None, True,
     dict.fromkeys(both('github.com', '**.github.com'), [])),
    ('seed: the registry', 'registry.npmjs.org\n', (), None, True, dict.fromkeys(both('registry.npmjs.org'), [])),
    ('seed: the model endpoint', None, [SEED_ENDPOINT], None, True, {('host.docker.internal', 11434): []}),
    ('seed: allowlist and endpoint together', SEED_ALLOWLIST, [SEED_ENDPOINT], None, True,
     merged(dict.fromkeys(both('api.anthropic.com', 'github.com', '**.github.com', 'registry.npmjs.org'), []),
            {('host.docker.internal', 11434): []})),
    ('a name in capitals is lowercased', 'API.Anthropic.COM\n', (), None, True,
     dict.fromkeys(both('api.anthropic.com'), [])),
    ('a two-label name', 'a.b\n', (), None, True, dict.fromkeys(both('a.b'), [])),
    ('a hyphenated name', 'x-y.example.org\n', (), None, True, dict.fromkeys(both('x-y.example.org'), [])),
    ('a punycode name', 'xn--bcher-kva.example\n', (), None, True,
     dict.fromkeys(both('xn--bcher-kva.example'), [])),
    ('a label starting with a digit', '1password.com\n', (), None, True, dict.fromkeys(both('1password.com'), [])),
    ('an indented line with a trailing note', '\tapi.provider.test   # note\n', (), None, True,
     dict.fromkeys(both('api.provider.test'), [])),
    ('a leading dot below a two-label suffix', '.example.co.uk\n', (), None, True,
     dict.fromkeys(both('example.co.uk', '**.example.co.uk'), [])),
    ('a leading dot below a private suffix', '.user.github.io\n', (), None, True,
     dict.fromkeys(both('user.github.io', '**.user.github.io'), [])),
    ('a deep leading-dot entry', '.a.b.c.example.com\n', (), None, True,
     dict.fromkeys(both('a.b.c.example.com', '**.a.b.c.example.com'), [])),
    ('a leading dot under an unlisted TLD', '.forge.test\n', (), None, True,
     dict.fromkeys(both('forge.test', '**.forge.test'), [])),
    ('a leading dot over a metadata name is still a domain', '.google.internal\n', (), None, True,
     dict.fromkeys(both('google.internal', '**.google.internal'), [])),
    ('a name that reaches the host (squid admits it, with a warning)', 'host.docker.internal\n', (), None, True,
     dict.fromkeys(both('host.docker.internal'), [])),
    ('a public IPv4 literal', '93.184.216.34\n', (), None, True, dict.fromkeys(both('93.184.216.34'), [])),
    ('a private IPv4 literal in an opened range', '10.1.2.3\n', (), ['10.0.0.0/8'], True,
     dict.fromkeys(both('10.1.2.3'), ['10.1.2.3'])),
    ('another opened range', '192.168.5.5\n', (), ['192.168.0.0/16'], True,
     dict.fromkeys(both('192.168.5.5'), ['192.168.5.5'])),
    ('plain_http off: 443 only', 'api.anthropic.com\n', (), None, False, {('api.anthropic.com', 443): []}),
    ('plain_http off: a leading dot, 443 only', '.github.com\n', (), None, False,
     {('github.com', 443): [], ('**.github.com', 443): []}),
    ('plain_http off: an endpoint keeps its port', None, [SEED_ENDPOINT], None, False,
     {('host.docker.internal', 11434): []}),
    ('a LAN model server (RFC 1918): allowed_ips is exactly it', None, [E_VLLM], None, True,
     {('192.168.1.20', 8000): ['192.168.1.20']}),
    ('a CGNAT model server', None, [dict(id='cg', host='100.64.1.1', port=8080, slots=1)], None, True,
     {('100.64.1.1', 8080): ['100.64.1.1']}),
    ('a public model server address', None, [dict(id='pub', host='93.184.216.34', port=8443, slots=1)], None,
     True, {('93.184.216.34', 8443): []}),
    ('rootless Podman\'s host name', None, [dict(id='pod', host='host.containers.internal', port=11434, slots=1)],
     None, True, {('host.containers.internal', 11434): []}),
    ('a model server by LAN name', None, [dict(id='lan', host='llama.lan.example', port=8080, slots=2)], None, True,
     {('llama.lan.example', 8080): []}),
    ('an endpoint on 443 of a listed host adds nothing new', 'api.example.com\n',
     [dict(id='api', host='api.example.com', port=443, slots=1)], None, True,
     dict.fromkeys(both('api.example.com'), [])),
    ('an endpoint on another port of a listed host adds that port only', 'api.example.com\n',
     [dict(id='api', host='api.example.com', port=8443, slots=1)], None, True,
     merged(dict.fromkeys(both('api.example.com'), []), {('api.example.com', 8443): []})),
    ('nothing listed, nothing declared: a policy that admits nothing', '# none\n', (), None, True, {}),
    ('no allowlist file at all', None, (), None, True, {}),
    ('a name covered by a wildcard is carried by the wildcard', '.github.com\napi.github.com\n', (), None, True,
     dict.fromkeys(both('github.com', '**.github.com'), [])),
    ('two endpoints, sorted by id', None, [E_VLLM, SEED_ENDPOINT], None, True,
     {('192.168.1.20', 8000): ['192.168.1.20'], ('host.docker.internal', 11434): []}),
]


@needs_schema
@pytest.mark.parametrize('case, text, items, opened, plain_http, expected', TABLE, ids=[c[0] for c in TABLE])
def test_translation_table(case, text, items, opened, plain_http, expected):
    translation = _render(text, items, opened, plain_http)
    assert _admitted(translation.policy) == expected, case
    # the file round-trips through the same message
    for fmt in ('yaml', 'json'):
        again = _readback.loads(_readback.dumps(translation.policy, fmt), 'policy.' + fmt)
        assert _readback.compare(_schema.parse(translation.policy, 'a'), _schema.parse(again, 'b')) == []


def test_the_table_is_at_least_thirty_cases():
    assert len(TABLE) >= 30


def test_the_seed_renders_one_rule_per_line_and_endpoint_in_order():
    translation = _render(SEED_ALLOWLIST, [SEED_ENDPOINT])
    assert list(translation.policy['network_policies']) == [
        'allowlist_host_api_anthropic_com', 'allowlist_domain_github_com', 'allowlist_host_registry_npmjs_org',
        'model_endpoint_mac-ollama']
    origins = translation.origins()
    assert origins[1] == dict(rule='allowlist_domain_github_com', source='allowlist', where=PATH + ':2',
                              entry='.github.com', endpoints=['github.com:443', 'github.com:80',
                                                              '**.github.com:443', '**.github.com:80'])
    assert origins[3]['where'] == EP_PATH + ': endpoint mac-ollama'
    assert origins[3]['entry'] == 'host.docker.internal:11434'
    assert translation.skipped == []
    assert translation.limits == [_translate.LIMIT_READ, _translate.LIMIT_PORT_80, _translate.LIMIT_PRIVATE]


def test_the_wildcard_is_never_the_one_label_star():
    hosts = [e['host'] for rule in _render('.github.com\n').policy['network_policies'].values()
             for e in rule['endpoints']]
    assert '*.github.com' not in hosts and '**.github.com' in hosts and 'github.com' in hosts


# ---------------------------------------------------------------- skipped: squid matches nothing for them

SKIPS = [
    ('127.0.0.1\n', None, '127.0.0.1', 'always refuses (127.0.0.0/8'),
    ('169.254.169.254\n', None, '169.254.169.254', 'always refuses (169.254.0.0/16'),
    ('100.100.100.200\n', None, '100.100.100.200', 'always refuses (100.100.100.200/32'),
    ('10.47.0.9\n', ['10.0.0.0/8'], '10.47.0.9', 'the job-network pool'),
    ('10.1.2.3\n', None, '10.1.2.3', 'non-public range 10.0.0.0/8'),
    ('192.168.5.5\n', ['10.0.0.0/8'], '192.168.5.5', 'non-public range 192.168.0.0/16'),
    ('metadata.google.internal\n', None, 'metadata.google.internal', 'cloud metadata service'),
    ('.github.com\napi.github.com\n', None, 'api.github.com', 'already covered by .github.com on line 1'),
    ('.github.com\n.api.github.com\n', None, '.api.github.com', 'already covered by .github.com on line 1'),
    ('x.api.github.com\n.github.com\n', None, 'x.api.github.com', 'already covered by .github.com on line 2'),
]


@pytest.mark.parametrize('text, opened, entry, words', SKIPS, ids=[s[2] + ' ' + s[3] for s in SKIPS])
def test_an_entry_squid_matches_nothing_for_is_skipped_and_reported(text, opened, entry, words):
    translation = _render(text, opened=opened)
    assert [s.entry for s in translation.skipped] == [entry]
    skip = translation.skipped[0]
    assert words in skip.reason
    assert str(skip).startswith('%s: %s:' % (_translate.SKIPPED, PATH))
    assert all(o['entry'] != entry for o in translation.origins())


# ---------------------------------------------------------------- refused: openshell-egress-untranslatable

def _hand_made(*entries):
    """An Allowlist whose entries did not come through parse() (what translate must still refuse)."""
    allowlist = _allowlist.Allowlist(PATH)
    allowlist.entries = list(enumerate(entries, start=1))
    return allowlist


class _Endpoint(object):
    """An endpoint that bypassed the declaration's own checks."""

    def __init__(self, ident, host, port, kind):
        self.id, self.host, self.port, self.kind = ident, host, port, kind
        self.address = '[%s]:%d' % (host, port) if kind == 'ipv6' else '%s:%d' % (host, port)


REFUSALS = [
    ('a one-label wildcard', _hand_made('.com'), (), '.com', 'one-label name com', 'list the exact host'),
    ('a public-suffix wildcard', _hand_made('.co.uk'), (), '.co.uk', 'whole public suffix co.uk', 'your own domain'),
    ('a private public-suffix wildcard', _hand_made('.github.io'), (), '.github.io', 'public suffix github.io',
     'list the exact host'),
    ('a one-label name', _hand_made('localhost'), (), 'localhost', 'one-label name localhost', 'list the exact host'),
    ('a star wildcard', _hand_made('*.example.com'), (), '*.example.com', 'contains a wildcard', 'leading dot'),
    ('a dot before an address', _hand_made('.1.2.3.4'), (), '.1.2.3.4', 'leading dot before an IP address',
     'without the dot'),
    ('an IPv6 model endpoint', None, _endpoints.from_items([dict(id='v6', host='fd00::5', port=8000, slots=1)]),
     '[fd00::5]:8000', 'IPv6 literal', 'DNS name'),
    ('a link-local model endpoint', None,
     _endpoints.from_items([dict(id='ll', host='169.254.1.2', port=11434, slots=1)]), '169.254.1.2:11434',
     '169.254.0.0/16 (link-local), which OpenShell always refuses', 'listens on'),
    ('an unspecified-range model endpoint', None,
     _endpoints.from_items([dict(id='zero', host='0.1.2.3', port=8000, slots=1)]), '0.1.2.3:8000',
     'OpenShell always refuses', 'listens on'),
    ('a model endpoint in the job pool', None,
     _endpoints.from_items([dict(id='pool', host='10.47.1.2', port=8000, slots=1)]), '10.47.1.2:8000',
     'job-network pool 10.47.0.0/16', 'listens on'),
    ('a loopback endpoint that bypassed the declaration', None, [_Endpoint('lo', '127.0.0.1', 8000, 'ipv4')],
     '127.0.0.1:8000', '127.0.0.0/8 (loopback)', 'listens on'),
]


@pytest.mark.parametrize('case, allowlist, eps, entry, reason, fix', REFUSALS, ids=[r[0] for r in REFUSALS])
def test_an_entry_that_cannot_be_expressed_without_widening_is_refused(case, allowlist, eps, entry, reason, fix):
    with pytest.raises(_translate.Untranslatable) as err:
        _translate.translate(allowlist, eps, endpoints_path=EP_PATH)
    [refusal] = err.value.refusals
    assert refusal.entry == entry
    assert reason in refusal.reason, refusal.reason
    assert fix in refusal.fix, refusal.fix
    assert str(err.value).startswith(_translate.UNTRANSLATABLE + ': 1 entry cannot be expressed')
    assert 'nothing was rendered or written' in str(err.value)
    assert str(refusal).startswith('%s: %s' % (_translate.UNTRANSLATABLE, PATH if allowlist else EP_PATH))


def test_every_refused_entry_is_named_at_once():
    eps = _endpoints.from_items([dict(id='v6', host='fd00::5', port=8000, slots=1)])
    with pytest.raises(_translate.Untranslatable) as err:
        _translate.translate(_hand_made('api.anthropic.com', '.com', '.co.uk'), eps, endpoints_path=EP_PATH)
    assert [(r.where, r.entry) for r in err.value.refusals] == [
        (PATH + ':2', '.com'), (PATH + ':3', '.co.uk'), (EP_PATH + ': endpoint v6', '[fd00::5]:8000')]
    assert '3 entries cannot be expressed' in str(err.value)
    assert all(r.as_dict()['code'] == _translate.UNTRANSLATABLE for r in err.value.refusals)


def test_a_missing_public_suffix_list_refuses_a_wildcard(monkeypatch):
    monkeypatch.setattr(_allowlist, 'publicsuffixlist', None)
    monkeypatch.setattr(_allowlist, '_PSL', [])
    with pytest.raises(_translate.Untranslatable) as err:
        _translate.translate(_hand_made('.example.com'))
    assert 'pip install publicsuffixlist' in err.value.refusals[0].fix


# ---------------------------------------------------------------- keys, binaries

@pytest.mark.parametrize('source, entry, key', [
    ('allowlist', 'api.anthropic.com', 'allowlist_host_api_anthropic_com'),
    ('allowlist', '.github.com', 'allowlist_domain_github_com'),
    ('allowlist', 'x-y.example.org', 'allowlist_host_x-y_example_org'),
    ('allowlist', '93.184.216.34', 'allowlist_ip_93_184_216_34'),
    ('endpoint', 'mac-ollama', 'model_endpoint_mac-ollama'),
])
def test_rule_keys(source, entry, key):
    assert _translate.rule_key(source, entry) == key


@pytest.mark.parametrize('value, words', [
    ([], 'non-empty list'),
    ('/**', 'non-empty list'),
    (['usr/bin/node'], "'usr/bin/node' is not an absolute executable path"),
    (['/usr/bin/no de'], 'is not an absolute executable path'),
    ([7], 'is not an absolute executable path'),
])
def test_bad_binaries_are_refused_naming_the_option(value, words):
    with pytest.raises(ValueError) as err:
        _translate.check_binaries(value)
    assert words in str(err.value) and str(err.value).startswith('binaries')


@needs_schema
def test_narrower_binaries_are_rendered_on_every_rule():
    binaries = _translate.check_binaries(['/usr/bin/node', '/usr/bin/git', '/usr/bin/node'])
    translation = _translate.translate(_allowlist.parse('api.anthropic.com\n', PATH), binaries=binaries)
    message = _schema.parse(translation.policy, 'x')
    assert [b.path for r in message.network_policies.values() for b in r.binaries] == ['/usr/bin/node', '/usr/bin/git']


def test_docs_openshell_md_shows_what_the_seed_renders():
    import os
    import re
    root = os.path.dirname(os.path.abspath(__file__))
    for _level in range(4):
        root = os.path.dirname(root)
    with open(os.path.join(root, 'docs', 'openshell.md')) as handle:
        page = handle.read()
    shown = re.search(r'<!-- rendered-seed-policy -->\n```yaml\n(.*?)```\n', page, re.S).group(1)
    assert shown == _readback.dumps(_render(SEED_ALLOWLIST, [SEED_ENDPOINT]).policy, 'yaml')
    # the page's translation table names what the code does
    for words in ('`github.com` and `**.github.com`, each on 443 and 80', 'openshell-egress-untranslatable',
                  'openshell_policy_skipped', 'openshell-policy-readback-differs', 'pip install openshell==0.1.5'):
        assert words in page, words
