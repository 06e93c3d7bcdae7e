# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""A project's protocol opt-ins for a transparent job network (docs/transparent.md, "The policy file").

The file is seed 001's ``.pi-container/config.yaml``; only ``egress.allow`` is read (other keys of
the file belong to other tools and are left alone); :data:`SEED` is its deny-all form, the seed's own text.

Each protocol is ``false`` (closed), ``true`` (open towards every name the job's resolver answers:
the doctor warns) or, beyond the seed, a list of host names (open towards those names only, at the
addresses the gateway's resolver answered for them). ``tcp_ports`` / ``udp_ports`` hold ports, or
``{port: N, hosts: [names]}``. A project without the file gets the seed's deny-all text, written
create-only. Everything else is refused, naming the file, the key, the value and the fix; nothing is
repaired. Pure logic, but :func:`load` (which reads and seeds the file).
"""

from __future__ import annotations

import os
import stat
from typing import Any, Dict, List, Optional, Tuple, Union

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import files as _files
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import hostnames as _hostnames

SEED = """\
# .pi-container/config.yaml
egress:
  allow:
    ssh: false            # TCP 22 (e.g. git over SSH)
    smtp: false           # TCP 25, 465, 587
    git: false            # TCP 9418 (git://)
    ntp: false            # UDP 123
    tcp_ports: []         # arbitrary extra TCP ports, e.g. [2222, 8443]
    udp_ports: []         # arbitrary extra UDP ports, e.g. [51820]
"""

# protocol -> (transport, ports)
PROTOCOLS = {
    'ssh': ('tcp', (22,)),
    'smtp': ('tcp', (25, 465, 587)),
    'git': ('tcp', (9418,)),
    'ntp': ('udp', (123,)),
}
PORT_LISTS = {'tcp_ports': 'tcp', 'udp_ports': 'udp'}
# The gateway's own ports on a job network: they are always the resolver's and the proxy's.
RESERVED = {'tcp': (53, 80, 443), 'udp': (53,)}
MAX_BYTES = 65536

Value = Union[bool, List[str]]


class OptinError(Exception):
    """The project policy is refused; the message names the file, the key and the fix."""


class Optins(object):
    """What a job may reach beyond 80/443 through its gateway.

    ``ports``: ``{'tcp': {port: True | [names]}, 'udp': {...}}``; ``wide``: the keys set to ``true``;
    ``seeded``: the file was missing and this call wrote the deny-all seed; ``path``.
    """

    def __init__(self, ports: Dict[str, Dict[int, Value]], wide: List[str], path: Optional[str] = None,
                 seeded: bool = False) -> None:
        self.ports = ports
        self.wide = wide
        self.path = path
        self.seeded = seeded

    def names(self) -> List[str]:
        out = set()
        for table in self.ports.values():
            for value in table.values():
                if isinstance(value, list):
                    out.update(value)
        return sorted(out)

    def as_config(self) -> Dict[str, Dict[str, Value]]:
        """The gateway's form (JSON keys are text)."""
        return dict((proto, dict((str(p), v) for p, v in sorted(table.items())))
                    for proto, table in self.ports.items())

    def as_dict(self) -> Dict[str, Any]:
        return dict(path=self.path, seeded=self.seeded, wide=list(self.wide), ports=self.as_config())


def deny_all(path: Optional[str] = None, seeded: bool = False) -> Optins:
    return Optins({'tcp': {}, 'udp': {}}, [], path, seeded)


def _problem(path: str, key: str, value: Any, rule: str, fix: str) -> OptinError:
    return OptinError('%s: egress.allow.%s = %r %s. Fix: %s. Nothing was created.' % (path, key, value, rule, fix))


def _hosts(path: str, key: str, value: Any) -> List[str]:
    if not isinstance(value, list) or not value:
        raise _problem(path, key, value, 'is not a non-empty list of host names',
                       'write true, false, or a list such as [github.com]')
    out = []
    for item in value:
        if not isinstance(item, str):
            raise _problem(path, key, item, 'is not a host name', 'write a host name such as github.com')
        name = item.strip().lower().rstrip('.')
        problem = _hostnames.name_problem(name) if name and not name.startswith('.') else ('bad', None)
        if problem or _hostnames.is_ipv4(name) or '.' not in name:
            raise _problem(path, key, item, 'is not a fully qualified host name (an IP literal or a wildcard '
                           'is not accepted: a transparent job reaches only names its resolver answers)',
                           'name the host, e.g. github.com')
        if name not in out:
            out.append(name)
    return out


def _merge(table: Dict[int, Value], port: int, value: Value) -> None:
    have = table.get(port)
    if have is True or value is True:
        table[port] = True
    elif have:
        table[port] = sorted(set(have) | set(value))  # type: ignore[arg-type]
    else:
        table[port] = list(value)  # type: ignore[arg-type]


def _port(path: str, key: str, value: Any, proto: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise _problem(path, key, value, 'is not a port (1 to 65535)', 'write a port number such as 2222')
    if value in RESERVED[proto]:
        raise _problem(path, key, value, 'is the gateway\'s own port (DNS, and 80/443 through the proxy\'s '
                       'allowlist)', 'list the host in the allowlist instead; remove this port')
    return value


def validate(data: Any, path: str) -> Optins:
    """The opt-ins of a parsed policy file (``data``: the whole YAML document)."""
    if data is None:
        return deny_all(path)
    if not isinstance(data, dict):
        raise OptinError('%s is not a mapping (it holds %s). Fix: write the seed\'s form (egress: allow: ...). '
                         'Nothing was created.' % (path, type(data).__name__))
    egress = data.get('egress')
    if egress is None:
        return deny_all(path)
    if not isinstance(egress, dict) or set(egress) - {'allow'}:
        raise OptinError('%s: egress must be a mapping with the one key allow (it has %s). Fix: move other '
                         'keys out of egress. Nothing was created.'
                         % (path, sorted(egress) if isinstance(egress, dict) else type(egress).__name__))
    allow = egress.get('allow')
    if allow is None:
        return deny_all(path)
    if not isinstance(allow, dict):
        raise OptinError('%s: egress.allow is not a mapping. Fix: write the seed\'s keys (ssh, smtp, git, ntp, '
                         'tcp_ports, udp_ports). Nothing was created.' % path)
    ports = {'tcp': {}, 'udp': {}}  # type: Dict[str, Dict[int, Value]]
    wide = []
    for key in sorted(allow, key=str):
        value = allow[key]
        if key in PROTOCOLS:
            proto, numbers = PROTOCOLS[key]
            if value is False or value is None:
                continue
            opened = True if value is True else _hosts(path, key, value)  # type: Value
            if value is True:
                wide.append(key)
            for number in numbers:
                _merge(ports[proto], number, opened)
        elif key in PORT_LISTS:
            proto = PORT_LISTS[key]
            if value is None:
                continue
            if not isinstance(value, list):
                raise _problem(path, key, value, 'is not a list', 'write a list such as [2222] or '
                               '[{port: 2222, hosts: [git.example.com]}]')
            for item in value:
                if isinstance(item, dict):
                    extra = set(item) - {'port', 'hosts'}
                    if extra or 'port' not in item or 'hosts' not in item:
                        raise _problem(path, key, item, 'needs exactly the keys port and hosts',
                                       'write {port: 2222, hosts: [git.example.com]}')
                    _merge(ports[proto], _port(path, key, item['port'], proto),
                           _hosts(path, '%s.hosts' % key, item['hosts']))
                else:
                    _merge(ports[proto], _port(path, key, item, proto), True)
                    if '%s %s' % (key, item) not in wide:
                        wide.append('%s %s' % (key, item))
        else:
            raise OptinError('%s: egress.allow.%s is not a known key. Fix: use ssh, smtp, git, ntp, tcp_ports or '
                             'udp_ports. Nothing was created.' % (path, key))
    return Optins(ports, wide, path)


def _parse_yaml(text: str, path: str) -> Any:
    try:
        import yaml
    except ImportError:
        raise OptinError('Reading %s needs PyYAML in the Python that runs the job-network API. Fix: pip install '
                         'PyYAML (ansible-core brings it). Nothing was created.' % path)

    class _Strict(yaml.SafeLoader):
        """safe_load that refuses a key written twice (YAML would keep the last one silently)."""

    def _mapping(loader: Any, node: Any, deep: bool = False) -> Any:
        seen = set()
        for key_node, _value in node.value:
            key = loader.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, 'the key %r is written twice' % (key,),
                                                        key_node.start_mark)
            seen.add(key)
        return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)

    _Strict.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
    try:
        return yaml.load(text, Loader=_Strict)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, 'problem_mark', None)
        where = ' line %d' % (mark.line + 1) if mark is not None else ''
        raise OptinError('%s%s is not valid YAML (%s). Fix: correct the line, or remove the file to get the '
                         'deny-all seed. Nothing was created.' % (path, where, getattr(exc, 'problem', exc)))


def load(path: str) -> Optins:
    """Read a project's policy file; write the deny-all seed (create-only) when there is none.

    A symlink, a directory, an oversized or undecodable file is refused, naming the path.
    """
    if not path or not os.path.isabs(path):
        raise OptinError('The project policy path %r is not absolute. Fix: pass the absolute path of the '
                         "project's .pi-container/config.yaml. Nothing was created." % (path,))
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        parent = os.path.dirname(path)
        if not os.path.isdir(parent):
            raise OptinError('%s does not exist, and neither does its folder %s. Fix: create the project\'s '
                             '.pi-container folder (or pass the right path). Nothing was created.' % (path, parent))
        created = _files.create_exclusive(path, SEED, 0o644)
        if created:
            return deny_all(path, seeded=True)
        st = os.lstat(path)  # another job of the project wrote it first
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
        raise OptinError('%s is %s, not a regular file. Fix: replace it with the file itself. Nothing was '
                         'created.' % (path, 'a symlink' if stat.S_ISLNK(st.st_mode) else 'not a file'))
    if st.st_size > MAX_BYTES:
        raise OptinError('%s is %d bytes, more than %d. Fix: keep the policy file small. Nothing was created.'
                         % (path, st.st_size, MAX_BYTES))
    with open(path, 'rb') as handle:
        raw = handle.read(MAX_BYTES + 1)
    try:
        text = raw.decode('utf-8-sig')
    except UnicodeDecodeError as exc:
        raise OptinError('%s is not UTF-8 (byte %d). Fix: save it as UTF-8. Nothing was created.' % (path, exc.start))
    return validate(_parse_yaml(text, path), path)


def describe(optins: Optins) -> List[Tuple[str, str]]:
    """(port, towards) lines for docs, the doctor and errors."""
    out = []
    for proto in ('tcp', 'udp'):
        for port, value in sorted(optins.ports[proto].items()):
            out.append(('%s/%d' % (proto, port), 'any name the resolver answers' if value is True
                        else ', '.join(value)))  # type: ignore[arg-type]
    return out
