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
repaired. :func:`load` reads and seeds the file with no link followed (a symlinked ``.pi-container`` or
``config.yaml`` is refused).

The file is in the checkout the project's jobs write, so what it opens takes effect only in the form the
operator approved (docs/transparent.md, "Approving a project's opt-ins"): :func:`approve` keeps the
digest of the opt-ins in ``<deploy_dir>/optins-approved/``, outside every project; :func:`check_approved`
refuses, with the diff and the approving command, a policy that opens anything and is not the approved
one. A policy that opens nothing needs no approval. Pure logic, but :func:`load`, :func:`read_approval`
and :func:`approve`.
"""

from __future__ import annotations

import binascii
import difflib
import errno
import hashlib
import json
import os
import shlex
import stat
import time
from typing import Any, Dict, List, Optional, Tuple, Union

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment
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
# What one project may open (issue 42, item 5): the gateway opens one listener per TCP port and a set of
# sockets per UDP port on each job network of the project, from one file-descriptor budget for all jobs.
MAX_PORTS = {'tcp': 8, 'udp': 4}
MAX_HOSTS = 32   # names per key

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
    if len(value) > MAX_HOSTS:
        raise OptinError('%s: egress.allow.%s lists %d names; a key names at most %d names. Fix: list only the hosts '
                         'the project reaches on that port. Nothing was created.' % (path, key, len(value), MAX_HOSTS))
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
    for proto in ('tcp', 'udp'):
        if len(ports[proto]) > MAX_PORTS[proto]:
            raise OptinError('%s: egress.allow opens %d %s ports (%s); a project opens at most %d. Fix: open only '
                             'the ports the project uses (smtp alone is 3). Nothing was created.'
                             % (path, len(ports[proto]), proto.upper(), ', '.join(str(p) for p in sorted(ports[proto])),
                                MAX_PORTS[proto]))
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


# --- reading and seeding the file, no link followed ------------------------------------------------------


def _is_link(path: str) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        return False


def _open_folder(folder: str, what: str, fix: str) -> int:
    """A descriptor of ``folder``, opened without following a symlink in its place (FileNotFoundError when absent).

    A symlink is refused naming the folder, what it is (``what``) and ``fix``: whoever can write the folder's
    parent could point it anywhere.
    """
    try:
        return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if _is_link(folder):
            raise OptinError('%s (%s) is a symlink: it is never followed, since a job could point it anywhere. '
                             'Fix: %s. Nothing was created.' % (folder, what, fix))
        raise OptinError('%s (%s) cannot be opened as a folder (%s). Fix: %s. Nothing was created.'
                         % (folder, what, exc.strerror or exc, fix))


def _write_new(dfd: int, name: str, data: bytes, mode: int) -> str:
    """A new file in ``dfd`` holding ``data`` (fsynced, ``mode``), under a random name; returns that name."""
    for _attempt in range(8):
        tmp = '.%s.%s.tmp' % (name, binascii.hexlify(os.urandom(6)).decode('ascii'))
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
        except FileExistsError:
            continue
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, mode)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp, dir_fd=dfd)
            raise
        os.close(fd)
        return tmp
    raise OSError(errno.EEXIST, 'no free temporary name')


def _seed(dfd: int, name: str) -> bool:
    """Write the deny-all seed as ``name`` in ``dfd`` unless something has that name. True when written.

    Atomic and exclusive (a temporary file hard-linked to the name; no link followed), so a concurrent
    create or an existing file, symlink included, always wins and a reader never sees half a seed.
    """
    tmp = _write_new(dfd, name, SEED.encode('utf-8'), 0o644)
    try:
        try:
            os.link(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
        except FileExistsError:
            return False
        return True
    finally:
        os.unlink(tmp, dir_fd=dfd)


_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def _read_no_follow(dfd: int, name: str, path: str) -> bytes:
    """The bytes of ``name`` in ``dfd`` (FileNotFoundError when absent); a symlink, a folder, a FIFO or an oversized
    file is refused naming ``path`` (opened non-blocking, with no link followed, judged on the open file)."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dfd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OptinError('%s is a symlink, not a regular file. Fix: replace it with the file itself. Nothing was '
                             'created.' % path)
        raise OptinError('%s cannot be read (%s). Fix: make it a readable regular file. Nothing was created.'
                         % (path, exc.strerror or exc))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OptinError('%s is not a regular file (a folder, a FIFO or a device). Fix: replace it with the file '
                             'itself. Nothing was created.' % path)
        if st.st_size > MAX_BYTES:
            raise OptinError('%s is %d bytes, more than %d. Fix: keep the policy file small. Nothing was created.'
                             % (path, st.st_size, MAX_BYTES))
        chunks = []
        size = 0
        while size <= MAX_BYTES:
            chunk = os.read(fd, MAX_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        raw = b''.join(chunks)
    finally:
        os.close(fd)
    if len(raw) > MAX_BYTES:
        raise OptinError('%s is more than %d bytes. Fix: keep the policy file small. Nothing was created.'
                         % (path, MAX_BYTES))
    return raw


def load(path: str, seed: bool = True) -> Optins:
    """Read a project's policy file; write the deny-all seed (create-only) when there is none.

    No link is followed: a symlinked ``.pi-container`` folder or policy file is refused, naming the path and the
    fix, and nothing is written through it. A directory, a FIFO, an oversized or undecodable file is refused,
    naming the path. ``seed=False`` (approving) refuses a missing file instead of seeding it.
    """
    if not path or not os.path.isabs(path):
        raise OptinError('The project policy path %r is not absolute. Fix: pass the absolute path of the '
                         "project's .pi-container/config.yaml. Nothing was created." % (path,))
    parent, name = os.path.split(path)
    if not name:
        raise OptinError('The project policy path %s names a folder. Fix: pass the path of the project\'s '
                         '.pi-container/config.yaml. Nothing was created.' % path)
    try:
        dfd = _open_folder(parent, 'the folder of the project policy %s' % name,
                           'replace the symlink with a real folder (rm %s; mkdir %s), or pass the real path'
                           % (shlex.quote(parent), shlex.quote(parent)))
    except FileNotFoundError:
        raise OptinError('%s does not exist, and neither does its folder %s. Fix: create the project\'s '
                         '.pi-container folder (or pass the right path). Nothing was created.' % (path, parent))
    try:
        try:
            raw = _read_no_follow(dfd, name, path)
        except FileNotFoundError:
            if not seed:
                raise OptinError('%s does not exist: a project without it opens nothing, and there is nothing to '
                                 'approve. Fix: pass the path of the policy file to approve.' % path)
            if _seed(dfd, name):
                return deny_all(path, seeded=True)
            raw = _read_no_follow(dfd, name, path)  # another job of the project wrote it first
    except FileNotFoundError:
        raise OptinError('%s was removed while it was read. Fix: retry. Nothing was created.' % path)
    except OSError as exc:
        raise OptinError('%s cannot be read or seeded (%s). Fix: make its folder writable by the dispatcher, or '
                         'write the file. Nothing was created.' % (path, exc.strerror or exc))
    finally:
        os.close(dfd)
    try:
        text = raw.decode('utf-8-sig')
    except UnicodeDecodeError as exc:
        raise OptinError('%s is not UTF-8 (byte %d). Fix: save it as UTF-8. Nothing was created.' % (path, exc.start))
    return validate(_parse_yaml(text, path), path)


# --- the operator's approval ----------------------------------------------------------------------------
#
# A project's policy file lives in the checkout its jobs write, so a job can change what the NEXT job may
# open. What a file opens takes effect only in the form the operator approved: the approval (the digest of
# the opt-ins, and what they open, for the diff) is kept in the deployment folder, outside every project,
# one file per policy path. A policy that opens nothing (the seed) needs no approval.

APPROVALS = 'optins-approved'
CLI = 'python3 -m ansible_collections.pi_dispatch.egress.plugins.module_utils.jobnet_cli'
RECORD_VERSION = 1
ANY = 'any name the resolver answers'


def _normal(config: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """The gateway form (``as_config``) with every host list sorted: the order of names opens nothing more."""
    return dict((proto, dict((str(port), True if value is True else sorted(value))
                             for port, value in (config.get(proto) or {}).items()))
                for proto in ('tcp', 'udp'))


def digest_of(config: Dict[str, Any]) -> str:
    """``sha256:<hex>`` of a policy's opt-ins (the gateway form): what is approved, never the file's other keys."""
    text = json.dumps(_normal(config), sort_keys=True, separators=(',', ':'))
    return 'sha256:' + hashlib.sha256(text.encode('utf-8')).hexdigest()


def digest(optins: Optins) -> str:
    return digest_of(optins.as_config())


def opens_anything(optins: Optins) -> bool:
    return any(optins.ports[proto] for proto in optins.ports)


def lines_of(config: Dict[str, Any]) -> List[str]:
    """What a policy opens, one ``tcp/22 towards github.com`` line per port (the diff's lines)."""
    out = []
    normal = _normal(config)
    for proto in ('tcp', 'udp'):
        for port in sorted(normal[proto], key=int):
            value = normal[proto][port]
            out.append('%s/%s towards %s' % (proto, port, ANY if value is True else ', '.join(value)))
    return out


def diff_lines(approved: Optional[Dict[str, Any]], optins: Optins) -> List[str]:
    """The unified diff of what the approval opens and what the file opens now (policy lines only)."""
    before = lines_of(approved['ports']) if approved else []
    after = lines_of(optins.as_config())
    head = 'approved %s' % approved['approved_at'] if approved else 'approved: nothing (never approved)'
    out = []
    for line in difflib.unified_diff(before, after, head, '%s now' % optins.path, n=len(before) + len(after),
                                     lineterm=''):
        if not line.startswith('@@'):
            out.append(line)
    return out


def approval_path(deploy_dir: str, policy_path: str) -> str:
    """Where the approval of ``policy_path`` is kept: ``<deploy_dir>/optins-approved/<sha256 of the path>.json``."""
    key = hashlib.sha256(os.path.normpath(policy_path).encode('utf-8', 'surrogateescape')).hexdigest()[:32]
    return os.path.join(deploy_dir, APPROVALS, key + '.json')


def approve_command(policy_path: str, deploy_dir: str, digest_text: str) -> str:
    """The command line that approves exactly the policy of ``digest_text``."""
    folder = os.path.dirname(policy_path)
    if os.path.basename(policy_path) == 'config.yaml' and os.path.basename(folder) == '.pi-container':
        where = '--project %s' % shlex.quote(os.path.dirname(folder))
    else:
        where = '--policy %s' % shlex.quote(policy_path)
    return '%s approve-optins %s --deploy-dir %s --digest %s' % (CLI, where, shlex.quote(deploy_dir), digest_text)


def _check_record(data: Any, record: str, policy_path: str, deploy_dir: str) -> Dict[str, Any]:
    fine = (isinstance(data, dict) and data.get('version') == RECORD_VERSION
            and data.get('policy') == os.path.normpath(policy_path) and isinstance(data.get('ports'), dict)
            and isinstance(data.get('approved_at'), str) and isinstance(data.get('digest'), str))
    if fine:
        try:
            fine = digest_of(data['ports']) == data['digest']
        except (TypeError, AttributeError):
            fine = False
    if not fine:
        raise OptinError('%s is not a valid approval of %s (edited by hand, or of another version). Fix: remove it '
                         'and approve the policy again (%s approve-optins ... --deploy-dir %s). Nothing was created.'
                         % (record, policy_path, CLI, shlex.quote(deploy_dir)))
    return data


def read_approval(deploy_dir: str, policy_path: str) -> Optional[Dict[str, Any]]:
    """The approval record of ``policy_path`` in ``deploy_dir``, or None (never approved). No link is followed."""
    record = approval_path(deploy_dir, policy_path)
    folder, name = os.path.split(record)
    try:
        dfd = _open_folder(folder, 'the approvals of project opt-ins', 'replace it with a real folder the operator '
                           'owns, and approve again')
    except FileNotFoundError:
        return None
    try:
        try:
            raw = _read_no_follow(dfd, name, record)
        except FileNotFoundError:
            return None
    finally:
        os.close(dfd)
    try:
        data = json.loads(raw.decode('utf-8'))
    except ValueError:
        data = None
    return _check_record(data, record, policy_path, deploy_dir)


def refusal(optins: Optins, approved: Optional[Dict[str, Any]], deploy_dir: str) -> Optional[str]:
    """Why ``optins`` may not take effect given the operator's approval ``approved`` (None: never), or None.

    Pure. A policy that opens nothing needs no approval; any other takes effect only when its digest is the
    approved one. The message shows the diff of the policy's lines (ports and host names, never another key of
    the file) and the exact command that approves this policy.
    """
    if not opens_anything(optins):
        return None
    now = digest(optins)
    if approved is not None and approved.get('digest') == now:
        return None
    path = optins.path or 'the project policy'
    if approved is None:
        why = ('opens ports that were never approved (a policy that opens nothing needs no approval; one that opens '
               'a port needs the operator\'s, kept in %s)' % os.path.join(deploy_dir, APPROVALS))
        restore = 'remove the opt-ins (or the file: the deny-all seed is written again)'
    else:
        why = ('changed since its opt-ins were approved on %s (approved %s, now %s)'
               % (approved['approved_at'], approved['digest'], now))
        restore = 'restore the approved opt-ins (git checkout -- .pi-container/config.yaml in the project)'
    diff = '\n'.join('    ' + line for line in diff_lines(approved, optins))
    return ('%s %s:\n%s\nA job of the project can write this file, so what it opens takes effect only with the '
            'operator\'s consent. Fix: review the change above; if the project means it, approve exactly this '
            'policy with: %s ; otherwise %s. Nothing was created.'
            % (path, why, diff, approve_command(path, deploy_dir, now), restore))


def check_approved(optins: Optins, deploy_dir: str) -> None:
    """Raise OptinError (the diff and the approving command) unless ``optins`` may take effect (:func:`refusal`)."""
    if not opens_anything(optins):
        return
    if not deploy_dir or not os.path.isabs(deploy_dir):
        raise OptinError('The deployment folder %r that keeps the approvals of project opt-ins is not absolute. Fix: '
                         'pass the absolute path of the deployment folder. Nothing was created.' % (deploy_dir,))
    message = refusal(optins, read_approval(deploy_dir, optins.path or ''), deploy_dir)
    if message:
        raise OptinError(message)


def _who() -> str:
    try:
        import pwd
        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return 'uid %d' % os.getuid()


def approve(policy_path: str, deploy_dir: str, digest_text: Optional[str] = None, check_mode: bool = False,
            now: Optional[float] = None) -> Dict[str, Any]:
    """Approve the opt-ins ``policy_path`` holds now, when their digest is ``digest_text`` (the one reviewed).

    Returns dict(changed, policy, approval (the record's path), digest, opens (lines), diff (against the last
    approval), approved_before (its digest or None), command). ``check_mode`` approves nothing and tells what
    would change (``digest_text`` may then be None). Raises OptinError when the file is refused, when
    ``digest_text`` is not the digest of what the file holds now (it changed since it was reviewed: nothing is
    approved), or when the deployment folder is not a folder.
    """
    if not deploy_dir or not os.path.isabs(deploy_dir):
        raise OptinError('The deployment folder %r is not absolute. Fix: pass --deploy-dir with the absolute path of '
                         'the deployment folder (default %s). Nothing was approved.'
                         % (deploy_dir, _deployment.DEFAULT_DEPLOY_DIR))
    if not os.path.isdir(deploy_dir):
        raise OptinError('The deployment folder %s does not exist. Fix: pass --deploy-dir with the deployment folder '
                         'the dispatcher gives create (deploy_dir). Nothing was approved.' % deploy_dir)
    optins = load(policy_path, seed=False)
    approved = read_approval(deploy_dir, policy_path)
    now_digest = digest(optins)
    record = approval_path(deploy_dir, policy_path)
    result = dict(policy=policy_path, approval=record, digest=now_digest, opens=lines_of(optins.as_config()),
                  diff=diff_lines(approved, optins), approved_before=approved['digest'] if approved else None,
                  command=approve_command(policy_path, deploy_dir, now_digest),
                  changed=approved is None or approved['digest'] != now_digest)
    if check_mode or not result['changed']:
        if not check_mode and digest_text is not None and digest_text != now_digest:
            raise _changed_since_review(policy_path, digest_text, now_digest, result)
        return result
    if digest_text is None:
        raise OptinError('Approving %s needs the digest of the policy you reviewed. Fix: review what it opens (run '
                         'with --check), then pass --digest %s. Nothing was approved.' % (policy_path, now_digest))
    if digest_text != now_digest:
        raise _changed_since_review(policy_path, digest_text, now_digest, result)
    stamp = time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(now))
    data = dict(version=RECORD_VERSION, policy=os.path.normpath(policy_path), digest=now_digest,
                ports=_normal(optins.as_config()), opens=result['opens'], approved_at=stamp, approved_by=_who())
    _write_record(deploy_dir, record, (json.dumps(data, indent=2, sort_keys=True) + '\n').encode('utf-8'))
    return result


def _changed_since_review(policy_path: str, reviewed: str, now_digest: str, result: Dict[str, Any]) -> OptinError:
    return OptinError('%s changed since it was reviewed: the digest given is %s, the policy now is %s and opens:\n%s\n'
                      'Nothing was approved. Fix: review what it opens now; if the project means it, run: %s'
                      % (policy_path, reviewed, now_digest,
                         '\n'.join('    ' + line for line in result['opens']) or '    nothing', result['command']))


def _write_record(deploy_dir: str, record: str, data: bytes) -> None:
    folder, name = os.path.split(record)
    try:
        os.mkdir(folder, 0o755)
    except FileExistsError:
        pass
    dfd = _open_folder(folder, 'the approvals of project opt-ins', 'replace it with a real folder the operator owns')
    try:
        tmp = _write_new(dfd, name, data, 0o644)
        try:
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            tmp = None
            os.fsync(dfd)
        finally:
            if tmp is not None:
                os.unlink(tmp, dir_fd=dfd)
    finally:
        os.close(dfd)


def describe(optins: Optins) -> List[Tuple[str, str]]:
    """(port, towards) lines for docs, the doctor and errors."""
    out = []
    for proto in ('tcp', 'udp'):
        for port, value in sorted(optins.ports[proto].items()):
            out.append(('%s/%d' % (proto, port), 'any name the resolver answers' if value is True
                        else ', '.join(value)))  # type: ignore[arg-type]
    return out
