# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""pi-dispatch credential interceptor: a mitmproxy addon (docs/credentials.md).

A job holds a placeholder (``pi-placeholder-<credential>-<32 hex>``) instead of each declared secret.
This addon, in the interceptor container, terminates TLS only for a host a credential is bound to;
every other host passes through untouched (mitmproxy never decrypts it). On a terminated connection,
for each request it decides, in this order (:func:`decide`):

1. ``TRACE``/``TRACK`` are refused (they echo the request, with whatever was swapped in, back).
2. The request's Host must be the SNI the client sent, which must be the bound host.
3. A request carrying a real secret (any credential's, anywhere: a header, the URL, the body) is
   refused: the job was never given one, so it was taken from somewhere.
4. Every placeholder in the request is looked up: an unknown one, one bound to another host, one in
   any place but its credential's declared header, or one issued to another job than the client's,
   is refused.
5. Each placeholder in its declared place is replaced by the secret, read from its file now (a
   changed file takes effect on the next request, with no restart).

Responses from a bound host have every secret replaced by ``[redacted:<credential>]``. Every decision
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

CONFIG = os.environ.get('PI_INTERCEPTOR_CONFIG', '/etc/pi-interceptor/credentials.json')
JOBS_DIR = os.environ.get('PI_INTERCEPTOR_JOBS', '/run/pi-interceptor/jobs')
MAX_SECRET_BYTES = 8192
MAX_JOB_FILE = 65536
PLACEHOLDER_RE = re.compile(r'pi-placeholder-[a-z][a-z0-9-]{0,31}-[0-9a-f]{32}')
# What a request may carry before it is scanned (a larger body is refused, not passed unscanned).
MAX_SCANNED_BODY = 32 * 1024 * 1024
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
    """What :func:`decide` looks at: the method, the target, the headers (a list of pairs), the path and the body."""

    def __init__(self, method, host, port, sni, host_header, headers, path, body):
        self.method = method
        self.host = (host or '').lower()
        self.port = port
        self.sni = (sni or '').lower()
        self.host_header = (host_header or '').lower()
        self.headers = list(headers)
        self.path = path or ''
        self.body = body or b''


class Decision(object):
    def __init__(self, refused=None, credential=None, job=None, headers=None, swapped=()):
        self.refused = refused          # the reason, or None
        self.credential = credential    # the credential concerned, when one is
        self.job = job
        self.headers = headers          # the headers to send, when anything was swapped
        self.swapped = list(swapped)    # the credentials swapped in

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


def decide(request, creds, jobs, secret_of, client_job=None):
    """The decision on one request to a terminated (bound) host; see the module's docstring."""
    if request.method.upper() in REFUSED_METHODS:
        return Decision('trace', job=client_job)
    bound = [c for c in creds if c.host == request.host and c.port == request.port]
    host_only = request.host_header.rsplit(':', 1)[0] if request.host_header.count(':') == 1 else request.host_header
    if not bound or request.sni != request.host or host_only.strip('[]') != request.host:
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
    headers = list(request.headers)
    swapped = []
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
            if cred.name not in swapped:
                swapped.append(cred.name)
            job = token_job
    return Decision(None, job=job, headers=headers if swapped else None, swapped=swapped)


def _has_basic(value, token):
    basic = _basic_parts(value)
    return bool(basic) and token in basic[2]


def redact(data, pairs):
    """``data`` (bytes) with every secret of ``pairs`` [(name, secret)] replaced; (bytes, count)."""
    count = 0
    for name, secret in pairs:
        needle = secret.encode('utf-8')
        found = data.count(needle)
        if found:
            data = data.replace(needle, ('[redacted:%s]' % name).encode('ascii'))
            count += found
    return data, count


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
        named = flow.request.headers.get('X-Pi-Client')
        if named:
            self.clients[flow.client_conn.id] = named.strip()

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
        if not self._bound(flow.request.host, flow.request.port) or not flow.client_conn.tls_established:
            return
        self.jobs.refresh()
        client = self._client(flow.client_conn)
        client_job = self.jobs.job_of(client) if client else None
        body = flow.request.get_content(strict=False) or b''
        req = Request(flow.request.method, flow.request.host, flow.request.port, flow.client_conn.sni,
                      flow.request.host_header, flow.request.headers.items(multi=True), flow.request.path, body)
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
        if decision.headers is not None:
            for name in set(n.lower() for n, _v in req.headers):
                del flow.request.headers[name]
            for name, value in decision.headers:
                flow.request.headers.add(name, value)
            emit(decision.record(req, client))

    def response(self, flow):
        if not flow.metadata.get('pi_bound') or flow.metadata.get('pi_refused') or flow.response is None:
            return
        pairs = []
        for cred in self.creds:
            try:
                pairs.append((cred.name, self.secrets.get(cred.secret)))
            except SecretError:
                continue
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
