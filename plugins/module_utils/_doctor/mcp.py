# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The doctor's MCP lines: the overlay's ``mcp.json`` judged as the preflight judges a job's, and which
declared endpoints only an MCP server uses.

:func:`mcp_lines` turns the findings of ``_policy/mcp.judge`` into overlay lines (✗ for a server a job
naming it would be refused for, ⚠ for a package runner whose registry is not listed). An endpoint
that only an enabled MCP server with a URL uses, and no overlay model's ``baseUrl``, is an "MCP server
endpoint": its tunnel line passes once anything answers through the tunnel (``probes.classify_mcp_tunnel``),
because such a server does not serve ``/v1/models``. :func:`mcp_only_endpoints` reads the files once per
run and is asked by the canary before this check prints. Files only, no daemon.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Set, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import mcp as _mcp
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets.preflight import mcp_findings
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import models_json as _models_json
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.context import Check, DoctorContext
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.lines import Line, shape

FIX_REFUSED = ('serve it as https:// on 443 from a host in egress-allowlist.conf, or declare its exact host and port '
               'in model-endpoints.json, then run ansible-playbook pi_dispatch.egress.site')


def mcp_lines(path: str, findings: Optional[Sequence[_mcp.Finding]], problem: Optional[str] = None) -> List[Line]:
    """The overlay lines of ``mcp.json`` at ``path``: its findings, or ``problem`` when it could not be judged."""
    if findings is None:
        return [Line('overlay.mcp_unread', 'fail', shape('overlay.mcp_unread', path=path, why=problem or 'unknown'),
                     fix='fix the file (it is read as pi reads it: comments and trailing commas are fine), or the '
                         'deployment folder it is judged against')]
    lines = []
    for finding in findings:
        server = finding.server
        if finding.refused:
            lines.append(Line('overlay.mcp_refused', 'fail', shape(
                'overlay.mcp_refused', path=path, name=server.name, url=server.shown_url, why=finding.reason),
                fix=finding.fix or FIX_REFUSED))
        elif finding.kind == _mcp.RUNNER:
            lines.append(Line('overlay.mcp_runner', 'warn', 'Overlay mcp.json %s: MCP server %s %s'
                              % (path, server.name, finding.reason), fix=finding.fix))
    if not lines:
        carried = ['%s (%s)' % (f.server.name, f.reason) for f in findings if f.kind in (_mcp.REACHABLE, _mcp.ENDPOINT)]
        servers = '; '.join(carried) or 'none with a url'
        lines.append(Line('overlay.mcp_ok', 'ok', shape('overlay.mcp_ok', path=path, servers=servers)))
    return lines


def model_addresses(models_text: Optional[str]) -> Set[Tuple[str, int]]:
    """(host, port) of every baseUrl in the overlay models.json text (empty when there is none or it is refused)."""
    if not models_text:
        return set()
    try:
        data = _models_json.loads(models_text)
    except _models_json.ModelsJsonError:
        return set()
    found = set()
    providers = data.get('providers') if isinstance(data, dict) else None
    for provider in (providers.values() if isinstance(providers, dict) else []):
        if not isinstance(provider, dict):
            continue
        urls = [provider.get('baseUrl')] + [model.get('baseUrl') for model in provider.get('models') or []
                                            if isinstance(model, dict)]
        for url in urls:
            parsed = _models_json.url_host_port(url) if isinstance(url, str) else None
            if parsed:
                found.add((parsed[0], parsed[1]))
    return found


def mcp_only(findings: Sequence[_mcp.Finding], endpoints: Sequence[Any], models: Set[Tuple[str, int]]) -> Set[str]:
    """Ids of the endpoints an MCP server uses and no overlay model does (a model's use decides the judgement)."""
    used = set(f.endpoint_id for f in findings if f.kind == _mcp.ENDPOINT and f.endpoint_id)
    by_model = set(ep.id for ep in endpoints if (str(ep.host).lower(), int(ep.port)) in models)
    return used - by_model


def judged(ctx: DoctorContext) -> Tuple[Optional[List[_mcp.Finding]], Optional[str]]:
    """(findings, None) of the overlay's mcp.json against the deployment folder, or (None, why); read once."""
    if ctx.mcp_judged is not None:
        return ctx.mcp_judged
    try:
        result: Tuple[Optional[List[_mcp.Finding]], Optional[str]] = (
            mcp_findings(ctx.mcp_json, ctx.deploy_dir, ctx.declared_endpoints() or []), None)
    except _mcp.McpError as exc:
        result = (None, str(exc))
    except (IOError, OSError, UnicodeDecodeError) as exc:
        allowlist = _deployment.paths(ctx.deploy_dir)['allowlist']
        result = (None, 'the allowlist %s could not be read (%s)' % (allowlist, getattr(exc, 'strerror', None) or exc))
    ctx.mcp_judged = result
    return result


def mcp_only_endpoints(ctx: DoctorContext) -> Set[str]:
    """Ids of the declared endpoints only an enabled MCP server of the overlay's mcp.json uses (none without one)."""
    if not ctx.mcp_json:
        return set()
    findings, _problem = judged(ctx)
    if not findings:
        return set()
    text = None
    if ctx.models_json:
        text, _read_problem = _models_json.read_text(ctx.models_json)
    return mcp_only(findings, ctx.declared_endpoints() or [], model_addresses(text))


class McpCheck(Check):
    """The overlay's mcp.json lines (only when ``mcp_json`` is given)."""

    def lines(self, ctx: DoctorContext) -> List[Line]:
        if not ctx.mcp_json:
            return []
        findings, problem = judged(ctx)
        return mcp_lines(ctx.mcp_json, findings, problem)
