# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""Which hosts a model endpoint may name: :func:`classify_host`.

A DNS name (the shared rules of :mod:`_hostnames`), a strict dotted-decimal IPv4 address or an
IPv6 literal; never the proxy itself (loopback, this-host, slirp4netns's host alias) and never a
cloud metadata address or the name of one (:data:`_hostnames.METADATA_NAMES`, the allowlist's
list). Link-local stays allowed: podman's host.containers.internal is 169.254.1.2.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import hostnames as _hostnames

MAX_NAME = _hostnames.MAX_NAME
MAX_LABEL = _hostnames.MAX_LABEL

# Addresses that inside the proxy are the proxy itself (or, for 10.0.2.2,
# slirp4netns's alias of the host's loopback). Link-local stays allowed:
# podman's host.containers.internal is 169.254.1.2.
REFUSED_V4 = (ipaddress.ip_network('127.0.0.0/8'), ipaddress.ip_network('0.0.0.0/32'),
              ipaddress.ip_network('10.0.2.2/32'))
REFUSED_V6 = (ipaddress.ip_address('::1'), ipaddress.ip_address('::'))

# Cloud metadata services: never a model server, as a literal or as what a name resolves to.
METADATA_ADDRESSES = ('169.254.169.254', '100.100.100.200', 'fd00:ec2::254')


def type_name(value: Any) -> str:
    if value is None:
        return 'null'
    if isinstance(value, bool):
        return 'a boolean'
    if isinstance(value, int):
        return 'an integer'
    if isinstance(value, float):
        return 'a number with a fraction or exponent'
    if isinstance(value, str):
        return 'a string'
    if isinstance(value, list):
        return 'a list'
    if isinstance(value, dict):
        return 'an object'
    return type(value).__name__


# --- host ------------------------------------------------------------------------

class HostRefused(ValueError):
    def __init__(self, rule: str, fix: str) -> None:
        super(HostRefused, self).__init__(rule)
        self.rule = rule
        self.fix = fix


_NO_SELF = ('inside the proxy that is the proxy itself, not your machine',
            'declare the address the proxy dials to reach the server: host.docker.internal on Docker '
            '(server listening on the bridge gateway or 0.0.0.0), host.containers.internal on rootless '
            'Podman, or the LAN name or address of the machine')


_METADATA = ('is a cloud metadata address, which hands out the machine\'s credentials and is never a model '
             'server', 'remove the endpoint, or declare the address the model server really listens on')


def classify_host(host: str) -> Tuple[str, str]:
    """Return (canonical host, kind) for a valid endpoint host, else raise HostRefused.

    kind is ``name``, ``ipv4`` or ``ipv6``. Refuses loopback and this-host
    addresses and names; link-local addresses are allowed.
    """
    if not isinstance(host, str):
        raise HostRefused('must be a string (a DNS name or an IP address), not %s' % type_name(host),
                          'write the host as a JSON string, e.g. "host.docker.internal"')
    if not host:
        raise HostRefused('must not be empty', 'write the DNS name or IP address the proxy dials')
    if _hostnames.has_control_or_space(host):
        raise HostRefused('contains whitespace or a control character', 'write the bare name or address')
    if _hostnames.has_non_ascii(host):
        raise HostRefused('contains a non-ASCII character',
                          'write an internationalised name in its xn-- (punycode) form')
    if '://' in host or '/' in host or '@' in host or '?' in host or '#' in host:
        raise HostRefused('is a URL or has a path, user or query part, not a bare host',
                          'write only the host name or address; the port goes in "port"')
    if host.startswith('['):
        if host.endswith(']'):
            raise HostRefused('is a bracketed IPv6 literal',
                              'write the IPv6 address without brackets (the render adds them)')
        raise HostRefused('is host:port (a bracketed address followed by a port)',
                          'put only the address in "host" (without brackets) and the port in "port"')
    if ':' in host:
        return _classify_ipv6(host)
    lowered = host.lower()
    if lowered.endswith('.'):
        raise HostRefused('ends with a dot', 'remove the trailing dot')
    if _hostnames.is_ipv4(lowered):
        address = ipaddress.IPv4Address(lowered)
        if lowered in METADATA_ADDRESSES:
            raise HostRefused(*_METADATA)
        for net in REFUSED_V4:
            if address in net:
                raise HostRefused('is %s (in %s): %s' % (lowered, net, _NO_SELF[0]), _NO_SELF[1])
        return lowered, 'ipv4'
    problem = _hostnames.name_problem(lowered)
    code, label = problem if problem else (None, None)
    if code == _hostnames.TOO_LONG:
        raise HostRefused('is longer than %d characters' % MAX_NAME, 'no DNS name is that long; check the name')
    if code == _hostnames.EMPTY_LABEL:
        raise HostRefused('has an empty label (a leading dot or two dots in a row)',
                          'write a plain DNS name: no leading dot, no wildcard')
    if code == _hostnames.LONG_LABEL:
        raise HostRefused('has a label longer than %d characters (%s...)' % (MAX_LABEL, label[:12]),
                          'no DNS label is longer than 63 characters; check the name')
    if code == _hostnames.BAD_LABEL:
        raise HostRefused('label %s is not a DNS label (letters, digits and inner hyphens only)'
                          % json.dumps(label), 'write a plain DNS name (no *, _ or other characters)')
    if code == _hostnames.ALL_NUMERIC:
        raise HostRefused('is not a strict dotted-decimal IPv4 address (four numbers 0-255, '
                          'no leading zeros)', 'write the address as four decimal numbers, e.g. 192.168.1.20')
    if code == _hostnames.NUMERIC_LAST:
        raise HostRefused('ends in a numeric label, which no DNS name does',
                          'write a DNS name whose last label is not a number, or an IPv4 address')
    if lowered == 'localhost' or lowered.endswith('.localhost'):
        raise HostRefused('is %s, a loopback name: %s' % (lowered, _NO_SELF[0]), _NO_SELF[1])
    if lowered in _hostnames.METADATA_NAMES:
        raise HostRefused('names a cloud metadata service (%s), which hands out the machine\'s credentials and '
                          'is never a model server; the destination guard refuses its address' % lowered,
                          _METADATA[1])
    return lowered, 'name'


def _classify_ipv6(host: str) -> Tuple[str, str]:
    if '%' in host:
        raise HostRefused('has an IPv6 zone id (a percent sign and an interface after the address)',
                          'write the address without the zone id; the proxy cannot use one')
    if host.count(':') == 1:
        raise HostRefused('is host:port', 'put only the host in "host" and the port in "port"')
    try:
        address = ipaddress.IPv6Address(host)
    except ValueError:
        last = host.rsplit(':', 1)[-1]
        if '.' in host.rsplit(':', 1)[0] and last.isdigit():
            raise HostRefused('is host:port', 'put only the host in "host" and the port in "port"')
        raise HostRefused('is not a valid IPv6 address',
                          'write a valid IPv6 literal, a strict dotted-decimal IPv4 address or a DNS name')
    if address.ipv4_mapped is not None:
        raise HostRefused('is an IPv4-mapped IPv6 address (::ffff:a.b.c.d)',
                          'write the IPv4 address %s itself' % address.ipv4_mapped)
    if address.compressed in METADATA_ADDRESSES:
        raise HostRefused(*_METADATA)
    if address in REFUSED_V6:
        raise HostRefused('is %s: %s' % (address.compressed, _NO_SELF[0]), _NO_SELF[1])
    return address.compressed, 'ipv6'
