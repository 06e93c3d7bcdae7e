# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment(object):
    """The options every module that talks to the Docker Engine shares (daemon address, timeout, retries, TLS)."""

    DOCUMENTATION = r'''
options:
  docker_host:
    description:
      - The daemon to talk to, for example C(unix:///var/run/docker.sock) or C(tcp://engine.example:2376).
      - Default the local one, or C(DOCKER_HOST) (and C(DOCKER_TLS_VERIFY), C(DOCKER_CERT_PATH)) when set.
      - Set it once for every module of the collection with C(module_defaults) and the action group
        C(group/pi_dispatch.egress.docker).
    type: str
    aliases: [docker_url]
  docker_timeout:
    description: Seconds an API call may take.
    type: int
    default: 60
  docker_retries:
    description:
      - How many more times a call that decides nothing (the first ping, an inspect or a list) is tried when the
        daemon did not answer or answered 500/502/503/504; the wait grows by a second each time.
      - A call that changes something is never repeated.
    type: int
    default: 2
  tls:
    description: Talk TLS to a C(tcp://) I(docker_host) without checking the daemon's certificate.
    type: bool
    default: false
  validate_certs:
    description: Talk TLS and check the daemon's certificate against I(ca_path).
    type: bool
    default: false
    aliases: [tls_verify]
  ca_path:
    description: The CA that signed the daemon's certificate (docker's C(ca.pem)); I(validate_certs) needs it.
    type: path
    aliases: [ca_cert, tls_ca_cert]
  client_cert:
    description: The client certificate the daemon accepts (docker's C(cert.pem)); goes with I(client_key).
    type: path
    aliases: [tls_client_cert]
  client_key:
    description: The key of I(client_cert) (docker's C(key.pem)).
    type: path
    aliases: [tls_client_key]
requirements:
  - Docker SDK for Python >= 7.0 on the target (the Python that runs the module).
attributes:
  action_group:
    description: Use C(group/pi_dispatch.egress.docker) in C(module_defaults) to set the connection options once.
    support: full
    membership:
      - pi_dispatch.egress.docker
notes:
  - Every daemon failure names the daemon and what to do; a failure caused by a daemon that did not answer returns
    C(retryable=true), and nothing was changed.
'''
