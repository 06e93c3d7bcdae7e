# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The proxy and its upstream network as Quadlet units (Podman 4.4 and later), from the proxy's wanted shape.

The units say what ``egress_proxy`` would create through the API: :func:`container_unit` renders the
proxy's spec (``_proxy/spec.desired_spec`` as ``for_venue`` gives it to Podman) key by key, so the
container systemd starts has exactly the shape the drift comparison wants (``test_quadlet.py``
compares it with ``spec.differences``). Two things differ, both Quadlet's:

* systemd restarts the proxy (``Restart=always``), so the container's own restart policy is ``no``
  (Quadlet runs it with ``--rm``): :func:`for_unit` says so in the wanted shape;
* the unit never pulls (``--pull=never``): the image is built on the host, as everywhere else.

Options that not every Quadlet version has a key for (tmpfs, sysctls, ulimits, limits, the log
options, extra hosts) go through ``PodmanArgs=``, which Quadlet has had since 4.4. Pure: the text of
the two files; ``egress_podman_units`` writes them and the role runs systemd.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import venue as _venue

MANAGED = '# Managed by pi_dispatch.egress (egress_podman_units): edits are replaced on the next run.'
NS = 1000000000
# Where Quadlet reads units: the system's, and a rootless account's (under its home).
SYSTEM_UNITS_DIR = '/etc/containers/systemd'
USER_UNITS_DIR = '.config/containers/systemd'


class QuadletError(ValueError):
    """A shape the units cannot say as asked: the message names the setting and the fix."""


def quote(word: str) -> str:
    """One word of a systemd command line (Exec=, PodmanArgs=): quoted when it must be, ``%`` escaped."""
    word = str(word).replace('%', '%%')
    if word and not any(ch in word for ch in ' \t\n"\'\\;$`'):
        return word
    return '"%s"' % word.replace('\\', '\\\\').replace('"', '\\"').replace('\n', '\\n')


def words(items: Sequence[str]) -> str:
    return ' '.join(quote(item) for item in items)


def seconds(nanoseconds: int) -> str:
    value = int(nanoseconds)
    if value % NS:
        raise QuadletError('a health check duration of %d ns is not whole seconds; give whole seconds' % value)
    return '%ds' % (value // NS)


def unit_names(spec: Dict[str, Any]) -> Tuple[str, str]:
    """(container unit file, network unit file) names; systemd's services are <name>.service and <net>-network."""
    return '%s.container' % spec['name'], '%s.network' % spec['network']


def service_names(spec: Dict[str, Any]) -> Tuple[str, str]:
    """The services Quadlet generates from the two files."""
    return '%s.service' % spec['name'], '%s-network.service' % spec['network']


# How a unit's podman places the container in cgroups: Quadlet's own split where systemd can delegate them,
# and what `podman generate systemd --new` writes (no-conmon) for a rootless account on a cgroup v1 host.
V1_ROOTLESS_CGROUPS = 'no-conmon'


def unit_cgroups(scope: str, cgroup_version: str) -> Optional[str]:
    """The ``--cgroups`` mode a unit of ``scope`` needs on a host of ``cgroup_version``; None for Quadlet's own."""
    return V1_ROOTLESS_CGROUPS if scope == 'user' and str(cgroup_version) == '1' else None


def for_unit(spec: Dict[str, Any]) -> Dict[str, Any]:
    """The wanted shape of a proxy that a Quadlet unit runs: systemd restarts it, so its own policy is ``no``."""
    return dict(spec, restart_policy='no')


def network_unit(spec: Dict[str, Any], internal: bool, labels: Dict[str, str]) -> str:
    """The ``.network`` file of the proxy's upstream network (named as the spec names it)."""
    lines = [MANAGED, '[Unit]', 'Description=pi-dispatch egress: the proxy\'s upstream network %s'
             % spec['network'], '', '[Network]', 'NetworkName=%s' % spec['network']]
    if internal:
        lines.append('Internal=true')
    lines += ['Label=%s=%s' % (key, value) for key, value in sorted(labels.items())]
    return '\n'.join(lines) + '\n'


def podman_args(spec: Dict[str, Any]) -> List[str]:
    """The ``podman run`` options of the shape that have no Quadlet key of their own (and the unit never pulls)."""
    args = ['--pull=never']
    for path, options in sorted((spec.get('create_tmpfs') or spec['tmpfs']).items()):
        args.append('--tmpfs=%s:%s' % (path, options))
    for key, value in sorted(spec['sysctls'].items()):
        args.append('--sysctl=%s=%s' % (key, value))
    for limit in sorted(spec['ulimits'], key=lambda item: item['name']):
        args.append('--ulimit=%s=%d:%d' % (limit['name'], limit['soft'], limit['hard']))
    args += ['--memory=%d' % spec['memory'], '--memory-swap=%d' % spec['memory'],
             '--pids-limit=%d' % spec['pids_limit']]
    log = spec.get('create_log_config') or spec['log_config']
    # The spec says Docker's json-file; Podman's own driver for it comes from the venue table.
    driver = _venue.VENUES[_venue.PODMAN]['log_driver'] if log['type'] == 'json-file' else log['type']
    args.append('--log-driver=%s' % driver)
    for key, value in sorted((log.get('config') or {}).items()):
        args.append('--log-opt=%s=%s' % (key, value))
    for entry in spec['extra_hosts']:
        args.append('--add-host=%s' % entry)
    if spec.get('unit_cgroups'):
        # Quadlet runs a container with --cgroups=split; under a rootless account on cgroup v1 that fails
        # (measured with Podman 5.4: "mkdir /sys/fs/cgroup/pids/.../user@<uid>.service/runtime: permission
        # denied"), since systemd delegates no v1 controller to a user manager. The last --cgroups wins.
        args.append('--cgroups=%s' % spec['unit_cgroups'])
    return args


def check(spec: Dict[str, Any], scope: str) -> None:
    """QuadletError when a unit (Quadlet's or a generated one) cannot say ``spec`` for ``scope``."""
    if spec.get('for_venue') != 'podman':
        raise QuadletError('the proxy\'s shape was not made for Podman (spec.for_venue); this is a bug of the caller')
    if scope not in ('system', 'user'):
        raise QuadletError('scope %r: give system or user' % scope)
    health = spec['healthcheck']
    if not health['test'] or health['test'][0] != 'CMD':
        raise QuadletError('the health check %r is not an exec form ["CMD", ...]' % (health['test'],))
    others = [opt for opt in spec['security_opt'] if not opt.startswith('no-new-privileges')]
    if others:
        raise QuadletError('security options %s have no Quadlet key here; remove them' % ', '.join(others))


def no_new_privileges(spec: Dict[str, Any]) -> bool:
    return 'no-new-privileges:true' in spec['security_opt'] or 'no-new-privileges' in spec['security_opt']


def health_cmd(spec: Dict[str, Any]) -> str:
    """The exec-form health check as JSON: Podman stores it as ["CMD", ...], the shape the drift comparison wants."""
    return json.dumps(list(spec['healthcheck']['test'][1:]))


def install_lines(scope: str) -> List[str]:
    """The ``[Install]`` section (after a blank line): the system's multi-user target, or the account's default."""
    return ['', '[Install]', 'WantedBy=%s' % ('default.target' if scope == 'user' else 'multi-user.target')]


def container_unit(spec: Dict[str, Any], scope: str = 'system') -> str:
    """The ``.container`` file that runs the proxy of ``spec`` (as ``for_venue`` gives it to Podman)."""
    check(spec, scope)
    health = spec['healthcheck']
    lines = [MANAGED, '[Unit]', 'Description=pi-dispatch egress proxy %s (squid, the allowlist)' % spec['name'], '',
             '[Container]', 'ContainerName=%s' % spec['name'], 'Image=%s' % spec['image'],
             'Exec=%s' % words(spec['command'])]
    for net in [spec['network'] + '.network'] + list(spec.get('extra_networks') or []):
        lines.append('Network=%s' % net)
    for source, target in spec['mounts']:
        lines.append('Volume=%s:%s:ro' % (source, target))
    if spec.get('log_mount'):
        lines.append('Volume=%s:%s:rw' % tuple(spec['log_mount']))
    lines.append('ReadOnly=%s' % ('true' if spec['read_only'] else 'false'))
    if [cap.upper() for cap in spec['cap_drop']] == ['ALL']:
        lines.append('DropCapability=all')
    else:
        lines += ['DropCapability=%s' % cap for cap in spec['cap_drop']]
    lines += ['AddCapability=%s' % cap for cap in spec['cap_add']]
    if no_new_privileges(spec):
        lines.append('NoNewPrivileges=true')
    lines += ['Label=%s' % quote('%s=%s' % item) for item in sorted(spec['labels'].items())]
    lines += ['Environment=%s' % quote('%s=%s' % item) for item in sorted((spec.get('environment') or {}).items())]
    lines += ['HealthCmd=%s' % health_cmd(spec).replace('%', '%%'),
              'HealthInterval=%s' % seconds(health['interval']), 'HealthTimeout=%s' % seconds(health['timeout']),
              'HealthRetries=%d' % health['retries'], 'HealthStartPeriod=%s' % seconds(health['start_period'])]
    lines.append('PodmanArgs=%s' % words(podman_args(spec)))
    lines += ['', '[Service]', 'Restart=always', 'TimeoutStartSec=300'] + install_lines(scope)
    return '\n'.join(lines) + '\n'
