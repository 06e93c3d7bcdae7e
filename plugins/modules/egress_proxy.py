#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r'''
---
module: egress_proxy
short_description: Manage the pi-dispatch egress proxy container
version_added: 0.1.0
description:
  - Manages the squid container C(pi-dispatch-egress-proxy) on the upstream network
    C(pi-dispatch-egress-out), with the deployment folder's rules, allowlist and
    model-endpoints include bind-mounted read-only as single files, restart policy
    C(unless-stopped), C(host.docker.internal:host-gateway), a health check that
    asks squid itself (C(squidclient mgr:info) against port 3128) and no published port.
  - Runs it hardened - every capability dropped (squid runs as the unprivileged C(proxy) user
    and needs none, C(NET_RAW) included), a read-only root file system with small tmpfs mounts
    for C(/tmp) and C(/run/squid), C(no-new-privileges), packet forwarding off
    (C(net.ipv4.ip_forward=0), C(net.ipv6.conf.all.forwarding=0)), memory, pids and open-file
    limits, and a rotated C(json-file) log - and mounts the destination guard include
    C(egress-guard.conf) beside the model-endpoints include.
  - Compares every setting it applies (image, command, mounts, upstream network, restart policy,
    extra hosts, published ports, health check and its timing, labels, security options,
    capabilities, read-only root, tmpfs, sysctls, memory and pids limits, ulimits, log config) and
    recreates the container only when something differs, reporting each difference in
    RV(differences) and the diff. It also compares, by content, every mounted file inside the
    running proxy with the file on disk; a file saved by rename (C(sed -i), an editor) leaves the
    proxy reading the old inode, and is a difference too. Networks the old container was attached
    to (job networks and any other but the upstream) are reconnected to the new one.
  - A replace, restart, stop or removal that would cut jobs (job networks attached to a running or
    paused proxy) is refused with the count, unless O(allow_cut_jobs) is set, the same rule as the
    upgrade.
  - Before it starts or reloads squid it validates the allowlist; a refused allowlist changes nothing.
  - A container under the proxy's name that is not a pi-dispatch proxy (no label of
    this collection and no squid rules mount) is refused, never replaced.
author:
  - pi-dispatch egress team (@pi-dispatch)
attributes:
  check_mode:
    support: full
    description: Reports the actions it would take and changes nothing.
  diff_mode:
    support: full
    description: Shows the observed and the wanted shape when they differ.
options:
  state:
    description:
      - C(present) and C(started) make sure the container exists in the wanted shape and runs. When the
        running squid read another allowlist than the file mounted now (an operator's edit), they also run
        C(squid -k reconfigure), which re-reads it without cutting any job; the module keeps a copy of the
        allowlist squid read inside the container to tell.
      - C(stopped) stops it (creating it stopped when missing).
      - C(absent) removes it.
      - C(restarted) makes sure it exists and restarts it, so squid rereads its rules.
      - C(reloaded) runs C(squid -k reconfigure) in the running proxy (no restart, no job is cut).
    type: str
    default: started
    choices: [present, started, stopped, absent, restarted, reloaded]
  name:
    description: Container name.
    type: str
    default: pi-dispatch-egress-proxy
  image:
    description: The proxy image (built locally by the C(proxy) role).
    type: str
    default: pi-dispatch-egress-proxy:latest
  deploy_dir:
    description: The deployment folder whose files are mounted. Required unless I(state=absent).
    type: path
  network:
    description: The upstream network; created when missing.
    type: str
    default: pi-dispatch-egress-out
  network_internal:
    description:
      - Create the upstream network with C(--internal) (no route out). Tests use this so
        no packet can leave the machine. Has no effect on an existing network.
    type: bool
    default: false
  extra_hosts:
    description: More C(name:address) entries for the proxy's /etc/hosts, beside C(host.docker.internal:host-gateway).
    type: list
    elements: str
    default: []
  mount_endpoints:
    description:
      - Mount C(model-endpoints.conf) and C(egress-guard.conf). Only a rules file without the includes (the
        two-mount shape from before the model-endpoints include) may run without them.
    type: bool
    default: true
  health_interval:
    description: Seconds between health checks (also the start period).
    type: int
    default: 5
  wait:
    description: After a start, restart or create, wait until the health check passes.
    type: bool
    default: true
  wait_timeout:
    description: Seconds to wait for the proxy to become healthy.
    type: int
    default: 60
  allow_cut_jobs:
    description:
      - Consent to an action that cuts the jobs attached to the running proxy (their tunnels drop), that is
        a replace (any difference, including a stale mount), a restart, a stop or a removal. Without
        it such an action is refused and nothing changes.
    type: bool
    default: false
  memory:
    description: Memory limit of the container (no swap beyond it), a size such as C(512m) or C(1g); at least C(64m).
    type: str
    default: 512m
  pids_limit:
    description: Most processes and threads in the container (squid, its health checks and execs).
    type: int
    default: 256
  nofile:
    description: Open-file limit (soft and hard) of the container, which bounds squid's file descriptors.
    type: int
    default: 16384
  log_max_size:
    description: Size at which Docker rotates the proxy's json-file log (the access log), e.g. C(10m).
    type: str
    default: 10m
  log_max_file:
    description: How many rotated json-file logs Docker keeps.
    type: int
    default: 3
  shard_bound:
    description:
      - How many job networks the proxy and each of its shards carry before a job gets a new shard,
        for every dispatcher on the host that passes no bound of its own (C(job_network) without
        I(shard_bound), the job-network API's C(create_job_network) with C(shard_bound=None)).
      - Kept as the container's label C(io.pi-dispatch.egress.shard-bound), so changing it replaces
        the proxy (with I(allow_cut_jobs) while jobs are attached). Unset, nothing is labelled and
        dispatchers use the collection's default, 10. C(0) turns shards off.
      - Why a bound, and why 10, in docs/job-networks.md ("Choosing the bound").
    type: int
  decision_log:
    description:
      - Mount the decision log's folder (I(decision_log_dir)) read-write, so squid and the TLS name check
        write one JSON line per decision into it (docs/decisions.md), when the deployment's rules write
        one (rules version 3); a proxy on older rules keeps its shape until they are refreshed.
        C(false) leaves it out; the lines then go to the container's log.
    type: bool
    default: true
    version_added: 0.3.0
  decision_log_dir:
    description:
      - The host folder of the decision log, made C(0750) and given to the proxy user (uid 13) when
        missing or someone else's. A symlink, or a file at that path, is refused and nothing changes.
        Default C(<deploy_dir>/decisions).
    type: path
    version_added: 0.3.0
  decision_log_max_size:
    description: Size (C(k), C(m) or C(g); at least C(64k)) at which each container's decision log file is rotated.
    type: str
    default: 10m
    version_added: 0.3.0
  decision_log_keep:
    description: How many rotated decision log files each container keeps (0 to 100).
    type: int
    default: 5
    version_added: 0.3.0
  credentials_include:
    description:
      - The TLS name check's credential include the M(pi_dispatch.egress.egress_credentials) module rendered
        (its C(include) result). Given, the proxy mounts it and joins the interceptor's network before squid starts;
        omitted (nothing declared), the image's empty copy stands and nothing changes (docs/credentials.md).
    type: path
    version_added: 0.6.0
  credentials_network:
    description: The interceptor's network the proxy joins with I(credentials_include) (the module's I(network)).
    type: str
    default: pi-dispatch-egress-credentials
    version_added: 0.6.0
  units:
    description:
      - >-
        Run the proxy as systemd units on the Podman venue (the system's, or with O(units_scope=user) a service
        account's) - C(quadlet) (Podman 4.4 and later) or C(systemd) (Podman 4.3, the C(podman generate
        systemd --new) form), rendered as
        C(egress_podman_units) renders them. The unit C(<name>.service) then owns the container, and brings it
        back after a crash and at boot.
      - >-
        One step, in this order - the decision and the consent rule first (a refused step writes nothing), then
        the units written when they differ and C(systemctl daemon-reload) (C(systemctl enable) for C(systemd)),
        then every step that makes, replaces, starts, stops or removes the container as C(systemctl restart) or
        C(systemctl stop) of the unit; job networks the old container had are reconnected to the new one. A
        reload of squid and an unpause act on the running container as without units. With O(state=absent) the
        unit is stopped, then its files removed.
      - >-
        The wanted shape is the units' - restart policy C(no) (systemd restarts it), the image as
        C(localhost/<image>), the decision log mounted and rotated as without units (since 0.17.0; before, the
        units carried none and the log was off). A container the unit started that still differs from it
        is an error naming the unit, never replaced again.
      - >-
        Refused on the Docker Engine, and with O(credentials_include) or O(shard_bound), which the units do not
        carry.
    type: str
    choices: [quadlet, systemd]
    version_added: 0.14.0
  units_scope:
    description:
      - >-
        Whose systemd runs the units - C(system) (the system manager and the system's unit folder; the engine
        must be rootful Podman) or C(user) (the user manager of O(units_account), C(systemctl --user -M
        <account>@), and the account's own folder under its home; the engine must be that account's rootless
        Podman, which the role M(pi_dispatch.egress.egress_podman_account) makes reachable).
      - >-
        Either mismatch is refused before anything changes - units of one manager would start a container in
        another Podman than the one this module checks. With C(user) the proxy comes back after the user
        manager restarts and at boot only when the account lingers (the service-account role enables linger
        where logind runs).
      - >-
        On a cgroup v1 host the account's units run the container with C(--cgroups=no-conmon) instead of
        Quadlet's C(--cgroups=split), which a user manager cannot hold there (systemd delegates no v1
        controller to it); that host needs O(limits_unenforced_ok) anyway.
    type: str
    choices: [system, user]
    default: system
    version_added: 0.19.0
  units_account:
    description: With O(units_scope=user), the service account whose rootless Podman and user manager run the proxy.
    type: str
    version_added: 0.19.0
  units_dir:
    description: With O(units), write them here instead of the format's folder of O(units_scope).
    type: path
    version_added: 0.14.0
  limits_unenforced_ok:
    description:
      - >-
        Consent to run the proxy on an engine that cannot apply its memory and pids limits - rootless Podman or
        rootless Docker on a cgroup v1 host (RHEL 8, Debian 10, Ubuntu 20.04 and hosts booted that way). Without
        it such an engine is refused before anything changes, naming the fix (cgroup v2, or the rootful engine).
      - >-
        With it the proxy is deployed exactly as elsewhere (created with the limits, which the engine ignores), the
        limits are not compared with what the engine reports, RV(limits) says C(enforced=false) with the reason,
        and the run warns. The doctor keeps saying so on every run (C(proxy.limits_unenforced)).
    type: bool
    default: false
    version_added: 0.17.0
extends_documentation_fragment:
  - pi_dispatch.egress.docker
requirements:
  - Docker Engine API >= 1.41
seealso:
  - module: pi_dispatch.egress.egress_deployment
'''

EXAMPLES = r'''
- name: Run the proxy on the deployment folder's files
  pi_dispatch.egress.egress_proxy:
    deploy_dir: /opt/pi-dispatch/egress

- name: Make squid reread the allowlist without cutting any job
  pi_dispatch.egress.egress_proxy:
    deploy_dir: /opt/pi-dispatch/egress
    state: reloaded

- name: Remove the proxy
  pi_dispatch.egress.egress_proxy:
    state: absent
'''

RETURN = r'''
limits:
  description:
    - Whether the engine enforces the proxy's memory and pids limits, the host's cgroup version and the engine.
    - C(why) when they are not enforced (only deployed with O(limits_unenforced_ok)).
    - C(ulimits_enforced) is false on an engine that drops the ulimits (nofile, nproc) of a container created
      through its Docker API (rootless Podman); the proxy then runs with the Podman service's own, and the
      ulimits are not compared with what the engine reports (since 0.18.0).
  returned: when the engine was asked
  type: dict
  sample: {enforced: false, cgroup_version: '1', engine: Podman 4.3.1 (rootless), why: Podman 4.3.1 (rootless) runs ...,
           ulimits_enforced: false}
  version_added: 0.17.0
actions:
  description: The actions taken (or, in check mode, that would be taken), in order.
  returned: always
  type: list
  elements: str
  sample: [create network pi-dispatch-egress-out, create, start, reconnect]
refused:
  description: True when the actions were refused because they would cut jobs without O(allow_cut_jobs).
  returned: when refused
  type: bool
differences:
  description: What differed between the running and the wanted container.
  returned: always
  type: list
  elements: str
stale_mounts:
  description: Mounted files that were replaced on disk (saved by rename), which the running proxy still read
    the old copy of; they make the proxy be recreated.
  returned: always
  type: list
  elements: str
jobs_cut:
  description:
    - How many attached jobs the actions cut (or would cut, when refused or in check mode), the proxy's and its
      shards' together.
  returned: always
  type: int
units:
  description:
    - >-
      With I(units), the unit files - C(units_dir), C(units) (the two files), C(written) and C(removed) (the files
      this run wrote or removed, or would in check mode).
  returned: when units is set
  type: dict
  version_added: 0.14.0
shards:
  description:
    - What each proxy shard (C(<name>-shard-<n>), a clone of the proxy carrying job networks beyond the shard bound)
      does to follow the proxy, C(name), C(action) (remove, replace, restart, stop or start) and C(jobs) (or, once
      done, C(jobs_cut) and C(error)). Empty without shards. A shard with jobs is cut only with I(allow_cut_jobs),
      counted shard by shard.
  returned: always
  type: list
  elements: dict
allowlist_changed:
  description: The mounted allowlist differed from the one the running squid read, so it was (or, in check
    mode, would be) reconfigured.
  returned: always
  type: bool
messages:
  description: Notes such as job networks reconnected after a recreate.
  returned: always
  type: list
  elements: str
container:
  description: Facts of the proxy container after the run (empty when absent).
  returned: always
  type: dict
  contains:
    id:
      description: Container id.
      type: str
      returned: when present
    status:
      description: Docker state (running, paused, exited, ...).
      type: str
      returned: when present
    health:
      description: Health status.
      type: str
      returned: when present
    networks:
      description: Networks it is attached to.
      type: list
      returned: when present
    job_networks:
      description: The job networks among them.
      type: list
      returned: when present
    mounts:
      description: Its mounts.
      type: list
      returned: when present
    published_ports:
      description: Published ports (always empty for a proxy this module made).
      type: list
      returned: when present
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import venue as _venue
from ansible_collections.pi_dispatch.egress.plugins.module_utils._podman import quadlet as _quadlet
from ansible_collections.pi_dispatch.egress.plugins.module_utils._podman import units_apply as _units
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import deploy as _deploy
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import lifecycle as _proxy
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import reload as _reload
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import spec as _proxy_spec


def unit_spec(p, deploy_paths):
    """The shape of a proxy that the units (``p['units']``) run: the units' own (_podman/units_apply.py)."""
    carried = [key for key in ('credentials_include', 'shard_bound') if p[key] is not None]
    if carried:
        raise _proxy_spec.ProxyError('units %s: the units do not carry %s; leave units unset to run this proxy '
                                     'without systemd' % (p['units'], ' or '.join(carried)))
    return _units.wanted_spec(p, deploy_paths)


def systemctl(module):
    """``run(verb, unit=None)``: ``systemctl [--user -M <account>@] <verb> [unit]``, ProxyError naming the unit
    and where to look."""
    binary = module.get_bin_path('systemctl', required=True)
    manager = _units.manager_args(module.params['units_scope'], module.params['units_account'])
    shown = ' '.join(['systemctl'] + manager)

    def run(verb, unit=None):
        rc, out, err = module.run_command([binary] + manager + [verb] + ([unit] if unit else []))
        if rc != 0:
            where = (' See %s status %s and %s -u %s.' % (shown, unit, ' '.join(['journalctl'] + manager), unit)
                     if unit else '')
            raise _proxy_spec.ProxyError('%s %s%s failed (exit %d): %s.%s'
                                         % (shown, verb, ' ' + unit if unit else '', rc, (err or out).strip(), where))
    return run


def units_writer(module, deploy_paths, found):
    """What ``ProxyDeploy`` needs to drive the units: the unit's name, systemctl, and the units' writer."""
    p = module.params
    options = dict(p, format=p['units'], scope=p['units_scope'], account=p['units_account'],
                   cgroups=_quadlet.unit_cgroups(p['units_scope'], found.cgroup_version))

    def write(state, check_mode):
        try:
            return _units.apply(dict(options, state=state), deploy_paths, check_mode=check_mode)
        except _units.UnitsError as exc:
            raise _proxy_spec.ProxyError('%s. No unit was written' % exc) from None
    return _deploy.Units(name='%s.service' % p['name'], fmt=p['units'], write=write, systemctl=systemctl(module),
                         manager=' '.join(_units.manager_args(p['units_scope'], p['units_account'])))


def main():
    argument_spec = dict(
        state=dict(type='str', default='started', choices=list(_proxy.STATES)),
        name=dict(type='str', default=_proxy_spec.PROXY_NAME),
        image=dict(type='str', default='pi-dispatch-egress-proxy:latest'),
        deploy_dir=dict(type='path'),
        network=dict(type='str', default=_proxy_spec.UPSTREAM_NETWORK),
        network_internal=dict(type='bool', default=False),
        extra_hosts=dict(type='list', elements='str', default=[]),
        mount_endpoints=dict(type='bool', default=True),
        health_interval=dict(type='int', default=5),
        wait=dict(type='bool', default=True),
        wait_timeout=dict(type='int', default=60),
        allow_cut_jobs=dict(type='bool', default=False),
        memory=dict(type='str', default=_proxy_spec.DEFAULT_LIMITS['memory']),
        pids_limit=dict(type='int', default=_proxy_spec.DEFAULT_LIMITS['pids']),
        nofile=dict(type='int', default=_proxy_spec.DEFAULT_LIMITS['nofile']),
        log_max_size=dict(type='str', default=_proxy_spec.DEFAULT_LIMITS['log_max_size']),
        log_max_file=dict(type='int', default=_proxy_spec.DEFAULT_LIMITS['log_max_file']),
        shard_bound=dict(type='int'),
        decision_log=dict(type='bool', default=True),
        decision_log_dir=dict(type='path'),
        decision_log_max_size=dict(type='str', default=_proxy_spec.DECISION_LOG_DEFAULTS['max_size']),
        decision_log_keep=dict(type='int', default=_proxy_spec.DECISION_LOG_DEFAULTS['keep']),
        credentials_include=dict(type='path'),
        credentials_network=dict(type='str', default=_proxy_spec.CREDENTIALS_NETWORK),
        units=dict(type='str', choices=['quadlet', 'systemd']),
        units_scope=dict(type='str', default='system', choices=['system', 'user']),
        units_account=dict(type='str'),
        units_dir=dict(type='path'),
        limits_unenforced_ok=dict(type='bool', default=False),
    )
    module = AnsibleModule(argument_spec=dc.argument_spec(argument_spec), supports_check_mode=True,
                           required_if=[('state', s, ['deploy_dir']) for s in _proxy.STATES if s != 'absent']
                           + [('units_scope', 'user', ['units_account'])])
    p = module.params
    try:
        _deploy.check_options(p)
    except _proxy_spec.ProxyError as exc:
        module.fail_json(msg=str(exc))
    deploy_paths = _deployment.module_layout(module).paths if p['deploy_dir'] else None
    try:
        spec = unit_spec(p, deploy_paths) if p['units'] else _deploy.wanted_spec(p, deploy_paths)
    except (_proxy_spec.ProxyError, _units.UnitsError) as exc:
        module.fail_json(msg='%s. Nothing was changed.' % exc)

    client = dc.module_client(module)
    try:
        found = _venue.venue(client)
        spec = _proxy_spec.for_venue(spec, found)
        if p['units'] and not found.is_podman:
            raise _proxy_spec.ProxyError('units %s: systemd units run the proxy only on the Podman venue, and %s '
                                         'is not Podman; leave units unset on the Docker Engine'
                                         % (p['units'], found.describe()))
        refused = _units.venue_refusal(p['units_scope'], p['units_account'], found) if p['units'] else None
        if refused:
            raise _proxy_spec.ProxyError(refused)
        refusal, limits = found.limits_decision(p['limits_unenforced_ok'])
        if refusal and p['state'] != 'absent':
            module.fail_json(msg='%s. Nothing was changed.' % refusal, limits=limits)
        if not limits['enforced']:
            spec = dict(spec, limits_unenforced=True)
        if not limits['ulimits_enforced']:
            spec = dict(spec, ulimits_unapplied=True)
    except dc.EngineError as exc:
        module.fail_json(msg='%s Nothing was changed.' % exc)
    except _proxy_spec.ProxyError as exc:
        module.fail_json(msg='%s. Nothing was changed.' % exc)
    run = _deploy.ProxyDeploy(client, p, spec, deploy_paths, check_mode=module.check_mode, diff=module._diff,
                              units=units_writer(module, deploy_paths, found) if p['units'] else None)
    try:
        run.run()
    except _reload.SourcesRefused as exc:
        module.fail_json(msg=str(exc), problems=exc.problems, **run.result)
    except (_proxy_spec.ProxyError, dc.EngineError) as exc:
        module.fail_json(msg=str(exc), **run.result)
    run.result['limits'] = limits
    if not limits['enforced'] and p['state'] != 'absent':
        module.warn('the proxy runs without enforced memory and pids limits (consented with '
                    'limits_unenforced_ok): %s' % limits['why'])
    if not limits['ulimits_enforced'] and p['state'] != 'absent':
        module.warn('%s drops the ulimits of a container created through its Docker API: the proxy runs with the '
                    'Podman service\'s own open-files and processes limits, not nofile %d and nproc %d '
                    '(docs/podman.md)' % (limits['engine'], p['nofile'], _proxy_spec.PODMAN_NPROC))
    for warning in run.warnings:
        module.warn(warning)
    module.exit_json(**run.result)


if __name__ == '__main__':
    main()
