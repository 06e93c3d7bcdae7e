"""Structure of the packaged squid rules: what is there and in which order."""

from ansible_collections.pi_dispatch.egress.plugins.module_utils import _rules


def _directives():
    out = []
    for line in _rules.packaged_rules().splitlines():
        line = line.strip()
        if line and not line.startswith('#'):
            out.append(line.split())
    return out


def _access_rules():
    return [' '.join(words) for words in _directives() if words[0] in ('http_access', 'include')]


def test_precedence_is_exactly_the_contract():
    assert _access_rules() == [
        'include /etc/pi-dispatch/egress-guard.conf',
        'http_access allow localhost manager',
        'http_access deny manager',
        'http_access deny pi_client_conns',
        'include /etc/pi-dispatch/model-endpoints.conf',
        'http_access deny pi_allowlist pi_guard',
        'http_access allow CONNECT pi_port_443 pi_allowlist',
        'http_access allow !CONNECT pi_port_80 pi_allowlist',
        'http_access deny all',
    ]


def test_allowlist_is_matched_as_written_from_the_mounted_file():
    acls = dict((w[1], w[2:]) for w in _directives() if w[0] == 'acl')
    assert acls['pi_allowlist'] == ['dstdomain', '-n', '"/etc/pi-dispatch/egress-allowlist.conf"']
    assert acls['pi_port_443'] == ['port', '443'] and acls['pi_port_80'] == ['port', '80']
    assert acls['CONNECT'] == ['method', 'CONNECT']


def test_guard_is_tested_after_the_allowlist_so_unlisted_names_are_never_resolved():
    guard = [w for w in _directives() if w[:2] == ['http_access', 'deny'] and 'pi_guard' in w]
    assert guard == [['http_access', 'deny', 'pi_allowlist', 'pi_guard']]


def test_version_and_includes():
    assert _rules.RULES_VERSION == 3
    text = _rules.packaged_rules()
    assert _rules.included(text) == list(_rules.INCLUDES)
    assert _rules.includes_guard(text) and _rules.includes_endpoints(text)
    assert '(rules version 3)' in text


def test_every_tunnel_to_443_goes_through_the_tls_name_check_and_nothing_else_does():
    d = [' '.join(w) for w in _directives()]
    assert 'cache_peer 127.0.0.1 parent 3129 0 no-query no-digest no-netdb-exchange name=pi_tls_check' in d
    assert [x for x in d if x.startswith('cache_peer_access')] == [
        'cache_peer_access pi_tls_check allow CONNECT pi_port_443',
        'cache_peer_access pi_tls_check deny all']
    # never direct: a tunnel to 443 fails closed (503) when the check is not there, never goes around it
    direct = [x for x in d if x.startswith(('never_direct', 'always_direct'))]
    assert direct == ['never_direct allow CONNECT pi_port_443']
    assert _rules.checks_tls_names(_rules.packaged_rules())
    assert not _rules.checks_tls_names('http_port 3128\n# cache_peer 127.0.0.1 parent 3129\n')


def test_listen_cache_and_logs():
    d = [' '.join(w) for w in _directives()]
    assert 'http_port 3128' in d
    assert sum(1 for x in d if x.startswith('http_port')) == 1
    assert 'cache deny all' in d and 'cache_mem 0 MB' in d
    assert 'forwarded_for delete' in d
    assert 'access_log stdio:/dev/stdout' in d
    assert not any(x.startswith(('cache_dir', 'https_port', 'icp_port', 'htcp_port')) for x in d)
    # Nothing is written to the read-only image: pid and cores on tmpfs, no netdb state file.
    assert 'pid_filename /run/squid/squid.pid' in d and 'coredump_dir /tmp' in d
    assert 'netdb_filename none' in d


def test_includes_endpoints_detects_the_post_503_shape():
    assert _rules.includes_endpoints(_rules.packaged_rules())
    old = '\n'.join(line for line in _rules.packaged_rules().splitlines() if not line.startswith('include'))
    assert not _rules.includes_endpoints(old)
    assert not _rules.includes_endpoints('# include /etc/pi-dispatch/model-endpoints.conf\n')
    assert not _rules.includes_guard(old)


def test_digest_is_stable():
    assert _rules.digest('abc') == _rules.digest(b'abc')
    assert _rules.digest(_rules.packaged_rules()) != _rules.digest(_rules.packaged_rules() + ' ')
