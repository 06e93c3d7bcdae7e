"""site.yml on the real engine: layout, idempotence, the operator's files, bad input."""

import hashlib
import json
import os

import pytest

pytestmark = pytest.mark.integration

FILES = ['egress-allowlist.conf', 'deploy/egress-proxy.conf', 'model-endpoints.json', 'model-endpoints.conf']


def _digests(root):
    out = {}
    for name in FILES:
        path = os.path.join(root, name)
        st = os.stat(path)
        with open(path, 'rb') as handle:
            out[name] = (hashlib.sha256(handle.read()).hexdigest(), st.st_ino, st.st_mtime_ns)
    return out


def _started_at(env):
    return env.client.api.inspect_container(env.proxy)['State']['StartedAt']


def test_first_run_laid_out_the_folder_and_said_so(egress_env):
    for name in FILES:
        assert os.path.isfile(os.path.join(egress_env.deploy_dir, name)), name
    out = egress_env.first_site_output
    assert 'Created: ' in out and 'egress-allowlist.conf' in out
    first = egress_env.first_files
    for entry in egress_env.allowlist:
        assert '\n%s' % entry['host'] in '\n' + first['egress-allowlist.conf']
    assert json.loads(first['model-endpoints.json']) == {'version': 1, 'endpoints': []}
    assert first['deploy/egress-proxy.conf'].startswith('# pi-dispatch egress proxy rules')
    include = [ln for ln in first['model-endpoints.conf'].splitlines() if ln.strip() and not ln.startswith('#')]
    assert include == []


def test_squid_parses_the_deployed_rules_in_the_image(egress_env):
    container = egress_env.client.containers.get(egress_env.proxy)
    rc, out = container.exec_run(['squid', '-k', 'parse', '-f', '/etc/squid/squid.conf'])
    text = out.decode('utf-8', 'replace')
    assert rc == 0, text
    assert 'FATAL' not in text and 'ERROR' not in text, text


def test_container_shape(egress_env):
    attrs = egress_env.client.api.inspect_container(egress_env.proxy)
    host = attrs['HostConfig']
    assert attrs['State']['Running'] is True
    assert attrs['State']['Health']['Status'] == 'healthy'
    assert host['RestartPolicy']['Name'] == 'unless-stopped'
    if egress_env.venue.is_podman:
        # Podman names the host itself (host.containers.internal); 4.3 would write "host-gateway" literally.
        assert 'host.docker.internal:host-gateway' not in (host.get('ExtraHosts') or [])
        rc, out = egress_env.client.containers.get(egress_env.proxy).exec_run(['cat', '/etc/hosts'])
        assert rc == 0 and 'host.containers.internal' in out.decode() and 'host-gateway' not in out.decode(), out
    else:
        assert 'host.docker.internal:host-gateway' in (host.get('ExtraHosts') or [])
    assert not host.get('PortBindings') and not host.get('PublishAllPorts')
    assert not attrs['NetworkSettings'].get('Ports', {}).get('3128/tcp')
    mounts = dict((m['Destination'], m) for m in attrs['Mounts'])
    want = {
        '/etc/squid/squid.conf': 'deploy/egress-proxy.conf',
        '/etc/pi-dispatch/egress-allowlist.conf': 'egress-allowlist.conf',
        '/etc/pi-dispatch/model-endpoints.conf': 'model-endpoints.conf',
        '/etc/pi-dispatch/egress-guard.conf': 'egress-guard.conf',
    }
    # the decision log's folder is the one mount the proxy writes to
    assert set(mounts) == set(want) | {'/var/log/pi-dispatch'}
    for dest, rel in want.items():
        assert mounts[dest]['Source'] == os.path.join(egress_env.deploy_dir, rel)
        assert mounts[dest]['RW'] is False
    assert mounts['/var/log/pi-dispatch']['Source'] == os.path.join(egress_env.deploy_dir, 'decisions')
    assert mounts['/var/log/pi-dispatch']['RW'] is True
    assert not any('docker.sock' in m['Source'] for m in attrs['Mounts'])
    nets = attrs['NetworkSettings']['Networks']
    assert egress_env.upstream_net in nets
    upstream = egress_env.client.api.inspect_network(egress_env.upstream_net)
    assert upstream['Internal'] is True
    labels = egress_env.client.api.inspect_image(attrs['Image'])['Config']['Labels']
    assert labels['io.pi-dispatch.egress.squid-version'].startswith('6.')


def test_second_run_changes_nothing(egress_env):
    before = _digests(egress_env.deploy_dir)
    started = _started_at(egress_env)
    rc, out, recap = egress_env.site()
    assert rc == 0, out[-4000:]
    assert recap.get('changed') == 0, out[-4000:]
    assert _digests(egress_env.deploy_dir) == before
    assert _started_at(egress_env) == started


def test_check_mode_on_a_deployed_host_predicts_no_change(egress_env):
    rc, out, recap = egress_env.site(check=True)
    assert rc == 0, out[-4000:]
    assert recap.get('changed') == 0, out[-4000:]


def test_hand_edited_allowlist_is_left_untouched_and_read_without_a_restart(egress_env):
    """An operator lists models.test by hand: site.yml keeps the file and reconfigures squid (no restart)."""
    path = os.path.join(egress_env.deploy_dir, 'egress-allowlist.conf')
    with open(path) as handle:
        original = handle.read()
    edited = original + '# added by the operator\nmodels.test\n'
    refused = egress_env.curl(['https://models.test/'])
    assert refused['connect'] == 403, refused['raw']  # not listed yet
    started = _started_at(egress_env)
    with open(path, 'w') as handle:  # in place: the proxy mounts this single file
        handle.write(edited)
    try:
        before = _digests(egress_env.deploy_dir)
        rc, out, recap = egress_env.site()
        assert rc == 0, out[-4000:]
        assert recap.get('changed') == 1, out[-4000:]  # the proxy task: a reconfigure, nothing else
        assert 'reconfigure' in out and 'the allowlist differs from what squid last read' in out, out[-4000:]
        with open(path) as handle:
            assert handle.read() == edited
        assert _digests(egress_env.deploy_dir) == before
        assert 'Left untouched' in out and 'egress-allowlist.conf' in out
        assert _started_at(egress_env) == started  # not restarted: no job was cut
        reached = egress_env.curl(['https://models.test/'])
        assert (reached['connect'], reached['code']) == (200, 401), reached['raw']
        # Nothing changed since: the next run is quiet.
        rc, out, recap = egress_env.site()
        assert rc == 0 and recap.get('changed') == 0, out[-4000:]
    finally:
        with open(path, 'w') as handle:
            handle.write(original)
        rc, out, _recap = egress_env.site()
        assert rc == 0, out[-4000:]
    gone = egress_env.curl(['https://models.test/'])
    assert gone['connect'] == 403, gone['raw']


def test_bad_allowlist_is_refused_with_file_and_line_and_proxy_keeps_running(egress_env):
    path = os.path.join(egress_env.deploy_dir, 'egress-allowlist.conf')
    with open(path) as handle:
        original = handle.read()
    lines = original.splitlines()
    bad_lineno = len(lines) + 1
    started = _started_at(egress_env)
    with open(path, 'w') as handle:
        handle.write(original + 'https://evil.test/path\n')
    try:
        rc, out, _recap = egress_env.site()
        assert rc != 0
        assert '%s:%d' % (path, bad_lineno) in out, out[-4000:]
        assert 'https://evil.test/path' in out
        attrs = egress_env.client.api.inspect_container(egress_env.proxy)
        assert attrs['State']['Running'] is True
        assert attrs['State']['StartedAt'] == started
    finally:
        with open(path, 'w') as handle:
            handle.write(original)
    r = egress_env.curl(['https://api.provider.test/'])
    assert r['code'] == 401, r['raw']
