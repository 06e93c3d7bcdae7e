"""Verify the converged roles on the local host (testinfra)."""

import json

DEPLOY = '/tmp/pi-egress-molecule/egress'
PROXY = 'pi-dispatch-egress-proxy-mol'
UPSTREAM = 'pi-dispatch-egress-out-mol'


def _inspect(host, kind, name):
    out = host.check_output('docker %s inspect %s', kind, name)
    return json.loads(out)[0]


def test_deployment_files(host):
    for rel in ('egress-allowlist.conf', 'deploy/egress-proxy.conf', 'model-endpoints.json',
                'model-endpoints.conf'):
        f = host.file('%s/%s' % (DEPLOY, rel))
        assert f.is_file and not f.is_symlink, rel
    allow = host.file(DEPLOY + '/egress-allowlist.conf').content_string
    assert 'api.provider.test' in allow and '.forge.test' in allow
    assert 'api.anthropic.com' not in allow
    assert json.loads(host.file(DEPLOY + '/model-endpoints.json').content_string) == {
        'version': 1, 'endpoints': []}


def test_container_running_and_healthy(host):
    attrs = _inspect(host, 'container', PROXY)
    assert attrs['State']['Running'] is True
    assert attrs['State']['Health']['Status'] == 'healthy'
    assert attrs['HostConfig']['RestartPolicy']['Name'] == 'unless-stopped'


def test_files_are_read_only_and_only_the_decision_log_folder_is_writable(host):
    attrs = _inspect(host, 'container', PROXY)
    mounts = dict((m['Destination'], m) for m in attrs['Mounts'])
    assert mounts['/etc/squid/squid.conf']['Source'] == DEPLOY + '/deploy/egress-proxy.conf'
    assert mounts['/etc/pi-dispatch/egress-allowlist.conf']['Source'] == DEPLOY + '/egress-allowlist.conf'
    assert mounts['/etc/pi-dispatch/model-endpoints.conf']['Source'] == DEPLOY + '/model-endpoints.conf'
    assert mounts['/etc/pi-dispatch/egress-guard.conf']['Source'] == DEPLOY + '/egress-guard.conf'
    # every file read-only; the one writable mount is the decision log's folder
    assert [m['Destination'] for m in attrs['Mounts'] if m['RW']] == ['/var/log/pi-dispatch']
    assert mounts['/var/log/pi-dispatch']['Source'] == DEPLOY + '/decisions'
    assert len(attrs['Mounts']) == 5


def test_no_published_ports(host):
    attrs = _inspect(host, 'container', PROXY)
    assert not attrs['HostConfig'].get('PortBindings')
    assert not attrs['HostConfig'].get('PublishAllPorts')
    ports = host.check_output('docker port %s', PROXY)
    assert ports.strip() == ''


def test_upstream_network_is_internal_in_the_scenario(host):
    net = _inspect(host, 'network', UPSTREAM)
    assert net['Internal'] is True
    assert [c['Name'] for c in net['Containers'].values()] == [PROXY]


def test_squid_parses_its_rules(host):
    cmd = host.run('docker exec %s squid -k parse -f /etc/squid/squid.conf', PROXY)
    assert cmd.rc == 0, cmd.stderr
    assert 'FATAL' not in cmd.stderr + cmd.stdout
