# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The credential interceptor beside the proxy (docs/credentials.md): the TLS name check's include that
routes bound hosts through it, and the interceptor container's wanted shape.

The chain, for a tunnel to a host a credential is bound to::

    job ──CONNECT──► squid :3128 (allowlist, guard, per-client bound)
                     └─► TLS name check :3129 (peeks: SNI = CONNECT host) ──► interceptor :8080
                                                                              (swap, refuse, redact)
    interceptor ──CONNECT──► TLS name check :3130 (only from the interceptor's network, only bound
                             hosts; the guard and the SNI check again) ──► the bound host

Every other tunnel is unchanged: the TLS name check splices it straight to its host, never terminated.
The include is rendered into the deployment folder and mounted over the image's empty copy (the proxy
mounts it only when a credential is declared, so a deployment that declares none is unchanged).
Pure logic, no engine call.
"""

from __future__ import annotations

import ipaddress
import os
from typing import Any, Dict, Iterable, List

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import credentials as _credentials
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import spec as _spec

INTERCEPTOR_NAME = 'pi-dispatch-egress-interceptor'
INTERCEPTOR_IMAGE = 'pi-dispatch-egress-interceptor:latest'
# The network only the proxy and the interceptor are on (--internal: the interceptor reaches nothing but
# the proxy, so every byte it sends out passes the TLS name check again).
NETWORK = _spec.CREDENTIALS_NETWORK
INTERCEPTOR_PORT = 8080
# The TLS name check's port for the interceptor's own way out.
RETURN_PORT = 3130
INCLUDE_NAME = 'egress-credentials.conf'
# Inside the interceptor container.
CONFIG_DIR = '/etc/pi-interceptor'
JOBS_DIR = '/run/pi-interceptor/jobs'
CA_DIR = '/var/lib/pi-interceptor'
CA_CERT = 'mitmproxy-ca-cert.pem'
LABEL_ROLE = 'io.pi-dispatch.egress.role'
# The container's bounds, like the proxy's: memory (mitmproxy buffers a request body of at most 32 MiB, and a
# bound host's response, to scan and redact them; a flood of them ends in a refusal, not in the host's
# memory) and processes.
MEMORY = 1024 ** 3
PIDS_LIMIT = 256
ROLE = 'interceptor'

# As the TLS name check's own port (peek.conf): peek, splice or cut; never a certificate shown.
RETURN_PORT_OPTIONS = 'ssl-bump tls-cert=/etc/squid/pi-peek.pem generate-host-certificates=off name=pi_from_interceptor'
# The TLS name check's helper that tags a client connection with the job's address (roles/proxy/files/client-tag):
# never cached (ttl=0), so each tunnel is tagged by its own CONNECT.
CLIENT_TAG_HELPER = ('ttl=0 negative_ttl=0 children-startup=1 children-max=8 %{X-Pi-Client}>h '
                     '/usr/bin/perl /usr/lib/pi-dispatch/client-tag')
INCLUDE_HEADER = """\
# pi-dispatch credential placeholders, rendered from egress-credentials.json by the pi_dispatch.egress
# collection (docs/credentials.md). Do not edit. The TLS name check (peek.conf) includes this file: it
# sends each tunnel to a host a credential is bound to through the credential interceptor, and opens a
# port for the interceptor's own way out, from its network only, to the bound hosts only.
"""


def _acl_hosts(hosts: Iterable[str]) -> List[str]:
    return sorted(set(h.lower() for h in hosts))


def render_include(bound_hosts: Iterable[str], network_subnet: str, interceptor_host: str = INTERCEPTOR_NAME,
                   interceptor_port: int = INTERCEPTOR_PORT, return_port: int = RETURN_PORT) -> str:
    """The TLS name check's include for ``bound_hosts`` (exact names), given the interceptor network's subnet.

    With no bound host the include is the header alone: nothing is routed, no port is opened.
    """
    hosts = _acl_hosts(bound_hosts)
    out = [INCLUDE_HEADER]
    if not hosts:
        out.append('# No credential is declared: every tunnel is spliced, as without this file.\n')
        return ''.join(out)
    subnet = ipaddress.ip_network(network_subnet, strict=True)
    out.append("""
# The interceptor's way out: its tunnels arrive here, are peeked and checked like any other, and go
# straight to the bound host (never back to the interceptor).
http_port %(return_port)d %(port_options)s
acl pi_interceptor_port myportname pi_from_interceptor
acl pi_interceptor_net src %(subnet)s
acl pi_bound_hosts dstdomain %(hosts)s
http_access deny pi_interceptor_port !pi_interceptor_net
http_access allow pi_interceptor_port CONNECT pi_port_443 pi_bound_hosts
http_access deny pi_interceptor_port

# A job's tunnel to a bound host, once its SNI named that host: through the interceptor.
cache_peer %(host)s parent %(port)d 0 no-query no-digest no-netdb-exchange name=pi_interceptor
cache_peer_access pi_interceptor allow pi_bound_hosts !pi_interceptor_port
cache_peer_access pi_interceptor deny all
never_direct allow pi_bound_hosts !pi_interceptor_port

# The job's address, carried to the interceptor: the proxy's squid names the job in X-Pi-Client on its
# CONNECT, but the tunnel this squid opens to the interceptor after peeking is a new request without it.
# client-tag tags this client connection with the address (clt_conn_tag; an IP literal or nothing), and
# the CONNECT to the interceptor carries the tag again. The line only asks: it never matches ("!all").
external_acl_type pi_client_tag %(client_tag)s
acl pi_client_tagged external pi_client_tag
http_access deny pi_from_front CONNECT pi_bound_hosts pi_client_tagged !all
request_header_add X-Pi-Client "%%{clt_conn_tag}note" pi_bound_hosts !pi_interceptor_port
""" % dict(return_port=int(return_port), port_options=RETURN_PORT_OPTIONS, subnet=subnet, hosts=' '.join(hosts),
           host=interceptor_host, port=int(interceptor_port), client_tag=CLIENT_TAG_HELPER))
    return ''.join(out)


def secret_mounts(secret_files: Iterable[str]) -> Dict[str, Dict[str, str]]:
    """{host folder: bind}: each secret file's folder, once, read-only (``credentials.secret_folder_in_container``)."""
    return dict((folder, {'bind': _credentials.secret_folder_in_container(folder), 'mode': 'ro'})
                for folder in sorted(set(os.path.dirname(path) for path in secret_files)))


def container_kwargs(image: str, config_dir: str, jobs_dir: str, ca_dir: str, secret_files: Iterable[str],
                     upstream: str, name: str = INTERCEPTOR_NAME, network: str = NETWORK,
                     upstream_ca: bool = False) -> Dict[str, Any]:
    """docker-py ``containers.run`` keyword arguments of the hardened interceptor.

    User 0 with no capability (it reads the root-only secret files as their owner and can override
    nothing), no new privileges, a read-only root, a small /tmp; the configuration, the secrets' folders
    and the jobs' records read-only; only the CA folder writable (mitmproxy makes the CA there once).
    Memory (no swap beyond it) and processes are bounded (:data:`MEMORY`, :data:`PIDS_LIMIT`).
    """
    volumes = {config_dir: {'bind': CONFIG_DIR, 'mode': 'ro'},
               jobs_dir: {'bind': JOBS_DIR, 'mode': 'ro'},
               ca_dir: {'bind': CA_DIR, 'mode': 'rw'}}
    volumes.update(secret_mounts(secret_files))
    environment = {'PI_INTERCEPTOR_UPSTREAM': upstream}
    if upstream_ca:
        environment['PI_INTERCEPTOR_UPSTREAM_CA'] = CONFIG_DIR + '/upstream-ca.pem'
    return dict(image=image, name=name, detach=True, network=network, user='0:0', cap_drop=['ALL'],
                security_opt=['no-new-privileges:true'], read_only=True,
                tmpfs={'/tmp': 'rw,noexec,nosuid,nodev,size=16m'}, environment=environment, volumes=volumes,
                mem_limit=MEMORY, memswap_limit=MEMORY, pids_limit=PIDS_LIMIT,
                labels={LABEL_ROLE: ROLE}, restart_policy={'Name': 'unless-stopped'})
