# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The model endpoints applied: what model_endpoints does between its options and its result.

Declare (the file or the ``endpoints`` option, refused never repaired), render the squid include,
compare it with the file the proxy mounts, decide the reload before anything is written, write the
include in place, then reload the proxy and its shards through the one reload path (``_proxy/reload.py``),
putting the previous include back when squid refuses the new one. It lives beside the reload path
because it reloads the proxy; the declaration and the include are ``_policy/endpoints.py``'s.

:class:`EndpointsApply` keeps the result so far in ``result`` and raises :class:`EndpointsFailed`
(the message and what goes beside the result) for the module to pass to ``fail_json``.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import files as _files
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import endpoints as _endpoints
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import rules as _rules
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import reload as _reload

PARSE_CMD = _reload.PARSE_CMD
RECONFIGURE_CMD = ['squid', '-k', 'reconfigure', '-f', _rules.CONTAINER_RULES]
NOTHING_WRITTEN = 'Nothing was written.'


class EndpointsFailed(Exception):
    """The run stops: the message, and ``extra`` (``problems``, ``retryable``) to report beside the result."""

    def __init__(self, message: str, **extra: Any) -> None:
        super(EndpointsFailed, self).__init__(message)
        self.extra = extra


def mount_warning(container: Any, include: str) -> str | None:
    """A warning when the proxy does not mount this include, or mounts another file."""
    mounts = (container.attrs or {}).get('Mounts') or []
    for mount in mounts:
        if mount.get('Destination') == _rules.CONTAINER_ENDPOINTS:
            source = mount.get('Source') or ''
            if os.path.realpath(source) != os.path.realpath(include):
                return ('The proxy mounts %s as its model-endpoints include, not %s; the reload does not read '
                        'what was rendered here. Point deploy_dir at the proxy\'s folder, or recreate the proxy '
                        '(pi_dispatch.egress.egress_proxy).' % (source, include))
            return None
    return ('The proxy does not mount %s (a proxy made before model endpoints existed), so the endpoints stay '
            'unreachable until it is recreated with the third mount (pi_dispatch.egress.egress_proxy).'
            % _rules.CONTAINER_ENDPOINTS)


class EndpointsApply(object):
    """One run of model_endpoints on the validated deployment folder ``layout`` (``_policy/deployment.Layout``)."""

    def __init__(self, params: dict[str, Any], layout: Any, check_mode: bool = False, diff: bool = False) -> None:
        self.params = params
        self.layout = layout
        self.check_mode = check_mode
        self.diff = diff
        self.include = _endpoints.include_path(layout.deploy_dir)
        self.warnings: list[str] = []
        self.result: dict[str, Any] = dict(
            changed=False, endpoints=[], declaration=dict(path=None, exists=False), include=self.include,
            include_changed=False, inode=None, reloaded=False, reload_skipped='', actions=[])

    def render(self) -> tuple[bytes, str]:
        """Declare, render and compare: (the include now, the render); ``result`` says whether they differ."""
        p, result = self.params, self.result
        try:
            if p['endpoints'] is not None:
                endpoints, decl_path, exists = _endpoints.from_items(p['endpoints']), None, False
            else:
                endpoints, decl_path, exists = _endpoints.load(self.layout.deploy_dir, p['declaration'])
        except _endpoints.EndpointsError as exc:
            raise EndpointsFailed(str(exc), problems=[pr.as_dict() for pr in exc.problems])
        result['endpoints'] = _endpoints.summary(endpoints)
        result['declaration'] = dict(path=decl_path, exists=exists)
        try:
            new_text = _endpoints.render_include(endpoints)
        except _endpoints.EndpointsError as exc:
            raise EndpointsFailed(str(exc), problems=[pr.as_dict() for pr in exc.problems])
        try:
            st = _files.check_target(self.include)
            current = _files.read(self.include)
        except _files.InPlaceError as exc:
            raise EndpointsFailed(str(exc))
        except OSError as exc:
            raise EndpointsFailed('Cannot read %s: %s' % (self.include, exc))
        result['inode'] = st.st_ino
        changed = current != new_text.encode('utf-8')
        result['include_changed'] = changed
        result['changed'] = changed
        return current, new_text

    def find_proxy(self, connect: Callable[[], Any]) -> tuple[Any, Any]:
        """(client, the running proxy to reload or None), decided before anything is written; ``connect`` gives
        the client, asked only when a reload is wanted."""
        p, result = self.params, self.result
        if not result['include_changed']:
            return None, None
        if not p['reload']:
            result['reload_skipped'] = 'reload is false'
            return None, None
        client = connect()
        try:
            container = dc.get_container(client, p['proxy_name'])
        except dc.EngineError as exc:
            raise EndpointsFailed('%s %s' % (exc, NOTHING_WRITTEN), retryable=bool(getattr(exc, 'retryable', False)))
        if container is None:
            result['reload_skipped'] = 'proxy %s does not exist' % p['proxy_name']
        elif container.status != 'running':
            result['reload_skipped'] = 'proxy %s is not running (%s)' % (p['proxy_name'], container.status)
            container = None
        if result['reload_skipped']:
            self.warnings.append('Reload skipped: %s. The include is %s; the proxy reads it when it starts.'
                                 % (result['reload_skipped'], 'rendered' if not self.check_mode else
                                    'what would be rendered'))
        elif container is not None:
            warning = mount_warning(container, self.include)
            if warning:
                self.warnings.append(warning)
        return client, container

    def run(self, connect: Callable[[], Any]) -> dict[str, Any]:
        """The whole run; ``connect()`` returns a client (or fails the module) and is called only to reload."""
        p, result, include = self.params, self.result, self.include
        current, new_text = self.render()
        changed = result['include_changed']
        if p['state'] == 'validated':
            # report what a render would do; write, reload and contact nothing.
            result['changed'] = False
            result['reload_skipped'] = 'state is validated' if changed else ''
            return result
        client, container = self.find_proxy(connect)
        if self.diff:
            after_header = include
            if changed:
                after_header += (' (then squid -k reconfigure in %s)' % p['proxy_name'] if container is not None
                                 else ' (no reload: %s)' % result['reload_skipped'])
            result['diff'] = dict(before=current.decode('utf-8', 'replace'), after=new_text,
                                  before_header=include, after_header=after_header)
        if changed:
            result['actions'].append('write %s' % include)
        if changed and container is not None:
            result['actions'] += [' '.join(PARSE_CMD[:3]), ' '.join(RECONFIGURE_CMD[:3])]
            result['reloaded'] = True
        if changed and not self.check_mode:
            self.write_and_reload(client, container, current, new_text)
        return result

    def write_and_reload(self, client: Any, container: Any, current: bytes, new_text: str) -> None:
        """Write the include in place, then parse and reconfigure; the previous include back when squid refuses."""
        result, include = self.result, self.include
        try:
            written = _files.write_in_place(include, new_text)
        except _files.InPlaceError as exc:
            result['reloaded'] = False
            raise EndpointsFailed(str(exc))
        result['inode'] = written['inode']
        if container is None:
            return
        try:
            result['loaded'] = _reload.reload_family(client, container, self.layout.paths)
        except _reload.ParseRefused as exc:
            try:
                _files.write_in_place(include, current)
                put_back = 'The previous include was written back'
            except _files.InPlaceError as exc2:
                put_back = 'Writing the previous include back failed too (%s)' % exc2
            result['reloaded'] = False
            raise EndpointsFailed('%s %s.' % (exc, put_back))
        except (_reload.ProxyError, dc.EngineError) as exc:
            result['reloaded'] = False
            raise EndpointsFailed('%s The include is written; reload with docker exec %s squid -k reconfigure.'
                                  % (exc, self.params['proxy_name']))
