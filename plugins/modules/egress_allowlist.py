#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r'''
---
module: egress_allowlist
short_description: Validate an egress allowlist before squid reads it
version_added: 0.1.0
description:
  - Reads C(egress-allowlist.conf) and checks every line; the module never writes.
  - A line that is not a bare hostname or a leading-dot domain (spaces inside an
    entry, quotes, a scheme such as C(http://), a port, a path, a wildcard, a
    control character, an over-long label) fails the task with the file, the
    line number, the offending text and the fix. Run this before any start or
    reload so that the running proxy keeps its last good file.
  - An entry that covers a whole public suffix of the Public Suffix List (ICANN
    and PRIVATE sections, e.g. C(.com), C(co.uk), C(.github.io),
    C(.s3.amazonaws.com)) and any one-label entry (C(localhost), C(.test),
    C(.internal)) fail the task the same way; list the exact host
    (C(api.example.com)) or your own domain (C(.yourdomain.tld)) instead. The
    list is the copy shipped inside the C(publicsuffixlist) package, so the check
    works offline.
  - Entries that open the proxy's own host (C(host.docker.internal),
    C(host.containers.internal), or a domain such as C(.docker.internal) that
    covers them) are warnings naming the line; declare a model endpoint instead.
  - An IPv4 literal that the destination guard refuses (loopback, link-local, the
    cloud metadata addresses, the job-network pool, or a non-public range that
    O(private_destinations) does not open) and a cloud metadata service name
    (C(metadata.google.internal), C(metadata.goog), C(instance-data.ec2.internal),
    C(metadata.tencentyun.com), or a domain covering one) are warnings naming the
    line and the fix, since every request to them is refused.
  - Linear in the size of the file (100,000 entries in a few seconds;
    C(benchmarks/allowlist.py)).
author:
  - pi-dispatch egress team (@pi-dispatch)
attributes:
  check_mode:
    support: full
    description: Read-only; runs the same in check mode.
  diff_mode:
    support: none
    description: It validates and writes nothing, so there is nothing to diff.
options:
  path:
    description: The allowlist file.
    type: path
    required: true
  warnings_fatal:
    description: Fail on warnings too.
    type: bool
    default: false
  private_destinations:
    description:
      - The private ranges the destination guard opens (the proxy role's
        C(egress_private_destinations)), so that a listed address inside one is
        not warned about. A value that is not a CIDR is ignored here (the guard's
        own task refuses it).
    type: list
    elements: str
    default: []
    version_added: 0.2.0
requirements:
  - publicsuffixlist (Python package, on the target; C(pip install publicsuffixlist)).
    Without it the module fails and the allowlist is refused, never accepted unchecked.
seealso:
  - module: pi_dispatch.egress.egress_deployment
'''

EXAMPLES = r'''
- name: Refuse a malformed allowlist before the proxy reads it
  pi_dispatch.egress.egress_allowlist:
    path: /opt/pi-dispatch/egress/egress-allowlist.conf
'''

RETURN = r'''
entries:
  description: The valid entries, lowercased, in file order.
  returned: success
  type: list
  elements: str
  sample: [api.anthropic.com, .github.com]
problems:
  description: Every refused line (fatal) and warning, with path, line, text, reason and fix.
  returned: always
  type: list
  elements: dict
'''

import os

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import allowlist as _allowlist


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type='path', required=True),
            warnings_fatal=dict(type='bool', default=False),
            private_destinations=dict(type='list', elements='str', default=[]),
        ),
        supports_check_mode=True,
    )
    if _allowlist.publicsuffixlist is None:
        module.fail_json(
            msg='%s Run: pip install %s on the target. The allowlist is refused until then (an entry '
                'covering a whole public suffix cannot be told apart); the running proxy keeps its '
                'last good file.' % (missing_required_lib(_allowlist.PSL_PACKAGE,
                                                          reason='to check entries against the Public Suffix List'),
                                     _allowlist.PSL_PACKAGE),
            exception=_allowlist.PSL_IMPORT_ERROR, problems=[])
    path = module.params['path']
    if os.path.islink(path):
        module.fail_json(msg='%s is a symlink; the proxy mounts the allowlist as a single file. '
                             'Replace it with the real file.' % path, problems=[])
    if not os.path.isfile(path):
        module.fail_json(msg='%s does not exist or is not a regular file; run the deployment role '
                             '(playbooks/site.yml) to create it.' % path, problems=[])
    try:
        with open(path, 'rb') as handle:
            raw = handle.read()
        text = raw.decode('utf-8')
    except UnicodeDecodeError as exc:
        module.fail_json(msg='%s is not UTF-8 text (%s); save it as plain ASCII/UTF-8.' % (path, exc), problems=[])
    except OSError as exc:
        module.fail_json(msg='Reading %s failed: %s' % (path, exc), problems=[])
    result = _allowlist.parse(text, path, opened=module.params['private_destinations'])
    problems = [dict(p.as_dict(), severity='error') for p in result.errors]
    problems += [dict(p.as_dict(), severity='warning') for p in result.warnings]
    for warning in result.warnings:
        module.warn(str(warning))
    if result.errors or (module.params['warnings_fatal'] and result.warnings):
        bad = result.errors or result.warnings
        module.fail_json(
            msg='The allowlist is refused; the running proxy keeps its last good file. %s'
                % ' | '.join(str(p) for p in bad),
            problems=problems)
    module.exit_json(changed=False, entries=result.hosts(), problems=problems)


if __name__ == '__main__':
    main()
