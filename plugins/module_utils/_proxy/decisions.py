# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The decision log: reading it, counting it, and replaying it against a candidate allowlist.

The proxy and each of its shards write one JSON line per decision into a host folder
(``<deploy_dir>/decisions`` by default; the image's decision-log program, docs/decisions.md):
``<container>.decisions.jsonl`` for what the proxy's squid decided and
``<container>.tls-decisions.jsonl`` for what the TLS name check decided, each rotated by size into
``.1`` ... ``.N``. Everything here is pure except :func:`log_files` and :func:`read_records`, which
only read.
"""

from __future__ import annotations

import calendar
import errno
import gc
import json
import os
import re
import stat
import time
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy.hostnames import parent_domains

DEFAULT_FOLDER = 'decisions'

# verdict "allowed" for these reasons, "refused" for every other
ALLOWED_REASONS = ('listed', 'endpoint', 'sni_ok', 'ip_literal')
REASONS = {
    'listed': 'the host is on the allowlist (plain HTTP to port 80, or a CONNECT to 443 before the TLS name check)',
    'endpoint': 'a declared model endpoint, its exact host and port',
    'sni_ok': 'a tunnel to 443 whose TLS SNI names the CONNECT host',
    'ip_literal': 'a tunnel to 443 of a listed IP literal, with no SNI',
    'unlisted': 'the host is not on the allowlist',
    'port': 'the host is listed, the port is not 443 for a tunnel or 80 for plain HTTP',
    'plain_https': 'a plain (untunnelled) request to port 443 of a listed host',
    'guard': 'the host resolves into a range the destination guard refuses',
    'conn_limit': 'the client already holds its maximum number of connections',
    'authority': "a CONNECT whose authority is not name:port or [ipv6]:port after squid's parse",
    'ipv6_client': 'a client that came from an IPv6 address; jobs reach the proxy over IPv4',
    'sni_mismatch': 'the TLS SNI names another host than the CONNECT (domain fronting)',
    'no_sni': 'a TLS hello without SNI to a name (only a listed IP literal may omit it)',
    'not_tls': 'the bytes in a tunnel to 443 are not TLS',
    'manager': "squid's cache manager, asked from outside the proxy",
    'tls_check_unavailable': 'the TLS name check did not answer',
    'invalid': 'a request squid could not parse',
    'way_out': "a tunnel on the interceptor's way out (port 3130) from outside its network, or to a host no "
               'credential is bound to',
    'other': 'refused before any rule decided',
}
# the reasons an allowlist decides, which a replay judges again
ALLOWLIST_REASONS = ('listed', 'sni_ok', 'ip_literal', 'unlisted', 'port', 'plain_https')
VERDICTS = ('allowed', 'refused')

_FILE_RE = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.-]*\.jsonl(?:\.[0-9]{1,3})?\Z')
_TIME_RE = re.compile(r'^(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?Z?\Z')
_SPAN_RE = re.compile(r'^(\d+)\s*([smhd])\Z')
_SPAN_UNITS = dict(s=1, m=60, h=3600, d=86400)


class DecisionsError(ValueError):
    """Bad input (a folder, a time, a filter): nothing was read."""


class UnsafeFile(DecisionsError):
    """A path that is not a regular file (a symlink, a FIFO, a socket, a device, a folder): not read."""


# never follow a link, never wait on a FIFO's writer, never leak the descriptor into a child
_OPEN_FLAGS = os.O_RDONLY | getattr(os, 'O_NOFOLLOW', 0) | getattr(os, 'O_NONBLOCK', 0) | getattr(os, 'O_CLOEXEC', 0)
_KINDS = ((stat.S_ISLNK, 'a symlink'), (stat.S_ISFIFO, 'a FIFO'), (stat.S_ISSOCK, 'a socket'),
          (stat.S_ISCHR, 'a device'), (stat.S_ISBLK, 'a device'), (stat.S_ISDIR, 'a folder'))


def _kind(mode: int) -> str:
    for test, kind in _KINDS:
        if test(mode):
            return kind
    return 'not a regular file'


def _unsafe(path: str, kind: str, log: bool) -> UnsafeFile:
    if log:
        return UnsafeFile('%s is %s, not a file the proxy writes, and was not read (never followed or waited on): '
                          'remove it (rm %s) and find out who made it; only root and the proxy user (uid 13) may '
                          'write in this folder' % (path, kind, path))
    return UnsafeFile('%s is %s, not a regular file; name the real file. Nothing was read' % (path, kind))


def open_regular(path: str, dir_fd: Optional[int] = None, log: bool = False, shown: Optional[str] = None) -> Any:
    """A binary read handle on ``path``, which must be a regular file: opened with no link following and
    without waiting (O_NOFOLLOW|O_NONBLOCK), then fstat'ed, so a symlink swapped in after a listing or a FIFO
    is refused (:class:`UnsafeFile` naming the file and the fix), never read or waited on. ``dir_fd``: the
    path is relative to that folder, and ``shown`` names it in a message. ``log``: the message is a decision
    log file's."""
    shown = shown or path
    try:
        fd = os.open(path, _OPEN_FLAGS, dir_fd=dir_fd) if dir_fd is not None else os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):   # EMLINK: a link under O_NOFOLLOW on some BSDs
            raise _unsafe(shown, 'a symlink', log)
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _unsafe(shown, _kind(info.st_mode), log)
        handle = os.fdopen(fd, 'rb')
    except BaseException:
        os.close(fd)
        raise
    return handle


def read_text(path: str, what: str) -> str:
    """The text of a file an operator names (an allowlist): a regular file only (:func:`open_regular`).
    DecisionsError naming ``what`` and the fix otherwise; OSError when it cannot be read."""
    try:
        with open_regular(path) as handle:
            return handle.read().decode('utf-8', 'replace')
    except UnsafeFile as exc:
        raise DecisionsError('%s (%s)' % (exc, what))


def parse_time(text: Optional[Union[str, int, float]], now: Optional[float] = None,
               key: str = 'since') -> Optional[float]:
    """Epoch seconds of ``text``: an ISO 8601 UTC time (2026-12-05T21:00:00Z), epoch seconds, or a span
    back from ``now`` ('90s', '30m', '1h', '7d'). None stays None. DecisionsError names ``key``."""
    if text in (None, ''):
        return None
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    value = str(text).strip()
    span = _SPAN_RE.match(value)
    if span:
        return (time.time() if now is None else now) - int(span.group(1)) * _SPAN_UNITS[span.group(2)]
    if re.match(r'^\d+(\.\d+)?\Z', value):
        return float(value)
    match = _TIME_RE.match(value)
    if match:
        parts = [int(p) for p in match.groups()[:6]]
        frac = match.group(7) or '0'
        try:
            return calendar.timegm(tuple(parts) + (0, 0, 0)) + float('0.' + frac)
        except (OverflowError, ValueError):
            pass
    raise DecisionsError('%s = %r is not a time: write a span back from now (30m, 1h, 7d), an ISO 8601 UTC '
                         'time (2026-12-05T21:00:00Z) or epoch seconds' % (key, text))


def format_time(epoch: float) -> str:
    return time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(epoch))


def log_files(folder: str) -> Tuple[List[str], List[str]]:
    """(files, warnings): the decision log's files in ``folder``, oldest rotation first.

    DecisionsError when the folder is a symlink or not a folder. A missing folder has no files (the
    proxy has logged nothing yet). A log file's name that is not a regular file (a symlink, a FIFO, ...)
    is skipped with a warning naming it and the fix, never followed or opened; one swapped in after this
    listing is refused when it is opened (:func:`read_log`).
    """
    if os.path.islink(folder):
        raise DecisionsError('%s is a symlink; name the real decision log folder (egress_decision_log_dir). '
                             'Nothing was read' % folder)
    if not os.path.exists(folder):
        return [], []
    if not os.path.isdir(folder):
        raise DecisionsError('%s is not a folder; name the decision log folder (egress_decision_log_dir, '
                             '<deploy_dir>/%s by default). Nothing was read' % (folder, DEFAULT_FOLDER))
    files, warnings = [], []
    for name in sorted(os.listdir(folder)):
        if not _FILE_RE.match(name):
            continue
        path = os.path.join(folder, name)
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            continue   # rotated away since the listing
        if stat.S_ISREG(mode):
            files.append(path)
        else:
            warnings.append(str(_unsafe(path, _kind(mode), log=True)))

    def order(path: str) -> Tuple[str, int]:
        base, _sep, suffix = os.path.basename(path).rpartition('.jsonl')
        rotation = int(suffix[1:]) if suffix.startswith('.') else 0
        return (base, -rotation)
    return sorted(files, key=order), warnings


_SECONDS = {}


def _line_epoch(text: str) -> float:
    """Epoch seconds of a line's time as the writer writes it (2026-12-05T21:00:00.123Z), the whole
    seconds cached (a busy log has many lines per second); any other form through :func:`parse_time`."""
    if len(text) == 24 and text[19] == '.' and text[23] == 'Z' and text[20:23].isdigit():
        head = text[:19]
        seconds = _SECONDS.get(head)
        if seconds is None:
            if len(_SECONDS) > 100000:
                _SECONDS.clear()
            seconds = _SECONDS[head] = parse_time(head, key='time')
        return seconds + int(text[20:23]) / 1000.0
    return parse_time(text, key='time')


def parse_line(line: str) -> Optional[Dict[str, Any]]:
    """A record (dict) from one JSON line, or None when it is not a decision."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get('time'), str):
        return None
    try:
        record['epoch'] = _line_epoch(record['time'])
    except DecisionsError:
        return None
    return record


class DecisionLog(object):
    """What one read of the folder found: ``records`` (time order), ``problems``, ``warnings``, ``files``."""

    def __init__(self, records: List[Dict[str, Any]], problems: List[str], warnings: List[str],
                 files: List[str]) -> None:
        self.records = records
        self.problems = problems
        self.warnings = warnings
        self.files = files


def read_log(folder: str, since: Optional[float] = None, until: Optional[float] = None,
             max_problems: int = 20) -> DecisionLog:
    """A :class:`DecisionLog` of every file of the folder within [since, until], the folder listed once.

    A line that is not a decision record is a problem naming its file and line (at most
    ``max_problems`` are listed; the count is always complete in the last one).
    """
    files, warnings = log_files(folder)
    records, problems, bad, read = [], [], 0, []
    if not files:
        return DecisionLog(records, problems, warnings, files)
    # the files are opened relative to the folder as it was checked (a folder swapped for a link since is
    # refused here), each with no link following and no waiting
    try:
        folder_fd = os.open(folder, os.O_RDONLY | getattr(os, 'O_DIRECTORY', 0) | getattr(os, 'O_NOFOLLOW', 0)
                            | getattr(os, 'O_CLOEXEC', 0))
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise DecisionsError('%s is not a folder any more (a symlink?); name the real decision log folder '
                                 '(egress_decision_log_dir). Nothing was read' % folder)
        raise
    # hundreds of thousands of small dicts: the cyclic collector would walk them again and again (none
    # of them forms a cycle), which made reading grow faster than the log
    collecting = gc.isenabled()
    gc.disable()
    try:
        for path in files:
            try:
                handle = open_regular(os.path.basename(path), dir_fd=folder_fd, log=True, shown=path)
            except UnsafeFile as exc:
                warnings.append(str(exc))
                continue
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    continue   # rotated away since the listing
                raise
            with handle:
                bad += _read_file(handle, path, since, until, records, problems, max_problems)
            read.append(path)
    finally:
        os.close(folder_fd)
        if collecting:
            gc.enable()
    if bad > len(problems):
        problems.append('%d lines in all were not decision records' % bad)
    records.sort(key=lambda r: r['epoch'])
    return DecisionLog(records, problems, warnings, read)


def read_records(folder: str, since: Optional[float] = None, until: Optional[float] = None, max_problems: int = 20
                 ) -> Tuple[List[Dict[str, Any]], List[str], List[str]]:
    """(records in time order, problems, warnings): :func:`read_log` without the file list."""
    log = read_log(folder, since, until, max_problems)
    return log.records, log.problems, log.warnings


def query(folder: str, job: Optional[str] = None, host: Optional[str] = None, verdict: Optional[str] = None,
          reason: Optional[str] = None, since: Optional[Union[str, int, float]] = None,
          before: Optional[Union[str, int, float]] = None, limit: int = 50, top: int = 10
          ) -> Tuple[Dict[str, Any], List[Dict[str, Any]], List[str]]:
    """egress_decisions' reading: (result dict, the matched records, warnings). DecisionsError for bad filters.

    ``since``/``before`` are the module's texts (:func:`parse_time`); ``limit`` records are shown (0:
    none), ``top`` rows per summary table. Reads nothing when an argument is wrong.
    """
    if limit < 0 or top < 1:
        raise DecisionsError('limit must be 0 or more and top at least 1. Nothing was read.')
    start = parse_time(since, key='since')
    end = parse_time(before, key='before')
    check_filters(job=job, host=host, verdict=verdict, reason=reason)
    log = read_log(folder, since=start, until=end)
    matched = select(log.records, job=job, host=host, verdict=verdict, reason=reason)
    result = dict(changed=False, folder=folder, files=log.files, problems=log.problems, count=len(matched),
                  records=matched[-limit:] if limit else [], summary=summarize(matched, top=top),
                  refused_files=list(log.warnings))
    return result, matched, log.warnings


def _read_file(handle: Any, path: str, since: Optional[float], until: Optional[float],
               records: List[Dict[str, Any]], problems: List[str], max_problems: int) -> int:
    """Append the records within the window of the open file ``handle`` (named ``path``); returns how many
    lines were not records."""
    bad = 0
    for lineno, raw in enumerate(handle, start=1):
        text = raw.decode('utf-8', 'replace').strip()
        if not text:
            continue
        record = parse_line(text)
        if record is None:
            bad += 1
            if len(problems) < max_problems:
                problems.append('%s line %d is not a decision record (cut by a full disk or a rotation?); '
                                'it was skipped' % (path, lineno))
            continue
        if since is not None and record['epoch'] < since:
            continue
        if until is not None and record['epoch'] > until:
            continue
        records.append(record)
    return bad


def _norm_host(host: Any) -> Any:
    return host.lower().rstrip('.') if isinstance(host, str) else host


def check_filters(job: Optional[str] = None, host: Optional[str] = None, verdict: Optional[str] = None,
                  reason: Optional[str] = None) -> None:
    if verdict not in (None, '') and verdict not in VERDICTS:
        raise DecisionsError('verdict = %r: use one of %s' % (verdict, ', '.join(VERDICTS)))
    if reason not in (None, '') and reason not in REASONS:
        raise DecisionsError('reason = %r is not a reason the proxy records: use one of %s'
                             % (reason, ', '.join(sorted(REASONS))))


def select(records: Iterable[Dict[str, Any]], job: Optional[str] = None, host: Optional[str] = None,
           verdict: Optional[str] = None, reason: Optional[str] = None, since: Optional[float] = None,
           until: Optional[float] = None) -> List[Dict[str, Any]]:
    """The records matching every filter given. ``host``: exact, or '.domain' for it and every name under it."""
    check_filters(job=job, host=host, verdict=verdict, reason=reason)
    want_host = _norm_host(host) if host else None
    out = []
    for r in records:
        if job and r.get('job') != job:
            continue
        if verdict and r.get('verdict') != verdict:
            continue
        if reason and r.get('reason') != reason:
            continue
        if since is not None and r.get('epoch', 0) < since:
            continue
        if until is not None and r.get('epoch', 0) > until:
            continue
        if want_host:
            have = _norm_host(r.get('host')) or ''
            if want_host.startswith('.'):
                if have != want_host[1:] and not have.endswith(want_host):
                    continue
            elif have != want_host:
                continue
        out.append(r)
    return out


def _top(counter: Dict[Any, int], top: int) -> List[Dict[str, Any]]:
    return [dict(name=name, count=count) for name, count in
            sorted(counter.items(), key=lambda item: (-item[1], str(item[0])))[:top]]


def summarize(records: Iterable[Dict[str, Any]], top: int = 10) -> Dict[str, Any]:
    """Counts: total, per verdict, per reason, and the top jobs and hosts (all and refused only)."""
    by_verdict, by_reason, by_job, by_host, refused_job, refused_host = {}, {}, {}, {}, {}, {}
    for r in records:
        verdict, job, host = r.get('verdict'), r.get('job') or '(no job)', _norm_host(r.get('host')) or '(none)'
        by_verdict[verdict] = by_verdict.get(verdict, 0) + 1
        by_reason[r.get('reason')] = by_reason.get(r.get('reason'), 0) + 1
        by_job[job] = by_job.get(job, 0) + 1
        by_host[host] = by_host.get(host, 0) + 1
        if verdict == 'refused':
            refused_job[job] = refused_job.get(job, 0) + 1
            refused_host[host] = refused_host.get(host, 0) + 1
    return dict(total=len(records), allowed=by_verdict.get('allowed', 0), refused=by_verdict.get('refused', 0),
                by_reason=dict(sorted(by_reason.items(), key=lambda item: str(item[0]))),
                jobs=_top(by_job, top), hosts=_top(by_host, top),
                refused_jobs=_top(refused_job, top), refused_hosts=_top(refused_host, top))


class Matcher(object):
    """What squid's ``dstdomain -n`` matches for a list of allowlist entries: an exact name (any case,
    one trailing dot ignored), a '.domain' entry for the domain and every name under it, an IP literal
    as written. Linear to build, one set lookup per label to ask."""

    def __init__(self, entries: Iterable[str]) -> None:
        self.exact = set()
        self.domains = set()
        for entry in entries:
            entry = _norm_host(entry.strip())
            if not entry or entry.startswith('#'):
                continue
            if entry.startswith('.'):
                self.domains.add(entry[1:])
            else:
                self.exact.add(entry)

    def covers(self, host: Any) -> bool:
        host = _norm_host(host)
        if not host:
            return False
        if host.startswith('[') and host.endswith(']'):
            host = host[1:-1]
        if host in self.exact or host in self.domains:
            return True
        return any(parent in self.domains for parent in parent_domains(host))


def entries_of(text: str) -> List[str]:
    """The entries of allowlist text (one per line, '#' comments; the proxy role validates the file)."""
    out = []
    for line in text.splitlines():
        word = line.strip().split('#', 1)[0].strip()
        if word:
            out.append(word.split()[0])
    return out


def judge(record: Dict[str, Any], matcher: Matcher) -> Optional[str]:
    """'allowed' or 'refused' for a recorded request under the allowlist of ``matcher``; None when the
    allowlist does not decide it (a model endpoint, the guard, the TLS name check's own refusals, ...)."""
    if record.get('reason') not in ALLOWLIST_REASONS:
        return None
    port = record.get('port')
    if not matcher.covers(record.get('host')):
        return 'refused'
    if record.get('method') == 'CONNECT':
        return 'allowed' if port == 443 else 'refused'
    return 'allowed' if port == 80 else 'refused'


def replay(records: Iterable[Dict[str, Any]], current_entries: Iterable[str], candidate_entries: Iterable[str]
           ) -> Dict[str, Any]:
    """What the candidate allowlist changes for the recorded requests, against the current one.

    Returns dict(newly_refused, newly_allowed, judged, unchanged): each change is one row per
    (method, host, port) with the jobs that made such requests, how many, and the last time.
    """
    current, candidate = Matcher(current_entries), Matcher(candidate_entries)
    changes = dict(newly_refused={}, newly_allowed={})
    judged = unchanged = 0
    for r in records:
        before = judge(r, current)
        if before is None:
            continue
        judged += 1
        after = judge(r, candidate)
        if after == before:
            unchanged += 1
            continue
        kind = 'newly_refused' if after == 'refused' else 'newly_allowed'
        key = ('CONNECT' if r.get('method') == 'CONNECT' else 'HTTP', _norm_host(r.get('host')), r.get('port'))
        row = changes[kind].setdefault(key, dict(kind=key[0], host=key[1], port=key[2], jobs=set(),
                                                 requests=0, last=r.get('time')))
        row['requests'] += 1
        row['last'] = max(row['last'] or '', r.get('time') or '')
        if r.get('job'):
            row['jobs'].add(r['job'])
    out = dict(judged=judged, unchanged=unchanged)
    for kind, rows in changes.items():
        out[kind] = [dict(row, jobs=sorted(row['jobs'])) for _key, row in
                     sorted(rows.items(), key=lambda item: (str(item[0][1]), str(item[0][2]), item[0][0]))]
    return out


def replay_lines(result: Dict[str, Any]) -> List[str]:
    """The replay as text lines, for Ansible's diff and the playbook's report."""
    lines = []
    for kind, sign, word in (('newly_refused', '-', 'would be refused'), ('newly_allowed', '+', 'would pass')):
        for row in result[kind]:
            jobs = ', '.join(row['jobs']) if row['jobs'] else 'no job network'
            lines.append('%s %s %s:%s %s (%d recorded request%s, last %s; jobs: %s)' % (
                sign, row['kind'], row['host'], row['port'], word, row['requests'],
                '' if row['requests'] == 1 else 's', row['last'], jobs))
    return lines


def replay_diff(result: Dict[str, Any], current_name: str, candidate_name: str) -> Dict[str, str]:
    """Ansible's diff dict: the recorded requests whose verdict the candidate changes, before and after."""
    before, after = [], []
    for kind in ('newly_refused', 'newly_allowed'):
        for row in result[kind]:
            was, now = ('allowed', 'refused') if kind == 'newly_refused' else ('refused', 'allowed')
            label = '%s %s:%s (jobs: %s)' % (row['kind'], row['host'], row['port'], ', '.join(row['jobs']) or '-')
            before.append('%s %s\n' % (label, was))
            after.append('%s %s\n' % (label, now))
    return dict(before=''.join(before), after=''.join(after),
                before_header='recorded decisions under %s' % current_name,
                after_header='the same requests under %s' % candidate_name)
