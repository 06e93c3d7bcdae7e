# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The host-name rules the allowlist and the model endpoints share.

A DNS name is at most 253 characters of labels of at most 63 letters, digits and inner
hyphens, and its last label is not a number; an IPv4 address is strict dotted decimal (four
numbers 0-255, no leading zeros). :func:`name_problem` says which rule a name breaks; each
caller words the refusal for its own file (an allowlist entry may start with a dot, an
endpoint host may not).
"""

from __future__ import annotations

import ipaddress
import re
from typing import List, Optional, Tuple
from urllib.parse import urlsplit

MAX_NAME = 253
MAX_LABEL = 63

LABEL_RE = re.compile(r'^[a-z0-9]([a-z0-9-]*[a-z0-9])?$')
IPV4_RE = re.compile(r'^(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])'
                     r'(\.(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])){3}$')

# Names that reach the host running the proxy.
HOST_NAMES = ('host.docker.internal', 'host.containers.internal')

# Names of cloud metadata services: they serve the machine's own credentials, and the guard refuses
# the addresses they resolve to (169.254.169.254, fd00:ec2::254, 100.100.100.200). The allowlist
# warns about a listed one; a model endpoint that names one is refused. The one definition.
METADATA_NAMES = (
    'metadata.google.internal',     # Google Cloud
    'metadata.goog',                # Google Cloud
    'metadata',                     # Google Cloud's short name (the google.internal search domain)
    'instance-data.ec2.internal',   # AWS
    'metadata.tencentyun.com',      # Tencent Cloud
)

TOO_LONG = 'too-long'
EMPTY_LABEL = 'empty-label'
LONG_LABEL = 'long-label'
BAD_LABEL = 'bad-label'
NUMERIC_LAST = 'numeric-last'
ALL_NUMERIC = 'all-numeric'


def is_ipv4(text: str) -> bool:
    """Strict dotted decimal (what squid and the endpoints contract accept)."""
    return bool(IPV4_RE.match(text))


def has_control_or_space(text: str) -> bool:
    return any(ord(c) <= 32 or ord(c) == 127 for c in text)


def has_non_ascii(text: str) -> bool:
    return any(ord(c) > 127 for c in text)


def name_problem(name: str) -> Optional[Tuple[str, Optional[str]]]:
    """The first rule the DNS name ``name`` (no leading dot; any case) breaks: (code, label) or None.

    ``label`` is the offending label as written for EMPTY_LABEL, LONG_LABEL and BAD_LABEL, else None.
    ALL_NUMERIC is a name of numbers only that is not a strict IPv4 address (1.2.3, 01.2.3.4).
    """
    if len(name) > MAX_NAME:
        return TOO_LONG, None
    labels = name.split('.')
    for label in labels:
        if not label:
            return EMPTY_LABEL, label
        if len(label) > MAX_LABEL:
            return LONG_LABEL, label
        if not LABEL_RE.match(label.lower()):
            return BAD_LABEL, label
    if labels[-1].isdigit():
        return (ALL_NUMERIC if all(label.isdigit() for label in labels) else NUMERIC_LAST), None
    return None


def parent_domains(name: str) -> List[str]:
    """The domains above ``name``, nearest first: ``a.b.c`` -> ``['b.c', 'c']`` (none for one label).

    What squid's ``.domain`` entries are matched against: an entry ``.b.c`` covers ``a.b.c`` because
    ``b.c`` is among them (and covers ``b.c`` itself).
    """
    labels = name.split('.')
    return ['.'.join(labels[i:]) for i in range(1, len(labels))]


def url_address(url: str) -> Optional[Tuple[str, str, int]]:
    """(scheme, host, port) of an http(s) URL, the host lowercased (an IP literal in its short form), the port
    the scheme's default when absent; None when it is not http:// or https:// with a host and a valid port."""
    try:
        parts = urlsplit((url or '').strip())
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    if parts.scheme not in ('http', 'https') or not host:
        return None
    host = host.lower().rstrip('.')
    try:
        host = ipaddress.ip_address(host).compressed
    except ValueError:
        pass
    return parts.scheme, host, port or (443 if parts.scheme == 'https' else 80)
