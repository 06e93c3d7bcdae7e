# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The fleet summary of an upgrade: every host of the play in one group, one line, one JSON row.

Pure: :func:`summarize` takes the play's hosts and each host's ``egress_upgrade_report`` (None
for a host the play did not reach) and returns the groups (the text the upgrade has always
printed), one line per reached host, a table and JSON rows with each host's outcome.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

GROUPS = ('refreshed', 'restarted', 'started', 'created', 'replaced', 'rolled back', 'refused', 'failed',
          'left alone', 'not reached')
STEP_GROUPS = {'restart': 'restarted', 'unpause+restart': 'restarted', 'start': 'started', 'create': 'created',
               'replace': 'replaced'}
NOT_REACHED = 'not reached (the play stopped before this host, or it was unreachable)'
OUTCOMES = ('upgraded', 'unchanged', 'rolled back', 'refused', 'failed', 'not reached')


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ('true', 'yes', '1', 'on')
    return bool(value)


def groups_of(report: Optional[Dict[str, Any]]) -> List[str]:
    """The summary groups one host's report puts it in (a refreshed host may also be restarted)."""
    if report is None:
        return ['not reached']
    if _truthy(report.get('rolled_back')):
        return ['rolled back']
    if _truthy(report.get('refused')):
        return ['refused']
    if _truthy(report.get('failed')):
        return ['failed']
    found = ['refreshed'] if _truthy(report.get('refreshed')) else []
    step = STEP_GROUPS.get(report.get('proxy_step'))
    if step:
        found.append(step)
    elif not found:
        found.append('left alone')
    return found


def outcome_of(report: Optional[Dict[str, Any]]) -> str:
    """One word per host for the table: upgraded, unchanged, rolled back, refused, failed, not reached."""
    first = groups_of(report)[0]
    if first in ('rolled back', 'refused', 'failed', 'not reached'):
        return first
    return 'unchanged' if first == 'left alone' else 'upgraded'


def host_line(host: str, report: Dict[str, Any], check_mode: bool = False) -> str:
    message = (report.get('message') or '').splitlines()
    line = '%s: %s%s - %s' % (host, report.get('action'), ' (check mode)' if check_mode else '',
                              message[0] if message else '')
    if report.get('backup'):
        line += ' Backup: %s' % report['backup']
    return line


def summarize(hosts: Sequence[str], reports: Sequence[Optional[Dict[str, Any]]],
              check_mode: bool = False) -> Dict[str, Any]:
    """Summary of the play's ``hosts`` given ``reports`` (same order; None: not reached)."""
    if len(hosts) != len(reports):
        raise ValueError('hosts has %d names but reports has %d entries; give one report (or null) per host'
                         % (len(hosts), len(reports)))
    grouped = dict((name, []) for name in GROUPS)
    lines, rows = [], []
    for host, report in zip(hosts, reports):
        for name in groups_of(report):
            grouped[name].append(host)
        if report is not None:
            lines.append(host_line(host, report, check_mode))
        rows.append(dict(host=host, outcome=outcome_of(report),
                         action=report.get('action') if report else None,
                         proxy_step=report.get('proxy_step') if report else None,
                         backup=report.get('backup') if report else None,
                         jobs_cut=int(report.get('jobs_cut') or 0) if report else 0,
                         message=(report.get('message') or '') if report else NOT_REACHED))
    text = ['%s: %s' % (name, ', '.join(grouped[name]) if grouped[name] else '-') for name in GROUPS] + lines
    width = max([len('host')] + [len(row['host']) for row in rows])
    table = ['%-*s  %-11s  %s' % (width, 'host', 'outcome', 'action')]
    table += ['%-*s  %-11s  %s' % (width, row['host'], row['outcome'], row['action'] or '-') for row in rows]
    totals = dict((outcome, sum(1 for row in rows if row['outcome'] == outcome)) for outcome in OUTCOMES)
    return dict(groups=grouped, lines=text, table=table, hosts=rows, totals=totals)
