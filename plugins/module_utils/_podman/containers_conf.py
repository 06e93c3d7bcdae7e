# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""A Podman account's ``containers.conf``: the settings that map the host into containers, refused.

On the rootless Podman venue the destination guard refuses the addresses where the host's loopback
can appear inside a container (pasta's default gateway mapping is off since Podman 5; slirp4netns
shows the host's loopback as ``10.0.2.2`` only when ``allow_host_loopback=true``). A
``containers.conf`` can move or widen that mapping behind the guard's back, so a job, or a listed
name pointing there, reaches every service bound to the host's ``127.0.0.1`` (seed 000, issue #428):

* pasta ``--map-host-loopback <address>``: the host's loopback at an address of the operator's choice;
* pasta ``--map-gw``: the network's gateway address is the host's loopback;
* slirp4netns ``cidr=<range>``: the host's loopback, where ``allow_host_loopback`` opens it, is
  then ``<range>.2``, no longer the ``10.0.2.2`` the guard knows.

One more setting undoes the proxy's confinement rather than the guard: ``[containers] cgroups =
"disabled"`` starts every container without a cgroup of its own, so the proxy's memory and pids
limits are reported by ``podman inspect`` but hold nothing (measured, see :func:`_cgroups_refusal`).

The helpers' options live in ``[network] pasta_options`` (Podman 5) and ``[engine]
network_cmd_options`` (Podman 4, for either helper). Podman reads every file of
:func:`account_files` in order, a later one overriding a key, so each file is checked on its own:
a refusal names the file and the key wherever it is set.

Pure: :func:`parse` (the TOML subset containers.conf uses; ``tomllib`` where Python has it) and
:func:`refusals`; :func:`check_files` only reads files.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

try:  # Python 3.11 and later: the real TOML parser
    import tomllib as _tomllib
except ImportError:  # older Pythons on a target host: the subset below
    _tomllib = None

# (table, key): the option lists Podman hands to the rootless network helper.
OPTION_KEYS = (('network', 'pasta_options'), ('engine', 'network_cmd_options'))

FIX_PASTA_LOOPBACK = ('remove %s from %s in %s (Podman then maps no address to the host\'s loopback); reach a model '
                      'server on the host through host.containers.internal, as docs/podman.md shows')
FIX_PASTA_GW = ('remove --map-gw from %s in %s (Podman passes --no-map-gw by default, so the gateway stays the '
                'gateway)')
FIX_CGROUPS = ('remove [containers] cgroups from %s, or set it to "enabled" (Podman\'s default; "no-conmon" is '
               'fine too), and restart the proxy so its own cgroup holds the limits again')
FIX_CIDR = ('remove %s from %s in %s: slirp4netns\'s default 10.0.2.0/24 puts the host\'s loopback at 10.0.2.2, '
            'which the destination guard refuses')


class ConfError(ValueError):
    """A file that could not be read as containers.conf: the message names the file, the line and the fix."""


class Refusal(object):
    """One setting that maps the host into containers: where it is, what it is, why, and the fix."""

    def __init__(self, path: str, key: str, value: str, why: str, fix: str) -> None:
        self.path, self.key, self.value, self.why, self.fix = path, key, value, why, fix

    def as_dict(self) -> Dict[str, str]:
        return dict(path=self.path, key=self.key, value=self.value, why=self.why, fix=self.fix)

    def __str__(self) -> str:
        return '%s: %s has %s, which %s. Fix: %s' % (self.path, self.key, self.value, self.why, self.fix)


def account_files(home: str, environ: Optional[Mapping[str, str]] = None, rootless: bool = True) -> List[str]:
    """The containers.conf files Podman reads for an account, in the order it reads them.

    ``CONTAINERS_CONF`` replaces them all when set (Podman reads only that file). The user's own files
    follow the system's; Podman 5 also reads ``containers.rootless.conf`` for a rootless account.
    Drop-in folders contribute their ``*.conf`` files in name order, listed as found by :func:`expand`.
    """
    environ = environ or {}
    if environ.get('CONTAINERS_CONF'):
        return [environ['CONTAINERS_CONF']]
    config_home = environ.get('XDG_CONFIG_HOME') or os.path.join(home, '.config')
    files = ['/usr/share/containers/containers.conf', '/usr/share/containers/containers.conf.d',
             '/etc/containers/containers.conf', '/etc/containers/containers.conf.d']
    if rootless:
        files += ['/etc/containers/containers.rootless.conf', '/etc/containers/containers.rootless.conf.d']
    files += [os.path.join(config_home, 'containers', 'containers.conf'),
              os.path.join(config_home, 'containers', 'containers.conf.d')]
    return files


def expand(paths: Iterable[str]) -> List[str]:
    """Existing files among ``paths``, a folder giving its ``*.conf`` files in name order."""
    found = []
    for path in paths:
        if os.path.isdir(path):
            found += [os.path.join(path, name) for name in sorted(os.listdir(path)) if name.endswith('.conf')]
        elif os.path.exists(path):
            found.append(path)
    return found


# --- the TOML subset containers.conf uses ---------------------------------------------------------

_TABLE = re.compile(r'^\[\s*([A-Za-z0-9_.\-]+)\s*\]$')
_KEY = re.compile(r'^([A-Za-z0-9_\-]+)\s*=\s*(.*)$')
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"|\'([^\']*)\'')


def _strip_comment(text: str) -> str:
    """``text`` without a trailing ``#`` comment (a ``#`` inside a string stays)."""
    quote = None
    for index, char in enumerate(text):
        if quote:
            if char == quote:
                quote = None
        elif char in '"\'':
            quote = char
        elif char == '#':
            return text[:index]
    return text


def _value(raw: str, path: str, number: int) -> Any:
    raw = raw.strip()
    if raw.startswith('['):
        if not raw.endswith(']'):
            raise ConfError('%s line %d: the array is not closed with ]; fix the file (it is TOML)' % (path, number))
        body = raw[1:-1].strip().rstrip(',')
        items = []
        rest = body
        while rest.strip():
            match = _STRING.match(rest.strip())
            if not match:
                raise ConfError('%s line %d: an array item is not a quoted string (%s); fix the file (it is TOML)'
                                % (path, number, rest.strip()[:40]))
            items.append(match.group(1) if match.group(1) is not None else match.group(2))
            rest = rest.strip()[match.end():].strip()
            if rest.startswith(','):
                rest = rest[1:]
            elif rest:
                raise ConfError('%s line %d: array items must be separated by commas; fix the file (it is TOML)'
                                % (path, number))
        return items
    match = _STRING.fullmatch(raw)
    if match:
        return match.group(1) if match.group(1) is not None else match.group(2)
    if raw in ('true', 'false'):
        return raw == 'true'
    if re.fullmatch(r'[+-]?[0-9_]+', raw):
        return int(raw.replace('_', ''))
    raise ConfError('%s line %d: %r is not a value this check reads (a quoted string, true/false, a number or an '
                    'array of strings); fix the file (it is TOML)' % (path, number, raw[:40]))


def parse_subset(text: str, path: str) -> Dict[str, Dict[str, Any]]:
    """containers.conf as {table: {key: value}} without ``tomllib``; ConfError names the file and the line."""
    tables: Dict[str, Dict[str, Any]] = {'': {}}
    current = ''
    pending: Optional[Tuple[str, str, int]] = None  # a multi-line array: (key, text so far, first line)
    for number, raw in enumerate(text.splitlines(), 1):
        line = _strip_comment(raw).strip()
        if pending is not None:
            key, so_far, first = pending
            so_far += ' ' + line
            if line.endswith(']'):
                tables[current][key] = _value(so_far, path, first)
                pending = None
            else:
                pending = (key, so_far, first)
            continue
        if not line:
            continue
        table = _TABLE.match(line)
        if table:
            current = table.group(1)
            tables.setdefault(current, {})
            continue
        pair = _KEY.match(line)
        if not pair:
            raise ConfError('%s line %d: %r is neither [table] nor key = value; fix the file (it is TOML)'
                            % (path, number, line[:60]))
        key, value = pair.group(1), pair.group(2).strip()
        if value.startswith('[') and not value.endswith(']'):
            pending = (key, value, number)
            continue
        tables[current][key] = _value(value, path, number)
    if pending is not None:
        raise ConfError('%s line %d: the array of %s is never closed with ]; fix the file (it is TOML)'
                        % (path, pending[2], pending[0]))
    return tables


def parse(text: str, path: str) -> Dict[str, Any]:
    """containers.conf as a dict of tables; ConfError (file, line, fix) when it is not TOML."""
    if _tomllib is not None:
        try:
            return _tomllib.loads(text)
        except _tomllib.TOMLDecodeError as exc:
            raise ConfError('%s: not valid TOML (%s); fix the file, Podman refuses it too' % (path, exc)) from None
    return parse_subset(text, path)


# --- the refusal -------------------------------------------------------------------------------------

def _option_refusals(path: str, key: str, options: List[str]) -> List[Refusal]:
    out = []
    for index, option in enumerate(options):
        word = option.strip()
        name, _sep, inline = word.partition('=')
        if name == '--map-host-loopback':
            address = inline or (options[index + 1].strip() if index + 1 < len(options) else '')
            shown = ('--map-host-loopback %s' % address).strip()
            out.append(Refusal(path, key, shown, 'maps the host\'s loopback to %s inside every container, an address '
                               'the destination guard does not know' % (address or 'an address'),
                               FIX_PASTA_LOOPBACK % (shown, key, path)))
        elif name == '--map-gw':
            out.append(Refusal(path, key, '--map-gw', 'makes the network\'s gateway address the host\'s loopback, so '
                               'every service bound to 127.0.0.1 on the host answers a container',
                               FIX_PASTA_GW % (key, path)))
        for part in word.split(','):  # slirp4netns options come as one comma list or one per item
            if part.strip().startswith('cidr='):
                out.append(Refusal(path, key, part.strip(), 'moves slirp4netns\'s network, so the host\'s loopback '
                                   'appears at an address the destination guard does not know',
                                   FIX_CIDR % (part.strip(), key, path)))
    return out


def _cgroups_refusal(document: Mapping[str, Any], path: str) -> List[Refusal]:
    """``[containers] cgroups = "disabled"``: every limit of the proxy holds only on paper.

    Measured with Podman 5.4.2 (cgroup v1): with the key set, ``podman run --memory=512m
    --pids-limit=256`` is accepted without a word and ``podman inspect`` reports both limits, so the
    drift comparison sees the shape it wants; but the process stays in its parent's memory and pids
    cgroups, whose limit is unlimited.
    """
    section = document.get('containers')
    if not isinstance(section, Mapping) or 'cgroups' not in section:
        return []
    value = section['cgroups']
    if not isinstance(value, str):
        raise ConfError('%s: [containers] cgroups must be a string ("enabled", "no-conmon" or "disabled"), not %r; '
                        'fix the file' % (path, value))
    if value.strip().lower() != 'disabled':
        return []
    return [Refusal(path, CGROUPS_KEY, '"%s"' % value, 'runs every container without a cgroup of its own, '
                    'so the proxy\'s memory and pids limits do not hold while podman inspect still reports them (a '
                    'job can exhaust the host through the proxy, and the drift check cannot see it)',
                    FIX_CGROUPS % path)]


CGROUPS_KEY = '[containers] cgroups'


def split_consented(refused: List[Refusal], limits_unenforced_ok: bool) -> Tuple[List[Refusal], List[Refusal]]:
    """(still refused, consented): with the operator's consent to unenforced limits, the cgroups setting moves
    to the second list; a setting that maps the host into containers never does."""
    if not limits_unenforced_ok:
        return list(refused), []
    return ([item for item in refused if item.key != CGROUPS_KEY],
            [item for item in refused if item.key == CGROUPS_KEY])


def refusals(document: Mapping[str, Any], path: str) -> List[Refusal]:
    """Every setting of one parsed file that maps the host into containers or unbinds the proxy's limits."""
    out = []
    for table, key in OPTION_KEYS:
        section = document.get(table)
        if not isinstance(section, Mapping) or key not in section:
            continue
        value = section[key]
        name = '[%s] %s' % (table, key)
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise ConfError('%s: %s must be an array of strings, not %r; fix the file' % (path, name, value))
        out += _option_refusals(path, name, value)
    return out + _cgroups_refusal(document, path)


def check_files(paths: Iterable[str]) -> Tuple[List[str], List[Refusal]]:
    """(files read, refusals) over existing files; ConfError for one that cannot be read or parsed."""
    read, found = [], []
    for path in expand(paths):
        try:
            with open(path, 'rb') as handle:
                text = handle.read().decode('utf-8')
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfError('%s: could not be read (%s); fix its permissions or encoding (UTF-8)' % (path, exc)) \
                from None
        read.append(path)
        found += refusals(parse(text, path), path)
    return read, found
