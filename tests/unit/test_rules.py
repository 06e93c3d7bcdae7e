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
        'http_access allow localhost manager',
        'http_access deny manager',
        'http_access deny pi_allowlist pi_this_host',
        'include /etc/pi-dispatch/model-endpoints.conf',
        'http_access allow CONNECT pi_port_443 pi_allowlist',
        'http_access allow !CONNECT pi_port_80 pi_allowlist',
        'http_access deny all',
    ]


def test_allowlist_is_matched_as_written_from_the_mounted_file():
    acls = dict((w[1], w[2:]) for w in _directives() if w[0] == 'acl')
    assert acls['pi_allowlist'] == ['dstdomain', '-n', '"/etc/pi-dispatch/egress-allowlist.conf"']
    assert acls['pi_port_443'] == ['port', '443'] and acls['pi_port_80'] == ['port', '80']
    assert acls['CONNECT'] == ['method', 'CONNECT']


def test_this_host_acl_covers_loopback_and_link_local():
    acls = dict((w[1], w[2:]) for w in _directives() if w[0] == 'acl')
    assert acls['pi_this_host'][0] == 'dst'
    assert set(acls['pi_this_host'][1:]) == {'127.0.0.0/8', '0.0.0.0/32', '169.254.0.0/16', '10.0.2.2/32',
                                             '::1', '::/128', 'fe80::/10'}


def test_listen_cache_and_logs():
    d = [' '.join(w) for w in _directives()]
    assert 'http_port 3128' in d
    assert sum(1 for x in d if x.startswith('http_port')) == 1
    assert 'cache deny all' in d and 'cache_mem 0 MB' in d
    assert 'forwarded_for delete' in d
    assert 'access_log stdio:/dev/stdout' in d
    assert not any(x.startswith(('cache_dir', 'https_port', 'icp_port', 'htcp_port')) for x in d)


def test_includes_endpoints_detects_the_post_503_shape():
    assert _rules.includes_endpoints(_rules.packaged_rules())
    old = '\n'.join(line for line in _rules.packaged_rules().splitlines() if not line.startswith('include'))
    assert not _rules.includes_endpoints(old)
    assert not _rules.includes_endpoints('# include /etc/pi-dispatch/model-endpoints.conf\n')


def test_digest_is_stable():
    assert _rules.digest('abc') == _rules.digest(b'abc')
    assert _rules.digest(_rules.packaged_rules()) != _rules.digest(_rules.packaged_rules() + ' ')
