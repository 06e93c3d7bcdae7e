# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""OpenShell's own policy schema: the protobuf messages of the ``openshell`` package, imported lazily.

The package (pinned: :data:`REQUIREMENT`) is the source of truth for what a sandbox policy may
hold: a rendered policy is parsed into its ``SandboxPolicy`` message with unknown fields
refused, and a policy read back (from a file or a gateway) is compared through the same
message. This file imports cleanly without the package (``ansible-test sanity`` imports it on
every Python): :data:`IMPORT_ERROR` then holds the reason and :func:`parse` refuses.

Two spellings of one policy meet here. The authored form (the YAML or JSON that
``openshell policy set`` reads) writes enums by their short names (``enforcement: enforce``,
``access: full``) and the filesystem section as ``filesystem_policy``; the message's JSON
mapping writes ``NETWORK_ENFORCEMENT_MODE_ENFORCE`` and ``filesystem``. :func:`to_message_dict`
maps the first onto the second for the fields that differ and leaves every other key as it
is, so a key the message does not have is still refused by the parse.
"""

from __future__ import annotations

import copy
import traceback
from typing import Any, Dict, Optional

PACKAGE = 'openshell'
PINNED_VERSION = '0.1.5'
REQUIREMENT = '%s==%s' % (PACKAGE, PINNED_VERSION)
INSTALL = 'pip install %s' % REQUIREMENT

IMPORT_ERROR = None
try:
    from google.protobuf import json_format
    from openshell._proto import sandbox_pb2
except Exception:  # pylint: disable=broad-except
    # Missing, or present but unusable here (a Python older than the package needs, a protobuf
    # runtime it was not built for): either way the schema is not available, never a traceback.
    json_format = None
    sandbox_pb2 = None
    IMPORT_ERROR = traceback.format_exc()

# authored short name -> the enum value's name in the message
ENFORCEMENT = {'enforce': 'NETWORK_ENFORCEMENT_MODE_ENFORCE', 'audit': 'NETWORK_ENFORCEMENT_MODE_AUDIT'}
ACCESS = {'read-only': 'NETWORK_ACCESS_PRESET_READ_ONLY', 'read-write': 'NETWORK_ACCESS_PRESET_READ_WRITE',
          'full': 'NETWORK_ACCESS_PRESET_FULL'}
TLS = {'skip': 'NETWORK_TLS_MODE_SKIP', 'terminate': 'NETWORK_TLS_MODE_TERMINATE',
       'passthrough': 'NETWORK_TLS_MODE_PASSTHROUGH'}
ENUMS = {'enforcement': ENFORCEMENT, 'access': ACCESS, 'tls': TLS}
TOP_RENAMES = {'filesystem_policy': 'filesystem'}

UNAVAILABLE_FIX = ('%s on the host that runs the module (Python 3.11 or later), then run again; nothing is '
                   'rendered or compared until then' % INSTALL)


class SchemaRefused(Exception):
    """A policy OpenShell's own message does not accept: ``where`` (file or label), ``reason`` and ``fix``."""

    def __init__(self, where: str, reason: str, fix: str) -> None:
        self.where = where
        self.reason = reason
        self.fix = fix
        super(SchemaRefused, self).__init__('%s: %s; %s' % (where, reason, fix))


def available() -> bool:
    return sandbox_pb2 is not None


def installed_version() -> Optional[str]:
    """The installed ``openshell`` distribution's version, or None when it cannot be told."""
    if not available():
        return None
    try:
        from importlib.metadata import version  # pylint: disable=import-outside-toplevel
        return version(PACKAGE)
    except Exception:  # pylint: disable=broad-except
        return None


def unavailable_reason() -> str:
    return ('the Python package %s (pinned %s) cannot be imported here, so the policy cannot be checked against '
            "OpenShell's own schema" % (PACKAGE, PINNED_VERSION))


def to_message_dict(policy: Any) -> Any:
    """The authored policy ``policy`` in the message's JSON mapping (a deep copy; ``policy`` is untouched).

    Renames ``filesystem_policy`` and maps the short enum names of every endpoint; anything else,
    including a value that is not a short name, is passed on for the parse to judge.
    """
    if not isinstance(policy, dict):
        return policy
    out = copy.deepcopy(policy)
    for authored, field in TOP_RENAMES.items():
        if authored in out and field not in out:
            out[field] = out.pop(authored)
    rules = out.get('network_policies')
    if isinstance(rules, dict):
        for rule in rules.values():
            endpoints = rule.get('endpoints') if isinstance(rule, dict) else None
            if not isinstance(endpoints, list):
                continue
            for endpoint in endpoints:
                if not isinstance(endpoint, dict):
                    continue
                for key, names in ENUMS.items():
                    value = endpoint.get(key)
                    if isinstance(value, str) and value in names:
                        endpoint[key] = names[value]
    return out


def parse(policy: Any, where: str) -> Any:
    """``policy`` (authored or message form) as a ``SandboxPolicy`` message; unknown fields refused.

    Raises :class:`SchemaRefused` naming ``where`` when the package is not available, when
    ``policy`` is not a mapping, or when the message does not accept it (the parser's own words:
    the field and the message it is not a field of).
    """
    if not available():
        raise SchemaRefused(where, unavailable_reason(), UNAVAILABLE_FIX)
    if not isinstance(policy, dict):
        raise SchemaRefused(where, 'is not a mapping (a policy is an object with version and network_policies)',
                            'give the policy document itself, as OpenShell writes it')
    message = sandbox_pb2.SandboxPolicy()
    try:
        json_format.ParseDict(to_message_dict(policy), message, ignore_unknown_fields=False)
    except json_format.ParseError as exc:
        raise SchemaRefused(where, "is not accepted by OpenShell's SandboxPolicy message (%s)" % exc,
                            'compare it with the policy schema of openshell %s; nothing is guessed' % PINNED_VERSION)
    return message


def message_to_dict(message: Any) -> Dict[str, Any]:
    """A message as a plain dict, field names as in the .proto, defaults left out."""
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


SHORT_NAMES = dict((key, dict((v, k) for k, v in names.items())) for key, names in ENUMS.items())


def endpoint_to_authored(message: Any) -> Dict[str, Any]:
    """A ``NetworkEndpoint`` message as the authored form writes it (short enum names)."""
    out = message_to_dict(message)
    for key, names in SHORT_NAMES.items():
        if out.get(key) in names:
            out[key] = names[out[key]]
    return out
