#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r'''
---
module: egress_preflight
short_description: Decide, before a job spends anything, whether the egress proxy can carry it
version_added: 0.1.0
description:
  - Returns the seed's pre-spend verdict from one container inspect of the egress proxy.
  - C(admit) when the proxy is running; C(egress-proxy-stopped) when it is paused, exited, dead,
    created (or restarting); C(egress-proxy-missing) when there is no such container while the
    daemon answers; C(engine-unavailable) with C(retryable=true) when the daemon itself does not
    answer, so nothing was decided and the job should be retried later, not refused.
  - With I(enabled=false) (the egress policy off) the verdict is C(admit) and the daemon is not touched.
  - What this proves is the structure (the proxy is up), not the allowlist's contents.
  - Never changes anything.
author:
  - pi-dispatch egress team (@pi-dispatch)
attributes:
  check_mode:
    support: full
    description: Read-only; runs the same in check mode.
  diff_mode:
    support: none
    description: It reads one inspect and changes nothing.
options:
  enabled:
    description: Whether the egress policy is on. When C(false) the job is admitted without asking the daemon.
    type: bool
    default: true
  proxy_name:
    description: The egress proxy container.
    type: str
    default: pi-dispatch-egress-proxy
  fail_on_refusal:
    description: Fail the task unless the verdict is C(admit) (the verdict is returned either way).
    type: bool
    default: false
  mode:
    description: The job's network mode. For C(transparent) the gateway I(gateway_name) must run too (a second
      inspect).
    type: str
    version_added: 0.5.0
    choices: [explicit, transparent]
    default: explicit
  gateway_name:
    description: The gateway of transparent job networks.
    type: str
    version_added: 0.5.0
    default: pi-dispatch-egress-gateway
  credentials_dir:
    description:
      - The deployment folder whose C(egress-credentials.json) declares credentials (docs/credentials.md). When it
        declares any, each secret file must be usable (C(egress-credential-unavailable), naming the credential and the
        file, never a byte of the secret) and the interceptor I(interceptor_name) must run
        (C(egress-interceptor-missing) / C(egress-interceptor-stopped)).
    type: path
    version_added: 0.6.0
  interceptor_name:
    description: The credential interceptor container.
    type: str
    default: pi-dispatch-egress-interceptor
    version_added: 0.6.0
  mcp_json:
    description:
      - The job's C(mcp.json) (its MCP servers, read as pi reads it; comments and trailing commas are fine).
      - Every enabled server with a C(url) must be C(https://) on 443 to a host the allowlist of I(deploy_dir) lists,
        or exactly the host and port of a declared model endpoint; otherwise the verdict is
        C(egress-mcp-server-refused), naming each server and why, decided from the files before the daemon is
        asked. A package runner (npx, uvx) whose registry is not listed is said in the admitted message.
    type: path
    version_added: 0.11.0
  deploy_dir:
    description: The deployment folder whose allowlist and model endpoints judge I(mcp_json).
    type: path
    default: /opt/pi-dispatch/egress
    version_added: 0.11.0
extends_documentation_fragment:
  - pi_dispatch.egress.docker
requirements:
  - Docker SDK for Python >= 7.0 (only when I(enabled=true))
seealso:
  - module: pi_dispatch.egress.job_network
'''

EXAMPLES = r'''
- name: Refuse the job before it spends when the proxy is down
  pi_dispatch.egress.egress_preflight:
  register: preflight

- name: Retry later when the daemon did not answer
  ansible.builtin.fail:
    msg: "{{ preflight.message }}"
  when: not preflight.admitted
'''

RETURN = r'''
verdict:
  description: One of admit, egress-proxy-stopped, egress-proxy-missing, engine-unavailable, and for I(mode=transparent)
    egress-gateway-stopped, egress-gateway-missing; with I(credentials_dir) the credential verdicts, with I(mcp_json)
    egress-mcp-server-refused.
  returned: always
  type: str
  sample: admit
admitted:
  description: Whether the verdict is admit.
  returned: always
  type: bool
retryable:
  description: True only for engine-unavailable (nothing was decided).
  returned: always
  type: bool
state:
  description: The proxy's docker state (null when missing, unknown, or the policy is off).
  returned: always
  type: str
  sample: running
message:
  description: What the verdict means and what to do.
  returned: always
  type: str
'''

from ansible.module_utils.basic import AnsibleModule, missing_required_lib  # noqa: E402

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as _jobnet  # noqa: E402


def main():
    argument_spec = dict(
        enabled=dict(type='bool', default=True),
        proxy_name=dict(type='str', default=_jobnet.PROXY_NAME),
        fail_on_refusal=dict(type='bool', default=False),
        mode=dict(type='str', default=_jobnet.EXPLICIT, choices=list(_jobnet.MODES)),
        gateway_name=dict(type='str', default=_jobnet.GATEWAY_NAME),
        credentials_dir=dict(type='path'),
        interceptor_name=dict(type='str', default='pi-dispatch-egress-interceptor'),
        mcp_json=dict(type='path'),
        deploy_dir=dict(type='path', default='/opt/pi-dispatch/egress'),
    )
    module = AnsibleModule(argument_spec=dc.argument_spec(argument_spec), supports_check_mode=True)
    p = module.params
    if p['enabled'] and dc.docker is None:
        module.fail_json(msg=missing_required_lib('docker'), exception=dc.DOCKER_IMPORT_ERROR)
    problem = dc.check_connection_options(p)
    if problem:
        module.fail_json(msg=problem)
    verdict = _jobnet.preflight(_jobnet.lazy_client(p['docker_host'], p['docker_timeout'], **dc.tls_options(p)),
                                proxy_name=p['proxy_name'], enabled=p['enabled'], docker_host=p['docker_host'],
                                mode=p['mode'], gateway_name=p['gateway_name'], credentials_dir=p['credentials_dir'],
                                interceptor_name=p['interceptor_name'], mcp_json=p['mcp_json'],
                                deploy_dir=p['deploy_dir'])
    result = dict(changed=False, admitted=verdict.admitted, **verdict.as_dict())
    if p['fail_on_refusal'] and not verdict.admitted:
        module.fail_json(msg=verdict.message, **result)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
