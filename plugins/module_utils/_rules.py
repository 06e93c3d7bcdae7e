# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The packaged squid rules (``deploy/egress-proxy.conf``).

The text lives here, in module_utils, so that every module that needs the
collection's copy (the deployment layout, the rules refresh, the doctor's
comparison) gets the same bytes on any target host without a file lookup.
``docs/rules.md`` explains each block.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib

RULES_VERSION = 1

# Paths inside the proxy container (contract with the egress_proxy module).
CONTAINER_RULES = '/etc/squid/squid.conf'
CONTAINER_ALLOWLIST = '/etc/pi-dispatch/egress-allowlist.conf'
CONTAINER_ENDPOINTS = '/etc/pi-dispatch/model-endpoints.conf'
PROXY_PORT = 3128

# Addresses that are this host as seen from the proxy: loopback, "this
# network", link-local (cloud metadata, podman's host alias) and
# slirp4netns's host address.
THIS_HOST_NETS = ('127.0.0.0/8', '0.0.0.0/32', '169.254.0.0/16', '10.0.2.2/32',
                  '::1', '::/128', 'fe80::/10')

PACKAGED_RULES = """\
# pi-dispatch egress proxy rules, packaged by the pi_dispatch.egress collection
# (rules version %(version)d). Do not edit: edit egress-allowlist.conf for hosts
# and model-endpoints.json for model servers. A refresh keeps your copy as
# egress-proxy.conf.bak-<UTC timestamp>.

http_port %(port)d

# --- what is asked for -------------------------------------------------------
acl CONNECT method CONNECT
acl pi_port_443 port 443
acl pi_port_80 port 80
# The allowlist, matched as written: no reverse lookup of an IP literal.
acl pi_allowlist dstdomain -n "%(allowlist)s"
# This host's own addresses as the proxy sees them.
acl pi_this_host dst %(this_host)s

# --- cache manager, from inside the proxy container only ----------------------
http_access allow localhost manager
http_access deny manager

# --- precedence ----------------------------------------------------------------
# 1. A listed name that resolves to this host is refused. pi_allowlist is
#    tested first so squid never resolves a name that is not listed.
http_access deny pi_allowlist pi_this_host
# 2. Declared model endpoints: a CONNECT tunnel to exactly their host:port.
include %(endpoints)s
# 3. A CONNECT tunnel only to port 443 of a listed host.
http_access allow CONNECT pi_port_443 pi_allowlist
# 4. A plain (untunnelled) request only to port 80 of a listed host, whatever
#    the scheme squid gateways; so never https:// on 443.
http_access allow !CONNECT pi_port_80 pi_allowlist
# 5. Everything else.
http_access deny all

# --- no cache, no identity leaks ------------------------------------------------
cache deny all
cache_mem 0 MB
forwarded_for delete
httpd_suppress_version_string on

# --- logs to the container's stdout/stderr (docker logs) -------------------------
access_log stdio:/dev/stdout
cache_log stdio:/dev/stderr
logfile_rotate 0
pid_filename /run/squid/squid.pid
coredump_dir /tmp
shutdown_lifetime 2 seconds
pinger_enable off
""" % dict(version=RULES_VERSION, port=PROXY_PORT, allowlist=CONTAINER_ALLOWLIST,
           endpoints=CONTAINER_ENDPOINTS, this_host=' '.join(THIS_HOST_NETS))


def packaged_rules():
    return PACKAGED_RULES


def digest(text):
    if isinstance(text, str):
        text = text.encode('utf-8')
    return hashlib.sha256(text).hexdigest()


def includes_endpoints(text):
    """True when a rules text includes the model-endpoints file (post-#503 shape)."""
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == 'include' and words[1] == CONTAINER_ENDPOINTS:
            return True
    return False
