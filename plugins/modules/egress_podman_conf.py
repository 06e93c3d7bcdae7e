#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r'''
---
module: egress_podman_conf
short_description: Refuse a Podman account's containers.conf that maps the host's loopback or gateway into containers
version_added: 0.9.0
description:
  - Reads every C(containers.conf) a Podman account's containers are started with (the system's files, their
    C(.d) folders, C(containers.rootless.conf) for a rootless account, then the account's own under
    C($XDG_CONFIG_HOME/containers), or only C(CONTAINERS_CONF) when the account sets it) and fails naming the
    file, the key and the fix for each setting that maps the host into containers.
  - Refused wherever it is set, in C([network] pasta_options) (Podman 5) or C([engine] network_cmd_options)
    (Podman 4). Pasta C(--map-host-loopback <address>) puts the host's loopback at an address of the file's
    choice. Pasta C(--map-gw) makes the gateway the host's loopback. Slirp4netns C(cidr=) moves the address where
    C(allow_host_loopback) shows the host's loopback away from the C(10.0.2.2) the destination guard refuses.
    With any of them a job, or a listed name resolving there, reaches every service bound to the host's
    127.0.0.1 (seed 000, issue 428).
  - Also refused, C([containers] cgroups = "disabled"). Podman then starts every container without a cgroup of
    its own, so the proxy's memory and pids limits hold nothing while C(podman inspect), and so the drift
    comparison, still reports them (measured with Podman 5.4.2).
  - With O(limits_unenforced_ok) that one setting is reported in RV(limits_unenforced) and warned about instead of
    refused (the consent of C(egress_proxy_limits_unenforced_ok)); the settings that map the host in stay refused.
  - Read only. A file that is not valid TOML fails the task naming the file (and the line where the parser
    says); nothing is ever changed. See C(docs/podman.md).
author:
  - pi-dispatch egress team (@pi-dispatch)
attributes:
  check_mode:
    support: full
    description: Reads and reports the same way; it never changes anything.
  diff_mode:
    support: none
    description: It writes nothing, so there is nothing to show.
options:
  account:
    description:
      - The account whose Podman runs the proxy and the jobs; its home comes from the password database.
      - Unset, the account running the module.
    type: str
  home:
    description: The account's home, where it is not the password database's (a test, a chroot).
    type: path
  account_env:
    description:
      - The account's C(XDG_CONFIG_HOME) and C(CONTAINERS_CONF), where they are set (Podman reads
        C(CONTAINERS_CONF) alone when it is set).
    type: dict
    default: {}
  rootless:
    description: The account runs Podman rootless (Podman 5 then also reads C(containers.rootless.conf)).
    type: bool
    default: true
  paths:
    description:
      - Check exactly these files (and the C(*.conf) files of these folders) instead of the account's.
    type: list
    elements: path
  limits_unenforced_ok:
    description:
      - Consent to C([containers] cgroups = "disabled") (the proxy's memory and pids limits hold nothing); the
        same consent as the proxy role's C(egress_proxy_limits_unenforced_ok). Settings that map the host into
        containers are refused whatever this says.
    type: bool
    default: false
    version_added: 0.17.0
seealso:
  - module: pi_dispatch.egress.egress_guard
'''

EXAMPLES = r'''
- name: Refuse a containers.conf that maps the host into the worker account's containers
  pi_dispatch.egress.egress_podman_conf:
    account: pi-worker
'''

RETURN = r'''
files:
  description: The files read, in the order Podman reads them.
  returned: always
  type: list
  elements: str
refusals:
  description: Each refused setting (C(path), C(key), C(value), C(why), C(fix)); the task fails when any is listed.
  returned: always
  type: list
  elements: dict
limits_unenforced:
  description: The settings admitted by O(limits_unenforced_ok) (same keys as RV(refusals)); each is also a warning.
  returned: always
  type: list
  elements: dict
  version_added: 0.17.0
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.pi_dispatch.egress.plugins.module_utils._podman import account as _account
from ansible_collections.pi_dispatch.egress.plugins.module_utils._podman import containers_conf as _conf


def main():
    module = AnsibleModule(
        argument_spec=dict(
            account=dict(type='str'),
            home=dict(type='path'),
            account_env=dict(type='dict', default={}),
            rootless=dict(type='bool', default=True),
            paths=dict(type='list', elements='path'),
            limits_unenforced_ok=dict(type='bool', default=False),
        ),
        supports_check_mode=True,
    )
    params = module.params
    result = dict(changed=False, files=[], refusals=[], limits_unenforced=[])
    if params['paths']:
        paths = params['paths']
    else:
        home = params['home']
        if not home:
            try:
                home = _account.entry(params['account']).pw_dir
            except _account.AccountError as exc:
                module.fail_json(msg='%s, or set home' % exc, **result)
        environ = dict((str(k), str(v)) for k, v in (params['account_env'] or {}).items())
        paths = _conf.account_files(home, environ, rootless=params['rootless'])
    try:
        files, refused = _conf.check_files(paths)
    except _conf.ConfError as exc:
        module.fail_json(msg='%s. Nothing was changed.' % exc, **result)
    refused, consented = _conf.split_consented(refused, params['limits_unenforced_ok'])
    result.update(files=files, refusals=[item.as_dict() for item in refused],
                  limits_unenforced=[item.as_dict() for item in consented])
    for item in consented:
        module.warn('consented with limits_unenforced_ok: %s' % item)
    if refused:
        module.fail_json(msg='containers.conf undoes the egress layer\'s confinement (the destination guard, or the '
                             'proxy\'s limits): %s. Nothing was changed.' % ' | '.join(str(item) for item in refused),
                         **result)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
