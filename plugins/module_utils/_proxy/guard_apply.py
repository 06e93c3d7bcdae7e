# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The destination guard applied: what egress_guard does between its options and its result.

Read the proxy's gateways from the daemon, validate the opened destinations against them and the job
pool, render ``egress-guard.conf``, write it in place when it differs, then reload the proxy and its
shards through the one reload path, putting the previous guard back when squid refuses it. The guard
itself (validation, render) is ``_policy/guard.py``'s; this lives beside the reload path because it
reloads the proxy.

:class:`GuardApply` keeps the result so far in ``result`` and the warnings in ``warnings``, and raises
:class:`GuardFailed` (the message and what goes beside the result) for the module's ``fail_json``.
"""

from __future__ import annotations

from typing import Any

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import files as _files
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import guard as _guard
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import lifecycle as _proxy
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import reload as _reload
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import spec as _proxy_spec

NOTHING_WRITTEN = 'Nothing was written.'


class GuardFailed(Exception):
    """The run stops: the message, and ``extra`` (``retryable``) to report beside the result."""

    def __init__(self, message: str, **extra: Any) -> None:
        super(GuardFailed, self).__init__(message)
        self.extra = extra


def new_result(include: str) -> dict[str, Any]:
    return dict(changed=False, include=include, opened=[], gateways=[], host_gateway=None, kept_inside=[],
                denied=[], reloaded=False, actions=[])


class GuardApply(object):
    """One run of egress_guard on the deployment folder's ``deploy_paths`` (``_policy/deployment.paths``)."""

    def __init__(self, params: dict[str, Any], deploy_paths: dict[str, str], check_mode: bool = False,
                 diff: bool = False) -> None:
        self.params = params
        self.deploy_paths = deploy_paths
        self.include = deploy_paths['guard_conf']
        self.check_mode = check_mode
        self.diff = diff
        self.warnings: list[str] = []
        self.result = new_result(self.include)

    def read_gateways(self, client: Any) -> tuple[Any, list[str], str | None]:
        """(the proxy container or None, the gateways of its networks, the host-gateway address or None)."""
        name = self.params['proxy_name']
        try:
            container = dc.get_container(client, name)
            gateways, host_gateway = _proxy.gateways(client, container)
        except dc.EngineError as exc:
            raise GuardFailed('%s %s' % (exc, NOTHING_WRITTEN), retryable=bool(getattr(exc, 'retryable', False)))
        try:
            host_gateway = str(_guard.ipaddress.ip_address(host_gateway)) if host_gateway else None
        except ValueError:
            self.warnings.append('host.docker.internal is %r inside %s, not an address; it is not in the guard'
                                 % (host_gateway, name))
            host_gateway = None
        self.result.update(gateways=gateways, host_gateway=host_gateway)
        return container, gateways, host_gateway

    def render(self, gateways: list[str], host_gateway: str | None) -> str:
        """The guard's text; ``result`` gets what it opens, keeps inside and denies."""
        p = self.params
        try:
            _guard.check_client_max_connections(p['client_max_connections'])
            opened = _guard.validate(p['private_destinations'], p['job_pool'], gateways, host_gateway)
        except (_guard.GuardError, ValueError) as exc:
            raise GuardFailed(str(exc))
        text = _guard.render(opened, p['job_pool'], gateways, host_gateway, p['client_max_connections'])
        self.result.update(
            opened=[str(n) for n in opened], kept_inside=_guard.kept_inside(opened, gateways, host_gateway),
            denied=[str(n) for n in _guard.denied(opened, p['job_pool'], gateways, host_gateway)])
        return text

    def run(self, client: Any) -> dict[str, Any]:
        p, result, include = self.params, self.result, self.include
        container, gateways, host_gateway = self.read_gateways(client)
        text = self.render(gateways, host_gateway)
        try:
            _files.check_target(include)
            current = _files.read(include)
        except _files.InPlaceError as exc:
            raise GuardFailed('%s Lay out the deployment folder first (pi_dispatch.egress.egress_deployment adds '
                              'the missing file).' % exc)
        changed = current != text.encode('utf-8')
        result['changed'] = changed
        if self.diff:
            result['diff'] = dict(before=current.decode('utf-8', 'replace'), after=text, before_header=include,
                                  after_header=include)
        live = container is not None and container.status == 'running'
        if changed:
            result['actions'].append('write %s' % include)
            if p['reload'] and live:
                result['actions'].append('squid -k parse, then squid -k reconfigure in %s' % p['proxy_name'])
                result['reloaded'] = True
        if changed and not self.check_mode:
            self.write_and_reload(client, container, current, text)
        if changed and not live:
            self.warnings.append('The proxy %s is not running, so it was not reloaded; it reads %s when it starts.'
                                 % (p['proxy_name'], include))
        return result

    def write_and_reload(self, client: Any, container: Any, current: bytes, text: str) -> None:
        """Write the guard in place, then reload when decided; the previous guard back when squid refuses it."""
        result, include = self.result, self.include
        try:
            _files.write_in_place(include, text, fallback=current)
        except _files.InPlaceError as exc:
            raise GuardFailed(str(exc))
        if not result['reloaded']:
            return
        try:
            result['loaded'] = _reload.reload_family(client, container, self.deploy_paths)
        except _reload.ParseRefused as exc:
            _files.write_in_place(include, current, fallback=current)
            result['reloaded'] = False
            raise GuardFailed('%s The previous %s was written back.' % (exc, include))
        except (_proxy_spec.ProxyError, dc.EngineError) as exc:
            result['reloaded'] = False
            raise GuardFailed('%s The include is written; reload with docker exec %s squid -k reconfigure.'
                              % (exc, self.params['proxy_name']))
