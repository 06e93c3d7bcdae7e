# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The host-firewall layer: its names and parameters, validated, and the comment rule that records them.

Pure except :func:`endpoint_ports`, which reads the deployment folder's
``model-endpoints.json``. The chains are ``<prefix>-INPUT``,
``<prefix>-FORWARD`` and ``<prefix>-UPSTREAM`` (:func:`chain_names`); what
the module was asked is written into the layer as one comment rule
(:func:`params_comment`) so that the doctor can read it back
(:func:`parse_params`) and recompute. Every refusal is a
:class:`FirewallError` naming the fix.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Dict, Iterable, List, Optional, Sequence

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import jobpool as _jobpool

DEFAULT_PREFIX = 'PI-EGRESS'
DEFAULT_UPSTREAM = 'pi-dispatch-egress-out'
DEFAULT_PORTS = (80, 443)
KINDS = ('INPUT', 'FORWARD', 'UPSTREAM')
INPUT_HOOK = 'INPUT'
FORWARD_HOOK = 'DOCKER-USER'
FAMILIES = ('ipv4', 'ipv6')
CHAIN_MAX = 28           # iptables: a chain name has at most 28 characters
MULTIPORT_MAX = 15       # -m multiport takes at most 15 ports
COMMENT_MAX = 255
PARAMS_TAG = 'pi_dispatch.egress.egress_firewall v1'
DNS_PORT = 53

_PREFIX_RE = re.compile(r'^[A-Z0-9][A-Z0-9_-]*\Z')
_NET_NAME_RE = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.-]*\Z')


class FirewallError(ValueError):
    """Bad input or a host that cannot take the layer; the message names the fix. Nothing was changed."""


# --------------------------------------------------------------------------
# Names and parameters (pure)
# --------------------------------------------------------------------------

def validate_prefix(prefix: Any) -> str:
    """The chain-name prefix: upper-case letters, digits, '-' and '_', so every chain fits in 28 characters."""
    longest = max(len(kind) for kind in KINDS) + 1
    if not isinstance(prefix, str) or not _PREFIX_RE.match(prefix) or len(prefix) + longest > CHAIN_MAX:
        raise FirewallError(
            'chain_prefix %r is refused: use upper-case letters, digits, "-" and "_", starting with a letter or '
            'a digit, at most %d characters (the chains are <prefix>-INPUT, <prefix>-FORWARD and '
            '<prefix>-UPSTREAM, and iptables allows %d characters), e.g. PI-EGRESS.'
            % (prefix, CHAIN_MAX - longest, CHAIN_MAX))
    if prefix in ('INPUT', 'FORWARD', 'OUTPUT', 'DOCKER', 'DOCKER-USER') or prefix.startswith('DOCKER'):
        raise FirewallError('chain_prefix %r is refused: it names chains Docker or iptables own; use e.g. '
                            'PI-EGRESS.' % prefix)
    return prefix


def chain_names(prefix: str = DEFAULT_PREFIX) -> Dict[str, str]:
    """kind -> chain name ('INPUT' -> 'PI-EGRESS-INPUT', ...)."""
    validate_prefix(prefix)
    return dict((kind, '%s-%s' % (prefix, kind)) for kind in KINDS)


def validate_pool(pool: Any) -> Optional[str]:
    """None/'' (no pool rule) or an IPv4 network (string form)."""
    if pool in (None, ''):
        return None
    try:
        net = ipaddress.ip_network(pool, strict=True)
    except ValueError as exc:
        raise FirewallError('pool %r is not a network (%s); give the job networks\' pool as a CIDR such as '
                            '%s, or "" for no pool rule.' % (pool, exc, _jobpool.DEFAULT_POOL))
    if net.version != 4 or net.prefixlen == 0:
        raise FirewallError('pool %r is refused: give the IPv4 job-network pool (e.g. %s); a /0 would drop '
                            'everything.' % (pool, _jobpool.DEFAULT_POOL))
    return str(net)


def validate_ports(ports: Optional[Iterable[Any]], key: str = 'upstream_ports') -> List[int]:
    out = []
    for port in ports or []:
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise FirewallError('%s: %r is not a TCP port (1-65535); e.g. [80, 443].' % (key, port))
        out.append(port)
    return sorted(set(out))


def validate_network_names(names: Optional[Iterable[Any]]) -> Optional[List[str]]:
    if names is None:
        return None
    for name in names:
        if not isinstance(name, str) or not _NET_NAME_RE.match(name) or ',' in name:
            raise FirewallError('networks: %r is not a docker network name.' % (name,))
    return sorted(set(names))


def params_comment(pool: Optional[str], upstream: Optional[str], ports: Optional[Sequence[int]], endpoints: bool,
                   networks: Optional[Sequence[str]], created_table: bool = False) -> str:
    """The comment rule that opens ``<prefix>-INPUT``: what the module was asked, so the doctor can recompute.

    ``ports`` None means the upstream is not limited; ``networks`` None means
    every job and canary network on the daemon.
    """
    text = '%s pool=%s upstream=%s ports=%s endpoints=%s networks=%s' % (
        PARAMS_TAG, pool or '-', upstream or '-',
        ','.join(str(p) for p in ports) if ports is not None else '-',
        'yes' if endpoints else 'no',
        ','.join(networks) if networks is not None else '*')
    if created_table:
        text += ' table=created'
    if len(text) > COMMENT_MAX:
        raise FirewallError('The parameters do not fit in an iptables comment (%d > %d characters): name fewer '
                            'networks (leave networks unset to cover every job network).' % (len(text), COMMENT_MAX))
    return text


def parse_params(comment: Optional[str]) -> Optional[Dict[str, Any]]:
    """The parameters from :func:`params_comment`'s text, or None when it is not ours."""
    if not comment or not comment.startswith(PARAMS_TAG + ' '):
        return None
    fields = {}
    for word in comment[len(PARAMS_TAG) + 1:].split():
        key, sep, value = word.partition('=')
        if not sep:
            return None
        fields[key] = value
    try:
        ports = None if fields.get('ports', '-') == '-' else [int(p) for p in fields['ports'].split(',') if p]
    except ValueError:
        return None
    networks = fields.get('networks', '*')
    return dict(pool=None if fields.get('pool', '-') == '-' else fields['pool'],
                upstream=None if fields.get('upstream', '-') == '-' else fields['upstream'],
                ports=ports, endpoints=fields.get('endpoints') == 'yes',
                networks=None if networks == '*' else [n for n in networks.split(',') if n],
                created_table=fields.get('table') == 'created')


# --------------------------------------------------------------------------
# Ports the upstream may reach besides 80 and 443
# --------------------------------------------------------------------------

def endpoint_ports(deploy_dir: str) -> List[int]:
    """The declared model-endpoint ports in ``<deploy_dir>/model-endpoints.json`` (sorted)."""
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import endpoints as _endpoints
    try:
        endpoints, _path, _exists = _endpoints.load(deploy_dir)
    except Exception as exc:  # EndpointsError names the file, the key and the fix
        raise FirewallError('The model endpoints could not be read for the upstream ports: %s'
                            % ' '.join(str(exc).split()))
    return sorted(set(int(e.port) for e in endpoints))
