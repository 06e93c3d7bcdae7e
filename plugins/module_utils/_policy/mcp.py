# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""A job's MCP servers (the overlay's ``mcp.json``) against the egress policy (seed 000).

MCP servers a job connects go through the same proxy as everything else. A streamable HTTP server
(one with a ``url``) is reachable when its host is listed and it is https:// on 443, or when its host
and port are exactly a declared model endpoint's; a job naming one that is neither is refused before
it starts. A server the job runs itself (``command``) needs nothing from the proxy, except that a
package runner (npx, uvx, ...) fetches its package from a registry, which must be listed: that is
said, not refused.

The file is read the way pi reads it (``_common/jsonc.py``: comments, a byte order mark, trailing
commas). ``mcpServers`` maps a name to a server; ``enabled: false`` or ``disabled: true`` switches
one off. A wrong-typed field is refused naming its path. Headers and environment values are never
read into a message, and a URL is shown with its credentials masked. Pure: :func:`parse`,
:func:`judge`; :func:`load` reads the file.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import jsonc as _jsonc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import redact as _redact
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import hostnames as _hostnames

FILE_NAME = 'mcp.json'
SERVERS_KEY = 'mcpServers'
# The package runners a stdio server may name, and the registries they fetch from.
RUNNER_REGISTRIES: Dict[str, Tuple[str, ...]] = {
    'npx': ('registry.npmjs.org',),
    'bunx': ('registry.npmjs.org',),
    'pnpx': ('registry.npmjs.org',),
    'uvx': ('pypi.org', 'files.pythonhosted.org'),
    'pipx': ('pypi.org', 'files.pythonhosted.org'),
}
REACHABLE, ENDPOINT, REFUSED, LOCAL, RUNNER = 'listed', 'endpoint', 'refused', 'local', 'runner'


class McpError(ValueError):
    """The file cannot be read as pi reads it: the message names the file, where, and the fix."""


class Server(object):
    """One enabled or disabled server of ``mcp.json``: remote (``url``) or run by the job (``command``)."""

    __slots__ = ('name', 'url', 'command', 'enabled')

    def __init__(self, name: str, url: Optional[str] = None, command: Optional[str] = None,
                 enabled: bool = True) -> None:
        self.name, self.url, self.command, self.enabled = name, url, command, enabled

    @property
    def shown_url(self) -> str:
        return _redact.redact(self.url or '') or ''

    def address(self) -> Optional[Tuple[str, str, int]]:
        """(scheme, host, port) of a remote server's URL; None when it is not http(s) with a host."""
        return _hostnames.url_address(self.url or '')


class Finding(object):
    """What the policy makes of one server: ``kind`` (listed, endpoint, refused, local, runner) and why."""

    __slots__ = ('server', 'kind', 'reason', 'fix', 'endpoint_id')

    def __init__(self, server: Server, kind: str, reason: str, fix: str = '', endpoint_id: Optional[str] = None):
        self.server, self.kind, self.reason, self.fix, self.endpoint_id = server, kind, reason, fix, endpoint_id

    @property
    def refused(self) -> bool:
        return self.kind == REFUSED

    def __str__(self) -> str:
        return 'MCP server %r%s: %s%s' % (self.server.name, (' (%s)' % self.server.shown_url) if self.server.url
                                          else '', self.reason, ('; %s' % self.fix) if self.fix else '')

    def as_dict(self) -> Dict[str, Any]:
        return dict(server=self.server.name, url=self.server.shown_url or None, kind=self.kind, reason=self.reason,
                    fix=self.fix, endpoint=self.endpoint_id)


def _type(value: Any) -> str:
    return {bool: 'a boolean', int: 'a number', float: 'a number', str: 'a string', list: 'a list',
            dict: 'an object', type(None): 'null'}.get(type(value), type(value).__name__)


def parse(text: Any, path: str = FILE_NAME) -> List[Server]:
    """The servers of ``mcp.json`` text, in file order; McpError naming the file, where and the fix."""
    try:
        data = _jsonc.loads(text)
    except _jsonc.JsoncError as exc:
        raise McpError('%s%s %s; pi would not read it either. Fix the JSON (comments and trailing commas are '
                       'fine)' % (path, (' (%s)' % exc.where) if exc.where else '', exc)) from None
    if not isinstance(data, dict):
        raise McpError('%s: the top level is %s, not an object; write {"%s": {...}}'
                       % (path, _type(data), SERVERS_KEY))
    servers = data.get(SERVERS_KEY, {})
    if not isinstance(servers, dict):
        raise McpError('%s: "%s" is %s, not an object of name -> server' % (path, SERVERS_KEY, _type(servers)))
    out = []
    for name, spec in servers.items():
        where = '%s: %s.%s' % (path, SERVERS_KEY, name)
        if not isinstance(spec, dict):
            raise McpError('%s is %s, not an object; give {"url": "https://..."} or {"command": "..."}'
                           % (where, _type(spec)))
        for key in ('url', 'command', 'type', 'transport'):
            if key in spec and not isinstance(spec[key], str):
                raise McpError('%s.%s is %s, not a string' % (where, key, _type(spec[key])))
        for key in ('enabled', 'disabled'):
            if key in spec and not isinstance(spec[key], bool):
                raise McpError('%s.%s is %s, not true or false' % (where, key, _type(spec[key])))
        for key, kind in (('args', list), ('headers', dict), ('env', dict)):
            if key in spec and not isinstance(spec[key], kind):
                raise McpError('%s.%s is %s, not %s' % (where, key, _type(spec[key]), _type(kind())))
        url, command = spec.get('url'), spec.get('command')
        if bool(url) == bool(command):
            raise McpError('%s has %s; give exactly one of "url" (a streamable HTTP server) or "command" (a server '
                           'the job runs)' % (where, 'both url and command' if url else 'neither url nor command'))
        enabled = spec.get('enabled', True) and not spec.get('disabled', False)
        out.append(Server(str(name), url=url, command=command, enabled=enabled))
    return out


def judge(servers: Sequence[Server], listed: Callable[[str], bool], endpoints: Sequence[Any]) -> List[Finding]:
    """One finding per enabled server (disabled ones are skipped): reachable, refused, or what a runner needs."""
    declared = dict(((str(ep.host).lower(), int(ep.port)), ep) for ep in endpoints)
    findings = []
    for server in servers:
        if not server.enabled:
            continue
        if server.command:
            runner = os.path.basename(server.command.strip().split()[0]) if server.command.strip() else ''
            registries = RUNNER_REGISTRIES.get(runner)
            if registries:
                unlisted = [host for host in registries if not listed(host)]
                if unlisted:
                    findings.append(Finding(server, RUNNER, 'runs %s, which fetches its package from %s: %s not '
                                            'listed, so the server cannot start in the job'
                                            % (runner, ', '.join(registries), ', '.join(unlisted)),
                                            fix='list %s in egress-allowlist.conf, or install the package in the '
                                                'job image' % ', '.join(unlisted)))
                    continue
            findings.append(Finding(server, LOCAL, 'runs in the job (%s); it reaches what the allowlist lists'
                                    % (runner or 'a command')))
            continue
        address = server.address()
        if address is None:
            findings.append(Finding(server, REFUSED, 'the url is not an http:// or https:// URL with a host',
                                    fix='give the server\'s https:// URL'))
            continue
        scheme, host, port = address
        endpoint = declared.get((host, port))
        if endpoint is not None:
            findings.append(Finding(server, ENDPOINT, 'is the declared model endpoint %s (%s:%d)'
                                    % (endpoint.id, host, port), endpoint_id=endpoint.id))
        elif scheme == 'https' and port == 443 and listed(host):
            findings.append(Finding(server, REACHABLE, '%s is listed (https on 443)' % host))
        else:
            if scheme != 'https':
                why = 'is http://, and %s:%d is not a declared model endpoint' % (host, port)
            elif port != 443:
                why = 'is on port %d, and %s:%d is not a declared model endpoint' % (port, host, port)
            else:
                why = '%s is not listed, and %s:443 is not a declared model endpoint' % (host, host)
            findings.append(Finding(server, REFUSED, '%s, so the proxy refuses it' % why,
                                    fix='serve it as https:// on 443 from a listed host, or declare %s:%d in '
                                        'model-endpoints.json' % (host, port)))
    return findings


def load(path: str) -> List[Server]:
    """The servers of the file at ``path``; McpError for a missing, unreadable, symlinked or unreadable-as-JSON file."""
    if os.path.islink(path):
        raise McpError('%s is a symlink; it is refused rather than followed. Give the file itself' % path)
    try:
        with open(path, 'rb') as handle:
            data = handle.read()
    except (IOError, OSError) as exc:
        raise McpError('%s could not be read (%s); give the job\'s mcp.json'
                       % (path, getattr(exc, 'strerror', None) or exc)) from None
    return parse(data, path)
