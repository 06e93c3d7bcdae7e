#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r'''
---
module: job_network
short_description: Create or tear down the per-job network of one pi-dispatch job
version_added: 0.1.0
description:
  - Manages C(pi-job-<id>-net), the C(--internal) network of one job, which holds exactly the job
    container C(pi-job-<id>) and the egress proxy.
  - I(state=present) creates it labelled as ours (job id, creation time, owner host), with a /29
    from the dedicated job pool (overlap-checked against every docker network and the host's
    routes), then attaches the proxy. If the attach fails the network is removed again and the
    task fails with the daemon's reason, so no half-made network is left.
  - I(state=absent) force-detaches the proxy, then removes the network. It refuses, changing
    nothing, while any other container (running, stopped or created) is still on it; it never
    removes a container.
  - The job id is validated (letters, digits, C(-), C(_); 1 to 64 characters, starting and
    ending with a letter or digit) before any name is built from it.
  - A thin adapter over C(plugins/module_utils/jobnet.py), which a job runner can import and
    call directly (create_job_network, teardown_job_network).
author:
  - pi-dispatch egress team (@pi-dispatch)
attributes:
  check_mode:
    support: full
    description: Reads the daemon (networks, routes) and reports the subnet and actions it would take; changes nothing.
  diff_mode:
    support: full
    description: Shows the network's presence before and after.
options:
  job_id:
    description: The job's id; names the network C(pi-job-<id>-net) and the container C(pi-job-<id>).
    type: str
    required: true
  state:
    description: C(present) creates the network and attaches the proxy; C(absent) detaches the proxy and removes it.
    type: str
    default: present
    choices: [present, absent]
  proxy_name:
    description: The egress proxy container to attach.
    type: str
    default: pi-dispatch-egress-proxy
  proxy_port:
    description: The proxy's port, used in the returned C(HTTPS_PROXY) / C(HTTP_PROXY).
    type: int
    default: 3128
  pool:
    description:
      - The dedicated IPv4 pool job networks take their subnets from. See docs/job-networks.md for why
        C(10.47.0.0/16) is the default.
    type: str
    default: 10.47.0.0/16
  prefix:
    description: Prefix length of each job network's subnet (at most 29; a /29 holds gateway, job and proxy).
    type: int
    default: 29
  no_proxy:
    description: The C(NO_PROXY) value handed to the job.
    type: str
    default: localhost,127.0.0.1,::1
  check_host_routes:
    description:
      - Also avoid the routes of the host this module runs on. Right for a local daemon; set C(false)
        when I(docker_host) is a remote daemon, whose routes this host cannot see.
    type: bool
    default: true
  shard_bound:
    description:
      - How many job networks the proxy and each of its shards carry. A new network gets the least-loaded running
        one below the bound; when all are full, a new shard C(<proxy_name>-shard-<n>) (a clone of the proxy) is
        started first and attached with the network alias I(proxy_name), so the job still reaches
        C(<proxy_name>:<proxy_port>). C(0) turns shards off (the proxy carries every network).
      - Unset, the bound the proxy carries (its label C(io.pi-dispatch.egress.shard-bound), set by the proxy
        role's C(egress_proxy_shard_bound)), else 10.
      - Why a bound at all, and the figures, in docs/job-networks.md ("What grows with the number of jobs").
    type: int
  mode:
    description:
      - C(explicit) (the default) hands the job the proxy variables; every client must honour them.
      - C(transparent) needs nothing from the job (docs/transparent.md). Its names resolve through the gateway
        I(gateway_name), which answers only the names the allowlist, the model endpoints and the project's
        opt-ins cover (NXDOMAIN for any other, sent nowhere), relays 80 and 443 into the proxy and forwards only
        the ports the project opted in. I(env) is then empty and I(run_args) carries C(--dns).
      - A transparent network is a /26 (with I(prefix) left at 29; else I(prefix) must be 27 or wider).
    type: str
    version_added: 0.5.0
    choices: [explicit, transparent]
    default: explicit
  project_policy:
    description:
      - With I(mode=transparent), the absolute path of the project's policy file (seed 001's
        C(.pi-container/config.yaml); only its C(egress.allow) is read). A project without it gets the deny-all
        seed, written create-only. Unset, the job gets no opt-in at all.
      - Refused with any other mode.
    type: path
    version_added: 0.5.0
  gateway_name:
    description: The gateway container of transparent job networks (started by the proxy role with
      C(egress_gateway_enabled)).
    type: str
    version_added: 0.5.0
    default: pi-dispatch-egress-gateway
  credentials_dir:
    description:
      - The deployment folder whose C(egress-credentials.json) declares credentials (docs/credentials.md). With
        I(state=present), each secret file is checked first (an unusable one refuses the job, naming the
        credential, and nothing is created); the job's C(env) then holds a placeholder, unique to it, in each
        credential's variable, and the CA variables, and C(run_args) mounts the deployment CA. With
        I(state=absent), the job's placeholders are forgotten.
      - Unset, no credential is handled (the job gets no placeholder).
    type: path
    version_added: 0.6.0
  deploy_dir:
    description:
      - The deployment folder that keeps the operator's approvals of project opt-ins (C(optins-approved/);
        docs/transparent.md, "Approving a project's opt-ins"). With I(mode=transparent), a I(project_policy) that
        opens any port takes effect only as approved there; any other is refused, with the diff and the approving
        command, and nothing is created.
      - Unset, I(credentials_dir) when that is set, else C(/opt/pi-dispatch/egress).
    type: path
    version_added: 0.15.0
extends_documentation_fragment:
  - pi_dispatch.egress.docker
requirements:
  - Docker Engine API >= 1.41
seealso:
  - module: pi_dispatch.egress.job_network_gc
  - module: pi_dispatch.egress.egress_preflight
'''

EXAMPLES = r'''
- name: Give job 1234 its network
  pi_dispatch.egress.job_network:
    job_id: '1234'
  register: jobnet

- name: Start the job on it
  ansible.builtin.command:
    argv: "{{ ['docker', 'run', '-d'] + jobnet.run_args + ['job-image:latest'] }}"

- name: Tear it down after the job container is removed
  pi_dispatch.egress.job_network:
    job_id: '1234'
    state: absent
'''

RETURN = r'''
network:
  description: The network's name.
  returned: always
  type: str
  sample: pi-job-1234-net
network_id:
  description: The network's id (null in check mode before it exists, and after state=absent).
  returned: always
  type: str
container:
  description: The job container's name.
  returned: always
  type: str
  sample: pi-job-1234
subnet:
  description: The network's subnet (in check mode, the one that would be picked).
  returned: when state=present
  type: str
proxy:
  description: The container that carries the network, the proxy or one of its shards (in check mode, the one it
    would get).
  returned: when state=present
  type: str
  sample: 10.47.0.0/29
env:
  description:
    - The environment the job container needs (uppercase proxy variables, NO_PROXY, NODE_USE_ENV_PROXY).
    - With I(credentials_dir) and declared credentials, also each credential's variable holding the job's placeholder
      (never the secret) and the CA variables (NODE_EXTRA_CA_CERTS, SSL_CERT_FILE, REQUESTS_CA_BUNDLE, GIT_SSL_CAINFO).
  returned: when state=present
  type: dict
  sample: {HTTPS_PROXY: 'http://pi-dispatch-egress-proxy:3128', HTTP_PROXY: 'http://pi-dispatch-egress-proxy:3128',
           NO_PROXY: 'localhost,127.0.0.1,::1', NODE_USE_ENV_PROXY: '1'}
run_args:
  description: C(docker run) arguments for the job container (name, network, environment).
  returned: when state=present
  type: list
  elements: str
ca_mounts:
  description: The deployment CA files the job mounts (host file to path in the job), with I(credentials_dir).
  returned: when state=present
  type: dict
  version_added: 0.6.0
mode:
  description: The network's mode (explicit or transparent).
  returned: when state=present
  type: str
  sample: transparent
dns:
  description: The gateway's address the job resolves through (transparent networks; null otherwise).
  returned: when state=present
  type: str
  sample: 10.47.0.2
optins:
  description: What the project opened (transparent networks) - C(path), C(seeded) (the deny-all file was written
    now), C(wide) (keys set to C(true)), C(ports) (C(tcp)/C(udp) port to C(true) or a list of names).
  returned: when state=present and mode=transparent
  type: dict
actions:
  description: The actions taken (or, in check mode, that would be taken), in order.
  returned: always
  type: list
  elements: str
  sample: ['create pi-job-1234-net (10.47.0.0/29)', 'attach pi-dispatch-egress-proxy']
'''

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as _jobnet  # noqa: E402


def main():
    argument_spec = dict(
        job_id=dict(type='str', required=True),
        state=dict(type='str', default='present', choices=['present', 'absent']),
        proxy_name=dict(type='str', default=_jobnet.PROXY_NAME),
        proxy_port=dict(type='int', default=_jobnet.PROXY_PORT),
        pool=dict(type='str', default=_jobnet.DEFAULT_POOL),
        prefix=dict(type='int', default=_jobnet.DEFAULT_PREFIX),
        no_proxy=dict(type='str', default=_jobnet.NO_PROXY),
        check_host_routes=dict(type='bool', default=True),
        shard_bound=dict(type='int'),
        mode=dict(type='str', default=_jobnet.EXPLICIT, choices=list(_jobnet.MODES)),
        project_policy=dict(type='path'),
        gateway_name=dict(type='str', default=_jobnet.GATEWAY_NAME),
        credentials_dir=dict(type='path'),
        deploy_dir=dict(type='path'),
    )
    module = AnsibleModule(argument_spec=dc.argument_spec(argument_spec), supports_check_mode=True)
    p = module.params
    # Bad input is refused before the daemon is asked anything.
    try:
        _jobnet.validate_job_id(p['job_id'])
        _jobnet.parse_pool(p['pool'], p['prefix'])
    except _jobnet.JobNetError as exc:
        module.fail_json(msg=str(exc))
    if not 1 <= p['proxy_port'] <= 65535:
        module.fail_json(msg='proxy_port %d is not a TCP port; use 1 to 65535 (the proxy listens on 3128).'
                         % p['proxy_port'])

    name = _jobnet.network_name(p['job_id'])
    result = dict(changed=False, network=name, network_id=None, container=_jobnet.container_name(p['job_id']),
                  actions=[])
    client = dc.module_client(module, result)

    try:
        before = _jobnet.inspect_job_network(client, name) is not None
        if p['state'] == 'present':
            jobnet = _jobnet.create_job_network(
                client, p['job_id'], proxy_name=p['proxy_name'], proxy_port=p['proxy_port'], pool=p['pool'],
                prefix=p['prefix'], routes=None if p['check_host_routes'] else [], no_proxy=p['no_proxy'],
                check_mode=module.check_mode, shard_bound=p['shard_bound'], mode=p['mode'],
                project_policy=p['project_policy'], gateway_name=p['gateway_name'],
                credentials_dir=p['credentials_dir'], deploy_dir=p['deploy_dir'])
            result.update(changed=jobnet.changed, network_id=jobnet.network_id, subnet=jobnet.subnet,
                          proxy=jobnet.proxy, env=jobnet.env, run_args=jobnet.run_args(), actions=jobnet.actions,
                          mode=jobnet.mode, dns=jobnet.dns, ca_mounts=jobnet.ca_mounts)
            if jobnet.optins is not None:
                result['optins'] = jobnet.optins
            after = True
        else:
            done = _jobnet.teardown_job_network(client, p['job_id'], proxy_name=p['proxy_name'],
                                                check_mode=module.check_mode, gateway_name=p['gateway_name'],
                                                credentials_dir=p['credentials_dir'])
            result.update(changed=done['changed'], actions=done['actions'])
            after = False
    except (_jobnet.JobNetError, dc.EngineError) as exc:
        dc.fail(module, exc, result)
    if module._diff:
        result['diff'] = dict(before='network %s: %s\n' % (name, 'present' if before else 'absent'),
                              after='network %s: %s\n' % (name, 'present' if after else 'absent'))
    module.exit_json(**result)


if __name__ == '__main__':
    main()
