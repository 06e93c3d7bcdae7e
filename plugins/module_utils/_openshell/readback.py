# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""A policy read back from OpenShell, compared with the rendered one; and the policy file's text.

The comparison is semantic: both policies are ``SandboxPolicy`` messages (``schema.parse``),
reduced to one entry per (host, port) that a network rule admits, with everything else the
endpoint says (protocol, enforcement, access, allowed_ips, L7 rules, ...) and the executables of
its rule as that entry's value. Rule names and keys, the order of rules, endpoints and list
items, a host's case, ``port`` against ``ports: [port]``, and defaults written or left out do
not count. Only the network part is compared (``network_policies``); the filesystem, Landlock,
process and middleware sections are OpenShell's own and are reported as not compared.

A difference names the endpoint (``host:port``) and whether the read-back policy is missing
it, adds it, or carries it with other settings.
"""

from __future__ import annotations

import json
from typing import Any, Dict, FrozenSet, List, Optional, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import schema as _schema
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import endpoints as _endpoints

READBACK_DIFFERS = 'openshell-policy-readback-differs'
COMPARED = ('version', 'network_policies')

Key = Tuple[str, int]
VERSION_PORT = 0  # the one Difference that is not an endpoint: the policy's schema version


class Difference(object):
    """One endpoint that differs: ``kind`` is missing (rendered only), added (read back only) or changed."""

    def __init__(self, host: str, port: int, kind: str, rendered: Optional[List[Dict[str, Any]]],
                 read_back: Optional[List[Dict[str, Any]]]) -> None:
        self.host = host
        self.port = port
        self.kind = kind
        self.rendered = rendered
        self.read_back = read_back

    @property
    def endpoint(self) -> str:
        return self.host if self.port == VERSION_PORT else '%s:%d' % (self.host, self.port)

    def __str__(self) -> str:
        if self.kind == 'missing':
            return '%s: missing from the policy read back (the sources admit it)' % self.endpoint
        if self.kind == 'added':
            return ('%s: admitted by the policy read back, which the sources do not admit (%s)'
                    % (self.endpoint, _show(self.read_back)))
        return '%s: changed: rendered %s, read back %s' % (self.endpoint, _show(self.rendered), _show(self.read_back))

    def as_dict(self) -> Dict[str, Any]:
        return dict(endpoint=self.endpoint, host=self.host, port=self.port, kind=self.kind, rendered=self.rendered,
                    read_back=self.read_back, message=str(self))


class ReadBackDiffers(Exception):
    def __init__(self, differences: List[Difference], where: str) -> None:
        self.differences = list(differences)
        self.where = where
        lines = ['%s: the policy read back from %s differs from what the sources render in %d endpoint%s; a job '
                 'never runs under a policy that reads back differently:'
                 % (READBACK_DIFFERS, where, len(self.differences), '' if len(self.differences) == 1 else 's')]
        lines += ['  - %s' % d for d in self.differences]
        super(ReadBackDiffers, self).__init__('\n'.join(lines))


def _show(values: Optional[List[Dict[str, Any]]]) -> str:
    if not values:
        return '{}'
    return ' | '.join(json.dumps(v, sort_keys=True, separators=(', ', ': ')) for v in values)


def _canonical(value: Any) -> Any:
    """Order-insensitive normal form: dicts with sorted keys, lists sorted by their JSON text."""
    if isinstance(value, dict):
        return dict((k, _canonical(v)) for k, v in value.items())
    if isinstance(value, list):
        items = [_canonical(v) for v in value]
        return sorted(items, key=lambda v: json.dumps(v, sort_keys=True))
    return value


def endpoint_map(message: Any) -> Dict[Key, FrozenSet[str]]:
    """(host lowercased, port) -> the set of canonical settings every rule admitting it gives it."""
    out = {}  # type: Dict[Key, set]
    for rule in message.network_policies.values():
        binaries = sorted(set(b.path for b in rule.binaries))
        for endpoint in rule.endpoints:
            settings = _schema.endpoint_to_authored(endpoint)
            for field in ('host', 'port', 'ports'):
                settings.pop(field, None)
            settings['binaries'] = binaries
            text = json.dumps(_canonical(settings), sort_keys=True)
            ports = list(endpoint.ports) or [endpoint.port]
            for port in ports:
                out.setdefault((endpoint.host.lower(), int(port)), set()).add(text)
    return dict((key, frozenset(value)) for key, value in out.items())


def _decode(texts: FrozenSet[str]) -> List[Dict[str, Any]]:
    return [json.loads(t) for t in sorted(texts)]


def compare(rendered: Any, read_back: Any) -> List[Difference]:
    """Every endpoint whose admission differs between two ``SandboxPolicy`` messages, sorted by host and port."""
    want = endpoint_map(rendered)
    have = endpoint_map(read_back)
    out = []
    for key in sorted(set(want) | set(have)):
        if key not in have:
            out.append(Difference(key[0], key[1], 'missing', _decode(want[key]), None))
        elif key not in want:
            out.append(Difference(key[0], key[1], 'added', None, _decode(have[key])))
        elif want[key] != have[key]:
            out.append(Difference(key[0], key[1], 'changed', _decode(want[key]), _decode(have[key])))
    if rendered.version != read_back.version:
        out.append(Difference('the policy version', VERSION_PORT, 'changed', [{'version': rendered.version}],
                              [{'version': read_back.version}]))
    return out


def not_compared(policy: Any) -> List[str]:
    """The top-level sections of an authored or message-form policy that the comparison leaves out."""
    if not isinstance(policy, dict):
        return []
    return sorted(k for k in policy if k not in COMPARED)


# --- the file --------------------------------------------------------------------

class PolicyFileError(Exception):
    pass


def loads(text: str, path: str) -> Dict[str, Any]:
    """A policy document from JSON or YAML text (JSON is tried first). Raises PolicyFileError naming ``path``."""
    stripped = text.lstrip()
    if stripped.startswith('{'):
        try:
            data = json.loads(text, object_pairs_hook=_endpoints.pairs_no_duplicates)
        except ValueError as exc:
            raise PolicyFileError('%s is not valid JSON (%s); fix the file, or read the policy back again'
                                  % (path, exc))
    else:
        from ansible.module_utils.common.yaml import HAS_YAML, yaml_load  # pylint: disable=import-outside-toplevel
        if not HAS_YAML:
            raise PolicyFileError('%s is not JSON, and reading YAML needs PyYAML, which is not installed here; '
                                  'install PyYAML, or read the policy back as JSON' % path)
        try:
            data = yaml_load(text)
        except Exception as exc:  # pylint: disable=broad-except
            raise PolicyFileError('%s is not valid YAML (%s); fix the file, or read the policy back again'
                                  % (path, str(exc).replace('\n', ' ')))
    if not isinstance(data, dict):
        raise PolicyFileError('%s does not hold a policy (a mapping with version and network_policies); read the '
                              'policy back again' % path)
    return data


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return 'true' if value else 'false'
    if isinstance(value, int):
        return str(value)
    return json.dumps(value)  # a double-quoted YAML scalar (JSON escapes are YAML's)


def _yaml_lines(value: Any, indent: int) -> List[str]:
    pad = '  ' * indent
    lines = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                lines.append('%s%s:' % (pad, key))
                lines.extend(_yaml_lines(item, indent + 1))
            else:
                lines.append('%s%s: %s' % (pad, key, _empty(item) if isinstance(item, (dict, list)) else _scalar(item)))
        return lines
    for item in value:
        if isinstance(item, dict) and item:
            inner = _yaml_lines(item, indent + 1)
            inner[0] = '%s- %s' % (pad, inner[0].lstrip())
            lines.extend(inner)
        else:
            lines.append('%s- %s' % (pad, _scalar(item)))
    return lines


def _empty(value: Any) -> str:
    return '{}' if isinstance(value, dict) else '[]'


HEADER = ('# OpenShell sandbox policy (network part), rendered by pi_dispatch.egress (egress_openshell_policy)\n'
          '# from egress-allowlist.conf and model-endpoints.json. Do not edit: change the sources and render\n'
          '# again, so both venues keep one policy.\n')


def dumps(policy: Dict[str, Any], fmt: str = 'yaml') -> str:
    """The policy file's text: ``yaml`` (a header comment, then block YAML) or ``json``. Deterministic."""
    if fmt == 'json':
        return json.dumps(policy, indent=2) + '\n'
    return HEADER + '\n'.join(_yaml_lines(policy, 0)) + '\n'
