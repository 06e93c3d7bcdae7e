#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r'''
---
module: egress_decisions
short_description: Read the egress proxy's decision log, count it per job and host, and replay an allowlist change
version_added: 0.3.0
description:
  - The proxy and each of its shards write one JSON line per decision (allowed and refused) into a host
    folder, C(<deploy_dir>/decisions) by default (role variable C(egress_decision_log_dir)); see
    C(docs/decisions.md) for the fields and the reasons.
  - This module reads every file of that folder (the rotated ones too), keeps the decisions that match
    every filter given (I(job), I(host), I(verdict), I(reason), the time window I(since) to I(before)),
    and returns the last I(limit) of them with counts per verdict, reason, job and host.
  - With I(replay_allowlist) or I(replay_entries) it replays the recorded requests that the allowlist
    decides against that candidate and reports what would change against the current allowlist (the
    deployment folder's file, I(current_allowlist), or what the running proxy I(current_from_proxy)
    loaded), namely the hosts and jobs that would newly be refused and the refused requests that would now pass. With
    C(--diff) the change is shown as a diff.
  - It changes nothing. A line that is not a decision (a cut line) is skipped and named in I(problems);
    a symlinked folder is refused. A log file that is not a regular file (a symlink, a FIFO, a socket),
    also one swapped in while it reads, is skipped with a warning naming it and the fix, never followed,
    read or waited on; an allowlist file (I(current_allowlist), I(replay_allowlist)) that is not a regular
    file is refused.
author:
  - pi-dispatch egress team (@pi-dispatch)
options:
  deploy_dir:
    description:
      - The deployment folder; the log is read from its C(decisions) folder and the current allowlist is its
        C(egress-allowlist.conf), unless I(folder) or I(current_allowlist) say otherwise.
    type: path
  folder:
    description: The decision log folder (C(egress_decision_log_dir)). One of I(deploy_dir) and I(folder) is required.
    type: path
  job:
    description: Only the decisions of this job id (the job network C(pi-job-<id>-net) the request came from).
    type: str
  host:
    description: Only the decisions for this host; C(.example.test) for that domain and every name under it.
    type: str
  verdict:
    description: Only C(allowed) or only C(refused) decisions.
    type: str
    choices: [allowed, refused]
  reason:
    description: Only the decisions with this reason (C(unlisted), C(port), C(guard), C(sni_mismatch), ...).
    type: str
  since:
    description:
      - The start of the window, a span back from now (C(30m), C(1h), C(7d)), an ISO 8601 UTC time
        (C(2026-12-05T21:00:00Z)) or epoch seconds. Unset reads from the oldest line kept.
    type: str
  before:
    description: The end of the window, written like I(since). Unset reads to the newest line.
    type: str
  limit:
    description: How many of the matching decisions (the newest) are returned in I(records); the counts cover all.
    type: int
    default: 50
  top:
    description: How many jobs and hosts the counts list, the busiest first.
    type: int
    default: 10
  replay_allowlist:
    description: A candidate allowlist file to replay the recorded decisions against.
    type: path
  replay_entries:
    description: A candidate allowlist as a list of entries (as the file would list them).
    type: list
    elements: str
  current_allowlist:
    description: The allowlist the recorded decisions are compared under; default the deployment folder's.
    type: path
  current_from_proxy:
    description:
      - Compare under the allowlist this running proxy container loaded (its own record of the file it read
        at its last start or reload) instead of a file. Needs the Docker SDK and the connection options.
    type: str
extends_documentation_fragment:
  - pi_dispatch.egress.docker
attributes:
  check_mode:
    support: full
    description: It only reads; check mode returns the same.
  diff_mode:
    support: full
    description: With a replay, the recorded requests whose verdict the candidate changes, before and after.
notes:
  - The log is written by the proxy image's decision-log program; a job id is known only for a client on
    a job network (C(pi-job-<id>-net)), read from the engine's DNS as the request is logged.
'''

EXAMPLES = r'''
- name: What job 1234 was refused in the last hour
  pi_dispatch.egress.egress_decisions:
    deploy_dir: /opt/pi-dispatch/egress
    job: "1234"
    verdict: refused
    since: 1h

- name: What dropping a host from the allowlist would break (before applying it)
  pi_dispatch.egress.egress_decisions:
    deploy_dir: /opt/pi-dispatch/egress
    replay_allowlist: /opt/pi-dispatch/egress/egress-allowlist.conf.candidate
    since: 7d
  register: egress_replay
'''

RETURN = r'''
records:
  description: The newest I(limit) matching decisions, oldest first (the fields of docs/decisions.md, plus C(epoch)).
  returned: always
  type: list
  elements: dict
count:
  description: How many decisions matched.
  returned: always
  type: int
summary:
  description:
    - Counts of the matching decisions (total, allowed, refused, by_reason, jobs, hosts, refused_jobs,
      refused_hosts).
  returned: always
  type: dict
files:
  description: The log files read.
  returned: always
  type: list
  elements: str
problems:
  description: Lines that are not decision records, by file and line.
  returned: always
  type: list
  elements: str
refused_files:
  description:
    - Names in the folder that are log files by name but not regular files (a symlink, a FIFO, a socket, a
      folder), also one swapped in while it was read; each was not read, never followed or waited on, and
      is named with the fix. Also given as warnings.
  returned: always
  type: list
  elements: str
  version_added: 0.15.0
replay:
  description:
    - With a candidate, the changes (newly_refused, newly_allowed; one row per method kind, host and port with
      the jobs, the number of requests and the last time), how many recorded requests the allowlist decided
      (judged), how many keep their verdict (unchanged), and C(lines), the change as text.
  returned: when a candidate is given
  type: dict
'''

import os
from typing import Any, Dict, List, Optional, Tuple

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import decisions as _decisions
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy.spec import LOADED_ALLOWLIST

ALLOWLIST_FILE = 'egress-allowlist.conf'


def _read_text(module: AnsibleModule, path: str, what: str) -> str:
    try:
        return _decisions.read_text(path, what)
    except _decisions.DecisionsError as exc:
        module.fail_json(msg=str(exc))
    except (IOError, OSError) as exc:
        module.fail_json(msg='Cannot read %s (%s): %s. Name a readable file.' % (path, what, exc.strerror or exc))


def _current_entries(module: AnsibleModule, p: Dict[str, Any]) -> Tuple[Optional[List[str]], str]:
    if p['current_from_proxy']:
        client = dc.module_client(module, why='current_from_proxy reads the allowlist the proxy loaded')
        try:
            container = dc.get_container(client, p['current_from_proxy'])
            if container is None or container.status != 'running':
                return None, 'proxy %s is not running' % p['current_from_proxy']
            rc, out = dc.exec_in(container, ['cat', LOADED_ALLOWLIST])
        except dc.EngineError as exc:
            module.fail_json(msg=str(exc), retryable=True)
        if rc != 0:
            return None, 'proxy %s has no record of the allowlist it loaded' % p['current_from_proxy']
        return _decisions.entries_of(out), 'the allowlist proxy %s loaded' % p['current_from_proxy']
    path = p['current_allowlist'] or os.path.join(p['deploy_dir'], ALLOWLIST_FILE)
    return _decisions.entries_of(_read_text(module, path, 'current allowlist')), path


def main():
    argument_spec = dict(
        deploy_dir=dict(type='path'),
        folder=dict(type='path'),
        job=dict(type='str'),
        host=dict(type='str'),
        verdict=dict(type='str', choices=list(_decisions.VERDICTS)),
        reason=dict(type='str'),
        since=dict(type='str'),
        before=dict(type='str'),
        limit=dict(type='int', default=50),
        top=dict(type='int', default=10),
        replay_allowlist=dict(type='path'),
        replay_entries=dict(type='list', elements='str'),
        current_allowlist=dict(type='path'),
        current_from_proxy=dict(type='str'),
    )
    module = AnsibleModule(argument_spec=dc.argument_spec(argument_spec), supports_check_mode=True,
                           required_one_of=[('deploy_dir', 'folder')],
                           mutually_exclusive=[('replay_allowlist', 'replay_entries'),
                                               ('current_allowlist', 'current_from_proxy')])
    p = module.params
    replaying = p['replay_allowlist'] is not None or p['replay_entries'] is not None
    if replaying and not p['deploy_dir'] and not (p['current_allowlist'] or p['current_from_proxy']):
        module.fail_json(msg='A replay compares under the current allowlist: give deploy_dir, current_allowlist or '
                             'current_from_proxy. Nothing was read.')
    folder = p['folder'] or os.path.join(p['deploy_dir'], _decisions.DEFAULT_FOLDER)
    try:
        result, matched, warnings = _decisions.query(
            folder, job=p['job'], host=p['host'], verdict=p['verdict'], reason=p['reason'], since=p['since'],
            before=p['before'], limit=p['limit'], top=p['top'])
    except _decisions.DecisionsError as exc:
        module.fail_json(msg=str(exc))
    except (IOError, OSError) as exc:
        module.fail_json(msg='Cannot read the decision log in %s: %s. Run as a user that can read it (root).'
                             % (folder, exc))
    for warning in warnings:
        module.warn(warning)
    if replaying:
        if p['replay_allowlist'] is not None:
            candidate = _decisions.entries_of(_read_text(module, p['replay_allowlist'], 'replay_allowlist'))
            candidate_name = p['replay_allowlist']
        else:
            candidate, candidate_name = list(p['replay_entries']), 'replay_entries'
        current, current_name = _current_entries(module, p)
        if current is None:
            result['replay'] = dict(newly_refused=[], newly_allowed=[], judged=0, unchanged=0,
                                    lines=['nothing replayed: %s' % current_name])
            module.exit_json(**result)
        replayed = _decisions.replay(matched, current, candidate)
        replayed['lines'] = _decisions.replay_lines(replayed)
        result['replay'] = replayed
        if module._diff and (replayed['newly_refused'] or replayed['newly_allowed']):
            result['diff'] = _decisions.replay_diff(replayed, current_name, candidate_name)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
