# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The doctor's overlay lines: the overlay models.json against the declared endpoints, and the allowlist.

Files only, no daemon: the allowlist's entries that open this host or cover a
whole public suffix, and the overlay ``models.json`` (``models_json.check``)
against the declared model endpoints. :func:`overlay_lines` and
:func:`public_suffix_lines` are pure; :class:`OverlayCheck` reads the files.
"""

from __future__ import annotations

import re
from typing import Any, Callable, List, Optional, Sequence

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import allowlist as _allowlist
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import models_json as _models_json
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.context import Check, DoctorContext
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.lines import Line, shape


# --- the overlay models.json and the allowlist: pure ------------------------------------------------

_OVERLAY_KINDS = {
    'allowlist': 'overlay.allowlist',
    'parse': 'overlay.parse',
    'uses': 'overlay.uses',
    'port-mismatch': 'overlay.port_mismatch',
    'loopback': 'overlay.loopback',
    'max-tokens': 'overlay.max_tokens',
}


def _overlay_line(check_line: _models_json.Line, path: Optional[str]) -> Line:
    """A doctor Line from a ``_models_json.Line``."""
    kind, status = check_line.kind, check_line.status
    if kind == 'keyless':
        if status == 'fail':
            line_id = 'overlay.keyless_refused'
        elif check_line.text.startswith('Provider key'):
            line_id = 'overlay.keyless'
        else:
            line_id = 'overlay.needs_key'
    elif kind == 'read':
        return Line('overlay.read', status, 'Overlay models.json: %s %s' % (path, check_line.text),
                    fix=check_line.fix or None)
    else:
        line_id = _OVERLAY_KINDS.get(kind, 'overlay.parse')
    fix = check_line.fix or None
    if status == 'ok' and line_id != 'overlay.needs_key':
        fix = None
    return Line(line_id, status, check_line.text, fix=fix)


def overlay_lines(models_path: Optional[str], models_text: Optional[str], read_problem: Optional[_models_json.Line],
                  endpoints: Sequence[Any], allowlist_entries: Optional[Sequence[str]],
                  allowlist_problem: Optional[str] = None) -> List[Line]:
    """The overlay and allowlist lines.

    ``models_path``: the overlay models.json doctor was given (None: none given);
    ``models_text``: its content (None: missing or unreadable, see ``read_problem``,
    a ``_models_json.Line``); ``allowlist_entries``: the allowlist's entries, or
    None when ``allowlist_problem`` (a sentence) says why it could not be read.
    """
    lines = []
    if allowlist_entries is None:
        lines.append(Line('overlay.allowlist_unread', 'warn', 'Allowlist: %s' % allowlist_problem,
                          fix='ansible-playbook pi_dispatch.egress.site (validates the allowlist and names the '
                              'line to fix)'))
        entries = ()
    else:
        entries = list(allowlist_entries)
    # The allowlist warnings come first and do not need an overlay.
    for check_line in _models_json.check(None, endpoints, allowlist_hosts=entries):
        lines.append(_overlay_line(check_line, models_path))
    if allowlist_entries is not None and not lines:
        lines.append(Line('overlay.allowlist_ok', 'ok', shape('overlay.allowlist_ok')))
    if models_path is None:
        lines.append(Line('overlay.none', 'notrun', shape('overlay.none')))
        return lines
    if read_problem is not None:
        lines.append(_overlay_line(read_problem, models_path))
        return lines
    if models_text is None:
        lines.append(Line('overlay.missing', 'warn', 'Overlay models.json: %s does not exist' % models_path,
                          fix='set doctor_models_json to the overlay\'s models.json (in PI_GLOBAL_PI_DIR), or leave '
                              'it empty'))
        return lines
    for check_line in _models_json.check(models_text, endpoints, allowlist_hosts=(), path=models_path):
        lines.append(_overlay_line(check_line, models_path))
    return lines


# --- public-suffix entries in the allowlist: pure ---------------------------------------------------------

_ENTRY_RE = re.compile(r'^\.?[a-z0-9_.\-]+$')


def public_suffix_checker() -> Callable[[str], Optional[str]]:
    """The allowlist's own rule (the Public Suffix List): one source for the validator and the doctor."""
    return _allowlist.public_suffix_covered


def public_suffix_lines(path: str, text: Optional[str], covered: Callable[[str], Optional[str]]) -> List[Line]:
    """A warning per allowlist entry that is a whole public suffix (files written before that rule).

    Reads the entries itself, so an entry today's validator refuses is still named.
    """
    lines, seen = [], set()
    for raw in (text or '').lstrip(u'\ufeff').splitlines():
        words = raw.split('#', 1)[0].split()
        if not words or not _ENTRY_RE.match(words[0].lower()) or words[0].lower() in seen:
            continue
        entry = words[0].lower()
        seen.add(entry)
        try:
            suffix = covered(entry)
        except Exception as exc:  # e.g. PublicSuffixListMissing: names the package to install
            return [Line('overlay.allowlist_unread', 'warn', 'Allowlist: %s could not be checked (for public '
                                                             'suffixes: %s)' % (path, ' '.join(str(exc).split())),
                         fix='pip install publicsuffixlist where the doctor runs, then re-run doctor')]
        if suffix:
            lines.append(Line('overlay.public_suffix', 'warn',
                              '%s in egress-allowlist.conf covers the whole public suffix %s: every site anyone '
                              'registers under it is open to every job' % (entry, suffix),
                              fix='replace %s in %s with the exact hosts (api.example.com) or your own domain '
                                  '(.yourdomain.tld), then ansible-playbook pi_dispatch.egress.site '
                                  '-e egress_proxy_state=reloaded' % (entry, path)))
    return lines


# --- the daemon side -------------------------------------------------------------------------------

class OverlayCheck(Check):
    """The overlay models.json and allowlist lines (files only, no daemon)."""

    def lines(self, ctx: DoctorContext) -> List[Line]:
        path = _deployment.paths(ctx.deploy_dir)['allowlist']
        entries, problem = None, None
        try:
            with open(path, 'r') as handle:
                parsed = _allowlist.parse(handle.read(), path)
            if parsed.errors:
                problem = '%s could not be checked (%s)' % (path, ' '.join(str(parsed.errors[0]).split()))
            else:
                entries = [entry for _lineno, entry in parsed.entries]
        except (IOError, OSError, UnicodeDecodeError) as exc:
            problem = '%s could not be checked (%s)' % (path, getattr(exc, 'strerror', None) or exc)
        suffix_lines = []
        try:
            with open(path, 'r') as handle:
                suffix_lines = public_suffix_lines(path, handle.read(), public_suffix_checker())
        except (IOError, OSError, UnicodeDecodeError):
            pass  # the line above already says the allowlist could not be read
        text, read_problem = (None, None)
        if ctx.models_json:
            text, read_problem = _models_json.read_text(ctx.models_json)
        lines = overlay_lines(ctx.models_json, text, read_problem, ctx.declared_endpoints() or [], entries, problem)
        at = len([line for line in lines if line.id.startswith('overlay.allowlist')])
        return lines[:at] + suffix_lines + lines[at:]
