"""Property tests of the credential interceptor's pure part (issue 42): what a job controls in a request to a
bound host (the method, the request target, Host, the headers, the body), arbitrary.

The property: :func:`decide` never raises, and it never swaps a secret into a request that names anything but
the bound host (origin-form target, exactly one Host naming the bound authority) or that comes from a client
no job names. The small parsers (Basic values, X-Pi-Client, Host authorities) are refused or parsed exactly.
Bounded in every run (the ``ci`` profile, tests/unit/conftest.py); ``benchmarks/fuzz.py`` runs them long.
"""

import base64
import importlib.util
import ipaddress
import os
import types

import pytest

hypothesis = pytest.importorskip('hypothesis')
from hypothesis import assume, given, strategies as st  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PROGRAM = os.path.join(ROOT, 'roles', 'proxy', 'files', 'interceptor', 'pi_interceptor.py')


def _load_addon():
    spec = importlib.util.spec_from_file_location('pi_interceptor_properties', PROGRAM)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


addon = _load_addon()
API = 'api.provider.test'
CREDS = [addon.Credential('anthropic', API, 443, 'header', 'x-api-key', '/s/a'),
         addon.Credential('forge', 'forge.test', 443, 'basic', 'authorization', '/s/f')]
SECRET = {'anthropic': 'sk-ant-REAL-4f3c2a1b9e', 'forge': 'ghp_REALforge0001'}
PH = 'pi-placeholder-anthropic-' + '0a' * 16
JOBS = types.SimpleNamespace(by_placeholder={PH: ('job-a', 'anthropic')})


def secret_of(cred):
    return SECRET[cred.name]


# What a job can put in a request line or a header: printable text with the characters that matter most.
TEXT = st.text(alphabet=st.sampled_from('abcdefghijklmnopqrstuvwxyz0123456789.-:/@[]%?#*_ \\tAPI'), max_size=60)
HOSTISH = st.one_of(TEXT, st.sampled_from([
    API, API + ':443', API + ':0443', API + ':443:1', API + ':', 'API.provider.test', API + '.', '[' + API + ']',
    'user@' + API, 'other.provider.test', API + ':8443', ' ' + API, API + ' ', '']))
TARGET = st.one_of(TEXT, st.sampled_from(['/v1/messages', '*', 'https://other.test/v1', 'http://' + API + '/x',
                                          API + ':443', '//other.test/x', '/']))


def _request(method, path, host_header, authority, version, extra_hosts, body):
    headers = [('x-api-key', PH)] + [('Host', h) for h in extra_hosts]
    return addon.Request(method, API, 443, API, host_header, headers, path, body, authority=authority,
                         http_version=version)


@given(method=st.sampled_from(['GET', 'POST', 'CONNECT', 'OPTIONS', 'TRACE', 'get', 'PUT']), path=TARGET,
       host_header=HOSTISH, authority=st.one_of(st.just(''), HOSTISH),
       version=st.sampled_from(['HTTP/1.1', 'HTTP/1.0', 'HTTP/2.0']),
       extra_hosts=st.lists(HOSTISH, max_size=2), body=st.binary(max_size=64),
       client_job=st.sampled_from(['job-a', None, 'job-b']))
def test_a_swap_happens_only_for_an_origin_form_request_naming_the_bound_host(
        method, path, host_header, authority, version, extra_hosts, body, client_job):
    request = _request(method, path, host_header, authority, version, extra_hosts, body)
    decision = addon.decide(request, CREDS, JOBS, secret_of, client_job)
    assert decision.refused is None or isinstance(decision.refused, str)
    if decision.swapped:
        assert client_job == 'job-a'
        assert path.startswith('/') and method.upper() not in ('CONNECT', 'TRACE', 'TRACK')
        assert version.startswith('HTTP/2') or authority == ''
        for value in [host_header] + list(extra_hosts) + ([authority] if authority else []):
            assert value.lower() in (API, API + ':443'), value
        assert len(extra_hosts) <= 1


@given(value=st.text(max_size=40))
def test_names_the_target_accepts_exactly_the_bound_authority(value):
    accepted = addon._names_the_target(value, API, 443)
    assert accepted == (value in (API, API + ':443'))


@given(host=st.from_regex(r'[a-z0-9](?:[a-z0-9-]{0,10}\.){1,3}[a-z]{2,5}', fullmatch=True),
       port=st.integers(min_value=1, max_value=65535), suffix=st.sampled_from(['', ':{p}', ':0{p}', ':{p}:1', ':']))
def test_names_the_target_with_generated_names(host, port, suffix):
    value = host + suffix.format(p=port)
    assert addon._names_the_target(value, host, port) == (suffix in ('', ':{p}'))


@given(values=st.lists(st.text(max_size=45), max_size=3))
def test_client_address_is_one_ip_literal_or_nothing(values):
    address = addon.client_address(values)
    if address is not None:
        assert len(values) == 1
        assert str(ipaddress.ip_address(values[0].strip())) == address


@given(value=st.one_of(st.text(max_size=80), st.binary(max_size=60).map(
    lambda raw: 'Basic ' + base64.b64encode(raw).decode('ascii'))))
def test_basic_parts_parse_exactly_or_refuse(value):
    parts = addon._basic_parts(value)
    if parts is not None:
        scheme, user, password = parts
        assert scheme.lower() == 'basic'
        raw = base64.b64decode(value.split(None, 1)[1].strip(), validate=True)
        assert raw.decode('utf-8' if _utf8(raw) else 'latin-1') == user + ':' + password


def _utf8(raw):
    try:
        raw.decode('utf-8')
        return True
    except UnicodeDecodeError:
        return False


@given(prefix=st.binary(max_size=40), middle=st.binary(max_size=40), suffix=st.binary(max_size=40),
       secret=st.from_regex(r'[!-~]{4,40}', fullmatch=True), form=st.integers(min_value=0, max_value=4))
def test_no_derived_form_of_the_secret_survives_redaction(prefix, middle, suffix, secret, form):
    forms = addon.derived_forms(secret)
    needle = forms[form % len(forms)].encode('utf-8')
    assume(b'[redacted' not in prefix + middle + suffix)
    data = prefix + needle + middle + needle + suffix
    redacted, count = addon.redact(data, addon.redaction_pairs([('anthropic', secret)]))
    assert count >= 2
    for each in forms:
        assert each.encode('utf-8') not in redacted or each.encode('utf-8') in prefix + middle + suffix
