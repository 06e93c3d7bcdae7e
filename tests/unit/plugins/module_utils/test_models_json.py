"""The overlay models.json checks doctor prints about model endpoints."""
import json

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import endpoints as E
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import models_json as M

ENDPOINTS = E.parse(json.dumps({'version': 1, 'endpoints': [
    {'id': 'mac-ollama', 'host': 'host.docker.internal', 'port': 11434, 'slots': 2, 'keyless': True},
    {'id': 'lan-vllm', 'host': '192.168.1.20', 'port': 8000, 'slots': 4},
]}))

SEED = ('{"providers":{"local-ollama":{"api":"openai-completions","baseUrl":"http://host.docker.internal:11434/v1",'
        '"apiKey":"$PI_DISPATCH_KEYLESS","compat":{"maxTokensField":"max_tokens"},'
        '"models":[{"id":"qwen2.5:0.5b","contextWindow":32768,"maxTokens":2048}]}}}')


def provider(**kw):
    base = {'baseUrl': 'http://host.docker.internal:11434/v1', 'apiKey': '$PI_DISPATCH_KEYLESS',
            'models': [{'id': 'm'}]}
    base.update(kw)
    return base


def text_of(**providers):
    return json.dumps({'providers': providers})


def lines(text, allow=()):
    return M.check(text, ENDPOINTS, allow)


def find(result, kind, status=None):
    return [r for r in result if r.kind == kind and (status is None or r.status == status)]


def test_seed_example_is_keyless():
    result = lines(SEED)
    assert [str(r) for r in find(result, 'keyless')] == [
        '\u2713 Provider key: none needed (local-ollama is keyless: served by declared endpoint mac-ollama)']
    assert find(result, 'uses', 'ok')[0].text == \
        'Overlay model "local-ollama"/"qwen2.5:0.5b" uses declared endpoint mac-ollama (host.docker.internal:11434)'
    assert not [r for r in result if r.status != 'ok']


READER = [
    ('comments', '// head\n{"providers": /* inline */ {}}\n', True),
    ('bom', '\ufeff{"providers": {}}', True),
    ('trailing commas', '{"providers": {"a": {"models": [{"id": "m",},],},},}', True),
    ('comment with quote and comma', '{"providers": {} // "x",\n}', True),
    ('url in string not a comment', '{"providers": {"a": {"baseUrl": "http://x.test//v1", "models": []}}}', True),
    ('comma inside string kept', '{"providers": {"a": {"name": "a,}", "models": []}}}', True),
    ('lone comma', '{"providers": {"a": {,}}}', False),
    ('double comma', '{"providers": {"a": {"models": [],,}}}', False),
    ('unclosed comment', '{"providers": {}} /* x', False),
    ('not json', '{providers: {}}', False),
    ('NaN', '{"providers": {"a": {"models": [{"id": "m", "maxTokens": NaN}]}}}', False),
]


@pytest.mark.parametrize('name,text,ok', READER, ids=[r[0] for r in READER])
def test_reader(name, text, ok):
    if ok:
        assert isinstance(M.loads(text), dict)
        assert not find(lines(text), 'parse')
    else:
        with pytest.raises(M.ModelsJsonError):
            M.loads(text)
        (line,) = find(lines(text), 'parse', 'fail')
        assert 'no provider in it is keyless' in line.text and line.fix


WRONG_TYPES = [
    ('root list', '[]', 'root'),
    ('no providers', '{}', 'providers'),
    ('providers list', '{"providers": []}', 'providers'),
    ('provider string', text_of(a='x'), 'providers.a'),
    ('apiKey number', text_of(a=provider(apiKey=1)), 'providers.a.apiKey'),
    ('apiKey empty', text_of(a=provider(apiKey='')), 'providers.a.apiKey'),
    ('headers non-string', text_of(a=provider(headers={'X': 1})), 'providers.a.headers'),
    ('models object', text_of(a=provider(models={})), 'providers.a.models'),
    ('model id missing', text_of(a=provider(models=[{'name': 'x'}])), 'providers.a.models[0].id'),
    ('model id empty', text_of(a=provider(models=[{'id': ''}])), 'providers.a.models[0].id'),
    ('model id number', text_of(a=provider(models=[{'id': 5}])), 'providers.a.models[0].id'),
    ('maxTokens string', text_of(a=provider(models=[{'id': 'm', 'maxTokens': '2048'}])),
     'providers.a.models[0].maxTokens'),
    ('contextWindow bool', text_of(a=provider(models=[{'id': 'm', 'contextWindow': True}])),
     'providers.a.models[0].contextWindow'),
    ('reasoning string', text_of(a=provider(models=[{'id': 'm', 'reasoning': 'yes'}])),
     'providers.a.models[0].reasoning'),
    ('input bad', text_of(a=provider(models=[{'id': 'm', 'input': ['audio']}])), 'providers.a.models[0].input'),
    ('cost partial', text_of(a=provider(models=[{'id': 'm', 'cost': {'input': 1}}])),
     'providers.a.models[0].cost'),
    ('maxTokensField bad', text_of(a=provider(compat={'maxTokensField': 'max_output_tokens'})),
     'providers.a.compat'),
    ('override cost string', text_of(openai={'modelOverrides': {'gpt': {'cost': {'input': 'x'}}}}),
     'providers.openai.modelOverrides.gpt.cost'),
]


@pytest.mark.parametrize('name,text,where', WRONG_TYPES, ids=[w[0] for w in WRONG_TYPES])
def test_wrong_types_refuse_the_whole_file(name, text, where):
    result = lines(text)
    (line,) = find(result, 'parse', 'fail')
    assert where in line.text
    assert not find(result, 'keyless')


KEYLESS = [
    ('literal key', dict(apiKey='sk-123'), 'ok', 'literal key'),
    ('other variable', dict(apiKey='$OLLAMA_KEY'), 'ok', 'another variable'),
    ('command', dict(apiKey='!pass show x'), 'ok', '!command'),
    ('no apiKey', dict(apiKey=None), 'ok', 'no apiKey'),
    ('provider headers', dict(headers={'Authorization': 'Bearer x'}), 'fail', 'headers on the provider'),
    ('model headers', dict(models=[{'id': 'm', 'headers': {'X-Key': 'x'}}]), 'fail', 'headers on model "m"'),
    ('override headers', dict(modelOverrides={'m': {'headers': {'X': 'y'}}}), 'fail', 'headers in modelOverrides.m'),
    ('oauth', dict(oauth={'x': 1}), 'fail', 'oauth on the provider'),
    ('userinfo', dict(baseUrl='http://u:p@host.docker.internal:11434/v1'), 'fail', 'user:password@'),
    ('no models', dict(models=[]), 'fail', 'defines no model'),
    ('model elsewhere', dict(models=[{'id': 'm'}, {'id': 'n', 'baseUrl': 'https://api.example.test/v1'}]),
     'fail', 'model "n" is not served by a declared endpoint'),
    ('endpoint not keyless', dict(baseUrl='http://192.168.1.20:8000/v1'), 'fail', 'not marked "keyless": true'),
    ('host alone', dict(baseUrl='http://host.docker.internal:11435/v1'), 'fail', 'not served by a declared'),
]


@pytest.mark.parametrize('name,changes,status,reason', KEYLESS, ids=[k[0] for k in KEYLESS])
def test_keyless_refusals(name, changes, status, reason):
    prov = provider(**changes)
    if prov.get('apiKey') is None:
        del prov['apiKey']
    result = lines(text_of(**{'local-x': prov}))
    (line,) = find(result, 'keyless')
    assert line.status == status, line
    assert reason in line.text
    assert line.fix
    if status == 'fail':
        assert 'names $PI_DISPATCH_KEYLESS but is not keyless' in line.text


def test_known_provider_needs_key():
    result = lines(text_of(openai=provider()))
    (line,) = find(result, 'keyless', 'fail')
    assert 'pi knows openai' in line.text


def test_keyless_over_two_endpoints_names_both():
    eps = E.parse(json.dumps({'version': 1, 'endpoints': [
        {'id': 'a', 'host': 'a.test', 'port': 1, 'slots': 1, 'keyless': True},
        {'id': 'b', 'host': 'b.test', 'port': 2, 'slots': 1, 'keyless': True}]}))
    text = text_of(p=provider(models=[{'id': 'x', 'baseUrl': 'http://a.test:1'},
                                      {'id': 'y', 'baseUrl': 'https://b.test:2/v1'}]))
    (line,) = find(M.check(text, eps), 'keyless', 'ok')
    assert 'served by declared endpoints a, b' in line.text


def test_host_alone_does_not_match_warns():
    result = lines(text_of(p=provider(baseUrl='http://host.docker.internal/v1')))
    (line,) = find(result, 'port-mismatch', 'warn')
    assert 'port 80' in line.text and '11434 (mac-ollama)' in line.text
    assert not find(result, 'uses')


def test_priced_model_without_max_tokens_warns():
    model = {'id': 'q', 'cost': {'input': 1, 'output': 2, 'cacheRead': 0, 'cacheWrite': 0}}
    result = lines(text_of(**{'local-ollama': provider(models=[model])}))
    (line,) = find(result, 'max-tokens', 'warn')
    assert line.text == ('Overlay models.json sends the output cap of "local-ollama"/"q" as max_completion_tokens '
                         'to a declared model endpoint, which a local server may ignore (Ollama does), so under a '
                         'dollar cap every call to it is refused as unboundable')
    assert 'maxTokensField' in line.fix


@pytest.mark.parametrize('compat_on', ['model', 'provider'])
def test_max_tokens_field_set_no_warning(compat_on):
    model = {'id': 'q', 'cost': {'input': 1, 'output': 2, 'cacheRead': 0, 'cacheWrite': 0}}
    prov = provider(models=[model])
    target = model if compat_on == 'model' else prov
    target['compat'] = {'maxTokensField': 'max_tokens'}
    assert not find(lines(text_of(p=prov)), 'max-tokens')


def test_free_model_no_warning():
    model = {'id': 'q', 'cost': {'input': 0, 'output': 0, 'cacheRead': 0, 'cacheWrite': 0}}
    assert not find(lines(text_of(p=provider(models=[model]))), 'max-tokens')


def test_priced_model_off_endpoint_no_warning():
    model = {'id': 'q', 'cost': {'input': 1, 'output': 2, 'cacheRead': 0, 'cacheWrite': 0}}
    assert not find(lines(text_of(p=provider(baseUrl='https://api.example.test/v1', models=[model]))),
                    'max-tokens')


@pytest.mark.parametrize('url', ['http://localhost:11434/v1', 'http://127.0.0.1:11434', 'http://[::1]:8080/v1',
                                 'http://ollama.localhost:1/v1', 'http://0.0.0.0:11434'])
def test_loopback_base_url_warns(url):
    result = lines(text_of(p={'apiKey': 'k', 'models': [{'id': 'm', 'baseUrl': url}]}))
    (line,) = find(result, 'loopback', 'warn')
    assert url in line.text and 'declare it' in line.fix


@pytest.mark.parametrize('entry,warns', [('host.docker.internal', True), ('host.containers.internal', True),
                                         ('.internal', True), ('.docker.internal', True),
                                         ('api.anthropic.com', False), ('.github.com', False)])
def test_allowlist_host_entries(entry, warns):
    result = M.check(None, ENDPOINTS, [entry])
    assert bool(find(result, 'allowlist', 'warn')) == warns


def test_no_file_no_lines():
    assert M.check(None, ENDPOINTS, ['api.anthropic.com']) == []


def test_line_as_dict():
    (line,) = find(lines(SEED), 'keyless')
    data = line.as_dict()
    assert data['status'] == 'ok' and data['line'].startswith('\u2713 Provider key')


def test_read_text(tmp_path):
    assert M.read_text(str(tmp_path / 'missing.json')) == (None, None)
    path = tmp_path / 'models.json'
    path.write_text(SEED)
    assert M.read_text(str(path)) == (SEED, None)
    path.write_bytes(b'\xff\xfe')
    text, line = M.read_text(str(path))
    assert text is None and line.status == 'fail'


def test_read_text_directory(tmp_path):
    text, line = M.read_text(str(tmp_path))
    assert text is None and line.status == 'fail' and 'EISDIR' in line.text
