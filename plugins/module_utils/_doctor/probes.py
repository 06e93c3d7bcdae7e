# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The doctor's probes: the bounded curl a probe container runs through the proxy, and its verdicts.

* the canary's five probes (:data:`PROBES`): the provider is reached, an
  unlisted host is denied, plain HTTP to a listed host on port 443 is refused,
  a tunnel to the provider carrying a TLS hello for the unlisted host is cut
  (the TLS name check), and plain bytes in a tunnel to the provider's 443 are cut
  (those two verdicts are in ``tls.py``);
* three probes per declared model endpoint (:data:`ENDPOINT_PROBES`): a
  CONNECT tunnel, the nearest undeclared port, a plain forward request.

All pure and unit-tested without a daemon: :func:`probe_script`,
:func:`parse_probe_output` and the ``classify_*`` functions. ``containers.py``
runs the containers and ``canary.py`` runs them all at once on the canary's
networks.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import endpoints as _endpoints
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.lines import Line

PROBES = ('provider', 'deny', 'plain', 'sni', 'tunnel_plain')
ENDPOINT_PROBES = ('tunnel', 'port', 'plain')
ENDPOINT_PROBE_LABELS = {'tunnel': 'tunnel', 'port': 'port-exact', 'plain': 'plain-request'}


# --- probe results: pure classification ------------------------------------------------------

PROBE_MARK = 'PIDOCTOR'  # never starting with @: curl -w would read a file
# curl's exit code when the proxy's own name did not resolve. Podman 4.3's aardvark-dns (1.4) drops its
# listeners for a moment each time a container joins a network (containers/aardvark-dns#389), and the
# doctor starts its probes together, so one of them can be refused an answer (measured in the Podman
# gate: "Could not resolve proxy"), or its query dropped until curl's own timeout ("Resolving timed out",
# exit 28; measured in the Podman gate after test_upgrade.py). Such a probe tries again, RESOLVE_RETRIES
# times, RESOLVE_RETRY_S apart; any other outcome, and the last try, is the probe's result.
CURL_PROXY_UNRESOLVED = 5
CURL_TIMEOUT = 28
RESOLVING_TIMED_OUT = 'Resolving timed out'
RESOLVE_RETRIES = 3
RESOLVE_RETRY_S = 1


def resolve_allowance(timeout: int = 1) -> int:
    """Seconds a probe container may take beyond its curl and start grace: the retries of an unresolved proxy
    (each one a curl that may wait ``timeout`` seconds for the name)."""
    return RESOLVE_RETRIES * (RESOLVE_RETRY_S + max(1, int(timeout)))


def probe_script(url: str, proxy_url: str, timeout: int, tunnel: bool = False, connect_to: Optional[str] = None) -> str:
    """The shell the probe container runs: one curl (tried again only while the proxy's name does not
    resolve), bounded, with a parseable trailer.

    ``-k``: no credential is sent, so the certificate is not what is proved;
    reaching the host through the tunnel is. ``connect_to`` (``host:port:other:port``): the tunnel
    goes to the other host while the TLS hello names the URL's (curl's ``--connect-to``).
    """
    curl = ['curl', '-sS', '-k', '--max-time', str(int(timeout)), '--connect-timeout', str(int(timeout)),
            '-o', '/dev/null', '-D', '/tmp/h', '-w', "'%s %%{http_code} %%{http_connect}\\n'" % PROBE_MARK,
            '--proxy', proxy_url]
    # An http:// URL through --proxy is a plain forward request (GET http://host:port/), unless -p
    # (--proxytunnel) asks for a CONNECT tunnel first, as a job's client does for a model server.
    if tunnel:
        curl.append('-p')
    if connect_to:
        curl += ['--connect-to', "'%s'" % connect_to]
    curl.append("'%s'" % url)
    # Tried again only while the proxy's name does not resolve: refused (5), or timed out while resolving
    # (28 with curl's "Resolving timed out"); any other timeout is an answer.
    retry = ('n=0; while :; do %s 2>/tmp/e; rc=$?; unresolved=0; [ $rc -eq %d ] && unresolved=1; '
             'if [ $rc -eq %d ]; then case "$(cat /tmp/e 2>/dev/null)" in *"%s"*) unresolved=1;; esac; fi; '
             'if [ $unresolved -eq 0 ] || [ $n -ge %d ]; then break; fi; n=$((n+1)); sleep %d; done; '
             % (' '.join(curl), CURL_PROXY_UNRESOLVED, CURL_TIMEOUT, RESOLVING_TIMED_OUT, RESOLVE_RETRIES,
                RESOLVE_RETRY_S))
    return ('%secho "%s-rc $rc"; echo "%s-headers"; cat /tmp/h 2>/dev/null; '
            'echo "%s-stderr"; cat /tmp/e 2>/dev/null' % (retry, PROBE_MARK, PROBE_MARK, PROBE_MARK))


def got_no_answer(result: Optional[Dict[str, Any]]) -> bool:
    """Whether a probe got no answer at all: curl failed before the proxy said anything (the proxy's name did
    not resolve, the connection or the tunnel timed out), so it proved nothing either way."""
    if not result:
        return False
    return result.get('rc') not in (0, None) and not result.get('connect') and not result.get('code')


def parse_probe_output(text: Optional[str]) -> Optional[Dict[str, Any]]:
    """dict(rc, code, connect, squid_error, headers, error) from the probe's output (None: no trailer)."""
    result = dict(rc=None, code=0, connect=0, squid_error=None, error='')
    section = None
    found = False
    for raw in (text or '').splitlines():
        line = raw.rstrip('\r')
        if line.startswith(PROBE_MARK + ' '):
            found = True
            words = line.split()
            if len(words) > 1 and words[1].isdigit():
                result['code'] = int(words[1])
            if len(words) > 2 and words[2].isdigit():
                result['connect'] = int(words[2])
            continue
        if line.startswith(PROBE_MARK + '-rc '):
            value = line.split()[-1]
            result['rc'] = int(value) if value.lstrip('-').isdigit() else None
            continue
        if line == PROBE_MARK + '-headers':
            section = 'headers'
            continue
        if line == PROBE_MARK + '-stderr':
            section = 'stderr'
            continue
        if section == 'headers' and line.lower().startswith('x-squid-error:'):
            result['squid_error'] = line.split(':', 1)[1].strip()
        elif section == 'stderr' and line.strip():
            result['error'] = (result['error'] + ' ' + line.strip()).strip()
    return result if found else None


def no_answer(result: Dict[str, Any]) -> str:
    """What a probe that got no answer says: curl's exit and its error."""
    return 'no answer (curl exit %s%s)' % (result.get('rc'), ': ' + result['error'] if result.get('error') else '')


def classify_provider(provider: str, result: Optional[Dict[str, Any]], why_not: Optional[str] = None) -> Line:
    if result is None:
        return notrun_line('provider', why_not or 'the probe printed no result')
    connect, code = result['connect'], result['code']
    if connect == 200 and code:
        return Line('canary.provider', 'ok',
                    'Egress policy reaches the provider (%s answered %d, so the whole path works and no key was '
                    'spent)' % (provider, code))
    if connect and connect != 200:
        what = 'the proxy answered the tunnel with %d%s' % (connect, ' (refused by the rules)' if connect == 403 else
                                                            ' (it let the tunnel through and nothing answered)'
                                                            if connect == 503 else '')
    elif connect == 200:
        what = 'the tunnel opened but the provider did not answer (%s)' % no_answer(result)
    else:
        return notrun_line('provider', 'the proxy gave no answer: %s' % no_answer(result))
    return Line('canary.provider_unreached', 'warn', 'Egress policy does not reach the provider (%s: %s)'
                % (provider, what),
                fix='list %s in egress-allowlist.conf, then reload the proxy (ansible-playbook '
                    'pi_dispatch.egress.site -e egress_proxy_state=reloaded)' % provider)


def classify_deny(deny: str, result: Optional[Dict[str, Any]], why_not: Optional[str] = None) -> Line:
    if result is None:
        return notrun_line('deny', why_not or 'the probe printed no result')
    connect, code = result['connect'], result['code']
    if connect == 403:
        return Line('canary.deny', 'ok',
                    'Egress policy denies an unlisted host (%s: the proxy refused the tunnel with 403; the deny '
                    'direction is the half an allowlist can silently lose)' % deny)
    if connect == 200 or code:
        what = 'the proxy opened the tunnel%s' % (' and the host answered %d' % code if code else '')
    elif connect:
        what = 'the proxy answered the tunnel with %d, so it tried to connect' % connect
    else:
        return notrun_line('deny', 'the proxy gave no answer: %s' % no_answer(result))
    return Line('canary.deny_leaks', 'fail', 'Egress policy lets an unlisted host through (%s: %s)' % (deny, what),
                fix='remove %s (or the rule that admits it) from the proxy rules or the allowlist, then restart '
                    'the proxy (ansible-playbook pi_dispatch.egress.site -e egress_proxy_state=restarted)' % deny)


def classify_plain(listed: str, result: Optional[Dict[str, Any]], why_not: Optional[str] = None) -> Line:
    if result is None:
        return notrun_line('plain', why_not or 'the probe printed no result')
    code, error = result['code'], result.get('squid_error') or ''
    if code == 403 and error.startswith('ERR_ACCESS_DENIED'):
        return Line('canary.plain', 'ok',
                    "Egress policy refuses plain HTTP to a listed host off port 80 (%s:443 without a tunnel got "
                    "squid's 403 %s; only a CONNECT reaches 443)" % (listed, error.split()[0]))
    if not code:
        return notrun_line('plain', 'the proxy gave no answer: %s' % no_answer(result))
    detail = ' X-Squid-Error: %s' % error if error else ' from upstream'
    what = 'GET http://%s:443/ without a tunnel got %d%s' % (listed, code, detail)
    return Line('canary.plain_leaks', 'fail', 'Egress policy lets plain HTTP through to %s on port 443 (%s)'
                % (listed, what),
                fix='refresh deploy/egress-proxy.conf to the packaged rules (they allow a plain request only to '
                    'port 80), then restart the proxy (ansible-playbook pi_dispatch.egress.site '
                    '-e egress_proxy_state=restarted)')


def notrun_line(probe: str, why: str) -> Line:
    return Line('canary.notrun', 'notrun', 'Egress canary probe %s did not run (%s)' % (probe, why))


# --- model endpoint probes: pure ------------------------------------------------------------

def next_undeclared_port(port: int, declared_ports: Iterable[int]) -> Optional[int]:
    """The nearest port above ``port`` that nobody declared for that host, never 80 or 443.

    Below ``port`` only when nothing above is free; None when no port is left.
    """
    taken = set(declared_ports) | set((80, 443))
    for candidate in range(port + 1, 65536):
        if candidate not in taken:
            return candidate
    for candidate in range(port - 1, 0, -1):
        if candidate not in taken:
            return candidate
    return None


def endpoint_targets(endpoint: _endpoints.Endpoint, endpoints: Iterable[_endpoints.Endpoint]
                     ) -> List[Tuple[str, Optional[str], bool]]:
    """(kind, url, tunnel) for the three probes of ``endpoint``; the port probe is None without a free port."""
    host = _endpoint_host(endpoint)
    same_host = [e.port for e in endpoints if e.host == endpoint.host]
    other = next_undeclared_port(endpoint.port, same_host)
    return [
        ('tunnel', 'http://%s/v1/models' % endpoint.address, True),
        ('port', ('http://%s:%d/' % (host, other)) if other else None, True),
        ('plain', 'http://%s/v1/models' % endpoint.address, False),
    ]


def _endpoint_host(endpoint: _endpoints.Endpoint) -> str:
    return '[%s]' % endpoint.host if endpoint.kind == 'ipv6' else endpoint.host


def _endpoint_fix() -> str:
    return ('ansible-playbook pi_dispatch.egress.endpoints (render and reload); if that changes nothing, compare '
            'deploy/egress-proxy.conf with the packaged rules')


def classify_endpoint_tunnel(endpoint: _endpoints.Endpoint, result: Optional[Dict[str, Any]], timeout: int,
                             why_not: Optional[str] = None) -> Line:
    if result is None:
        return endpoint_notrun_line(endpoint, 'tunnel', why_not or 'the probe printed no result')
    connect, code, rc = result['connect'], result['code'], result.get('rc')
    head = 'GET http://%s/v1/models through a CONNECT tunnel' % endpoint.address
    if connect == 200 and code:
        if 200 <= code < 300:
            return Line('endpoint.tunnel', 'ok', 'Model endpoint %s answers through the proxy (%s: %d)'
                        % (endpoint.id, head, code))
        if code in (401, 403):
            return Line('endpoint.tunnel', 'ok', 'Model endpoint %s answers through the proxy (%s: %d from the '
                        'server: the route works and the server wants a key)' % (endpoint.id, head, code))
        what = ('the server answered %d; Ollama, llama-server, vLLM and LM Studio all serve that path, so check '
                'that %s is the model server' % (code, endpoint.address))
        fix = 'curl the server on its own host: curl http://%s/v1/models' % endpoint.address
    elif connect == 200:
        if rc == 28:
            what = ('the tunnel opened and no answer came within %ds: the server took the connection and is '
                    'stuck or busy' % timeout)
        else:
            what = ('the tunnel opened and the server closed the plain request (%s); a TLS server does that, '
                    'and a model server behind https:// is not what the overlay\'s http:// baseUrl reaches'
                    % no_answer(result))
        fix = 'check the server at %s (its logs, its load)' % endpoint.address
    elif connect == 503:
        what = ('the proxy answered 503: it let the tunnel through and nothing answered, so the server is down or '
                'listens where the proxy cannot reach it')
        fix = ('start the server, listening on an address the proxy reaches (not 127.0.0.1 of its host), then '
               're-run doctor')
    elif connect == 403:
        what = "the proxy answered 403: its rules do not allow it"
        fix = _endpoint_fix()
    elif connect:
        what = 'the proxy answered %d' % connect
        fix = 'docker logs --tail 50 <proxy>'
    else:
        return endpoint_notrun_line(endpoint, 'tunnel', 'the proxy gave no answer: %s' % no_answer(result))
    return Line('endpoint.tunnel_fails', 'warn', 'Model endpoint %s does not answer through the proxy (%s: %s)'
                % (endpoint.id, head, what), fix=fix)


def as_mcp(line: Line) -> Line:
    """``line`` of an endpoint that only an MCP server uses: named "MCP server endpoint" (seed 000)."""
    line.message = line.message.replace('Model endpoint ', 'MCP server endpoint ', 1)
    return line


def classify_mcp_tunnel(endpoint: _endpoints.Endpoint, result: Optional[Dict[str, Any]], timeout: int,
                        why_not: Optional[str] = None) -> Line:
    """The tunnel line of an endpoint only an MCP server uses: any answer through the tunnel passes.

    Such a server does not serve ``/v1/models``; an https:// one closes the probe's plain request, as a
    TLS server does, and that passes too. A timeout, or the proxy's 403 or 503, still does not.
    """
    head = 'GET http://%s/v1/models through a CONNECT tunnel' % endpoint.address
    tail = 'an MCP server does not serve that path, so any answer proves the route'
    if result is not None and result['connect'] == 200 and result['code']:
        return Line('endpoint.mcp_tunnel', 'ok', 'MCP server endpoint %s answers through the proxy (%s: %d); %s'
                    % (endpoint.id, head, result['code'], tail))
    if result is not None and result['connect'] == 200 and result.get('rc') != 28:
        return Line('endpoint.mcp_tunnel', 'ok', 'MCP server endpoint %s answers through the proxy (%s: the server '
                    'closed the plain request, as a TLS server does); %s' % (endpoint.id, head, tail))
    line = classify_endpoint_tunnel(endpoint, result, timeout, why_not=why_not)
    if line.id == 'endpoint.tunnel_fails':
        line = Line('endpoint.mcp_tunnel_fails', 'warn', line.message, fix=line.fix)
    return as_mcp(line)


def classify_endpoint_port(endpoint: _endpoints.Endpoint, url: Optional[str], result: Optional[Dict[str, Any]],
                           why_not: Optional[str] = None) -> Line:
    if url is None:
        return endpoint_notrun_line(endpoint, 'port-exact', 'every other port of %s is declared' % endpoint.host)
    if result is None:
        return endpoint_notrun_line(endpoint, 'port-exact', why_not or 'the probe printed no result')
    target = url[len('http://'):].rstrip('/')
    connect, code = result['connect'], result['code']
    if connect == 403:
        return Line('endpoint.port_exact', 'ok',
                    "Model endpoint %s's rule is port-exact (a CONNECT to %s, a port nobody declared, got the "
                    "proxy's 403)" % (endpoint.id, target))
    if connect == 200:
        what = 'opened a tunnel%s' % (' and a server answered %d' % code if code else '')
    elif connect == 503:
        what = 'got 503: the proxy tried to connect'
    elif connect:
        what = 'got %d from the proxy' % connect
    else:
        return endpoint_notrun_line(endpoint, 'port-exact', 'the proxy gave no answer: %s' % no_answer(result))
    return Line('endpoint.port_leaks', 'warn',
                "Model endpoint %s's rule is not port-exact (a CONNECT to %s, a port nobody declared, %s): the "
                "rules allow more than you declared" % (endpoint.id, target, what), fix=_endpoint_fix())


def classify_endpoint_plain(endpoint: _endpoints.Endpoint, result: Optional[Dict[str, Any]],
                            why_not: Optional[str] = None) -> Line:
    if result is None:
        return endpoint_notrun_line(endpoint, 'plain-request', why_not or 'the probe printed no result')
    code, error = result['code'], result.get('squid_error') or ''
    head = 'GET http://%s/v1/models without a tunnel' % endpoint.address
    if code == 403 and error.startswith('ERR_ACCESS_DENIED'):
        return Line('endpoint.plain', 'ok', "Model endpoint %s admits no plain forward request (%s got the proxy's "
                    "403 %s)" % (endpoint.id, head, error.split()[0]))
    if not code:
        return endpoint_notrun_line(endpoint, 'plain-request', 'the proxy gave no answer: %s' % no_answer(result))
    what = 'got %d%s' % (code, ' X-Squid-Error: %s' % error if error else ' from the server')
    return Line('endpoint.plain_leaks', 'warn', 'Model endpoint %s admits a plain forward request (%s %s): the '
                'rules allow more than a tunnel' % (endpoint.id, head, what), fix=_endpoint_fix())


def endpoint_notrun_line(endpoint: _endpoints.Endpoint, probe: str, why: str) -> Line:
    return Line('endpoint.notrun', 'notrun', 'Model endpoint %s: the %s probe did not run (%s)'
                % (endpoint.id, probe, why))
