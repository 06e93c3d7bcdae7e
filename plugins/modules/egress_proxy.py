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

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import decisions as _decisions
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import lifecycle as _proxy
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import spec as _proxy_spec
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import reload as _reload
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import rules as _rules
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import shards as _shards


def _rules_write_decision_log(path):
    try:
        with open(path) as handle:
            return _rules.writes_decision_log(handle.read())
    except (IOError, OSError, UnicodeDecodeError):
        return False   # a missing rules file is refused below with its fix


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
    )
    module = AnsibleModule(argument_spec=dc.argument_spec(argument_spec), supports_check_mode=True,
                           required_if=[('state', s, ['deploy_dir']) for s in _proxy.STATES if s != 'absent'])
    p = module.params
    for entry in p['extra_hosts']:
        if ':' not in entry or entry.startswith(':') or entry.endswith(':'):
            module.fail_json(msg='extra_hosts entry %r is not name:address' % entry)
    if p['health_interval'] < 1 or p['wait_timeout'] < 1:
        module.fail_json(msg='health_interval and wait_timeout must be at least 1 second')

    deploy_paths = _deployment.module_layout(module).paths if p['deploy_dir'] else None
    limits = dict(memory=p['memory'], pids=p['pids_limit'], nofile=p['nofile'], log_max_size=p['log_max_size'],
                  log_max_file=p['log_max_file'])
    decision_log = None
    # mounted for rules that write it (version 3); a proxy still on older rules keeps its shape
    if p['decision_log'] and deploy_paths and _rules_write_decision_log(deploy_paths['rules']):
        decision_log = dict(dir=p['decision_log_dir'] or os.path.join(p['deploy_dir'], _decisions.DEFAULT_FOLDER),
                            max_size=p['decision_log_max_size'], keep=p['decision_log_keep'])
    try:
        spec = _proxy_spec.desired_spec(
            p['image'],
            deploy_paths['rules'] if deploy_paths else '', deploy_paths['allowlist'] if deploy_paths else '',
            deploy_paths['endpoints_conf'] if deploy_paths else '',
            network=p['network'], name=p['name'], extra_hosts=p['extra_hosts'],
            health_interval=p['health_interval'], mount_endpoints=p['mount_endpoints'],
            guard=deploy_paths['guard_conf'] if deploy_paths and p['mount_endpoints'] else None, limits=limits,
            shard_bound=p['shard_bound'], decision_log=decision_log)
    except _proxy_spec.ProxyError as exc:
        module.fail_json(msg='%s. Nothing was changed.' % exc)

    client = dc.module_client(module)

    manager = _proxy.ProxyManager(client, spec, check_mode=module.check_mode)
    result = dict(changed=False, actions=manager.actions, differences=[], messages=manager.messages, container={},
                  allowlist_changed=False, stale_mounts=[], jobs_cut=0)
    try:
        container = manager.container()
        obs = _proxy_spec.observed(container.attrs) if container else None
        if obs and not _proxy_spec.is_ours(obs):
            module.fail_json(msg='A container named %s exists but is not a pi-dispatch egress proxy (no %s label '
                                 'and no squid rules mount). Rename or remove it (docker rename / docker rm), '
                                 'or choose another name.' % (p['name'], _proxy_spec.LABEL_ROLE), **result)
        image_id = None
        if p['state'] != 'absent':
            for src, _dst in spec['mounts']:
                path = [v for v in deploy_paths.values() if os.path.realpath(v) == src]
                path = path[0] if path else src
                if os.path.islink(path):
                    module.fail_json(msg='%s is a symlink; the proxy mounts it as a single file. Replace it '
                                         'with the real file. Nothing was changed.' % path, **result)
            if spec.get('log_mount'):
                try:
                    manager.check_log_dir()
                except _proxy_spec.ProxyError as exc:
                    module.fail_json(msg=str(exc), **result)
            missing = manager.missing_sources()
            if missing:
                module.fail_json(msg='Mount source(s) missing: %s. Lay out the deployment folder first '
                                     '(pi_dispatch.egress.egress_deployment or playbooks/site.yml), which adds '
                                     'what is missing and changes nothing else.' % ', '.join(missing), **result)
            if p['state'] not in ('stopped',):
                # squid reads the allowlist and the includes at every start and reconfigure: never ones
                # nobody validated (the reload path's own check, before any action).
                try:
                    _reload.check_sources(deploy_paths, includes=('endpoints_conf', 'guard_conf')
                                          if p['mount_endpoints'] else ())
                except _reload.SourcesRefused as exc:
                    module.fail_json(msg=str(exc), problems=exc.problems, **result)
            image_id = manager.image_id()
            if image_id is None:
                module.fail_json(msg='Image %s is not on this daemon. Build it with the proxy role '
                                     '(playbooks/site.yml builds it locally; nothing is pulled).' % p['image'],
                                 **result)
        diffs = _proxy_spec.differences(spec, obs, image_id) if obs and p['state'] != 'absent' else []
        live = bool(obs and obs['running'] and not obs['paused'])
        if obs and live and p['state'] != 'absent':
            # A mounted file saved by rename is a new inode the running proxy never sees.
            try:
                rc, out = dc.exec_in(container, _reload.mounted_digests_cmd([d for _s, d in spec['mounts']]))
                stale = _reload.stale_mounts(spec, _reload.parse_digests(out))
            except dc.EngineError as exc:
                stale = []
                manager.messages.append('could not compare the mounted files with the proxy\'s view: %s' % exc)
            for src, dst in stale:
                diffs.append('mounts: %s was replaced on disk (saved by rename, e.g. sed -i or an editor); the '
                             'running proxy still reads the old file at %s, so the proxy is recreated to mount '
                             'the new one' % (src, dst))
            result['stale_mounts'] = [src for src, _dst in stale]
        result['differences'] = diffs
        allowlist_changed = False
        if obs and not diffs and live and p['state'] in ('present', 'started'):
            try:
                rc, _out = dc.exec_in(container, _reload.allowlist_check_cmd())
                allowlist_changed = rc != 0
            except dc.EngineError as exc:
                manager.messages.append('could not compare the allowlist with what squid last read: %s' % exc)
            if allowlist_changed:
                manager.messages.append('the allowlist differs from what squid last read (edited by hand, or '
                                        'never recorded): reconfigure, which cuts no job')
        result['allowlist_changed'] = allowlist_changed
        actions = _proxy.decide(p['state'], obs, diffs, allowlist_changed=allowlist_changed, upstream=p['network'])
        # The shards (clones of the proxy, _shards.py) follow what the proxy does; each one's jobs count.
        plan = _shards.follow_plan(_shards.members(client, p['name']), actions) if obs else []
        result['shards'] = [dict(name=m.name, action=step, jobs=m.load) for m, step in plan]
        result['jobs_cut'] = _proxy.jobs_cut(actions, obs) + _shards.plan_jobs_cut(plan)
        refusal = (_proxy.consent_refusal(actions, obs, p['allow_cut_jobs'])
                   or _proxy.shard_consent_refusal(plan, p['allow_cut_jobs']))
        if refusal:
            result['refused'] = True
            if module._diff and diffs:
                result['diff'] = _proxy_spec.shape_diff(spec, obs, image_id)
                result['diff']['after_header'] = '%s (wanted; refused: %s)' % (p['name'], refusal)
            module.fail_json(msg='%s What differs: %s' % (refusal, '; '.join(diffs) or 'nothing (%s asked)'
                                                          % p['state']), **result)
        if p['state'] != 'absent':
            manager.ensure_network(internal=p['network_internal'])
            if manager.ensure_log_dir():
                result['changed'] = True
        old_networks = _proxy.reattach_networks(obs, p['network']) if obs else []
        container = manager.apply(actions, container, old_networks)
        if plan and not module.check_mode:
            result['shards'] = _shards.apply_plan(client, p['name'], plan)
            failed = [s for s in result['shards'] if s['error']]
            if failed:
                module.fail_json(msg='The proxy is as wanted, but %d shard(s) did not follow it: %s. Rerun to '
                                     'retry them.' % (len(failed), '; '.join('%s (%s: %s)' % (
                                         s['name'], s['action'], s['error']) for s in failed)),
                                 **result)
        manager.actions.extend('%s shard %s' % (step, m.name) for m, step in plan)
        result['changed'] = bool(manager.actions)
        if module._diff and (diffs or (obs is None and 'create' in actions)):
            result['diff'] = _proxy_spec.shape_diff(spec, obs, image_id)
        if container is not None and not module.check_mode:
            started = set(actions) & set(['create', 'start', 'restart', 'unpause', 'reconfigure'])
            if p['wait'] and started and p['state'] not in ('stopped',):
                status = manager.wait_healthy(container, p['wait_timeout'])
                if status != 'healthy':
                    module.fail_json(msg='The proxy did not become healthy within %ss (last status: %s). '
                                         'Its log ends with:\n%s' % (p['wait_timeout'], status,
                                                                     _proxy.logs_tail(container)), **result)
            container.reload()
            obs_after = _proxy_spec.observed(container.attrs)
            result['container'] = dict((k, obs_after[k]) for k in (
                'id', 'name', 'status', 'health', 'networks', 'job_networks', 'mounts', 'published_ports',
                'image_id', 'restart_policy', 'extra_hosts'))
        elif obs and p['state'] != 'absent':
            result['container'] = obs
    except (_proxy_spec.ProxyError, dc.EngineError) as exc:
        module.fail_json(msg=str(exc), **result)
    for warning in manager.warnings:
        module.warn(warning)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
