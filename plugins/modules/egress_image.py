#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r'''
---
module: egress_image
short_description: Build the egress proxy image (or a probe image) locally, pulling nothing
version_added: 0.1.0
description:
  - Builds an image from a Containerfile given as text, on a base image that is already
    on the daemon, with the build context made in memory and C(pull) off.
  - When the base image is missing and I(base_build=debootstrap), first builds the base
    from the host's configured Debian mirror with C(debootstrap) and imports it, as an
    air-gapped fleet needs.
  - Idempotent by a build hash over the Containerfile, the base image id and the extra
    files, kept in the label C(io.pi-dispatch.egress.build-hash); a second run with the
    same inputs builds nothing.
  - Records the squid version found in the image in the label
    C(io.pi-dispatch.egress.squid-version) when I(squid=true), the squid package version in
    C(io.pi-dispatch.egress.squid-package) and a digest of every installed package in
    C(io.pi-dispatch.egress.packages).
  - When the Containerfile declares C(ARG SECURITY_MIRROR), passes the Debian security archive as the
    build arguments C(SECURITY_MIRROR) and C(SECURITY_SUITE) (C(<base_suite>-security)), the host's own
    security archive from its apt sources, else I(security_mirror). Both are covered by the build hash.
  - I(refresh=true) builds again without the layer cache, so apt fetches what the mirror serves now; when
    the fresh image installs exactly the packages of the current one, the current image is kept.
author:
  - pi-dispatch egress team (@pi-dispatch)
attributes:
  check_mode:
    support: full
    description: Reports whether the base and the image would be built.
  diff_mode:
    support: none
    description: A build has no file diff; the result names the build hash and what changed.
options:
  name:
    description: Tag of the image to build.
    type: str
    required: true
  containerfile:
    description: The Containerfile text. It should start with C(ARG BASE_IMAGE) and C(FROM ${BASE_IMAGE}).
    type: str
    required: true
  files:
    description: Extra files of the build context, name to text.
    type: dict
    default: {}
  base_image:
    description: The base image, passed as build argument C(BASE_IMAGE).
    type: str
    default: pi-dispatch-egress-base:trixie
  base_build:
    description: What to do when the base image is missing.
    type: str
    choices: [none, debootstrap]
    default: none
  base_suite:
    description: Debian suite debootstrap installs (trixie carries squid 6.13).
    type: str
    default: trixie
  mirror:
    description: Debian mirror for debootstrap; by default the one the host's apt sources use.
    type: str
  squid:
    description: Check that the image runs squid and label its version.
    type: bool
    default: true
  security_mirror:
    description:
      - The Debian security archive the image's apt uses when the host's apt sources carry none (an entry
        whose URI is a C(/debian-security) archive or whose suite ends in C(-security) wins, as for the main
        mirror).
      - Unset means C(http://deb.debian.org/debian-security).
      - An empty string leaves the security suite out; the result then carries a warning.
      - Used only when the Containerfile declares C(ARG SECURITY_MIRROR).
    type: str
  unless_present:
    description:
      - An image name. When that image is on the daemon, nothing is built or checked and the result says
        so (C(present_instead)); the doctor role builds its own probe image only when the job image is
        missing.
    type: str
    version_added: 0.2.0
  refresh:
    description:
      - Rebuild without the layer cache even when the build hash matches, so C(apt-get) fetches current
        packages (security updates). When nothing changed, the current image is kept and C(changed) is false.
      - In check mode, reports C(changed) (a refresh cannot be predicted without building).
    type: bool
    default: false
extends_documentation_fragment:
  - pi_dispatch.egress.docker
requirements:
  - debootstrap on the target, when I(base_build=debootstrap) has to build the base
'''

EXAMPLES = r'''
- name: Build the proxy image, building its Debian base from the host's mirror if needed
  pi_dispatch.egress.egress_image:
    name: pi-dispatch-egress-proxy:latest
    containerfile: "{{ lookup('ansible.builtin.file', 'Containerfile') }}"
    base_build: debootstrap
'''

RETURN = r'''
id:
  description: Id of the image (in check mode, of the existing image or null; null when I(unless_present) is there).
  returned: always
  type: str
present_instead:
  description: The I(unless_present) image, found on the daemon, so nothing was built.
  returned: when I(unless_present) is on the daemon
  type: str
  sample: pi-dispatch-job:latest
squid_version:
  description: The squid version found in the image.
  returned: when I(squid=true) and the image exists
  type: str
  sample: "6.13"
squid_package:
  description: The Debian package version of squid in the image (null for an image built before this label).
  returned: when I(squid=true) and the image exists
  type: str
  sample: "6.13-2+deb13u4"
security_mirror:
  description: The security archive the image's apt sources carry (null when it is left out).
  returned: when the Containerfile declares C(ARG SECURITY_MIRROR)
  type: str
  sample: http://deb.debian.org/debian-security
security_source:
  description: Where I(security_mirror) came from (the host's apt sources, the option, the default, or disabled).
  returned: when the Containerfile declares C(ARG SECURITY_MIRROR)
  type: str
refreshed:
  description: Whether a rebuild without the layer cache ran.
  returned: always
  type: bool
packages_changed:
  description: After a refresh, whether the fresh image installs other packages than the current one.
  returned: when I(refresh=true)
  type: bool
base_built:
  description: Whether the base image was built by debootstrap in this run.
  returned: always
  type: bool
mirror:
  description: The mirror debootstrap used (or would use).
  returned: when the base is built
  type: str
build_hash:
  description: The build hash of the inputs.
  returned: always
  type: str
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import image as _image


def main():
    argument_spec = dict(
        name=dict(type='str', required=True),
        containerfile=dict(type='str', required=True),
        files=dict(type='dict', default={}),
        base_image=dict(type='str', default='pi-dispatch-egress-base:trixie'),
        base_build=dict(type='str', default='none', choices=['none', 'debootstrap']),
        base_suite=dict(type='str', default='trixie'),
        mirror=dict(type='str'),
        squid=dict(type='bool', default=True),
        security_mirror=dict(type='str'),
        refresh=dict(type='bool', default=False),
        unless_present=dict(type='str'),
    )
    module = AnsibleModule(argument_spec=dc.argument_spec(argument_spec), supports_check_mode=True)
    result = dict(changed=False, base_built=False, id=None, build_hash=None, refreshed=False)
    buildargs, warning = _image.module_security(module.params, result)
    if warning:
        module.warn(warning)
    client = dc.module_client(module, result)
    try:
        _image.ensure_image(client, module.params, buildargs, result, check_mode=module.check_mode)
    except (_image.ImageError, dc.EngineError) as exc:
        module.fail_json(msg=str(exc), **result)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
