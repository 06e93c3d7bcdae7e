#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r'''
---
module: egress_doctor_report
short_description: Put the egress doctor's results of every host into one fleet report
version_added: 0.2.0
description:
  - Takes the hosts of the play and each host's registered M(pi_dispatch.egress.egress_canary) result and
    returns one row per host with its status (V(ok), V(fail), V(unreachable), V(not run)), an aligned table,
    the human report (every host's lines with the doctor's symbols, the fix under each warn and fail) and
    the totals.
  - A host the doctor ran on is V(fail) when at least one of its lines is a fail, V(ok) otherwise (a warn
    or a not-run line does not make it fail). A host in I(unreachable), or whose result says it was
    unreachable, is V(unreachable). A host without a result (C(null) or C({})), or whose result is a failed
    or skipped task without doctor lines (for example a preflight that found no Docker SDK), is V(not run),
    with the reason from I(reasons) or else the result's C(msg).
  - Of a result it reads only C(lines) (the doctor redacted them), C(msg), C(failed), C(unreachable) and
    C(skipped); a reason or a C(msg) is redacted before it is shown.
  - It does not fail when a host failed or was not reached (RV(fleet_failed) says so; the playbook
    decides). It fails on input that does not pair up (I(hosts) and I(results) of different lengths, a
    result that is not a dict or C(null), a line without a doctor status, a name in I(unreachable) or
    I(reasons) that is not in I(hosts)), naming the option and the index.
  - It reads nothing, writes only I(json_path) and talks to no daemon.
author:
  - pi-dispatch egress team (@pi-dispatch)
options:
  hosts:
    description: The play's hosts, in order (C(ansible_play_hosts_all)); each once.
    type: list
    elements: str
    required: true
  results:
    description:
      - One entry per host of I(hosts), in the same order, the host's registered
        M(pi_dispatch.egress.egress_canary) result, or C(null) when the host gave none.
    type: list
    elements: raw
    required: true
  unreachable:
    description: The hosts of I(hosts) that could not be reached.
    type: list
    elements: str
    default: []
  reasons:
    description:
      - Host to the message of what stopped it before the doctor ran (a connection error, a preflight's
        message). It is the reason shown for an unreachable or not-run host, before the result's C(msg).
    type: dict
    default: {}
  json_path:
    description:
      - Also write one JSON document (C(hosts), C(totals) and C(failed), which is RV(fleet_failed)) to this
        file on the host the module runs on; unset writes nothing.
    type: path
attributes:
  check_mode:
    support: full
    description: Reports the same in check mode; I(json_path) is not written.
  diff_mode:
    support: none
    description: It returns the report; there is nothing to diff.
seealso:
  - module: pi_dispatch.egress.egress_canary
'''

EXAMPLES = r'''
- name: Egress doctor
  pi_dispatch.egress.egress_canary:
    probe_image: pi-dispatch-job:latest
  register: doctor_result
  failed_when: false

- name: Fleet report of the egress doctor
  pi_dispatch.egress.egress_doctor_report:
    hosts: "{{ ansible_play_hosts_all }}"
    results: >-
      {{ ansible_play_hosts_all | map('extract', hostvars)
         | map(attribute='doctor_result', default=none) }}
    unreachable: "{{ ansible_play_hosts_all | difference(ansible_play_hosts) }}"
    json_path: /var/tmp/egress-doctor-fleet.json
  run_once: true
  delegate_to: localhost
  register: fleet

- name: Print the table
  ansible.builtin.debug:
    var: fleet.table
  run_once: true

- name: Fail the play when a host failed or gave no result
  ansible.builtin.fail:
    msg: "egress doctor: {{ fleet.totals.hosts }}"
  when: fleet.fleet_failed
  run_once: true
'''

RETURN = r'''
table:
  description:
    - C(host status ok warn fail notrun detail), a header and one row per host, aligned. The counts are
      C(-) for a host the doctor did not run on; the detail is the first fail line's message (and how many
      more fail), or the reason.
  returned: always
  type: list
  elements: str
  sample:
    - "host      status       ok  warn  fail  notrun  detail"
    - "engine-a  ok            9     0     0       1"
    - "engine-b  fail          8     0     1       1  Egress proxy missing: there is no container ..."
    - "engine-c  unreachable   -     -     -       -  Failed to connect to the host via ssh"
lines:
  description:
    - "The human report. For every host C(== host: status ==), its reason if any, then its lines grouped as
      the doctor prints them, each with its symbol and the fix under a warn or fail, and its count; last, one
      line of totals."
  returned: always
  type: list
  elements: str
hosts:
  description: One row per host of I(hosts), in order.
  returned: always
  type: list
  elements: dict
  contains:
    host:
      description: The host.
      type: str
    status:
      description: V(ok), V(fail), V(unreachable) or V(not run).
      type: str
    summary:
      description: Its lines per status (V(ok), V(warn), V(fail), V(notrun)); all 0 when the doctor did not run.
      type: dict
    failed_lines:
      description: The ids of its fail lines.
      type: list
      elements: str
    reason:
      description: What stopped it (unreachable, not run), or the message I(reasons) gave; null when none.
      type: str
    lines:
      description: Its doctor lines (id, status, message, fix, and group when the result had it).
      type: list
      elements: dict
totals:
  description:
    - C(hosts), hosts per status; C(lines), the lines per status summed over the fleet.
    - C(consented), per weakening an operator consented to, the hosts whose doctor said so -
      C(limits_unenforced), the hosts whose proxy runs without enforced memory and pids limits (rootless on
      cgroup v1, C(egress_proxy_limits_unenforced_ok)); the report's last line names them.
  returned: always
  type: dict
  sample: {hosts: {ok: 1, fail: 1, unreachable: 1, not run: 0}, lines: {ok: 17, warn: 0, fail: 1, notrun: 2},
           consented: {limits_unenforced: [engine-b]}}
fleet_failed:
  description:
    - True when a host failed, was unreachable or was not run. Not called C(failed), which would fail the
      task; the module itself succeeds.
  returned: always
  type: bool
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.pi_dispatch.egress.plugins.module_utils._fleet import doctor_report as _doctor_report


def main():
    module = AnsibleModule(
        argument_spec=dict(
            hosts=dict(type='list', elements='str', required=True),
            results=dict(type='list', elements='raw', required=True),
            unreachable=dict(type='list', elements='str', default=[]),
            reasons=dict(type='dict', default={}),
            json_path=dict(type='path'),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        report = _doctor_report.aggregate(p['hosts'], p['results'], unreachable=p['unreachable'],
                                          reasons=p['reasons'])
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    changed = False
    if p['json_path']:
        try:
            changed = _doctor_report.write_json(p['json_path'], _doctor_report.json_document(report),
                                                check_mode=module.check_mode)
        except (IOError, OSError) as exc:
            module.fail_json(msg='Writing %s failed: %s; give a json_path whose folder exists and is writable'
                             % (p['json_path'], exc), **report)
    module.exit_json(changed=changed, **report)


if __name__ == '__main__':
    main()
