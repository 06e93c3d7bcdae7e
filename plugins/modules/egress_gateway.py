#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r'''
---
module: egress_gateway
short_description: Run the gateway of transparent job networks
version_added: 0.5.0
description:
  - Starts the gateway container that transparent job networks resolve and connect through
    (docs/transparent.md). It holds the only C(NET_ADMIN) of the egress layer, used by its root commands for
    its packet filter and per-name addresses; its resolver and relays run as an unprivileged user with no
    capability. It mounts the deployment folder's allowlist, model endpoints and guard read-only.
  - A gateway whose image was rebuilt, or whose shape differs, is recreated; every transparent job network it
    was on is attached again at the same address, and the networks' files (a named volume) are applied again.
  - I(state=absent) removes it and its C(<name>-nets) volume, and is refused while a transparent job network still
    has it.
author:
  - pi-dispatch egress team (@pi-dispatch)
attributes:
  check_mode:
    support: full
    description: Says what would be created, recreated, started or removed; changes nothing.
  diff_mode:
    support: none
    description: The actions and the differences are in the result; there is no file diff.
options:
  deploy_dir:
    description: The deployment folder (its allowlist, model endpoints and guard are mounted read-only).
    type: path
    required: true
  name:
    description: The gateway container.
    type: str
    default: pi-dispatch-egress-gateway
  image:
    description: The locally built gateway image (nothing is pulled).
    type: str
    default: pi-dispatch-egress-gateway:latest
  upstream_network:
    description: The proxy's upstream network, the gateway's own.
    type: str
    default: pi-dispatch-egress-out
  proxy_name:
    description: The proxy the gateway relays 80 and 443 into (recorded as a label).
    type: str
    default: pi-dispatch-egress-proxy
  dns:
    description: Resolvers the gateway itself asks for the names the policy covers (default the daemon's).
    type: list
    elements: str
    default: []
  allow_cut_jobs:
    description:
      - Consent to recreating a gateway that carries transparent job networks (its image was rebuilt, or its shape
        differs). The networks are attached again at the same addresses, but the connections its relays held open
        are cut. Without it such a recreate is refused, changing nothing.
    type: bool
    default: false
  state:
    description: C(started) or C(absent).
    type: str
    choices: [started, absent]
    default: started
extends_documentation_fragment:
  - pi_dispatch.egress.docker
requirements:
  - Docker SDK for Python >= 7.0
seealso:
  - module: pi_dispatch.egress.job_network
'''

EXAMPLES = r'''
- name: Run the gateway of transparent job networks
  pi_dispatch.egress.egress_gateway:
    deploy_dir: /opt/pi-dispatch/egress
'''

RETURN = r'''
actions:
  description: What was done (or in check mode would be), in order.
  returned: always
  type: list
  elements: str
  sample: ['create pi-dispatch-egress-gateway', 'start pi-dispatch-egress-gateway']
differences:
  description: Why an existing gateway was recreated (empty when it was as wanted).
  returned: always
  type: list
  elements: str
'''

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import gateway as _gateway  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy.spec import PROXY_NAME


def main():
    argument_spec = dict(
        deploy_dir=dict(type='path', required=True),
        name=dict(type='str', default=_gateway.GATEWAY_NAME),
        image=dict(type='str', default=_gateway.GATEWAY_IMAGE),
        upstream_network=dict(type='str', default='pi-dispatch-egress-out'),
        proxy_name=dict(type='str', default=PROXY_NAME),
        dns=dict(type='list', elements='str', default=[]),
        state=dict(type='str', default='started', choices=['started', 'absent']),
        allow_cut_jobs=dict(type='bool', default=False),
    )
    module = AnsibleModule(argument_spec=dc.argument_spec(argument_spec), supports_check_mode=True)
    p = module.params
    result = dict(changed=False, actions=[], differences=[])
    client = dc.module_client(module, result)
    try:
        if p['state'] == 'absent':
            result.update(_gateway.remove(client, p['name'], check_mode=module.check_mode))
        else:
            spec = _gateway.desired(p['deploy_dir'], p['upstream_network'], p['proxy_name'], image=p['image'],
                                    name=p['name'], dns=p['dns'])
            result.update(_gateway.ensure(client, spec, check_mode=module.check_mode,
                                          allow_cut_jobs=p['allow_cut_jobs']))
    except dc.EngineError as exc:
        dc.fail(module, exc, result, suffix='(docs/transparent.md)')
    module.exit_json(**result)


if __name__ == '__main__':
    main()
