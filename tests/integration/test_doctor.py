"""The doctor against the real engine, a real squid and the fake upstream.

Every probe targets .test names served by the fake upstream (never the real
default hosts): provider api.provider.test, deny denied.test, and the plain
probe's listed host api.provider.test. The broken-rules case runs on this
file's own proxy (h7-proxy), never on the shared egress_env proxy's files.
"""

import json
import os
import subprocess
import time

import pytest

from conftest import _remove_container, _remove_network, doctor_objects_left, run_playbook
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import venue as _venue
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import doctor as _doctor
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import names as _doctor_names
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import lifecycle as _jobnet_lifecycle

docker = pytest.importorskip('docker')

OWN_PROXY = 'h7-proxy'
REPORT_DIR = os.environ.get('PI_DOCTOR_REPORT_DIR')


def doctor_vars(env, json_path, **more):
    extra = {
        'egress_proxy_name': env.proxy,
        'egress_deploy_dir': env.deploy_dir,
        'doctor_probe_image': env.tools_image,
        'doctor_provider_host': 'api.provider.test',
        'doctor_deny_host': 'denied.test',
        'doctor_listed_host': 'api.provider.test',
        'doctor_probe_timeout': 5,
        'doctor_probe_start_grace': 20,
        # The upstream is --internal: the mirror check would only wait out apt's timeouts (about 40 s a run).
        # test_proxy_image.py pins the line with it on; here it is off, and the line says so.
        'doctor_squid_mirror': False,
        'doctor_json_path': str(json_path),
    }
    extra.update(more)
    return extra


def run_doctor(env, tmp_path, name, **more):
    json_path = tmp_path / ('%s.jsonl' % name)
    rc, out, recap = run_playbook('playbooks/doctor.yml', doctor_vars(env, json_path, **more), timeout=300)
    if REPORT_DIR:
        with open(os.path.join(REPORT_DIR, 'doctor-%s.log' % name), 'w') as handle:
            handle.write(out)
    assert json_path.exists(), out[-4000:]
    lines = [json.loads(text) for text in json_path.read_text().splitlines() if text.strip()]
    return rc, out, dict((line['id'], line) for line in lines), lines


def test_a_removed_variable_name_fails_the_doctor_before_it_runs_anything(egress_env, tmp_path):
    """doctor_proxy_name (deprecated in 0.3.0, removed in 0.4.0) is refused by name, not ignored."""
    rc, out, _recap = run_playbook('playbooks/doctor.yml', doctor_vars(egress_env, tmp_path / 'old.jsonl',
                                                                       doctor_proxy_name=egress_env.proxy),
                                   timeout=300)
    assert rc != 0, out[-3000:]
    assert 'doctor_proxy_name was removed in pi_dispatch.egress 0.4.0' in out and 'set egress_proxy_name' in out
    assert 'doctor : Refuse the variable names removed in 0.4.0' in out  # the role's tasks print this way
    assert 'doctor : Run the doctor' not in out, 'the doctor ran although a removed name was set'


def _no_doctor_objects_of(client, pid):
    nets = [n['Name'] for n in client.api.networks(filters={'name': 'pi-dispatch-egress-doctor-%d' % pid})]
    return [n for n in nets if n == 'pi-dispatch-egress-doctor-%d' % pid]


FORGE_TOKEN = 'glpat-forge-SECRET-0123456789'


def test_healthy_deployment_all_pass(egress_env, tmp_path):
    # Forges (seed 000): https:// on 443 and listed passes; http:// and another port warn and say why. A token in
    # a URL is never shown. Warnings never fail the play.
    forges = {'forge': 'https://oauth2:%s@api.provider.test/group' % FORGE_TOKEN,
              'GITLAB_URL': 'http://gitlab.forge.test', 'FORGEJO_URL': 'https://api.provider.test:8443'}
    rc, out, by_id, lines = run_doctor(egress_env, tmp_path, 'healthy', doctor_forge_urls=forges)
    assert rc == 0, out[-4000:]
    assert by_id['forge.ok']['status'] == 'ok', by_id['forge.ok']
    assert 'forge https://api.provider.test/group' in by_id['forge.ok']['message']
    assert by_id['forge.http']['status'] == 'warn' and 'GITLAB_URL' in by_id['forge.http']['message']
    assert 'git ignores HTTP_PROXY' in by_id['forge.http']['message']
    assert by_id['forge.port']['status'] == 'warn' and 'port 8443' in by_id['forge.port']['message']
    assert FORGE_TOKEN not in out and FORGE_TOKEN not in (tmp_path / 'healthy.jsonl').read_text()
    for line_id in ('proxy.running', 'proxy.health', 'proxy.rules', 'canary.provider', 'canary.deny',
                    'canary.plain', 'canary.sni', 'canary.tunnel_plain'):
        assert by_id[line_id]['status'] == 'ok', (line_id, by_id.get(line_id), out[-4000:])
    assert '401' in by_id['canary.provider']['message']
    # the decision log: earlier tests were refused on purpose, so a summary (never the doctor's own probes)
    decisions = [line for line in lines if line['id'].startswith('decisions.')]
    assert [line['id'] for line in decisions] in (['decisions.refusals'], ['decisions.quiet']), decisions
    assert 'pi-dispatch-egress-doctor-' not in decisions[0]['message'], decisions
    assert 'ERR_ACCESS_DENIED' in by_id['canary.plain']['message']
    # Two real job networks, one peer each: each reached the proxy and not the other.
    assert by_id['isolation.peers']['status'] == 'ok', (by_id.get('isolation.peers'), lines)
    assert 'pi-job-doctor-' in by_id['isolation.peers']['message']
    assert by_id['overlay.allowlist_ok']['status'] == 'ok'
    assert by_id['overlay.none']['status'] == 'notrun'  # no overlay models.json given: said, never a pass
    assert not [line for line in lines if line['status'] == 'fail']
    assert not [line for line in lines if line['id'].startswith('endpoint')]  # nothing declared, no probe
    assert not [line for line in lines if 'not checked yet' in line['message']]
    # Its own objects are gone.
    client = egress_env.client
    assert not doctor_objects_left(client)


def test_check_mode_runs_probes_and_changes_nothing(egress_env, tmp_path):
    json_path = tmp_path / 'check.jsonl'
    rc, out, _recap = run_playbook('playbooks/doctor.yml', doctor_vars(egress_env, json_path), check=True,
                                   timeout=300)
    assert rc == 0, out[-4000:]
    assert 'Egress policy denies an unlisted host' in out
    assert not json_path.exists()  # check mode writes no report file


@pytest.mark.alone  # plants a dead run's leftovers: another worker's doctor would sweep them first
def test_killed_leftover_swept_live_leftover_kept(egress_env, tmp_path):
    client = egress_env.client
    dead = subprocess.Popen(['true'])
    dead.wait()
    live = subprocess.Popen(['sleep', '300'])
    stopped = 'pi-egress-stopped-other' + egress_env.suffix
    made = []
    try:
        for pid in (dead.pid, live.pid):
            net = 'pi-dispatch-egress-doctor-%d' % pid
            probe = 'pi-dispatch-egress-probe-provider-%d' % pid
            _remove_container(client, probe)
            _remove_network(client, net)
            client.networks.create(net, driver='bridge', internal=True)
            client.containers.run(egress_env.tools_image, ['sleep', '300'], name=probe, detach=True, network=net)
            made.append((net, probe))
        # A killed run also left the proxy attached to its network: detached and named.
        client.networks.get(made[0][0]).connect(egress_env.proxy)
        # And a container of someone else's that has stopped on it: Docker's inspect does not list it, Podman
        # refuses the network's removal while it is there (network is being used). Detached and named, kept.
        _remove_container(client, stopped)
        client.containers.run(egress_env.tools_image, ['true'], name=stopped, detach=True, network=made[0][0])
        assert client.api.wait(stopped, timeout=60)['StatusCode'] == 0
        rc, out, by_id, lines = run_doctor(egress_env, tmp_path, 'leftovers')
        assert rc == 0, out[-4000:]
        dead_net, dead_probe = made[0]
        live_net, live_probe = made[1]
        swept = [line for line in lines if line['id'] == 'leftovers.removed' and dead_net in line['message']]
        assert swept and swept[0]['status'] == 'ok', lines
        assert dead_probe in swept[0]['message']
        assert 'detaching %s' % egress_env.proxy in swept[0]['message']
        assert stopped in swept[0]['message'], swept
        assert made[0][0] not in client.api.inspect_container(egress_env.proxy)['NetworkSettings']['Networks']
        assert made[0][0] not in client.api.inspect_container(stopped)['NetworkSettings']['Networks']
        assert 'EARLIER doctor run' in swept[0]['message']
        assert not _no_doctor_objects_of(client, dead.pid)
        with pytest.raises(docker.errors.NotFound):
            client.api.inspect_container(dead_probe)
        # The live pid's leftover is another doctor's: untouched and unmentioned.
        assert not [line for line in lines if live_net in line['message']], lines
        client.api.inspect_network(live_net)
        assert client.api.inspect_container(live_probe)['State']['Running']
    finally:
        live.kill()
        live.wait()
        _remove_container(client, stopped)
        for net, probe in made:
            _remove_container(client, probe)
            _remove_network(client, net)


@pytest.fixture
def own_proxy(egress_env, tmp_path_factory):
    """h7-proxy: a proxy of this file's own, on the shared upstream network."""
    client = egress_env.client
    deploy_dir = str(tmp_path_factory.mktemp('h7deploy') / 'egress')
    _remove_container(client, OWN_PROXY)
    rc, out, _recap = run_playbook('playbooks/site.yml', {
        'egress_deploy_dir': deploy_dir,
        'egress_proxy_name': OWN_PROXY,
        'egress_proxy_upstream_network': egress_env.upstream_net,
        'egress_proxy_network_internal': True,
        'egress_allowlist_seed': egress_env.allowlist,
        'egress_proxy_install_debootstrap': False,
        'egress_private_destinations': [egress_env.upstream_subnet],
    })
    assert rc == 0, out[-4000:]
    try:
        yield deploy_dir
    finally:
        _remove_container(client, OWN_PROXY)


def _wait_healthy(client, name, deadline_s=60):
    end = time.monotonic() + deadline_s
    status = None
    while time.monotonic() < end:
        _venue.run_health_check(client, name)  # Podman with no systemd runs no health check timers
        state = client.api.inspect_container(name)['State']
        status = (state.get('Health') or {}).get('Status')
        if status == 'healthy':
            return
        time.sleep(0.5)
    raise AssertionError('%s not healthy within %ss (%s)' % (name, deadline_s, status))


def test_rules_that_let_everything_through_fail(egress_env, own_proxy, tmp_path):
    client = egress_env.client
    rules = os.path.join(own_proxy, 'deploy', 'egress-proxy.conf')
    inode = os.stat(rules).st_ino
    with open(rules, 'r+') as handle:  # in place: the proxy reads it through a single-file bind mount
        text = handle.read()
        marker = 'http_access deny pi_allowlist pi_guard'
        assert marker in text
        text = text.replace(marker, 'http_access allow all\n' + marker, 1)
        handle.seek(0)
        handle.write(text)
        handle.truncate()
    assert os.stat(rules).st_ino == inode
    client.api.restart(OWN_PROXY, timeout=10)
    _wait_healthy(client, OWN_PROXY)
    # A declaration nobody rendered: the include inside the proxy is stale.
    with open(os.path.join(own_proxy, 'model-endpoints.json'), 'w') as handle:
        json.dump({'version': 1, 'endpoints': [{'id': 'm1', 'host': 'models.test', 'port': 11434, 'slots': 1}]},
                  handle)

    rc, out, by_id, lines = run_doctor(egress_env, tmp_path, 'leaky', egress_proxy_name=OWN_PROXY,
                                       egress_deploy_dir=own_proxy)
    assert rc != 0, out[-4000:]
    # .get: a probe that got no answer reports canary.notrun instead, and the lines say why.
    assert by_id.get('canary.deny_leaks', {}).get('status') == 'fail', lines
    assert 'denied.test' in by_id['canary.deny_leaks']['message']
    assert by_id.get('canary.plain_leaks', {}).get('status') == 'fail', lines
    assert by_id.get('canary.provider', {}).get('status') == 'ok', lines
    differ = by_id['proxy.rules_differ']
    assert differ['status'] == 'warn' and rules in differ['message']
    assert 'plugins/module_utils/_policy/rules.py' in differ['message']
    assert by_id['endpoints.include_stale']['status'] == 'fail', lines
    for line in lines:
        if line['status'] in ('warn', 'fail'):
            assert line['fix'], line

    # Proxy stopped: a hard failure naming the start command; no probe claims a pass.
    client.api.stop(OWN_PROXY, timeout=10)
    rc, out, by_id, lines = run_doctor(egress_env, tmp_path, 'stopped', egress_proxy_name=OWN_PROXY,
                                       egress_deploy_dir=own_proxy)
    assert rc != 0, out[-4000:]
    assert by_id['proxy.stopped']['status'] == 'fail'
    assert by_id['proxy.stopped']['fix'] == 'docker start %s' % OWN_PROXY
    assert not [line for line in lines if line['id'].startswith('canary.') and line['status'] == 'ok']


class _StuckAPI(object):
    """The real API client, except that removing one container fails as a wedged daemon would."""

    def __init__(self, api, stuck):
        self._api = api
        self._stuck = stuck

    def remove_container(self, name, **kwargs):
        if name == self._stuck:
            raise docker.errors.APIError('simulated: device or resource busy')
        return self._api.remove_container(name, **kwargs)

    def __getattr__(self, name):
        return getattr(self._api, name)


class _StuckClient(object):
    def __init__(self, client, stuck):
        self.api = _StuckAPI(client.api, stuck)
        self.containers = client.containers
        self.networks = client.networks
        self.images = client.images


@pytest.mark.alone  # plants a dead run's leftovers: another worker's doctor would sweep them first (CI, measured)
def test_stuck_probe_keeps_the_network(egress_env):
    """A probe the daemon will not remove: the real network is kept (the only handle on it) and reported."""
    client = egress_env.client
    dead = subprocess.Popen(['true'])
    dead.wait()
    net = 'pi-dispatch-egress-doctor-%d' % dead.pid
    probe = 'pi-dispatch-egress-probe-deny-%d' % dead.pid
    _remove_container(client, probe)
    _remove_network(client, net)
    client.networks.create(net, driver='bridge', internal=True)
    client.containers.run(egress_env.tools_image, ['sleep', '300'], name=probe, detach=True, network=net)
    try:
        doc = _doctor.Doctor(_StuckClient(client, probe), _doctor.DoctorOptions(
            egress_env.proxy, egress_env.deploy_dir, egress_env.tools_image, environ={}))
        lines = [line for line in doc.checks['sweep'].lines(doc.ctx) if net in line.message]
        assert [(line.id, line.status) for line in lines] == [('leftovers.kept', 'warn')], lines
        assert 'docker rm -f %s' % probe in lines[0].message
        client.api.inspect_network(net)  # kept
        assert client.api.inspect_container(probe)['State']['Running']
        # Once the probe goes, the next run sweeps the network.
        _remove_container(client, probe)
        options = _doctor.DoctorOptions(egress_env.proxy, egress_env.deploy_dir, egress_env.tools_image, environ={})
        doc = _doctor.Doctor(client, options)
        lines = [line for line in doc.checks['sweep'].lines(doc.ctx) if net in line.message]
        assert [line.id for line in lines] == ['leftovers.removed'], lines
        with pytest.raises(docker.errors.NotFound):
            client.api.inspect_network(net)
    finally:
        _remove_container(client, probe)
        _remove_network(client, net)


MODELS_JSON = """// the overlay a worker reads (comments and trailing commas are fine)
{
  "providers": {
    "local-fake": {
      "baseUrl": "http://models.test:8080/v1",
      "api": "openai-completions",
      "apiKey": "$PI_DISPATCH_KEYLESS",
      "models": [{"id": "fake-model", "compat": {"maxTokensField": "max_tokens"}},],
    },
    "on-loopback": {"baseUrl": "http://localhost:11434/v1", "api": "openai-completions", "apiKey": "K",
                    "models": [{"id": "x"}]},
  },
}
"""


MCP_JSON = """// the job's MCP servers, read as pi reads them
{"mcpServers": {
  "http": {"url": "http://models.test:8931/mcp", "type": "streamable-http"},
  "tls": {"url": "https://models.test:8443/mcp"},
  "docs": {"url": "https://api.provider.test/mcp", "headers": {"Authorization": "Bearer sk-never-shown"},},
  "off": {"url": "https://unlisted.test/mcp", "enabled": false},
}}
"""


def test_a_job_naming_an_unreachable_mcp_server_is_refused_before_it_starts(egress_env, tmp_path):
    """The preflight given the job's mcp.json (API 3.3), against the session's deployment and its running proxy."""
    from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as jn
    mcp = tmp_path / 'mcp.json'
    mcp.write_text('{"mcpServers": {"docs": {"url": "https://api.provider.test/mcp"}, '
                   '"tracker": {"url": "https://tracker.unlisted.test/mcp"}}}')
    v = jn.preflight(egress_env.client, proxy_name=egress_env.proxy, mcp_json=str(mcp),
                     deploy_dir=egress_env.deploy_dir)
    assert v.verdict == jn.MCP_SERVER_REFUSED and not v.retryable, v
    assert "MCP server 'tracker' (https://tracker.unlisted.test/mcp)" in v.message and "'docs'" not in v.message
    # What the proxy does with each, from a job network: the listed one answers, the refused one gets squid's 403.
    assert egress_env.curl(['https://api.provider.test/mcp'])['code'] == 401
    assert egress_env.curl(['https://tracker.unlisted.test/mcp'])['connect'] == 403
    mcp.write_text('{"mcpServers": {"docs": {"url": "https://api.provider.test/mcp"}, '
                   '"tracker": {"url": "https://tracker.unlisted.test/mcp", "disabled": true}}}')
    v = jn.preflight(egress_env.client, proxy_name=egress_env.proxy, mcp_json=str(mcp),
                     deploy_dir=egress_env.deploy_dir)
    assert v.verdict == jn.ADMIT and '1 MCP server carried by the proxy' in v.message, v


def test_model_endpoint_probes_and_overlay(egress_env, own_proxy, tmp_path):
    """Declared endpoints on this file's own proxy: one served (models.test:8080), one where nothing listens."""
    # Used only by MCP servers of the overlay's mcp.json (issue 31): mcp-http, the fake's streamable HTTP MCP server
    # (8931: no /v1/models, a 404), and mcp-tls, the fake's TLS port.
    endpoints = [{'id': 'fake-http', 'host': 'models.test', 'port': 8080, 'slots': 1, 'keyless': True},
                 {'id': 'down', 'host': 'models.test', 'port': 9099, 'slots': 1},
                 {'id': 'mcp-http', 'host': 'models.test', 'port': 8931, 'slots': 1},
                 {'id': 'mcp-tls', 'host': 'models.test', 'port': 8443, 'slots': 1}]
    rc, out, _recap = run_playbook('playbooks/endpoints.yml', {
        'egress_deploy_dir': own_proxy, 'egress_proxy_name': OWN_PROXY, 'egress_model_endpoints': endpoints})
    assert rc == 0, out[-4000:]
    overlay = tmp_path / 'models.json'
    overlay.write_text(MODELS_JSON)
    mcp = tmp_path / 'mcp.json'
    mcp.write_text(MCP_JSON)
    rc, out, by_id, lines = run_doctor(egress_env, tmp_path, 'endpoints', egress_proxy_name=OWN_PROXY,
                                       egress_deploy_dir=own_proxy, doctor_models_json=str(overlay),
                                       doctor_mcp_json=str(mcp), doctor_isolation=False)
    assert rc == 0, out[-4000:]  # warnings only
    assert by_id['endpoints.include']['status'] == 'ok', lines

    def of(line_id, endpoint_id):
        found = [line for line in lines if line['id'] == line_id and 'endpoint %s' % endpoint_id in line['message']]
        assert len(found) == 1, (line_id, endpoint_id, lines)
        return found[0]

    # The served endpoint: a tunnel gets the server's 200, the next port the proxy's 403, a plain request squid's.
    tunnel = of('endpoint.tunnel', 'fake-http')
    assert 'GET http://models.test:8080/v1/models through a CONNECT tunnel: 200' in tunnel['message']
    port = of('endpoint.port_exact', 'fake-http')
    assert 'models.test:8081' in port['message']
    plain = of('endpoint.plain', 'fake-http')
    assert 'ERR_ACCESS_DENIED' in plain['message']
    # Nothing listens on 9099: the proxy let the tunnel through and nothing answered (503), a warning.
    down = of('endpoint.tunnel_fails', 'down')
    assert down['status'] == 'warn' and '503' in down['message'] and down['fix']
    assert 'models.test:9100' in of('endpoint.port_exact', 'down')['message']
    assert of('endpoint.plain', 'down')['status'] == 'ok'
    # The endpoints only an MCP server uses pass on any answer through the tunnel, where a model endpoint warns (the
    # unit table): the streamable HTTP server's 404 for /v1/models, and the TLS server closing the plain request.
    # Their other lines are named so too.
    mcp_http = of('endpoint.mcp_tunnel', 'mcp-http')
    assert mcp_http['status'] == 'ok' and 'through a CONNECT tunnel: 404); an MCP server' in mcp_http['message']
    mcp_tls = of('endpoint.mcp_tunnel', 'mcp-tls')
    assert mcp_tls['status'] == 'ok' and 'as a TLS server does' in mcp_tls['message'], mcp_tls
    for endpoint_id in ('mcp-http', 'mcp-tls'):
        assert [line['status'] for line in lines
                if line['message'].startswith('MCP server endpoint %s' % endpoint_id)] == ['ok', 'ok', 'ok'], lines
    assert by_id['overlay.mcp_ok']['status'] == 'ok' and 'tls (is the declared model endpoint mcp-tls' in \
        by_id['overlay.mcp_ok']['message'], by_id['overlay.mcp_ok']
    # The overlay against the declaration.
    assert by_id['overlay.uses']['status'] == 'ok' and 'fake-http' in by_id['overlay.uses']['message']
    assert by_id['overlay.keyless']['status'] == 'ok' and 'local-fake' in by_id['overlay.keyless']['message']
    assert by_id['overlay.loopback']['status'] == 'warn' and by_id['overlay.loopback']['fix']
    assert by_id['isolation.notrun']['status'] == 'notrun'
    # doctor_squid_mirror: false (doctor_vars) is said as a not-run line naming the switch, never a pass.
    mirror = by_id['proxy.squid_mirror_unread']
    assert mirror['status'] == 'notrun' and 'switched off (squid_mirror: false' in mirror['message'], mirror
    assert by_id['proxy.squid']['status'] == 'ok', lines  # the installed version is still read
    assert not doctor_objects_left(egress_env.client)


@pytest.mark.alone  # plants a dead run's leftovers: another worker's doctor would sweep them first
def test_killed_isolation_leftovers_are_swept(egress_env, tmp_path):
    """A killed doctor left its two isolation job networks with peers and the proxy on them."""
    _names = _doctor_names
    client = egress_env.client
    dead = subprocess.Popen(['true'])
    dead.wait()
    nets = [_names.isolation_network_name(dead.pid, peer) for peer in _names.PEERS]
    peers = [_names.peer_name(peer, dead.pid) for peer in _names.PEERS]
    try:
        for net, peer in zip(nets, peers):
            _remove_container(client, peer)
            _remove_network(client, net)
            client.networks.create(net, driver='bridge', internal=True)
            client.networks.get(net).connect(egress_env.proxy)
            client.containers.run(egress_env.tools_image, ['sleep', '300'], name=peer, detach=True, network=net)
        rc, out, by_id, lines = run_doctor(egress_env, tmp_path, 'isolation-leftovers')
        assert rc == 0, out[-4000:]
        for net, peer in zip(nets, peers):
            swept = [line for line in lines if line['id'] == 'leftovers.removed' and net in line['message']]
            assert swept, lines
            assert peer in swept[0]['message'] and 'detaching %s' % egress_env.proxy in swept[0]['message']
            with pytest.raises(docker.errors.NotFound):
                client.api.inspect_network(net)
            with pytest.raises(docker.errors.NotFound):
                client.api.inspect_container(peer)
    finally:
        for net, peer in zip(nets, peers):
            _remove_container(client, peer)
            _remove_network(client, net)


def test_isolation_check_catches_peers_on_one_network(egress_env, monkeypatch):
    """The check can fail: when both peers land on one job network, each reaches the other and it says so."""
    client = egress_env.client
    real_create = _jobnet_lifecycle.create_job_network
    made = {}

    def shared(client_, job_id, **kwargs):
        if job_id.endswith('-b') and 'a' in made:
            return made['a']  # the broken layout: b's job shares a's network
        made['a'] = real_create(client_, job_id, **kwargs)
        return made['a']

    monkeypatch.setattr(_jobnet_lifecycle, 'create_job_network', shared)
    doc = _doctor.Doctor(client, _doctor.DoctorOptions(egress_env.proxy, egress_env.deploy_dir, egress_env.tools_image,
                                                       environ={}, start_grace=20))
    lines = doc.checks['isolation'].lines(doc.ctx)
    assert [(line.id, line.status) for line in lines][:1] == [('isolation.leaks', 'fail')], lines
    assert "reached pi-dispatch-egress-probe-peer-b-" in lines[0].message
    assert lines[0].fix
    # It cleaned up after itself all the same.
    assert not client.api.networks(filters={'name': 'pi-job-doctor-%d-' % doc.pid})
    assert not [c for c in doctor_objects_left(client) if 'pi-dispatch-egress-probe-peer-' in c]


def test_a_fresh_deployment_without_the_job_image_runs_every_canary_line(egress_env, tmp_path):
    """Issue 25, item 5: the default probe image is the job image, which a host without pi-dispatch's worker
    does not have. The role builds the collection's probe image (never pulled) and every canary line runs."""
    client = egress_env.client
    try:
        client.images.get('pi-dispatch-job:latest')
        pytest.skip('this daemon has a pi-dispatch-job:latest image; the fallback is not exercised')
    except docker.errors.ImageNotFound:
        pass
    more = dict(doctor_probe_image='pi-dispatch-job:latest', doctor_probe_fallback_image='pi-dispatch-egress-probe:it')
    rc, out, by_id, lines = run_doctor(egress_env, tmp_path, 'fallback-probe-image', **more)
    assert rc == 0, out[-4000:]
    line = by_id['canary.probe_image']
    assert line['status'] == 'ok' and 'pi-dispatch-egress-probe:it' in line['message'], line
    assert 'pi-dispatch-job:latest is not on this daemon' in line['message']
    for line_id in ('canary.provider', 'canary.deny', 'canary.plain', 'canary.sni', 'canary.tunnel_plain',
                    'isolation.peers'):
        assert by_id[line_id]['status'] == 'ok', (line_id, by_id.get(line_id), out[-4000:])
    assert not [line for line in lines if line['status'] == 'notrun'
                and line['id'].split('.')[0] in ('canary', 'endpoints', 'isolation')], lines
    labels = client.images.get('pi-dispatch-egress-probe:it').labels
    assert labels.get('org.opencontainers.image.title') == 'pi-dispatch egress doctor probe'
    # a second run finds the image built and builds nothing
    rc, out, by_id, _lines = run_doctor(egress_env, tmp_path, 'fallback-probe-image-again', **more)
    assert rc == 0 and by_id['canary.probe_image']['status'] == 'ok', out[-4000:]
