"""model-endpoints.json contract and the rendered include (golden files)."""
import json
import os

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import endpoints as E
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import allowlist as _allowlist
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import hostnames as _hostnames

GOLDEN = os.path.join(os.path.dirname(__file__), 'golden', 'endpoints')


def ep(**kw):
    base = dict(id='ollama', host='host.docker.internal', port=11434, slots=2)
    base.update(kw)
    for key in [k for k, v in base.items() if v is Ellipsis]:
        del base[key]
    return base


def doc(*endpoints, **top):
    data = dict(version=1, endpoints=list(endpoints))
    data.update(top)
    for key in [k for k, v in data.items() if v is Ellipsis]:
        del data[key]
    return json.dumps(data)


VALID = [
    ('empty', doc(), []),
    ('name', doc(ep()), [('ollama', 'host.docker.internal', 'name')]),
    ('uppercase name lowered', doc(ep(host='Host.Docker.Internal')), [('ollama', 'host.docker.internal', 'name')]),
    ('single label', doc(ep(host='ollama')), [('ollama', 'ollama', 'name')]),
    ('ipv4', doc(ep(host='192.168.1.20')), [('ollama', '192.168.1.20', 'ipv4')]),
    ('link-local v4 allowed', doc(ep(host='169.254.1.2')), [('ollama', '169.254.1.2', 'ipv4')]),
    ('link-local v6 allowed', doc(ep(host='fe80::1')), [('ollama', 'fe80::1', 'ipv6')]),
    ('ipv6 canonicalised', doc(ep(host='2001:DB8:0:0::1')), [('ollama', '2001:db8::1', 'ipv6')]),
    ('10.0.2.3 is not slirp host', doc(ep(host='10.0.2.3')), [('ollama', '10.0.2.3', 'ipv4')]),
    ('name with digits first', doc(ep(host='1password.example')), [('ollama', '1password.example', 'name')]),
    ('253 chars', doc(ep(host='.'.join(['a' * 63] * 3) + '.' + 'b' * 61)), None),
    ('keyless true', doc(ep(keyless=True)), [('ollama', 'host.docker.internal', 'name')]),
    ('port 1 and slots 64', doc(ep(port=1, slots=64)), None),
    ('port 65535 slots 1', doc(ep(port=65535, slots=1)), None),
    ('same host other port', doc(ep(id='a'), ep(id='b', port=11435)), None),
    ('same port other host', doc(ep(id='a'), ep(id='b', host='host.containers.internal')), None),
    ('id 32 chars', doc(ep(id='a' * 32)), None),
    ('id with hyphens', doc(ep(id='-a-')), None),
]


@pytest.mark.parametrize('name,text,want', VALID, ids=[v[0] for v in VALID])
def test_valid(name, text, want):
    endpoints = E.parse(text)
    if want is not None:
        assert [(e.id, e.host, e.kind) for e in endpoints] == want
    assert [e.id for e in endpoints] == sorted(e.id for e in endpoints)


def test_keyless_default_false():
    assert E.parse(doc(ep()))[0].keyless is False
    assert E.parse(doc(ep(keyless=True)))[0].keyless is True


# (name, text, key, value-as-shown, words of the rule)
INVALID = [
    ('top not object', '[]', None, None, 'top level must be an object'),
    ('bad json', '{"version": 1,', None, None, 'not valid JSON'),
    ('comment', '{"version": 1, "endpoints": []} // x', None, None, 'not valid JSON'),
    ('duplicate key', '{"version": 1, "version": 1, "endpoints": []}', None, None, 'duplicate key'),
    ('bom', '\ufeff' + doc(), None, None, 'byte order mark'),
    ('NaN port', '{"version": 1, "endpoints": [{"id": "a", "host": "h.test", "port": NaN, "slots": 1}]}',
     None, None, 'not valid JSON'),
    ('unknown top key', doc(extra=1), 'extra', '1', 'is not a key of the declaration'),
    ('version missing', doc(version=Ellipsis), 'version', None, 'is required'),
    ('version string', doc(version='1'), 'version', '"1"', 'must be an integer'),
    ('version bool', doc(version=True), 'version', 'true', 'must be an integer'),
    ('version float', doc(version=1.0), 'version', '1.0', 'must be an integer'),
    ('version 0', doc(version=0), 'version', '0', 'at least 1'),
    ('version 2', doc(version=2), 'version', '2', 'newer than this collection understands'),
    ('endpoints missing', doc(endpoints=Ellipsis), 'endpoints', None, 'is required'),
    ('endpoints object', doc(endpoints={}), 'endpoints', '{}', 'must be a list'),
    ('endpoint not object', doc('x'), None, '"x"', 'must be an object'),
    ('unknown endpoint key', doc(ep(Slots=2)), 'Slots', '2', 'is not a key of an endpoint'),
    ('id missing', doc(ep(id=Ellipsis)), 'id', None, 'is required'),
    ('slots missing', doc(ep(slots=Ellipsis)), 'slots', None, 'is required'),
    ('host missing', doc(ep(host=Ellipsis)), 'host', None, 'is required'),
    ('port missing', doc(ep(port=Ellipsis)), 'port', None, 'is required'),
    ('id uppercase', doc(ep(id='Mac')), 'id', '"Mac"', '^[a-z0-9-]{1,32}$'),
    ('id underscore', doc(ep(id='a_b')), 'id', '"a_b"', '^[a-z0-9-]{1,32}$'),
    ('id empty', doc(ep(id='')), 'id', '""', '^[a-z0-9-]{1,32}$'),
    ('id 33 chars', doc(ep(id='a' * 33)), 'id', '"' + 'a' * 33 + '"', '^[a-z0-9-]{1,32}$'),
    ('id int', doc(ep(id=1)), 'id', '1', 'must be a string'),
    ('id duplicate', doc(ep(id='a'), ep(id='a', port=1)), 'id', '"a"', 'already used by endpoint 0'),
    ('host localhost', doc(ep(host='localhost')), 'host', '"localhost"', 'loopback'),
    ('host LOCALHOST', doc(ep(host='LOCALHOST')), 'host', '"LOCALHOST"', 'loopback'),
    ('host sub.localhost', doc(ep(host='ollama.localhost')), 'host', '"ollama.localhost"', 'loopback'),
    ('host 127.0.0.1', doc(ep(host='127.0.0.1')), 'host', '"127.0.0.1"', 'proxy itself'),
    ('host 127.1.2.3', doc(ep(host='127.1.2.3')), 'host', '"127.1.2.3"', 'proxy itself'),
    ('host 0.0.0.0', doc(ep(host='0.0.0.0')), 'host', '"0.0.0.0"', 'proxy itself'),
    ('host ::1', doc(ep(host='::1')), 'host', '"::1"', 'proxy itself'),
    ('host ::1 long form', doc(ep(host='0:0:0:0:0:0:0:1')), 'host', '"0:0:0:0:0:0:0:1"', 'proxy itself'),
    ('host ::', doc(ep(host='::')), 'host', '"::"', 'proxy itself'),
    ('host slirp 10.0.2.2', doc(ep(host='10.0.2.2')), 'host', '"10.0.2.2"', 'proxy itself'),
    ('host v4-mapped', doc(ep(host='::ffff:192.168.1.2')), 'host', '"::ffff:192.168.1.2"', 'IPv4-mapped'),
    ('host v4-mapped loopback', doc(ep(host='::ffff:127.0.0.1')), 'host', '"::ffff:127.0.0.1"', 'IPv4-mapped'),
    ('host zone id', doc(ep(host='fe80::1%eth0')), 'host', '"fe80::1%eth0"', 'zone id'),
    ('host bracketed', doc(ep(host='[2001:db8::1]')), 'host', '"[2001:db8::1]"', 'bracketed'),
    ('host bracketed port', doc(ep(host='[2001:db8::1]:80')), 'host', '"[2001:db8::1]:80"', 'host:port'),
    ('host name:port', doc(ep(host='models.test:8443')), 'host', '"models.test:8443"', 'host:port'),
    ('host ipv4:port', doc(ep(host='192.168.1.2:11434')), 'host', '"192.168.1.2:11434"', 'host:port'),
    ('host bad ipv6', doc(ep(host='2001:db8::g')), 'host', '"2001:db8::g"', 'not a valid IPv6'),
    ('host trailing dot', doc(ep(host='models.test.')), 'host', '"models.test."', 'ends with a dot'),
    ('host leading dot', doc(ep(host='.models.test')), 'host', '".models.test"', 'empty label'),
    ('host double dot', doc(ep(host='a..test')), 'host', '"a..test"', 'empty label'),
    ('host too long', doc(ep(host='.'.join(['a' * 63] * 4))), 'host', None, 'longer than 253'),
    ('host label too long', doc(ep(host='a' * 64 + '.test')), 'host', None, 'longer than 63'),
    ('host underscore', doc(ep(host='my_host.test')), 'host', '"my_host.test"', 'not a DNS label'),
    ('host wildcard', doc(ep(host='*.test')), 'host', '"*.test"', 'not a DNS label'),
    ('host hyphen edge', doc(ep(host='-a.test')), 'host', '"-a.test"', 'not a DNS label'),
    ('host numeric last label', doc(ep(host='models.123')), 'host', '"models.123"', 'numeric label'),
    ('host short ipv4', doc(ep(host='10.1')), 'host', '"10.1"', 'strict dotted-decimal'),
    ('host ipv4 leading zero', doc(ep(host='010.0.0.1')), 'host', '"010.0.0.1"', 'strict dotted-decimal'),
    ('host ipv4 256', doc(ep(host='1.2.3.256')), 'host', '"1.2.3.256"', 'strict dotted-decimal'),
    ('host decimal int', doc(ep(host='2130706433')), 'host', '"2130706433"', 'strict dotted-decimal'),
    ('host metadata name', doc(ep(host='metadata.google.internal')), 'host', '"metadata.google.internal"',
     'cloud metadata service'),
    ('host metadata name, upper case', doc(ep(host='METADATA.Google.Internal')), 'host',
     '"METADATA.Google.Internal"', 'cloud metadata service (metadata.google.internal)'),
    ('host metadata short name', doc(ep(host='metadata')), 'host', '"metadata"', 'cloud metadata service'),
    ('host metadata.goog', doc(ep(host='metadata.goog')), 'host', '"metadata.goog"', 'cloud metadata service'),
    ('host aws metadata name', doc(ep(host='instance-data.ec2.internal')), 'host', '"instance-data.ec2.internal"',
     'cloud metadata service'),
    ('host tencent metadata name', doc(ep(host='metadata.tencentyun.com')), 'host', '"metadata.tencentyun.com"',
     'cloud metadata service'),
    ('host url', doc(ep(host='http://models.test')), 'host', '"http://models.test"', 'URL'),
    ('host space', doc(ep(host='models .test')), 'host', '"models .test"', 'whitespace'),
    ('host empty', doc(ep(host='')), 'host', '""', 'must not be empty'),
    ('host non-ascii', doc(ep(host='bücher.test')), 'host', None, 'non-ASCII'),
    ('host int', doc(ep(host=1)), 'host', '1', 'must be a string'),
    ('port string', doc(ep(port='11434')), 'port', '"11434"', 'must be an integer'),
    ('port bool', doc(ep(port=True)), 'port', 'true', 'must be an integer'),
    ('port float', doc(ep(port=11434.0)), 'port', '11434.0', 'must be an integer'),
    ('port 0', doc(ep(port=0)), 'port', '0', 'between 1 and 65535'),
    ('port 65536', doc(ep(port=65536)), 'port', '65536', 'between 1 and 65535'),
    ('port negative', doc(ep(port=-1)), 'port', '-1', 'between 1 and 65535'),
    ('port proxy', doc(ep(port=3128)), 'port', '3128', "proxy's own port"),
    ('slots 0', doc(ep(slots=0)), 'slots', '0', 'between 1 and 64'),
    ('slots 65', doc(ep(slots=65)), 'slots', '65', 'between 1 and 64'),
    ('slots bool', doc(ep(slots=True)), 'slots', 'true', 'must be an integer'),
    ('slots string', doc(ep(slots='2')), 'slots', '"2"', 'must be an integer'),
    ('slots float', doc(ep(slots=2.5)), 'slots', '2.5', 'must be an integer'),
    ('keyless string', doc(ep(keyless='true')), 'keyless', '"true"', 'true or false'),
    ('keyless int', doc(ep(keyless=1)), 'keyless', '1', 'true or false'),
    ('keyless null', doc(ep(keyless=None)), 'keyless', 'null', 'true or false'),
    ('same host and port twice', doc(ep(id='a'), ep(id='b')), 'host', '"host.docker.internal"',
     'already declared by endpoint 0'),
    ('same host and port, other case', doc(ep(id='a'), ep(id='b', host='HOST.docker.internal')), 'host',
     '"HOST.docker.internal"', 'already declared by endpoint 0'),
    ('same v6 different spelling', doc(ep(id='a', host='2001:db8::1'), ep(id='b', host='2001:db8:0::1')),
     'host', '"2001:db8:0::1"', 'already declared by endpoint 0'),
]


@pytest.mark.parametrize('name,text,key,shown,rule', INVALID, ids=[v[0] for v in INVALID])
def test_invalid(name, text, key, shown, rule):
    with pytest.raises(E.EndpointsError) as info:
        E.parse(text, path='/d/model-endpoints.json')
    problems = info.value.problems
    assert problems
    message = str(info.value)
    assert '/d/model-endpoints.json' in message
    assert rule in message
    matching = [p for p in problems if rule in str(p)]
    assert matching, message
    problem = matching[0]
    assert problem.key == key
    text_of_problem = str(problem)
    if key is not None:
        assert '"%s"' % key in text_of_problem
    if shown is not None:
        assert shown in text_of_problem
    if problem.index is not None or 'endpoints[' in text_of_problem:
        assert problem.index is not None
        assert 'endpoint %d' % problem.index in text_of_problem
        if problem.endpoint_id:
            assert '(id "%s")' % problem.endpoint_id in text_of_problem
    assert problem.fix and problem.fix in text_of_problem


def test_table_size():
    assert len(VALID) + len(INVALID) >= 40


def test_every_problem_reported_at_once():
    with pytest.raises(E.EndpointsError) as info:
        E.parse(doc(ep(id='A', host='localhost', port=3128, slots=True, x=1)))
    keys = sorted(p.key for p in info.value.problems)
    assert keys == ['host', 'id', 'port', 'slots', 'x']


def test_index_and_id_named():
    with pytest.raises(E.EndpointsError) as info:
        E.parse(doc(ep(id='good'), ep(id='second', port=0)))
    (problem,) = info.value.problems
    assert problem.index == 1 and problem.endpoint_id == 'second'
    assert 'endpoint 1 (id "second")' in str(problem)
    assert problem.as_dict()['value'] == 0


def test_load_missing_default_is_empty(tmp_path):
    assert E.load(str(tmp_path)) == ([], str(tmp_path / 'model-endpoints.json'), False)


def test_load_missing_explicit_refused(tmp_path):
    with pytest.raises(E.EndpointsError) as info:
        E.load(str(tmp_path), str(tmp_path / 'other.json'))
    assert 'does not exist' in str(info.value)


def test_load_reads(tmp_path):
    (tmp_path / 'model-endpoints.json').write_text(doc(ep()))
    endpoints, path, exists = E.load(str(tmp_path))
    assert exists and [e.id for e in endpoints] == ['ollama']


def test_dumps_roundtrip():
    endpoints = E.parse(doc(ep(id='b'), ep(id='a', port=1, keyless=True)))
    assert E.parse(E.dumps(endpoints)) == endpoints


GOLDEN_CASES = {
    'empty': doc(),
    'one-name': doc(dict(id='mac-ollama', host='host.docker.internal', port=11434, slots=2, keyless=True)),
    'mixed': doc(
        dict(id='lan-vllm', host='192.168.1.20', port=8000, slots=4),
        dict(id='podman-llama', host='169.254.1.2', port=8080, slots=1, keyless=True),
        dict(id='v6-lmstudio', host='2001:DB8::20', port=1234, slots=4),
        dict(id='mac-ollama', host='host.docker.internal', port=11434, slots=2, keyless=True)),
    'models-test': doc(dict(id='fake-models', host='models.test', port=8443, slots=1)),
}


@pytest.mark.parametrize('name', sorted(GOLDEN_CASES))
def test_golden(name):
    rendered = E.render_include(E.parse(GOLDEN_CASES[name]))
    path = os.path.join(GOLDEN, name + '.conf')
    if os.environ.get('UPDATE_GOLDEN'):
        with open(path, 'w') as handle:
            handle.write(rendered)
    with open(path) as handle:
        assert rendered == handle.read()


def test_empty_render_is_header_only():
    text = E.render_include([])
    assert text == E.INCLUDE_HEADER
    assert all(line.startswith('#') for line in text.splitlines())


def test_render_rules_shape():
    text = E.render_include(E.parse(GOLDEN_CASES['mixed']))
    lines = text.splitlines()
    assert 'acl pi_ep_mac_ollama_host dstdomain -n host.docker.internal' in lines
    # An address endpoint is matched as written: a name whose records include it gets nothing.
    assert 'acl pi_ep_lan_vllm_host dst -n 192.168.1.20' in lines
    assert 'acl pi_ep_v6_lmstudio_host dst -n 2001:db8::20' in lines
    assert '# endpoint v6-lmstudio: [2001:db8::20]:1234 (slots 4)' in lines
    never = [line for line in lines if line.startswith('acl pi_endpoints_never dst ')]
    assert len(never) == 1
    for net in ('127.0.0.0/8', '10.0.2.2/32', '169.254.169.254/32', '100.100.100.200/32', 'fd00:ec2::254/128',
                '10.47.0.0/16'):
        assert net in never[0].split()
    # link-local as such stays allowed (podman's host.containers.internal is 169.254.1.2)
    assert '169.254.0.0/16' not in never[0]
    allows = [line for line in lines if line.startswith('http_access allow')]
    assert all(line.startswith('http_access allow CONNECT pi_ep_') for line in allows)
    # The port is tested first, so squid resolves nothing for a request to another port.
    for line in [line for line in lines if line.startswith('http_access')]:
        assert line.split()[3].endswith('_port'), line
    # Endpoints only add a tunnel: no deny of plain requests (they fall through to the allowlist's rules).
    assert not [line for line in lines if '!CONNECT' in line]
    ids = [line.split()[2] for line in lines if line.startswith('# endpoint')]
    assert ids == sorted(ids)
    # the never deny precedes the allow for a name
    assert lines.index('http_access deny CONNECT pi_ep_mac_ollama_port pi_ep_mac_ollama_host pi_endpoints_never '
                       'pi_ep_r_guard') < \
        lines.index('http_access allow CONNECT pi_ep_mac_ollama_port pi_ep_mac_ollama_host pi_ep_r_endpoint')
    # the decision log's reasons: defined in the file itself (it never depends on the rules' ACLs)
    assert 'acl pi_ep_r_endpoint annotate_transaction pi_reason=endpoint' in lines
    assert 'acl pi_ep_r_guard annotate_transaction pi_reason=guard' in lines


def test_render_refuses_an_address_endpoint_in_the_job_pool():
    with pytest.raises(E.EndpointsError) as info:
        E.render_include(E.parse(doc(dict(id='peer', host='10.47.0.2', port=8080, slots=1))))
    assert 'job-network pool 10.47.0.0/16' in str(info.value)
    # the pool the render is told about, not only the default
    E.render_include(E.parse(doc(dict(id='peer', host='10.47.0.2', port=8080, slots=1))), pool='10.99.0.0/16')


@pytest.mark.parametrize('host', ['169.254.169.254', '100.100.100.200', 'fd00:ec2::254', 'FD00:EC2::254'])
def test_metadata_addresses_are_refused(host):
    with pytest.raises(E.EndpointsError) as info:
        E.parse(doc(dict(id='meta', host=host, port=80, slots=1)))
    assert 'cloud metadata address' in str(info.value)


@pytest.mark.parametrize('name', _hostnames.METADATA_NAMES)
def test_every_metadata_name_of_the_allowlist_is_refused_with_its_fix(name):
    # one list: the names the allowlist warns about are the names an endpoint may not be
    assert _allowlist.METADATA_NAMES is _hostnames.METADATA_NAMES
    with pytest.raises(E.EndpointsError) as info:
        E.parse(doc(dict(id='meta', host=name, port=80, slots=1)), path='/d/model-endpoints.json')
    [problem] = info.value.problems
    assert problem.key == 'host' and problem.index == 0
    assert 'names a cloud metadata service (%s)' % name in str(problem)
    assert 'remove the endpoint' in problem.fix and '/d/model-endpoints.json' in str(info.value)


@pytest.mark.parametrize('host', ['metadata.example.com', 'metadata.google.internal.example', 'mymetadata',
                                  'models.google.internal'])
def test_metadata_lookalikes_are_accepted(host):
    assert E.parse(doc(dict(id='m', host=host, port=80, slots=1)))[0].host == host


def test_render_accepts_dicts():
    assert E.render_include([ep(id='a')]) == E.render_include(E.parse(doc(ep(id='a'))))


def test_deployment_empty_include_uses_render():
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment
    assert _deployment.empty_include() == E.render_include([])


# --- the declaration given as a list (model_endpoints' endpoints option) -------------

def _option_cases():
    """Every table case whose file is a version 1 object with an endpoints list: the list alone."""
    cases = []
    for name, text, _want in VALID:
        data = json.loads(text)
        cases.append((name, data['endpoints']))
    for name, text, _key, _shown, _rule in INVALID:
        try:
            data = E.loads_strict(text)
        except E.EndpointsError:
            continue  # not JSON: a file-only problem
        if (isinstance(data, dict) and sorted(data) == ['endpoints', 'version'] and data['version'] == 1
                and isinstance(data['endpoints'], list)):
            cases.append((name, data['endpoints']))
    return cases


OPTION_CASES = _option_cases()


def test_option_cases_cover_the_endpoint_rules():
    assert len(OPTION_CASES) >= 70


@pytest.mark.parametrize('name,items', OPTION_CASES, ids=[c[0] for c in OPTION_CASES])
def test_from_items_judges_like_the_file(name, items):
    """Same endpoints, or the same problems with the same rules and fixes; only the label differs."""
    text = json.dumps(dict(version=1, endpoints=items))
    try:
        want = E.parse(text, path='/d/model-endpoints.json')
    except E.EndpointsError as exc:
        with pytest.raises(E.EndpointsError) as info:
            E.from_items(items)
        got = info.value
        assert [dict(p.as_dict(), path=None, message=None) for p in got.problems] == \
            [dict(p.as_dict(), path=None, message=None) for p in exc.problems]
        assert [str(p) for p in got.problems] == \
            [str(p).replace('/d/model-endpoints.json', E.OPTION_LABEL, 1) for p in exc.problems]
        assert str(got) == str(exc).replace('/d/model-endpoints.json', E.OPTION_LABEL)
        assert all(p.path == E.OPTION_LABEL for p in got.problems)
    else:
        assert E.from_items(items) == want


def test_from_items_names_the_option_and_the_endpoint():
    with pytest.raises(E.EndpointsError) as info:
        E.from_items([ep(id='mac-ollama', host='127.0.0.1')])
    message = str(info.value)
    assert message.startswith('the endpoints option is refused (1 problem); nothing was rendered or changed:')
    assert 'the endpoints option: endpoint 0 (id "mac-ollama"): key "host" = "127.0.0.1": is 127.0.0.1' in message


@pytest.mark.parametrize('item,rule', [
    ('id=a host=h.test port=1 slots=1', 'must be an object, not a string'),
    ('{"id": "a", "host": "h.test", "port": 1, "slots": 1}', 'must be an object, not a string'),
    (['a'], 'must be an object, not a list'),
    (7, 'must be an object, not an integer'),
    (None, 'must be an object, not null'),
])
def test_from_items_refuses_an_item_that_is_not_a_mapping_never_parses_it(item, rule):
    with pytest.raises(E.EndpointsError) as info:
        E.from_items([item])
    (problem,) = info.value.problems
    assert problem.index == 0 and problem.key is None and rule in str(problem)


@pytest.mark.parametrize('items,rule', [
    ('mac-ollama', 'must be a list, not a string'),
    ({'id': 'a'}, 'must be a list, not an object'),
])
def test_from_items_refuses_what_is_not_a_list(items, rule):
    with pytest.raises(E.EndpointsError) as info:
        E.from_items(items)
    (problem,) = info.value.problems
    assert problem.key == 'endpoints' and rule in str(problem)


def test_from_items_nothing_converted_or_defaulted():
    with pytest.raises(E.EndpointsError) as info:
        E.from_items([ep(port='11434', slots=Ellipsis)])
    assert sorted(p.key for p in info.value.problems) == ['port', 'slots']


def test_from_items_empty_list_declares_nothing_and_renders_the_header():
    assert E.from_items([]) == []
    assert E.render_include(E.from_items([])) == E.INCLUDE_HEADER


def test_from_items_renders_like_the_file(tmp_path):
    items = [ep(id='mac-ollama', keyless=True), ep(id='lan-vllm', host='192.168.1.20', port=8000, slots=4)]
    path = tmp_path / 'model-endpoints.json'
    path.write_text(json.dumps(dict(version=1, endpoints=items)))
    from_file = E.load(str(tmp_path))[0]
    assert E.render_include(E.from_items(items)) == E.render_include(from_file)
    assert E.summary(E.from_items(items)) == E.summary(from_file)
