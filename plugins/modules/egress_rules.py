#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r'''
---
module: egress_rules
short_description: Compare and, when asked, refresh the egress proxy rules with a backup
version_added: 0.1.0
description:
  - Compares the deployment folder's C(deploy/egress-proxy.conf) with the collection's
    packaged copy and reports whether they differ (a unified diff in diff mode, naming both files).
  - With I(refresh=true) and a difference, keeps the current file as
    C(deploy/egress-proxy.conf.bak-YYYYMMDDTHHMMSSZ) (UTC; an existing backup is never
    overwritten, a taken name gets C(.1), C(.2) ... appended), writes the packaged copy to a
    temporary file beside it, fsyncs it and renames it into place, and returns the backup path.
  - Refreshing is never implicit. Without I(refresh), a differing copy is a warning only
    (it still enforces the allowlist, and the difference may be the operator's own edit).
  - Refuses when C(deploy/) or C(deploy/egress-proxy.conf) is a symlink, or when the file is
    not a regular file; nothing is written.
  - With I(proxy_name), also inspects that proxy container (read-only) and returns the
    C(decision) of what must follow (restart, unpause and restart, start, create, or the
    replacement of a two-mount proxy made before model endpoints). A refresh that needs a
    consent it was not given (to replace a two-mount proxy, or to cut attached jobs) fails
    and writes nothing. The module never changes the container; M(pi_dispatch.egress.egress_proxy) does.
  - With I(restore_from), puts that backup back as the rules file (the rollback).
  - The proxy mounts the rules as a single file, so a running squid does not see the renamed
    file until the container is restarted or recreated.
author:
  - pi-dispatch egress team (@pi-dispatch)
attributes:
  check_mode:
    support: full
    description: Reports the difference, the decision and the backup it would make; writes nothing.
  diff_mode:
    support: full
    description: Shows the unified diff between the folder's rules and the packaged copy (or the backup restored).
options:
  deploy_dir:
    description: Absolute path of the deployment folder.
    type: path
    required: true
  refresh:
    description:
      - Replace a differing C(deploy/egress-proxy.conf) with the packaged copy, keeping a backup.
      - When false, a difference is reported as a warning and nothing is written.
    type: bool
    default: false
  source:
    description:
      - Compare with and refresh from this file instead of the collection's packaged copy
        (a staged rules file; the tests use it for a rules file squid refuses).
    type: path
  restore_from:
    description:
      - Put this backup (a C(egress-proxy.conf.bak-*) file beside the rules) back as the rules
        file. Excludes I(refresh).
    type: path
  proxy_name:
    description: Inspect this proxy container and return the decision of what follows the refresh. Only then
      is the daemon (I(docker_host)) contacted.
    type: str
  allow_cut_jobs:
    description: Consent to restart or replace a proxy that has job networks attached (cuts their tunnels).
    type: bool
    default: false
  allow_replace:
    description: Consent to replace a two-mount proxy (made before model endpoints) together with the refresh.
    type: bool
    default: false
extends_documentation_fragment:
  - pi_dispatch.egress.docker
seealso:
  - module: pi_dispatch.egress.egress_proxy
  - module: pi_dispatch.egress.egress_deployment
notes:
  - The decision table is documented in docs/upgrade.md.
'''

EXAMPLES = r'''
- name: Does the folder's rules file differ from the packaged copy?
  pi_dispatch.egress.egress_rules:
    deploy_dir: /opt/pi-dispatch/egress

- name: Refresh it (with a backup) and learn what the proxy needs
  pi_dispatch.egress.egress_rules:
    deploy_dir: /opt/pi-dispatch/egress
    refresh: true
    proxy_name: pi-dispatch-egress-proxy
  register: rules

- name: Roll back
  pi_dispatch.egress.egress_rules:
    deploy_dir: /opt/pi-dispatch/egress
    restore_from: "{{ rules.backup }}"
'''

RETURN = r'''
differs:
  description: The folder's rules differ from the packaged copy (before this run).
  returned: always
  type: bool
path:
  description: The rules file.
  returned: always
  type: str
packaged:
  description: Names the packaged copy compared with.
  returned: always
  type: str
backup:
  description: The backup made (in check mode, the one it would make); null when none.
  returned: always
  type: str
  sample: /opt/pi-dispatch/egress/deploy/egress-proxy.conf.bak-20261203T082000Z
refreshed:
  description: The rules file was (or in check mode would be) replaced by the packaged copy.
  returned: always
  type: bool
restored:
  description: The backup was (or would be) put back (only with I(restore_from)).
  returned: always
  type: bool
decision:
  description: What follows, when I(proxy_name) is set (see docs/upgrade.md for the table).
  returned: when proxy_name is set
  type: dict
  contains:
    action:
      description: e.g. none, warn-differs, refresh+restart, refresh+unpause+restart, refresh+start,
        create, refresh+create, refresh+replace, replace, refuse-needs-consent.
      type: str
    proxy_state:
      description: The egress_proxy state to ask for afterwards; null to leave the proxy alone.
      type: str
    proxy_step:
      description: restart, unpause+restart, start, create, replace or null.
      type: str
    jobs_cut:
      description: How many attached jobs the proxy step cuts (or would have cut, when refused).
      type: int
    mount_endpoints_before:
      description: The proxy mounted model-endpoints.conf before (false for the two-mount shape).
      type: bool
    proxy_before:
      description: running, paused, stopped or missing.
      type: str
    message:
      description: The decision in words.
      type: str
'''

import traceback
from typing import Any, Dict

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import venue as _venue
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import spec as _proxy_spec
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import refresh as _refresh
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import shards as _shards


def _decision(module: AnsibleModule, p: Dict[str, Any], compared: Dict[str, Any]) -> Dict[str, Any]:
    client = dc.module_client(module)
    try:
        container = dc.get_container(client, p['proxy_name'])
    except dc.EngineError as exc:
        dc.fail(module, exc)
    obs = _proxy_spec.observed(_venue.container_attrs(client, container.attrs)) if container else None
    if obs and not _proxy_spec.is_ours(obs):
        module.fail_json(msg='A container named %s exists but is not a pi-dispatch egress proxy; nothing was '
                             'written. Rename or remove it, or choose another proxy_name.' % p['proxy_name'])
    state, two_mount, jobs = _refresh.proxy_facts(obs)
    if obs:
        # The shards follow the proxy's restart or replacement (egress_proxy), so their jobs count too.
        try:
            jobs += sum(m.load for m in _shards.members(client, p['proxy_name']) if m.is_shard and m.running)
        except dc.EngineError as exc:
            dc.fail(module, exc)
    decision = _refresh.decide(state, two_mount, compared['differs'], p['refresh'], jobs=jobs,
                               allow_cut_jobs=p['allow_cut_jobs'], allow_replace=p['allow_replace'],
                               current_includes_endpoints=compared['current_includes_endpoints'])
    decision['proxy_before'] = state
    decision['job_networks'] = obs['job_networks'] if obs else []
    return decision


def _restored(module: AnsibleModule, p: Dict[str, Any], result: Dict[str, Any]) -> Dict[str, Any]:
    """The result of putting the backup ``restore_from`` back."""
    restored = _refresh.restore(p['deploy_dir'], p['restore_from'], check_mode=module.check_mode)
    result.update(changed=restored['changed'], restored=restored['changed'], path=restored['path'],
                  backup=restored['backup'])
    if module._diff and restored['changed']:
        result['diff'] = dict(before_header=restored['path'], after_header=restored['backup'],
                              prepared=restored['diff'])
    return result


def main():
    module = AnsibleModule(
        argument_spec=dc.argument_spec(dict(
            deploy_dir=dict(type='path', required=True),
            refresh=dict(type='bool', default=False),
            source=dict(type='path'),
            restore_from=dict(type='path'),
            proxy_name=dict(type='str'),
            allow_cut_jobs=dict(type='bool', default=False),
            allow_replace=dict(type='bool', default=False),
        )),
        mutually_exclusive=[('refresh', 'restore_from')],
        supports_check_mode=True,
    )
    p = module.params
    result = dict(changed=False, differs=False, backup=None, refreshed=False, restored=False,
                  path=None, packaged=_refresh.PACKAGED_NAME)
    try:
        if p['restore_from']:
            module.exit_json(**_restored(module, p, result))
        packaged, packaged_name = _refresh.read_source(p['source'])
        compared = _refresh.plan_refresh(p['deploy_dir'], packaged, packaged_name=packaged_name)
        result.update(differs=compared['differs'], path=compared['path'], packaged=packaged_name)
        decision = _decision(module, p, compared) if p['proxy_name'] else None
        if decision is not None:
            result['decision'] = decision
        if module._diff and compared['differs']:
            result['diff'] = dict(before_header=compared['path'], after_header=packaged_name,
                                  prepared=compared['diff'])
        if decision is not None and decision['refuse']:
            module.fail_json(msg=decision['message'], **result)
        write = compared['differs'] and p['refresh']
        if not write:
            if compared['differs']:
                module.warn('%s differs from the packaged copy (%s); it still enforces the allowlist, and the '
                            'difference may be your own edit. Review the diff (--diff) and refresh with '
                            'refresh=true (egress_upgrade_refresh_rules=true in playbooks/upgrade.yml); a backup '
                            'is kept.' % (compared['path'], packaged_name))
            module.exit_json(**result)
        if module.check_mode:
            result.update(changed=True, refreshed=True, backup=compared['backup'])
            module.exit_json(**result)
        done = _refresh.refresh(p['deploy_dir'], packaged, packaged_name=packaged_name)
        result.update(changed=done['changed'], refreshed=done['changed'], backup=done['backup'])
    except _refresh.RefreshError as exc:
        module.fail_json(msg=str(exc), **result)
    except (OSError, IOError) as exc:
        module.fail_json(msg='Reading or writing the rules failed: %s' % exc, exception=traceback.format_exc(),
                         **result)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
