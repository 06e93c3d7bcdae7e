"""Property-based tests of the gateway's parsers that see a job's untrusted bytes (issue 42): DNS questions,
TLS ClientHellos, plain HTTP request heads (roles/proxy/files/gateway/gatewayd, loaded as a module).

The property, for each parser: refused or parsed exactly; never an exception escaping; never accepted with a
name other than the one present. Inputs: arbitrary bytes, well-formed messages truncated at every offset,
records split at every offset (as the relays read them), lengths made larger than what follows. CI runs a
bounded number of examples (seconds); PI_EGRESS_FUZZ_EXAMPLES=<n> runs more (a longer run by hand).
"""

import asyncio
import importlib.machinery
import importlib.util
import os
import re
import struct

from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PROGRAM = os.path.join(ROOT, 'roles', 'proxy', 'files', 'gateway', 'gatewayd')


def _load_gatewayd():
    loader = importlib.machinery.SourceFileLoader('pi_egress_gatewayd_fuzz', PROGRAM)
    spec = importlib.util.spec_from_loader('pi_egress_gatewayd_fuzz', loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


GW = _load_gatewayd()
LONG_RUN = os.environ.get('PI_EGRESS_FUZZ_EXAMPLES')
EXAMPLES = int(LONG_RUN or '60')
# CI: the same bounded examples every run (derandomized), no example database left in the work tree.
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=not LONG_RUN, database=None,
                suppress_health_check=[HealthCheck.too_slow])

LABEL = st.text(alphabet='abcdefghijklmnopqrstuvwxyz0123456789', min_size=1, max_size=20)
HOSTNAME = st.lists(LABEL, min_size=1, max_size=5).map('.'.join)


# --- DNS questions -----------------------------------------------------------------------------------

def _qname(name):
    return b''.join(bytes([len(label)]) + label.encode('ascii') for label in name.split('.') if label) + b'\x00'


def _query(name, qid, flags, qtype, extra=b''):
    return struct.pack('>HHHHHH', qid, flags, 1, 0, 0, 0) + _qname(name) + struct.pack('>HH', qtype, 1) + extra


QUERY = st.builds(_query, HOSTNAME, st.integers(0, 0xffff), st.integers(0, 0x7fff), st.integers(0, 0xffff),
                  st.binary(max_size=40))


def _check_question(data):
    """Whatever parse_question returns for ``data`` is exactly what ``data`` says."""
    parsed = GW.parse_question(data)
    if parsed is None:
        return None
    qid, flags, name, qtype, end = parsed
    assert end <= len(data)
    assert (qid, flags) == struct.unpack('>HH', data[:4]) and not flags & 0x8000
    assert struct.unpack('>H', data[4:6])[0] == 1
    assert _qname(name) == data[12:end - 4].lower(), (name, data)
    assert qtype == struct.unpack('>H', data[end - 4:end - 2])[0]
    answer = GW.build_answer(data, end, 3)                    # never raises on what was parsed
    assert answer[:2] == data[:2] and answer[12:end] == data[12:end]
    return parsed


@FUZZ
@given(st.binary(max_size=600))
def test_parse_question_arbitrary_bytes(data):
    _check_question(data)


@FUZZ
@given(st.binary(min_size=12, max_size=12), st.binary(max_size=300))
def test_parse_question_arbitrary_names(header, rest):
    data = header[:4] + b'\x00\x01' + header[6:] + rest       # one question: the name parser is reached
    _check_question(data)


@FUZZ
@given(QUERY)
def test_parse_question_well_formed_truncated_at_every_offset(data):
    parsed = _check_question(data)
    assert parsed is not None
    end = parsed[4]
    for cut in range(len(data)):
        got = _check_question(data[:cut])
        assert got is None if cut < end else got == parsed, cut


@FUZZ
@given(QUERY, st.data())
def test_parse_question_oversized_label(data, draw):
    labels = []
    pos = 12
    while data[pos]:
        labels.append(pos)
        pos += 1 + data[pos]
    at = draw.draw(st.sampled_from(labels))
    bigger = draw.draw(st.integers(data[at] + 1, 255))
    _check_question(data[:at] + bytes([bigger]) + data[at + 1:])


@FUZZ
@given(QUERY, st.integers(1, 64))
def test_dns_over_tcp_split_at_every_offset(data, _seed):
    """The TCP resolver reads a length and a message; split anywhere, the same question is answered."""
    framed = struct.pack('>H', len(data)) + data
    for cut in range(0, len(framed) + 1, max(1, len(framed) // 16)):
        assert _answers_over_tcp([framed[:cut], framed[cut:]]) == [_check_question(data)[2]]


class _Writer(object):
    def __init__(self):
        self.out = []

    def get_extra_info(self, key):
        return ('10.47.0.70', 5353)

    def write(self, data):
        self.out.append(data)

    async def drain(self):
        return None


def _answers_over_tcp(chunks):
    asked = []

    class Gateway(object):
        async def answer(self, data, peer):
            asked.append(GW.parse_question(data)[2])
            return data

    async def run():
        reader = asyncio.StreamReader()
        for chunk in chunks:
            reader.feed_data(chunk)
        reader.feed_eof()
        try:
            await GW.Gateway.dns_tcp(Gateway(), reader, _Writer())
        except asyncio.IncompleteReadError:
            pass
    asyncio.run(run())
    return asked


# --- TLS ClientHellos -----------------------------------------------------------------------------

def _ext(etype, data):
    return struct.pack('>HH', etype, len(data)) + data


def _sni(name):
    entry = b'\x00' + struct.pack('>H', len(name)) + name
    return _ext(0, struct.pack('>H', len(entry)) + entry)


def _hello(exts, session=b'', suites=b'\x13\x01\x13\x02', random32=b'\x00' * 32):
    body = b'\x03\x03' + random32 + bytes([len(session)]) + session + struct.pack('>H', len(suites)) + suites
    body += b'\x01\x00' + struct.pack('>H', len(exts)) + exts
    return b'\x01' + struct.pack('>I', len(body))[1:] + body


OTHER_EXT = st.tuples(st.integers(1, 0xffff).filter(lambda t: t != GW.EXT_ECH), st.binary(max_size=40))


@st.composite
def client_hellos(draw, ech=False):
    """(body, name, the offset of the name) of a ClientHello with other extensions in any order."""
    name = draw(HOSTNAME).encode('ascii')
    others = draw(st.lists(OTHER_EXT, max_size=6, unique_by=lambda e: e[0]))
    exts = [_ext(t, d) for t, d in others]
    exts.insert(draw(st.integers(0, len(exts))), _sni(name))
    if ech:
        exts.insert(draw(st.integers(0, len(exts))), _ext(GW.EXT_ECH, draw(st.binary(max_size=60))))
    session = draw(st.binary(max_size=32))
    body = _hello(b''.join(exts), session=session, random32=draw(st.binary(min_size=32, max_size=32)))
    return body, name.decode('ascii')


def _check_hello(body, name=None):
    """parse_client_hello never raises, and any name it gives is the one present (``name`` when known)."""
    got, why = GW.parse_client_hello(body)
    assert (got is None) is (why is not None) and why in (None, 'malformed', 'no-sni', 'ech')
    if got is not None:
        assert GW.hostname(got) == got and re.fullmatch(r'[a-z0-9_.-]{1,253}', got), got
        assert got.encode('ascii') in body.lower()
        if name is not None:
            assert got == name
    return got, why


@FUZZ
@given(st.binary(max_size=800))
def test_client_hello_arbitrary_bytes(body):
    _check_hello(body)


@FUZZ
@given(st.binary(max_size=400))
def test_client_hello_arbitrary_extensions(exts):
    body = _hello(exts)
    _check_hello(body)


@FUZZ
@given(client_hellos())
def test_client_hello_parsed_exactly(hello):
    body, name = hello
    assert _check_hello(body, name) == (name, None)


@FUZZ
@example((_hello(_sni(b'api.example.test')), 'api.example.test'), b'\n', True)
@example((_hello(_sni(b'api.example.test')), 'api.example.test'), b'\r\nX: y', True)
@given(client_hellos(), st.one_of(st.sampled_from([b'\n', b'\r\n', b'\r', b'\x00', b':', b' ', b'.', b'\x85']),
                                  st.binary(min_size=1, max_size=2)), st.booleans())
def test_client_hello_name_with_a_foreign_byte(hello, extra, at_end):
    """A server name with any byte added (a CR, an LF, a NUL, a colon...) is that name or refused: the name
    goes into 'CONNECT <name>:443' to the proxy."""
    body, name = hello
    raw = (name.encode('ascii') + extra) if at_end else (extra + name.encode('ascii'))
    exts = _sni(raw)
    got, _why = _check_hello(_hello(exts))
    assert got is None or got.encode('ascii') == raw.lower().rstrip(b'.')


@FUZZ
@given(client_hellos(ech=True))
def test_client_hello_with_ech_anywhere_is_refused(hello):
    body, name = hello
    assert _check_hello(body, name) == (None, 'ech')


@FUZZ
@given(client_hellos())
def test_client_hello_truncated_at_every_offset(hello):
    """A ClientHello cut anywhere (a record split there: relay_tls reads one record) is refused whole."""
    body, name = hello
    for cut in range(len(body)):
        assert _check_hello(body[:cut], name)[0] is None, cut


def _length_fields(body):
    """The offsets and sizes of every length field of a ClientHello built by _hello."""
    fields = [(1, 3)]
    pos = 4 + 2 + 32
    fields.append((pos, 1))
    pos += 1 + body[pos]
    fields.append((pos, 2))
    pos += 2 + struct.unpack('>H', body[pos:pos + 2])[0]
    fields.append((pos, 1))
    pos += 1 + body[pos]
    fields.append((pos, 2))
    pos += 2
    while pos < len(body):
        etype, elen = struct.unpack('>HH', body[pos:pos + 4])
        fields.append((pos + 2, 2))
        if etype == 0:
            fields += [(pos + 4, 2), (pos + 7, 2)]
        pos += 4 + elen
    return fields


@FUZZ
@given(client_hellos(), st.data())
def test_client_hello_oversized_lengths(hello, data):
    body, name = hello
    at, size = data.draw(st.sampled_from(_length_fields(body)))
    value = int.from_bytes(body[at:at + size], 'big')
    assume(value < (1 << (8 * size)) - 1)
    bigger = data.draw(st.integers(value + 1, (1 << (8 * size)) - 1))
    changed = body[:at] + bigger.to_bytes(size, 'big') + body[at + size:]
    # refused, or (a shifted reading that happens to be a whole ClientHello again) exactly the name present
    _check_hello(changed, name)
    if at in (1, len(body) - len(name) - 2) or (at == _length_fields(body)[4][0]):
        assert _check_hello(changed, name)[0] is None    # the message, the name, the extensions: past the end


@FUZZ
@given(client_hellos())
def test_relay_tls_record_split_at_every_offset(hello):
    """relay_tls reads one record whatever the writes' boundaries: the same name, or nothing."""
    body, name = hello
    record = b'\x16\x03\x01' + struct.pack('>H', len(body)) + body
    for cut in range(0, len(record) + 1, max(1, len(record) // 24)):
        assert _relay_tls([record[:cut], record[cut:]]) == ['%s:443' % name]
    # the ClientHello in two records (RFC 8446 5.1 allows it): refused, never a prefix of the name
    for cut in range(1, len(body), max(1, len(body) // 24)):
        two = b'\x16\x03\x01' + struct.pack('>H', cut) + body[:cut]
        two += b'\x16\x03\x01' + struct.pack('>H', len(body) - cut) + body[cut:]
        assert _relay_tls([two]) == []


def _relay_tls(chunks):
    targets = []

    class Gateway(object):
        def count(self, net, what):
            pass

        async def through_proxy(self, net, target, first, reader, writer):
            targets.append(target)

    async def run():
        reader = asyncio.StreamReader()
        for chunk in chunks:
            reader.feed_data(chunk)
        reader.feed_eof()
        try:
            await GW.Gateway.relay_tls(Gateway(), None, reader, _Writer())
        except asyncio.IncompleteReadError:
            pass
    asyncio.run(run())
    return targets


# --- plain HTTP heads -----------------------------------------------------------------------------

TOKEN = st.text(alphabet='ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz-', min_size=1, max_size=12)
VALUE = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=30)
PATH = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7e), max_size=30).map(lambda p: '/' + p)


def _host_of(head):
    """The one Host header's value of a head the parser accepted, as the parser must have read it."""
    lines = head.decode('latin-1')[:-4].split('\r\n')[1:]
    hosts = [line.split(':', 1)[1].strip() for line in lines if line.split(':', 1)[0].strip().lower() == 'host']
    assert len(hosts) == 1, hosts
    return hosts[0]


def _check_head(head):
    out = GW.absolute_request(head)
    if out is None:
        return None
    host = _host_of(head)
    method, path = head.split(b' ', 2)[:2]
    first = out.split(b'\r\n', 1)[0]
    assert first == b'%s http://%s%s %s' % (method, host.encode('latin-1'), path, head.split(b'\r\n', 1)[0].split(
        b' ')[2])
    assert GW.hostname(host.rsplit(':', 1)[0] if ':' in host else host) is not None
    assert out.endswith(b'\r\nConnection: close\r\n\r\n') and out.count(b'\r\n\r\n') == 1
    for line in out.decode('latin-1')[:-4].split('\r\n')[1:]:
        assert line.split(':', 1)[0].strip().lower() not in ('proxy-authorization', 'proxy-connection',
                                                             'keep-alive') or line == 'Connection: close'
    return out


@FUZZ
@given(st.binary(max_size=400))
def test_absolute_request_arbitrary_bytes(data):
    _check_head(data)
    _check_head(data + b'\r\n\r\n')


@FUZZ
@given(st.sampled_from(['GET', 'POST', 'PUT']), PATH, HOSTNAME, st.one_of(st.none(), st.integers(1, 65535)),
       st.lists(st.tuples(TOKEN, VALUE), max_size=5), st.integers(0, 5))
def test_absolute_request_well_formed(method, path, host, port, headers, at):
    assume(all(key.lower() != 'host' for key, _v in headers))
    authority = host if port is None else '%s:%d' % (host, port)
    lines = ['%s: %s' % h for h in headers]
    lines.insert(min(at, len(lines)), 'Host: %s' % authority)
    head = ('\r\n'.join(['%s %s HTTP/1.1' % (method, path)] + lines) + '\r\n\r\n').encode('latin-1')
    out = _check_head(head)
    assert out is not None
    assert out.startswith(('%s http://%s%s HTTP/1.1\r\n' % (method, authority, path)).encode('latin-1'))
    for cut in range(len(head)):
        assert _check_head(head[:cut]) is None, cut
    # a second Host header, whatever its value: refused
    two = head[:-2] + b'Host: other.example.test\r\n\r\n'
    assert _check_head(two) is None


@FUZZ
@given(HOSTNAME, st.sampled_from(['\r', '\n', '\x00', ' ', '\t', '@', '/', '\x7f', '\x85']), st.integers(0, 30))
def test_absolute_request_host_with_a_foreign_character(host, char, at):
    at = min(at, len(host))
    bad = host[:at] + char + host[at:]
    head = ('GET / HTTP/1.1\r\nHost: %s\r\n\r\n' % bad).encode('latin-1')
    out = _check_head(head)
    if out is not None:  # only surrounding blanks may go: the name is then exactly the one present
        assert char in ' \t' and (at == 0 or at == len(host)) and _host_of(head) == host
