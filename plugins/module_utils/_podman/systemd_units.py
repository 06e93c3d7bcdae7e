# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The proxy and its upstream network as plain systemd services that run ``podman`` (Podman 4.3, no Quadlet).

Debian 12's Podman (4.3) has no Quadlet; its way to a unit is ``podman generate systemd --new``, which
needs a container to exist first and writes whatever that container has. These units are rendered
instead, from the same wanted shape as the Quadlet units (:mod:`quadlet`), in the form that command
gives: ``podman run --cidfile=%t/%n.ctr-id --cgroups=no-conmon --rm --sdnotify=conmon --replace -d``
with the shape's options, ``Type=notify``, and ``podman stop`` / ``podman rm`` on the way down, so the
container the service starts has the shape the drift comparison wants (``test_podman.py`` runs the
unit's own command lines on Debian's Podman 4.3 and compares).

Two things are this form's own, both measured on Podman 4.3.1: its ``podman network create`` has no
``--ignore``, so the network's service tries the create (a failure ignored, as when the network is
already there) and then fails unless ``podman network exists`` says it is there; and the
``PODMAN_SYSTEMD_UNIT`` label comes from the service's environment, as ``generate systemd`` does it.
The service names are Quadlet's (``<name>.service``, ``<network>-network.service``), so what runs
systemd is the same for both. Pure: the text of the two files.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._podman import quadlet as _quadlet

PODMAN = '/usr/bin/podman'
# Where systemd reads units: the system's, and a rootless account's (under its home).
SYSTEM_UNITS_DIR = '/etc/systemd/system'
USER_UNITS_DIR = '.config/systemd/user'
CIDFILE = '--cidfile=%t/%n.ctr-id'
# What `podman generate systemd --new` (4.3) puts before the container's own options.
RUN_PREFIX = (PODMAN, 'run', CIDFILE, '--cgroups=no-conmon', '--rm', '--sdnotify=conmon', '--replace', '-d')


def unit_names(spec: Dict[str, Any]) -> Tuple[str, str]:
    """(container service file, network service file): the files are the services."""
    return _quadlet.service_names(spec)


def run_options(spec: Dict[str, Any]) -> List[str]:
    """The ``podman run`` options that say ``spec``, key for key what the Quadlet unit says."""
    args = ['--name=%s' % spec['name']]
    args += ['--network=%s' % net for net in [spec['network']] + list(spec.get('extra_networks') or [])]
    args += ['--volume=%s:%s:ro' % (source, target) for source, target in spec['mounts']]
    if spec.get('log_mount'):
        args.append('--volume=%s:%s:rw' % tuple(spec['log_mount']))
    if spec['read_only']:
        args.append('--read-only')
    args += ['--cap-drop=%s' % cap.lower() for cap in spec['cap_drop']]
    args += ['--cap-add=%s' % cap for cap in spec['cap_add']]
    if _quadlet.no_new_privileges(spec):
        args.append('--security-opt=no-new-privileges')
    args += ['--label=%s=%s' % item for item in sorted(spec['labels'].items())]
    args += ['--env=%s=%s' % item for item in sorted((spec.get('environment') or {}).items())]
    health = spec['healthcheck']
    args += ['--health-cmd=%s' % _quadlet.health_cmd(spec),
             '--health-interval=%s' % _quadlet.seconds(health['interval']),
             '--health-timeout=%s' % _quadlet.seconds(health['timeout']),
             '--health-retries=%d' % health['retries'],
             '--health-start-period=%s' % _quadlet.seconds(health['start_period'])]
    # RUN_PREFIX says --cgroups (no-conmon) already, for every scope.
    return args + _quadlet.podman_args(dict(spec, unit_cgroups=None))


def container_unit(spec: Dict[str, Any], scope: str = 'system') -> str:
    """The ``<name>.service`` file that runs the proxy of ``spec`` (as ``for_venue`` gives it to Podman)."""
    _quadlet.check(spec, scope)
    network_service = _quadlet.service_names(spec)[1]
    start = ' '.join(RUN_PREFIX) + ' ' + _quadlet.words(run_options(spec) + [spec['image']] + list(spec['command']))
    lines = [_quadlet.MANAGED, '[Unit]',
             'Description=pi-dispatch egress proxy %s (squid, the allowlist)' % spec['name'],
             'Wants=network-online.target', 'After=network-online.target %s' % network_service,
             'Requires=%s' % network_service, 'RequiresMountsFor=%t/containers', '',
             '[Service]', 'Environment=PODMAN_SYSTEMD_UNIT=%n', 'Restart=always', 'TimeoutStartSec=300',
             'TimeoutStopSec=70', 'ExecStart=%s' % start,
             'ExecStop=%s stop --ignore -t 10 %s' % (PODMAN, CIDFILE),
             'ExecStopPost=%s rm -f --ignore -t 10 %s' % (PODMAN, CIDFILE),
             'Type=notify', 'NotifyAccess=all']
    return '\n'.join(lines + _quadlet.install_lines(scope)) + '\n'


def network_unit(spec: Dict[str, Any], internal: bool, labels: Dict[str, str], scope: str = 'system') -> str:
    """The ``<network>-network.service`` file that makes the proxy's upstream network when it is missing."""
    create = [PODMAN, 'network', 'create'] + (['--internal'] if internal else [])
    create += ['--label=%s=%s' % item for item in sorted(labels.items())] + [spec['network']]
    lines = [_quadlet.MANAGED, '[Unit]', 'Description=pi-dispatch egress: the proxy\'s upstream network %s'
             % spec['network'], 'Wants=network-online.target', 'After=network-online.target',
             'RequiresMountsFor=%t/containers', '',
             '[Service]', 'Type=oneshot', 'RemainAfterExit=yes',
             # 4.3's create has no --ignore: a failed create is ignored (the network may be there already),
             # and the unit fails unless the network exists afterwards.
             'ExecStart=-%s' % _quadlet.words(create),
             'ExecStart=%s' % _quadlet.words([PODMAN, 'network', 'exists', spec['network']])]
    return '\n'.join(lines + _quadlet.install_lines(scope)) + '\n'
