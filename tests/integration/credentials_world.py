"""The credential world on the real engine, shared by tests/integration/test_credentials.py and
benchmarks/credentials.py: site.yml deploys a proxy whose egress-credentials.json binds two credentials to
a fake provider; the interceptor, a direct client on its network and a job client on a job network.

:func:`build` makes it (about a minute: site.yml builds nothing when the images are current) and returns a
:class:`World`; :func:`cleanup` removes every container and network it made (also a killed run's).
Nothing leaves the machine: every name is a ``.test`` alias on an ``--internal`` network.
"""

import hashlib
import json
import os
import secrets
import shutil
import subprocess
import time

from conftest import ROOT, _remove_container, _remove_network, ansible_env

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import credentials as _credentials
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import interceptor as _interceptor

from conftest import SUFFIX  # noqa: E402  (the worker's suffix under pytest-xdist)
TOOLS_IMAGE = 'pi-dispatch-egress-tools:test'
INTERCEPTOR_IMAGE = os.environ.get('PI_EGRESS_IT_INTERCEPTOR_IMAGE', 'pi-dispatch-egress-interceptor:latest')
PROXY_IMAGE = os.environ.get('PI_EGRESS_IT_PROXY_IMAGE', 'pi-dispatch-egress-proxy:latest')
NET = 'pi-cred-net' + SUFFIX
UP = 'pi-cred-up' + SUFFIX
JOBNET = 'pi-cred-job' + SUFFIX
PROVIDER = 'pi-cred-provider' + SUFFIX
INTERCEPTOR = 'pi-cred-interceptor' + SUFFIX
PROXY = 'pi-cred-proxy' + SUFFIX
CLIENT = 'pi-cred-client' + SUFFIX
JOB_CLIENT = 'pi-cred-job-client' + SUFFIX
CONTAINERS = (JOB_CLIENT, CLIENT, PROXY, INTERCEPTOR, PROVIDER)
NETWORKS = (JOBNET, NET, UP)
LABEL = {'io.pi-dispatch.egress.test': 'credentials'}
NAMES = ['api.provider.test', 'other.provider.test', 'unbound.provider.test', 'unlisted.provider.test']
LISTED = ['api.provider.test', 'other.provider.test', 'unbound.provider.test']
JOB = 'job-cred-a'
OTHER_JOB = 'job-cred-b'

# argv: proxy host, proxy port, CONNECT host, SNI, Host header, method, path, CA file, header lines (JSON
# list of [name, value]). One JSON line back: the CONNECT status, the answer's status line and
# body, and the issuer of the certificate the client was shown; or the error.
CLIENT_SCRIPT = r'''
import json, socket, ssl, sys
proxy, port, host, sni, host_header, method, path, ca, headers = sys.argv[1:10]
out = dict(connect=None, status=None, body=None, issuer=None, error=None)
try:
    s = socket.create_connection((proxy, int(port)), timeout=10)
    s.sendall(("CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\n\r\n" % (host, host)).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(1)
        if not chunk:
            break
        head += chunk
    out["connect"] = head.split(b"\r\n")[0].decode("latin-1")
    ctx = ssl.create_default_context(cafile=ca)
    ctx.check_hostname = False
    t = ctx.wrap_socket(s, server_hostname=sni)
    issuer = dict(x[0] for x in t.getpeercert()["issuer"])
    out["issuer"] = issuer.get("commonName") or issuer.get("organizationName")
    lines = ["%s %s HTTP/1.1" % (method, path), "Host: %s" % host_header, "Connection: close"]
    lines += ["%s: %s" % (k, v) for k, v in json.loads(headers)]
    t.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    data = b""
    while True:
        chunk = t.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _sep, body = data.partition(b"\r\n\r\n")
    out["status"] = head.split(b"\r\n")[0].decode("latin-1")
    out["headers"] = head.decode("latin-1")
    out["body"] = body.decode("latin-1")
except Exception as exc:
    out["error"] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(out))
'''


# argv: proxy host, proxy port, CONNECT host, CA file, header lines (JSON), declared size, chunked (1/0), the
# most bytes to send. Sends zeros in 1 MiB pieces while a reader thread waits for the answer; stops at the
# answer, an error, the limit or 60 s. One JSON line back: the status line, the bytes sent, the seconds.
UPLOAD_SCRIPT = r'''
import json, select, socket, ssl, sys, time
proxy, port, host, ca, headers, size, chunked, most = sys.argv[1:9]
size, chunked, most = int(size), chunked == "1", int(most)
out = dict(connect=None, status=None, sent=0, seconds=None, error=None)
start = time.monotonic()
try:
    s = socket.create_connection((proxy, int(port)), timeout=10)
    s.sendall(("CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\n\r\n" % (host, host)).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(1)
        if not chunk:
            break
        head += chunk
    out["connect"] = head.split(b"\r\n")[0].decode("latin-1")
    ctx = ssl.create_default_context(cafile=ca)
    ctx.check_hostname = False
    t = ctx.wrap_socket(s, server_hostname=host)
    lines = ["POST /v1/upload HTTP/1.1", "Host: %s" % host, "Content-Type: application/octet-stream"]
    lines.append("Transfer-Encoding: chunked" if chunked else "Content-Length: %d" % size)
    lines += ["%s: %s" % (k, v) for k, v in json.loads(headers)]
    t.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    piece = b"\0" * (1 << 20)
    answer = b""
    while out["sent"] < most and time.monotonic() - start < 60:
        readable, writable, _x = select.select([t], [t], [], 5)
        if readable or t.pending():
            # Readable may be only TLS records with no data (a session ticket): never wait on them.
            t.settimeout(0.2)
            try:
                data = t.recv(65536)
            except (socket.timeout, ssl.SSLWantReadError):
                data = None
            t.settimeout(30)
            if data == b"":
                break
            answer += data or b""
            if b"\r\n" in answer:
                break
        if writable:
            n = min(len(piece), most - out["sent"])
            t.sendall(("%x\r\n" % n).encode() + piece[:n] + b"\r\n" if chunked else piece[:n])
            out["sent"] += n
    if b"\r\n" not in answer:
        if chunked and out["sent"] >= most:
            t.sendall(b"0\r\n\r\n")
        t.settimeout(30)
        while b"\r\n" not in answer:
            data = t.recv(65536)
            if not data:
                break
            answer += data
    out["status"] = answer.split(b"\r\n")[0].decode("latin-1") or None
except Exception as exc:
    out["error"] = "%s: %s" % (type(exc).__name__, exc)
out["seconds"] = round(time.monotonic() - start, 2)
print(json.dumps(out))
'''


def _wait_log(client, name, text, seconds=60):
    end = time.monotonic() + seconds
    logs = ''
    while time.monotonic() < end:
        logs = client.api.logs(name).decode('utf-8', 'replace')
        if text in logs:
            return
        time.sleep(0.5)
    raise AssertionError('%s did not print %r within %ss:\n%s' % (name, text, seconds, logs[-3000:]))


class World(object):
    def __init__(self, client, folder):
        self.client = client
        self.folder = folder
        self.secret_dir = os.path.join(folder, 'secrets')
        self.jobs_dir = os.path.join(folder, 'jobs')
        self.share = os.path.join(folder, 'share')
        self.log_dir = os.path.join(folder, 'decisions')
        self.deploy_dir = os.path.join(folder, 'deploy')
        self.secret = {'anthropic': 'sk-ant-REAL-' + secrets.token_hex(20), 'other': 'ghp_REAL' + secrets.token_hex(20)}
        self.placeholders = {}

    def write_secret(self, name, value):
        path = os.path.join(self.secret_dir, name)
        tmp = path + '.new'
        with open(tmp, 'w') as handle:
            handle.write(value + '\n')
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
        self.secret[name] = value

    def request(self, host, header_pairs=(), sni=None, host_header=None, method='GET', path='/v1/messages',
                ca='-', via='interceptor', body=None, connect_headers=()):
        """One request from the direct client to the interceptor (``via='interceptor'``), or from the job
        client through squid (``via='job'``; ``via='return-port'`` dials the interceptor's way out instead).
        ``connect_headers``: more header lines on the CONNECT (what a job would forge)."""
        ca_path = '/share/interceptor-ca.pem' if ca == '-' else ca
        proxy, port, container = dict(interceptor=(INTERCEPTOR, 8080, CLIENT), job=(PROXY, 3128, JOB_CLIENT),
                                      **{'return-port': (PROXY, _interceptor.RETURN_PORT, JOB_CLIENT)})[via]
        script = CLIENT_SCRIPT
        if body is not None:   # this copy of the client script sends ``body`` after the headers
            script = CLIENT_SCRIPT.replace('t.sendall(("\\r\\n".join(lines) + "\\r\\n\\r\\n").encode())',
                                           't.sendall(("\\r\\n".join(lines) + "\\r\\n\\r\\n" + %r).encode())' % body)
            assert script != CLIENT_SCRIPT
            header_pairs = list(header_pairs) + [('Content-Type', 'application/x-www-form-urlencoded'),
                                                 ('Content-Length', str(len(body)))]
        if connect_headers:   # this copy sends them on the CONNECT, after Host
            extra = ''.join('%s: %s\\r\\n' % pair for pair in connect_headers)
            script = script.replace('Host: %s:443\\r\\n\\r\\n"', 'Host: %s:443\\r\\n' + extra + '\\r\\n"')
            assert extra and script.count(extra) == 1
        argv = ['python3', '-c', script, proxy, str(port), host, sni or host, host_header or host, method, path,
                ca_path, json.dumps([list(p) for p in header_pairs])]
        rc, out = self.client.containers.get(container).exec_run(['timeout', '30'] + argv)
        text = out.decode('utf-8', 'replace').strip().splitlines()
        assert text, 'the client printed nothing (rc %s)' % rc
        return json.loads(text[-1])

    def write_job(self, record):
        """The job's record, replaced whole (the interceptor reads it again when it changed)."""
        path = os.path.join(self.jobs_dir, record['job'] + '.json')
        with open(path + '.new', 'w') as handle:
            json.dump(record, handle)
        os.replace(path + '.new', path)

    def upload(self, host, header_pairs, size, chunked=False, send_at_most=None, via='job'):
        """A POST to ``host`` declaring ``size`` bytes (Content-Length, or chunked when ``chunked``) that sends
        zeros until the answer comes or ``send_at_most`` bytes went (bounded: at most 60 s). Returns the answer's
        status line, the bytes sent before it and the seconds it took, or the error."""
        proxy, port, container = dict(interceptor=(INTERCEPTOR, 8080, CLIENT), job=(PROXY, 3128, JOB_CLIENT))[via]
        argv = ['python3', '-c', UPLOAD_SCRIPT, proxy, str(port), host, '/share/interceptor-ca.pem',
                json.dumps([list(p) for p in header_pairs]), str(size), '1' if chunked else '0',
                str(send_at_most if send_at_most is not None else size)]
        rc, out = self.client.containers.get(container).exec_run(['timeout', '90'] + argv)
        text = out.decode('utf-8', 'replace').strip().splitlines()
        assert text, 'the upload client printed nothing (rc %s)' % rc
        return json.loads(text[-1])

    def provider_saw(self):
        rc, out = self.client.containers.get(PROVIDER).exec_run(['cat', '/tmp/fake-provider/requests.jsonl'])
        if rc != 0:
            return []
        return [json.loads(line) for line in out.decode('utf-8').splitlines() if line.strip()]

    def saw_marker(self, marker):
        return [r for r in self.provider_saw() if marker in r['path']]

    def records(self):
        logs = self.client.api.logs(INTERCEPTOR).decode('utf-8', 'replace')
        found = []
        for line in logs.splitlines():
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
        return found


def cleanup(client):
    for name in CONTAINERS:
        _remove_container(client, name)
    for name in NETWORKS:
        _remove_network(client, name)


def _network(client, name):
    net = client.networks.create(name, driver='bridge', internal=True, labels=LABEL)
    net.reload()
    return net.attrs['IPAM']['Config'][0]['Subnet']


def site(w, up_subnet, **more):
    """site.yml into the world's deployment folder (its egress-credentials.json already written)."""
    extra = {
        'egress_deploy_dir': w.deploy_dir, 'egress_proxy_name': PROXY, 'egress_proxy_upstream_network': UP,
        'egress_proxy_network_internal': True, 'egress_private_destinations': [up_subnet],
        'egress_allowlist_seed': [{'host': h, 'comment': 'fake provider'} for h in LISTED],
        'egress_proxy_install_debootstrap': False, 'egress_proxy_image': PROXY_IMAGE,
        'egress_proxy_gc_at_start': False, 'egress_decision_log_dir': w.log_dir,
        'egress_credentials_interceptor_name': INTERCEPTOR, 'egress_credentials_network': NET,
        'egress_credentials_interceptor_image': INTERCEPTOR_IMAGE,
        'egress_credentials_upstream_ca': os.path.join(w.share, 'provider-ca.pem'),
    }
    extra.update(more)
    # -vvv --diff: every module's arguments and results are in the output the secret must never appear in.
    proc = subprocess.run(['ansible-playbook', '-vvv', '--diff', '-i', 'localhost,', '-c', 'local',
                           os.path.join(ROOT, 'playbooks', 'site.yml'), '-e', json.dumps(extra)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900, env=ansible_env(), cwd=ROOT,
                          check=False)
    return proc.returncode, proc.stdout.decode('utf-8', 'replace')


def build(client, folder):
    """The world in ``folder`` (a fresh temporary folder); raises with site.yml's output when it fails."""
    w = World(client, folder)
    cleanup(client)
    for sub in (w.secret_dir, w.jobs_dir, w.share, w.deploy_dir):
        os.makedirs(sub, mode=0o700)
    os.chmod(w.share, 0o755)
    for name, value in w.secret.items():
        w.write_secret(name, value)
    declaration = {'version': 1, 'credentials': [
        {'name': 'anthropic', 'host': 'api.provider.test', 'port': 443, 'env': 'ANTHROPIC_API_KEY',
         'scheme': 'header', 'header': 'x-api-key', 'secret_file': os.path.join(w.secret_dir, 'anthropic')},
        {'name': 'other', 'host': 'other.provider.test', 'port': 443, 'env': 'OTHER_TOKEN',
         'scheme': 'bearer', 'secret_file': os.path.join(w.secret_dir, 'other')}]}
    with open(os.path.join(w.deploy_dir, _credentials.FILE_NAME), 'w') as handle:
        json.dump(declaration, handle)

    api = client.api
    try:
        up_subnet, job_subnet = _network(client, UP), _network(client, JOBNET)
        provider = api.create_container(
            TOOLS_IMAGE, ['python3', '/usr/local/bin/fake_provider.py'] + sum([['--name', n] for n in NAMES], []) +
            sum([['--require-key', hashlib.sha256(v.encode()).hexdigest()] for v in w.secret.values()], []),
            name=PROVIDER, detach=True, labels=LABEL, host_config=api.create_host_config(network_mode=UP),
            networking_config=api.create_networking_config({UP: api.create_endpoint_config(aliases=NAMES)}))
        api.start(provider['Id'])
        _wait_log(client, PROVIDER, 'fake provider ready')
        rc, ca = client.containers.get(PROVIDER).exec_run(['cat', '/tmp/fake-provider/ca.pem'])
        assert rc == 0
        with open(os.path.join(w.share, 'provider-ca.pem'), 'wb') as handle:
            handle.write(ca)

        # site.yml: the interceptor (its network, configuration and include), then the proxy mounting it.
        rc, out = site(w, up_subnet)
        w.site_output = out
        assert rc == 0, out[-6000:]
        w.jobs_dir = os.path.join(w.deploy_dir, 'credentials', 'jobs')
        ca_cert = os.path.join(w.deploy_dir, 'credentials', 'ca', _interceptor.CA_CERT)
        shutil.copy(ca_cert, os.path.join(w.share, 'interceptor-ca.pem'))
        client.networks.get(JOBNET).connect(PROXY)
        for name, net in ((CLIENT, NET), (JOB_CLIENT, JOBNET)):
            client.containers.run(TOOLS_IMAGE, ['sleep', 'infinity'], name=name, detach=True, network=net,
                                  labels=LABEL, volumes={w.share: {'bind': '/share', 'mode': 'ro'}})
        direct = client.api.inspect_container(CLIENT)['NetworkSettings']['Networks'][NET]['IPAddress']
        # The job's placeholders, recorded against the job, its network and the direct client's address (the
        # interceptor names a job by the client's address: on its own network the peer's, through squid the
        # address squid names in X-Pi-Client).
        w.placeholders = dict((c['name'], _credentials.placeholder(c['name'])) for c in declaration['credentials'])
        w.job_record = {'job': JOB, 'subnets': [direct + '/32', job_subnet], 'placeholders': w.placeholders}
        w.write_job(w.job_record)
        # Another job's placeholder (a network that is not the client's).
        w.foreign = _credentials.placeholder('anthropic')
        with open(os.path.join(w.jobs_dir, OTHER_JOB + '.json'), 'w') as handle:
            json.dump({'job': OTHER_JOB, 'subnets': ['192.0.2.0/24'], 'placeholders': {'anthropic': w.foreign}},
                      handle)
        # Bounded wait until the whole chain answers (at most 30 tries of one request).
        for _attempt in range(30):
            answer = w.request('api.provider.test', path='/ready', via='job')
            if ' 200 ' in (answer.get('status') or '') + ' ':
                break
            time.sleep(1)
        else:
            raise AssertionError('the chain did not answer: %s\n%s' % (
                answer, client.api.logs(PROXY, tail=40).decode('utf-8', 'replace')))
        return w
    except BaseException:
        cleanup(client)
        raise
