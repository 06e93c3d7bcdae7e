#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r'''
---
module: egress_firewall
short_description: Keep this host's firewall layer below Docker's rules (the collection's own iptables chains)
version_added: 0.1.0
description:
  - An C(--internal) job network has no route off the host, but its gateway is this host, so a service
    listening on C(0.0.0.0) answers a job that dials the gateway. This module keeps a layer of iptables
    rules that drops that traffic, in chains the collection owns, computed from what the Docker daemon
    says (never from assumed subnets or resolved provider addresses).
  - C(<prefix>-INPUT), jumped from C(INPUT) as its first rule - nothing from a job or canary network reaches
    the host (replies to connections the host opened still do); in IPv4 also everything from I(pool), so a job
    network created after this run is covered too.
  - C(<prefix>-FORWARD), jumped from C(DOCKER-USER) as its first rule - nothing is forwarded off a job or canary
    network or onto one from elsewhere; traffic between the containers of ONE network (a job and the proxy)
    passes. For IPv6 without a C(DOCKER-USER) chain (Docker not managing ip6tables) it is jumped from C(FORWARD).
  - With I(limit_upstream), C(<prefix>-UPSTREAM) - the proxy's own traffic out of its upstream network, to the
    host or forwarded, reaches only TCP I(upstream_ports), the ports declared in
    C(<deploy_dir>/model-endpoints.json), and DNS (53).
  - The layer only DROPs or RETURNs, never ACCEPTs. It never flushes or deletes a chain it does not own; in
    C(INPUT) and C(DOCKER-USER) it touches only its own jump. A missing jump (Docker re-creates C(DOCKER-USER)
    when it starts, a firewall reload flushes) is put back; a jump that is no longer rule 1 is moved back.
  - IPv4 (iptables) and IPv6 (ip6tables; skipped with a message when the host has no ip6tables), on
    iptables-nft and iptables-legacy hosts (C(iptables -V) says which). Each family is one
    C(iptables-restore --noflush) transaction, read back afterwards.
  - C(state=absent) removes exactly its chains and jumps, so C(iptables-save) is what it was before, minus counters.
  - Needs root and the daemon on this host (bridge names are this host's interfaces). See docs/firewall.md.
author:
  - pi-dispatch egress team (@pi-dispatch)
attributes:
  check_mode:
    support: full
    description: Reads the tables and the daemon and reports the actions and the restore input it would apply;
      changes nothing.
  diff_mode:
    support: full
    description: Before and after are the layer's own lines per family (its jumps and its chains' rules).
options:
  state:
    description: C(present) writes the layer, C(absent) removes its chains and jumps.
    type: str
    choices: [present, absent]
    default: present
  chain_prefix:
    description:
      - Prefix of the layer's chains (C(<prefix>-INPUT), C(<prefix>-FORWARD), C(<prefix>-UPSTREAM)). Tests use their
        own, so they never touch a deployed layer.
    type: str
    default: PI-EGRESS
  pool:
    description:
      - The job networks' IPv4 pool (as given to M(pi_dispatch.egress.job_network)). Traffic from it to the host,
        and forwarded between it and anything outside it, is dropped. An empty string writes no pool rule.
    type: str
    default: 10.47.0.0/16
  networks:
    description:
      - The networks to write interface rules for. Unset, every bridge network the daemon has that is a job network
        (C(pi-job-<id>-net) or our job-id label) or a doctor canary network. Given, exactly these (each must exist), for
        tests and for hosts where the layer is scoped by hand.
    type: list
    elements: str
  upstream_network:
    description: The proxy's upstream network (only the proxy is on it); used with I(limit_upstream).
    type: str
    default: pi-dispatch-egress-out
  limit_upstream:
    description: Limit the proxy's own traffic out of I(upstream_network) to I(upstream_ports), the declared model
      endpoint ports and DNS, so even a compromised squid reaches nothing else.
    type: bool
    default: false
  upstream_ports:
    description: TCP ports the proxy may always reach with I(limit_upstream) (the allowlist's CONNECT 443 and
      plain HTTP 80).
    type: list
    elements: int
    default: [80, 443]
  deploy_dir:
    description: The deployment folder whose C(model-endpoints.json) declares the model endpoint ports (read only
      with I(limit_upstream)).
    type: path
    default: /opt/pi-dispatch/egress
  ipv6:
    description: Manage the IPv6 tables too (skipped, with a message, when the host has no ip6tables).
    type: bool
    default: true
  iptables:
    description: Which iptables to drive. C(auto) follows C(iptables -V) (the Debian alternative Docker uses too).
    type: str
    choices: [auto, nft, legacy]
    default: auto
extends_documentation_fragment:
  - pi_dispatch.egress.docker
requirements:
  - iptables (iptables-nft or iptables-legacy), run as root
seealso:
  - module: pi_dispatch.egress.job_network
  - module: pi_dispatch.egress.egress_canary
'''

EXAMPLES = r'''
- name: Keep the host firewall layer
  pi_dispatch.egress.egress_firewall:
    limit_upstream: true
  become: true

- name: Remove it again (its chains and jumps only)
  pi_dispatch.egress.egress_firewall:
    state: absent
  become: true
'''

RETURN = r'''
actions:
  description: What was done (in check mode, what would be), per family.
  returned: always
  type: list
  elements: str
  sample: ['ipv4: create PI-EGRESS-INPUT (4 rules)', 'ipv4: insert the jump DOCKER-USER -> PI-EGRESS-FORWARD (rule 1)']
families:
  description: Per family (C(ipv4), C(ipv6)) the iptables variant and version, the actions, the restore input
    applied (or that would be), and the layer's lines before and after; or C(skipped) with why.
  returned: always
  type: dict
networks:
  description: The networks the interface rules cover (name, id, bridge, kind, subnets).
  returned: always
  type: list
  elements: dict
messages:
  description: Notes (IPv6 skipped, a network that is not a bridge, the FORWARD hook for IPv6).
  returned: always
  type: list
  elements: str
install:
  description: Per family, iptables-restore --noflush input that installs this layer on a table without it (the
    boot unit's file; empty with state absent).
  returned: always
  type: dict
'''

from typing import Optional  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils._firewall import host as _fw_host  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils._firewall import params as _fw_params  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as _jobnet  # noqa: E402


def _local(docker_host: Optional[str]) -> bool:
    return not docker_host or docker_host.startswith('unix://')


def main():
    argument_spec = dict(
        state=dict(type='str', choices=['present', 'absent'], default='present'),
        chain_prefix=dict(type='str', default=_fw_params.DEFAULT_PREFIX),
        pool=dict(type='str', default=_jobnet.DEFAULT_POOL),
        networks=dict(type='list', elements='str'),
        upstream_network=dict(type='str', default=_fw_params.DEFAULT_UPSTREAM),
        limit_upstream=dict(type='bool', default=False),
        upstream_ports=dict(type='list', elements='int', default=list(_fw_params.DEFAULT_PORTS)),
        deploy_dir=dict(type='path', default=_deployment.DEFAULT_DEPLOY_DIR),
        ipv6=dict(type='bool', default=True),
        iptables=dict(type='str', choices=['auto', 'nft', 'legacy'], default='auto'),
    )
    module = AnsibleModule(argument_spec=dc.argument_spec(argument_spec), supports_check_mode=True)
    p = module.params
    try:
        _fw_params.validate_prefix(p['chain_prefix'])
        pool = _fw_params.validate_pool(p['pool'])
        names = _fw_params.validate_network_names(p['networks'])
        base_ports = _fw_params.validate_ports(p['upstream_ports']) if p['limit_upstream'] else None
    except _fw_params.FirewallError as exc:
        module.fail_json(msg=str(exc))
    if not _local(p['docker_host']):
        module.fail_json(msg='egress_firewall writes THIS host\'s iptables and takes bridge names from the daemon, so '
                             'the daemon must be this host\'s (docker_host %s is not a unix socket). Run the task on '
                             'the daemon\'s host against its local socket.' % p['docker_host'])
    networks = []
    endpoint_ports = []
    if p['state'] == 'present':
        client = dc.module_client(module)
        try:
            networks = dc.read("Listing the daemon's networks", client.api.networks)
        except dc.EngineError as exc:
            dc.fail(module, exc)
        if p['limit_upstream']:
            try:
                endpoint_ports = _fw_params.endpoint_ports(_deployment.module_layout(module).deploy_dir)
            except _fw_params.FirewallError as exc:
                module.fail_json(msg=str(exc))
    try:
        result = _fw_host.converge(
            networks, _fw_host.Runner(), state=p['state'], prefix=p['chain_prefix'], pool=pool, names=names,
            upstream=p['upstream_network'], base_ports=base_ports, endpoint_port_list=endpoint_ports,
            endpoints=p['limit_upstream'], ipv6=p['ipv6'], variant=p['iptables'], check_mode=module.check_mode)
    except _fw_params.FirewallError as exc:
        module.fail_json(msg=str(exc))
    if module._diff:
        result['diff'] = [dict(before_header='%s (%s) before' % (family, info.get('variant')),
                               after_header='%s (%s) after' % (family, info.get('variant')),
                               before=info.get('before', ''), after=info.get('after', ''))
                          for family, info in sorted(result['families'].items()) if 'skipped' not in info]
    for message in result['messages']:
        if message.startswith('IPv6 skipped'):
            module.warn(message)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
