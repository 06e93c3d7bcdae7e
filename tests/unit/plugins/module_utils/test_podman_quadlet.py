"""The proxy as Quadlet units (_podman/quadlet.py, _podman/units_apply.py), no engine.

The refusals are tabled once here for both renderers (Quadlet's and _podman/systemd_units.py's).

test_quadlet.py starts these units under systemd on Podman 5 and compares the container with the wanted shape;
here: each setting of the shape lands in the unit, quoting, refusals, and the writes.
"""

import os

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import venue as _venue
from ansible_collections.pi_dispatch.egress.plugins.module_utils._podman import quadlet as _quadlet
from ansible_collections.pi_dispatch.egress.plugins.module_utils._podman import systemd_units as _systemd
from ansible_collections.pi_dispatch.egress.plugins.module_utils._podman import units_apply as _units
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import spec as _spec

PODMAN = _venue.Venue(_venue.PODMAN, '5.4.2')


def podman_spec(**more):
    spec = _spec.desired_spec('localhost/pi-dispatch-egress-proxy:latest', '/d/deploy/egress-proxy.conf',
                              '/d/egress-allowlist.conf', '/d/model-endpoints.conf', guard='/d/egress-guard.conf',
                              **more)
    return _spec.for_venue(spec, PODMAN)


def unit_lines(spec, scope='system'):
    return _quadlet.container_unit(spec, scope).splitlines()


@pytest.mark.parametrize('line', [
    'ContainerName=pi-dispatch-egress-proxy',
    'Image=localhost/pi-dispatch-egress-proxy:latest',
    'Exec=sh -c "cp /etc/pi-dispatch/egress-allowlist.conf /tmp/pi-egress-loaded-allowlist.conf; exec squid -N -f '
    '/etc/squid/squid.conf"',
    'Network=pi-dispatch-egress-out.network',
    'Volume=/d/deploy/egress-proxy.conf:/etc/squid/squid.conf:ro',
    'Volume=/d/egress-allowlist.conf:/etc/pi-dispatch/egress-allowlist.conf:ro',
    'Volume=/d/model-endpoints.conf:/etc/pi-dispatch/model-endpoints.conf:ro',
    'Volume=/d/egress-guard.conf:/etc/pi-dispatch/egress-guard.conf:ro',
    'ReadOnly=true',
    'DropCapability=all',
    'NoNewPrivileges=true',
    'Label=io.pi-dispatch.egress.role=proxy',
    'HealthCmd=["squidclient", "-h", "localhost", "-p", "3128", "-T", "3", "mgr:info"]',
    'HealthInterval=5s',
    'HealthTimeout=5s',
    'HealthRetries=3',
    'HealthStartPeriod=5s',
    'Restart=always',
    'WantedBy=multi-user.target',
])
def test_every_setting_of_the_shape_is_in_the_container_unit(line):
    assert line in unit_lines(podman_spec())


@pytest.mark.parametrize('arg', [
    '--pull=never',
    '--tmpfs=/run/squid:rw,nosuid,nodev,noexec,size=1m,U,mode=0755',  # U: Podman refuses uid=
    '--tmpfs=/tmp:rw,nosuid,nodev,noexec,size=16m,mode=1777',
    '--tmpfs=/run:rw,nosuid,nodev,noexec,size=1m,mode=0755',  # named, or Podman mounts it executable
    '--tmpfs=/var/tmp:rw,nosuid,nodev,noexec,size=1m,mode=1777',
    '--sysctl=net.ipv4.ip_forward=0',
    '--sysctl=net.ipv6.conf.all.forwarding=0',
    '--ulimit=nofile=16384:16384',
    '--ulimit=nproc=4096:4096',
    '--memory=536870912',
    '--memory-swap=536870912',
    '--pids-limit=256',
    '--log-driver=k8s-file',
    '--log-opt=max-size=10m',
])
def test_the_rest_goes_through_podman_args(arg):
    podman_args = [line for line in unit_lines(podman_spec()) if line.startswith('PodmanArgs=')]
    assert len(podman_args) == 1 and arg in podman_args[0].split('=', 1)[1].split(' ')


def test_no_host_gateway_and_no_max_file_on_podman():
    text = _quadlet.container_unit(podman_spec())
    assert 'host-gateway' not in text and 'max-file' not in text and 'host.docker.internal' not in text


def test_the_decision_log_mount_and_the_environment_and_extra_networks():
    spec = podman_spec(decision_log=dict(dir='/d/decisions', max_size='10m', keep=5),
                       credentials_include='/d/egress-credentials.conf')
    lines = unit_lines(spec)
    assert 'Volume=/d/decisions:/var/log/pi-dispatch:rw' in lines  # the one read-write mount
    assert 'Network=pi-dispatch-egress-credentials' in lines
    assert any(line.startswith('Environment=PI_EGRESS_DECISION_LOG_NAME=') for line in lines)


def test_user_scope_is_wanted_by_the_default_target():
    assert 'WantedBy=default.target' in unit_lines(podman_spec(), 'user')


@pytest.mark.parametrize('word, quoted', [
    ('plain', 'plain'),
    ('two words', '"two words"'),
    ('a;b', '"a;b"'),
    ('100%', '100%%'),  # systemd specifiers
    ('say "hi"', '"say \\"hi\\""'),
    ('back\\slash', '"back\\\\slash"'),
    ('', '""'),
])
def test_quoting_for_a_systemd_command_line(word, quoted):
    assert _quadlet.quote(word) == quoted


@pytest.mark.parametrize('render', [_quadlet.container_unit, _systemd.container_unit], ids=['quadlet', 'systemd'])
@pytest.mark.parametrize('change, fragment', [
    (dict(for_venue=None), 'was not made for Podman'),
    (dict(security_opt=['no-new-privileges:true', 'seccomp=unconfined']), 'seccomp=unconfined'),
    (dict(healthcheck=dict(test=['CMD-SHELL', 'true'], interval=5, timeout=5, retries=3, start_period=5)),
     'not an exec form'),
])
def test_a_shape_the_unit_cannot_say_is_refused(render, change, fragment):
    spec = dict(podman_spec(), **change)
    with pytest.raises(_quadlet.QuadletError, match=fragment):
        render(spec)


def test_a_duration_that_is_not_whole_seconds_is_refused():
    with pytest.raises(_quadlet.QuadletError, match='whole seconds'):
        _quadlet.seconds(1500000000)


@pytest.mark.parametrize('internal, expect', [(True, ['Internal=true']), (False, [])])
def test_the_network_unit(internal, expect):
    lines = _quadlet.network_unit(podman_spec(), internal, {'io.pi-dispatch.egress.network': 'upstream'}).splitlines()
    assert 'NetworkName=pi-dispatch-egress-out' in lines
    assert 'Label=io.pi-dispatch.egress.network=upstream' in lines
    assert [line for line in lines if line.startswith('Internal=')] == expect


def test_for_unit_leaves_the_restarts_to_systemd():
    assert _quadlet.for_unit(podman_spec())['restart_policy'] == 'no'
    assert podman_spec()['restart_policy'] == 'unless-stopped'


# --- units_apply: the module's writes ----------------------------------------------------------

PARAMS = dict(name='pi-dispatch-egress-proxy', image='pi-dispatch-egress-proxy:latest',
              network='pi-dispatch-egress-out', network_internal=True, extra_hosts=[], health_interval=5,
              memory='512m', pids_limit=256, nofile=16384, log_max_size='10m', log_max_file=3, scope='system',
              account=None, units_dir=None, state='present', deploy_dir='/d')
PATHS = dict(rules='/d/deploy/egress-proxy.conf', allowlist='/d/egress-allowlist.conf',
             endpoints_conf='/d/model-endpoints.conf', guard_conf='/d/egress-guard.conf')


def run(tmp_path, check_mode=False, **change):
    params = dict(dict(PARAMS, units_dir=str(tmp_path / 'units')), **change)
    return _units.apply(params, PATHS, check_mode=check_mode)


def test_written_once_then_unchanged_then_removed(tmp_path):
    first = run(tmp_path)
    assert first['changed'] and len(first['written']) == 2
    assert first['services'] == ['pi-dispatch-egress-proxy.service', 'pi-dispatch-egress-out-network.service']
    text = (tmp_path / 'units' / 'pi-dispatch-egress-proxy.container').read_text()
    assert 'Image=localhost/pi-dispatch-egress-proxy:latest' in text  # a short name is read as a local image
    assert oct(os.stat(str(tmp_path / 'units' / 'pi-dispatch-egress-proxy.container')).st_mode & 0o777) == '0o644'
    assert not run(tmp_path)['changed']
    changed = run(tmp_path, memory='256m')
    assert changed['written'] == [str(tmp_path / 'units' / 'pi-dispatch-egress-proxy.container')]
    gone = run(tmp_path, state='absent')
    assert gone['changed'] and len(gone['removed']) == 2 and not os.listdir(str(tmp_path / 'units'))


def test_check_mode_writes_nothing(tmp_path):
    result = run(tmp_path, check_mode=True)
    assert result['changed'] and not (tmp_path / 'units').exists()


def test_a_symlinked_unit_file_is_refused_and_nothing_is_written(tmp_path):
    folder = tmp_path / 'units'
    folder.mkdir()
    (tmp_path / 'elsewhere').write_text('x')
    os.symlink(str(tmp_path / 'elsewhere'), str(folder / 'pi-dispatch-egress-proxy.container'))
    with pytest.raises(_units.UnitsError, match='is a symlink'):
        run(tmp_path)
    assert sorted(os.listdir(str(folder))) == ['pi-dispatch-egress-proxy.container']
    assert (tmp_path / 'elsewhere').read_text() == 'x'


@pytest.mark.parametrize('change, fragment', [
    (dict(extra_hosts=['gw:host-gateway']), 'host-gateway'),
    (dict(extra_hosts=['nocolon']), 'is not name:address'),
    (dict(memory='lots'), 'memory'),
    (dict(scope='user', account=None, units_dir=None), 'scope user needs account'),
    (dict(scope='user', account='pi-egress-no-such-account', units_dir=None), 'does not exist'),
])
def test_bad_options_are_refused_before_anything_is_written(tmp_path, change, fragment):
    with pytest.raises(_units.UnitsError, match=fragment):
        run(tmp_path, **change)
    assert not (tmp_path / 'units').exists()


# --- a service account's units (units_scope user) ------------------------------------------------

@pytest.mark.parametrize('scope, cgroup_version, expect', [
    ('user', '1', 'no-conmon'),  # a user manager holds no v1 controller: split fails there (Podman 5.4)
    ('user', '2', None),
    ('user', '', None),
    ('system', '1', None),
    ('system', '2', None),
])
def test_the_cgroups_mode_a_unit_needs(scope, cgroup_version, expect):
    assert _quadlet.unit_cgroups(scope, cgroup_version) == expect


def podman_args_line(result):
    text = [d['after'] for d in result['diff'] if d['after_header'].endswith('.container')][0]
    return [line for line in text.splitlines() if line.startswith('PodmanArgs=')][0]


def test_the_cgroups_override_is_the_last_podman_arg_and_only_when_asked(tmp_path):
    assert '--cgroups' not in podman_args_line(run(tmp_path))
    args = podman_args_line(_units.apply(dict(PARAMS, units_dir=str(tmp_path / 'v1'), cgroups='no-conmon'), PATHS))
    assert args.endswith(' --cgroups=no-conmon'), args  # Quadlet puts its own --cgroups=split first


def test_the_systemd_form_says_its_cgroups_once():
    spec = dict(_quadlet.for_unit(podman_spec()), unit_cgroups='no-conmon')
    text = _systemd.container_unit(spec, 'user')
    start = [line for line in text.splitlines() if line.startswith('ExecStart=')][0]
    assert start.count('--cgroups') == 1 and '--cgroups=no-conmon' in start, start


@pytest.mark.parametrize('scope, account, expect', [
    ('system', None, []),
    ('system', 'svc', []),
    ('user', 'pi-egress', ['--user', '-M', 'pi-egress@']),
])
def test_how_systemctl_reaches_the_units_manager(scope, account, expect):
    assert _units.manager_args(scope, account) == expect


ROOTFUL = _venue.Venue(_venue.PODMAN, '5.4.2')
ROOTLESS = _venue.Venue(_venue.PODMAN, '5.4.2', rootless=True, cgroup_version='1')


@pytest.mark.parametrize('scope, found, fragments', [
    ('system', ROOTFUL, None),
    ('user', ROOTLESS, None),
    ('user', ROOTFUL, ['units_scope user', "svc's user manager", 'Podman 5.4.2', 'podman_account']),
    ('system', ROOTLESS, ['units_scope system', 'Podman 5.4.2 (rootless)', 'units_scope user']),
])
def test_units_of_another_manager_than_the_engine_are_refused(scope, found, fragments):
    refusal = _units.venue_refusal(scope, 'svc', found)
    if fragments is None:
        assert refusal is None
    else:
        assert refusal and all(fragment in refusal for fragment in fragments), refusal


@pytest.mark.parametrize('v2_tree, scope, given, expect', [
    (False, 'user', 'auto', 'no-conmon'),  # this host's cgroup v1 (or hybrid) tree
    (True, 'user', 'auto', None),
    (False, 'system', 'auto', None),
    (True, 'user', '1', 'no-conmon'),  # given wins over what the host says
    (False, 'user', '2', None),
])
def test_the_standalone_module_reads_the_hosts_cgroup_version(tmp_path, v2_tree, scope, given, expect):
    root = tmp_path / 'cgroup'
    root.mkdir()
    if v2_tree:
        (root / 'cgroup.controllers').write_text('cpu memory pids\n')
    assert _units.cgroups_for(scope, given, str(root)) == expect
