"""Verify the upgraded host (testinfra)."""

import json

DEPLOY = '/tmp/pi-egress-molecule-upgrade/egress'
PROXY = 'pi-dispatch-egress-proxy-molup'
INCLUDE = 'include /etc/pi-dispatch/model-endpoints.conf'
GUARD = 'include /etc/pi-dispatch/egress-guard.conf'


def _inspect(host):
    return json.loads(host.check_output('docker container inspect %s', PROXY))[0]


def test_one_backup_holds_the_old_rules(host):
    listing = host.check_output('ls %s/deploy', DEPLOY).split()
    backups = [name for name in listing if name.startswith('egress-proxy.conf.bak-')]
    assert len(backups) == 1, listing
    old = host.file('%s/deploy/%s' % (DEPLOY, backups[0])).content_string
    assert 'http_access deny all' in old and INCLUDE not in old and GUARD not in old


def test_new_rules_include_the_guard_and_the_endpoints(host):
    new = host.file(DEPLOY + '/deploy/egress-proxy.conf').content_string
    assert INCLUDE in new and GUARD in new
    assert new.index(GUARD) < new.index(INCLUDE)


def test_the_upgrade_added_the_missing_guard_include(host):
    guard = host.file(DEPLOY + '/egress-guard.conf')
    assert guard.is_file and not guard.is_symlink
    assert 'acl pi_guard dst' in guard.content_string and '10.47.0.0/16' in guard.content_string


def test_proxy_replaced_with_four_mounts_and_healthy(host):
    attrs = _inspect(host)
    dests = sorted(m['Destination'] for m in attrs['Mounts'])
    # the four files, and the decision log's folder the refreshed rules write to
    assert dests == ['/etc/pi-dispatch/egress-allowlist.conf', '/etc/pi-dispatch/egress-guard.conf',
                     '/etc/pi-dispatch/model-endpoints.conf', '/etc/squid/squid.conf', '/var/log/pi-dispatch']
    assert attrs['State']['Running'] is True
    assert attrs['State']['Health']['Status'] == 'healthy'


def test_squid_runs_the_new_rules(host):
    cmd = host.run('docker exec %s squid -k parse -f /etc/squid/squid.conf', PROXY)
    assert cmd.rc == 0, cmd.stderr
    assert INCLUDE in host.check_output('docker exec %s cat /etc/squid/squid.conf', PROXY)
