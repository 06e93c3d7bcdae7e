"""OpenShell's own schema (_openshell/schema.py): the pinned package's SandboxPolicy, unknown fields refused."""

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import schema as _schema

needs_schema = pytest.mark.skipif(not _schema.available(), reason='the openshell package (%s) is not installed'
                                  % _schema.REQUIREMENT)

ENDPOINT = {'host': 'api.anthropic.com', 'port': 443, 'protocol': 'rest', 'enforcement': 'enforce', 'access': 'full'}


def _policy(**endpoint):
    return {'version': 1, 'network_policies': {'r': {'name': 'r', 'endpoints': [dict(ENDPOINT, **endpoint)],
                                                     'binaries': [{'path': '/**'}]}}}


def test_the_pin_is_the_one_documented():
    assert _schema.REQUIREMENT == 'openshell==0.1.5'
    assert _schema.INSTALL == 'pip install openshell==0.1.5'


@needs_schema
def test_the_installed_package_is_the_pinned_one():
    assert _schema.installed_version() == _schema.PINNED_VERSION


@needs_schema
@pytest.mark.parametrize('authored, field, value', [
    (dict(enforcement='enforce'), 'enforcement', 'NETWORK_ENFORCEMENT_MODE_ENFORCE'),
    (dict(enforcement='audit'), 'enforcement', 'NETWORK_ENFORCEMENT_MODE_AUDIT'),
    (dict(access='read-only'), 'access', 'NETWORK_ACCESS_PRESET_READ_ONLY'),
    (dict(access='read-write'), 'access', 'NETWORK_ACCESS_PRESET_READ_WRITE'),
    (dict(access='full'), 'access', 'NETWORK_ACCESS_PRESET_FULL'),
    (dict(tls='skip'), 'tls', 'NETWORK_TLS_MODE_SKIP'),
    (dict(access='NETWORK_ACCESS_PRESET_FULL'), 'access', 'NETWORK_ACCESS_PRESET_FULL'),
])
def test_the_short_enum_names_map_onto_the_message(authored, field, value):
    message = _schema.parse(_policy(**authored), 'p')
    endpoint = message.network_policies['r'].endpoints[0]
    enum = endpoint.DESCRIPTOR.fields_by_name[field].enum_type
    assert enum.values_by_number[getattr(endpoint, field)].name == value


@needs_schema
def test_the_filesystem_section_is_renamed_and_the_input_untouched():
    policy = dict(_policy(), filesystem_policy={'read_only': ['/usr']})
    message = _schema.parse(policy, 'p')
    assert list(message.filesystem.read_only) == ['/usr']
    assert 'filesystem_policy' in policy and policy['network_policies']['r']['endpoints'][0]['access'] == 'full'


@needs_schema
@pytest.mark.parametrize('policy, words', [
    (_policy(bogus=True), 'has no field named "bogus"'),
    (_policy(access='everything'), 'everything'),
    (_policy(port='not a port'), 'port'),
    (dict(_policy(), networks={}), 'has no field named "networks"'),
    (dict(_policy(), version='one'), 'version'),
    ({'version': 1, 'network_policies': {'r': {'endpoints': [], 'binaries': [{'path': '/**', 'sha': 'x'}]}}},
     'has no field named "sha"'),
])
def test_what_the_message_does_not_accept_is_refused_naming_the_field(policy, words):
    with pytest.raises(_schema.SchemaRefused) as err:
        _schema.parse(policy, '/tmp/read-back.yaml')
    assert str(err.value).startswith("/tmp/read-back.yaml: is not accepted by OpenShell's SandboxPolicy message (")
    assert words in str(err.value)
    assert 'openshell 0.1.5' in err.value.fix


@needs_schema
def test_a_document_that_is_not_a_mapping_is_refused():
    with pytest.raises(_schema.SchemaRefused) as err:
        _schema.parse(['version', 1], 'p.yaml')
    assert 'is not a mapping' in str(err.value)


def test_without_the_package_parse_refuses_naming_it_and_the_pin(monkeypatch):
    monkeypatch.setattr(_schema, 'sandbox_pb2', None)
    assert not _schema.available()
    assert _schema.installed_version() is None
    with pytest.raises(_schema.SchemaRefused) as err:
        _schema.parse(_policy(), 'the rendered policy')
    assert 'openshell (pinned 0.1.5) cannot be imported here' in str(err.value)
    assert 'pip install openshell==0.1.5' in str(err.value)


def test_the_file_imports_without_the_package(monkeypatch):
    """What ansible-test sanity's import test does on a Python without openshell: no traceback, a reason."""
    import builtins
    import importlib
    import sys

    real_import = builtins.__import__

    def no_openshell(name, *args, **kwargs):
        if name == 'openshell' or name.startswith('openshell.'):
            raise ImportError('No module named %r' % name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, '__import__', no_openshell)
    for name in [n for n in sys.modules if n == 'openshell' or n.startswith('openshell.')]:
        monkeypatch.delitem(sys.modules, name)
    fresh = importlib.reload(_schema)
    try:
        assert not fresh.available()
        assert 'No module named' in fresh.IMPORT_ERROR
        assert fresh.to_message_dict({'filesystem_policy': {}}) == {'filesystem': {}}
    finally:
        monkeypatch.undo()
        importlib.reload(_schema)


def test_to_message_dict_leaves_what_it_does_not_know():
    odd = {'version': 1, 'network_policies': {'a': 'not a rule', 'b': {'endpoints': 'no'}, 'c': {'endpoints': [3]}}}
    assert _schema.to_message_dict(odd) == odd
    assert _schema.to_message_dict('text') == 'text'
