#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r'''
---
module: job_network_gc
short_description: Remove the job networks a dead worker left behind
version_added: 0.1.0
description:
  - The boot-time sweep of the per-job networks, made safe. Candidates are networks whose name is
    exactly a job network name C(pi-job-<id>-net); one that carries labels, none of them ours, or
    our job-id label naming another job, is kept and reported.
  - A network with a running (or paused, or restarting) container on it is kept. A network with a
    stopped or created container other than the proxy is kept and reported, because that container
    would lose its network. Otherwise the proxy and any stale endpoint are force-detached and the
    network is removed.
  - With I(remove_exited_jobs) the job container C(pi-job-<id>) of a finished job (exited or dead)
    is removed first, and its network with it.
  - I(min_age) keeps a network younger than that many seconds, so a job being set up right now is
    never swept (age from our creation label, else the daemon's creation time; unknown age keeps).
  - Every candidate is reported exactly once, as removed, kept (with a fixed reason) or failed
    (with the step and the daemon's message). Nothing is silently skipped.
author:
  - pi-dispatch egress team (@pi-dispatch)
attributes:
  check_mode:
    support: full
    description: Lists what would be removed (and detached) and what would be kept; changes nothing.
  diff_mode:
    support: none
    description: Removals are listed in the result (in check mode, what would go); there is no file diff.
options:
  min_age:
    description: Seconds a network must have existed before it may be swept. C(0) sweeps regardless of age.
    type: int
    default: 300
  remove_exited_jobs:
    description: Remove an exited or dead job container C(pi-job-<id>) first, then its network.
    type: bool
    default: false
  proxy_name:
    description: The egress proxy container, which is detached (never kept for).
    type: str
    default: pi-dispatch-egress-proxy
  id_prefix:
    description: Sweep only job ids starting with this (tests, and daemons shared by several fleets). Empty sweeps all.
    type: str
    default: ''
  fail_on_failed:
    description: Fail the task when any network could not be removed (it is reported either way).
    type: bool
    default: false
  credentials_dir:
    description:
      - The deployment folder (docs/credentials.md). The credential placeholders of each removed network's job are
        forgotten, and so is any job's placeholder record older than I(min_age) whose network is gone.
    type: path
    version_added: 0.6.0
extends_documentation_fragment:
  - pi_dispatch.egress.docker
seealso:
  - module: pi_dispatch.egress.job_network
'''

EXAMPLES = r'''
- name: See what the sweep would do
  pi_dispatch.egress.job_network_gc:
  check_mode: true
  register: gc

- name: Sweep, removing finished job containers first
  pi_dispatch.egress.job_network_gc:
    min_age: 600
    remove_exited_jobs: true
'''

RETURN = r'''
removed:
  description: Networks removed (in check mode, that would be removed), with what was detached and removed first.
  returned: always
  type: list
  elements: dict
  sample: [{network: pi-job-17-net, job_id: '17', detached: [pi-dispatch-egress-proxy], removed_containers: []}]
kept:
  description: Networks kept, each with a fixed C(reason) (see docs/job-networks.md) and its members.
  returned: always
  type: list
  elements: dict
  sample: [{network: pi-job-18-net, job_id: '18', reason: job-stopped,
            members: [{name: pi-job-18, state: exited}, {name: pi-dispatch-egress-proxy, state: running}]}]
failed:
  description: Networks whose removal failed, with the C(step), the daemon's C(message) and what was C(done) before.
  returned: always
  type: list
  elements: dict
forgotten:
  description: The jobs whose credential placeholders were forgotten (with I(credentials_dir)).
  returned: always
  type: list
  elements: str
  version_added: 0.6.0
lines:
  description: One human-readable line per network, in the order above.
  returned: always
  type: list
  elements: str
reasons:
  description: The fixed keep reasons and what each means.
  returned: always
  type: dict
'''

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as _jobnet  # noqa: E402


def main():
    argument_spec = dict(
        min_age=dict(type='int', default=300),
        remove_exited_jobs=dict(type='bool', default=False),
        proxy_name=dict(type='str', default=_jobnet.PROXY_NAME),
        id_prefix=dict(type='str', default=''),
        fail_on_failed=dict(type='bool', default=False),
        credentials_dir=dict(type='path'),
    )
    module = AnsibleModule(argument_spec=dc.argument_spec(argument_spec), supports_check_mode=True)
    p = module.params
    if p['min_age'] < 0:
        module.fail_json(msg='min_age %d is negative; use 0 (no minimum) or a number of seconds, e.g. 300.'
                         % p['min_age'])
    try:
        _jobnet.validate_id_prefix(p['id_prefix'])
    except _jobnet.JobNetError as exc:
        module.fail_json(msg=str(exc))
    client = dc.module_client(module)
    try:
        result = _jobnet.sweep(client, min_age=p['min_age'], remove_exited_jobs=p['remove_exited_jobs'],
                               proxy_name=p['proxy_name'], id_prefix=p['id_prefix'],
                               check_mode=module.check_mode, credentials_dir=p['credentials_dir'])
    except (_jobnet.JobNetError, dc.EngineError) as exc:
        dc.fail(module, exc)
    result['lines'] = _jobnet.sweep_lines(result, check_mode=module.check_mode)
    result['reasons'] = dict(_jobnet.KEEP_REASONS)
    for entry in result['failed']:
        module.warn('%s could not be removed (%s): %s' % (entry['network'] or 'a proxy shard', entry['step'],
                                                          entry['message']))
    if p['fail_on_failed'] and result['failed']:
        module.fail_json(msg='%d job network(s) could not be removed: %s' % (
            len(result['failed']), ', '.join(e['network'] for e in result['failed'])), **result)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
