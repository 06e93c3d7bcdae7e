#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r'''
---
module: egress_guard
short_description: Render the destination guard of the pi-dispatch egress proxy and reload it
version_added: 0.2.0
description:
  - Renders C(<deploy_dir>/egress-guard.conf), the include of the packaged rules (version 2) that
    names the addresses a listed name may never lead a job to, and the per-client connection bound.
  - The guard refuses every non-public range (RFC 1918, CGNAT, benchmarking, documentation, multicast,
    reserved, ULA, link-local, loopback) minus the private ranges named in O(private_destinations),
    and always, whatever was opened, the job-network pool, the gateway of every network the proxy is on,
    the C(host-gateway) address (read inside the proxy as C(host.docker.internal)), loopback,
    link-local and the cloud metadata addresses.
  - The gateways and the host-gateway address come from the Docker Engine, never from assumed subnets.
  - The file is written in place (same inode, since the proxy mounts it as a single file), then the running
    proxy is reloaded with C(squid -k parse) and C(squid -k reconfigure), which keeps every running
    job's tunnels. A parse squid refuses puts the previous file back.
author:
  - pi-dispatch egress team (@pi-dispatch)
attributes:
  check_mode:
    support: full
    description: Reports the render and the reload it would do, writes nothing and reloads nothing.
  diff_mode:
    support: full
    description: Shows the include before and after.
options:
  deploy_dir:
    description: The deployment folder holding C(egress-guard.conf).
    type: path
    required: true
  proxy_name:
    description: The proxy container whose networks' gateways are refused and which is reloaded.
    type: str
    default: pi-dispatch-egress-proxy
  private_destinations:
    description:
      - Private ranges (CIDR) a listed name may resolve to, e.g. a LAN mirror. Validated - a range that
        overlaps the job-network pool, contains the host-gateway address, overlaps loopback, link-local,
        metadata, multicast or reserved space, is public, or is nothing but gateways is refused with the
        reason, and nothing is written.
      - A gateway inside an opened range stays refused.
    type: list
    elements: str
    default: []
  job_pool:
    description: The job-network address pool (as the job runner uses it); always refused.
    type: str
    default: 10.47.0.0/16
  client_max_connections:
    description: More open connections than this from one client address (one job) are refused.
    type: int
    default: 256
  reload:
    description: Reload the running proxy when the include changed.
    type: bool
    default: true
extends_documentation_fragment:
  - pi_dispatch.egress.docker
seealso:
  - module: pi_dispatch.egress.egress_proxy
  - module: pi_dispatch.egress.model_endpoints
'''

EXAMPLES = r'''
- name: Let listed names reach the LAN package mirror, nothing else private
  pi_dispatch.egress.egress_guard:
    deploy_dir: /opt/pi-dispatch/egress
    private_destinations: [192.168.50.0/24]
'''

RETURN = r'''
include:
  description: Path of the rendered include.
  returned: always
  type: str
opened:
  description: The private ranges opened, normalised.
  returned: always
  type: list
  elements: str
gateways:
  description: The network gateways read from the daemon (always refused).
  returned: always
  type: list
  elements: str
host_gateway:
  description: The host-gateway address read inside the proxy (always refused), or null when unknown.
  returned: always
  type: str
kept_inside:
  description: Gateways that lie inside an opened range and stay refused all the same.
  returned: always
  type: list
  elements: str
denied:
  description: The guard's address set as rendered.
  returned: always
  type: list
  elements: str
reloaded:
  description: squid was (or, in check mode, would be) reconfigured.
  returned: always
  type: bool
loaded:
  description:
    - What squid read at the reload (the reload path's record), from the reload path shared by every writer of a file
      squid reads. C(members) lists the proxy and each running shard with C(reconfigured) and C(error).
      C(parsed) and C(reconfigured) are the steps done; C(files) maps each source file to its sha256.
  returned: when the proxy was reloaded
  type: dict
actions:
  description: What was done (or would be done), in order.
  returned: always
  type: list
  elements: str
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import guard as _guard
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import guard_apply as _apply
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import spec as _proxy_spec


def main():
    argument_spec = dict(
        deploy_dir=dict(type='path', required=True),
        proxy_name=dict(type='str', default=_proxy_spec.PROXY_NAME),
        private_destinations=dict(type='list', elements='str', default=[]),
        job_pool=dict(type='str', default=_guard.DEFAULT_POOL),
        client_max_connections=dict(type='int', default=_guard.DEFAULT_CLIENT_MAX_CONNECTIONS),
        reload=dict(type='bool', default=True),
    )
    module = AnsibleModule(argument_spec=dc.argument_spec(argument_spec), supports_check_mode=True)
    run = _apply.GuardApply(module.params, _deployment.module_layout(module).paths, check_mode=module.check_mode,
                            diff=module._diff)
    client = dc.module_client(module, run.result, suffix=_apply.NOTHING_WRITTEN)
    try:
        run.run(client)
    except _apply.GuardFailed as exc:
        for warning in run.warnings:
            module.warn(warning)
        module.fail_json(msg=str(exc), **dict(exc.extra, **run.result))
    for warning in run.warnings:
        module.warn(warning)
    module.exit_json(**run.result)


if __name__ == '__main__':
    main()
