"""The proxy as plain systemd services for Podman 4.3 (_podman/systemd_units.py, units_apply format systemd).

test_podman.py runs these units' own command lines on Debian's Podman 4.3 and compares the container with
the wanted shape; here: the service says what the Quadlet unit says, option for option, and the writes.
"""

import json
import os
import shlex

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import venue as _venue
from ansible_collections.pi_dispatch.egress.plugins.module_utils._podman import quadlet as _quadlet
from ansible_collections.pi_dispatch.egress.plugins.module_utils._podman import systemd_units as _systemd
from ansible_collections.pi_dispatch.egress.plugins.module_utils._podman import units_apply as _units
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import spec as _spec

PODMAN = _venue.Venue(_venue.PODMAN, '4.3.1')
LABELS = {'io.pi-dispatch.egress.network': 'upstream'}


def podman_spec(**more):
    spec = _spec.desired_spec('localhost/pi-dispatch-egress-proxy:latest', '/d/deploy/egress-proxy.conf',
                              '/d/egress-allowlist.conf', '/d/model-endpoints.conf', guard='/d/egress-guard.conf',
                              **more)
    return _quadlet.for_unit(_spec.for_venue(spec, PODMAN))


def values(text, key):
    return [line.split('=', 1)[1] for line in text.splitlines() if line.startswith(key + '=')]


def argv(command):
    """A unit's command line as systemd runs it, %t and %n left as they are (the test's own doubles removed)."""
    return shlex.split(command.replace('%%', '%'))


def quadlet_as_run_options(text):
    """What Quadlet passes to ``podman run`` for the keys of a ``.container`` file (Quadlet's own: --name, ...)."""
    options = []
    simple = {'ContainerName': '--name=%s', 'Volume': '--volume=%s', 'AddCapability': '--cap-add=%s',
              'Label': '--label=%s', 'Environment': '--env=%s',
              'HealthInterval': '--health-interval=%s', 'HealthTimeout': '--health-timeout=%s',
              'HealthRetries': '--health-retries=%s', 'HealthStartPeriod': '--health-start-period=%s'}
    for line in text.splitlines():
        if '=' not in line or line.startswith('#'):
            continue
        key, value = line.split('=', 1)
        if key in simple:
            options.append(simple[key] % ' '.join(argv(value)))
        elif key == 'HealthCmd':  # one string, not words: the exec form as JSON
            options.append('--health-cmd=%s' % value.replace('%%', '%'))
        elif key == 'Network':
            options.append('--network=%s' % value[:-len('.network')] if value.endswith('.network') else
                           '--network=%s' % value)
        elif key == 'ReadOnly' and value == 'true':
            options.append('--read-only')
        elif key == 'DropCapability':
            options.append('--cap-drop=%s' % value)
        elif key == 'NoNewPrivileges' and value == 'true':
            options.append('--security-opt=no-new-privileges')
        elif key == 'PodmanArgs':
            options += argv(value)
    return options


SPECS = {
    'default': {},
    'decision log, credentials': dict(decision_log=dict(dir='/d/decisions', max_size='10m', keep=5),
                                      credentials_include='/d/egress-credentials.conf'),
    'extra hosts': dict(extra_hosts=['models.test:10.0.0.5']),
}


@pytest.mark.parametrize('name', sorted(SPECS))
def test_the_service_runs_what_the_quadlet_unit_says_option_for_option(name):
    spec = podman_spec(**SPECS[name])
    start = argv(values(_systemd.container_unit(spec), 'ExecStart')[0])
    prefix, rest = start[:len(_systemd.RUN_PREFIX)], start[len(_systemd.RUN_PREFIX):]
    assert tuple(prefix) == _systemd.RUN_PREFIX
    command = [spec['image']] + list(spec['command'])
    assert rest[-len(command):] == command
    assert sorted(rest[:-len(command)]) == sorted(quadlet_as_run_options(_quadlet.container_unit(spec)))


@pytest.mark.parametrize('line', [
    'Environment=PODMAN_SYSTEMD_UNIT=%n',  # the label Podman sets from it (generate systemd's way)
    'Restart=always',
    'Type=notify',
    'NotifyAccess=all',
    'Requires=pi-dispatch-egress-out-network.service',
    'After=network-online.target pi-dispatch-egress-out-network.service',
    'RequiresMountsFor=%t/containers',
    'ExecStop=/usr/bin/podman stop --ignore -t 10 --cidfile=%t/%n.ctr-id',
    'ExecStopPost=/usr/bin/podman rm -f --ignore -t 10 --cidfile=%t/%n.ctr-id',
    'WantedBy=multi-user.target',
])
def test_the_container_service_lines(line):
    assert line in _systemd.container_unit(podman_spec()).splitlines()


def test_the_health_check_is_the_exec_form_as_json():
    start = argv(values(_systemd.container_unit(podman_spec()), 'ExecStart')[0])
    health = [word.split('=', 1)[1] for word in start if word.startswith('--health-cmd=')]
    assert [json.loads(text) for text in health] == [['squidclient', '-h', 'localhost', '-p', '3128', '-T', '3',
                                                      'mgr:info']]


def test_a_percent_in_the_shape_is_escaped_for_systemd_and_the_specifiers_are_not():
    spec = dict(podman_spec(), environment={'PI_X': '50%'})
    start = values(_systemd.container_unit(spec), 'ExecStart')[0]
    assert '--env=PI_X=50%%' in start.split(' ')
    assert start.startswith('/usr/bin/podman run --cidfile=%t/%n.ctr-id ')


def test_user_scope_is_wanted_by_the_default_target():
    assert 'WantedBy=default.target' in _systemd.container_unit(podman_spec(), 'user').splitlines()
    assert 'WantedBy=default.target' in _systemd.network_unit(podman_spec(), False, LABELS, 'user').splitlines()


@pytest.mark.parametrize('internal, create', [
    (True, '-/usr/bin/podman network create --internal --label=io.pi-dispatch.egress.network=upstream '
           'pi-dispatch-egress-out'),
    (False, '-/usr/bin/podman network create --label=io.pi-dispatch.egress.network=upstream pi-dispatch-egress-out'),
])
def test_the_network_service_creates_when_missing_then_requires_it_exists(internal, create):
    text = _systemd.network_unit(podman_spec(), internal, LABELS)
    # Podman 4.3's create has no --ignore: the create may fail (the network is there), the check may not.
    assert values(text, 'ExecStart') == [create, '/usr/bin/podman network exists pi-dispatch-egress-out']
    assert 'Type=oneshot' in text.splitlines() and 'RemainAfterExit=yes' in text.splitlines()


# --- units_apply with format systemd ------------------------------------------------------------

PARAMS = dict(name='pi-dispatch-egress-proxy', image='pi-dispatch-egress-proxy:latest',
              network='pi-dispatch-egress-out', network_internal=True, extra_hosts=[], health_interval=5,
              memory='512m', pids_limit=256, nofile=16384, log_max_size='10m', log_max_file=3, scope='system',
              account=None, units_dir=None, state='present', deploy_dir='/d', format='systemd')
PATHS = dict(rules='/d/deploy/egress-proxy.conf', allowlist='/d/egress-allowlist.conf',
             endpoints_conf='/d/model-endpoints.conf', guard_conf='/d/egress-guard.conf')
SERVICES = ['pi-dispatch-egress-proxy.service', 'pi-dispatch-egress-out-network.service']


def run(tmp_path, check_mode=False, **change):
    params = dict(dict(PARAMS, units_dir=str(tmp_path / 'units')), **change)
    return _units.apply(params, PATHS, check_mode=check_mode)


def test_written_once_then_unchanged_then_removed(tmp_path):
    first = run(tmp_path)
    assert first['changed'] and first['services'] == SERVICES
    assert sorted(os.listdir(str(tmp_path / 'units'))) == sorted(SERVICES)
    assert first['units'] == [str(tmp_path / 'units' / name) for name in SERVICES]
    text = (tmp_path / 'units' / SERVICES[0]).read_text()
    assert ' localhost/pi-dispatch-egress-proxy:latest sh -c ' in text  # a short name is read as a local image
    assert not run(tmp_path)['changed']
    assert run(tmp_path, memory='256m')['written'] == [str(tmp_path / 'units' / SERVICES[0])]
    gone = run(tmp_path, state='absent')
    assert gone['changed'] and len(gone['removed']) == 2 and not os.listdir(str(tmp_path / 'units'))


def test_a_quadlet_folder_beside_it_is_left_alone(tmp_path):
    run(tmp_path, format='quadlet')
    run(tmp_path)
    assert sorted(os.listdir(str(tmp_path / 'units'))) == sorted(
        SERVICES + ['pi-dispatch-egress-proxy.container', 'pi-dispatch-egress-out.network'])


@pytest.mark.parametrize('fmt, scope, home, expect', [
    ('quadlet', 'system', None, '/etc/containers/systemd'),
    ('systemd', 'system', None, '/etc/systemd/system'),
    ('quadlet', 'user', '/home/pi', '/home/pi/.config/containers/systemd'),
    ('systemd', 'user', '/home/pi', '/home/pi/.config/systemd/user'),
])
def test_where_each_format_is_written(monkeypatch, fmt, scope, home, expect):
    class Entry(object):
        pw_dir = home
    monkeypatch.setattr(_units._account, 'entry', lambda name: Entry())
    assert _units.units_dir(scope, 'pi' if scope == 'user' else None, None, fmt)[0] == expect
