# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The allowlist file: parse, validate, warn. Pure logic, no I/O but reading.

Format (``egress-allowlist.conf``): one bare hostname per line, a leading
dot for the name and all its subdomains, ``#`` comments (a whole line, or
after the entry and whitespace) and blank lines. squid reads the first
whitespace-separated word of each line and silently drops the rest, so
anything after an entry that is not a comment is refused here rather than
left for squid to half-read.
"""

from __future__ import annotations

import ipaddress
import re
import traceback
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import hostnames as _hostnames

PSL_IMPORT_ERROR = None
try:
    import publicsuffixlist
except ImportError:  # pragma: no cover - exercised by monkeypatching in the unit tests
    publicsuffixlist = None
    PSL_IMPORT_ERROR = traceback.format_exc()

MAX_NAME = _hostnames.MAX_NAME
MAX_LABEL = _hostnames.MAX_LABEL

# Names that reach the host running the proxy, and suffixes that cover them.
HOST_NAMES = _hostnames.HOST_NAMES


# The fix printed for an entry that covers a whole public suffix or is one label.
BREADTH_FIX = 'list the exact host (api.example.com) or your own domain (.yourdomain.tld)'
PSL_PACKAGE = 'publicsuffixlist'
PSL_MISSING_REASON = ('cannot be checked against the Public Suffix List: the Python package %s is not '
                      'installed where the check runs' % PSL_PACKAGE)
PSL_MISSING_FIX = ('pip install %s on the target (the Python that runs the module), then run again; '
                   'the allowlist is refused until then' % PSL_PACKAGE)


class PublicSuffixListMissing(Exception):
    """The ``publicsuffixlist`` package is not importable, so breadth cannot be judged."""

    def __init__(self) -> None:
        super(PublicSuffixListMissing, self).__init__('%s; %s' % (PSL_MISSING_REASON, PSL_MISSING_FIX))


_PSL = []  # the one parsed list, built on first use (about 50 ms)


def _public_suffix_list() -> Any:
    if publicsuffixlist is None:
        raise PublicSuffixListMissing()
    if not _PSL:
        # accept_unknown=True: a TLD missing from the list (.test, .internal, .localhost) is
        # treated as a public suffix of its own, as browsers do (the default "*" rule).
        # only_icann=False: the PRIVATE section (github.io, s3.amazonaws.com, ...) counts too.
        _PSL.append(publicsuffixlist.PublicSuffixList(accept_unknown=True, only_icann=False))
    return _PSL[0]


class AllowlistProblem(object):
    """One refused or suspicious line: where, what, why, and the fix."""

    def __init__(self, path: str, lineno: int, text: str, reason: str, fix: str) -> None:
        self.path = path
        self.lineno = lineno
        self.text = text
        self.reason = reason
        self.fix = fix

    def __str__(self) -> str:
        return '%s:%d: %r: %s; %s' % (self.path, self.lineno, self.text, self.reason, self.fix)

    def as_dict(self) -> Dict[str, Any]:
        return dict(path=self.path, line=self.lineno, text=self.text,
                    reason=self.reason, fix=self.fix, message=str(self))


class Allowlist(object):
    def __init__(self, path: str) -> None:
        self.path = path
        self.entries = []      # (lineno, entry) in file order
        self.errors = []       # AllowlistProblem
        self.warnings = []     # AllowlistProblem

    @property
    def ok(self) -> bool:
        return not self.errors

    def hosts(self) -> List[str]:
        return [entry for _lineno, entry in self.entries]


def classify_entry(entry: str) -> Optional[Tuple[str, str]]:
    """Return None when ``entry`` is a valid allowlist entry, else (reason, fix).

    ``entry`` is a single word (no whitespace) as found in the file.
    """
    if any(ord(c) < 32 or ord(c) == 127 for c in entry):
        return ('contains a control character', 'retype the line as plain ASCII text')
    if any(ord(c) > 127 for c in entry):
        return ('contains a non-ASCII character',
                'write an internationalised name in its xn-- (punycode) form')
    if '"' in entry or "'" in entry or '`' in entry:
        return ('contains a quote', 'remove the quotes: write the bare hostname')
    if '://' in entry:
        return ('is a URL, not a hostname',
                'write only the hostname, without the scheme (http:// or https://), port or path')
    if '/' in entry:
        return ('contains a path or slash', 'write only the hostname, without any path')
    if '*' in entry or '?' in entry:
        return ('contains a wildcard',
                'write a leading dot instead (.example.com covers every subdomain and the name itself)')
    if entry.startswith('['):
        return ('is a bracketed address',
                'IPv6 literals are not supported in the allowlist; declare a model endpoint instead')
    if ':' in entry:
        return ('contains a port or colon',
                'write only the hostname: a listed host is reachable on 443 (CONNECT) and 80 (plain); '
                'declare a model endpoint for any other port')
    if '@' in entry:
        return ('contains user information (@)', 'write only the hostname')
    body = entry[1:] if entry.startswith('.') else entry
    if not body:
        return ('is a lone dot, which would match every name', 'write a domain after the dot, e.g. .example.com')
    if body.startswith('.'):
        return ('starts with more than one dot', 'use a single leading dot, e.g. .example.com')
    if body.endswith('.'):
        return ('ends with a dot', 'remove the trailing dot')
    if len(body) > MAX_NAME:
        return ('is longer than %d characters' % MAX_NAME, 'shorten the name; no DNS name is that long')
    if _hostnames.is_ipv4(body):
        if entry.startswith('.'):
            return ('puts a leading dot before an IP address', 'write the address without the dot')
        return None
    problem = _hostnames.name_problem(body)
    if problem is None:
        return None
    code, label = problem
    if code == _hostnames.EMPTY_LABEL:
        return ('has an empty label (two dots in a row)', 'remove the extra dot')
    if code == _hostnames.LONG_LABEL:
        return ('has a label longer than %d characters (%s...)' % (MAX_LABEL, label[:12]),
                'no DNS label is longer than 63 characters; check the name')
    if code == _hostnames.BAD_LABEL:
        return ('label %r is not a hostname label (letters, digits and inner hyphens only)' % label,
                'write a plain DNS hostname')
    return ('ends in a numeric label but is not an IPv4 address',
            'write a full dotted-quad IPv4 address or a DNS name')


def public_suffix_covered(entry: str) -> Optional[str]:
    """Return what ``entry`` covers whole when it is too broad, else None.

    ``entry`` is an allowlist entry, with or without the leading dot, in any case.
    The answer is the single label for a one-label entry (``localhost``, ``.test``,
    ``.internal``: refused without consulting the list), the public suffix itself
    (lowercased, without the dot) for an entry that is a public suffix in the
    Public Suffix List, ICANN and PRIVATE sections (``com``, ``.co.uk``,
    ``github.io``, ``.s3.amazonaws.com``, ``foo.ck`` under the ``*.ck`` rule),
    and None for an entry below a suffix (``example.com``, ``user.github.io``,
    ``www.ck`` by the ``!www.ck`` exception, ``forge.test``) or an IPv4 literal.
    A lone dot answers ``'.'`` (it covers everything).

    Raises :class:`PublicSuffixListMissing` when a name of two or more labels
    must be looked up and the ``publicsuffixlist`` package is not installed:
    never a silent None. Check ``publicsuffixlist is not None`` first to avoid it.
    """
    body = entry[1:] if entry.startswith('.') else entry
    body = body.lower()
    if not body:
        return '.'
    if _hostnames.is_ipv4(body):
        return None
    labels = body.split('.')
    if len(labels) == 1:
        return body
    if _public_suffix_list().is_public(body):
        return body
    return None


def host_opening_entry(entry: str) -> bool:
    """True when ``entry`` admits a name that reaches the proxy's own host."""
    lowered = entry.lower()
    for name in HOST_NAMES:
        if lowered == name:
            return True
        if lowered.startswith('.') and (name == lowered[1:] or name.endswith(lowered)):
            return True
    return False


# Names of cloud metadata services (one definition, shared with the model endpoints): a listed
# one is at best a request that always fails and at worst a mistake worth knowing about.
METADATA_NAMES = _hostnames.METADATA_NAMES
METADATA_FIX = 'remove the line: a job never needs the cloud metadata service, and the guard refuses it anyway'


def metadata_name(entry: str) -> Optional[str]:
    """The metadata service name ``entry`` (a valid entry, lower case) admits, else None."""
    for name in METADATA_NAMES:
        if entry == name or (entry.startswith('.') and (name == entry[1:] or name.endswith(entry))):
            return name
    return None


def guard_problem(address: str, opened: Optional[Sequence[Any]] = None) -> Optional[Tuple[str, str]]:
    """(reason, fix) when the destination guard refuses every request to the IPv4 literal ``address``.

    ``opened``: the ranges egress_private_destinations opens (None: unknown, judged as none opened,
    and the fix says how to open one). A never-openable range (loopback, link-local, metadata, the
    job pool, ...) gets a fix that says so.
    """
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import guard as _guard  # pylint: disable=import-outside-toplevel
    addr = ipaddress.ip_address(address)
    for net, why in _guard.NEVER_OPEN + ((_guard.DEFAULT_POOL, 'the job-network pool: other jobs'),):
        net = ipaddress.ip_network(net)
        if net.version == addr.version and addr in net:
            return ('is an address the destination guard always refuses (%s, %s): every request to it is refused'
                    % (net, why), 'remove the line; no setting opens %s' % net)
    opened_nets = []
    for item in opened or []:
        try:
            opened_nets.append(ipaddress.ip_network(str(item), strict=False))
        except ValueError:
            continue  # the guard's own validation names it
    for net in _guard.NONPUBLIC_V4:
        net = ipaddress.ip_network(net)
        if addr in net and not any(o.version == 4 and addr in o for o in opened_nets):
            return ('is in the non-public range %s, which the destination guard refuses: every request to it is '
                    'refused' % net,
                    'open that range with egress_private_destinations (only a range you mean jobs to reach), or '
                    'declare the server as a model endpoint, or remove the line')
    return None


def _covering_wildcards(result: 'Allowlist') -> Dict[int, Tuple[int, str]]:
    """entry -> (line, wildcard) of the first line (in file order) whose leading-dot entry covers it."""
    wildcards = {}
    for lineno, entry in result.entries:
        if entry.startswith('.') and entry not in wildcards:
            wildcards[entry] = lineno
    covered = {}
    for lineno, entry in result.entries:
        name = entry.lstrip('.')
        best = None
        for domain in [name] + _hostnames.parent_domains(name):
            candidate = '.' + domain
            if candidate == entry:
                continue
            other_line = wildcards.get(candidate)
            if other_line is not None and (best is None or other_line < best[0]):
                best = (other_line, candidate)
        if best is not None:
            covered[lineno] = best
    return covered


def parse(text: str, path: str = 'egress-allowlist.conf', opened: Optional[Sequence[Any]] = None) -> 'Allowlist':
    """Parse and validate allowlist text; return an :class:`Allowlist`.

    ``opened``: the ranges egress_private_destinations opens, for the warning on a listed IPv4
    literal the destination guard refuses (None: none opened). Linear in the number of lines.
    """
    result = Allowlist(path)
    if text.startswith('\ufeff'):
        result.errors.append(AllowlistProblem(path, 1, '\ufeff', 'starts with a byte order mark',
                                              'save the file as UTF-8 without a BOM'))
        text = text[1:]
    seen = {}
    missing_reported = False
    for lineno, raw in enumerate(text.split('\n'), start=1):
        line = raw[:-1] if raw.endswith('\r') else raw
        stripped = line.strip(' \t')
        if not stripped or stripped.startswith('#'):
            continue
        words = re.split(r'[ \t]+', stripped, maxsplit=1)
        entry = words[0]
        rest = words[1] if len(words) > 1 else ''
        if rest and not rest.startswith('#'):
            result.errors.append(AllowlistProblem(
                path, lineno, stripped, 'has a space inside the entry (squid would read only %r)' % entry,
                'put one hostname per line; start a trailing note with #'))
            continue
        if '#' in entry:
            result.errors.append(AllowlistProblem(
                path, lineno, stripped, 'has a # inside the entry',
                'separate a trailing comment from the hostname with a space'))
            continue
        problem = classify_entry(entry)
        if problem:
            result.errors.append(AllowlistProblem(path, lineno, entry, problem[0], problem[1]))
            continue
        entry = entry.lower()
        try:
            covered = public_suffix_covered(entry)
        except PublicSuffixListMissing:
            if not missing_reported:
                result.errors.append(AllowlistProblem(path, lineno, entry, PSL_MISSING_REASON, PSL_MISSING_FIX))
                missing_reported = True
            covered = None
        if covered is not None:
            if '.' in covered:
                reason = ('covers the whole public suffix %s (every site anyone registers under it, '
                          'in the Public Suffix List)' % covered)
            else:
                reason = ('is the one-label suffix %s: a top-level name (com, test, internal) or a local '
                          'name (localhost), never one site' % covered)
            result.errors.append(AllowlistProblem(path, lineno, entry, reason, BREADTH_FIX))
            continue
        if entry in seen:
            result.warnings.append(AllowlistProblem(
                path, lineno, entry, 'repeats line %d' % seen[entry], 'remove the duplicate line'))
            continue
        seen[entry] = lineno
        if host_opening_entry(entry):
            result.warnings.append(AllowlistProblem(
                path, lineno, entry,
                "opens this host's ports 443 and 80 to every job (host.docker.internal / "
                "host.containers.internal)",
                'remove the line and declare the model server in model-endpoints.json instead'))
        metadata = metadata_name(entry)
        if metadata:
            result.warnings.append(AllowlistProblem(
                path, lineno, entry, 'names a cloud metadata service (%s), which serves the machine\'s own '
                                     'credentials; the destination guard refuses its address' % metadata,
                METADATA_FIX))
        if _hostnames.is_ipv4(entry):
            problem = guard_problem(entry, opened)
            if problem:
                result.warnings.append(AllowlistProblem(path, lineno, entry, problem[0], problem[1]))
        result.entries.append((lineno, entry))
    # squid warns and drops an entry another wildcard entry already covers.
    covered = _covering_wildcards(result)
    for lineno, entry in result.entries:
        if lineno in covered:
            other_line, other = covered[lineno]
            result.warnings.append(AllowlistProblem(
                path, lineno, entry, 'is already covered by %s on line %d' % (other, other_line),
                'remove one of the two lines (squid ignores the narrower one)'))
    return result


def render_seed(entries: Sequence[Dict[str, str]]) -> str:
    """Text of a new allowlist from [{'host': ..., 'comment': ...}] items."""
    lines = [
        '# pi-dispatch egress allowlist: one bare hostname per line.',
        '# A leading dot (.example.com) matches the name and every subdomain.',
        '# A listed host is reachable by CONNECT on 443 and by plain HTTP on 80, nothing else.',
        '# Declare model servers (any other host:port) in model-endpoints.json, not here.',
        '',
    ]
    width = max([len(e['host']) for e in entries] + [0]) + 2
    for item in entries:
        host = item['host']
        comment = item.get('comment')
        if comment:
            lines.append('%s# %s' % (host.ljust(width), comment))
        else:
            lines.append(host)
    return '\n'.join(lines) + '\n'
