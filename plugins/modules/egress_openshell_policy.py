#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r'''
---
module: egress_openshell_policy
short_description: Render the OpenShell sandbox network policy from the allowlist and the model endpoints
version_added: 0.7.0
description:
  - Reads the deployment folder's C(egress-allowlist.conf) and C(model-endpoints.json) through the same parsers
    the squid proxy's modules use, and translates them into the network part of an NVIDIA OpenShell sandbox
    policy (C(version) and C(network_policies)) that admits what squid admits and never more. See
    C(docs/openshell.md) for the translation table.
  - A listed name is that host on 443 and 80; a leading-dot entry is the name and its C(**.) wildcard (any
    depth, as squid's C(.domain)); a model endpoint is exactly its host and port. Every endpoint is read by
    OpenShell (C(protocol rest), C(enforcement enforce), C(access full)).
  - An entry OpenShell cannot express without widening (a public-suffix or one-label wildcard, an IPv6 or
    link-local model endpoint) fails the task with C(openshell-egress-untranslatable), naming every such entry,
    the reason and the fix; nothing is written. A line squid matches nothing for (covered by another wildcard,
    an address the destination guard always refuses, a metadata service's name) is skipped and reported as
    C(openshell_policy_skipped).
  - The rendered policy is parsed into the C(SandboxPolicy) protobuf message of the C(openshell) Python package
    with unknown fields refused, so the file is what OpenShell's own schema accepts.
  - With O(compare_with) (a file) or O(gateway) (a sandbox's effective policy, fetched), a policy read back from
    OpenShell is compared with the render semantically (rule names, order, case and C(port) against C(ports) do not
    count); any difference fails the task naming each endpoint (C(openshell-policy-readback-differs)), before
    anything is written.
  - The allowlist is refused as C(egress_allowlist) refuses it (file, line, entry, reason, fix); a missing
    allowlist lists nothing. The model endpoints are refused as C(model_endpoints) refuses them.
author:
  - pi-dispatch egress team (@pi-dispatch)
attributes:
  check_mode:
    support: full
    description: Renders, validates and compares, and reports whether O(dest) would change; writes nothing.
  diff_mode:
    support: full
    description: Shows the policy file before and after.
options:
  deploy_dir:
    description: The deployment folder holding C(egress-allowlist.conf) and C(model-endpoints.json).
    type: path
    default: /opt/pi-dispatch/egress
  dest:
    description:
      - Where to write the rendered policy, atomically, when its content differs. Unset renders and reports only.
      - A symlink or a directory there is refused; the folder must exist.
    type: path
  format:
    description: The policy file's format; both are what C(openshell policy set --policy) reads.
    type: str
    choices: [yaml, json]
    default: yaml
  compare_with:
    description:
      - A policy read back from OpenShell (YAML or JSON, the authored form or the message's JSON mapping) to
        compare with the render. Only the network part is compared; the other sections are listed in
        RV(not_compared).
    type: path
  gateway:
    description:
      - An OpenShell gateway (C(host:port)) to fetch the sandbox O(sandbox)'s effective policy from
        (C(GetSandboxConfig), through the C(openshell) package's own gRPC stub) and compare with the render, as
        O(compare_with) does with a file. Plaintext unless O(gateway_ca), O(gateway_cert) or O(gateway_key) is given.
      - Requires O(sandbox) and O(workspace).
    type: str
  sandbox:
    description: The sandbox whose policy O(gateway) is asked for.
    type: str
  workspace:
    description: The OpenShell workspace of O(sandbox).
    type: str
  gateway_ca:
    description: The CA (PEM) that signed the gateway's certificate; TLS instead of plaintext.
    type: path
  gateway_cert:
    description: A client certificate (PEM) for mTLS to the gateway; with O(gateway_key).
    type: path
  gateway_key:
    description: The client certificate's key (PEM); with O(gateway_cert).
    type: path
  gateway_timeout:
    description: Seconds to wait for the gateway's answer.
    type: float
    default: 30
  private_destinations:
    description:
      - The private ranges the destination guard opens (the proxy role's C(egress_private_destinations)). A listed
        IPv4 address in a non-public range is translated only when one of these opens it (squid refuses it
        otherwise, so it is skipped), and then with C(allowed_ips) naming exactly that address.
    type: list
    elements: str
    default: []
  plain_http:
    description:
      - Admit port 80 of every listed host beside 443, as squid admits a plain request there. OpenShell reads such a
        request when it comes through a tunnel and refuses a plain forward request to a public address.
      - V(false) admits 443 only; the policy then admits less than squid, never more.
    type: bool
    default: true
  binaries:
    description:
      - The executables every rule admits (OpenShell's C(binaries); glob patterns allowed). The default C(/**) is any
        executable of the job, as squid admits any process of it. A narrower list admits less.
    type: list
    elements: str
    default: ['/**']
  credential_provider:
    description:
      - The job's OpenShell provider (its name as C(openshell provider list) shows it). Every endpoint of the policy
        is bound to it (OpenShell's C(credential_binding)), so a placeholder in the agent's environment becomes the
        provider's real value only in a request to a host the policy admits (seed 000).
      - The binding is compared on read back like every other setting of an endpoint, so a policy that lost it, or
        is bound to another provider, is refused naming each endpoint.
      - Unset, no endpoint is bound. Non-empty, no surrounding or control whitespace, at most 253 bytes.
    type: str
    version_added: 0.12.0
  github_repository:
    description:
      - A GitHub job's own repository, as C(owner/name). Every C(github.com) endpoint then carries the git transport
        with a push to that repository only (seed 000). Explicit REST rules replace the C(full) access preset, admitting
        any C(GET) and C(HEAD), a fetch (C(POST .../git-upload-pack)) from any repository, and a push
        (C(POST /owner/name.git/git-receive-pack) or without C(.git)) to this one. Every other write there is
        refused, git LFS included. The other forges, and C(api.github.com), keep the access the allowlist gives.
      - Compared on read back like every other setting. Set but with no rule admitting C(github.com), the
        C(limits) say the job can neither fetch from nor push to it.
      - Unset, C(github.com) is rendered as listed.
    type: str
    version_added: 0.12.0
  project_policy:
    description:
      - The absolute path of the job's project policy (seed 001's C(.pi-container/config.yaml); only
        C(egress.allow) is read, as for a transparent job network). Each TCP port opened towards listed names
        becomes one rule, each name on that port as a passthrough endpoint (no C(protocol); OpenShell neither reads
        it nor resolves a credential in it, so it is never bound to I(credential_provider)).
      - Refused as C(openshell-egress-untranslatable), naming the file and the port, are a port opened towards every
        name (C(true)), any UDP port, and, with I(github_repository), a port opened towards C(github.com) (an
        uninspected push to any repository).
      - A missing file opts in nothing and is not created. A symlink, a file that is not the seed's shape, or a
        relative path is refused naming it.
      - Unset, no opt-in.
    type: path
    version_added: 0.12.0
requirements:
  - openshell == 0.1.5 (Python package, on the host that runs the module; Python 3.11 or later). It carries
    OpenShell's policy schema. Without it the module fails naming the package and the pinned version.
  - publicsuffixlist (Python package), as for C(egress_allowlist).
seealso:
  - module: pi_dispatch.egress.egress_allowlist
  - module: pi_dispatch.egress.model_endpoints
'''

EXAMPLES = r'''
- name: Render the OpenShell policy of this deployment folder
  pi_dispatch.egress.egress_openshell_policy:
    deploy_dir: /opt/pi-dispatch/egress
    dest: /opt/pi-dispatch/egress/openshell-policy.yaml

- name: Show what would change (run with --check --diff)
  pi_dispatch.egress.egress_openshell_policy:
    deploy_dir: /opt/pi-dispatch/egress
    dest: /opt/pi-dispatch/egress/openshell-policy.yaml
  check_mode: true
  diff: true

- name: Refuse a sandbox whose policy reads back differently
  pi_dispatch.egress.egress_openshell_policy:
    deploy_dir: /opt/pi-dispatch/egress
    compare_with: /tmp/job-1234-policy.yaml

- name: Render a GitHub job's policy, bound to its provider, pushing to its own repository only
  pi_dispatch.egress.egress_openshell_policy:
    deploy_dir: /opt/pi-dispatch/egress
    dest: /var/lib/pi-dispatch/jobs/1234/openshell-policy.yaml
    credential_provider: job-1234-anthropic
    github_repository: pi-dispatch/egress

- name: Compare the policy a gateway holds for a job's sandbox
  pi_dispatch.egress.egress_openshell_policy:
    deploy_dir: /opt/pi-dispatch/egress
    gateway: 127.0.0.1:8080
    sandbox: job-1234
    workspace: pi-dispatch
'''

RETURN = r'''
policy:
  description: The rendered policy (authored form), as written to O(dest).
  returned: success
  type: dict
  sample:
    version: 1
    network_policies:
      allowlist_host_api_anthropic_com:
        name: allowlist api.anthropic.com
        endpoints:
          - {host: api.anthropic.com, port: 443, protocol: rest, enforcement: enforce, access: full}
        binaries:
          - {path: /**}
rules:
  description: Every rule, in policy order, with the source line or endpoint it came from and its endpoints.
  returned: success
  type: list
  elements: dict
  sample:
    - rule: allowlist_domain_github_com
      source: allowlist
      where: "/opt/pi-dispatch/egress/egress-allowlist.conf:2"
      entry: .github.com
      endpoints: ["github.com:443", "github.com:80", "**.github.com:443", "**.github.com:80"]
skipped:
  description: Every entry squid matches nothing for, left out of the policy (code, source, where, entry, reason).
  returned: success
  type: list
  elements: dict
limits:
  description: Where the policy admits less than squid for the same sources (what OpenShell reads or refuses).
  returned: success
  type: list
  elements: str
differences:
  description: With O(compare_with) or O(gateway), every endpoint that differs (endpoint, kind missing, added or
    changed, both sides).
  returned: always
  type: list
  elements: dict
not_compared:
  description: The top-level sections of the policy read back that the comparison leaves out (OpenShell's own).
  returned: always
  type: list
  elements: str
dest:
  description: The policy file (null when only rendered).
  returned: always
  type: str
format:
  description: The policy file's format.
  returned: always
  type: str
sources:
  description: The allowlist and the model endpoints declaration read, and whether each exists.
  returned: always
  type: dict
schema:
  description: The package that validated the policy, its pinned and its installed version.
  returned: always
  type: dict
  sample: {package: openshell, pinned: 0.1.5, installed: 0.1.5}
refused:
  description: On C(openshell-egress-untranslatable), every refused entry (where, entry, reason, fix).
  returned: failure
  type: list
  elements: dict
problems:
  description: On a refused allowlist or declaration, every problem (as C(egress_allowlist) and C(model_endpoints)).
  returned: failure
  type: list
  elements: dict
'''

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import apply as _apply
from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import schema as _schema
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment


def main():
    module = AnsibleModule(
        argument_spec=dict(
            deploy_dir=dict(type='path', default=_deployment.DEFAULT_DEPLOY_DIR),
            dest=dict(type='path'),
            format=dict(type='str', default='yaml', choices=list(_apply.FORMATS)),
            compare_with=dict(type='path'),
            gateway=dict(type='str'),
            sandbox=dict(type='str'),
            workspace=dict(type='str'),
            gateway_ca=dict(type='path'),
            gateway_cert=dict(type='path'),
            gateway_key=dict(type='path'),
            gateway_timeout=dict(type='float', default=30.0),
            private_destinations=dict(type='list', elements='str', default=[]),
            plain_http=dict(type='bool', default=True),
            binaries=dict(type='list', elements='str', default=['/**']),
            credential_provider=dict(type='str'),
            github_repository=dict(type='str'),
            project_policy=dict(type='path'),
        ),
        required_together=[('gateway', 'sandbox', 'workspace'), ('gateway_cert', 'gateway_key')],
        supports_check_mode=True,
    )
    if not _schema.available():
        module.fail_json(
            msg='%s Run: %s on the host that runs this module (Python 3.11 or later). No policy was rendered or '
                'compared, and nothing was written.' % (
                    missing_required_lib(_schema.REQUIREMENT, reason="to check the policy against OpenShell's own "
                                                                     'schema'), _schema.INSTALL),
            exception=_schema.IMPORT_ERROR)
    run = _apply.PolicyRun(module.params, _deployment.module_layout(module), check_mode=module.check_mode,
                           diff=module._diff)
    try:
        run.run()
    except _apply.PolicyFailed as exc:
        module.fail_json(msg=str(exc), **dict(run.result, **exc.extra))
    for warning in run.warnings:
        module.warn(warning)
    module.exit_json(**run.result)


if __name__ == '__main__':
    main()
