#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r'''
---
module: egress_podman_units
short_description: Write the egress proxy and its upstream network as Quadlet units or systemd services
version_added: 0.9.0
description:
  - Renders the proxy exactly as M(pi_dispatch.egress.egress_proxy) would create it on Podman (the same wanted
    shape, hardening and limits) as a Quadlet C(.container) file, and its upstream network as a C(.network) file,
    and writes them atomically into the folder where Quadlet reads them, when their content differs.
  - With I(format=systemd) (Podman 4.3, which has no Quadlet, as Debian 12 ships it) the same shape becomes two
    plain systemd services in the form C(podman generate systemd --new) gives, C(<name>.service) running
    C(podman run --replace --rm --sdnotify=conmon) and C(<network>-network.service) making the network when it is
    missing; the service names are the same as Quadlet's.
  - systemd then runs the proxy, restarts it when it dies, and brings it back at boot; the container systemd
    starts has the shape the drift comparison wants, except its own restart policy (C(no); systemd restarts it).
    The unit never pulls (C(--pull=never)).
  - It does not run systemd; after a change, run C(systemctl daemon-reload) and restart the proxy's service
    (C(systemctl --user) for I(scope=user)). See C(docs/podman.md).
  - A symlink or a directory where a unit file goes is refused, and nothing is written.
author:
  - pi-dispatch egress team (@pi-dispatch)
attributes:
  check_mode:
    support: full
    description: Renders and reports what would change; writes nothing.
  diff_mode:
    support: full
    description: Shows each unit file before and after.
options:
  deploy_dir:
    description: The deployment folder whose rules, allowlist, endpoints include and guard the proxy mounts.
    type: path
    default: /opt/pi-dispatch/egress
  name:
    description: The proxy's container name (the unit is C(<name>.container), its service C(<name>.service)).
    type: str
    default: pi-dispatch-egress-proxy
  image:
    description: The proxy's image, built on the host (a name without a registry is read as C(localhost/<name>)).
    type: str
    default: pi-dispatch-egress-proxy:latest
  network:
    description: The proxy's upstream network (the unit C(<network>.network) creates it under this name).
    type: str
    default: pi-dispatch-egress-out
  network_internal:
    description: Create the upstream network C(--internal) (a test world with a fake upstream; never in production).
    type: bool
    default: false
  extra_hosts:
    description: Extra C(name:address) entries of the proxy's C(/etc/hosts); C(host-gateway) is refused on Podman.
    type: list
    elements: str
    default: []
  health_interval:
    description: Seconds between health checks (and the start period).
    type: int
    default: 5
  memory:
    description: The proxy's memory limit (no swap beyond it).
    type: str
    default: 512m
  pids_limit:
    description: The proxy's process limit.
    type: int
    default: 256
  nofile:
    description: The proxy's open-file limit.
    type: int
    default: 16384
  log_max_size:
    description: The size at which the proxy's log is cut (Podman keeps one file).
    type: str
    default: 10m
  log_max_file:
    description: Read for the shape's checks only; Podman keeps one log file.
    type: int
    default: 3
  scope:
    description:
      - C(system) writes C(/etc/containers/systemd); C(user) writes the account's C(~/.config/containers/systemd)
        (with I(format=systemd), C(/etc/systemd/system) and C(~/.config/systemd/user)).
    type: str
    choices: [system, user]
    default: system
  account:
    description: The service account of I(scope=user); the files and the folders made under its home are its own.
    type: str
  cgroup_version:
    description:
      - The host's cgroup version, for an account's Quadlet unit (I(scope=user)). On C(1) the unit ends its
        C(PodmanArgs=) with C(--cgroups=no-conmon), since Quadlet's C(--cgroups=split) fails under a user manager
        there (systemd delegates no v1 controller to it; measured with Podman 5.4.2). C(auto) reads this host
        (C(/sys/fs/cgroup/cgroup.controllers) exists only on the unified v2 tree). The system's units, and
        I(format=systemd) (which says C(--cgroups=no-conmon) always), are the same for every value.
    type: str
    choices: [auto, '1', '2']
    default: auto
    version_added: 0.20.0
  units_dir:
    description: Write here instead of the scope's folder.
    type: path
  format:
    description:
      - C(quadlet) writes Quadlet files (Podman 4.4 and later); C(systemd) writes systemd services that run
        C(podman) (Podman 4.3), into C(/etc/systemd/system) or the account's C(~/.config/systemd/user).
    type: str
    choices: [quadlet, systemd]
    default: quadlet
    version_added: 0.13.0
  state:
    description: C(present) writes the units; C(absent) removes the two files.
    type: str
    choices: [present, absent]
    default: present
seealso:
  - module: pi_dispatch.egress.egress_proxy
  - module: pi_dispatch.egress.egress_podman_conf
'''

EXAMPLES = r'''
- name: The proxy as a Quadlet unit of the system's Podman
  pi_dispatch.egress.egress_podman_units:
    deploy_dir: /opt/pi-dispatch/egress
  register: units

- name: Reload systemd and restart the proxy when a unit changed
  ansible.builtin.systemd_service:
    name: "{{ units.services[0] }}"
    state: restarted
    daemon_reload: true
  when: units is changed

- name: On Podman 4.3 (Debian 12, no Quadlet), plain systemd services instead
  pi_dispatch.egress.egress_podman_units:
    deploy_dir: /opt/pi-dispatch/egress
    format: systemd
  register: units
'''

RETURN = r'''
units:
  description: The container unit's and the network unit's paths.
  returned: always
  type: list
  elements: str
services:
  description: The services Quadlet generates from them, or the two services themselves (the proxy's first).
  returned: always
  type: list
  elements: str
written:
  description: The unit files written (or, in check mode, that would be).
  returned: always
  type: list
  elements: str
removed:
  description: The unit files removed with I(state=absent).
  returned: always
  type: list
  elements: str
units_dir:
  description: The folder the units are in.
  returned: always
  type: str
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment
from ansible_collections.pi_dispatch.egress.plugins.module_utils._podman import units_apply as _units
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy.spec import PROXY_NAME


def main():
    module = AnsibleModule(
        argument_spec=dict(
            deploy_dir=dict(type='path', default=_deployment.DEFAULT_DEPLOY_DIR),
            name=dict(type='str', default=PROXY_NAME),
            image=dict(type='str', default='pi-dispatch-egress-proxy:latest'),
            network=dict(type='str', default='pi-dispatch-egress-out'),
            network_internal=dict(type='bool', default=False),
            extra_hosts=dict(type='list', elements='str', default=[]),
            health_interval=dict(type='int', default=5),
            memory=dict(type='str', default='512m'),
            pids_limit=dict(type='int', default=256),
            nofile=dict(type='int', default=16384),
            log_max_size=dict(type='str', default='10m'),
            log_max_file=dict(type='int', default=3),
            scope=dict(type='str', default='system', choices=['system', 'user']),
            account=dict(type='str'),
            cgroup_version=dict(type='str', default='auto', choices=['auto', '1', '2']),
            units_dir=dict(type='path'),
            format=dict(type='str', default='quadlet', choices=['quadlet', 'systemd']),
            state=dict(type='str', default='present', choices=['present', 'absent']),
        ),
        required_if=[('scope', 'user', ('account',))],
        supports_check_mode=True,
    )
    layout = _deployment.module_layout(module)
    params = dict(module.params, cgroups=_units.cgroups_for(module.params['scope'], module.params['cgroup_version']))
    try:
        result = _units.apply(params, layout.paths, check_mode=module.check_mode)
    except _units.UnitsError as exc:
        module.fail_json(msg='%s. Nothing was written.' % exc)
    except OSError as exc:
        module.fail_json(msg='Writing the units failed: %s. Fix the cause and run again (each file is '
                             'replaced whole, never half-written).' % exc)
    diff = result.pop('diff')
    if module._diff:
        result['diff'] = diff
    module.exit_json(**result)


if __name__ == '__main__':
    main()
