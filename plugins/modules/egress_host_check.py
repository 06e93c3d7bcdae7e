#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r'''
---
module: egress_host_check
short_description: Check that a target host has what the collection's modules need there
version_added: 0.2.0
description:
  - The collection's modules run on the target host, not on the controller. This module checks,
    on the target, what they need there and fails with one message naming the host's gap and the
    fix, instead of a traceback from the first module that hits it.
  - Checks the Python the modules run with (3.8 or newer), that it can import the Docker SDK for
    Python (7.0 or newer) and C(publicsuffixlist) (the allowlist check), and that the Docker Engine
    answers (API 1.41 or newer).
  - Also reports which iptables the host runs, nf_tables or legacy as C(iptables -V) names it, the
    one Docker programs its network rules with. It decides how a job network's start grows with the
    number of networks on the host (docs/job-networks.md); it is reported, never a failure.
  - The playbooks run it first on every host (role C(pi_dispatch.egress.host_check)).
  - With O(proxy_limits_unenforced_ok) set (C(playbooks/site.yml) and C(upgrade.yml) set it), it also refuses an
    engine that cannot apply the proxy's memory and pids limits (rootless on a cgroup v1 host) unless it is
    V(true). It is the refusal of M(pi_dispatch.egress.egress_proxy), said before any role of the play changes anything.
  - Never changes anything.
author:
  - pi-dispatch egress team (@pi-dispatch)
attributes:
  check_mode:
    support: full
    description: Read-only; runs the same in check mode.
  diff_mode:
    support: none
    description: It changes nothing.
options:
  engine:
    description: Also check that the Docker Engine answers (C(false) checks Python and the SDK only).
    type: bool
    default: true
  proxy_limits_unenforced_ok:
    description:
      - The play deploys the proxy, with this consent (the role passes C(egress_proxy_limits_unenforced_ok)). On an
        engine that cannot apply the proxy's memory and pids limits, V(false) fails here, naming the consent and the
        fix, before anything changes; V(true) goes on and RV(limits) says they are not enforced.
      - Unset, the limits are not asked about (the play deploys no proxy). Needs O(engine=true).
    type: bool
    version_added: 0.18.0
extends_documentation_fragment:
  - pi_dispatch.egress.docker
requirements:
  - Docker SDK for Python >= 7.0 on the target (what this module checks)
  - publicsuffixlist on the target (what this module checks)
seealso:
  - module: pi_dispatch.egress.egress_preflight
'''

EXAMPLES = r'''
- name: Check the target before the egress roles run
  pi_dispatch.egress.egress_host_check:
'''

RETURN = r'''
python:
  description: The target's Python (executable and version).
  returned: always
  type: dict
  sample: {executable: /usr/bin/python3, version: 3.13.5}
sdk_version:
  description: The Docker SDK for Python the target imports, null when it is missing.
  returned: always
  type: str
  sample: 7.1.0
engine:
  description: The engine's version and API version (when I(engine=true) and it answered).
  returned: when I(engine=true) and the SDK is present
  type: dict
  sample: {version: 26.1.5, api_version: '1.45', docker_host: null}
limits:
  description:
    - Whether the engine enforces the proxy's memory and pids limits, the host's cgroup version and the engine (the
      report M(pi_dispatch.egress.egress_proxy) returns as C(limits)).
  returned: when O(proxy_limits_unenforced_ok) is set and the engine answered
  type: dict
  sample: {enforced: false, cgroup_version: '1', engine: Podman 4.3.1 (rootless), why: Podman 4.3.1 (rootless) runs ...}
  version_added: 0.18.0
iptables:
  description:
    - The host's C(iptables) as C(iptables -V) names it. I(variant) is C(nft) or C(legacy), null
      when it could not be told, and then I(why) says what was found instead.
    - On a host with hundreds of job networks, C(legacy) keeps a job network's create flat where
      C(nft) grows (docs/job-networks.md, "The host's iptables").
  returned: when the checks passed
  type: dict
  sample: {variant: nft, version: iptables v1.8.9 (nf_tables), why: null}
'''

import sys

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import allowlist as _allowlist
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import venue as _venue
from ansible_collections.pi_dispatch.egress.plugins.module_utils._firewall import host as _firewall_host
from ansible_collections.pi_dispatch.egress.plugins.module_utils._fleet import host_check as _host_check


def main():
    module = AnsibleModule(argument_spec=dc.argument_spec(dict(engine=dict(type='bool', default=True),
                                                               proxy_limits_unenforced_ok=dict(type='bool'))),
                           supports_check_mode=True)
    result = dict(changed=False, sdk_version=None,
                  python=dict(executable=sys.executable, version='.'.join(str(p) for p in sys.version_info[:3])))
    problem = _host_check.check_python()
    if problem:
        module.fail_json(msg=problem, **result)
    if dc.docker is not None:
        result['sdk_version'] = getattr(dc.docker, '__version__', '0')
    problem = _host_check.check_sdk(result['sdk_version'], sys.executable)
    if problem:
        module.fail_json(msg=problem, **result)
    missing = [_allowlist.PSL_PACKAGE] if _allowlist.publicsuffixlist is None else []
    problem = _host_check.check_libraries(missing, sys.executable)
    if problem:
        module.fail_json(msg=problem, **result)
    if module.params['engine']:
        where = dc.describe_host(module.params['docker_host'])
        client = dc.module_client(module, result)
        try:
            info = dc.read('the engine version', client.version)
        except dc.EngineError as exc:
            dc.fail(module, exc, result)
        result['engine'] = dict(version=info.get('Version'), api_version=info.get('ApiVersion'),
                                docker_host=module.params['docker_host'])
        problem = _host_check.check_api(info.get('ApiVersion', '0'), info.get('Version'), where)
        if problem:
            module.fail_json(msg=problem, **result)
        consent = module.params['proxy_limits_unenforced_ok']
        if consent is not None:
            try:
                refusal, result['limits'] = _venue.venue(client).limits_decision(consent)
            except dc.EngineError as exc:
                dc.fail(module, exc, result)
            if refusal:
                module.fail_json(msg='%s. Nothing was changed.' % refusal, **result)
    result['iptables'] = _host_check.iptables_variant(_firewall_host.Runner(timeout=10))
    module.exit_json(**result)


if __name__ == '__main__':
    main()
