"""The integration world: a real proxy deployed by site.yml, a fake upstream, a job network.

One session fixture, ``egress_env``, builds it once:

* ``playbooks/site.yml`` deploys into a temporary folder with an allowlist of
  ``.test`` names only, the upstream network created ``--internal`` (nothing can
  leave the machine even if a rule were wrong) and ``loopback.test`` pinned to
  127.0.0.1 in the proxy's /etc/hosts (the "listed name that resolves to this
  host" case);
* a fake upstream container (``tests/images/tools/fake_upstream.py``) joins the
  upstream network under every ``.test`` alias the tests use; it answers HTTPS
  on 443/8443 with a provider-like 401 and plain HTTP on 80/8080;
* a fresh ``--internal`` job network holds only a long-lived client container
  and the proxy; ``env.curl(...)`` runs curl inside that client.

Names carry the suffix ``$PI_EGRESS_IT_SUFFIX`` (default ``-it``) so a run never
touches a real deployment on the same daemon and parallel runs stay apart.
The images come from ``tests/images/build.yml`` (``./run test`` builds them).
"""

import contextlib
import json
import os
import shlex
import subprocess
import time

import pytest

docker = pytest.importorskip('docker')
from docker.types import IPAMConfig, IPAMPool  # noqa: E402

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import files as _files  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import venue as _venue  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as _jobnet  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import reload as _reload  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import lock as _jobnet_lock  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import names as _doctor_names  # noqa: E402

DOCTOR_LABEL = 'io.pi-dispatch.egress.doctor'

# A tunnel held open by a client across a reload: argv = proxy, host, port, file prefix. It writes
# <prefix>-open (the CONNECT status line), waits (at most 120 s) for <prefix>-go, then sends a GET
# through the tunnel and writes the answer to <prefix>-result.
TUNNEL_SCRIPT = r'''
import os, socket, ssl, sys, time
proxy, host, port, prefix = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
target = ("%s:%s" % (host, port)).encode()
s = socket.create_connection((proxy, 3128), timeout=90)
s.sendall(b"CONNECT " + target + b" HTTP/1.1\r\nHost: " + target + b"\r\n\r\n")
head = b""
while b"\r\n\r\n" not in head:
    chunk = s.recv(1)
    if not chunk:
        break
    head += chunk
open(prefix + "-open", "w").write(head.split(b"\r\n")[0].decode())
t = ssl._create_unverified_context().wrap_socket(s, server_hostname=host)
deadline = time.time() + 120
while not os.path.exists(prefix + "-go") and time.time() < deadline:
    time.sleep(0.1)
t.sendall(b"GET /v1/messages HTTP/1.0\r\nHost: " + host.encode() + b"\r\n\r\n")
data = b""
while True:
    chunk = t.recv(4096)
    if not chunk:
        break
    data += chunk
open(prefix + "-result", "w").write(data.decode("utf-8", "replace"))
'''

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def worker_suffix(environ=None):
    """The names' suffix: ``$PI_EGRESS_IT_SUFFIX`` (default ``-it``), plus ``-<worker>`` under pytest-xdist.

    ``./run``'s integration gate runs the suite on parallel workers (``-n``, ``--dist loadfile``); each worker
    is a session of its own and builds its own world, so two workers never share a container, a network or
    a deployment folder. The tests marked ``alone`` run afterwards without workers (docs/testing.md).
    """
    environ = os.environ if environ is None else environ
    worker = environ.get('PYTEST_XDIST_WORKER')
    return environ.get('PI_EGRESS_IT_SUFFIX', '-it') + ('-' + worker if worker else '')


SUFFIX = worker_suffix()
TOOLS_IMAGE = 'pi-dispatch-egress-tools:test'
# The proxy image the session's site.yml runs (the proxy role builds it under this tag when it is not
# current). PI_EGRESS_IT_PROXY_IMAGE keeps a run apart from another one on the same daemon.
PROXY_IMAGE = os.environ.get('PI_EGRESS_IT_PROXY_IMAGE', 'pi-dispatch-egress-proxy:latest')

# Names the fake upstream answers under (network aliases on the upstream net).
FAKE_ALIASES = [
    'api.provider.test',   # listed: the provider
    'www.forge.test',      # covered by the listed .forge.test
    'forge.test',          # the bare parent of .forge.test (dstdomain matches it too)
    'plain.test',          # listed: plain HTTP on 80
    'denied.test',         # NOT listed, resolves and answers: a leaky proxy would show
    'models.test',         # model server (declared by the endpoints tests)
]
ALLOWLIST = [
    {'host': 'api.provider.test', 'comment': 'the provider (fake)'},
    {'host': '.forge.test', 'comment': 'the forge (fake)'},
    {'host': 'plain.test', 'comment': 'plain http (fake)'},
    {'host': 'loopback.test', 'comment': 'resolves to 127.0.0.1 inside the proxy'},
]


# argv: proxy, CONNECT target (host:port), SNI ('-' none), path, mode ('tls' or 'plain'). Prints one JSON
# line: the CONNECT status line, and what the tunnel gave back (the upstream's status line, or the error).
TLS_CLIENT = r'''
import json, socket, ssl, sys
proxy, target, sni, path, mode = sys.argv[1:6]
out = dict(connect=None, answer=None, error=None)
try:
    s = socket.create_connection((proxy, 3128), timeout=8)
    s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(1)
        if not chunk:
            break
        head += chunk
    out["connect"] = head.split(b"\r\n")[0].decode("latin-1")
    if " 200 " in out["connect"] + " ":
        request = ("GET %s HTTP/1.0\r\nHost: %s\r\n\r\n" % (path, target.rsplit(":", 1)[0])).encode()
        if mode == "plain":
            s.sendall(request)
            t = s
        else:
            ctx = ssl._create_unverified_context()
            t = ctx.wrap_socket(s, server_hostname=None if sni == "-" else sni)
            t.sendall(request)
        data = t.recv(200)
        out["answer"] = data.split(b"\r\n")[0].decode("latin-1") if data else ""
except Exception as exc:
    out["error"] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(out))
'''


def tls_attempt(env, container, target, sni, mode='tls', upstream=None):
    """One TLS_CLIENT attempt from ``container`` (on a job network); returns (result, whether the upstream
    logged the attempt's own path, i.e. whether anything reached it)."""
    path = '/v1/it25-%d-%d' % (os.getpid(), time.monotonic_ns())
    wrapped = ['timeout', '20', 'python3', '-c', TLS_CLIENT, env.proxy, target, sni, path, mode]
    rc, out = env.client.containers.get(container).exec_run(wrapped)
    out = (out or b'').decode('utf-8', 'replace')
    assert rc == 0, out
    result = json.loads(out.strip().splitlines()[-1])
    time.sleep(0.3)  # the fake upstream logs a request as it answers it
    logged = path in env.client.api.logs(upstream or env.fake).decode('utf-8', 'replace')
    return result, logged


@contextlib.contextmanager
def listed_entry(env, entry):
    """``entry`` on the allowlist for the block (written in place, reloaded, restored after)."""
    paths = _deployment.Layout(env.deploy_dir).paths
    with open(paths['allowlist']) as handle:
        before = handle.read()
    proxy = env.client.containers.get(env.proxy)
    try:
        _files.write_in_place(paths['allowlist'], before + '%s\n' % entry)
        _reload.reload_family(env.client, proxy, paths)
        yield entry
    finally:
        _files.write_in_place(paths['allowlist'], before)
        _reload.reload_family(env.client, proxy, paths)


def ansible_env():
    env = dict(os.environ)
    env.setdefault('ANSIBLE_LOCALHOST_WARNING', 'false')
    env.setdefault('ANSIBLE_INVENTORY_UNPARSED_WARNING', 'false')
    env.setdefault('ANSIBLE_NOCOLOR', '1')
    env['ANSIBLE_STDOUT_CALLBACK'] = 'ansible.builtin.default'
    env['ANSIBLE_CALLBACK_RESULT_FORMAT'] = 'yaml'
    return env


_LIMITS_CONSENT = []


def limits_consent():
    """True when the engine cannot hold the proxy's memory and pids limits (rootless on a cgroup v1 host: ./run
    gate podman-rootless). Asked once per session."""
    if not _LIMITS_CONSENT:
        try:
            _LIMITS_CONSENT.append(bool(_venue.venue(docker.from_env(timeout=60)).limits_problem()))
        except Exception:  # no engine: the world's own fixtures say so
            return False
    return _LIMITS_CONSENT[0]


def run_playbook(playbook, extra_vars, check=False, timeout=900):
    """Run a playbook against localhost; returns (rc, output, recap dict).

    On an engine that cannot hold the proxy's limits, every world consents (egress_proxy_limits_unenforced_ok, as
    an operator of such a host would in group_vars) unless the caller says otherwise: test_podman_rootless.py
    proves the refusal without it.
    """
    if 'egress_proxy_limits_unenforced_ok' not in extra_vars and limits_consent():
        extra_vars = dict(extra_vars, egress_proxy_limits_unenforced_ok=True)
    cmd = ['ansible-playbook', '-i', 'localhost,', '-c', 'local', os.path.join(ROOT, playbook),
           '-e', json.dumps(extra_vars)]
    if check:
        cmd += ['--check', '--diff']
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout,
                          env=ansible_env(), cwd=ROOT, check=False)
    out = proc.stdout.decode('utf-8', 'replace')
    recap = {}
    for line in out.splitlines():
        if line.startswith('localhost') and 'ok=' in line:
            recap = dict(item.split('=') for item in line.split(':', 1)[1].split())
            recap = dict((k, int(v)) for k, v in recap.items())
    return proc.returncode, out, recap


class EgressEnv(object):
    """Handles to the integration world (see the module docstring)."""

    def __init__(self, client, deploy_dir):
        self.client = client
        self.deploy_dir = deploy_dir
        # Docker Engine, or Podman through its Docker-compatible API (./run gate podman; docs/podman.md).
        self.venue = _venue.venue(client)
        self.suffix = SUFFIX
        self.proxy = 'pi-dispatch-egress-proxy' + SUFFIX
        self.upstream_net = 'pi-dispatch-egress-out' + SUFFIX
        self.fake = 'pi-egress-fake' + SUFFIX
        self.job_net = 'pi-egress-client-net' + SUFFIX
        self.client_container = 'pi-egress-client' + SUFFIX
        self.tools_image = TOOLS_IMAGE
        self.proxy_image = PROXY_IMAGE
        self.proxy_url = 'http://%s:3128' % self.proxy
        self.allowlist = ALLOWLIST
        self.fake_aliases = FAKE_ALIASES

    def site_vars(self, **more):
        extra = {
            # The fake upstream lives on the (internal) upstream network, a private range the guard
            # refuses by default: open exactly that subnet, nothing else.
            'egress_private_destinations': [self.upstream_subnet] if getattr(self, 'upstream_subnet', None) else [],
            'egress_deploy_dir': self.deploy_dir,
            'egress_proxy_name': self.proxy,
            'egress_proxy_upstream_network': self.upstream_net,
            'egress_proxy_network_internal': True,
            'egress_proxy_extra_hosts': ['loopback.test:127.0.0.1'],
            'egress_allowlist_seed': self.allowlist,
            'egress_proxy_install_debootstrap': False,
            'egress_proxy_image': self.proxy_image,
        }
        extra.update(more)
        return extra

    def site(self, check=False, **more):
        return run_playbook('playbooks/site.yml', self.site_vars(**more), check=check)

    def exec_client(self, argv, timeout=30):
        """Run argv inside the client container; returns (rc, output)."""
        container = self.client.containers.get(self.client_container)
        wrapped = ['timeout', str(int(timeout)), *argv]
        rc, out = container.exec_run(wrapped, demux=False)
        return rc, (out or b'').decode('utf-8', 'replace')

    def curl(self, args, proxy=True, timeout=10):
        """curl inside the job network. Returns dict(rc, code, connect, headers, body).

        ``code`` is the final HTTP status (squid's own answer for a refused
        plain request, or the upstream's); ``connect`` is the status of the
        CONNECT request when one was made (403 when squid refused the tunnel).
        """
        argv = ['curl', '-sS', '-k', '--max-time', str(timeout), '-D', '/dev/stderr', '-o', '/tmp/body',
                '-w', '%{http_code} %{http_connect}']
        if proxy:
            argv += ['--proxy', self.proxy_url]
        else:
            argv += ['--noproxy', '*']
        script = '%s %s 2>/tmp/headers; rc=$?; echo; echo "rc=$rc"; echo ---; cat /tmp/headers; echo ---; ' \
                 'cat /tmp/body 2>/dev/null; rm -f /tmp/body /tmp/headers' % (
                     ' '.join(shlex.quote(a) for a in argv), ' '.join(shlex.quote(a) for a in args))
        _rc, out = self.exec_client(['sh', '-c', script], timeout=timeout + 5)
        first, _sep, rest = out.partition('\n')
        rcline, _sep, rest = rest.partition('\n')
        _head, _sep, rest = rest.partition('---\n')
        headers, _sep, body = rest.partition('---\n')
        codes = first.split()
        return dict(rc=int(rcline.split('=', 1)[1]) if rcline.startswith('rc=') else -1,
                    code=int(codes[0]) if codes and codes[0].isdigit() else 0,
                    connect=int(codes[1]) if len(codes) > 1 and codes[1].isdigit() else 0,
                    headers=headers, body=body, raw=out)

    def squid_mgr(self, page):
        container = self.client.containers.get(self.proxy)
        rc, out = container.exec_run(['squidclient', '-h', 'localhost', '-p', '3128', '-T', '5', 'mgr:' + page])
        assert rc == 0, out
        return out.decode('utf-8', 'replace')

    def fake_ip(self):
        attrs = self.client.api.inspect_container(self.fake)
        return attrs['NetworkSettings']['Networks'][self.upstream_net]['IPAddress']


def _remove_container(client, name):
    try:
        client.api.remove_container(name, force=True, v=True)
    except docker.errors.NotFound:
        pass


def _remove_network(client, name):
    try:
        net = client.networks.get(name)
    except docker.errors.NotFound:
        return
    net.reload()
    for cid in list((net.attrs.get('Containers') or {}).keys()):
        try:
            net.disconnect(cid, force=True)
        except docker.errors.APIError:
            pass
    try:
        net.remove()
    except docker.errors.NotFound:
        pass


def _wait_fake_ready(client, name, deadline_s=30):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        logs = client.api.logs(name).decode('utf-8', 'replace')
        if 'fake upstream ready' in logs:
            return
        time.sleep(0.5)
    raise AssertionError('fake upstream %s not ready within %ss:\n%s' % (name, deadline_s, logs))


def _wait_path_ready(env, tries=20, url='https://api.provider.test/'):
    """Bounded wait (at most ``tries`` curls of 3 s) until the fake provider at ``url`` answers through the proxy."""
    last = None
    for _attempt in range(tries):
        last = env.curl([url], timeout=3)
        if last['code'] == 401:
            return
        time.sleep(1)
    raise AssertionError('The fake provider at %s did not answer through the proxy after %d tries; last '
                         'answer:\n%s\nproxy logs:\n%s' % (
                             url, tries, last['raw'], env.client.api.logs(env.proxy, tail=30).decode()))


def tcp_reaches(container, host, port, tries=2, wait=2):
    """True when a TCP connect from ``container`` succeeds within ``tries`` bounded attempts of ``wait`` s."""
    for _attempt in range(tries):
        rc, _out = container.exec_run(['timeout', str(wait + 2), 'nc', '-z', '-w', str(wait), host, str(port)])
        if rc == 0:
            return True
    return False


def serving(container, port, within=30):
    """True once something in ``container`` listens on 127.0.0.1:``port``; polled at most 60 times, ``within`` s.

    A refused connect returns at once, so ``tcp_reaches`` alone would spend its tries in well under a second
    while a server is still starting on a loaded machine; this paces the attempts instead.
    """
    deadline = time.monotonic() + within
    for _attempt in range(60):
        rc, _out = container.exec_run(['timeout', '4', 'nc', '-z', '-w', '2', '127.0.0.1', str(port)])
        if rc == 0:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)
    return False


def ip_on(client, container, network):
    """The IPv4 address ``container`` has on ``network``."""
    return client.api.inspect_container(container)['NetworkSettings']['Networks'][network]['IPAddress']


def create_upstream_network(client, name):
    """The proxy's upstream network, --internal, made before site.yml so its subnet can be opened."""
    net = client.networks.create(name, driver='bridge', internal=True,
                                 labels={'io.pi-dispatch.egress.network': 'upstream'})
    net.reload()
    return net.attrs['IPAM']['Config'][0]['Subnet']


def create_pool_network(client, name, **kwargs):
    """An ``--internal`` bridge network on a free subnet of the job pool, picked and made under the job-network lock.

    The product's creators pick a subnet and create the network under one host-wide lock per daemon
    (``_jobnets/lock.py``); a test that made its own pool network outside it could race another worker's
    creator for the same subnet (the daemon refuses the second as overlapping).
    """
    with _jobnet_lock.held(client) as token:
        net = client.networks.create(name, driver='bridge', internal=True,
                                     ipam=IPAMConfig(pool_configs=[IPAMPool(subnet=str(_jobnet.plan_subnet(client)))]),
                                     **kwargs)
        token.changed()
    return net


def _label_pid(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


# What finished doctor runs had left before the current test began (set by doctor_objects_before): a leftover
# of an earlier test's run, on this shared daemon, is not the current test's.
_DOCTOR_BEFORE = {'objects': frozenset()}


@pytest.fixture(autouse=True)
def doctor_objects_before(request):
    """For a module that asserts on doctor_objects_left: what was left before this test began (printed when any).

    A run whose cleanup failed under load in another test (CI, measured: an empty network
    pi-dispatch-egress-doctor-<pid>) would otherwise fail every later test of every module that asserts
    nothing is left. The current test's own runs start after this and cannot be in it.
    """
    if 'doctor_objects_left' not in vars(request.module):
        yield
        return
    before = frozenset(_doctor_objects_left(request.getfixturevalue('engine')))
    if before:
        print('doctor objects left by an earlier test, not counted in this one: %s' % ', '.join(sorted(before)))
    _DOCTOR_BEFORE['objects'] = before
    try:
        yield
    finally:
        _DOCTOR_BEFORE['objects'] = frozenset()


def doctor_objects_left(client):
    """What a finished doctor run left behind since the current test began (``_doctor_objects_left``)."""
    return [item for item in _doctor_objects_left(client) if item not in _DOCTOR_BEFORE['objects']]


def _doctor_objects_left(client):
    """The doctor's labelled containers and networks that a FINISHED run left behind (this process's own too).

    A doctor run removes its objects before it ends (docs/doctor.md); objects whose run is still alive in
    another process (another worker's doctor, on this shared daemon) are not this test's and are skipped.
    An object whose run ended while we looked is checked again, so a run that removed its objects and
    exited between the listing and the pid check is not counted.
    """
    def finished(labels, name=''):
        pid = _label_pid((labels or {}).get(DOCTOR_LABEL))
        pid = _doctor_names.probe_pid(name) if pid is None else pid
        return pid is None or pid == os.getpid() or not _doctor_names.pid_alive(pid)

    def listing():
        seen = client.api.containers(all=True, filters={'label': DOCTOR_LABEL})
        seen += client.api.containers(all=True, filters={'name': _doctor_names.PROBE_PREFIX})
        found = ['container %s' % (c['Names'][0].lstrip('/'),)
                 for c in seen if finished(c.get('Labels'), c['Names'][0].lstrip('/'))]
        found += ['network %s' % n['Name'] for n in client.api.networks(filters={'label': DOCTOR_LABEL})
                  if finished(n.get('Labels'))]
        found += ['network %s' % n['Name'] for n in client.api.networks(filters={'name': 'pi-job-doctor-'})
                  if finished({DOCTOR_LABEL: _doctor_net_pid(n['Name'])})]
        return set(found)
    first = listing()
    return sorted(first & listing()) if first else []


def _doctor_net_pid(name):
    """The pid in an isolation network's name ``pi-job-doctor-<pid>-<peer>-net``."""
    parts = name.split('-')
    return parts[3] if len(parts) > 3 else None


@pytest.fixture(scope='session', autouse=True)
def engine_account_reaches_tmp(tmp_path_factory):
    """Under ``./run gate podman-rootless`` the engine runs as a service account, which must reach the files it
    mounts (egress_proxy refuses a folder it cannot, _proxy/rootless.py). pytest makes every temporary folder
    0700 (root's); here they are 0711, traversable as an operator's deployment folder is. The gate passes
    ``--basetemp`` under ``.cache/podman-rootless`` (its ancestors are 0755): nothing else is opened."""
    if os.environ.get('PI_EGRESS_IT_ENGINE') != 'podman-rootless':
        yield
        return
    os.chmod(str(tmp_path_factory.getbasetemp()), 0o711)
    original = type(tmp_path_factory).mktemp

    def mktemp(self, basename, numbered=True):
        path = original(self, basename, numbered=numbered)
        os.chmod(str(path), 0o711)
        return path

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(tmp_path_factory), 'mktemp', mktemp)
        yield


@pytest.fixture(scope='session')
def engine():
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as exc:  # the README test command starts the engine; say so
        pytest.fail('No Docker Engine answers (%s). Run the tests with ./run test, which starts one.' % exc)
    for image in (TOOLS_IMAGE, PROXY_IMAGE):
        try:
            client.images.get(image)
        except docker.errors.ImageNotFound:
            pytest.fail('Image %s is missing. Build it with: ansible-playbook tests/images/build.yml '
                        '(./run test does).' % image)
    return client


@pytest.fixture(scope='session')
def egress_env(engine, tmp_path_factory):
    client = engine
    deploy_dir = str(tmp_path_factory.mktemp('deploy') / 'egress')
    env = EgressEnv(client, deploy_dir)
    # Leftovers of a killed earlier run of this suite (same suffix) go first.
    for name in (env.client_container, env.fake, env.proxy):
        _remove_container(client, name)
    for name in (env.job_net, env.upstream_net):
        _remove_network(client, name)

    env.upstream_subnet = create_upstream_network(client, env.upstream_net)
    rc, out, _recap = env.site()
    if rc != 0:
        pytest.fail('site.yml failed (rc=%s):\n%s' % (rc, out[-6000:]))
    env.first_site_output = out
    # What the first run wrote, before any test edits the folder.
    env.first_files = {}
    for rel in ('egress-allowlist.conf', 'deploy/egress-proxy.conf', 'model-endpoints.json', 'model-endpoints.conf'):
        with open(os.path.join(deploy_dir, rel)) as handle:
            env.first_files[rel] = handle.read()

    # The aliases are set when the container is created, on its only network.
    api = client.api
    fake = api.create_container(
        TOOLS_IMAGE, ['python3', '/usr/local/bin/fake_upstream.py'], name=env.fake, detach=True,
        labels={'io.pi-dispatch.egress.test': 'fake-upstream'},
        host_config=api.create_host_config(network_mode=env.upstream_net),
        networking_config=api.create_networking_config({
            env.upstream_net: api.create_endpoint_config(aliases=FAKE_ALIASES)}))
    api.start(fake['Id'])
    _wait_fake_ready(client, env.fake)

    # A real job network comes from the job pool (its gateway is refused with the pool).
    create_pool_network(client, env.job_net, labels={'io.pi-dispatch.egress.test': 'client-net'})
    client.networks.get(env.job_net).connect(env.proxy)
    client.containers.run(TOOLS_IMAGE, ['sleep', 'infinity'], name=env.client_container, detach=True,
                          network=env.job_net, labels={'io.pi-dispatch.egress.test': 'client'})
    _wait_path_ready(env)
    try:
        yield env
    finally:
        for name in (env.client_container, env.fake, env.proxy):
            _remove_container(client, name)
        for name in (env.job_net, env.upstream_net):
            _remove_network(client, name)
