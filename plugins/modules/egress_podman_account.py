#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r'''
---
module: egress_podman_account
short_description: A service account ready to run rootless Podman, with its API socket
version_added: 0.18.0
description:
  - Makes a host account ready to run the egress layer's rootless Podman and returns the API socket
    (RV(docker_host)) the next roles use. Every refusal comes before anything changes and names the account or
    the file, the line and the fix.
  - The account must exist, unless O(create) (then C(useradd --create-home --shell /usr/sbin/nologin)).
  - Subordinate ids. A range of at least O(subid_count) ids for the account (by name or by uid) in both
    C(/etc/subuid) and C(/etc/subgid) is kept. A missing one is added, the first free range after every range of
    both files and never below 100000, written atomically; C(podman system migrate) then runs as the account. A
    range too small, one that overlaps another account's, a malformed line or a symlinked file is refused, never
    rewritten.
  - The runtime dir C(/run/user/<uid>) (0700, the account's) is made where no logind makes it; where logind runs,
    linger is enabled (C(loginctl enable-linger)).
  - The API socket. O(socket=systemd) enables the account's C(podman.socket) (C(systemctl --user -M <account>@
    enable --now podman.socket)). O(socket=supervised) starts C(podman system service --time=0) as the account
    (C(setpriv), a clean environment), detached, under a subreaper that reaps the exited C(aardvark-dns) and
    C(conmon) it inherits, and records its pid in C(/run/user/<uid>/pi-egress/podman-service.pid) (root's, 0600).
    Such a service is not restarted after a crash or a reboot; run the role again, or use systemd.
  - A recorded service that is alive and answers C(GET /_ping) is left alone. O(state=absent) stops it by its
    recorded pid only (or disables the account's C(podman.socket)); the account and its ranges stay.
  - The account's C(~/.config/containers) files are refused when they are symlinks (C(egress_podman_conf) reads
    them as root next). See C(docs/podman.md).
author:
  - pi-dispatch egress team (@pi-dispatch)
attributes:
  check_mode:
    support: full
    description: Says what it would do (the subordinate ranges it would add, the service it would start) and does
      nothing.
  diff_mode:
    support: full
    description: The lines added to C(/etc/subuid) and C(/etc/subgid), the account, and the service's state.
options:
  account:
    description: The service account whose rootless Podman runs the proxy and the jobs.
    type: str
    required: true
  create:
    description:
      - Create the account when it does not exist. Without it an account that does not exist is refused, naming it
        and C(useradd).
    type: bool
    default: false
  subid_count:
    description: How many subordinate uids and gids the account needs in each file.
    type: int
    default: 65536
  socket:
    description:
      - How the account's Podman API socket is run. V(systemd) is the account's C(podman.socket) under its user
        manager. V(supervised) is C(podman system service) started and watched by this module only while it runs.
      - V(auto) is V(systemd) when PID 1 is systemd and logind answers, else V(supervised).
    type: str
    choices: [auto, systemd, supervised]
    default: auto
  state:
    description:
      - V(present) runs the service; V(absent) stops the supervised service by its recorded pid (or disables the
        account's C(podman.socket)). The account and its ranges are kept either way.
    type: str
    choices: [present, absent]
    default: present
seealso:
  - module: pi_dispatch.egress.egress_podman_conf
  - module: pi_dispatch.egress.egress_podman_units
'''

EXAMPLES = r'''
- name: The worker account's rootless Podman and its API socket
  pi_dispatch.egress.egress_podman_account:
    account: pi-worker
    create: true
  register: worker

- name: The next roles reach that Podman
  ansible.builtin.set_fact:
    egress_docker_host: "{{ worker.docker_host }}"
'''

RETURN = r'''
account:
  description: The account.
  returned: always
  type: str
uid:
  description: The account's uid.
  returned: when the account exists
  type: int
actions:
  description: What was done (or, in check mode, would be done), one line each.
  returned: always
  type: list
  elements: str
subids:
  description: Per file (C(/etc/subuid), C(/etc/subgid)), the account's range (C(path), C(owner), C(start),
    C(count), C(added); a kept one also C(line)).
  returned: when state is present and the account exists
  type: dict
migrated:
  description: C(podman system migrate) ran as the account (or would) because a range was added.
  returned: when state is present and the account exists
  type: bool
runtime_dir:
  description: The account's runtime dir, C(/run/user/<uid>).
  returned: when the account exists
  type: str
linger:
  description: Linger is on (logind runs here); false where this module made the runtime dir itself.
  returned: when state is present and the account exists
  type: bool
socket:
  description: How the API socket is run, V(auto) resolved (V(systemd) or V(supervised)).
  returned: when the account exists
  type: str
service:
  description:
    - The service. Supervised, C(pid_file), C(pid), C(running), C(log); systemd, C(unit), C(scope), C(enabled).
  returned: when the account exists
  type: dict
supervision:
  description: For a supervised service, C(supervised by this module, not restarted after a crash or a reboot; run
    the role again, or use systemd) (the exact words are in the result).
  returned: when socket is supervised and state is present
  type: str
docker_host:
  description: The account's API socket for the next roles, C(unix:///run/user/<uid>/podman/podman.sock).
  returned: when the account exists
  type: str
  sample: unix:///run/user/1001/podman/podman.sock
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.pi_dispatch.egress.plugins.module_utils._podman import service_account as _sa


def main():
    module = AnsibleModule(
        argument_spec=dict(
            account=dict(type='str', required=True),
            create=dict(type='bool', default=False),
            subid_count=dict(type='int', default=65536),
            socket=dict(type='str', default='auto', choices=['auto', 'systemd', 'supervised']),
            state=dict(type='str', default='present', choices=['present', 'absent']),
        ),
        supports_check_mode=True,
    )
    params = module.params

    def runner(argv, cwd=None):
        try:
            return module.run_command(argv, cwd=cwd, handle_exceptions=False)
        except OSError as exc:
            return 127, '', str(exc)

    if params['subid_count'] < 1:
        module.fail_json(msg='subid_count must be 1 or more (65536 is what Podman expects). Nothing was changed.')
    run = _sa.ServiceAccount(_sa.Host(runner), params['account'], create=params['create'],
                             subid_count=params['subid_count'], socket_mode=params['socket'],
                             state=params['state'], check_mode=module.check_mode)
    try:
        result = run.apply()
    except _sa.Refusal as exc:
        module.fail_json(msg=str(exc), **run.result)
    except (RuntimeError, OSError) as exc:
        module.fail_json(msg='%s. Done before the failure: %s' % (exc, '; '.join(run.actions) or 'nothing'),
                         **run.result)
    if not module._diff:
        result.pop('diff', None)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
