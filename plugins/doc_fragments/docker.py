# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    """The options every module that talks to the Docker Engine shares (docker_host, docker_timeout)."""

    DOCUMENTATION = r'''
options:
  docker_host:
    description: The daemon to talk to; default the local one (or C(DOCKER_HOST)).
    type: str
    aliases: [docker_url]
  docker_timeout:
    description: Seconds an API call may take.
    type: int
    default: 60
'''
