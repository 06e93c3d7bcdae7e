# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""Credential placeholders: the ``egress-credentials.json`` contract.

A job gets a placeholder (``pi-placeholder-<name>-<token>``) instead of a real secret; the interceptor swaps
it for the secret only on requests to the bound host. The declaration is refused, never repaired: each
problem names the file, the credential (index and name), the key, the value, the rule and the fix; nothing
is converted (only the header name is stored lowercased). :func:`parse` never reads a secret, and
:func:`check_secret` and :func:`read_secret` never put a byte of one in a message.
"""

from __future__ import annotations

import ipaddress
import hashlib
import json
import operator
import os
import re
import secrets
import stat
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, Union

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import endpoints as _endpoints
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import hostnames as _hostnames
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy.endpoint_hosts import type_name as _type_name

FILE_NAME = 'egress-credentials.json'
SUPPORTED_VERSION = 1
EMPTY_DECLARATION = json.dumps({'version': SUPPORTED_VERSION, 'credentials': []}, indent=2) + '\n'
PLACEHOLDER_PREFIX = 'pi-placeholder-'
SCHEMES = ('header', 'bearer', 'basic')
DEFAULT_HEADER = 'authorization'  # bearer and basic, when "header" is left out
PORT = 443
MAX_SECRET_BYTES = 8192
MAX_CREDENTIALS = 32
MAX_FILE_BYTES = 256 * 1024
SECRETS_ROOT = '/run/pi-secrets'

TOP_KEYS = ('version', 'credentials')
CREDENTIAL_KEYS = ('name', 'host', 'port', 'env', 'scheme', 'header', 'secret_file')
REQUIRED_KEYS = ('name', 'host', 'port', 'env', 'scheme', 'secret_file')

# The variables common clients read for a CA file (node, OpenSSL and python, requests, git).
CA_ENV = ('NODE_EXTRA_CA_CERTS', 'SSL_CERT_FILE', 'REQUESTS_CA_BUNDLE', 'GIT_SSL_CAINFO')
_PROXY_ENV = ('HTTP_PROXY', 'HTTPS_PROXY', 'NO_PROXY', 'ALL_PROXY')
RESERVED_ENV = CA_ENV + _PROXY_ENV + tuple(v.lower() for v in _PROXY_ENV) + ('PATH', 'HOME')
# Headers that frame or route the request, or carry another party's credential: never a secret's.
FORBIDDEN_HEADERS = ('host', 'content-length', 'transfer-encoding', 'connection', 'cookie', 'proxy-authorization')

# \Z, not $: a $ would let a trailing newline through.
NAME_RE = re.compile(r'^[a-z][a-z0-9-]{0,31}\Z')
ENV_RE = re.compile(r'^[A-Z_][A-Z0-9_]{0,63}\Z')
HEADER_RE = re.compile(r'^[A-Za-z0-9-]{1,64}\Z')
TOKEN_RE = re.compile(r'^[0-9a-f]{32}\Z')  # what the interceptor scans requests for
PLACEHOLDER_RE = re.compile(r'^%s[a-z][a-z0-9-]{0,31}-[0-9a-f]{32}\Z' % re.escape(PLACEHOLDER_PREFIX))

_show = _endpoints._show
_is_int = _endpoints._is_int
_SHAPE = '{"version": 1, "credentials": [...]}'
_BY_NAME = operator.attrgetter('name')


class Problem(_endpoints.DeclarationProblem):
    """One refusal of credentials.json; the item is a credential, named by its name."""

    IDENT = 'name'

    def __init__(self, path: str, key: Optional[str], value: Any, rule: str, fix: str, index: Optional[int] = None,
                 name: Optional[str] = None, present: bool = True) -> None:
        super(Problem, self).__init__(path, key, value, rule, fix, index=index, ident=name, present=present)

    @property
    def name(self) -> Optional[str]:
        return self.ident

    def who(self) -> str:
        who = 'name %s' % json.dumps(self.ident) if isinstance(self.ident, str) and self.ident else 'no valid name'
        return 'credential %d (%s)' % (self.index, who)


class CredentialsError(_endpoints.DeclarationError):
    """credentials.json is refused; ``problems`` lists every reason."""

    UNCHANGED = 'nothing was changed'

    def __init__(self, problems: Iterable[_endpoints.DeclarationProblem], path: str = FILE_NAME) -> None:
        super(CredentialsError, self).__init__(problems, path)


class Credential(object):
    """A validated credential; ``header`` is lowercased, the default filled in. Holds a path, never a secret."""

    __slots__ = ('name', 'host', 'port', 'env', 'scheme', 'header', 'secret_file')

    def __init__(self, name: str, host: str, port: int, env: str, scheme: str, header: str,
                 secret_file: Optional[str] = None) -> None:
        self.name, self.host, self.port, self.env = name, host, port, env
        self.scheme, self.header, self.secret_file = scheme, header, secret_file

    def as_dict(self) -> Dict[str, Any]:
        return dict((slot, getattr(self, slot)) for slot in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Credential) and self.as_dict() == other.as_dict()

    def __repr__(self) -> str:
        return 'Credential(%r)' % (self.as_dict(),)


# --- parse -----------------------------------------------------------------------

def loads_strict(text: Union[str, bytes], path: str = FILE_NAME) -> Any:
    """Strict JSON, as :func:`_endpoints.loads_strict` reads it, refused as a :class:`CredentialsError`."""
    try:
        return _endpoints.loads_strict(text, path)
    except _endpoints.EndpointsError as exc:
        raise CredentialsError([Problem(path, None, None, p.rule, p.fix.replace('"endpoints"', '"credentials"'))
                                for p in exc.problems], path)


_NO_SNI = 'a TLS client sends no SNI for an IP literal, so the bound host could not be checked'
_EXACT = 'write the exact DNS name the client connects to, e.g. "api.example.com"'
_NAME_RULES = {
    _hostnames.TOO_LONG: 'is longer than %d characters' % _hostnames.MAX_NAME,
    _hostnames.EMPTY_LABEL: 'has an empty label (two dots in a row)',
    _hostnames.LONG_LABEL: 'has a label longer than %d characters' % _hostnames.MAX_LABEL,
    _hostnames.NUMERIC_LAST: 'ends in a numeric label, which no DNS name does',
    _hostnames.ALL_NUMERIC: 'is numbers only, which clients read as an IP literal: ' + _NO_SNI,
}


def _is_ip(host: str) -> bool:
    try:
        return bool(ipaddress.ip_address(host.split('%', 1)[0].strip('[]')))
    except ValueError:
        return host.startswith('[') or _hostnames.is_ipv4(host)


def host_problem(host: Any) -> Optional[Tuple[str, str]]:
    """(rule, fix) when ``host`` is not an exact lowercase DNS name of at least two labels, else None."""
    if not isinstance(host, str):
        return 'must be a string, not %s' % _type_name(host), _EXACT
    for failed, rule, fix in (
            (not host, 'must not be empty', _EXACT),
            (_hostnames.has_control_or_space(host), 'contains whitespace or a control character', _EXACT),
            (_hostnames.has_non_ascii(host), 'contains a non-ASCII character', 'write its xn-- (punycode) form'),
            (any(c in host for c in '/@?#'), 'is a URL or has a path, user or query part', 'write only the host'),
            (_is_ip(host), 'is an IP literal: ' + _NO_SNI, 'bind the credential to the DNS name the client uses'),
            (':' in host, 'has a port or colons (host:port)', 'write only the host name; the port goes in "port"'),
            (host != host.lower(), 'has uppercase letters (refused, not lowercased)',
             'write %s' % json.dumps(host.lower())),
            ('*' in host, 'is a wildcard: a credential is bound to one exact host', 'write the exact DNS name'),
            (host.startswith('.'), 'starts with a dot (a domain): a credential is bound to one exact host',
             'write the exact DNS name, without the leading dot'),
            (host.endswith('.'), 'ends with a dot', 'remove the trailing dot')):
        if failed:
            return rule, fix
    problem = _hostnames.name_problem(host)
    if problem is not None and problem[0] == _hostnames.BAD_LABEL:
        return ('label %s is not a DNS label (letters, digits and inner hyphens only)' % json.dumps(problem[1]),
                'write a plain DNS name (no _ or other characters)')
    if problem is not None:
        return _NAME_RULES[problem[0]], _EXACT
    if '.' not in host:
        return 'has one label: a bound host must be a full name of at least two labels', _EXACT
    return None


_EXAMPLES = dict(name='"forge"', env='"GH_TOKEN"', scheme='"bearer"', header='"x-api-key"',
                 secret_file='"/etc/pi-dispatch/secrets/forge"')


def field_problem(key: str, value: Any) -> Optional[Tuple[str, str]]:
    """(rule, fix) when ``value`` breaks the rules of the credential key ``key`` on its own, else None."""
    if key == 'host':
        return host_problem(value)
    if key == 'port':
        if not _is_int(value):
            return 'must be an integer, not %s' % _type_name(value), 'write "port": %d' % PORT
        return None if value == PORT else ('must be %d: the interceptor terminates TLS on %d only' % (PORT, PORT),
                                           'write "port": %d, or remove the credential' % PORT)
    if not isinstance(value, str):
        return 'must be a string, not %s' % _type_name(value), 'write a JSON string, e.g. %s' % _EXAMPLES[key]
    if key == 'name' and not NAME_RE.match(value):
        return ('must match ^[a-z][a-z0-9-]{0,31}$ (a lowercase letter, then up to 31 lowercase letters, digits '
                'or hyphens)', 'rename the credential, e.g. "anthropic"')
    if key == 'env' and not ENV_RE.match(value):
        return ('must match ^[A-Z_][A-Z0-9_]{0,63}$ (uppercase letters, digits and _, not starting with a digit)',
                'write the variable the client reads its key from, e.g. "ANTHROPIC_API_KEY"')
    if key == 'env' and value in RESERVED_ENV:
        return ('is reserved: pi-dispatch sets the proxy, CA, PATH and HOME variables of the job itself',
                'use the variable the client reads its key from')
    if key == 'scheme' and value not in SCHEMES:
        return ('must be one of %s' % ', '.join(SCHEMES),
                'write "header" (the raw secret in "header"), "bearer" (Bearer <secret>) or "basic" (the password)')
    if key == 'header' and not HEADER_RE.match(value):
        return ('must match ^[A-Za-z0-9-]{1,64}$ (a header name: letters, digits and hyphens)',
                'write the bare header name, without a colon or a value, e.g. "x-api-key"')
    if key == 'header' and value.lower() in FORBIDDEN_HEADERS:
        return ('is a header that frames or routes the request or belongs to another party (refused: %s)'
                % ', '.join(FORBIDDEN_HEADERS), 'name the header the API reads its key from')
    if key == 'secret_file':
        if any(ord(c) < 32 or ord(c) == 127 for c in value):
            return 'contains a NUL or control character', 'write a plain absolute path'
        if not value.startswith('/'):
            return 'is not an absolute path', 'write the absolute path, e.g. %s' % _EXAMPLES[key]
        if os.path.normpath(value) != value or value.startswith('//'):
            return ('is not a normalised path (no //, /./, /../ or trailing /)',
                    'write it as %s' % json.dumps(os.path.normpath('/' + value.lstrip('/'))))
    return None


def validate(data: Any, path: str = FILE_NAME, listed: Optional[Callable[[str], bool]] = None) -> List[Credential]:
    """Validate decoded JSON; return [Credential] sorted by name or raise CredentialsError."""
    problems = []  # type: List[Problem]

    def top(key: Optional[str], value: Any, rule: str, fix: str, present: bool = True) -> None:
        problems.append(Problem(path, key, value, rule, fix, present=present))

    if not isinstance(data, dict):
        top(None, data, 'the top level must be an object, not %s' % _type_name(data), 'write %s' % _SHAPE)
        raise CredentialsError(problems, path)
    for key in data:
        if key not in TOP_KEYS:
            top(key, data[key], 'is not a key of the declaration (known: %s)' % ', '.join(TOP_KEYS),
                'remove it; only "version" and "credentials" belong at the top level')
    version, items = data.get('version'), data.get('credentials')
    if 'version' not in data:
        top('version', None, 'is required', 'add "version": %d' % SUPPORTED_VERSION, present=False)
    elif not _is_int(version):
        top('version', version, 'must be an integer, not %s' % _type_name(version), 'write "version": 1')
    elif version != SUPPORTED_VERSION:
        top('version', version, 'is not a version this collection understands (only version %d)' % SUPPORTED_VERSION,
            'write the file in version 1, or upgrade the pi_dispatch.egress collection')
        raise CredentialsError(problems, path)  # another version may mean other keys: judge nothing else
    if 'credentials' not in data:
        top('credentials', None, 'is required', 'add "credentials": [] (empty when nothing is declared)',
            present=False)
        raise CredentialsError(problems, path)
    if not isinstance(items, list):
        top('credentials', items, 'must be a list, not %s' % _type_name(items), 'write "credentials": [{...}]')
        raise CredentialsError(problems, path)
    if len(items) > MAX_CREDENTIALS:
        top('credentials', len(items), 'holds more than %d credentials' % MAX_CREDENTIALS,
            'declare at most %d; remove the ones no job uses' % MAX_CREDENTIALS)

    result = []
    seen = {}  # type: Dict[Tuple[str, Any], Tuple[int, Any]]
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            problems.append(Problem(path, None, item, 'must be an object, not %s' % _type_name(item),
                                    'write {"name": ..., "host": ..., "port": 443, "env": ..., "scheme": ..., '
                                    '"secret_file": ...}', index=index))
            continue
        raw_name = item.get('name')
        before = len(problems)

        def bad(key: str, rule: str, fix: str, present: bool = True) -> None:  # called in this iteration only
            problems.append(Problem(path, key, item.get(key), rule, fix, index=index,
                                    name=raw_name if isinstance(raw_name, str) else None, present=present))

        def unique(key: str, value: Any, rule: str, fix: str) -> None:
            other = seen.setdefault((key, value), (index, raw_name))
            if other[0] != index:
                bad(key, '%s credential %d (name %s)' % (rule, other[0], _show(other[1])), fix)

        for key in item:
            if key not in CREDENTIAL_KEYS:
                bad(key, 'is not a key of a credential (known: %s)' % ', '.join(CREDENTIAL_KEYS),
                    'remove it (check the spelling)')
        good = {}  # type: Dict[str, Any]  # the keys that passed their own rules
        for key in CREDENTIAL_KEYS:
            refused = field_problem(key, item[key]) if key in item else None
            if key not in item and key in REQUIRED_KEYS:
                bad(key, 'is required', 'add "%s" to the credential' % key, present=False)
            elif refused is not None:
                bad(key, *refused)
            elif key in item:
                good[key] = item[key]

        name, host, env, scheme = good.get('name'), good.get('host'), good.get('env'), good.get('scheme')
        header = good['header'].lower() if 'header' in good else None
        if name is not None:
            unique('name', name, 'is already used by', 'give every credential its own name')
        if host is not None and listed is not None and not listed(host):
            bad('host', 'is not listed in egress-allowlist.conf: the bound host must be listed',
                'list it in egress-allowlist.conf or remove the credential')
        if env is not None:
            unique('env', env, 'is already used by', 'give every credential its own variable')
        if 'header' not in item and scheme == 'header':
            bad('header', 'is required when "scheme" is "header" (the header the secret travels in, raw value)',
                'add "header": the header the API reads its key from, e.g. "x-api-key"', present=False)
        elif 'header' not in item and scheme is not None:
            header = DEFAULT_HEADER
        if host is not None and header is not None:
            unique('host', (host, header), 'with header %s is already bound by' % json.dumps(header),
                   'bind one credential per host and header; remove the duplicate')
        if len(problems) == before:
            result.append(Credential(name, host, item['port'], env, scheme, header, good['secret_file']))
    if problems:
        raise CredentialsError(problems, path)
    return sorted(result, key=_BY_NAME)


def parse(text: Union[str, bytes], path: str = FILE_NAME,
          listed: Optional[Callable[[str], bool]] = None) -> List[Credential]:
    """Parse and validate declaration text; return [Credential] sorted by name. ``listed(host)`` False refuses."""
    return validate(loads_strict(text, path), path, listed)


def _read_regular(path: str, info: os.stat_result, limit: int) -> bytes:
    """The content of the regular file ``path`` that ``info`` (its lstat) describes; OSError past ``limit``."""
    flags = os.O_RDONLY | getattr(os, 'O_NOFOLLOW', 0) | getattr(os, 'O_NONBLOCK', 0)  # no link, no FIFO wait
    with os.fdopen(os.open(path, flags), 'rb') as handle:
        opened = os.fstat(handle.fileno())
        data = handle.read(limit + 1)
    if (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino) or len(data) > limit:
        raise OSError(0, 'it was replaced or grew while it was read')
    return data


def load(deploy_dir: str, listed: Optional[Callable[[str], bool]] = None) -> Tuple[List[Credential], str, bool]:
    """Read ``<deploy_dir>/egress-credentials.json``. Returns (credentials, path, exists); missing means none."""
    path = os.path.join(deploy_dir, FILE_NAME)

    def refuse(rule: str, fix: str) -> CredentialsError:
        return CredentialsError([Problem(path, None, None, rule, fix)], path)

    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return [], path, False
    except OSError as exc:
        raise refuse('cannot be examined (%s)' % exc.strerror, 'make the deployment folder readable')
    if stat.S_ISLNK(info.st_mode):
        raise refuse('is a symlink: the declaration is read only from a regular file, never through a link',
                     'replace the link with the file itself')
    if not stat.S_ISREG(info.st_mode):
        raise refuse('is not a regular file', 'make it a regular JSON file (%s)' % _SHAPE)
    if info.st_size > MAX_FILE_BYTES:
        raise refuse('is larger than %d bytes (256 KiB)' % MAX_FILE_BYTES,
                     'declare at most %d credentials; this is not the file you meant' % MAX_CREDENTIALS)
    try:
        data = _read_regular(path, info, MAX_FILE_BYTES)
    except OSError as exc:
        raise refuse('cannot be read (%s)' % exc.strerror, 'make it a regular file readable by this account')
    return parse(data, path, listed), path, True


# --- secrets ---------------------------------------------------------------------

def _secret(path: str, owner_uid: int) -> Tuple[Optional[str], Optional[Tuple[str, str]]]:
    """(value, None) or (None, (rule, fix)); neither the rule nor the fix ever holds a byte of the file."""
    root_only = 'make it root-only: chmod 0600 %s; chown root %s' % (path, path)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None, ('does not exist', 'write the secret to it, root-only: chmod 0600, chown root')
    except OSError as exc:
        return None, ('cannot be examined (%s)' % exc.strerror, 'make its folder readable by root')
    size = info.st_size
    for failed, rule, fix in (
            (stat.S_ISLNK(info.st_mode), 'is a symlink: a secret is read only from a regular file',
             'replace the link with the file itself'),
            (not stat.S_ISREG(info.st_mode), 'is not a regular file', 'write the secret to a regular file'),
            (info.st_uid != owner_uid, 'is owned by uid %d, not uid %d' % (info.st_uid, owner_uid), root_only),
            (info.st_mode & 0o077, 'is open to group or others (mode %04o), not root-only'
             % stat.S_IMODE(info.st_mode), root_only),
            (not 1 <= size <= MAX_SECRET_BYTES, 'is %d bytes, not 1 to %d' % (size, MAX_SECRET_BYTES),
             'write only the secret to the file')):
        if failed:
            return None, (rule, fix)
    try:
        data = _read_regular(path, info, MAX_SECRET_BYTES)
    except OSError as exc:
        return None, ('cannot be read (%s)' % exc.strerror, root_only)
    data = data[:-2] if data.endswith(b'\r\n') else data[:-1] if data.endswith(b'\n') else data
    codes = bytearray(data)
    for failed, rule, fix in (
            (not data, 'is empty (one trailing newline is ignored)', 'write the secret to the file'),
            (b' ' in data, 'contains a space', 'write only the secret, without spaces'),
            (any(c < 0x20 or c == 0x7f for c in codes), 'contains a control character (a tab, or a line break '
             'inside the value)', 'write the secret on one line, with at most one trailing newline'),
            (any(c > 0x7e for c in codes), 'contains a non-ASCII byte (a secret is printable ASCII)',
             'write the secret as issued, without typographic quotes; check the file encoding'),
            (data.startswith(PLACEHOLDER_PREFIX.encode()), 'holds a placeholder (it starts with %s), not the '
             'real secret' % PLACEHOLDER_PREFIX, 'write the real secret to the file')):
        if failed:
            return None, (rule, fix)
    return data.decode('ascii'), None


def check_secret(credential: Credential, path_override: Optional[str] = None, owner_uid: int = 0) -> Optional[str]:
    """None when the secret file is fine, else a message naming credential, file and fix (never the content)."""
    path = path_override if path_override is not None else credential.secret_file
    refused = _secret(path, owner_uid)[1] if path else ('is not declared', 'declare "secret_file"')
    if refused is None:
        return None
    return 'credential %s: secret file %s %s; %s' % (json.dumps(credential.name), path, refused[0], refused[1])


def read_secret(path: str, owner_uid: int = 0) -> str:
    """The secret in ``path`` (one trailing newline stripped), checked as by :func:`check_secret`.

    Raises ValueError naming the path and the rule, never the content.
    """
    value, refused = _secret(path, owner_uid)
    if refused is not None:
        raise ValueError('secret file %s %s; %s' % (path, refused[0], refused[1]))
    return str(value)


# --- placeholders and the interceptor --------------------------------------------

def placeholder(name: str, token: Optional[str] = None) -> str:
    """``pi-placeholder-<name>-<token>``; the token (32 lowercase hex digits) is fresh unless one is given."""
    token = token or secrets.token_hex(16)
    if not isinstance(name, str) or not NAME_RE.match(name) or not TOKEN_RE.match(token):
        raise ValueError('a placeholder needs a credential name and a token of 32 lowercase hex digits')
    return '%s%s-%s' % (PLACEHOLDER_PREFIX, name, token)


def is_placeholder_shaped(text: Any) -> bool:
    """True when ``text`` has the shape :func:`placeholder` writes."""
    return isinstance(text, str) and bool(PLACEHOLDER_RE.match(text))


def job_placeholders(credentials: Iterable[Credential], job_id: str) -> Dict[str, Dict[str, str]]:
    """``{name: {'env': env, 'placeholder': value}}``, fresh for job ``job_id`` (the id is not in the value)."""
    if not isinstance(job_id, str) or not job_id:
        raise ValueError('job_placeholders needs the job id as a non-empty string')
    return dict((c.name, {'env': c.env, 'placeholder': placeholder(c.name)}) for c in credentials)


def job_env(placeholders: Mapping[str, Mapping[str, str]], ca_path_in_job: str) -> Dict[str, str]:
    """The job's variables: each credential's ``env`` set to its placeholder, each of CA_ENV to the CA file."""
    if not isinstance(ca_path_in_job, str) or not ca_path_in_job.startswith('/'):
        raise ValueError('the CA path in the job must be an absolute path, not %s' % _show(ca_path_in_job))
    env = {}  # type: Dict[str, str]
    for name in sorted(placeholders):
        var, value = placeholders[name]['env'], placeholders[name]['placeholder']
        if var in env or var in RESERVED_ENV or not is_placeholder_shaped(value):
            raise ValueError('credential %s: %s is reserved or set twice, or its value is no placeholder' % (name, var))
        env[var] = value
    env.update((var, ca_path_in_job) for var in CA_ENV)
    return env


def secret_folder_in_container(folder: str, secrets_root: str = SECRETS_ROOT) -> str:
    """Where a secret file's host folder is mounted in the interceptor: one mount per folder (two secrets may
    share one), named by the folder's digest. The folder, not the file: a file replaced by a rename (how
    editors and ``install`` write) is then seen on the next request, where a file's bind keeps the old inode."""
    return '%s/%s' % (secrets_root.rstrip('/'), hashlib.sha256(folder.encode('utf-8')).hexdigest()[:16])


def secret_in_container(secret_file: str, secrets_root: str = SECRETS_ROOT) -> str:
    return '%s/%s' % (secret_folder_in_container(os.path.dirname(secret_file), secrets_root),
                      os.path.basename(secret_file))


def interceptor_config(credentials: Iterable[Credential], secrets_root: str = SECRETS_ROOT) -> Dict[str, Any]:
    """What the interceptor reads: each host, header and where its secret is mounted; never a secret value.

    The paths follow :func:`secret_folder_in_container` (how ``_proxy.interceptor`` mounts the folders)."""
    if not isinstance(secrets_root, str) or not secrets_root.startswith('/') \
            or os.path.normpath(secrets_root) != secrets_root:
        raise ValueError('secrets_root must be a normalised absolute path, not %s' % _show(secrets_root))
    items = [dict(name=c.name, host=c.host, port=c.port, scheme=c.scheme, header=c.header,
                  secret=secret_in_container(c.secret_file or '/' + c.name, secrets_root))
             for c in sorted(credentials, key=_BY_NAME)]
    return {'version': SUPPORTED_VERSION, 'credentials': items}
