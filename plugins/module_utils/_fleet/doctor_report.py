# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The fleet report of the doctor: every host of the play, its status, its lines, the totals.

Pure: :func:`aggregate` takes the play's hosts, each host's registered ``egress_canary`` result
(None for a host that gave none), the unreachable hosts and a reason per host that failed before
the doctor ran, and returns one row per host (ok, fail, unreachable, not run), an aligned table,
the human report (every host's lines with the doctor's symbols, fixes under warn and fail) and
the totals. Of a result it reads only ``lines`` (already redacted by the doctor), ``msg``,
``failed``, ``unreachable`` and ``skipped``; a reason or ``msg`` goes through
``_redact.redact`` before it is shown. :func:`json_document` and :func:`write_json` are the file
the module writes.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Iterable, List, Optional, Sequence

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import redact as _redact
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.lines import GROUPS, LINES, STATUSES, SYMBOLS

HOST_STATUSES = ('ok', 'fail', 'unreachable', 'not run')
UNREACHABLE = 'unreachable: the play could not connect to this host'
NOT_RUN = 'no doctor result: the play stopped on this host before the doctor ran'
SKIPPED = 'the doctor task was skipped on this host'
OTHER_GROUP = ('other', 'Other checks')
LINE_KEYS = ('id', 'status', 'message', 'fix', 'group')
FIX = "give the host's registered egress_canary result, or null when it gave none"

_GROUP_OF = dict((item[0], item[1]) for item in LINES)
_GROUP_TITLES = dict(GROUPS)


def _text(value: Any) -> str:
    return u'' if value is None else u'%s' % (value,)


def _first_line(text: Any) -> str:
    lines = _text(text).splitlines()
    return lines[0] if lines else u''


def _reason(*candidates: Any) -> Optional[str]:
    """The first candidate that says something, redacted (None when none does)."""
    for value in candidates:
        if value is not None and _text(value).strip():
            return _redact.redact(_text(value).strip())
    return None


def _check_names(hosts: Sequence[str], unreachable: Sequence[str], reasons: Dict[str, Any]) -> None:
    seen = set()
    for index, host in enumerate(hosts):
        if host in seen:
            raise ValueError('hosts[%d] %r is listed twice; give each host of the play once '
                             '(ansible_play_hosts_all)' % (index, host))
        seen.add(host)
    for index, host in enumerate(unreachable):
        if host not in seen:
            raise ValueError('unreachable[%d] %r is not one of hosts; list only hosts of the play' % (index, host))
    for host in sorted(reasons):
        if host not in seen:
            raise ValueError('reasons has a key %r that is not one of hosts; key reasons by the hosts of the play'
                             % (host,))


def _clean_lines(index: int, host: str, lines: Any) -> List[Dict[str, Any]]:
    """The result's lines, checked, with only the keys the report shows."""
    if not isinstance(lines, list):
        raise ValueError('results[%d] (host %s) has lines %r, not a list; %s' % (index, host, lines, FIX))
    clean = []
    for number, line in enumerate(lines):
        if not isinstance(line, dict) or line.get('status') not in STATUSES:
            raise ValueError('results[%d].lines[%d] (host %s) is %r, not a doctor line (a dict with a status of %s); %s'
                             % (index, number, host, line, ', '.join(STATUSES), FIX))
        clean.append(dict((key, line.get(key)) for key in LINE_KEYS if key in line))
    return clean


def host_row(index: int, host: str, result: Any, unreachable: bool = False, reason: Any = None) -> Dict[str, Any]:
    """One host's row: host, status, summary, failed_lines, reason, lines (``index`` names it in errors)."""
    if result is not None and not isinstance(result, dict):
        raise ValueError('results[%d] (host %s) is %r, not a result dict or null; %s' % (index, host, result, FIX))
    result = result or {}
    row = dict(host=host, status=None, summary=dict((status, 0) for status in STATUSES), failed_lines=[],
               reason=None, lines=[])
    if unreachable or result.get('unreachable'):
        row.update(status='unreachable', reason=_reason(reason, result.get('msg'), UNREACHABLE))
    elif 'lines' in result:
        row['lines'] = _clean_lines(index, host, result['lines'])
        for line in row['lines']:
            row['summary'][line['status']] += 1
        row['failed_lines'] = [line.get('id') for line in row['lines'] if line['status'] == 'fail']
        row.update(status='fail' if row['summary']['fail'] else 'ok', reason=_reason(reason))
    elif not result or result.get('failed') or result.get('skipped'):
        row.update(status='not run',
                   reason=_reason(reason, result.get('msg'), SKIPPED if result.get('skipped') else NOT_RUN))
    else:
        raise ValueError('results[%d] (host %s) has no lines and is not a failed, skipped or unreachable task '
                         'result (keys: %s); %s' % (index, host, ', '.join(sorted(result)), FIX))
    return row


def detail(row: Dict[str, Any]) -> str:
    """The table's last column: the first failing line's message (and how many more), or the reason."""
    failing = [line for line in row['lines'] if line['status'] == 'fail']
    if failing:
        text = _first_line(failing[0].get('message'))
        return text + (' (+%d more)' % (len(failing) - 1) if len(failing) > 1 else '')
    return _first_line(row['reason'])


def table(rows: List[Dict[str, Any]]) -> List[str]:
    """``host status ok warn fail notrun detail``, one row per host, aligned (counts ``-`` without lines)."""
    width = max([len('host')] + [len(row['host']) for row in rows])
    status_width = max(len(status) for status in HOST_STATUSES)

    def fmt(host: str, status: str, counts: Sequence[Any], text: str) -> str:
        cells = ['%-*s' % (width, host), '%-*s' % (status_width, status)]
        cells += ['%*s' % (len(name), count) for name, count in zip(STATUSES, counts)]
        return (u'  '.join(cells) + u'  ' + text).rstrip()

    out = [fmt('host', 'status', STATUSES, 'detail')]
    for row in rows:
        ran = row['status'] in ('ok', 'fail')
        out.append(fmt(row['host'], row['status'],
                       [row['summary'][status] if ran else '-' for status in STATUSES], detail(row)))
    return out


def _group(line: Dict[str, Any]) -> str:
    if line.get('group') in _GROUP_TITLES:
        return line['group']
    return _GROUP_OF.get(line.get('id'), OTHER_GROUP[0])


def _counts_text(counts: Dict[str, int]) -> str:
    return u'%d \u2713, %d \u26a0, %d \u2717, %d not run' % (
        counts['ok'], counts['warn'], counts['fail'], counts['notrun'])


def host_lines(row: Dict[str, Any]) -> List[str]:
    """One host in the human report: ``== host: status ==``, then its lines grouped as the doctor prints them."""
    out = [u'== %s: %s ==' % (row['host'], row['status'])]
    if row['reason']:
        out.extend(u'  %s' % text for text in row['reason'].splitlines())
    if row['status'] not in ('ok', 'fail'):
        return out
    for group, title in list(GROUPS) + [OTHER_GROUP]:
        members = [line for line in row['lines'] if _group(line) == group]
        if not members:
            continue
        out.append(u'  %s:' % title)
        for line in members:
            out.append(u'    %s %s' % (SYMBOLS[line['status']], _text(line.get('message'))))
            if line.get('fix') and line['status'] in ('warn', 'fail'):
                out.append(u'        fix: %s' % _text(line['fix']))
    out.append(u'  %d checks: %s' % (len(row['lines']), _counts_text(row['summary'])))
    return out


# Lines that say a host runs the layer with less than it is deployed with, by consent: counted per host.
CONSENTED = (('limits_unenforced', 'proxy.limits_unenforced',
              'the proxy runs without enforced memory and pids limits (rootless on cgroup v1)'),)


def consented_hosts(rows: List[Dict[str, Any]]) -> Dict[str, List[str]]:
    """For each consented weakening (:data:`CONSENTED`), the hosts whose doctor said so, in play order."""
    return dict((key, [row['host'] for row in rows if any(line.get('id') == line_id for line in row['lines'])])
                for key, line_id, _what in CONSENTED)


def totals_of(rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Hosts per status, the lines per status summed over the hosts the doctor ran on, and the hosts per
    consented weakening (``limits_unenforced``)."""
    hosts = dict((status, sum(1 for row in rows if row['status'] == status)) for status in HOST_STATUSES)
    lines = dict((status, sum(row['summary'][status] for row in rows)) for status in STATUSES)
    return dict(hosts=hosts, lines=lines, consented=consented_hosts(rows))


def aggregate(hosts: Sequence[str], results: Sequence[Any], unreachable: Optional[Iterable[str]] = (),
              reasons: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The fleet report of the play's ``hosts`` given ``results`` (same order; None: no result).

    Returns ``table``, ``lines``, ``hosts`` (one row per host), ``totals`` and ``fleet_failed``
    (any host fail, unreachable or not run). Raises ValueError, naming the option and the index,
    on input that does not pair up or is not a doctor result.
    """
    reasons = reasons or {}
    unreachable = list(unreachable or ())
    if len(hosts) != len(results):
        raise ValueError('hosts has %d names but results has %d entries; give one result (or null) per host, '
                         'in the order of hosts' % (len(hosts), len(results)))
    _check_names(hosts, unreachable, reasons)
    rows = [host_row(index, host, result, unreachable=host in unreachable, reason=reasons.get(host))
            for index, (host, result) in enumerate(zip(hosts, results))]
    totals = totals_of(rows)
    text = []
    for row in rows:
        text.extend(host_lines(row))
    text.append(u'%d hosts: %s; %d checks: %s' % (
        len(rows), ', '.join('%d %s' % (totals['hosts'][status], status) for status in HOST_STATUSES),
        sum(totals['lines'].values()), _counts_text(totals['lines'])))
    for key, _line_id, what in CONSENTED:
        if totals['consented'][key]:
            text.append(u'%d of %d hosts: %s: %s' % (len(totals['consented'][key]), len(rows), what,
                                                     ', '.join(totals['consented'][key])))
    return dict(table=table(rows), lines=text, hosts=rows, totals=totals,
                fleet_failed=any(row['status'] != 'ok' for row in rows))


def json_document(report: Dict[str, Any]) -> str:
    """The JSON file: ``{hosts, totals, failed}``, sorted and indented, with a final newline."""
    return json.dumps(dict(hosts=report['hosts'], totals=report['totals'], failed=report['fleet_failed']),
                      indent=2, sort_keys=True) + '\n'


def write_json(path: str, text: str, check_mode: bool = False) -> bool:
    """Write ``text`` to ``path`` unless it is there already; True when it changed (check mode: would)."""
    try:
        with open(path) as handle:
            changed = handle.read() != text
    except (IOError, OSError, ValueError):  # missing, unreadable or not text: write it
        changed = True
    if changed and not check_mode:
        with open(path, 'w') as handle:
            handle.write(text)
    return changed
