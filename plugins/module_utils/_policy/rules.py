# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The packaged squid rules (``deploy/egress-proxy.conf``).

The text lives here, in module_utils, so that every module that needs the
collection's copy (the deployment layout, the rules refresh, the doctor's
comparison) gets the same bytes on any target host without a file lookup.
``docs/rules.md`` explains each block.
"""

from __future__ import annotations

import hashlib
from typing import List, Union

RULES_VERSION = 3

# Paths inside the proxy container (contract with the egress_proxy module).
CONTAINER_RULES = '/etc/squid/squid.conf'
CONTAINER_ALLOWLIST = '/etc/pi-dispatch/egress-allowlist.conf'
CONTAINER_ENDPOINTS = '/etc/pi-dispatch/model-endpoints.conf'
CONTAINER_GUARD = '/etc/pi-dispatch/egress-guard.conf'
PROXY_PORT = 3128
# The decision log's folder (a host folder the proxy and its shards mount read-write).
CONTAINER_DECISION_LOG_DIR = '/var/log/pi-dispatch'
# The decision log's record of the proxy's squid, which the image's decision-log program reads (the TLS
# name check's, in peek.conf, has the same fields): v1, the source, time, client address and port, method,
# host, port, SNI (none here), reason, stage, status, squid status, bytes each way, ms, error, bump mode and
# the job's address (none here). Never the URL's path or query, never a header value.
DECISION_FORMAT = ('v1 proxy %ts.%03tu %#>a %>p %#rm %#>rd %>rP - %#{pi_reason}note %#{pi_stage}note %>Hs %#Ss '
                   '%>st %<st %tr %#err_code - -')
# The TLS name check the image runs beside squid (roles/proxy/files/peek.conf), loopback only.
PEEK_PORT = 3129

# The includes each rules version needs mounted, in the order they appear.
INCLUDES = (CONTAINER_GUARD, CONTAINER_ENDPOINTS)

PACKAGED_RULES = """\
# pi-dispatch egress proxy rules, packaged by the pi_dispatch.egress collection
# (rules version %(version)d). Do not edit: edit egress-allowlist.conf for hosts
# and model-endpoints.json for model servers; egress-guard.conf is rendered from
# the role variables. A refresh keeps your copy as
# egress-proxy.conf.bak-<UTC timestamp>.

http_port %(port)d

# --- what is asked for -------------------------------------------------------
acl CONNECT method CONNECT
acl pi_port_443 port 443
acl pi_port_80 port 80
# Jobs are named by their IPv4 address on their job network (the job-network API makes IPv4
# networks); http_port listens on IPv6 too, so a client from an IPv6 address (a link-local fe80::)
# would be a client no job names, with a connection allowance of its own (issue 42).
acl pi_ipv6_client src ipv6
# A CONNECT authority squid can read back as name:port or [v6]:port (issue 42). squid 6.13
# parses the request target before any ACL sees it (h:0443, h:443:1, h: and h all become h:443);
# what its parse leaves behind (a '[', '@', '_', an edge hyphen, a zone id) is refused here.
acl pi_authority url_regex -i ^([a-z0-9]([a-z0-9-]*[a-z0-9])?\\.)*[a-z0-9]([a-z0-9-]*[a-z0-9])?:[1-9][0-9]*$
acl pi_authority url_regex -i ^\\[[0-9a-f:.]+\\]:[1-9][0-9]*$
# The allowlist, matched as written: no reverse lookup of an IP literal.
acl pi_allowlist dstdomain -n "%(allowlist)s"
# The destination guard (pi_guard: the addresses a listed name must never lead
# to) and the per-client connection bound (pi_client_conns), rendered.
include %(guard)s

# --- the decision log: why each request was decided ---------------------------
# Each of these always matches and records a reason on the transaction; each is
# the last ACL of its line, so it marks only the line that decided.
acl pi_r_manager annotate_transaction pi_reason=manager
acl pi_r_ipv6_client annotate_transaction pi_reason=ipv6_client
acl pi_r_authority annotate_transaction pi_reason=authority
acl pi_r_conn_limit annotate_transaction pi_reason=conn_limit
acl pi_r_guard annotate_transaction pi_reason=guard
acl pi_r_listed annotate_transaction pi_reason=listed
acl pi_r_checked annotate_transaction pi_stage=checked
acl pi_r_plain_https annotate_transaction pi_reason=plain_https
acl pi_r_port annotate_transaction pi_reason=port
acl pi_r_unlisted annotate_transaction pi_reason=unlisted

# --- cache manager, from inside the proxy container only ----------------------
http_access allow localhost manager
http_access deny manager pi_r_manager

# --- precedence ----------------------------------------------------------------
# 0. A client from an IPv6 address (but the container's own loopback) is refused:
#    jobs reach the proxy over IPv4, where their job network names them.
http_access deny pi_ipv6_client !localhost pi_r_ipv6_client
#    A CONNECT whose authority is not a DNS name, IPv4 address or bracketed IPv6
#    address with a port is refused before any policy.
http_access deny CONNECT !pi_authority pi_r_authority
# 1. A client that already holds too many connections is refused.
http_access deny pi_client_conns pi_r_conn_limit
# 2. Declared model endpoints: a CONNECT tunnel to exactly their host:port.
include %(endpoints)s
# 3. The destination guard: a listed name (or listed IP literal) that resolves
#    to another job, a gateway of this host, the host itself or a private range
#    nobody opened is refused. pi_allowlist is tested first, so squid never
#    resolves a name that is not listed.
http_access deny pi_allowlist pi_guard pi_r_guard
# 4. A CONNECT tunnel only to port 443 of a listed host (then the TLS name check).
http_access allow CONNECT pi_port_443 pi_allowlist pi_r_listed pi_r_checked
# 5. A plain (untunnelled) request only to port 80 of a listed host, whatever
#    the scheme squid gateways; so never https:// on 443.
http_access allow !CONNECT pi_port_80 pi_allowlist pi_r_listed
# 6. Everything else: a listed host asked for in plain on 443, a listed host on
#    another port, a host that is not listed.
http_access deny !CONNECT pi_port_443 pi_allowlist pi_r_plain_https
http_access deny pi_allowlist pi_r_port
http_access deny all pi_r_unlisted

# --- every tunnel to port 443 goes through the TLS name check -------------------------
# A second squid in this container (127.0.0.1:%(peek_port)d, the image's peek.conf) peeks at the
# client's TLS ClientHello and passes the tunnel through only when its SNI names the CONNECT's host
# (or there is none and the host is a listed IP literal); any other hello, and anything that is not
# TLS, is cut, and nothing reaches the upstream. It never terminates TLS. What is refused above is
# refused here, with squid's 403, before the check is involved.
cache_peer 127.0.0.1 parent %(peek_port)d 0 no-query no-digest no-netdb-exchange name=pi_tls_check
cache_peer_access pi_tls_check allow CONNECT pi_port_443
cache_peer_access pi_tls_check deny all
never_direct allow CONNECT pi_port_443
# The check logs the job's address, which this squid tells it (a job's own header of that name is
# dropped first).
request_header_access X-Pi-Client deny all
request_header_add X-Pi-Client "%%>a" CONNECT pi_port_443

# --- no cache, no identity leaks ------------------------------------------------
cache deny all
cache_mem 0 MB
forwarded_for delete
httpd_suppress_version_string on

# --- the decision log -------------------------------------------------------------
# One JSON line per decision (docs/decisions.md): the image's decision-log program writes
# /var/log/pi-dispatch/<container>.decisions.jsonl, the host folder the proxy mounts there
# (egress_decision_log_dir), and rotates it by size. A tunnel the TLS name check passed is logged
# by the check, with its SNI; the container's own health check is not logged.
logformat pi_decision %(decision_format)s
logfile_daemon /usr/lib/pi-dispatch/decision-logd
acl pi_stage_checked note pi_stage checked
acl pi_status_200 http_status 200
acl pi_logged_by_check all-of pi_stage_checked pi_status_200
acl pi_health all-of localhost manager
access_log daemon:%(log_dir)s/decisions.jsonl logformat=pi_decision !pi_logged_by_check !pi_health

# --- nothing written to the (read-only) image ------------------------------------
access_log stdio:/dev/stdout
cache_log stdio:/dev/stderr
logfile_rotate 0
pid_filename /run/squid/squid.pid
coredump_dir /tmp
netdb_filename none
shutdown_lifetime 2 seconds
pinger_enable off
""" % dict(version=RULES_VERSION, port=PROXY_PORT, allowlist=CONTAINER_ALLOWLIST,
           endpoints=CONTAINER_ENDPOINTS, guard=CONTAINER_GUARD, peek_port=PEEK_PORT,
           log_dir=CONTAINER_DECISION_LOG_DIR, decision_format=DECISION_FORMAT)


def packaged_rules() -> str:
    return PACKAGED_RULES


def digest(text: Union[str, bytes]) -> str:
    if isinstance(text, str):
        text = text.encode('utf-8')
    return hashlib.sha256(text).hexdigest()


def included(text: str) -> List[str]:
    """The container paths a rules text includes, in order."""
    found = []
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == 'include':
            found.append(words[1])
    return found


def includes_endpoints(text: str) -> bool:
    """True when a rules text includes the model-endpoints file (post-#503 shape)."""
    return CONTAINER_ENDPOINTS in included(text)


def checks_tls_names(text: str) -> bool:
    """True when a rules text sends tunnels to 443 through the TLS name check (rules version 3)."""
    return any(line.split()[:2] == ['cache_peer', '127.0.0.1'] and str(PEEK_PORT) in line.split()
               for line in text.splitlines() if line.strip())


def writes_decision_log(text: str) -> bool:
    """True when a rules text hands its decisions to the decision log (rules version 3, from 0.3.0)."""
    marker = 'daemon:%s/' % CONTAINER_DECISION_LOG_DIR
    return any(line.split()[:1] == ['access_log'] and marker in line for line in text.splitlines())


def includes_guard(text: str) -> bool:
    """True when a rules text includes the destination guard (rules version 2)."""
    return CONTAINER_GUARD in included(text)
