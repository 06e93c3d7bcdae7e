# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""Job networks: the preflight, the verdict before a job spends anything.

:func:`verdict_for_state` is the pure decision from the proxy's docker
state; :func:`preflight` makes the one container inspect it needs (or none
when the egress policy is off); :func:`lazy_client` builds a client only
when the preflight needs one. Re-exported by ``jobnet.py``
(docs/job-network-api.md).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common.docker_client import get_container
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy.spec import PROXY_NAME

ADMIT = 'admit'
PROXY_STOPPED = 'egress-proxy-stopped'
PROXY_MISSING = 'egress-proxy-missing'
ENGINE_UNAVAILABLE = 'engine-unavailable'
VERDICTS = (ADMIT, PROXY_STOPPED, PROXY_MISSING, ENGINE_UNAVAILABLE)
# Only ever given when the caller asks with mode='transparent' (API 3.1): the job's gateway is not
# running. A caller that never passes the mode never sees them, so VERDICTS stays as it was.
GATEWAY_STOPPED = 'egress-gateway-stopped'
GATEWAY_MISSING = 'egress-gateway-missing'
TRANSPARENT_VERDICTS = VERDICTS + (GATEWAY_STOPPED, GATEWAY_MISSING)
# Only ever given when the caller passes credentials_dir (API 3.2, docs/credentials.md): a declared
# credential's secret is unusable (the message names it), or the credential interceptor is not running.
CREDENTIAL_UNAVAILABLE = 'egress-credential-unavailable'
INTERCEPTOR_MISSING = 'egress-interceptor-missing'
INTERCEPTOR_STOPPED = 'egress-interceptor-stopped'
CREDENTIAL_VERDICTS = VERDICTS + (CREDENTIAL_UNAVAILABLE, INTERCEPTOR_MISSING, INTERCEPTOR_STOPPED)
# Only ever given when the caller passes mcp_json (API 3.3, docs/job-networks.md): an enabled MCP server of
# the job is neither https:// on 443 to a listed host nor a declared model endpoint (the message names each),
# or the file cannot be read as pi reads it. Decided from files before the engine is asked.
MCP_SERVER_REFUSED = 'egress-mcp-server-refused'
MCP_VERDICTS = VERDICTS + (MCP_SERVER_REFUSED,)
INTERCEPTOR_NAME = 'pi-dispatch-egress-interceptor'


class Verdict(object):
    """The preflight's answer: ``verdict`` (one of VERDICTS), ``retryable``, the proxy's ``state``, ``message``."""

    def __init__(self, verdict: str, retryable: bool = False, state: Optional[str] = None, message: str = '') -> None:
        self.verdict = verdict
        self.retryable = retryable
        self.state = state
        self.message = message

    @property
    def admitted(self) -> bool:
        return self.verdict == ADMIT

    def as_dict(self) -> Dict[str, Any]:
        return dict(verdict=self.verdict, retryable=self.retryable, state=self.state, message=self.message)

    def __repr__(self) -> str:
        return 'Verdict(%r)' % (self.as_dict(),)


def verdict_for_state(state: Optional[str], proxy_name: str = PROXY_NAME) -> Verdict:
    """The preflight's decision from the proxy's docker state (None = no such container). Pure."""
    if state is None:
        return Verdict(PROXY_MISSING, False, None,
                       'The egress proxy %s does not exist, so this job would reach nothing. Start it '
                       '(ansible-playbook pi_dispatch.egress.site, or pi-dispatch up), or switch the '
                       'egress policy off.' % proxy_name)
    if state == 'running':
        return Verdict(ADMIT, False, state, 'The egress proxy %s is running.' % proxy_name)
    fix = ('docker unpause %s' % proxy_name if state == 'paused'
           else 'docker start %s' % proxy_name)
    return Verdict(PROXY_STOPPED, False, state,
                   'The egress proxy %s is %s, so this job would reach nothing. Start it (%s, or '
                   'ansible-playbook pi_dispatch.egress.site).' % (proxy_name, state, fix))


def gateway_verdict(state: Optional[str], gateway_name: str) -> Verdict:
    """The preflight's decision for a transparent job from its gateway's docker state (None = missing). Pure."""
    if state == 'running':
        return Verdict(ADMIT, False, state, 'The egress gateway %s is running.' % gateway_name)
    if state is None:
        return Verdict(GATEWAY_MISSING, False, None,
                       'The egress gateway %s does not exist, so a transparent job would resolve and reach '
                       'nothing. Start it (the proxy role with egress_gateway_enabled: true), or run the job '
                       'in explicit mode.' % gateway_name)
    return Verdict(GATEWAY_STOPPED, False, state,
                   'The egress gateway %s is %s, so a transparent job would resolve and reach nothing. Start it '
                   '(docker start %s, or the proxy role with egress_gateway_enabled: true).'
                   % (gateway_name, state, gateway_name))


def _state(container: Any) -> Optional[str]:
    if container is None:
        return None
    state = ((container.attrs or {}).get('State') or {}).get('Status') or getattr(container, 'status', None)
    return (state or 'unknown').lower()


def preflight(client: Any, proxy_name: str = PROXY_NAME, enabled: bool = True,
              docker_host: Optional[str] = None, mode: str = 'explicit',
              gateway_name: str = 'pi-dispatch-egress-gateway', credentials_dir: Optional[str] = None,
              interceptor_name: str = INTERCEPTOR_NAME, mcp_json: Optional[str] = None,
              deploy_dir: Optional[str] = None) -> Verdict:
    """The verdict before a job spends anything; one container inspect (two for a transparent job).

    ``client`` is a DockerClient, or a zero-argument callable returning one
    (called only when the policy is on). With ``enabled`` false the verdict is
    admit and the daemon is not touched. A daemon that does not answer gives
    ``engine-unavailable`` with retryable=True: nothing was decided.

    Returns a Verdict (``verdict`` one of VERDICTS, ``admitted``,
    ``retryable``, ``state``, ``message``). Does not raise for a daemon
    failure or a client that cannot be built: those are the
    ``engine-unavailable`` verdict. ``docker_host`` only names the daemon in that message.
    ``mode='transparent'``: the job's gateway ``gateway_name`` must run too
    (``egress-gateway-missing`` / ``egress-gateway-stopped`` otherwise).
    ``credentials_dir`` (the deployment folder; docs/credentials.md): when it declares credentials,
    each secret file must be usable (``egress-credential-unavailable``, naming the credential, never a
    byte of the secret) and the interceptor ``interceptor_name`` must run
    (``egress-interceptor-missing`` / ``-stopped``).
    ``mcp_json`` (the job's ``mcp.json``): every enabled MCP server with a url must be https:// on 443 to a
    host the allowlist of ``deploy_dir`` (default ``/opt/pi-dispatch/egress``) lists, or exactly a declared
    model endpoint; otherwise ``egress-mcp-server-refused`` names each one, decided from the files before
    the daemon is asked. A package runner whose registry is not listed is said in the admitted message.
    """
    if not enabled:
        return Verdict(ADMIT, False, None, 'The egress policy is off; the daemon was not asked.')
    mcp_note = ''
    if mcp_json:
        refused, mcp_note = mcp_verdict(mcp_json, deploy_dir)
        if refused is not None:
            return refused
    try:
        if callable(client) and not hasattr(client, 'containers'):
            client = client()
        container = get_container(client, proxy_name)
    except Exception as exc:  # an EngineError, or a client that cannot even be built
        return Verdict(ENGINE_UNAVAILABLE, True, None,
                       'The Docker Engine at %s does not answer about %s (%s). Nothing was decided; retry the '
                       'job later.' % (dc.describe_host(docker_host), proxy_name, exc))
    verdict = verdict_for_state(_state(container), proxy_name)
    if verdict.admitted and credentials_dir:
        verdict = _credentials_verdict(client, credentials_dir, interceptor_name, docker_host)
    if verdict.admitted and mcp_note:
        verdict.message = '%s %s' % (verdict.message, mcp_note)
    if not verdict.admitted or mode != 'transparent':
        return verdict
    try:
        gateway = get_container(client, gateway_name)
    except Exception as exc:
        return Verdict(ENGINE_UNAVAILABLE, True, None,
                       'The Docker Engine at %s does not answer about %s (%s). Nothing was decided; retry the '
                       'job later.' % (dc.describe_host(docker_host), gateway_name, exc))
    return gateway_verdict(_state(gateway), gateway_name)


def mcp_findings(mcp_json: str, deploy_dir: Optional[str] = None, endpoints: Optional[list] = None) -> list:
    """Each enabled MCP server of ``mcp_json`` judged against the allowlist and model endpoints of ``deploy_dir``.

    ``endpoints``: the declared ones when the caller has read them already. Raises ``McpError`` (the file),
    ``EndpointsError`` (the declaration) or ``OSError`` / ``UnicodeDecodeError`` (the allowlist). Files only.
    """
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import endpoints as _endpoints
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import mcp as _mcp
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy.credentials_apply import listed_by
    folder = deploy_dir or _deployment.DEFAULT_DEPLOY_DIR
    allowlist = _deployment.paths(folder)['allowlist']
    servers = _mcp.load(mcp_json)
    with open(allowlist) as handle:
        listed = listed_by(handle.read(), allowlist)
    if endpoints is None:
        endpoints = _endpoints.load(folder)[0]
    return _mcp.judge(servers, listed, endpoints)


def mcp_verdict(mcp_json: str, deploy_dir: Optional[str] = None) -> Tuple[Optional[Verdict], str]:
    """(the refusal or None, a note for the admitted message) of a job's ``mcp.json``; files only, no daemon."""
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import endpoints as _endpoints
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import mcp as _mcp
    try:
        findings = mcp_findings(mcp_json, deploy_dir)
    except (_mcp.McpError, _endpoints.EndpointsError) as exc:
        return Verdict(MCP_SERVER_REFUSED, False, None, '%s. The job was not started.' % exc), ''
    except (IOError, OSError, UnicodeDecodeError) as exc:
        allowlist = _deployment.paths(deploy_dir or _deployment.DEFAULT_DEPLOY_DIR)['allowlist']
        return Verdict(MCP_SERVER_REFUSED, False, None, 'The allowlist %s could not be read (%s), so the job\'s MCP '
                       'servers could not be judged. The job was not started.'
                       % (allowlist, getattr(exc, 'strerror', None) or exc)), ''
    refused = [finding for finding in findings if finding.refused]
    if refused:
        return Verdict(MCP_SERVER_REFUSED, False, None, '%s names %d MCP server%s the proxy would refuse: %s. The job '
                       'was not started.' % (mcp_json, len(refused), '' if len(refused) == 1 else 's',
                                             ' | '.join(str(finding) for finding in refused))), ''
    notes = [str(finding) for finding in findings if finding.kind == _mcp.RUNNER]
    carried = len([finding for finding in findings if finding.kind in (_mcp.REACHABLE, _mcp.ENDPOINT)])
    note = '%d MCP server%s carried by the proxy.' % (carried, '' if carried == 1 else 's')
    if notes:
        note += ' Note: %s.' % ' | '.join(notes)
    return None, note


def _credentials_verdict(client: Any, credentials_dir: str, interceptor_name: str,
                         docker_host: Optional[str]) -> Verdict:
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import credentials as _jobcreds
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets.names import JobNetError
    try:
        creds = _jobcreds.declared(credentials_dir)
    except JobNetError as exc:
        return Verdict(CREDENTIAL_UNAVAILABLE, False, None, str(exc))
    if not creds:
        return Verdict(ADMIT, False, 'running', 'No credential is declared; the job gets no placeholder.')
    try:
        state = _state(get_container(client, interceptor_name))
    except Exception as exc:
        return Verdict(ENGINE_UNAVAILABLE, True, None,
                       'The Docker Engine at %s does not answer about %s (%s). Nothing was decided; retry the '
                       'job later.' % (dc.describe_host(docker_host), interceptor_name, exc))
    if state == 'running':
        return Verdict(ADMIT, False, state, 'The egress proxy and the credential interceptor %s are running; %d '
                       'credential(s) declared, each secret usable.' % (interceptor_name, len(creds)))
    if state is None:
        return Verdict(INTERCEPTOR_MISSING, False, None,
                       'The credential interceptor %s does not exist, so the job\'s placeholders would reach '
                       'nothing. Run playbooks/site.yml (the proxy role runs it when a credential is declared).'
                       % interceptor_name)
    return Verdict(INTERCEPTOR_STOPPED, False, state,
                   'The credential interceptor %s is %s, so the job\'s placeholders would reach nothing. Start it '
                   '(docker start %s, or playbooks/site.yml).' % (interceptor_name, state, interceptor_name))


def lazy_client(docker_host: Optional[str] = None, timeout: int = 60, **options: Any) -> Callable[[], Any]:
    """A zero-argument callable building a DockerClient without a ping.

    For :func:`preflight`: the only call that must reach the daemon is the
    one inspect. (The SDK still asks the daemon's API version once while it
    builds the client; a runner that keeps one client pays that once.)
    ``options`` are the TLS options of :func:`_docker_client.connect`.
    """
    def build() -> Any:
        return dc.build_client(docker_host, timeout, **options)
    return build
