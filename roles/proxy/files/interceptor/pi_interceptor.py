# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""pi-dispatch credential interceptor: a mitmproxy addon (docs/credentials.md).

A job holds a placeholder (``pi-placeholder-<credential>-<32 hex>``) instead of each declared secret.
This addon, in the interceptor container, terminates TLS only for a host a credential is bound to;
every other host passes through untouched (mitmproxy never decrypts it). On a terminated connection,
for each request it decides, in this order (:func:`decide`):

1. ``TRACE``/``TRACK`` are refused (they echo the request, with whatever was swapped in, back).
2. The request target must be origin-form (``/path?query``): an absolute-form target
   (``https://other.host/...``) names a host the server routes by instead of Host (RFC 9112 3.2.2), and
   authority-form (``CONNECT``) and asterisk-form (``*``) have no place inside the bound tunnel.
3. The request's Host (exactly one, ``host`` or ``host:port`` in canonical form, or HTTP/2's
   ``:authority``) must be the SNI the client sent, which must be the bound host and port.
4. A request carrying a real secret (any credential's, anywhere: a header, the URL, the body) is
   refused: the job was never given one, so it was taken from somewhere.
5. Every placeholder in the request is looked up: an unknown one, one bound to another host, one in
   any place but its credential's declared header, or one issued to another job than the client's,
   is refused; so is any placeholder from a client whose job cannot be named (its address is on no
   job's network), since nothing then says the placeholder is the client's own.
6. Each placeholder in its declared place is replaced by the secret, read from its file now (a
   changed file takes effect on the next request, with no restart).

Responses from a bound host have every secret replaced by ``[redacted:<credential>]``, and so are its
percent- and JSON-escaped copies and the Basic values this addon made from it (:func:`derived_forms`).
Request bodies are bounded before they are buffered (mitmproxy's ``body_size_limit``, set by the
entrypoint to :data:`MAX_SCANNED_BODY`: by Content-Length before a byte of the body is read, and by the
bytes read for a chunked body). Every decision
that refuses is recorded as one JSON line on stdout (the container's log) naming the job, the client,
the host, the credential and the reason; never a header value, the URL's path or query, a body, a
placeholder or a secret. The pure part (everything above the mitmproxy glue) runs without mitmproxy.
"""

import base64
import binascii
import json
import os
import re
import stat
import sys
import time
from urllib.parse import quote

CONFIG = os.environ.get('PI_INTERCEPTOR_CONFIG', '/etc/pi-interceptor/credentials.json')
JOBS_DIR = os.environ.get('PI_INTERCEPTOR_JOBS', '/run/pi-interceptor/jobs')
MAX_SECRET_BYTES = 8192
MAX_JOB_FILE = 65536
PLACEHOLDER_RE = re.compile(r'pi-placeholder-[a-z][a-z0-9-]{0,31}-[0-9a-f]{32}')
# What a request may carry before it is scanned (a larger body is refused, not passed unscanned). The
# entrypoint gives mitmproxy the same bound (body_size_limit), so a larger body is never buffered.
MAX_SCANNED_BODY = 32 * 1024 * 1024
# A Host header or :authority in canonical form: a lowercase name or a bracketed IPv6 literal, then an
# optional port without leading zeros. Anything else (userinfo, a second colon, "h:", "h:0443") is refused.
AUTHORITY_RE = re.compile(r'(\[[0-9a-f:.]+\]|[a-z0-9](?:[a-z0-9.-]{0,251}[a-z0-9])?)(?::([1-9][0-9]{0,4}))?\Z')
REFUSED_METHODS = ('TRACE', 'TRACK')


class SecretError(Exception):
    """A secret file that cannot be used (the message names the file, never its content)."""


def read_secret_file(path):
    """The secret in ``path``, stripped of one trailing newline; SecretError names the rule broken."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise SecretError('%s cannot be read (%s)' % (path, exc.strerror))
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
        raise SecretError('%s is not a regular file' % path)
    if st.st_size < 1 or st.st_size > MAX_SECRET_BYTES:
        raise SecretError('%s is empty or larger than %d bytes' % (path, MAX_SECRET_BYTES))
    with open(path, 'rb') as handle:
        data = handle.read(MAX_SECRET_BYTES + 1)
    if data.endswith(b'\r\n'):
        data = data[:-2]
    elif data.endswith(b'\n'):
        data = data[:-1]
    if not data or any(byte < 0x21 or byte > 0x7e for byte in data):
        raise SecretError('%s must hold one line of printable ASCII without spaces' % path)
    return data.decode('ascii')


class Secrets(object):
    """Each credential's secret, read again whenever its file changed (inode, size or mtime)."""

    def __init__(self, reader=read_secret_file):
        self._reader = reader
        self._cache = {}

    def get(self, path):
        try:
            st = os.stat(path)
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            key = None
        cached = self._cache.get(path)
        if cached is not None and key is not None and cached[0] == key:
            return cached[1]
        value = self._reader(path)
        self._cache[path] = (key, value)
        return value


class Credential(object):
    __slots__ = ('name', 'host', 'port', 'scheme', 'header', 'secret')

    def __init__(self, name, host, port, scheme, header, secret):
        self.name = name
        self.host = host
        self.port = port
        self.scheme = scheme
        self.header = header.lower()
        self.secret = secret


def load_config(text):
    """The interceptor's credentials (rendered by the collection; never holds a secret value)."""
    data = json.loads(text)
    if not isinstance(data, dict) or data.get('version') != 1 or not isinstance(data.get('credentials'), list):
        raise ValueError('the interceptor configuration is not version 1 with a credentials list')
    creds = []
    for index, item in enumerate(data['credentials']):
        try:
            creds.append(Credential(item['name'], item['host'].lower(), int(item['port']), item['scheme'],
                                    item['header'], item['secret']))
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ValueError('credential %d of the interceptor configuration is malformed (%s)' % (index, exc))
    return creds


class Jobs(object):
    """Placeholders issued per job (one JSON file per job, written by the job-network API)."""

    def __init__(self, folder=JOBS_DIR):
        self.folder = folder
        self._stamp = None
        self.by_placeholder = {}   # placeholder -> (job, credential name)
        self.by_network = []       # (ipaddress network, job)

    def refresh(self):
        import ipaddress
        try:
            names = sorted(n for n in os.listdir(self.folder) if n.endswith('.json'))
            stamp = []
            for name in names:
                st = os.stat(os.path.join(self.folder, name))
                stamp.append((name, st.st_ino, st.st_size, st.st_mtime_ns))
            stamp = tuple(stamp)
        except OSError:
            self.by_placeholder, self.by_network, self._stamp = {}, [], None
            return
        if stamp == self._stamp:
            return
        by_placeholder, by_network = {}, []
        for name in names:
            try:
                with open(os.path.join(self.folder, name), 'rb') as handle:
                    record = json.loads(handle.read(MAX_JOB_FILE).decode('utf-8'))
                job = str(record['job'])
                for cred, value in sorted(record.get('placeholders', {}).items()):
                    by_placeholder[value] = (job, cred)
                for subnet in record.get('subnets', []):
                    by_network.append((ipaddress.ip_network(subnet, strict=False), job))
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue
        self.by_placeholder, self.by_network, self._stamp = by_placeholder, by_network, stamp

    def job_of(self, address):
        import ipaddress
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return None
        for net, job in self.by_network:
            if ip in net:
                return job
        return None


class Request(object):
    """What :func:`decide` looks at: the method, the target, the headers (a list of pairs), the path and the body.

    ``authority`` is what the request line named besides the path (HTTP/1: empty for origin-form, the
    authority of an absolute-form or authority-form target; HTTP/2: ``:authority``), ``http_version`` the
    protocol the client spoke."""

    def __init__(self, method, host, port, sni, host_header, headers, path, body, authority='',
                 http_version='HTTP/1.1'):
        self.method = method
        self.authority = (authority or '').lower()
        self.http_version = http_version or 'HTTP/1.1'
        self.host = (host or '').lower()
        self.port = port
        self.sni = (sni or '').lower()
        self.host_header = (host_header or '').lower()
        self.headers = list(headers)
        self.path = path or ''
        self.body = body or b''


class Decision(object):
    def __init__(self, refused=None, credential=None, job=None, headers=None, swapped=(), made=()):
        self.refused = refused          # the reason, or None
        self.credential = credential    # the credential concerned, when one is
        self.job = job
        self.headers = headers          # the headers to send, when anything was swapped
        self.swapped = list(swapped)    # the credentials swapped in
        self.made = list(made)          # (credential, header value) made from a secret (redacted in the answer)

    def record(self, request, client):
        return dict(time=round(time.time(), 3), event='refused' if self.refused else 'swapped',
                    reason=self.refused, credential=self.credential, job=self.job, client=client,
                    host=request.host, port=request.port, method=request.method, swapped=self.swapped)


def _basic_parts(value):
    """(scheme word, user, password) of a Basic authorization value, or None."""
    words = value.split(None, 1)
    if len(words) != 2 or words[0].lower() != 'basic':
        return None
    try:
        raw = base64.b64decode(words[1].strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    try:
        decoded = raw.decode('utf-8')
    except UnicodeDecodeError:
        decoded = raw.decode('latin-1')   # RFC 7617's historical charset: still scanned, never skipped
    if ':' not in decoded:
        return None
    user, password = decoded.split(':', 1)
    return words[0], user, password


def _texts(request):
    """Every place of a request a token can hide in, as (place, text): header values (a Basic value
    decoded as well), the path with its query, and the body."""
    places = []
    for name, value in request.headers:
        places.append(('header:' + name.lower(), value))
        basic = _basic_parts(value)
        if basic:
            places.append(('header:' + name.lower() + ':basic', basic[1] + ':' + basic[2]))
    places.append(('url', request.path))
    places.append(('body', request.body.decode('latin-1')))
    return places


def _swap(cred, value, placeholder, secret):
    """The declared header's value with ``placeholder`` replaced by ``secret``, or None when the value
    is not exactly in the declared form."""
    if cred.scheme == 'header':
        return secret if value == placeholder else None
    if cred.scheme == 'bearer':
        words = value.split(None, 1)
        if len(words) == 2 and words[0].lower() == 'bearer' and words[1] == placeholder:
            return '%s %s' % (words[0], secret)
        return None
    basic = _basic_parts(value)
    if basic and basic[2] == placeholder:
        return '%s %s' % (basic[0], base64.b64encode(('%s:%s' % (basic[1], secret)).encode('utf-8')).decode('ascii'))
    return None


def _names_the_target(value, host, port):
    """Whether a Host value or an authority (lowercase) is exactly ``host``, with ``port`` or no port."""
    match = AUTHORITY_RE.match(value)
    if not match:
        return False
    name, named_port = match.group(1), match.group(2)
    if name.startswith('['):
        name = name[1:-1]
    return name == host and (named_port is None or int(named_port) == port)


def target_form_refused(request):
    """Whether the request target is anything but origin-form (``/path``), in which a host or a whole
    other request could be named: absolute-form, authority-form (CONNECT), asterisk-form (``*``)."""
    if request.method.upper() == 'CONNECT' or not request.path.startswith('/'):
        return True
    # HTTP/1 origin-form has no authority; HTTP/2 always carries :authority, judged with Host below.
    return request.http_version.upper().startswith('HTTP/1') and request.authority != ''


def decide(request, creds, jobs, secret_of, client_job=None):
    """The decision on one request to a terminated (bound) host; see the module's docstring."""
    if request.method.upper() in REFUSED_METHODS:
        return Decision('trace', job=client_job)
    if target_form_refused(request):
        return Decision('request-target', job=client_job)
    bound = [c for c in creds if c.host == request.host and c.port == request.port]
    host_values = [v for n, v in request.headers if n.lower() == 'host']
    if (not bound or request.sni != request.host or len(host_values) > 1
            or not _names_the_target(request.host_header, request.host, request.port)
            or any(not _names_the_target(v.lower(), request.host, request.port) for v in host_values)
            or request.authority and not _names_the_target(request.authority, request.host, request.port)):
        return Decision('host-sni-mismatch', job=client_job)
    places = _texts(request)
    secrets = []
    for cred in creds:
        try:
            secrets.append((cred, secret_of(cred)))
        except SecretError:
            if cred in bound:
                return Decision('secret-unavailable', credential=cred.name, job=client_job)
    for cred, secret in secrets:
        if any(secret in text for _place, text in places):
            return Decision('real-credential', credential=cred.name, job=client_job)
    declared = dict((c.header, c) for c in bound)
    found = []
    for place, text in places:
        for token in PLACEHOLDER_RE.findall(text):
            issued = jobs.by_placeholder.get(token)
            if issued is None:
                return Decision('unknown-placeholder', job=client_job)
            job, cred_name = issued
            cred = next((c for c in creds if c.name == cred_name), None)
            # A refusal names the client's job when its address told it, else the placeholder's.
            blamed = client_job or job
            if cred is None or cred.host != request.host or cred.port != request.port:
                return Decision('placeholder-elsewhere', credential=cred_name, job=blamed)
            if client_job is not None and job != client_job:
                return Decision('placeholder-of-another-job', credential=cred_name, job=client_job)
            header_place = place.split(':')[1] if place.startswith('header:') else None
            if header_place != cred.header or declared.get(header_place) is not cred:
                return Decision('placeholder-elsewhere', credential=cred_name, job=blamed)
            if place.endswith(':basic') and token in text.split(':', 1)[0]:
                return Decision('placeholder-elsewhere', credential=cred_name, job=blamed)
            found.append((token, cred, job))
    if found and client_job is None:
        # Nothing names the client's job, so nothing says the placeholder is its own (docs/credentials.md).
        return Decision('job-unknown', credential=found[0][1].name, job=found[0][2])
    headers = list(request.headers)
    swapped = []
    made = []
    job = client_job
    secret_by_name = dict((c.name, s) for c, s in secrets)
    for token, cred, token_job in found:
        for index, (name, value) in enumerate(headers):
            if name.lower() != cred.header or token not in value and not _has_basic(value, token):
                continue
            new = _swap(cred, value, token, secret_by_name[cred.name])
            if new is None:
                return Decision('placeholder-elsewhere', credential=cred.name, job=token_job)
            headers[index] = (name, new)
            if cred.scheme == 'basic':
                made.append((cred.name, new))
            if cred.name not in swapped:
                swapped.append(cred.name)
            job = token_job
    return Decision(None, job=job, headers=headers if swapped else None, swapped=swapped, made=made)


def _has_basic(value, token):
    basic = _basic_parts(value)
    return bool(basic) and token in basic[2]


def derived_forms(secret):
    """``secret`` as a response may carry it: itself, percent-encoded (either case of hex digits), and
    JSON-escaped (``\\"``, ``\\\\``, ``\\/``); each distinct form once."""
    forms = [secret]
    encoded = quote(secret, safe='')
    forms += [encoded, re.sub(r'%[0-9A-F]{2}', lambda m: m.group(0).lower(), encoded)]
    escaped = secret.replace('\\', '\\\\').replace('"', '\\"')
    forms += [escaped, escaped.replace('/', '\\/')]
    out = []
    for form in forms:
        if form not in out:
            out.append(form)
    return out


def redact(data, pairs):
    """``data`` (bytes) with every value of ``pairs`` [(name, value)] replaced, longest value first (so a
    value inside a longer one never leaves a piece of the longer one behind); (bytes, count)."""
    count = 0
    for name, value in sorted(pairs, key=lambda pair: -len(pair[1])):
        needle = value.encode('utf-8')
        found = data.count(needle) if needle else 0
        if found:
            data = data.replace(needle, ('[redacted:%s]' % name).encode('ascii'))
            count += found
    return data, count


def redaction_pairs(secrets, swapped_values=()):
    """[(name, value)] to redact: each secret's :func:`derived_forms`, and each header value the swap
    made (a Basic value is the base64 of ``user:secret``, which no plain form matches)."""
    pairs = []
    for name, secret in secrets:
        pairs += [(name, form) for form in derived_forms(secret)]
    pairs += list(swapped_values)
    for name, value in swapped_values:   # the token alone, as a response echoing the header would carry it
        words = value.split(None, 1)
        if len(words) == 2 and words[0].lower() == 'basic':
            pairs.append((name, words[1].strip()))
    return pairs


def client_address(values):
    """The job's address squid named in X-Pi-Client: exactly one value, an IP literal; else None."""
    import ipaddress
    if len(values) != 1:
        return None
    try:
        return str(ipaddress.ip_address(values[0].strip()))
    except ValueError:
        return None


def emit(record, stream=None):
    stream = stream or sys.stdout
    stream.write(json.dumps(record, sort_keys=True) + '\n')
    stream.flush()


# --- the mitmproxy glue -------------------------------------------------------------------------------------
try:  # pragma: no cover - exercised in the interceptor container (tests/integration/test_credentials.py)
    from mitmproxy import http as _http
except ImportError:  # the unit tests import the pure part above without mitmproxy
    _http = None


class Interceptor(object):  # pragma: no cover - runs inside mitmproxy
    def __init__(self):
        self.secrets = Secrets()
        self.jobs = Jobs()
        self._config_stamp = None
        self.creds = []
        self.clients = {}   # client connection id -> the job's address squid named (X-Pi-Client)

    def _config(self):
        st = os.stat(CONFIG)
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        if stamp != self._config_stamp:
            with open(CONFIG) as handle:
                self.creds = load_config(handle.read())
            self._config_stamp = stamp
        return self.creds

    def _bound(self, host, port):
        return any(c.host == (host or '').lower() and c.port == port for c in self._config())

    def http_connect(self, flow):
        # Only the connection's first CONNECT, in the clear, is squid's: one inside a terminated tunnel is
        # the job's own (and refused in request()), and a name once taken is never replaced.
        conn = flow.client_conn
        if conn.tls_established or conn.id in self.clients:
            return
        named = client_address(flow.request.headers.get_all('X-Pi-Client'))
        if named:
            self.clients[conn.id] = named

    def client_disconnected(self, client):
        self.clients.pop(client.id, None)

    def _client(self, conn):
        return self.clients.get(conn.id) or (conn.peername[0] if conn.peername else None)

    def tls_clienthello(self, data):
        host, port = data.context.server.address
        sni = (data.client_hello.sni or '').lower()
        if not self._bound(host, port):
            data.ignore_connection = True   # never terminated: the bytes pass through untouched
            return
        if sni != host.lower():
            # Not terminated either: the hello goes on untouched toward a discard address, so the job gets
            # no certificate for a name it chose and the tunnel closes.
            self.jobs.refresh()
            client = self._client(data.context.client)
            emit(dict(time=round(time.time(), 3), event='refused', reason='sni-not-bound-host', credential=None,
                      job=self.jobs.job_of(client) if client else None, client=client, host=host.lower(), port=port,
                      method='CONNECT', swapped=[]))
            data.context.server.address = ('127.0.0.1', 9)
            data.ignore_connection = True

    def request(self, flow):
        # TLS is terminated only for a bound host whose hello named it (tls_clienthello): every request on
        # such a connection is decided, whatever host its request line or Host names (never passed undecided).
        if not flow.client_conn.tls_established:
            return
        self.jobs.refresh()
        client = self._client(flow.client_conn)
        client_job = self.jobs.job_of(client) if client else None
        body = flow.request.get_content(strict=False) or b''
        req = Request(flow.request.method, flow.request.host, flow.request.port, flow.client_conn.sni,
                      flow.request.host_header, flow.request.headers.items(multi=True), flow.request.path, body,
                      authority=flow.request.authority, http_version=flow.request.http_version)
        if len(body) > MAX_SCANNED_BODY:
            decision = Decision('body-too-large', job=client_job)
        else:
            decision = decide(req, self.creds, self.jobs, lambda c: self.secrets.get(c.secret), client_job)
        flow.metadata['pi_bound'] = True
        if decision.refused:
            emit(decision.record(req, client))
            flow.response = _http.Response.make(
                403, ('refused by the pi-dispatch credential interceptor: %s\n' % decision.refused).encode('ascii'),
                {'content-type': 'text/plain', 'connection': 'close'})
            flow.metadata['pi_refused'] = True
            return
        flow.metadata['pi_made'] = decision.made
        if decision.headers is not None:
            for name in set(n.lower() for n, _v in req.headers):
                del flow.request.headers[name]
            for name, value in decision.headers:
                flow.request.headers.add(name, value)
            emit(decision.record(req, client))

    def error(self, flow):
        # mitmproxy's body_size_limit (the entrypoint sets it to MAX_SCANNED_BODY) refused a body before
        # buffering it: by Content-Length before a byte was read, or by the bytes read of a chunked body.
        if flow.error is None or 'body_size_limit' not in (flow.error.msg or '') or flow.request is None:
            return
        if not flow.client_conn.tls_established:
            return
        self.jobs.refresh()
        client = self._client(flow.client_conn)
        req = Request(flow.request.method, flow.request.host, flow.request.port, flow.client_conn.sni,
                      flow.request.host_header, (), flow.request.path, b'')
        emit(Decision('body-too-large', job=self.jobs.job_of(client) if client else None).record(req, client))

    def response(self, flow):
        if not flow.metadata.get('pi_bound') or flow.metadata.get('pi_refused') or flow.response is None:
            return
        secrets = []
        for cred in self.creds:
            try:
                secrets.append((cred.name, self.secrets.get(cred.secret)))
            except SecretError:
                continue
        pairs = redaction_pairs(secrets, flow.metadata.get('pi_made', ()))
        for name, value in list(flow.response.headers.items(multi=True)):
            new = redact(value.encode('latin-1'), pairs)[0].decode('latin-1')
            if new != value:
                flow.response.headers[name] = new
        content = flow.response.get_content(strict=False)
        if content:
            new, count = redact(content, pairs)
            if count:
                flow.response.content = new


if _http is not None:  # pragma: no cover
    addons = [Interceptor()]
