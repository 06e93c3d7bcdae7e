#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r'''
---
module: model_endpoints
short_description: Render the declared model endpoints into the proxy's include and reload it
version_added: 0.1.0
description:
  - Reads and validates C(model-endpoints.json) (the declaration), renders the squid include
    C(model-endpoints.conf) from it, writes that file B(in place) when its content differs, and then
    reloads the running proxy with C(squid -k reconfigure). The proxy is never restarted (a restart
    cuts every running job; a reconfigure keeps them and their tunnels).
  - The declaration is refused, never repaired. Every refusal names the endpoint (index and id), the key,
    the value, the rule and the fix, and nothing on disk or in the daemon changes. See
    C(docs/model-endpoints.md) for the contract.
  - The include is written in place (open, truncate, write, fsync; the inode never changes) because the
    proxy mounts it as a single file and a file replaced by rename would leave squid reading the old one.
    A missing include, a symlink, a directory or a file with other hard links is refused. A failed write
    leaves the empty include (header only), never a partial one.
  - Before the reload the proxy parses its rules with the new include (C(squid -k parse)); when squid
    refuses them the previous include is written back and nothing is reloaded.
  - A proxy that does not exist or is not running is not reloaded; the file is still written (the proxy
    reads it when it starts) and a warning says so.
  - The declaration is the file (I(declaration)) or, with I(endpoints), a list given to the module; both
    are validated by the same rules, with the same messages.
  - With I(state=validated) the module only validates the declaration, renders it and checks the include it
    would write, and reports, whether or not in check mode; it writes nothing, reloads nothing and never
    contacts the daemon.
author:
  - pi-dispatch egress team (@pi-dispatch)
attributes:
  check_mode:
    support: full
    description: Validates and renders, reports whether the include would change and whether a reload would
      run, and writes nothing and reloads nothing.
  diff_mode:
    support: full
    description: Shows the include before and after; the after header says whether a reload follows.
options:
  deploy_dir:
    description: The deployment folder holding C(model-endpoints.json) and C(model-endpoints.conf).
    type: path
    default: /opt/pi-dispatch/egress
  declaration:
    description:
      - The declaration file. Unset means C(<deploy_dir>/model-endpoints.json), and a missing default file
        means nothing is declared. A file named here must exist.
      - The include is always C(<deploy_dir>/model-endpoints.conf), wherever the declaration lives.
      - Mutually exclusive with I(endpoints).
    type: path
    aliases: [endpoints_file]
  endpoints:
    description:
      - The declaration given as its list of endpoints instead of a file, each a mapping with C(id),
        C(host), C(port), C(slots) and optionally C(keyless) (the C(endpoints) of a version 1
        C(model-endpoints.json)). An empty list declares nothing.
      - Validated by the same rules as the file, with the same messages; a problem names
        C(the endpoints option) where it would name the file. Nothing is converted or defaulted; an item
        that is not a mapping is refused with the declaration's message rather than converted by Ansible,
        which is why the elements are C(raw).
      - The declaration file is neither read nor written; to keep it in step, write it yourself after
        validating with I(state=validated), as the C(pi_dispatch.egress.endpoints) role does.
      - Mutually exclusive with I(declaration).
    type: list
    elements: raw
  state:
    description:
      - C(present) validates, renders, writes the include when it differs and reloads the proxy.
      - C(validated) validates the declaration, renders it and checks the include (it must exist and be a
        regular file), then reports C(endpoints) and C(include_changed) (whether a render would change it)
        with C(changed=false); it writes nothing and reloads nothing, and I(reload) is not used.
    type: str
    choices: [present, validated]
    default: present
  proxy_name:
    description: The proxy container to reload.
    type: str
    default: pi-dispatch-egress-proxy
  reload:
    description: Reload the proxy (C(squid -k reconfigure)) when the include changed.
    type: bool
    default: true
extends_documentation_fragment:
  - pi_dispatch.egress.docker
requirements:
  - Docker SDK for Python >= 7.0 (only to reload)
seealso:
  - module: pi_dispatch.egress.egress_proxy
  - module: pi_dispatch.egress.egress_deployment
'''

EXAMPLES = r'''
- name: Render model-endpoints.json and reload the proxy when the include changed
  pi_dispatch.egress.model_endpoints:
    deploy_dir: /opt/pi-dispatch/egress

- name: Render from a declaration kept elsewhere, without reloading
  pi_dispatch.egress.model_endpoints:
    deploy_dir: /opt/pi-dispatch/egress
    declaration: /etc/pi-dispatch/model-endpoints.json
    reload: false

- name: Show what would change (run with --check --diff)
  pi_dispatch.egress.model_endpoints:
    deploy_dir: /opt/pi-dispatch/egress
  check_mode: true
  diff: true

- name: Validate a declaration given as a list (writes nothing, reloads nothing)
  pi_dispatch.egress.model_endpoints:
    deploy_dir: /opt/pi-dispatch/egress
    endpoints:
      - {id: mac-ollama, host: host.docker.internal, port: 11434, slots: 2, keyless: true}
    state: validated

- name: Render a declaration given as a list and reload the proxy (model-endpoints.json is left as it is)
  pi_dispatch.egress.model_endpoints:
    deploy_dir: /opt/pi-dispatch/egress
    endpoints:
      - {id: lan-vllm, host: 192.168.1.20, port: 8000, slots: 4}
'''

RETURN = r'''
endpoints:
  description: The declared endpoints, sorted by id, hosts in canonical form.
  returned: always
  type: list
  elements: dict
  sample: [{id: mac-ollama, host: host.docker.internal, port: 11434, slots: 2, keyless: true,
            kind: name, address: "host.docker.internal:11434"}]
declaration:
  description:
    - The declaration file read, and whether it exists (a missing default file declares nothing).
    - With I(endpoints), no file is read; C(path) is null and C(exists) false.
  returned: always
  type: dict
  sample: {path: /opt/pi-dispatch/egress/model-endpoints.json, exists: true}
include:
  description: Path of the rendered include (written in place).
  returned: always
  type: str
  sample: /opt/pi-dispatch/egress/model-endpoints.conf
include_changed:
  description: Whether the include's content differs from the render (and, outside check mode and with
    I(state=present), was written).
  returned: always
  type: bool
inode:
  description: The include's inode (unchanged by a write).
  returned: always
  type: int
reloaded:
  description: Whether the proxy was reloaded (in check mode, whether it would be).
  returned: always
  type: bool
loaded:
  description:
    - What squid read at the reload, from the reload path every writer of a file squid reads shares (allowlist and
      includes validated, C(squid -k parse), C(squid -k reconfigure)). C(members) lists the proxy and each
      running shard with C(reconfigured) and C(error). C(parsed) and C(reconfigured) are the steps
      done; C(files) maps each source file to its sha256.
  returned: when the proxy was reloaded
  type: dict
reload_skipped:
  description: Why no reload ran although the include changed (reload disabled, proxy missing or not running,
    or C(state is validated)).
  returned: always
  type: str
  sample: proxy pi-dispatch-egress-proxy is not running (exited)
actions:
  description: The actions taken (or, in check mode, that would be taken), in order.
  returned: always
  type: list
  elements: str
  sample: [write /opt/pi-dispatch/egress/model-endpoints.conf, squid -k parse, squid -k reconfigure]
problems:
  description: On a refused declaration, every problem (path, index, id, key, value, rule, fix, message).
  returned: failure
  type: list
  elements: dict
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import endpoints_apply as _apply
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy.spec import PROXY_NAME


def main():
    argument_spec = dict(
        deploy_dir=dict(type='path', default=_deployment.DEFAULT_DEPLOY_DIR),
        declaration=dict(type='path', aliases=['endpoints_file']),
        endpoints=dict(type='list', elements='raw'),
        state=dict(type='str', default='present', choices=['present', 'validated']),
        proxy_name=dict(type='str', default=PROXY_NAME),
        reload=dict(type='bool', default=True),
    )
    module = AnsibleModule(argument_spec=dc.argument_spec(argument_spec),
                           mutually_exclusive=[('declaration', 'endpoints')], supports_check_mode=True)
    run = _apply.EndpointsApply(module.params, _deployment.module_layout(module), check_mode=module.check_mode,
                                diff=module._diff)

    def connect():
        return dc.module_client(module, run.result, suffix=_apply.NOTHING_WRITTEN,
                                why='needed to reload the proxy; set reload: false to only render')
    try:
        run.run(connect)
    except _apply.EndpointsFailed as exc:
        module.fail_json(msg=str(exc), **dict(exc.extra, **run.result))
    for warning in run.warnings:
        module.warn(warning)
    module.exit_json(**run.result)


if __name__ == '__main__':
    main()
