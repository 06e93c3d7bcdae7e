# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The allowlist and the model endpoints, translated into the network part of an OpenShell sandbox policy.

Pure logic: the inputs are what the existing parsers return (an :class:`Allowlist` from
``_policy/allowlist.py`` ``parse()`` and the ``Endpoint`` list of ``_policy/endpoints.py``
``load()``); nothing is read or re-parsed here. The output admits exactly what squid admits
for the same sources, or less where OpenShell reads what squid only tunnelled, and never more:

* a listed name: that host on 443, and on 80 (``plain_http``);
* a leading-dot entry (squid's ``.example.com``: the name and every subdomain at any depth):
  the name itself and ``**.example.com`` (OpenShell's ``**.`` matches one or more labels and
  not the apex, its ``*.`` exactly one label), each on 443 and 80;
* a listed IPv4 address: that address on 443 and 80, with ``allowed_ips`` naming exactly it
  when it is a non-public address the operator opened;
* a model endpoint: exactly its host and port;
* every endpoint is read by OpenShell (``protocol: rest``, ``enforcement: enforce``,
  ``access: full``) and usable by any executable of the job (``binaries``, default ``/**``);
* a project's opt-in (seed 001's ``.pi-container/config.yaml``, ``_policy/optins.py``) towards
  listed names: each name on that TCP port as a passthrough endpoint (no ``protocol``: OpenShell
  neither reads it nor resolves a credential in it); an opt-in towards every name (``true``), any
  UDP port, and, on a GitHub job, one towards ``github.com`` (an uninspected push anywhere) are
  refused;
* with ``github_repository`` (a GitHub job's own ``owner/name``), ``github.com`` carries the git
  transport with a push to that repository only: its endpoints get explicit REST rules instead of
  ``access: full`` (any GET and HEAD, a fetch from any repository, a push to that one), which squid,
  tunnelling without reading, cannot express (seed 000). The other forges keep full access;
* with ``credential_provider`` (the job's OpenShell provider), every endpoint is bound to it
  (``credential_binding: {provider: ...}``), so the provider's credentials resolve in a request to
  a host the policy admits and nowhere else (seed 000: "every endpoint of the policy is bound to
  the job's provider"). The name is the job's, not a source file's, so it is an option of the
  render.

A line squid matches nothing for (one another wildcard covers, an address squid's destination
guard always refuses, a metadata service's name) is skipped and reported. An entry OpenShell
cannot express without widening, or cannot express at all, refuses the whole translation
(:class:`Untranslatable`, code :data:`UNTRANSLATABLE`), naming the entry, the reason and the fix.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import allowlist as _allowlist
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import endpoints as _endpoints
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import guard as _guard
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import hostnames as _hostnames
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy.jobpool import DEFAULT_POOL

UNTRANSLATABLE = 'openshell-egress-untranslatable'
SKIPPED = 'openshell_policy_skipped'

POLICY_VERSION = 1
HTTPS_PORT = 443
HTTP_PORT = 80
PROTOCOL = 'rest'
ENFORCEMENT = 'enforce'
ACCESS = 'full'
ANY_BINARY = '/**'
DEFAULT_BINARIES = (ANY_BINARY,)
RECURSIVE = '**.'

# Addresses OpenShell refuses whatever the policy says (its allowed_ips may not overlap them).
OPENSHELL_NEVER_V4 = (('127.0.0.0/8', 'loopback'), ('169.254.0.0/16', 'link-local'),
                      ('0.0.0.0/8', 'the unspecified "this network" range'))

LIMIT_READ = ('every endpoint is read (protocol rest, enforcement enforce, access full): a WebSocket or any other '
              'protocol over 443, which squid tunnelled without reading, is refused')
LIMIT_PORT_80 = ('port 80 of a listed host is an inspected endpoint: a plain HTTP request sent through a tunnel '
                 '(CONNECT) is read and passed, but OpenShell refuses a plain forward request (GET http://...) to a '
                 'public address, which squid passed')
LIMIT_NO_PORT_80 = ('plain_http is off: port 80 of a listed host is not admitted, which squid admits for a plain '
                    'request')
LIMIT_PRIVATE = ('OpenShell admits an exact listed name that resolves to an RFC 1918 address, which squid\'s '
                 'destination guard refuses unless egress_private_destinations opens the range; a wildcard endpoint '
                 'does not get that exception')

GITHUB_HOST = 'github.com'
LIMIT_GITHUB = ('github.com carries the git transport only: any GET and HEAD, a fetch (POST .../git-upload-pack) from '
                'any repository, and a push (POST .../git-receive-pack) to %s only; every other POST, PUT, PATCH or '
                'DELETE there is refused, git LFS through github.com included')
LIMIT_GITHUB_UNLISTED = ('github_repository %s is set, but no rule admits github.com: the job can neither fetch from '
                         'nor push to it on this venue')
LIMIT_OPTIN = ('an opted-in port is a TCP passthrough (no protocol): OpenShell neither reads what it carries nor '
               'resolves a credential placeholder in it, and no endpoint of it is bound to the provider')
_GITHUB_OWNER = re.compile(r'^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})$')
_GITHUB_NAME = re.compile(r'^[A-Za-z0-9._-]{1,100}$')


class Refusal(object):
    """One entry OpenShell cannot express without widening: where, what, why, and the fix."""

    def __init__(self, source: str, where: str, entry: str, reason: str, fix: str) -> None:
        self.source = source
        self.where = where
        self.entry = entry
        self.reason = reason
        self.fix = fix

    def __str__(self) -> str:
        return '%s: %s: %s: %s; %s' % (UNTRANSLATABLE, self.where, self.entry, self.reason, self.fix)

    def as_dict(self) -> Dict[str, Any]:
        return dict(code=UNTRANSLATABLE, source=self.source, where=self.where, entry=self.entry,
                    reason=self.reason, fix=self.fix, message=str(self))


class Skip(object):
    """One entry squid matches nothing for: left out of the policy and reported."""

    def __init__(self, source: str, where: str, entry: str, reason: str) -> None:
        self.source = source
        self.where = where
        self.entry = entry
        self.reason = reason

    def __str__(self) -> str:
        return '%s: %s: %s: %s' % (SKIPPED, self.where, self.entry, self.reason)

    def as_dict(self) -> Dict[str, Any]:
        return dict(code=SKIPPED, source=self.source, where=self.where, entry=self.entry, reason=self.reason,
                    message=str(self))


class Untranslatable(Exception):
    """The sources cannot be translated without widening; ``refusals`` lists every entry and reason."""

    def __init__(self, refusals: Sequence[Refusal]) -> None:
        self.refusals = list(refusals)
        lines = ['%s: %d entr%s cannot be expressed in an OpenShell policy without widening what squid admits; '
                 'every job on the openshell venue is refused until %s fixed, and nothing was rendered or written:'
                 % (UNTRANSLATABLE, len(self.refusals), 'y' if len(self.refusals) == 1 else 'ies',
                    'it is' if len(self.refusals) == 1 else 'they are')]
        lines += ['  - %s' % r for r in self.refusals]
        super(Untranslatable, self).__init__('\n'.join(lines))


class Translation(object):
    """The rendered policy (authored form), what each rule came from, the skipped entries and the limits."""

    def __init__(self) -> None:
        self.rules = []       # (key, rule dict, origin dict) in order
        self.skipped = []     # Skip
        self.limits = []      # str
        self.provider = None  # the provider every endpoint is bound to (bind), or None
        self.github_repository = None  # the GitHub job's own repository (restrict_github), or None

    @property
    def policy(self) -> Dict[str, Any]:
        return {'version': POLICY_VERSION, 'network_policies': dict((key, rule) for key, rule, _o in self.rules)}

    def origins(self) -> List[Dict[str, Any]]:
        """[{rule, source, where, entry, endpoints: ['host:port', ...]}] in policy order."""
        out = []
        for key, rule, origin in self.rules:
            eps = ['%s:%d' % (e['host'], e['port']) for e in rule['endpoints']]
            out.append(dict(origin, rule=key, endpoints=eps))
        return out


def _endpoint(host: str, port: int, allowed_ip: Optional[str] = None) -> Dict[str, Any]:
    endpoint = {'host': host, 'port': port, 'protocol': PROTOCOL, 'enforcement': ENFORCEMENT, 'access': ACCESS}
    if allowed_ip is not None:
        endpoint['allowed_ips'] = [allowed_ip]
    return endpoint


def rule_key(source: str, entry: str) -> str:
    """The map key of an entry's rule: letters, digits, ``_`` and ``-`` only, one per entry."""
    if source == 'endpoint':
        return 'model_endpoint_%s' % entry
    if entry.startswith('.'):
        kind, body = 'domain', entry[1:]
    elif _hostnames.is_ipv4(entry):
        kind, body = 'ip', entry
    else:
        kind, body = 'host', entry
    return 'allowlist_%s_%s' % (kind, body.replace('.', '_'))


def covering_lines(entries: Sequence[Tuple[int, str]]) -> Dict[int, Tuple[int, str]]:
    """line -> (line, wildcard) of the earliest leading-dot entry that covers the entry on that line.

    squid drops a ``dstdomain`` entry another (wildcard) entry already covers, so such a line
    matches nothing of its own.
    """
    wildcards = {}
    for lineno, entry in entries:
        if entry.startswith('.') and entry not in wildcards:
            wildcards[entry] = lineno
    covered = {}
    for lineno, entry in entries:
        name = entry.lstrip('.')
        best = None
        for domain in [name] + _hostnames.parent_domains(name):
            candidate = '.' + domain
            other = wildcards.get(candidate)
            if candidate != entry and other is not None and (best is None or other < best[0]):
                best = (other, candidate)
        if best is not None:
            covered[lineno] = best
    return covered


def _nonpublic_v4(address: str) -> Optional[str]:
    addr = ipaddress.ip_address(address)
    for net in _guard.NONPUBLIC_V4:
        if addr in ipaddress.ip_network(net):
            return net
    return None


def _openshell_never(address: str) -> Optional[Tuple[str, str]]:
    addr = ipaddress.ip_address(address)
    for net, why in OPENSHELL_NEVER_V4:
        if addr in ipaddress.ip_network(net):
            return net, why
    return None


def _allowlist_entry(entry: str, opened: Optional[Sequence[Any]], ports: Sequence[int]
                     ) -> Tuple[str, Any]:
    """('rule', [endpoint]), ('skip', reason) or ('refuse', (reason, fix)) for one valid, lowercased entry."""
    problem = _allowlist.classify_entry(entry)
    if problem is not None:
        return 'refuse', problem
    try:
        covered = _allowlist.public_suffix_covered(entry)
    except _allowlist.PublicSuffixListMissing:
        return 'refuse', (_allowlist.PSL_MISSING_REASON, _allowlist.PSL_MISSING_FIX)
    body = entry[1:] if entry.startswith('.') else entry
    if covered is not None:
        if '.' in covered:
            reason = ('covers the whole public suffix %s: its wildcard would admit every site anyone registers '
                      'under it' % covered)
        elif entry.startswith('.'):
            reason = ('is the one-label name %s: OpenShell refuses a wildcard over fewer than three labels '
                      '(%s%s), and a wider pattern is never guessed' % (covered, RECURSIVE, covered))
        else:
            reason = ('is the one-label name %s: a top-level or local name (com, test, localhost), never one site, '
                      'which the allowlist refuses too' % covered)
        return 'refuse', (reason, _allowlist.BREADTH_FIX)
    if _hostnames.is_ipv4(body):
        guarded = _allowlist.guard_problem(body, opened)
        if guarded is not None:
            return 'skip', '%s, so squid matches nothing for it' % guarded[0]
        allowed = body if _nonpublic_v4(body) else None
        return 'rule', [_endpoint(body, port, allowed) for port in ports]
    if not entry.startswith('.'):
        if _allowlist.metadata_name(entry) == entry:
            return 'skip', ("names a cloud metadata service: squid's destination guard refuses its address, and "
                            'OpenShell always refuses link-local addresses')
        return 'rule', [_endpoint(body, port) for port in ports]
    hosts = (body, RECURSIVE + body)
    return 'rule', [_endpoint(host, port) for host in hosts for port in ports]


def _model_endpoint(endpoint: Any, pool: str) -> Tuple[str, Any]:
    """('rule', [endpoint]) or ('refuse', (reason, fix)) for one validated model endpoint."""
    if endpoint.kind == 'ipv6':
        return 'refuse', ('is an IPv6 literal: the OpenShell policy documentation names no form for an IPv6 '
                          'endpoint host or its allowed_ips, and none is guessed',
                          'declare the server by a DNS name that resolves to it, or by an IPv4 address')
    if endpoint.kind == 'ipv4':
        never = _openshell_never(endpoint.host)
        if never is not None:
            return 'refuse', ('is in %s (%s), which OpenShell always refuses (allowed_ips may not overlap it)'
                              % never, 'declare the address the model server listens on that a sandbox can reach, '
                                       'or a DNS name for it')
        if ipaddress.ip_address(endpoint.host) in ipaddress.ip_network(pool):
            return 'refuse', ("is in the job-network pool %s: that is another job's container or job network, "
                              'never a model server' % pool, 'declare the address the model server listens on')
        allowed = endpoint.host if _nonpublic_v4(endpoint.host) else None
        return 'rule', [_endpoint(endpoint.host, endpoint.port, allowed)]
    return 'rule', [_endpoint(endpoint.host, endpoint.port)]


def _optin(proto: str, port: int, value: Any, repository: Optional[str]) -> Tuple[str, Any]:
    """('rule', [endpoint]) or ('refuse', (reason, fix)) for one opted-in port of a project's policy."""
    if proto != 'tcp':
        return 'refuse', ('opens a UDP port: an OpenShell policy admits TCP connections through the sandbox\'s '
                          'supervisor and has no endpoint for UDP',
                          'remove it from the project\'s policy for this venue (ntp, udp_ports), or run the project '
                          'on a transparent job network')
    if value is True:
        return 'refuse', ('opens the port towards every name the resolver answers: an OpenShell endpoint names its '
                          'host (a bare * is refused), and a wider pattern is never guessed',
                          'list the hosts instead, e.g. ssh: [github.com]')
    if repository is not None and GITHUB_HOST in value:
        return 'refuse', ('opens it towards github.com on a GitHub job: that tunnel is not read, so it would carry a '
                          'push to any repository, which this job may push to %s only' % repository,
                          'fetch and push over https on this venue (remove github.com from this opt-in)')
    return 'rule', [{'host': host, 'port': port} for host in value]


def _rule(name: str, endpoints: List[Dict[str, Any]], binaries: Sequence[str]) -> Dict[str, Any]:
    return {'name': name, 'endpoints': endpoints, 'binaries': [{'path': path} for path in binaries]}


def translate(allowlist: Any, endpoints: Sequence[Any] = (), opened: Optional[Sequence[Any]] = None,
              plain_http: bool = True, binaries: Sequence[str] = DEFAULT_BINARIES,
              endpoints_path: str = _endpoints.FILE_NAME, pool: str = DEFAULT_POOL,
              credential_provider: Optional[str] = None, github_repository: Optional[str] = None,
              optins: Any = None) -> Translation:
    """Translate a parsed allowlist (its ``entries``) and validated model endpoints; see the module docstring.

    ``allowlist`` is an ``Allowlist`` whose errors the caller has already refused (only its ``path`` and
    ``entries`` are read), or None for no allowlist (nothing listed). ``opened``: the ranges
    egress_private_destinations opens (None: none). ``credential_provider``: the job's provider, every
    endpoint bound to it (:func:`check_provider`; None: no binding). ``github_repository``: a GitHub job's own
    ``owner/name``, the only one github.com takes a push for (:func:`restrict_github`; None: github.com as
    listed). ``optins``: a project's ``Optins`` (``_policy/optins.py`` ``load``), whose ``path`` names it in a
    refusal (None: no opt-in). Raises :class:`Untranslatable` with every refusal; returns a
    :class:`Translation` otherwise.
    """
    provider = check_provider(credential_provider)
    repository = check_github_repository(github_repository)
    result = Translation()
    refusals = []
    ports = (HTTPS_PORT, HTTP_PORT) if plain_http else (HTTPS_PORT,)
    entries = list(allowlist.entries) if allowlist is not None else []
    path = allowlist.path if allowlist is not None else 'egress-allowlist.conf'
    covered = covering_lines(entries)
    for lineno, entry in entries:
        where = '%s:%d' % (path, lineno)
        if lineno in covered:
            other_line, other = covered[lineno]
            reason = ('is already covered by %s on line %d: squid drops this line, and the rule of line %d '
                      'carries it' % (other, other_line, other_line))
            result.skipped.append(Skip('allowlist', where, entry, reason))
            continue
        verdict, detail = _allowlist_entry(entry, opened, ports)
        if verdict == 'refuse':
            refusals.append(Refusal('allowlist', where, entry, detail[0], detail[1]))
        elif verdict == 'skip':
            result.skipped.append(Skip('allowlist', where, entry, detail))
        else:
            origin = dict(source='allowlist', where=where, entry=entry)
            result.rules.append((rule_key('allowlist', entry), _rule('allowlist %s' % entry, detail, binaries), origin))
    for endpoint in sorted(endpoints, key=lambda e: e.id):
        where = '%s: endpoint %s' % (endpoints_path, endpoint.id)
        verdict, detail = _model_endpoint(endpoint, pool)
        if verdict == 'refuse':
            refusals.append(Refusal('model-endpoints', where, endpoint.address, detail[0], detail[1]))
            continue
        origin = dict(source='model-endpoints', where=where, entry=endpoint.address)
        result.rules.append((rule_key('endpoint', endpoint.id),
                             _rule('model endpoint %s' % endpoint.id, detail, binaries), origin))
    if optins is not None:
        where_optins = optins.path or 'the project policy'
        for proto in ('tcp', 'udp'):
            for port, value in sorted(optins.ports[proto].items()):
                entry = '%s/%d towards %s' % (proto, port, 'any name' if value is True else ', '.join(value))
                verdict, detail = _optin(proto, port, value, repository)
                if verdict == 'refuse':
                    refusals.append(Refusal('project-policy', where_optins, entry, detail[0], detail[1]))
                    continue
                origin = dict(source='project-policy', where=where_optins, entry=entry)
                result.rules.append(('optin_%s_%d' % (proto, port),
                                     _rule('project opt-in %s/%d' % (proto, port), detail, binaries), origin))
    if refusals:
        raise Untranslatable(refusals)
    if any(origin['source'] == 'project-policy' for _k, _r, origin in result.rules):
        result.limits.append(LIMIT_OPTIN)
    if result.rules:
        result.limits.append(LIMIT_READ)
    listed = [origin for _k, _r, origin in result.rules if origin['source'] == 'allowlist']
    if listed:
        result.limits.append(LIMIT_PORT_80 if plain_http else LIMIT_NO_PORT_80)
    if any(not _hostnames.is_ipv4(o['entry'].lstrip('.')) for o in listed):
        result.limits.append(LIMIT_PRIVATE)
    return bind(restrict_github(result, repository), provider)


def check_provider(name: Any, key: str = 'credential_provider') -> Optional[str]:
    """The job's provider name as OpenShell's client takes it (``ProviderClient``: canonical, at most 253
    bytes), or None for no binding. Raises ValueError naming ``key``."""
    if name is None:
        return None
    if not isinstance(name, str) or not name or name.strip() != name or len(name.encode('utf-8')) > 253 \
            or any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        raise ValueError('%s: %r is not a provider name OpenShell accepts (non-empty, no surrounding or control '
                         'whitespace, at most 253 bytes); give the name of the job\'s provider as openshell provider '
                         'list shows it, or leave it unset for no binding' % (key, name))
    return name


def check_github_repository(value: Any, key: str = 'github_repository') -> Optional[str]:
    """A GitHub job's own repository as ``owner/name`` (GitHub's own character rules), or None. ValueError names
    ``key``."""
    if value is None:
        return None
    owner, sep, name = value.partition('/') if isinstance(value, str) else ('', '', '')
    if not sep or not _GITHUB_OWNER.match(owner) or not _GITHUB_NAME.match(name) or name in ('.', '..') \
            or name.endswith('.git'):
        raise ValueError('%s: %r is not a GitHub repository as owner/name (the owner letters, digits and -, the name '
                         'letters, digits, ., _ and -, without .git); give the job\'s own repository, e.g. '
                         'pi-dispatch/egress, or leave it unset on a job that is not a GitHub job' % (key, value))
    return value


def github_rules(repository: str) -> List[Dict[str, Any]]:
    """github.com's REST allow rules on a GitHub job: reads, a fetch from anywhere, a push to ``repository`` only.

    OpenShell's path globs: ``*`` and ``**`` match any characters, ``/`` included; ``owner/name`` has no glob
    character (:func:`check_github_repository`), so the push paths are literal.
    """
    allow = [('GET', '/**'), ('HEAD', '/**'), ('POST', '/**/git-upload-pack'),
             ('POST', '/%s.git/git-receive-pack' % repository), ('POST', '/%s/git-receive-pack' % repository)]
    return [{'allow': {'method': method, 'path': path}} for method, path in allow]


def restrict_github(translation: Translation, repository: Optional[str]) -> Translation:
    """Give every ``github.com`` endpoint :func:`github_rules` instead of ``access: full`` (None: unchanged)."""
    if repository is None:
        return translation
    found = False
    for _key, rule, _origin in translation.rules:
        for endpoint in rule['endpoints']:
            if endpoint['host'] == GITHUB_HOST:
                endpoint.pop('access', None)
                endpoint['rules'] = github_rules(repository)
                found = True
    translation.limits.append((LIMIT_GITHUB if found else LIMIT_GITHUB_UNLISTED) % repository)
    translation.github_repository = repository
    return translation


def bind(translation: Translation, provider: Optional[str]) -> Translation:
    """Bind every read endpoint of ``translation`` to ``provider`` (a checked name; None leaves it unbound).

    A passthrough opt-in is left unbound: OpenShell does not resolve a placeholder in a tunnel it does
    not read, and refuses a provider-credentialed endpoint without an inspected protocol.
    """
    if provider is not None:
        for _key, rule, _origin in translation.rules:
            for endpoint in rule['endpoints']:
                if 'protocol' in endpoint:  # a passthrough opt-in carries no credential
                    endpoint['credential_binding'] = {'provider': provider}
        translation.provider = provider
    return translation


def check_binaries(binaries: Any, key: str = 'binaries') -> List[str]:
    """The executables every rule admits: a non-empty list of absolute paths (globs allowed). Raises ValueError."""
    if not isinstance(binaries, (list, tuple)) or not binaries:
        raise ValueError('%s must be a non-empty list of absolute executable paths (default [%s], any executable '
                         'of the job, as squid admits any process)' % (key, ANY_BINARY))
    out = []
    for item in binaries:
        if not isinstance(item, str) or not item.startswith('/') or any(ord(c) <= 32 for c in item):
            raise ValueError('%s: %r is not an absolute executable path (e.g. /usr/bin/node, or /** for any '
                             'executable); write the path as the sandbox sees it' % (key, item))
        if item not in out:
            out.append(item)
    return out
