#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r'''
---
module: egress_upgrade_summary
short_description: Group the hosts of an egress upgrade by what happened to each
version_added: 0.2.0
description:
  - Takes the hosts of the play and each host's C(egress_upgrade_report) (the fact the
    C(pi_dispatch.egress.upgrade) role sets) and returns the fleet summary the upgrade prints
    (refreshed, restarted, started, created, replaced, rolled back, refused, failed, left alone,
    not reached), one line per host, a table and one JSON row per host with its outcome
    (upgraded, unchanged, rolled back, refused, failed, not reached).
  - It reads nothing, writes only I(json_path) and talks to no daemon. C(playbooks/upgrade.yml) runs it once per
    batch.
  - Optionally writes the JSON rows to I(json_path) on the host it runs on.
author:
  - pi-dispatch egress team (@pi-dispatch)
options:
  hosts:
    description: The play's hosts, in order (C(ansible_play_hosts_all)).
    type: list
    elements: str
    required: true
  reports:
    description:
      - One entry per host of I(hosts), in the same order, C(null) for a host the play did not reach.
    type: list
    elements: raw
    required: true
  check_mode_run:
    description: The upgrade ran in check mode (each line says so).
    type: bool
    default: false
  json_path:
    description: Also write the rows (and the totals) as JSON to this file; unset writes nothing.
    type: path
attributes:
  check_mode:
    support: full
    description: Groups the same in check mode; I(json_path) is not written.
  diff_mode:
    support: none
    description: It returns the summary; there is nothing to diff.
'''

EXAMPLES = r'''
- name: Summary of the egress upgrade
  pi_dispatch.egress.egress_upgrade_summary:
    hosts: "{{ ansible_play_hosts_all }}"
    reports: >-
      {{ ansible_play_hosts_all | map('extract', hostvars)
         | map(attribute='egress_upgrade_report', default=none) }}
  run_once: true
'''

RETURN = r'''
lines:
  description: The summary as printed, one group per line, then one line per reached host.
  returned: always
  type: list
  elements: str
table:
  description: C(host outcome action), one row per host, aligned.
  returned: always
  type: list
  elements: str
hosts:
  description: One row per host (host, outcome, action, proxy_step, backup, jobs_cut, message).
  returned: always
  type: list
  elements: dict
groups:
  description: Group name to the hosts in it.
  returned: always
  type: dict
totals:
  description: Outcome to the number of hosts with it.
  returned: always
  type: dict
'''

import json

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.pi_dispatch.egress.plugins.module_utils._fleet import upgrade_summary as _upgrade_summary


def main():
    module = AnsibleModule(
        argument_spec=dict(
            hosts=dict(type='list', elements='str', required=True),
            reports=dict(type='list', elements='raw', required=True),
            check_mode_run=dict(type='bool', default=False),
            json_path=dict(type='path'),
        ),
        supports_check_mode=True,
    )
    p = module.params
    for index, report in enumerate(p['reports']):
        if report is not None and not isinstance(report, dict):
            module.fail_json(msg='reports[%d] (host %s) is %r, not a report dict or null'
                             % (index, p['hosts'][index] if index < len(p['hosts']) else '?', report))
    try:
        summary = _upgrade_summary.summarize(p['hosts'], p['reports'], check_mode=p['check_mode_run'])
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    changed = False
    if p['json_path']:
        text = json.dumps(dict(hosts=summary['hosts'], totals=summary['totals']), indent=2, sort_keys=True) + '\n'
        try:
            with open(p['json_path']) as handle:
                changed = handle.read() != text
        except (IOError, OSError):
            changed = True
        if changed and not module.check_mode:
            try:
                with open(p['json_path'], 'w') as handle:
                    handle.write(text)
            except (IOError, OSError) as exc:
                module.fail_json(msg='Writing %s failed: %s' % (p['json_path'], exc), **summary)
    module.exit_json(changed=changed, **summary)


if __name__ == '__main__':
    main()
