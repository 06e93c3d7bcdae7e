# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""Model endpoints: the ``model-endpoints.json`` contract and the squid include.

The declaration (``<deploy_dir>/model-endpoints.json``)::

    {"version": 1, "endpoints": [
        {"id": "mac-ollama", "host": "host.docker.internal", "port": 11434,
         "slots": 2, "keyless": true}]}

is refused, never repaired: :func:`parse` collects every problem and raises
:class:`EndpointsError`, whose problems each name the endpoint (index and
id), the key, the value, the rule broken and the fix. Nothing is guessed: a
missing ``slots`` is not defaulted, a ``"port": "11434"`` is not converted,
a host with a port or a trailing dot is not trimmed. The only normal forms
applied are the ones that cannot change what is reached: a DNS name is
lowercased and an IPv6 literal is written in its canonical (compressed,
lowercase) form.

:func:`render_include` turns the endpoints into the squid include that the
packaged rules load between the "listed name resolves to this host" deny and
the allowlist allows (see ``_rules.PACKAGED_RULES``). Pure logic; the only
I/O is :func:`load`, which reads the declaration file.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from typing import Any, Dict, Iterable, List, NoReturn, Optional, Tuple, Union

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import hostnames as _hostnames
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy.endpoint_hosts import (
    HostRefused, classify_host)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy.endpoint_hosts import type_name as _type_name
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import rules as _rules
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy.jobpool import DEFAULT_POOL

SUPPORTED_VERSION = 1
FILE_NAME = 'model-endpoints.json'
INCLUDE_NAME = 'model-endpoints.conf'

TOP_KEYS = ('version', 'endpoints')
ENDPOINT_KEYS = ('id', 'host', 'port', 'slots', 'keyless')
REQUIRED_ENDPOINT_KEYS = ('id', 'host', 'port', 'slots')

MIN_SLOTS = 1
MAX_SLOTS = 64
MAX_ID = 32
MAX_NAME = _hostnames.MAX_NAME
MAX_LABEL = _hostnames.MAX_LABEL

ID_RE = re.compile(r'^[a-z0-9-]{1,%d}$' % MAX_ID)

# What a declared *name* must not resolve to (the render's own ACL): this
# host's loopback, slirp4netns's host alias, the metadata addresses, and the
# job-network pool (added at render time). Not link-local as such: a name may
# resolve to one (host.containers.internal on podman is 169.254.1.2).
NEVER_NETS = ('127.0.0.0/8', '0.0.0.0/8', '10.0.2.2/32', '169.254.169.254/32', '100.100.100.200/32',
              '::1', '::/128', 'fd00:ec2::254/128')
NEVER_ACL = 'pi_endpoints_never'

INCLUDE_HEADER = """\
# pi-dispatch model endpoints, rendered from model-endpoints.json by the
# pi_dispatch.egress collection (model_endpoints module). Do not edit: declare
# model servers in model-endpoints.json, render again, then reload the proxy
# (squid -k reconfigure). This file is written in place; never replace it.
# Each endpoint adds a CONNECT tunnel to exactly its host and port: no other
# port of that host. A plain request to it gets only what the allowlist gives
# any host (port 80, when the host is listed).
"""


class DeclarationProblem(object):
    """One refusal of a JSON declaration (model-endpoints.json, credentials.json): where (file, item index and
    identity, key), what (value), why (rule), and the fix. A subclass says who an item is (``who``) and the key its
    identity has in ``as_dict`` (``IDENT``)."""

    IDENT = 'id'

    def __init__(self, path: str, key: Optional[str], value: Any, rule: str, fix: str, index: Optional[int] = None,
                 ident: Optional[str] = None, present: bool = True) -> None:
        self.path, self.index, self.ident, self.key, self.value = path, index, ident, key, value
        self.rule, self.fix, self.present = rule, fix, present

    def who(self) -> str:
        raise NotImplementedError

    def where(self) -> str:
        return self.path if self.index is None else '%s: %s' % (self.path, self.who())

    def __str__(self) -> str:
        if self.key is None:
            what = ' value %s:' % _show(self.value) if self.index is not None else ''
        elif not self.present:
            what = ' key %s: missing:' % json.dumps(self.key)
        else:
            what = ' key %s = %s:' % (json.dumps(self.key), _show(self.value))
        return '%s:%s %s; %s' % (self.where(), what, self.rule, self.fix)

    def as_dict(self) -> Dict[str, Any]:
        found = dict(path=self.path, index=self.index, key=self.key, value=self.value if self.present else None,
                     rule=self.rule, fix=self.fix, message=str(self))
        found[self.IDENT] = self.ident
        return found


class Problem(DeclarationProblem):
    """One refusal of model-endpoints.json; the item is an endpoint, named by its id."""

    def __init__(self, path: str, key: Optional[str], value: Any, rule: str, fix: str, index: Optional[int] = None,
                 endpoint_id: Optional[str] = None, present: bool = True) -> None:
        super(Problem, self).__init__(path, key, value, rule, fix, index=index, ident=endpoint_id, present=present)

    @property
    def endpoint_id(self) -> Optional[str]:
        return self.ident

    def who(self) -> str:
        if isinstance(self.ident, str) and self.ident:
            return 'endpoint %d (id %s)' % (self.index, json.dumps(self.ident))
        return 'endpoint %d (no valid id)' % self.index


class DeclarationError(Exception):
    """A declaration is refused; ``problems`` lists every reason. ``UNCHANGED`` says what the refusal left alone."""

    UNCHANGED = 'nothing was rendered or changed'

    def __init__(self, problems: Iterable[DeclarationProblem], path: str) -> None:
        self.problems = list(problems)
        self.path = path
        lines = ['%s is refused (%d problem%s); %s:'
                 % (path, len(self.problems), '' if len(self.problems) == 1 else 's', self.UNCHANGED)]
        lines += ['  - %s' % p for p in self.problems]
        super(DeclarationError, self).__init__('\n'.join(lines))


class EndpointsError(DeclarationError):
    """model-endpoints.json is refused; ``problems`` lists every reason."""

    def __init__(self, problems: Iterable[DeclarationProblem], path: str = FILE_NAME) -> None:
        super(EndpointsError, self).__init__(problems, path)


class Endpoint(object):
    """A validated endpoint. ``host`` is canonical; ``kind`` is name, ipv4 or ipv6."""

    __slots__ = ('id', 'host', 'port', 'slots', 'keyless', 'kind')

    def __init__(self, id: str, host: str, port: int, slots: int, keyless: bool = False,  # noqa: A002 - the contract's key
                 kind: Optional[str] = None) -> None:
        self.id = id
        self.host = host
        self.port = port
        self.slots = slots
        self.keyless = keyless
        self.kind = kind or classify_host(host)[1]

    @property
    def address(self) -> str:
        """host:port as a client writes it (IPv6 bracketed)."""
        return '%s:%d' % (bracketed(self.host, self.kind), self.port)

    @property
    def acl_prefix(self) -> str:
        return 'pi_ep_%s' % self.id.replace('-', '_')

    def as_dict(self) -> Dict[str, Any]:
        return dict(id=self.id, host=self.host, port=self.port, slots=self.slots,
                    keyless=self.keyless, kind=self.kind, address=self.address)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Endpoint) and self.as_dict() == other.as_dict()

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __repr__(self) -> str:
        return 'Endpoint(%r)' % (self.as_dict(),)


def _show(value: Any) -> str:
    try:
        text = json.dumps(value, sort_keys=True)
    except (TypeError, ValueError):
        text = repr(value)
    if len(text) > 80:
        text = text[:77] + '...'
    return text


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def bracketed(host: str, kind: Optional[str] = None) -> str:
    kind = kind or classify_host(host)[1]
    return '[%s]' % host if kind == 'ipv6' else host


# --- parse -----------------------------------------------------------------------

def _reject_constant(name: str) -> NoReturn:
    raise ValueError('%s is not JSON' % name)


def pairs_no_duplicates(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    """``json.loads``' object_pairs_hook that refuses a key given twice (ValueError naming it)."""
    result = {}
    for key, value in pairs:
        if key in result:
            raise ValueError('duplicate key %s' % json.dumps(key))
        result[key] = value
    return result


def loads_strict(text: Union[str, bytes], path: str = FILE_NAME) -> Any:
    """Strict JSON: no comments, no trailing commas, no NaN, no duplicate keys."""
    if isinstance(text, bytes):
        try:
            text = text.decode('utf-8')
        except UnicodeDecodeError as exc:
            raise EndpointsError([Problem(path, None, None, 'is not UTF-8 (%s)' % exc,
                                          'save the file as UTF-8')], path)
    if text.startswith('\ufeff'):
        raise EndpointsError([Problem(path, None, None, 'starts with a byte order mark',
                                      'save the file as UTF-8 without a BOM')], path)
    try:
        return json.loads(text, object_pairs_hook=pairs_no_duplicates, parse_constant=_reject_constant)
    except ValueError as exc:
        raise EndpointsError([Problem(path, None, None, 'is not valid JSON (%s)' % exc,
                                      'fix the JSON; the expected shape is {"version": 1, "endpoints": [...]}')],
                             path)


def validate(data: Any, path: str = FILE_NAME) -> List[Endpoint]:
    """Validate decoded JSON; return [Endpoint] sorted by id or raise EndpointsError."""
    problems = []

    def top(key: Optional[str], value: Any, rule: str, fix: str, present: bool = True) -> None:
        problems.append(Problem(path, key, value, rule, fix, present=present))

    if not isinstance(data, dict):
        top(None, data, 'the top level must be an object, not %s' % _type_name(data),
            'write {"version": 1, "endpoints": [...]}')
        raise EndpointsError(problems, path)
    for key in data:
        if key not in TOP_KEYS:
            top(key, data[key], 'is not a key of the declaration (known: %s)' % ', '.join(TOP_KEYS),
                'remove it; only "version" and "endpoints" belong at the top level')
    if 'version' not in data:
        top('version', None, 'is required', 'add "version": %d' % SUPPORTED_VERSION, present=False)
    else:
        version = data['version']
        if not _is_int(version):
            top('version', version, 'must be an integer, not %s' % _type_name(version),
                'write "version": %d' % SUPPORTED_VERSION)
        elif version < 1:
            top('version', version, 'must be at least 1', 'write "version": %d' % SUPPORTED_VERSION)
        elif version > SUPPORTED_VERSION:
            top('version', version, 'is newer than this collection understands (version %d at most)'
                % SUPPORTED_VERSION, 'upgrade the pi_dispatch.egress collection, or write the file in '
                'version %d' % SUPPORTED_VERSION)
            # A newer version may mean other keys: judge nothing else by this version's rules.
            raise EndpointsError(problems, path)
    if 'endpoints' not in data:
        top('endpoints', None, 'is required', 'add "endpoints": [] (a list, empty when nothing is declared)',
            present=False)
        raise EndpointsError(problems, path)
    items = data['endpoints']
    if not isinstance(items, list):
        top('endpoints', items, 'must be a list, not %s' % _type_name(items),
            'write "endpoints": [ {...}, ... ]')
        raise EndpointsError(problems, path)

    endpoints = []
    ids = {}
    addresses = {}
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            problems.append(Problem(path, None, item, 'must be an object, not %s' % _type_name(item),
                                    'write {"id": ..., "host": ..., "port": ..., "slots": ...}', index=index))
            continue
        raw_id = item.get('id')
        eid = raw_id if isinstance(raw_id, str) and ID_RE.match(raw_id) else None
        before = len(problems)

        def bad(key: str, rule: str, fix: str, present: bool = True, _index: int = index, _item: Dict[str, Any] = item,
                _eid: Any = raw_id) -> None:
            problems.append(Problem(path, key, _item.get(key), rule, fix, index=_index,
                                    endpoint_id=_eid if isinstance(_eid, str) else None, present=present))

        for key in item:
            if key not in ENDPOINT_KEYS:
                bad(key, 'is not a key of an endpoint (known: %s)' % ', '.join(ENDPOINT_KEYS),
                    'remove it (check the spelling)')
        for key in REQUIRED_ENDPOINT_KEYS:
            if key not in item:
                bad(key, 'is required', 'add "%s" to the endpoint' % key, present=False)

        if 'id' in item:
            if not isinstance(raw_id, str):
                bad('id', 'must be a string, not %s' % _type_name(raw_id),
                    'write the id as a string of a-z, 0-9 and -, e.g. "mac-ollama"')
            elif not ID_RE.match(raw_id):
                bad('id', 'must match %s (1 to %d lowercase letters, digits or hyphens)' % (ID_RE.pattern, MAX_ID),
                    'rename the endpoint, e.g. "mac-ollama"')
            elif raw_id in ids:
                bad('id', 'is already used by endpoint %d' % ids[raw_id],
                    'give every endpoint its own id (one server, one id)')
            else:
                ids[raw_id] = index

        host = kind = None
        if 'host' in item:
            try:
                host, kind = classify_host(item['host'])
            except HostRefused as exc:
                bad('host', exc.rule, exc.fix)

        port = item.get('port')
        if 'port' in item:
            if not _is_int(port):
                bad('port', 'must be an integer, not %s' % _type_name(port), 'write the port as a bare number')
                port = None
            elif not 1 <= port <= 65535:
                bad('port', 'must be between 1 and 65535', 'write the port the server listens on')
                port = None
            elif port == _rules.PROXY_PORT:
                bad('port', 'is the proxy\'s own port %d, which a tunnel would loop back into the proxy'
                    % _rules.PROXY_PORT, 'serve the model on another port and declare that one')
                port = None

        slots = item.get('slots')
        if 'slots' in item:
            if not _is_int(slots):
                bad('slots', 'must be an integer, not %s' % _type_name(slots),
                    'write how many requests the server runs at once, e.g. 2')
            elif not MIN_SLOTS <= slots <= MAX_SLOTS:
                bad('slots', 'must be between %d and %d' % (MIN_SLOTS, MAX_SLOTS),
                    'write how many requests the server runs at once (Ollama: OLLAMA_NUM_PARALLEL)')

        keyless = item.get('keyless', False)
        if not isinstance(keyless, bool):
            bad('keyless', 'must be true or false, not %s' % _type_name(keyless),
                'write "keyless": true for a server that takes no key, or leave it out (false)')

        if host is not None and port is not None:
            previous = addresses.get((host, port))
            if previous is not None:
                bad('host', 'with port %d is already declared by endpoint %d (id %s)'
                    % (port, previous[0], json.dumps(previous[1])),
                    'declare one server under one id; remove the duplicate')
            else:
                addresses[(host, port)] = (index, raw_id)

        if len(problems) == before and eid is not None:
            endpoints.append(Endpoint(eid, host, port, slots, keyless, kind))
    if problems:
        raise EndpointsError(problems, path)
    return sorted(endpoints, key=lambda e: e.id)


def parse(text: Union[str, bytes], path: str = FILE_NAME) -> List[Endpoint]:
    """Parse and validate declaration text; return [Endpoint] sorted by id."""
    return validate(loads_strict(text, path), path)


OPTION_LABEL = 'the endpoints option'


def from_items(items: Any, label: str = OPTION_LABEL) -> List[Endpoint]:
    """Validate a declaration given as its list of endpoints (the module's ``endpoints`` option).

    The list is judged as the ``endpoints`` of a version 1 declaration, by
    :func:`validate`: the same rules, the same problems and the same fixes as
    the file, with ``label`` where a problem would name the file. Nothing is
    converted (an item that is not a mapping is refused, not parsed). Returns
    [Endpoint] sorted by id or raises EndpointsError.
    """
    return validate({'version': SUPPORTED_VERSION, 'endpoints': items}, label)


def default_path(deploy_dir: str) -> str:
    return os.path.join(deploy_dir, FILE_NAME)


def include_path(deploy_dir: str) -> str:
    return os.path.join(deploy_dir, INCLUDE_NAME)


def load(deploy_dir: Optional[str] = None, path: Optional[str] = None) -> Tuple[List[Endpoint], str, bool]:
    """Read the declaration. Returns (endpoints, path, exists).

    With ``path`` (named explicitly) the file must exist. Without it the
    default ``<deploy_dir>/model-endpoints.json`` is read, and a missing
    default file means nothing is declared.
    """
    explicit = path is not None
    if not explicit:
        if deploy_dir is None:
            raise ValueError('load() needs deploy_dir or path')
        path = default_path(deploy_dir)
    try:
        with open(path, 'rb') as handle:
            data = handle.read()
    except FileNotFoundError:
        if explicit:
            raise EndpointsError([Problem(path, None, None, 'does not exist (it was named explicitly)',
                                          'create it, or leave the declaration path unset to use '
                                          '<deploy_dir>/%s' % FILE_NAME)], path)
        return [], path, False
    except IsADirectoryError:
        raise EndpointsError([Problem(path, None, None, 'is a directory', 'name the JSON file itself')], path)
    except OSError as exc:
        raise EndpointsError([Problem(path, None, None, 'cannot be read (%s)' % exc,
                                      'make it readable by the account that runs this')], path)
    return parse(data, path), path, True


def dumps(endpoints: Iterable[Endpoint], version: int = SUPPORTED_VERSION) -> str:
    """Declaration text for validated endpoints (what the playbook writes)."""
    items = []
    for e in endpoints:
        items.append(dict(id=e.id, host=e.host, port=e.port, slots=e.slots, keyless=e.keyless))
    return json.dumps({'version': version, 'endpoints': items}, indent=2) + '\n'


# --- render ----------------------------------------------------------------------

def render_include(endpoints: Iterable[Union[Endpoint, Dict[str, Any]]], pool: Optional[str] = None) -> str:
    """The squid include for ``endpoints`` (Endpoint objects or validated dicts).

    A fixed header, then for each endpoint sorted by id: for a declared
    *name*, a deny of its tunnel when the name resolves to what no endpoint
    may lead to (:data:`NEVER_NETS` and the job-network ``pool``), then the
    allow of a CONNECT tunnel to exactly that host and port. The port is
    tested first, so squid resolves nothing for a request to another port;
    an address endpoint is matched as written (``dst -n``), so a name whose
    records include that address gets nothing. Endpoints only ever ADD a
    tunnel: a plain request to the host falls through to the allowlist's own
    rules. Nothing declared renders the header alone.
    """
    pool_net = ipaddress.ip_network(pool or DEFAULT_POOL, strict=False)
    eps = [e if isinstance(e, Endpoint) else Endpoint(**_endpoint_kwargs(e)) for e in endpoints]
    eps = sorted(eps, key=lambda e: e.id)
    seen = set()
    for e in eps:
        if e.id in seen:
            raise ValueError('endpoint id %s appears twice' % e.id)
        seen.add(e.id)
        if e.kind != 'name' and ipaddress.ip_address(e.host) in pool_net:
            raise EndpointsError([Problem(FILE_NAME, 'host', e.host, 'is in the job-network pool %s: that is '
                                          'another job\'s container or job network, never a model server'
                                          % pool_net, 'declare the address the model server listens on',
                                          endpoint_id=e.id, index=0)])
    out = [INCLUDE_HEADER]
    if not eps:
        return ''.join(out)
    out.append('\n# The decision log\'s reason for what these lines decide (each always matches).\n')
    out.append('acl pi_ep_r_endpoint annotate_transaction pi_reason=endpoint\n')
    out.append('acl pi_ep_r_guard annotate_transaction pi_reason=guard\n')
    if any(e.port == 443 for e in eps):
        out.append('acl pi_ep_r_checked annotate_transaction pi_stage=checked\n')
    if any(e.kind == 'name' for e in eps):
        out.append('\n# What a declared name must not resolve to: this host\'s loopback, slirp4netns\'s host '
                   'alias,\n# the cloud metadata addresses and the job-network pool.\n')
        out.append('acl %s dst %s %s\n' % (NEVER_ACL, ' '.join(NEVER_NETS), pool_net))
    for e in eps:
        p = e.acl_prefix
        flags = 'slots %d%s' % (e.slots, ', keyless' if e.keyless else '')
        out.append('\n# endpoint %s: %s (%s)\n' % (e.id, e.address, flags))
        out.append('acl %s_port port %d\n' % (p, e.port))
        if e.kind == 'name':
            out.append('acl %s_host dstdomain -n %s\n' % (p, e.host))
            out.append('http_access deny CONNECT %s_port %s_host %s pi_ep_r_guard\n' % (p, p, NEVER_ACL))
        else:
            out.append('acl %s_host dst -n %s\n' % (p, e.host))
        # on 443 the TLS name check logs the tunnel it passes (rules version 3)
        out.append('http_access allow CONNECT %s_port %s_host pi_ep_r_endpoint%s\n'
                   % (p, p, ' pi_ep_r_checked' if e.port == 443 else ''))
    return ''.join(out)


def _endpoint_kwargs(item: Dict[str, Any]) -> Dict[str, Any]:
    host, kind = classify_host(item['host'])
    return dict(id=item['id'], host=host, port=item['port'], slots=item['slots'],
                keyless=bool(item.get('keyless', False)), kind=kind)


def summary(endpoints: Iterable[Endpoint]) -> List[Dict[str, Any]]:
    """[{id, host, port, slots, keyless, kind, address}] for module results."""
    return [e.as_dict() for e in sorted(endpoints, key=lambda e: e.id)]
