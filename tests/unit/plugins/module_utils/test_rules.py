"""Structure of the packaged squid rules: what is there and in which order."""

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import rules as _rules


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
        'http_access deny manager pi_r_manager',
        'http_access deny pi_ipv6_client !localhost pi_r_ipv6_client',
        'http_access deny CONNECT !pi_authority pi_r_authority',
        'http_access deny pi_client_conns pi_r_conn_limit',
        'include /etc/pi-dispatch/model-endpoints.conf',
        'http_access deny pi_allowlist pi_guard pi_r_guard',
        'http_access allow CONNECT pi_port_443 pi_allowlist pi_r_listed pi_r_checked',
        'http_access allow !CONNECT pi_port_80 pi_allowlist pi_r_listed',
        'http_access deny !CONNECT pi_port_443 pi_allowlist pi_r_plain_https',
        'http_access deny pi_allowlist pi_r_port',
        'http_access deny all pi_r_unlisted',
    ]


def test_every_reason_acl_only_annotates_and_ends_its_line():
    # annotate_transaction always matches: placed last, it marks only the line that decided, and the
    # decision is the one the line had without it.
    acls = dict((w[1], w[2:]) for w in _directives() if w[0] == 'acl')
    reasons = [name for name, words in acls.items() if words[0] == 'annotate_transaction']
    assert sorted(reasons) == sorted(['pi_r_manager', 'pi_r_ipv6_client', 'pi_r_authority', 'pi_r_conn_limit',
                                      'pi_r_guard', 'pi_r_listed', 'pi_r_checked', 'pi_r_plain_https', 'pi_r_port',
                                      'pi_r_unlisted'])
    for words in _directives():
        if words[0] == 'http_access':
            marks = [i for i, w in enumerate(words) if w in reasons]
            assert marks and marks[0] >= 3 and all(words[i] in reasons for i in range(marks[0], len(words))) \
                or words[1:] == ['allow', 'localhost', 'manager'], words


# Issue 42, item 12: what squid 6.13 leaves of a CONNECT authority after its own parse (measured on the
# engine: h:0443, h:443:1, h: and h become h:443; [[h]]:1337 becomes %5bh:443, u@h:443 stays u@h:443).
AUTHORITY_OK = ['api.provider.test:443', 'API.Provider.Test:443', 'h:1', 'h:65535', 'localhost:443',
                'xn--bcher-kva.test:443', '1.2.3.4:443', '10.0.0.5:8080', '[::1]:443', '[fd00:ec2::254]:11434',
                '[::ffff:1.2.3.4]:443', 'a-b.c-d.test:443', '0.test:443']
AUTHORITY_BAD = ['%5bh:443', '[h:443', 'u@h:443', 'u:p@h:443', 'h_x:443', '-h:443', 'h-:443', 'a.-b.test:443',
                 '%5bfe80::1%25eth0%5d:443', '[fe80::1%eth0]:443', 'h:0', 'h:0443', 'h:', 'h', ':443',
                 'h:443:1', 'h..x:443', '.h:443', 'h.:443', '[[h]]:1337', 'h:443/x', 'h:+443', 'h :443',
                 'h%2e:443', '[h]:443x', '[]:443', 'http://h:443']


def _authority_regexes():
    import re
    lines = [w for w in _directives() if w[:3] == ['acl', 'pi_authority', 'url_regex']]
    assert lines and all(w[3] == '-i' and len(w) == 5 for w in lines), lines
    return [re.compile(w[4], re.IGNORECASE) for w in lines]


def test_a_connect_authority_is_refused_before_any_policy_unless_it_is_name_port_or_v6_port():
    regexes = _authority_regexes()
    for text in AUTHORITY_OK:
        assert any(r.search(text) for r in regexes), text
    for text in AUTHORITY_BAD:
        assert not any(r.search(text) for r in regexes), text
    rules = _access_rules()
    assert rules.index('http_access deny CONNECT !pi_authority pi_r_authority') == \
        rules.index('http_access deny manager pi_r_manager') + 2


def test_a_client_from_an_ipv6_address_is_refused_first_but_the_containers_own_loopback():
    # squid 6.13 (measured): "src ipv6" matches IPv6 clients only (fd00::/8, fe80::), never an IPv4
    # client on the dual-stack socket; "src 0.0.0.0/0" would match every client
    acls = dict((w[1], w[2:]) for w in _directives() if w[0] == 'acl')
    assert acls['pi_ipv6_client'] == ['src', 'ipv6']
    rules = _access_rules()
    assert rules.index('http_access deny pi_ipv6_client !localhost pi_r_ipv6_client') == \
        rules.index('http_access deny manager pi_r_manager') + 1


def test_the_decision_log_skips_what_the_tls_check_logs_and_the_health_check():
    d = [' '.join(w) for w in _directives()]
    assert 'logfile_daemon /usr/lib/pi-dispatch/decision-logd' in d
    assert ('access_log daemon:/var/log/pi-dispatch/decisions.jsonl logformat=pi_decision !pi_logged_by_check '
            '!pi_health') in d
    assert 'acl pi_logged_by_check all-of pi_stage_checked pi_status_200' in d
    # the job's own X-Pi-Client is dropped before squid adds the real one, on tunnels to 443 only
    assert d.index('request_header_access X-Pi-Client deny all') < d.index(
        'request_header_add X-Pi-Client "%>a" CONNECT pi_port_443')
    fmt = [w for w in _directives() if w[:2] == ['logformat', 'pi_decision']][0]
    # never the URL (its path and query) or a header value: host, port and method only
    assert not [w for w in fmt if w in ('%ru', '%>ru', '%rp', '%>rp') or w.endswith('>h')], fmt


def test_allowlist_is_matched_as_written_from_the_mounted_file():
    acls = dict((w[1], w[2:]) for w in _directives() if w[0] == 'acl')
    assert acls['pi_allowlist'] == ['dstdomain', '-n', '"/etc/pi-dispatch/egress-allowlist.conf"']
    assert acls['pi_port_443'] == ['port', '443'] and acls['pi_port_80'] == ['port', '80']
    assert acls['CONNECT'] == ['method', 'CONNECT']


def test_guard_is_tested_after_the_allowlist_so_unlisted_names_are_never_resolved():
    guard = [w for w in _directives() if w[:2] == ['http_access', 'deny'] and 'pi_guard' in w]
    assert guard == [['http_access', 'deny', 'pi_allowlist', 'pi_guard', 'pi_r_guard']]


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


def test_writes_decision_log_only_for_rules_that_hand_decisions_to_the_log_folder():
    assert _rules.writes_decision_log(_rules.packaged_rules())
    assert not _rules.writes_decision_log('access_log stdio:/dev/stdout\n')
    assert not _rules.writes_decision_log('# access_log daemon:/var/log/pi-dispatch/decisions.jsonl\n')
    assert _rules.writes_decision_log('access_log daemon:/var/log/pi-dispatch/x.jsonl logformat=y\n')


def test_the_tls_name_checks_port_is_the_same_in_the_rules_and_the_image():
    """rules.PEEK_PORT, peek.conf's http_port and the entrypoint's /proc/net/tcp wait name one port."""
    import os
    import re
    files = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..', 'roles', 'proxy', 'files')
    with open(os.path.join(files, 'peek.conf')) as handle:
        ports = re.findall(r'^http_port 127\.0\.0\.1:(\d+) ', handle.read(), re.M)
    with open(os.path.join(files, 'entrypoint')) as handle:
        listens = set(re.findall(r"grep -q ' (0100007F:[0-9A-F]{4}) ", handle.read()))
    assert ports == [str(_rules.PEEK_PORT)]
    assert listens == {'0100007F:%04X' % _rules.PEEK_PORT}
    assert 'cache_peer 127.0.0.1 parent %d ' % _rules.PEEK_PORT in _rules.packaged_rules()
    assert _rules.checks_tls_names(_rules.packaged_rules())
