# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""A transparent job network's part of the gateway (docs/transparent.md).

The network is split in two halves: the engine hands out addresses from the lower half only
(``ip_range``), the gateway answers names with addresses of the upper half (one per name). After the
proxy (or its shard) and the gateway are attached, :func:`configure` writes the network's file into
the gateway and has it apply it; :func:`forget` undoes it before the gateway is detached.
"""

from __future__ import annotations

import io
import ipaddress
import json
import tarfile
import time
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common.docker_client import EngineError, api_message
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets.engine import (
    connect_proxy,
    inspect_job_network,
)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets.names import PROXY_PORT, JobNetError
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets.pool import subnet_of
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import optins as _optins_mod
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy.optins import Optins
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy.gateway import (
    GATEWAY_NAME,
    NETS_DIR,
    GatewayError,
    control_request,
    control_socket,
    exec_gatewayd,
)

EXPLICIT = 'explicit'
TRANSPARENT = 'transparent'
MODES = (EXPLICIT, TRANSPARENT)
# A transparent network needs room for per-name addresses: /26 gives the engine the lower /27 and the
# gateway the upper /27 (30 names at a time).
TRANSPARENT_PREFIX = 26
MAX_TRANSPARENT_PREFIX = 27


def project_optins(project_policy: str, deploy_dir: str) -> Optins:
    """The opt-ins of a project's policy file, when they may take effect (docs/transparent.md).

    The file is read (and seeded deny-all when missing) with no link followed; a policy that opens any port
    must be the one the operator approved into ``deploy_dir`` (``_policy/optins.py`` ``approve``), since a job
    of the project can write the file. Raises JobNetError naming the file, the diff against the approval and
    the approving command, before anything is created.
    """
    try:
        optins = _optins_mod.load(project_policy)
        _optins_mod.check_approved(optins, deploy_dir)
    except (_optins_mod.OptinError, OSError) as exc:
        raise JobNetError(str(exc))
    return optins


def approve_optins(project_policy: str, digest: Optional[str] = None, deploy_dir: Optional[str] = None,
                   check_mode: bool = False) -> Dict[str, Any]:
    """Approve the opt-ins ``project_policy`` holds now, whose digest is ``digest`` (the one the operator reviewed).

    ``deploy_dir``: the deployment folder that keeps the approvals (default /opt/pi-dispatch/egress). Returns
    dict(changed, policy, approval, digest, opens, diff, approved_before, command); ``check_mode`` approves
    nothing (``digest`` may be None). Raises JobNetError when the file is refused, changed since it was
    reviewed (``digest`` is not its digest now), or the folder is unusable; nothing is approved then.
    """
    try:
        return _optins_mod.approve(project_policy, deploy_dir or _deployment.DEFAULT_DEPLOY_DIR,
                                   digest, check_mode=check_mode)
    except (_optins_mod.OptinError, OSError) as exc:
        raise JobNetError(str(exc))


def check_mode_name(mode: str) -> str:
    if mode not in MODES:
        raise JobNetError('mode %r is not one of %s. Fix: pass mode=%r (proxy variables) or mode=%r (the '
                          'gateway). Nothing was created.' % (mode, ', '.join(MODES), EXPLICIT, TRANSPARENT))
    return mode


def prefix_for(mode: str, prefix: int, default_prefix: int) -> int:
    """The subnet prefix a network of ``mode`` gets (a transparent one needs /27 or wider)."""
    if mode != TRANSPARENT:
        return prefix
    if prefix == default_prefix:
        return TRANSPARENT_PREFIX
    if prefix > MAX_TRANSPARENT_PREFIX:
        raise JobNetError('prefix /%d is too small for a transparent job network (the gateway needs half of '
                          'it for its per-name addresses). Fix: pass prefix=%d or wider. Nothing was created.'
                          % (prefix, TRANSPARENT_PREFIX))
    return prefix


def halves(subnet: ipaddress.IPv4Network) -> Tuple[ipaddress.IPv4Network, ipaddress.IPv4Network]:
    """(the engine's range, the gateway's per-name range)."""
    low, high = subnet.subnets(prefixlen_diff=1)
    return low, high


def address_on(attrs: Dict[str, Any], container: str) -> Optional[str]:
    """The IPv4 address ``container`` has in a network inspect, or None."""
    for _cid, endpoint in (attrs.get('Containers') or {}).items():
        if (endpoint or {}).get('Name') == container:
            return (endpoint.get('IPv4Address') or '').split('/')[0] or None
    return None


def config(job_id: str, network: str, subnet: str, gateway_addr: str, proxy_addr: str, proxy_port: int,
           optins: Optins) -> Dict[str, Any]:
    net = ipaddress.ip_network(subnet)
    _low, high = halves(net)
    return dict(network=network, job_id=job_id, subnet=str(net), gateway=gateway_addr, vrange=str(high),
                proxy=proxy_addr, proxy_port=proxy_port, optins=optins.as_config(), policy=optins.path,
                written=int(time.time()))


def _tar(name: str, data: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode='w') as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = 0o644
        info.mtime = int(time.time())
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def configure(client: Any, gateway: str, conf: Dict[str, Any]) -> None:
    """Write the network's file into the gateway and apply it. Raises GatewayError.

    Through the gateway's root control socket when it has one (no new process); else (a gateway made before
    it had one) the file is copied in and ``gatewayd apply`` run through ``docker exec``."""
    reply = control_request(control_socket(client, gateway), gateway, dict(op='configure', config=conf))
    if reply is not None:
        if conf['network'] not in (reply.get('networks') or []):
            raise GatewayError('The gateway %s did not apply %s (it is not on that network: docker logs %s)'
                               % (gateway, conf['network'], gateway))
        return
    data = json.dumps(conf, sort_keys=True).encode('utf-8')
    try:
        ok = client.api.put_archive(gateway, NETS_DIR, _tar(conf['network'] + '.json', data))
    except Exception as exc:
        raise GatewayError('Writing the configuration of %s into the gateway %s failed: %s'
                           % (conf['network'], gateway, api_message(exc)))
    if not ok:
        raise GatewayError('The gateway %s refused the configuration of %s' % (gateway, conf['network']))
    exec_gatewayd(client, gateway, ['apply'])


def forget(client: Any, gateway: str, network: str) -> None:
    if control_request(control_socket(client, gateway), gateway, dict(op='forget', network=network)) is None:
        exec_gatewayd(client, gateway, ['forget', network])


def counters(client: Any, gateway: str) -> Dict[str, Any]:
    """What the gateway dropped (``dropped``: chain -> packets, bytes) and refused (``refused``: '<network> <reason>'
    -> count), the DNS datagrams its rate bound dropped (``dns_rate_limited``: job subnet -> packets), and the
    networks it serves (``networks``: network, job_id, subnet, gateway, optins, policy), from ``gatewayd counters``."""
    return json.loads(exec_gatewayd(client, gateway, ['counters']))


status = counters


def chain_name(subnet: str) -> str:
    """The gateway's packet-filter chain of a job network (what ``gatewayd counters`` reports by)."""
    return 'PIGW-' + str(ipaddress.ip_network(subnet).network_address).replace('.', '-')


class How(object):
    """How a job network is made: its mode and, for a transparent one, its opt-ins and gateway."""

    def __init__(self, mode: str = EXPLICIT, optins: Optional[_optins_mod.Optins] = None,
                 gateway: str = GATEWAY_NAME, proxy_port: int = PROXY_PORT) -> None:
        self.mode = mode
        self.optins = optins or _optins_mod.deny_all()
        self.gateway = gateway
        self.proxy_port = proxy_port

    def result(self, jn: Any, attrs: Optional[Dict[str, Any]] = None) -> Any:
        """``jn`` (a lifecycle.JobNetwork) with the mode's attributes set."""
        jn.mode = self.mode
        if self.mode == TRANSPARENT:
            jn.gateway = self.gateway
            jn.optins = self.optins.as_dict()
            jn.dns = address_on(attrs or {}, self.gateway)
        return jn


def with_gateway(client: Any, net_id: str, name: str, job_id: str, carrier: str, how: How) -> List[str]:
    """Attach the gateway to a transparent network and have it apply the network's file. Returns the actions.

    Raises EngineError (GatewayError) naming what failed; the caller undoes what it made.
    """
    actions = []
    try:
        if connect_proxy(client, net_id, how.gateway):
            actions.append('attach %s' % how.gateway)
    except EngineError as exc:
        raise GatewayError('Attaching the gateway %s to %s failed: %s. Start it first (docs/transparent.md).'
                           % (how.gateway, name, exc))
    attrs = inspect_job_network(client, name) or {}
    gw_addr = address_on(attrs, how.gateway)
    proxy_addr = address_on(attrs, carrier)
    if not gw_addr or not proxy_addr:
        raise GatewayError('%s has no address for the gateway %s or the proxy %s after attaching them'
                           % (name, how.gateway, carrier))
    configure(client, how.gateway, config(
        job_id, name, subnet_of(attrs), gw_addr, proxy_addr, how.proxy_port, how.optins))
    actions.append('configure %s for %s' % (how.gateway, name))
    return actions
