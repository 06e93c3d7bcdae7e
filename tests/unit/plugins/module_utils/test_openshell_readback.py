"""A policy read back from OpenShell against the render (_openshell/readback.py): semantic, per endpoint."""

import copy
import json

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import readback as _readback
from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import schema as _schema
from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import translate as _translate
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import allowlist as _allowlist
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import endpoints as _endpoints

pytestmark = pytest.mark.skipif(not _schema.available(), reason='the openshell package (%s) is not installed'
                                % _schema.REQUIREMENT)

SEED = 'api.anthropic.com\n.github.com\nregistry.npmjs.org\n'
ENDPOINT = dict(id='mac-ollama', host='host.docker.internal', port=11434, slots=2, keyless=True)


def _rendered():
    allowlist = _allowlist.parse(SEED, '/d/egress-allowlist.conf')
    return _translate.translate(allowlist, _endpoints.from_items([ENDPOINT])).policy


def _compare(read_back):
    rendered = _rendered()
    return _readback.compare(_schema.parse(rendered, 'rendered'), _schema.parse(read_back, 'read back'))


def _rules(policy):
    return policy['network_policies']


def _reordered_and_renamed(policy):
    """The same admission: other keys and names, rules and endpoints in reverse, hosts in capitals."""
    out = {'version': 1, 'network_policies': {}}
    for n, (key, rule) in enumerate(reversed(list(_rules(policy).items()))):
        endpoints = [dict(e, host=e['host'].upper()) for e in reversed(rule['endpoints'])]
        out['network_policies']['rule_%d' % n] = {'name': key[::-1], 'endpoints': endpoints,
                                                  'binaries': rule['binaries']}
    return out


def _ports_form(policy):
    """Each host's endpoints merged into one with ``ports`` (as a gateway may give them back)."""
    out = {'version': 1, 'network_policies': {}}
    for key, rule in _rules(policy).items():
        merged = {}
        for e in rule['endpoints']:
            merged.setdefault(e['host'], dict((k, v) for k, v in e.items() if k != 'port'))
            merged[e['host']].setdefault('ports', []).append(e['port'])
        out['network_policies'][key] = dict(rule, endpoints=list(merged.values()))
    return out


def _message_form(policy):
    """The message's JSON mapping (enum names, camelCase), as MessageToJson writes it."""
    from google.protobuf import json_format
    return json.loads(json_format.MessageToJson(_schema.parse(policy, 'x')))


def _with_sections(policy):
    return dict(policy, filesystem_policy={'include_workdir': True, 'read_only': ['/usr'], 'read_write': ['/tmp']},
                landlock={'compatibility': 'best_effort'}, process={'run_as_user': 'sandbox'})


SAME = [
    ('itself', lambda p: p),
    ('a deep copy', copy.deepcopy),
    ('other keys, names, order and case', _reordered_and_renamed),
    ('ports instead of one endpoint per port', _ports_form),
    ("the message's JSON mapping", _message_form),
    ('with the filesystem, Landlock and process sections', _with_sections),
    ('enforcement and access spelled as the enum names',
     lambda p: json.loads(json.dumps(p).replace('"enforce"', '"NETWORK_ENFORCEMENT_MODE_ENFORCE"')
                          .replace('"full"', '"NETWORK_ACCESS_PRESET_FULL"'))),
    ('through the YAML file', lambda p: _readback.loads(_readback.dumps(p, 'yaml'), 'p.yaml')),
    ('through the JSON file', lambda p: _readback.loads(_readback.dumps(p, 'json'), 'p.json')),
    ('a binary listed twice', lambda p: _edit(p, 'allowlist_host_api_anthropic_com',
                                              lambda r: r['binaries'].append({'path': '/**'}))),
]


def _edit(policy, key, change):
    policy = copy.deepcopy(policy)
    change(_rules(policy)[key])
    return policy


@pytest.mark.parametrize('case, transform', SAME, ids=[s[0] for s in SAME])
def test_the_same_admission_reads_back_the_same(case, transform):
    assert _compare(transform(_rendered())) == []


def _drop_port_80_of_npm(rule):
    rule['endpoints'] = [e for e in rule['endpoints'] if e['port'] != 80]


DIFFERENT = [
    ('one endpoint missing', lambda p: _edit(p, 'allowlist_host_registry_npmjs_org', _drop_port_80_of_npm),
     [('registry.npmjs.org:80', 'missing')]),
    ('one endpoint added', lambda p: _edit(p, 'allowlist_host_api_anthropic_com', lambda r: r['endpoints'].append(
        dict(r['endpoints'][0], host='evil.example.com'))), [('evil.example.com:443', 'added')]),
    ('a wider wildcard', lambda p: _edit(p, 'allowlist_domain_github_com', lambda r: r['endpoints'].append(
        dict(r['endpoints'][0], host='*.github.com'))), [('*.github.com:443', 'added')]),
    ('another port', lambda p: _edit(p, 'model_endpoint_mac-ollama', lambda r: r['endpoints'][0].update(port=11435)),
     [('host.docker.internal:11434', 'missing'), ('host.docker.internal:11435', 'added')]),
    ('read-only instead of full', lambda p: _edit(p, 'model_endpoint_mac-ollama',
                                                  lambda r: r['endpoints'][0].update(access='read-only')),
     [('host.docker.internal:11434', 'changed')]),
    ('audit instead of enforce', lambda p: _edit(p, 'allowlist_host_api_anthropic_com',
                                                 lambda r: r['endpoints'][0].update(enforcement='audit')),
     [('api.anthropic.com:443', 'changed')]),
    ('no inspection (L4 passthrough)', lambda p: _edit(p, 'allowlist_host_api_anthropic_com', lambda r: [
        e.pop(k) for e in r['endpoints'] for k in ('protocol', 'access', 'enforcement')]),
     [('api.anthropic.com:80', 'changed'), ('api.anthropic.com:443', 'changed')]),
    ('allowed_ips added', lambda p: _edit(p, 'model_endpoint_mac-ollama',
                                          lambda r: r['endpoints'][0].update(allowed_ips=['10.0.0.0/8'])),
     [('host.docker.internal:11434', 'changed')]),
    ('one binary only', lambda p: _edit(p, 'model_endpoint_mac-ollama',
                                        lambda r: r.update(binaries=[{'path': '/usr/bin/node'}])),
     [('host.docker.internal:11434', 'changed')]),
    ('a rule gone', lambda p: dict(p, network_policies=dict(
        (k, v) for k, v in _rules(p).items() if k != 'model_endpoint_mac-ollama')),
     [('host.docker.internal:11434', 'missing')]),
    ('nothing at all', lambda p: {'version': 1},
     [(h, 'missing') for h in ('**.github.com:80', '**.github.com:443', 'api.anthropic.com:80', 'api.anthropic.com:443',
                               'github.com:80', 'github.com:443', 'host.docker.internal:11434',
                               'registry.npmjs.org:80', 'registry.npmjs.org:443')]),
    ('another policy version', lambda p: dict(p, version=2), [('the policy version', 'changed')]),
]


@pytest.mark.parametrize('case, transform, expected', DIFFERENT, ids=[d[0] for d in DIFFERENT])
def test_a_difference_names_each_endpoint_that_differs(case, transform, expected):
    differences = _compare(transform(_rendered()))
    assert [(d.endpoint, d.kind) for d in differences] == expected
    for d in differences:
        assert str(d).startswith(d.endpoint + ': ')
        assert d.as_dict()['message'] == str(d)


def test_the_refusal_names_the_one_endpoint_and_what_differs():
    read_back = _edit(_rendered(), 'allowlist_host_registry_npmjs_org', _drop_port_80_of_npm)
    err = _readback.ReadBackDiffers(_compare(read_back), '/tmp/policy.yaml')
    text = str(err)
    assert text.startswith(_readback.READBACK_DIFFERS + ': the policy read back from /tmp/policy.yaml differs from '
                           'what the sources render in 1 endpoint;')
    assert '  - registry.npmjs.org:80: missing from the policy read back' in text
    changed = _compare(_edit(_rendered(), 'model_endpoint_mac-ollama',
                             lambda r: r['endpoints'][0].update(access='read-only')))[0]
    assert '"access": "full"' in str(changed) and '"access": "read-only"' in str(changed)


def test_sections_left_out_are_named():
    assert _readback.not_compared(_with_sections(_rendered())) == ['filesystem_policy', 'landlock', 'process']
    assert _readback.not_compared(_rendered()) == []
    assert _readback.not_compared(['not', 'a', 'policy']) == []


# ---------------------------------------------------------------- the file

def test_the_yaml_file_is_deterministic_and_reads_back_as_yaml():
    text = _readback.dumps(_rendered())
    assert text == _readback.dumps(_rendered())
    assert text.startswith(_readback.HEADER)
    assert '      - host: "**.github.com"\n        port: 443\n' in text
    from ansible.module_utils.common.yaml import yaml_load
    assert yaml_load(text) == _rendered()


def test_empty_containers_and_booleans_render():
    text = _readback.dumps({'version': 1, 'network_policies': {}, 'flag': False, 'items': []})
    assert 'network_policies: {}\n' in text and 'flag: false\n' in text and 'items: []\n' in text
    assert json.loads(_readback.dumps({'version': 1}, 'json')) == {'version': 1}


@pytest.mark.parametrize('text, words', [
    ('{"version": 1, "version": 2}', 'duplicate key "version"'),
    ('{"version": 1,}', 'is not valid JSON'),
    ('version: [1\n', 'is not valid YAML'),
    ('- 1\n- 2\n', 'does not hold a policy'),
    ('just text', 'does not hold a policy'),
])
def test_a_bad_policy_file_is_refused_naming_it(text, words):
    with pytest.raises(_readback.PolicyFileError) as err:
        _readback.loads(text, '/tmp/read-back.yaml')
    assert str(err.value).startswith('/tmp/read-back.yaml ')
    assert words in str(err.value)
