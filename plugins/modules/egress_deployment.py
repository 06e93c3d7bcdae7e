#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r'''
---
module: egress_deployment
short_description: Lay out a pi-dispatch egress deployment folder, create-only
version_added: 0.1.0
description:
  - Creates the deployment folder and the four files the egress proxy mounts or reads
    (C(egress-allowlist.conf), C(deploy/egress-proxy.conf), C(model-endpoints.json),
    C(model-endpoints.conf)) when they are missing.
  - Every file is create-only. An existing file is never overwritten, never
    re-permissioned and never touched, so an operator's edits and an existing
    pi-dispatch deployment folder are adopted as they are.
  - The module reports which files it created and which it left.
  - A C(deploy_dir), C(deploy/) or file that is a symlink is refused, as is a path
    of the wrong type; nothing is written then.
author:
  - pi-dispatch egress team (@pi-dispatch)
attributes:
  check_mode:
    support: full
    description: Reports the files it would create and writes nothing.
  diff_mode:
    support: full
    description: Shows the content of every file it creates (or would create).
options:
  deploy_dir:
    description:
      - Absolute path of the deployment folder.
    type: path
    required: true
  allowlist:
    description:
      - Entries written into a newly created C(egress-allowlist.conf), each a
        mapping with C(host) and an optional C(comment).
      - Ignored when the allowlist already exists.
      - When omitted, the provider, the forge and the npm registry are written.
    type: list
    elements: dict
    suboptions:
      host:
        description: A bare hostname, or a leading-dot domain.
        type: str
        required: true
      comment:
        description: A note written after the entry.
        type: str
seealso:
  - module: pi_dispatch.egress.egress_proxy
  - module: pi_dispatch.egress.egress_allowlist
notes:
  - The rules file is the collection's packaged copy at creation time; a later
    refresh is an explicit, backed-up step (see the upgrade guide).
'''

EXAMPLES = r'''
- name: Lay out the deployment folder with the default allowlist
  pi_dispatch.egress.egress_deployment:
    deploy_dir: /opt/pi-dispatch/egress

- name: Lay out a folder with our own first allowlist
  pi_dispatch.egress.egress_deployment:
    deploy_dir: /srv/egress
    allowlist:
      - host: api.anthropic.com
        comment: the provider
      - host: .github.com
'''

RETURN = r'''
created:
  description: Files created by this run (in check mode, the files it would create).
  returned: always
  type: list
  elements: str
  sample: [/opt/pi-dispatch/egress/egress-allowlist.conf]
kept:
  description: Files that already existed and were left untouched.
  returned: always
  type: list
  elements: str
created_dirs:
  description: Folders created (or that would be created).
  returned: always
  type: list
  elements: str
paths:
  description: The layout's paths.
  returned: always
  type: dict
  contains:
    deploy_dir:
      description: The deployment folder.
      type: str
      returned: always
    allowlist:
      description: The allowlist file.
      type: str
      returned: always
    rules:
      description: The proxy rules file.
      type: str
      returned: always
    endpoints_json:
      description: The model endpoints declaration.
      type: str
      returned: always
    endpoints_conf:
      description: The rendered model endpoints include.
      type: str
      returned: always
    guard_conf:
      description: The destination guard include.
      type: str
      returned: always
'''

import traceback

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import allowlist as _allowlist
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment


def main():
    module = AnsibleModule(
        argument_spec=dict(
            deploy_dir=dict(type='path', required=True),
            allowlist=dict(type='list', elements='dict', options=dict(
                host=dict(type='str', required=True),
                comment=dict(type='str'),
            )),
        ),
        supports_check_mode=True,
    )
    entries = module.params['allowlist']
    if entries is not None:
        for index, item in enumerate(entries):
            problem = _allowlist.classify_entry(item['host'])
            if problem:
                module.fail_json(msg='allowlist[%d].host %r %s; %s' % (index, item['host'], problem[0], problem[1]))
            if item.get('comment') and ('\n' in item['comment'] or '\r' in item['comment']):
                module.fail_json(msg='allowlist[%d].comment must be a single line' % index)
    try:
        result = _deployment.apply(module.params['deploy_dir'], entries, check_mode=module.check_mode)
    except _deployment.DeploymentError as exc:
        module.fail_json(msg=str(exc))
    except OSError as exc:
        module.fail_json(msg='Writing the deployment folder failed: %s' % exc, exception=traceback.format_exc())
    contents = result.pop('contents')
    if module._diff:
        result['diff'] = [dict(before_header=path, after_header=path, before='', after=contents[path])
                          for path in result['created'] if path in contents]
    module.exit_json(**result)


if __name__ == '__main__':
    main()
