#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r'''
---
module: egress_canary
short_description: Prove the egress policy with throwaway probes, sweep a killed doctor's leftovers, report
version_added: 0.1.0
description:
  - The doctor's engine. Checks the proxy (running, health, rules against the collection's copy), sweeps
    what a killed earlier doctor run left behind, then runs the canary - an C(--internal) network
    C(pi-dispatch-egress-doctor-<pid>) with the proxy attached and three probe containers
    C(pi-dispatch-egress-probe-<probe>-<pid>) run concurrently from I(probe_image) - and removes its
    own objects at the end of the run, reporting anything it could not remove.
  - Probes, each bounded by I(probe_timeout) seconds of curl plus I(probe_start_grace) seconds for the
    container; the provider is reached (any HTTP answer through a tunnel, e.g. a 401, passes), an
    unlisted host is denied (the proxy's 403 to the CONNECT), and a plain HTTP request to a listed
    host on port 443 is refused by squid itself (403 with C(X-Squid-Error) starting C(ERR_ACCESS_DENIED)).
    A probe that did not run is reported as not run, never as a pass.
  - The sweep removes networks named C(pi-dispatch-egress-doctor-<pid>) (and their probes) whose pid is
    no longer alive on this host, and only when the daemon is on this host (a unix socket). A probe that
    cannot be removed keeps its network. See docs/doctor.md for every line.
  - Per declared model endpoint (C(model-endpoints.json) in I(deploy_dir)), three more probes on the canary's
    network, named C(pi-dispatch-egress-probe-endpoint-<probe>-<id>-<pid>) - C(GET /v1/models) through a
    CONNECT tunnel, a tunnel to the nearest undeclared port above (never 80 or 443) that must get the
    proxy's 403, and a plain forward request that must get squid's own 403 - each bounded by
    I(endpoint_timeout) seconds.
  - The overlay C(models.json) (I(models_json)) is checked against the declared endpoints, and the allowlist
    for entries that open the host (files only).
  - Job-to-job isolation (I(isolation)) - two real job networks C(pi-job-doctor-<pid>-<a|b>-net) from the job
    pool, each with the proxy and a peer C(pi-dispatch-egress-probe-peer-<a|b>-<pid>) at a fixed address; each
    peer must reach the proxy and neither the other peer (by name or address) nor the proxy's address on the
    other network. The sweep also covers these networks under a dead pid.
author:
  - pi-dispatch egress team (@pi-dispatch)
attributes:
  check_mode:
    support: partial
    description:
      - Not side-effect free, so declared partial. In check mode the canary still creates its own
        throwaway networks (C(pi-dispatch-egress-doctor-<pid>) and the isolation peers' job networks),
        attaches the proxy to them, runs its probe containers and an image's C(apt-get update) probe,
        sends the probes' requests through the proxy (each adds an access-log line), and removes all
        of it before it returns; the report is what check mode asks for. It never changes the
        deployment folder, the rules or the proxy's settings.
      - The sweep of an EARLIER run's leftovers is only reported (C(would be removed)), never done.
    details:
      - In check mode the probes still run (throwaway networks and containers are created and removed);
        only the sweep of an earlier run's leftovers is skipped and reported.
  diff_mode:
    support: none
    description: Nothing persistent is changed, so there is nothing to diff.
options:
  proxy_name:
    description: The proxy container.
    type: str
    default: pi-dispatch-egress-proxy
  deploy_dir:
    description: The deployment folder whose C(deploy/egress-proxy.conf) is compared with the collection's copy.
    type: path
    default: /opt/pi-dispatch/egress
  probe_image:
    description:
      - Image the probe containers run, built like a job image (not the proxy image). It needs C(sh) and C(curl).
    type: str
    required: true
  fallback_probe_image:
    description:
      - The image the probes run when I(probe_image) is not on the daemon (the doctor role builds the
        collection's own probe image for this, Debian with sh and curl). The report then carries the
        line C(canary.probe_image), which says that the probes prove the proxy, not the job image's
        own client stack. Unset, a missing I(probe_image) means no probe runs, as before.
    type: str
    version_added: 0.2.0
  decision_log_dir:
    description:
      - The decision log folder the proxy writes (C(egress_decision_log_dir)); the doctor summarizes the
        last hour's refusals from it in a C(decisions.*) line, leaving its own probes out. Default
        C(<deploy_dir>/decisions).
    type: path
    version_added: 0.3.0
  provider_host:
    description:
      - The provider the canary must reach (unauthenticated, so nothing is spent). A real public host by default;
        tests set a C(.test) name served by a fake upstream.
    type: str
    default: api.anthropic.com
  deny_host:
    description: An unlisted host that resolves and answers, so a proxy that lets everything out is caught.
    type: str
    default: example.com
  listed_host:
    description: A listed host for the plain-HTTP-on-443 probe; default I(provider_host).
    type: str
  probe_timeout:
    description: Seconds curl may take in each probe (connect and total).
    type: int
    default: 10
  probe_start_grace:
    description: Extra seconds a probe container may take to start and exit.
    type: int
    default: 20
  endpoint_timeout:
    description: Seconds curl may take in each model endpoint probe (no answer in that time means the server
      took the connection and is stuck or busy).
    type: int
    default: 15
  models_json:
    description:
      - The overlay C(models.json) to check against the declared endpoints (comments, a byte order mark and
        trailing commas allowed). Unset, those checks are reported as not run; the allowlist check still runs.
    type: path
  isolation:
    description: Run the job-to-job isolation check on two throwaway job networks.
    type: bool
    default: true
  job_network_pool:
    description: The job networks' address pool, as given to M(pi_dispatch.egress.job_network) (the isolation
      check's two networks come from it).
    type: str
    default: 10.47.0.0/16
  job_network_prefix:
    description: The prefix length of each job network's subnet in I(job_network_pool).
    type: int
    default: 29
  firewall:
    description:
      - Check the host firewall layer (M(pi_dispatch.egress.egress_firewall)) - its chains and jumps are present and
        current - and probe a throwaway job network's gateway through a listener the doctor opens there. Needs root
        for iptables-save (reported as not run otherwise) and a daemon on this host.
    type: bool
    default: true
  firewall_chain_prefix:
    description: The layer's chain prefix, as given to M(pi_dispatch.egress.egress_firewall).
    type: str
    default: PI-EGRESS
  firewall_probe:
    description: Run the gateway probe (a job network C(pi-job-doctor-<pid>-fw-net) from I(job_network_pool) and a
      probe C(pi-dispatch-egress-probe-firewall-<pid>)).
    type: bool
    default: true
  gateway_name:
    description:
      - The gateway of transparent job networks (docs/transparent.md). When set, the doctor checks it (running, its
        networks, opt-ins set to C(true)) and runs the transparent canary on a job network
        C(pi-job-doctor-<pid>-t-net) with a probe that has no proxy variable. Unset, none of it runs.
    type: str
    version_added: 0.5.0
  transparent_port:
    description:
      - C(host:port) the transparent canary opts in (for its own network only) and must reach, e.g. C(github.com:22).
        Unset, the canary proves only that the ports not opted in are dropped.
    type: str
    version_added: 0.5.0
  credentials_interceptor_name:
    description:
      - The credential interceptor's container (docs/credentials.md). Its lines, and the credential canary,
        run only when I(deploy_dir)'s C(egress-credentials.json) declares a credential. The canary makes a job
        network C(pi-job-doctor-<pid>-c-net) with the job-network API, sends each credential's placeholder to
        its bound host, then one placeholder where it does not belong, and searches everything the canary saw
        for the real secrets on this host (no secret is ever printed).
    type: str
    default: pi-dispatch-egress-interceptor
    version_added: 0.6.0
  credentials_probe_paths:
    description:
      - Credential name -> the URL path its canary probe asks the bound host (default C(/v1/models)). Give a
        path that answers 200 with a good key and 401 without one (for example C(/user) on a forge API), so the
        C(credentials.swap) line proves the provider took the secret.
    type: dict
    default: {}
    version_added: 0.6.0
  openshell_policy:
    description:
      - A deployed OpenShell sandbox policy file (as M(pi_dispatch.egress.egress_openshell_policy) writes it with
        its C(dest)). When set, the doctor renders the policy from I(deploy_dir)'s current sources exactly as that
        module does (its defaults) and compares the file with it semantically, naming each endpoint that differs
        (the C(openshell.*) lines, docs/openshell.md). Unset, none of it runs.
      - Needs the C(openshell) Python package (pinned 0.1.5) on the host that runs the doctor; without it the line
        is a warning naming the pinned version.
    type: path
    version_added: 0.8.0
  openshell_gateway:
    description:
      - An OpenShell gateway (C(host:port)) whose sandbox I(openshell_sandbox) in I(openshell_workspace) runs the
        openshell venue's jobs. When set, the doctor fetches that sandbox's effective policy (C(GetSandboxConfig),
        through the C(openshell) package's own gRPC stub) and compares it with what I(deploy_dir)'s current
        sources render, as for I(openshell_policy) (the C(openshell.gateway_*) lines, docs/openshell.md).
      - TLS when any of I(openshell_gateway_ca), I(openshell_gateway_cert), I(openshell_gateway_key) is given,
        plaintext otherwise.
    type: str
    version_added: 0.10.0
  openshell_credential_provider:
    description:
      - The provider the openshell venue's job policy binds every endpoint to (as
        M(pi_dispatch.egress.egress_openshell_policy)'s I(credential_provider)). Both comparisons, I(openshell_policy)
        and I(openshell_gateway), render with it, so a policy that lost the binding, or is bound to another
        provider, is a failure naming each endpoint.
      - Unset, the rendered policy binds nothing.
    type: str
    version_added: 0.12.0
  openshell_github_repository:
    description:
      - The GitHub job's own repository (C(owner/name)) whose policy is compared, as
        M(pi_dispatch.egress.egress_openshell_policy)'s I(github_repository). Both comparisons render C(github.com)
        with a push to that repository only, so a policy that admits a push elsewhere is a failure naming the
        endpoint.
      - Unset, C(github.com) is rendered as listed.
    type: str
    version_added: 0.12.0
  openshell_project_policy:
    description:
      - The project policy (C(.pi-container/config.yaml)) of the job whose policy is compared, as
        M(pi_dispatch.egress.egress_openshell_policy)'s I(project_policy). Both comparisons render its opt-ins, so a
        policy that lost an opted-in port, or opens one the project does not, is a failure naming the endpoint.
      - Unset, no opt-in is rendered.
    type: path
    version_added: 0.12.0
  openshell_sandbox:
    description: The sandbox's name on I(openshell_gateway).
    type: str
    version_added: 0.10.0
  openshell_workspace:
    description: The sandbox's workspace on I(openshell_gateway).
    type: str
    version_added: 0.10.0
  openshell_gateway_ca:
    description: The CA that signed the gateway's certificate (PEM).
    type: path
    version_added: 0.10.0
  openshell_gateway_cert:
    description: The client certificate for mTLS (PEM); with I(openshell_gateway_key).
    type: path
    version_added: 0.10.0
  openshell_gateway_key:
    description: The client certificate's key (PEM); with I(openshell_gateway_cert).
    type: path
    version_added: 0.10.0
  openshell_gateway_timeout:
    description: Seconds the fetch may take.
    type: float
    default: 30.0
    version_added: 0.10.0
  forge_urls:
    description:
      - Name -> URL of each forge a job pushes to and fetches from, for example C(GITLAB_URL) ->
        C(https://gitlab.example.com). Each gets a line in the C(forge) group, a warning unless it is
        C(https://) on port 443 with its host in the allowlist, naming why (git ignores C(HTTP_PROXY) for an
        C(http://) remote; the proxy refuses a C(CONNECT) to any port but 443).
      - Empty (the default), the doctor reads C(GITLAB_URL) and C(FORGEJO_URL) from the environment it runs in; no
        line when neither is set. A user or password in a URL is never shown.
    type: dict
    default: {}
    version_added: 0.11.0
  mcp_json:
    description:
      - The overlay's C(mcp.json) (the MCP servers jobs connect), read as pi reads it. Each enabled server is judged
        as the preflight judges a job's (a failing line for one a job naming it would be refused for, a warning for a
        package runner whose registry is not listed).
      - A declared model endpoint that only an enabled MCP server uses, and no model in I(models_json), is probed as
        an "MCP server endpoint", whose tunnel line passes on any answer through the tunnel (such a server does not
        serve C(/v1/models); an https:// one closing the plain request passes too).
    type: path
    version_added: 0.11.0
  enabled:
    description:
      - Whether the egress layer is on. C(false) is the seed's C(PI_EGRESS=0) posture, jobs on the default network
        with the whole network in front of them.
      - With C(false) no engine is contacted (the daemon options are not used) and the report is one warning,
        C(egress.off); with I(openshell_policy) or I(openshell_gateway) set it is one failure instead,
        C(egress.off_openshell), because that venue's policy is its egress control.
    type: bool
    default: true
    version_added: 0.11.0
  squid_mirror:
    description:
      - Ask the Debian mirror for squid's candidate version (C(apt-get update) in a throwaway container of the
        proxy's image on its upstream network, bounded at 60 seconds plus I(probe_start_grace)), so the doctor
        can say whether the squid inside the proxy is out of date.
      - Switch it off where the proxy's upstream cannot reach a mirror (an air-gapped host, a test world on an
        C(--internal) upstream), where the check only waits for apt's timeouts and ends C(notrun) anyway.
        Off, the C(proxy.squid_mirror_unread) line says it was switched off; the installed version is still read.
    type: bool
    default: true
    version_added: 0.9.0
  sweep:
    description:
      - Sweep leftovers of earlier doctor runs before the canary.
      - Only on a daemon that is a unix socket on this host (the default, or a C(unix://) I(docker_host));
        on any other daemon a leftover is reported, never swept, because its pid may be alive there.
    type: bool
    default: true
extends_documentation_fragment:
  - pi_dispatch.egress.docker
seealso:
  - module: pi_dispatch.egress.egress_proxy
'''

EXAMPLES = r'''
- name: Run the doctor's checks (tests use .test names served by a fake upstream)
  pi_dispatch.egress.egress_canary:
    probe_image: pi-dispatch-job:latest
  register: doctor

- name: Show the report
  ansible.builtin.debug:
    msg: "{{ doctor.report.splitlines() }}"
'''

RETURN = r'''
lines:
  description: Every check, in report order.
  returned: always
  type: list
  elements: dict
  contains:
    id:
      description: The line's id (docs/doctor.md has one row per id).
      type: str
    status:
      description: ok, warn, fail or notrun.
      type: str
    message:
      description: The sentence.
      type: str
    fix:
      description: The command that fixes it (every warn and fail has one where doctor knows it).
      type: str
report:
  description: The human report (grouped, with symbols and a summary count), ending with the run's wall time.
  returned: always
  type: str
json_lines:
  description: The same results, one JSON object per line (id, status, message, fix).
  returned: always
  type: str
summary:
  description: Count per status.
  returned: always
  type: dict
  sample: {ok: 9, warn: 0, fail: 0, notrun: 1}
actions:
  description: What the sweep removed or detached (or nothing in check mode).
  returned: always
  type: list
  elements: str
timings:
  description: Seconds per probe container, per group of checks (C(check.<name>)), and in total (C(total)).
  returned: always
  type: dict
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import doctor as _doctor
from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as _jobnet
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy.spec import PROXY_NAME


def main():
    argument_spec = dict(
        enabled=dict(type='bool', default=True),
        forge_urls=dict(type='dict', default={}),
        mcp_json=dict(type='path'),
        proxy_name=dict(type='str', default=PROXY_NAME),
        deploy_dir=dict(type='path', default=_deployment.DEFAULT_DEPLOY_DIR),
        probe_image=dict(type='str', required=True),
        fallback_probe_image=dict(type='str'),
        decision_log_dir=dict(type='path'),
        provider_host=dict(type='str', default=_doctor.DEFAULT_PROVIDER_HOST),
        deny_host=dict(type='str', default=_doctor.DEFAULT_DENY_HOST),
        listed_host=dict(type='str'),
        probe_timeout=dict(type='int', default=_doctor.DEFAULT_PROBE_TIMEOUT),
        probe_start_grace=dict(type='int', default=_doctor.DEFAULT_PROBE_START_GRACE),
        endpoint_timeout=dict(type='int', default=_doctor.DEFAULT_ENDPOINT_TIMEOUT),
        models_json=dict(type='path'),
        isolation=dict(type='bool', default=True),
        job_network_pool=dict(type='str', default=_jobnet.DEFAULT_POOL),
        job_network_prefix=dict(type='int', default=_jobnet.DEFAULT_PREFIX),
        squid_mirror=dict(type='bool', default=True),
        sweep=dict(type='bool', default=True),
        firewall=dict(type='bool', default=True),
        firewall_chain_prefix=dict(type='str', default='PI-EGRESS'),
        firewall_probe=dict(type='bool', default=True),
        gateway_name=dict(type='str'),
        transparent_port=dict(type='str'),
        credentials_interceptor_name=dict(type='str', default='pi-dispatch-egress-interceptor'),
        credentials_probe_paths=dict(type='dict', default={}),
        openshell_policy=dict(type='path'),
        openshell_gateway=dict(type='str'),
        openshell_sandbox=dict(type='str'),
        openshell_workspace=dict(type='str'),
        openshell_gateway_ca=dict(type='path'),
        openshell_gateway_cert=dict(type='path'),
        openshell_gateway_key=dict(type='path'),
        openshell_gateway_timeout=dict(type='float', default=30.0),
        openshell_credential_provider=dict(type='str'),
        openshell_github_repository=dict(type='str'),
        openshell_project_policy=dict(type='path'),
    )
    module = AnsibleModule(argument_spec=dc.argument_spec(argument_spec), supports_check_mode=True,
                           required_together=[('openshell_gateway', 'openshell_sandbox', 'openshell_workspace'),
                                              ('openshell_gateway_cert', 'openshell_gateway_key')])
    if not module.params['enabled']:
        module.exit_json(**_doctor.off_result(module.params))  # no engine is asked (docs/doctor.md, Egress off)
    deploy_dir = _deployment.module_layout(module).deploy_dir
    try:
        _doctor.check_canary_options(module.params)
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    client = dc.module_client(module)
    doctor = _doctor.Doctor(client, _doctor.canary_options(module.params, deploy_dir, check_mode=module.check_mode))
    try:
        lines = doctor.run()
    except dc.EngineError as exc:
        dc.fail(module, exc, dict(actions=doctor.actions))
    module.exit_json(**_doctor.canary_result(doctor, lines, check_mode=module.check_mode))


if __name__ == '__main__':
    main()
