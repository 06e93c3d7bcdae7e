"""Credential placeholders on the real engine: the real squid proxy (its TLS name check routing bound hosts
through the interceptor, by the rendered include), the real interceptor (mitmproxy with the pi_interceptor
addon, in its hardened container) and a fake provider that records every header it receives.

The world (module fixture), three ``--internal`` networks:

* the upstream network: the fake provider (``api.provider.test``, ``other.provider.test``,
  ``unbound.provider.test``, ``unlisted.provider.test``) and the proxy;
* the credentials network: the interceptor, the proxy and a "direct" client that talks to the interceptor
  itself (the addon's decisions, one by one);
* a job network: the proxy and a job client that goes through squid as a job does (the chain).

Two credentials are bound: ``anthropic`` (x-api-key) to api.provider.test and ``other`` (Bearer) to
other.provider.test; unbound.provider.test is listed with none; unlisted.provider.test is not listed. The
job's placeholders are recorded against the job id, as the job-network API will record them.
"""

import ipaddress
import json
import os
import secrets
import shutil
import time
import uuid

import pytest

docker = pytest.importorskip('docker')

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import credentials as _credentials  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import endpoints as _endpoints  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import guard as _guard  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import rules as _rules  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import interceptor as _interceptor  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import spec as _spec  # noqa: E402

SUFFIX = os.environ.get('PI_EGRESS_IT_SUFFIX', '-it')
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


def _remove(client, name):
    try:
        client.api.remove_container(name, force=True, v=True)
    except docker.errors.NotFound:
        pass


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
        self.ca_dir = os.path.join(folder, 'ca')
        self.conf_dir = os.path.join(folder, 'conf')
        self.share = os.path.join(folder, 'share')
        self.log_dir = os.path.join(folder, 'decisions')
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
                ca='-', via='interceptor', body=None):
        """One request from the direct client to the interceptor (``via='interceptor'``), or from the job
        client through squid (``via='job'``; ``via='return-port'`` dials the interceptor's way out instead)."""
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
        argv = ['python3', '-c', script, proxy, str(port), host, sni or host, host_header or host, method, path,
                ca_path, json.dumps([list(p) for p in header_pairs])]
        rc, out = self.client.containers.get(container).exec_run(['timeout', '30'] + argv)
        text = out.decode('utf-8', 'replace').strip().splitlines()
        assert text, 'the client printed nothing (rc %s)' % rc
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


def _cleanup(client):
    for name in CONTAINERS:
        _remove(client, name)
    for name in NETWORKS:
        try:
            client.networks.get(name).remove()
        except docker.errors.NotFound:
            pass


def _network(client, name):
    net = client.networks.create(name, driver='bridge', internal=True, labels=LABEL)
    net.reload()
    return net.attrs['IPAM']['Config'][0]['Subnet']


def _run_proxy(client, w, up_subnet, cred_subnet, creds):
    """The proxy as egress_proxy makes it (spec.desired_spec), with the credential include mounted."""
    from docker.types import LogConfig, Mount, Ulimit
    files = dict(rules=_rules.packaged_rules(), allowlist=''.join(h + '\n' for h in LISTED),
                 endpoints=_endpoints.render_include([]),
                 guard=_guard.render(opened=[ipaddress.ip_network(up_subnet)]),
                 include=_interceptor.render_include([c.host for c in creds], cred_subnet,
                                                     interceptor_host=INTERCEPTOR))
    paths = {}
    for key, text in files.items():
        paths[key] = os.path.join(w.folder, 'proxy-' + key + '.conf')
        with open(paths[key], 'w') as handle:
            handle.write(text)
        os.chmod(paths[key], 0o644)
    os.makedirs(w.log_dir, mode=0o750)
    os.chown(w.log_dir, _spec.PROXY_UID, _spec.PROXY_UID)
    spec = _spec.desired_spec(PROXY_IMAGE, paths['rules'], paths['allowlist'], paths['endpoints'], network=UP,
                              name=PROXY, guard=paths['guard'], credentials_include=paths['include'],
                              decision_log=dict(dir=w.log_dir))
    kwargs = _spec.create_kwargs(spec)
    kwargs['mounts'] = [Mount(target=dst, source=src, type='bind', read_only=True) for src, dst in spec['mounts']]
    kwargs['mounts'].append(Mount(target=spec['log_mount'][1], source=spec['log_mount'][0], type='bind'))
    kwargs['ulimits'] = [Ulimit(name=u['name'], soft=u['soft'], hard=u['hard']) for u in spec['ulimits']]
    kwargs['log_config'] = LogConfig(type=spec['log_config']['type'], config=spec['log_config']['config'])
    kwargs['labels'] = dict(kwargs['labels'], **LABEL)
    image = kwargs.pop('image')
    container = client.containers.create(image, **kwargs)
    client.networks.get(NET).connect(PROXY)
    client.networks.get(JOBNET).connect(PROXY)
    container.start()


@pytest.fixture(scope='module')
def world(tmp_path_factory):
    try:
        client = docker.from_env(timeout=120)
        client.ping()
        for image in (TOOLS_IMAGE, INTERCEPTOR_IMAGE, PROXY_IMAGE):
            client.images.get(image)
    except Exception as exc:
        pytest.fail('The engine or an image is missing (%s); ./run test builds the images '
                    '(ansible-playbook tests/images/build.yml).' % exc)
    folder = str(tmp_path_factory.mktemp('credentials'))
    w = World(client, folder)
    _cleanup(client)
    for sub in (w.secret_dir, w.jobs_dir, w.ca_dir, w.conf_dir, w.share):
        os.makedirs(sub, mode=0o700)
    os.chmod(w.share, 0o755)
    for name, value in w.secret.items():
        w.write_secret(name, value)
    creds = _credentials.parse(json.dumps({'version': 1, 'credentials': [
        {'name': 'anthropic', 'host': 'api.provider.test', 'port': 443, 'env': 'ANTHROPIC_API_KEY',
         'scheme': 'header', 'header': 'x-api-key', 'secret_file': os.path.join(w.secret_dir, 'anthropic')},
        {'name': 'other', 'host': 'other.provider.test', 'port': 443, 'env': 'OTHER_TOKEN',
         'scheme': 'bearer', 'secret_file': os.path.join(w.secret_dir, 'other')}]}),
        listed=lambda host: host in LISTED)
    with open(os.path.join(w.conf_dir, 'credentials.json'), 'w') as handle:
        json.dump(_credentials.interceptor_config(creds), handle)

    api = client.api
    try:
        up_subnet, cred_subnet, _job_subnet = _network(client, UP), _network(client, NET), _network(client, JOBNET)
        provider = api.create_container(
            TOOLS_IMAGE, ['python3', '/usr/local/bin/fake_provider.py'] + sum([['--name', n] for n in NAMES], []),
            name=PROVIDER, detach=True, labels=LABEL, host_config=api.create_host_config(network_mode=UP),
            networking_config=api.create_networking_config({UP: api.create_endpoint_config(aliases=NAMES)}))
        api.start(provider['Id'])
        _wait_log(client, PROVIDER, 'fake provider ready')
        rc, ca = client.containers.get(PROVIDER).exec_run(['cat', '/tmp/fake-provider/ca.pem'])
        assert rc == 0
        with open(os.path.join(w.share, 'provider-ca.pem'), 'wb') as handle:
            handle.write(ca)
        shutil.copy(os.path.join(w.share, 'provider-ca.pem'), os.path.join(w.conf_dir, 'upstream-ca.pem'))

        client.containers.run(**_interceptor.container_kwargs(
            INTERCEPTOR_IMAGE, w.conf_dir, w.jobs_dir, w.ca_dir, [c.secret_file for c in creds],
            upstream='http://%s:%d' % (PROXY, _interceptor.RETURN_PORT), name=INTERCEPTOR, network=NET,
            upstream_ca=True))
        client.containers.get(INTERCEPTOR).update(restart_policy={'Name': 'no'})
        # The proxy after the interceptor: squid resolves its cache_peer's name when it reads its
        # configuration, and a name that did not resolve then is retried only after negative_dns_ttl.
        _run_proxy(client, w, up_subnet, cred_subnet, creds)
        end = time.monotonic() + 60
        ca_cert = os.path.join(w.ca_dir, _interceptor.CA_CERT)
        while not os.path.exists(ca_cert) and time.monotonic() < end:
            time.sleep(0.5)
        assert os.path.exists(ca_cert), client.api.logs(INTERCEPTOR).decode()
        shutil.copy(ca_cert, os.path.join(w.share, 'interceptor-ca.pem'))
        for name, net in ((CLIENT, NET), (JOB_CLIENT, JOBNET)):
            client.containers.run(TOOLS_IMAGE, ['sleep', 'infinity'], name=name, detach=True, network=net,
                                  labels=LABEL, volumes={w.share: {'bind': '/share', 'mode': 'ro'}})
        direct = client.api.inspect_container(CLIENT)['NetworkSettings']['Networks'][NET]['IPAddress']
        # The job's placeholders, recorded against the job and the direct client's address (the interceptor
        # tells a job by its address only on its own network; through squid, by the placeholder).
        w.placeholders = dict((c.name, _credentials.placeholder(c.name)) for c in creds)
        with open(os.path.join(w.jobs_dir, JOB + '.json'), 'w') as handle:
            json.dump({'job': JOB, 'subnets': [direct + '/32'], 'placeholders': w.placeholders}, handle)
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
        yield w
    finally:
        _cleanup(client)


def _marker():
    return '/v1/messages?m=' + uuid.uuid4().hex


def test_the_bound_host_gets_the_real_secret_and_the_job_never_sees_it(world):
    path = _marker()
    answer = world.request('api.provider.test', [('x-api-key', world.placeholders['anthropic'])], path=path)
    assert answer['error'] is None and ' 200 ' in answer['status'] + ' ', answer
    assert answer['issuer'] == 'mitmproxy', 'a bound host is terminated with the deployment CA: %s' % answer
    seen = world.saw_marker(path.split('=')[1])
    assert len(seen) == 1
    assert ['x-api-key', world.secret['anthropic']] in [[k.lower(), v] for k, v in seen[0]['headers']]
    # The provider echoes the key back in its body and a header: the job gets it redacted.
    assert world.secret['anthropic'] not in answer['body'] + answer['headers']
    assert '[redacted:anthropic]' in answer['body'] and '[redacted:anthropic]' in answer['headers']
    assert any(r.get('event') == 'swapped' and r.get('job') == JOB and r.get('credential') is None
               and r.get('swapped') == ['anthropic'] for r in world.records())


def test_a_bearer_credential_is_swapped_in_its_scheme(world):
    path = _marker()
    answer = world.request('other.provider.test', [('Authorization', 'Bearer ' + world.placeholders['other'])],
                           path=path)
    assert ' 200 ' in (answer['status'] or '') + ' ', answer
    seen = world.saw_marker(path.split('=')[1])
    assert [['authorization', 'Bearer ' + world.secret['other']]] == [
        [k.lower(), v] for k, v in seen[0]['headers'] if k.lower() == 'authorization']


@pytest.mark.parametrize('case', [
    'header-to-other-bound-host', 'in-the-url', 'in-the-body', 'in-another-header', 'of-another-job',
    'unknown-placeholder', 'real-key', 'real-key-in-body', 'host-differs-from-sni', 'trace'])
def test_refused_requests_reach_nothing(world, case):
    ph = world.placeholders['anthropic']
    marker = uuid.uuid4().hex
    path = '/v1/messages?m=' + marker
    host, headers, method, host_header = 'api.provider.test', [], 'GET', None
    reason = None
    if case == 'header-to-other-bound-host':
        host, headers, reason = 'other.provider.test', [('x-api-key', ph)], 'placeholder-elsewhere'
    elif case == 'in-the-url':
        path, reason = path + '&key=' + ph, 'placeholder-elsewhere'
    elif case == 'in-the-body':
        reason = 'placeholder-elsewhere'
    elif case == 'in-another-header':
        headers, reason = [('x-forwarded-key', ph)], 'placeholder-elsewhere'
    elif case == 'of-another-job':
        headers, reason = [('x-api-key', world.foreign)], 'placeholder-of-another-job'
    elif case == 'unknown-placeholder':
        headers, reason = [('x-api-key', _credentials.placeholder('anthropic'))], 'unknown-placeholder'
    elif case == 'real-key':
        headers, reason = [('x-api-key', world.secret['anthropic'])], 'real-credential'
    elif case == 'real-key-in-body':
        reason = 'real-credential'
    elif case == 'host-differs-from-sni':
        host_header, headers, reason = 'other.provider.test', [('x-api-key', ph)], 'host-sni-mismatch'
    elif case == 'trace':
        method, headers, reason = 'TRACE', [('x-api-key', ph)], 'trace'
    if case == 'in-the-body':
        answer = world.request(host, path=path, method='POST', body='key=' + ph + '&x=yz')
    elif case == 'real-key-in-body':
        answer = world.request(host, path=path, method='POST', body=world.secret['anthropic'])
    else:
        answer = world.request(host, headers, host_header=host_header, method=method, path=path)
    assert answer['error'] is None and ' 403 ' in (answer['status'] or '') + ' ', answer
    assert reason in answer['body'], answer
    assert world.saw_marker(marker) == [], 'a refused request reached the provider'
    assert world.secret['anthropic'] not in json.dumps(answer)
    matching = [r for r in world.records() if r.get('event') == 'refused' and r.get('reason') == reason]
    assert matching, 'no refusal recorded for %s' % reason
    assert all(r.get('job') in (JOB, OTHER_JOB) for r in matching), matching


# --- through squid, as a job goes ------------------------------------------------------------------------

def test_through_squid_the_bound_host_gets_the_secret(world):
    """job -> squid (allowlist, guard) -> TLS name check -> interceptor -> TLS name check -> provider."""
    path = _marker()
    answer = world.request('api.provider.test', [('x-api-key', world.placeholders['anthropic'])], path=path,
                           via='job')
    assert answer['error'] is None and ' 200 ' in (answer['status'] or '') + ' ', answer
    assert answer['issuer'] == 'mitmproxy', answer
    seen = world.saw_marker(path.split('=')[1])
    assert len(seen) == 1, seen
    assert ['x-api-key', world.secret['anthropic']] in [[k.lower(), v] for k, v in seen[0]['headers']]
    assert world.secret['anthropic'] not in answer['body'] + answer['headers']
    assert '[redacted:anthropic]' in answer['body']


def test_an_unbound_listed_host_is_a_plain_tunnel(world):
    """No credential is bound to it: squid splices it, the job sees the provider's own certificate."""
    path = _marker()
    answer = world.request('unbound.provider.test', [('x-api-key', 'not-a-secret')], path=path,
                           ca='/share/provider-ca.pem', via='job')
    assert answer['error'] is None and ' 200 ' in answer['status'] + ' ', (
        answer, world.client.api.logs(PROXY, tail=30).decode('utf-8', 'replace'))
    assert answer['issuer'] == 'fake provider test CA', answer
    assert len(world.saw_marker(path.split('=')[1])) == 1
    # Through the deployment CA the same host fails: its certificate is the provider's own.
    failed = world.request('unbound.provider.test', path=_marker(), via='job')
    assert failed['error'] and 'CERTIFICATE_VERIFY_FAILED' in failed['error'], failed


def test_through_squid_a_placeholder_sent_to_another_bound_host_is_refused(world):
    marker = uuid.uuid4().hex
    answer = world.request('other.provider.test', [('x-api-key', world.placeholders['anthropic'])],
                           path='/v1/messages?m=' + marker, via='job')
    assert ' 403 ' in (answer['status'] or '') + ' ' and 'placeholder-elsewhere' in answer['body'], answer
    assert world.saw_marker(marker) == []


def test_through_squid_an_unlisted_host_is_refused_by_squid(world):
    answer = world.request('unlisted.provider.test', path=_marker(), via='job')
    assert (answer['connect'] or '').startswith('HTTP/1.1 403'), answer


def test_the_interceptors_way_out_is_closed_to_jobs(world):
    """Port 3130 of the TLS name check opens only to the interceptor's network: a job dialling it directly
    (to skip squid's rules and the interceptor) gets no tunnel."""
    marker = uuid.uuid4().hex
    answer = world.request('api.provider.test', [('x-api-key', world.placeholders['anthropic'])],
                           path='/v1/messages?m=' + marker, via='return-port', ca='/share/provider-ca.pem')
    # An ssl-bump port answers a refused CONNECT with 200 and then cuts the tunnel (an error there would
    # have to be served by terminating TLS): what matters is that no TLS session reaches anything.
    assert answer['status'] is None and answer['issuer'] is None and answer['error'], answer
    assert world.saw_marker(marker) == []


def test_through_squid_an_sni_that_is_not_the_connect_host_is_cut(world):
    marker = uuid.uuid4().hex
    answer = world.request('api.provider.test', [('x-api-key', world.placeholders['anthropic'])],
                           sni='unbound.provider.test', path='/v1/messages?m=' + marker, via='job',
                           ca='/share/provider-ca.pem')
    assert answer['status'] is None and answer['issuer'] is None, answer
    assert world.saw_marker(marker) == []


# --- the interceptor itself ------------------------------------------------------------------------------

def test_an_sni_that_is_not_the_bound_host_is_cut_without_a_certificate(world):
    answer = world.request('api.provider.test', [('x-api-key', world.placeholders['anthropic'])],
                           sni='unbound.provider.test', path=_marker(), ca='/share/provider-ca.pem')
    assert answer['error'] is not None and answer['status'] is None, answer
    assert answer['issuer'] is None, 'the interceptor showed a certificate for a name the job chose: %s' % answer
    assert any(r.get('reason') == 'sni-not-bound-host' and r.get('job') == JOB for r in world.records())


def test_a_changed_secret_file_takes_effect_on_the_next_request(world):
    old = world.secret['anthropic']
    new = 'sk-ant-ROTATED-' + secrets.token_hex(20)
    world.write_secret('anthropic', new)
    try:
        path = _marker()
        answer = world.request('api.provider.test', [('x-api-key', world.placeholders['anthropic'])], path=path)
        assert ' 200 ' in (answer['status'] or '') + ' ', answer
        seen = world.saw_marker(path.split('=')[1])
        assert ['x-api-key', new] in [[k.lower(), v] for k, v in seen[0]['headers']]
        assert old not in json.dumps(seen)
    finally:
        world.secret['rotated-away'] = old


def test_no_secret_appears_in_any_output(world):
    """The container's log (every record the interceptor wrote) and what the client got never hold a secret."""
    world.request('api.provider.test', [('x-api-key', world.placeholders['anthropic'])], path=_marker())
    logs = world.client.api.logs(INTERCEPTOR).decode('utf-8', 'replace')
    assert logs.strip(), 'the interceptor wrote no record at all'
    for name, value in world.secret.items():
        assert value not in logs, 'the secret %s appears in the interceptor log' % name
    for value in world.placeholders.values():
        assert value not in logs, 'a placeholder appears in the interceptor log'
    proxy_logs = world.client.api.logs(PROXY).decode('utf-8', 'replace')
    decisions = ''
    for name in sorted(os.listdir(world.log_dir)):
        with open(os.path.join(world.log_dir, name), encoding='utf-8', errors='replace') as handle:
            decisions += handle.read()
    assert 'api.provider.test' in decisions, 'the decision log recorded nothing: %r' % os.listdir(world.log_dir)
    for name, value in world.secret.items():
        assert value not in proxy_logs, 'the secret %s appears in the proxy log' % name
        assert value not in decisions, 'the secret %s appears in the decision log' % name
    rc, out = world.client.containers.get(CLIENT).exec_run(['sh', '-c', 'env; ls -la /share; cat /share/*'])
    for name, value in world.secret.items():
        assert value not in out.decode('utf-8', 'replace'), name
