# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The doctor's decision log line: a summary of the last hour's refusals (top hosts, which jobs, why).

The doctor's own probes (its canary networks and its isolation check's job networks) are refused on
purpose and left out. Pure but for reading the folder through :mod:`_decisions`.
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Optional

from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import decisions as _decisions
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.context import Check, DoctorContext
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.lines import Line
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.names import (
    ISOLATION_NET_PREFIX, NETWORK_PREFIX)

WINDOW = 3600
TOP = 5
READ_FIX = ('ansible-playbook pi_dispatch.egress.decisions -e egress_decisions_verdict=refused '
            '-e egress_decisions_since=1h')


def own_probe(record: Dict[str, Any]) -> bool:
    """True for a request the doctor made itself (its canary network, its isolation check's jobs)."""
    network = record.get('network') or ''
    return network.startswith(NETWORK_PREFIX) or network.startswith(ISOLATION_NET_PREFIX)


def _window_text(window: int) -> str:
    return 'hour' if window == 3600 else ('%d minutes' % (window // 60) if window % 60 == 0 else '%d s' % window)


def _counts(rows: List[Dict[str, Any]]) -> str:
    return ', '.join('%s (%d)' % (row['name'], row['count']) for row in rows) or 'none'


def decisions_line(folder: str, now: Optional[float] = None, window: int = WINDOW, top: int = TOP) -> Line:
    """The ``decisions.*`` line for the log in ``folder`` over the last ``window`` seconds."""
    now = time.time() if now is None else now
    span = _window_text(window)
    if not os.path.lexists(folder):
        return Line('decisions.missing', 'warn',
                    'Decision log: %s does not exist, so no decision of this proxy is recorded' % folder,
                    fix='run site.yml: the proxy role makes the folder (egress_decision_log_dir) and mounts it '
                        '(proxy image and rules from 0.3.0)')
    try:
        log = _decisions.read_log(folder, since=now - window)
        records, problems, files = log.records, log.problems, log.files
    except _decisions.DecisionsError as exc:
        return Line('decisions.unreadable', 'warn', 'Decision log: %s could not be read (%s)' % (folder, exc),
                    fix='name the real folder in egress_decision_log_dir and run site.yml')
    except (IOError, OSError) as exc:
        return Line('decisions.unreadable', 'warn', 'Decision log: %s could not be read (%s)'
                    % (folder, exc.strerror or exc), fix='run the doctor as root (the folder is 0750, uid 13)')
    if log.warnings:
        # a symlink, a FIFO, ... where the proxy writes its files: not read, and said before any count
        return Line('decisions.unreadable', 'warn', 'Decision log: %s could not be read (%s)'
                    % (folder, '; '.join(log.warnings)),
                    fix='remove what is named (the proxy writes regular files only) and find out who made it')
    refused = [r for r in records if r.get('verdict') == 'refused' and not own_probe(r)]
    if not refused:
        return Line('decisions.quiet', 'ok',
                    'Decision log: no job was refused in the last %s (%d decisions read from %d files in %s)'
                    % (span, len(records), len(files), folder))
    summary = _decisions.summarize(refused, top=top)
    unreadable = '; %d unreadable lines' % len(problems) if problems else ''
    reasons = ', '.join('%s %d' % (reason, count) for reason, count in
                        sorted(summary['by_reason'].items(), key=lambda item: (-item[1], str(item[0]))))
    return Line('decisions.refusals', 'warn',
                'Decision log: %d requests refused in the last %s; top hosts: %s; jobs: %s; reasons: %s'
                % (len(refused), span, _counts(summary['refused_hosts']), _counts(summary['refused_jobs']), reasons),
                fix='%s shows each one; a host a job needs goes into egress-allowlist.conf (replayed before it '
                    'applies: site.yml --check --diff)%s' % (READ_FIX, unreadable))


class DecisionsCheck(Check):
    """The decision log line for the folder in ``ctx.decision_log_dir``."""

    def lines(self, ctx: DoctorContext) -> List[Line]:
        return [decisions_line(ctx.decision_log_dir)]
