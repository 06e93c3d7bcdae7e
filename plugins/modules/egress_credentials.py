#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r'''
---
module: egress_credentials
short_description: Run the credential interceptor for the credentials egress-credentials.json declares
version_added: 0.6.0
description:
  - Reads C(egress-credentials.json) in the deployment folder (created empty when missing), each bound host
    checked against the allowlist. A refused declaration names the file, the credential, the key and the fix,
    and changes nothing (docs/credentials.md).
  - With nothing declared, removes an interceptor this collection made, then the include and the interceptor's
    configuration; the proxy runs without the include.
  - Otherwise writes the interceptor's configuration (never a secret value) under C(credentials/) in the
    deployment folder, makes the interceptor's C(--internal) network and runs the interceptor (recreated when its
    image or shape changed), then renders the TLS name check's include (C(egress-credentials.conf)) with that
    network's subnet. A running proxy that already mounts the include rereads it.
  - Replacing a running interceptor (a rebuilt image, a changed shape, a CA rotation) or removing it drops the
    connections to bound hosts of every job on the proxy family. While job networks are attached to a running
    member, that is refused before anything is written, naming them, unless I(allow_cut_jobs) (the proxy's
    consent rule).
  - Each secret file is checked (root-only, a regular file, one printable line); a problem is reported naming the
    credential and the file, never a byte of the file, and does not stop the run (the preflight refuses a job
    whose secret is unusable).
author:
  - pi-dispatch egress team (@pi-dispatch)
attributes:
  check_mode:
    support: full
    description: Says what would be written, created, recreated or reloaded; changes nothing.
  diff_mode:
    support: none
    description: The actions are in the result; no secret and no file content is ever shown.
options:
  deploy_dir:
    description: The deployment folder (C(egress-credentials.json), C(egress-allowlist.conf)).
    type: path
    required: true
  name:
    description: The interceptor container.
    type: str
    default: pi-dispatch-egress-interceptor
  image:
    description: The locally built interceptor image (nothing is pulled).
    type: str
    default: pi-dispatch-egress-interceptor:latest
  network:
    description: The C(--internal) network only the proxy and the interceptor are on.
    type: str
    default: pi-dispatch-egress-credentials
  proxy_name:
    description: The proxy whose TLS name check routes bound hosts through the interceptor.
    type: str
    default: pi-dispatch-egress-proxy
  upstream_ca:
    description:
      - A CA bundle the interceptor checks the bound hosts' certificates against instead of its own public bundle
        (a provider behind a private CA, or the tests' fake provider). Copied into the deployment folder.
    type: path
  inspect_only:
    description:
      - Only read and check the declaration (and create it empty when missing); start nothing. C(work) in the
        result then says whether a full run has anything to do.
    type: bool
    default: false
  allow_cut_jobs:
    description:
      - Consent to replace or remove a running interceptor while job networks are attached to the proxy family
        (their connections to bound hosts drop). Without it such a run is refused and changes nothing.
    type: bool
    default: false
extends_documentation_fragment:
  - pi_dispatch.egress.docker
requirements:
  - Docker SDK for Python >= 7.0
seealso:
  - module: pi_dispatch.egress.egress_proxy
'''

EXAMPLES = r'''
- name: Run the credential interceptor for what egress-credentials.json declares
  pi_dispatch.egress.egress_credentials:
    deploy_dir: /opt/pi-dispatch/egress
  register: credentials

- name: Mount the include into the proxy when anything is declared
  pi_dispatch.egress.egress_proxy:
    deploy_dir: /opt/pi-dispatch/egress
    credentials_include: "{{ credentials.include | default(omit, true) }}"
'''

RETURN = r'''
actions:
  description: What was done (or in check mode would be), in order.
  returned: always
  type: list
  elements: str
declared:
  description: The declared credentials (name, host, port, env, scheme, header); never a secret.
  returned: always
  type: list
  elements: dict
include:
  description: The rendered include the proxy mounts, or null when nothing is declared.
  returned: always
  type: str
ca_cert:
  description: The deployment CA's certificate, which jobs trust (null when nothing is declared).
  returned: always
  type: str
secret_problems:
  description: The credentials whose secret file is unusable, each with the problem (never the file's content).
  returned: always
  type: list
  elements: dict
work:
  description:
    - With I(inspect_only), whether a full run has anything to do (a credential declared, or the include or the
      interceptor's configuration still on disk, so an interceptor to remove). Always false otherwise.
  returned: always
  type: bool
refused:
  description: Why the run was refused under the consent rule (it then changed nothing).
  returned: when refused
  type: str
'''

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import credentials as _credentials  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import credentials_apply as _apply  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import interceptor as _interceptor  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy.spec import PROXY_NAME


def main():
    argument_spec = dict(
        deploy_dir=dict(type='path', required=True),
        name=dict(type='str', default=_interceptor.INTERCEPTOR_NAME),
        image=dict(type='str', default=_interceptor.INTERCEPTOR_IMAGE),
        network=dict(type='str', default=_interceptor.NETWORK),
        proxy_name=dict(type='str', default=PROXY_NAME),
        upstream_ca=dict(type='path'),
        inspect_only=dict(type='bool', default=False),
        allow_cut_jobs=dict(type='bool', default=False),
    )
    module = AnsibleModule(argument_spec=dc.argument_spec(argument_spec), supports_check_mode=True)
    result = dict(changed=False, actions=[], declared=[], include=None, ca_cert=None, secret_problems=[], work=False)
    client = None if module.params['inspect_only'] else dc.module_client(module, result)
    run = _apply.CredentialsDeploy(client, module.params, check_mode=module.check_mode)
    try:
        result.update(run.run())
    except _credentials.CredentialsError as exc:
        module.fail_json(msg=str(exc), problems=[p.as_dict() for p in exc.problems], **result)
    except (dc.EngineError, OSError) as exc:
        dc.fail(module, exc, result, suffix='(docs/credentials.md)')
    for warning in run.warnings:
        module.warn(warning)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
