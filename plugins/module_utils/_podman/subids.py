# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""A service account's subordinate id ranges (``/etc/subuid``, ``/etc/subgid``): the parse and the allocation.

Pure: the files' text in, the plan out (keep a range, or the line to add), or a :class:`Refusal` naming the
file, the line and the fix. ``service_account`` reads and writes the files.
"""

from __future__ import annotations

from typing import Any, Dict, List

SUBID_FILES = ('/etc/subuid', '/etc/subgid')
FIRST_SUBID = 100000


class Refusal(ValueError):
    """Refused before anything changed: the message names the account or file, the line, and the fix."""


class Range(object):
    """One line of /etc/subuid or /etc/subgid."""

    __slots__ = ('path', 'line', 'owner', 'start', 'count')

    def __init__(self, path: str, line: int, owner: str, start: int, count: int) -> None:
        self.path, self.line, self.owner, self.start, self.count = path, line, owner, start, count

    @property
    def end(self) -> int:
        return self.start + self.count

    def text(self) -> str:
        return '%s:%d:%d' % (self.owner, self.start, self.count)

    def as_dict(self) -> Dict[str, Any]:
        return dict(path=self.path, line=self.line, owner=self.owner, start=self.start, count=self.count)

    def __repr__(self) -> str:
        return 'Range(%r, %d, %r)' % (self.path, self.line, self.text())


def parse_subids(text: str, path: str) -> List[Range]:
    """The ranges of a subuid/subgid file; a line that is not ``owner:start:count`` is refused by number."""
    ranges = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith('#'):
            continue
        parts = line.split(':')
        if (len(parts) != 3 or not parts[0] or not parts[1].isdigit() or not parts[2].isdigit()
                or int(parts[2]) == 0):
            raise Refusal('%s line %d is not `account:start:count` (%r): fix or delete that line (man subuid), then '
                          'run again. Nothing was changed.' % (path, number, raw[:80]))
        ranges.append(Range(path, number, parts[0], int(parts[1]), int(parts[2])))
    return ranges


def _overlaps(a: Range, b: Range) -> bool:
    return a.start < b.end and b.start < a.end


def plan_subids(texts: Dict[str, str], account: str, uid: int, count: int) -> Dict[str, Dict[str, Any]]:
    """Per file (in ``texts``' order): ``{'keep': Range}`` or ``{'add': 'account:start:count'}``; else Refusal.

    The account's lines are those naming it or its uid. One of them must hold ``count`` ids and none may
    overlap another account's range in the same file. A file without any gets the first ``count`` ids after
    every range of every file (both files get the same start), never below :data:`FIRST_SUBID`.
    """
    parsed = dict((path, parse_subids(text, path)) for path, text in texts.items())
    names = (account, str(uid))
    plan = {}
    for path, ranges in parsed.items():
        own = [r for r in ranges if r.owner in names]
        others = [r for r in ranges if r.owner not in names]
        for mine in own:
            for other in others:
                if _overlaps(mine, other):
                    raise Refusal(
                        '%s line %d (%s) overlaps line %d (%s): two accounts would share the same subordinate ids, '
                        'so one could reach the other\'s container files. Delete line %d and run again (this module '
                        'then adds the first free range), or give it a range no other line holds. Nothing was '
                        'changed.' % (path, mine.line, mine.text(), other.line, other.text(), mine.line))
        if not own:
            plan[path] = {}
            continue
        big = [r for r in own if r.count >= count]
        if not big:
            small = own[0]
            raise Refusal(
                '%s line %d (%s) gives %s %d ids; rootless Podman here needs %d (subid_count). Make that line '
                '`%s:<start>:%d` with ids no other line holds, or delete it and run again (this module then adds '
                'the first free range), then run `podman system migrate` as %s. Nothing was changed.'
                % (path, small.line, small.text(), account, small.count, count, account, count, account))
        plan[path] = {'keep': big[0]}
    start = FIRST_SUBID
    for ranges in parsed.values():
        for r in ranges:
            start = max(start, r.end)
    for path in plan:
        if not plan[path]:
            plan[path] = {'add': '%s:%d:%d' % (account, start, count)}
    return plan
