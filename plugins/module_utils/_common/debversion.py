# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""Debian package versions compared the way dpkg compares them.

``[epoch:]upstream[-revision]``: the epoch (a number, 0 when absent) first,
then the upstream version, then the revision (0 when absent). Each part is
compared in alternating runs: a run of non-digits character by character,
where ``~`` sorts before everything (even the end of the string), letters
before every other character; then a run of digits as a number.
"""

from __future__ import annotations

import re
from typing import Tuple

_EPOCH = re.compile(r'^[0-9]+$')
_UPSTREAM = re.compile(r'^[0-9A-Za-z.+~:\-]+$')
_REVISION = re.compile(r'^[0-9A-Za-z.+~]+$')


def parse(version: str) -> Tuple[int, str, str]:
    """(epoch, upstream, revision) of ``version``; ValueError naming it when it is not a Debian version."""
    if not isinstance(version, str) or not version or version != version.strip() or ' ' in version:
        raise ValueError('%r is not a Debian version ([epoch:]upstream[-revision])' % (version,))
    epoch, upstream = 0, version
    if ':' in version:
        head, upstream = version.split(':', 1)
        if not _EPOCH.match(head):
            raise ValueError('%r is not a Debian version: the epoch %r is not a number' % (version, head))
        epoch = int(head)
    revision = '0'
    if '-' in upstream:
        upstream, revision = upstream.rsplit('-', 1)
        if not revision or not _REVISION.match(revision):
            raise ValueError('%r is not a Debian version: the revision %r is empty or has other characters'
                             % (version, revision))
    if not upstream or not _UPSTREAM.match(upstream):
        raise ValueError('%r is not a Debian version: the upstream part %r is empty or has other characters'
                         % (version, upstream))
    return epoch, upstream, revision


def _order(char: str) -> int:
    if char == '~':
        return -1
    if char.isdigit():
        return 0
    if char.isalpha():
        return ord(char)
    return ord(char) + 256


def _verrevcmp(a: str, b: str) -> int:
    i = j = 0
    while i < len(a) or j < len(b):
        first_diff = 0
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ac = _order(a[i]) if i < len(a) else 0
            bc = _order(b[j]) if j < len(b) else 0
            if ac != bc:
                return -1 if ac < bc else 1
            i += 1
            j += 1
        start = i
        while i < len(a) and a[i].isdigit():
            i += 1
        anum = int(a[start:i] or '0')
        start = j
        while j < len(b) and b[j].isdigit():
            j += 1
        bnum = int(b[start:j] or '0')
        if anum != bnum:
            first_diff = -1 if anum < bnum else 1
        if first_diff:
            return first_diff
    return 0


def compare(a: str, b: str) -> int:
    """-1, 0 or 1 as Debian version ``a`` is older than, equal to, or newer than ``b``."""
    ea, ua, ra = parse(a)
    eb, ub, rb = parse(b)
    if ea != eb:
        return -1 if ea < eb else 1
    return _verrevcmp(ua, ub) or _verrevcmp(ra, rb)
