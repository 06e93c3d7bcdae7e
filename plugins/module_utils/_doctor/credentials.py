# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The doctor's credential check: the interceptor, each declared secret, and a credential canary.

Runs only when the deployment folder's ``egress-credentials.json`` declares a credential
(docs/credentials.md); a deployment that declares none gets no line from here.

* the declaration read as the proxy role reads it (refused: one ✗ naming the file, key and fix);
* the interceptor container (``credentials_interceptor``) running;
* each secret file usable, as the job-network API checks it before a job (never its content);
* a canary: a real job network ``pi-job-doctor-<pid>-c-net`` made by the job-network API with
  ``credentials_dir``, so the probe container gets what a job gets: placeholders in its environment,
  the deployment CA mounted, the proxy variables. Its curl sends, for each credential (at most
  :data:`MAX_PROBED`), the placeholder in the declared header to the bound host's probe path
  (``probe_paths``, default :data:`PROBE_PATH`), then one placeholder where it does not belong: in
  another bound host's header when there is one, else in its own host's URL. The lines:

  - ``credentials.swap``: the bound host answered 2xx/3xx to the request carrying only the placeholder,
    so the interceptor put the real secret in and the provider took it (a refused key is 401/403);
  - ``credentials.secret_unseen``: the canary's environment and every answer it got (headers and
    bodies) were searched, on the host, for every real secret; none was there;
  - ``credentials.elsewhere``: the misplaced placeholder was refused by the interceptor
    (``placeholder-elsewhere``) and reached nothing.

The secrets are read on the host only to search the canary's output; no line, fix or action holds one.
Everything the canary made is removed at the end of the run (the job network through the API's teardown,
which also forgets its placeholders).
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.containers import run_job_probe
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.context import Check, DoctorContext
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.lines import Line
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.names import probe_name
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import lifecycle as _lifecycle
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import teardown as _teardown
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import credentials as _credentials
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import jobpool as _jobpool

DEFAULT_INTERCEPTOR = 'pi-dispatch-egress-interceptor'
PROBE_PATH = '/v1/models'
MAX_PROBED = 8
REFUSAL = 'refused by the pi-dispatch credential interceptor: '
MARK = 'pi-doctor-credential'
# One result line per probe: "<MARK> <kind> <index> <curl exit> <http code> <CONNECT code> <refusal or ->".
_RESULT_RE = re.compile(r'^%s (swap|elsewhere) (\d+) (\d+) (\d{3}) (\d{3}) ([a-z-]+)$' % MARK)
# No $ (the path goes inside sh double quotes, where $NAME would be expanded), no quote, no space.
_PATH_RE = re.compile(r'^/[A-Za-z0-9._~/%?=&+:@!,;*-]{0,255}\Z')
REFUSAL_FIXES = {
    'secret-unavailable': 'the interceptor cannot read the secret file: compare its mount with the declaration '
                          '(docker inspect <interceptor>) and run site.yml',
    'unknown-placeholder': 'the interceptor does not see this job\'s placeholders: its credentials/jobs mount must '
                           'be the deployment folder\'s (run site.yml)',
}


def canary_job_id(pid: int) -> str:
    return 'doctor-%d-c' % int(pid)


def check_probe_paths(paths: Optional[Mapping[str, Any]]) -> Dict[str, str]:
    """The probe path of each credential named in ``paths``; ValueError names a path that is not one. Pure."""
    out = {}
    for name, path in sorted((paths or {}).items()):
        if not isinstance(path, str) or not _PATH_RE.match(path):
            raise ValueError('credentials_probe_paths[%s] %r is not a URL path; give one such as /v1/models '
                             '(it must start with /, hold no space, quote or $, and be at most 256 characters)'
                             % (name, path))
        out[str(name)] = path
    return out


def _value_expr(scheme: str, env: str) -> str:
    """The header value a job sends, for use inside sh double quotes: the placeholder in variable ``env``
    written in ``scheme`` (basic: the placeholder as the password)."""
    var = '${%s}' % env
    if scheme == 'bearer':
        return 'Bearer %s' % var
    if scheme == 'basic':
        return 'Basic $(printf \'%%s\' "pi-doctor:%s" | base64 -w0)' % var
    return var


def _curl(kind: str, index: int, url_expr: str, header: Optional[Tuple[str, str]], timeout: int) -> str:
    """One curl of the canary, its headers and body kept for the search, and its result line."""
    h = '-H "%s: %s" ' % header if header else ''
    tag = '%s-%d' % (kind, index)
    # A curl that prints no write-out (killed, or not there) still gives a result line: 000 000.
    return ('w=$(curl -s --max-time %d --cacert "$SSL_CERT_FILE" %s-D /tmp/%s.h -o /tmp/%s.b '
            '-w \'%%{http_code} %%{http_connect}\' %s 2>/dev/null </dev/null); rc=$?; '
            'case "$w" in [0-9][0-9][0-9]\\ [0-9][0-9][0-9]) ;; *) w="000 000" ;; esac; '
            'why=$(sed -n \'s/^%s\\([a-z-]*\\).*/\\1/p\' /tmp/%s.b 2>/dev/null | head -n 1); '
            'echo "%s %s %d $rc $w ${why:--}"; '
            'echo "--- %s answer"; head -c 65536 /tmp/%s.h /tmp/%s.b 2>/dev/null; echo'
            % (timeout, h, tag, tag, url_expr, REFUSAL, tag, MARK, kind, index, tag, tag, tag))


def elsewhere_target(creds: Sequence[_credentials.Credential]) -> Tuple[_credentials.Credential, str, str]:
    """(the credential whose placeholder is misplaced, the host it goes to, where: 'header' or 'url'). Pure.

    Another bound host, in that host's own declared header, when one exists (the placeholder is then a
    valid token on the wrong host); else the credential's own host, in the URL's query.
    """
    first = creds[0]
    other = next((c for c in creds if c.host != first.host), None)
    if other is not None:
        return first, other.host, 'header'
    return first, first.host, 'url'


def probe_script(creds: Sequence[_credentials.Credential], paths: Mapping[str, str], timeout: int) -> str:
    """The canary's sh script: its environment, then each swap probe and the elsewhere probe."""
    steps = ['echo "--- environment"', 'env | sort']
    for index, cred in enumerate(creds):
        url = '"https://%s%s"' % (cred.host, paths.get(cred.name, PROBE_PATH))
        steps.append(_curl('swap', index, url, (cred.header, _value_expr(cred.scheme, cred.env)), timeout))
    cred, host, where = elsewhere_target(creds)
    other = next((c for c in creds if c.host == host), cred)
    if where == 'header':
        url = '"https://%s%s"' % (host, paths.get(other.name, PROBE_PATH))
        # in the other host's own header and scheme: a well-formed credential, only the wrong one
        steps.append(_curl('elsewhere', 0, url, (other.header, _value_expr(other.scheme, cred.env)), timeout))
    else:
        path = paths.get(cred.name, PROBE_PATH)
        url = '"https://%s%s%spi_doctor=${%s}"' % (host, path, '&' if '?' in path else '?', cred.env)
        steps.append(_curl('elsewhere', 0, url, None, timeout))
    return '; '.join(steps)


def parse_results(text: str) -> Dict[Tuple[str, int], Tuple[int, int, int, Optional[str]]]:
    """(kind, index) -> (curl exit, http code, CONNECT code, the interceptor's refusal or None). Pure."""
    out = {}
    for line in text.splitlines():
        match = _RESULT_RE.match(line.strip())
        if match:
            kind, index, rc, code, connect, why = match.groups()
            out[(kind, int(index))] = (int(rc), int(code), int(connect), None if why == '-' else why)
    return out


def swap_line(cred: _credentials.Credential, path: str, result: Optional[Tuple[int, int, int, Optional[str]]],
              interceptor: str) -> Line:
    """The swap probe's line for ``cred``. Pure."""
    if result is None:
        return Line('credentials.notrun', 'notrun',
                    'Credential canary probe for %s did not run (the probe printed no result for it)' % cred.name)
    rc, code, connect, why = result
    where = 'https://%s%s' % (cred.host, path)
    if why:
        return Line('credentials.swap_refused', 'fail',
                    'Credential %s: the interceptor refused the canary job\'s placeholder on %s (%s), so no job '
                    'gets the secret through' % (cred.name, where, why),
                    fix=REFUSAL_FIXES.get(why, 'docker logs --tail 30 %s names the refusal' % interceptor)
                    .replace('<interceptor>', interceptor))
    if code in (401, 403, 407):
        return Line('credentials.swap_rejected', 'fail',
                    'Credential %s: %s answered HTTP %d to the request the interceptor completed with the secret '
                    'from %s, so the provider does not take that secret' % (cred.name, where, code, cred.secret_file),
                    fix='write the current key into %s (read on the next request, no restart); docker logs %s '
                        'shows whether it was swapped' % (cred.secret_file, interceptor))
    if rc != 0 or code == 0:
        return Line('credentials.swap_unreached', 'warn',
                    'Credential %s: the canary job did not reach %s through the proxy and the interceptor (curl exit '
                    '%d, CONNECT answered %s)' % (cred.name, where, rc, connect or 'nothing'),
                    fix='docker logs --tail 30 %s; the canary lines above say whether the proxy reaches %s'
                        % (interceptor, cred.host))
    if 200 <= code < 400:
        return Line('credentials.swap', 'ok',
                    'Credential %s swapped on %s: the canary job sent only its placeholder and %s answered HTTP %d '
                    '(a key the provider refuses gets 401)' % (cred.name, cred.host, where, code))
    return Line('credentials.swap_unproven', 'warn',
                'Credential %s: %s answered HTTP %d to the canary job\'s request, which proves the chain but not '
                'that the provider takes the secret' % (cred.name, where, code),
                fix='set doctor_credentials_probe_paths[%s] to a path of %s that answers 200 with a good key and 401 '
                    'without one (for example /v1/models, or /user on a forge API)' % (cred.name, cred.host))


def elsewhere_line(cred: _credentials.Credential, host: str, where: str,
                   result: Optional[Tuple[int, int, int, Optional[str]]], interceptor: str) -> Line:
    """The elsewhere probe's line. Pure."""
    said = ('in the header of %s' % host) if where == 'header' else ('in the URL of %s' % host)
    if result is None:
        return Line('credentials.notrun', 'notrun',
                    'Credential canary probe for %s did not run (the probe printed no result for it)' % cred.name)
    rc, code, connect, why = result
    if why == 'placeholder-elsewhere':
        return Line('credentials.elsewhere', 'ok',
                    'Credential %s\'s placeholder sent %s is refused by the interceptor (placeholder-elsewhere, '
                    'HTTP %d) and reaches nothing' % (cred.name, said, code))
    if rc != 0 or code == 0:
        return Line('credentials.elsewhere_unreached', 'warn',
                    'Credential %s: the placeholder sent %s got no answer (curl exit %d, CONNECT answered %s), so '
                    'its refusal is not proven' % (cred.name, said, rc, connect or 'nothing'),
                    fix='docker logs --tail 30 %s' % interceptor)
    return Line('credentials.elsewhere_passed', 'fail',
                'Credential %s: the placeholder sent %s was not refused as misplaced (HTTP %d, %s)'
                % (cred.name, said, code, 'refused as %s' % why if why else 'answered by the host'),
                fix='the interceptor must refuse a placeholder outside its declared header on its bound host: '
                    'docker logs --tail 30 %s; rebuild its image with site.yml' % interceptor)


def seen_lines(text: str, secrets: Mapping[str, str], hosts: Sequence[str],
               interceptor: str = DEFAULT_INTERCEPTOR) -> List[Line]:
    """A ✗ per credential whose real secret is in the canary's output, else one ✓. Pure; no secret is said."""
    seen = sorted(name for name, secret in secrets.items() if secret and secret in text)
    if seen:
        return [Line('credentials.secret_seen', 'fail',
                     'The canary job saw the real secret of %s (in its environment or an answer it got), so a job '
                     'can read it and send it anywhere its allowlist reaches' % name,
                     fix='docker logs --tail 30 %s: the answers of the bound hosts must be redacted; the job '
                         'network must be made with credentials_dir so the job gets placeholders; treat the '
                         'secret as exposed and rotate it' % interceptor)
                for name in seen]
    return [Line('credentials.secret_unseen', 'ok',
                 'The canary job never saw a real secret: its environment held placeholders only, and what %s '
                 'answered reached it without one (%d secrets searched for, on the host)'
                 % (', '.join(sorted(set(hosts))), len(secrets)))]


class CredentialsCheck(Check):
    """The interceptor, the declared secrets and the credential canary (no line when nothing is declared)."""

    def lines(self, ctx: DoctorContext) -> List[Line]:
        if not ctx.deploy_dir or not os.path.lexists(os.path.join(ctx.deploy_dir, _credentials.FILE_NAME)):
            return []
        try:
            creds = _credentials.load(ctx.deploy_dir)[0]
        except _credentials.CredentialsError as exc:
            return [Line('credentials.declaration_refused', 'fail',
                         'Credential declaration refused, so every job is refused before it starts: %s'
                         % ' '.join(str(exc).split()),
                         fix='correct %s as the message says, then run site.yml'
                             % os.path.join(ctx.deploy_dir, _credentials.FILE_NAME))]
        if not creds:
            return []
        name = ctx.credentials_interceptor or DEFAULT_INTERCEPTOR
        out = [self.interceptor_line(ctx, name, creds)]
        problems = [(cred, _credentials.check_secret(cred)) for cred in creds]
        for cred, problem in problems:
            if problem:
                out.append(Line('credentials.secret_unusable', 'fail',
                                'Credential %s cannot be used, so every job is refused before it starts: %s'
                                % (cred.name, problem),
                                fix='make %s a regular file owned by root, mode 0600, holding the secret on one line'
                                    % cred.secret_file))
        why = None
        if ctx.check_mode:
            why = 'check mode creates nothing'
        elif not ctx.proxy_running:
            why = 'the proxy is not running'
        elif out[0].status != 'ok':
            why = 'the interceptor is not running'
        elif any(problem for _cred, problem in problems):
            why = 'a secret cannot be used, so the job-network API refuses the job'
        if why:
            return out + [Line('credentials.setup', 'notrun',
                               'Credential canary could not be set up (%s), so no probe ran' % why)]
        return out + self.canary(ctx, creds, name)

    @staticmethod
    def interceptor_line(ctx: DoctorContext, name: str, creds: Sequence[_credentials.Credential]) -> Line:
        try:
            attrs = dc.read('Inspecting %s' % name, lambda: ctx.client.api.inspect_container(name), missing=True)
        except dc.EngineError as exc:
            return Line('credentials.interceptor_unread', 'warn',
                        'Credential interceptor %s could not be inspected (%s)' % (name, exc))
        if attrs is None:
            return Line('credentials.interceptor_missing', 'fail',
                        'Credential interceptor missing: there is no container %s, so every request to a bound host '
                        'is cut' % name, fix='run site.yml (the proxy role runs the interceptor)')
        state = attrs.get('State') or {}
        if not state.get('Running') or state.get('Paused'):
            return Line('credentials.interceptor_stopped', 'fail',
                        'Credential interceptor stopped (%s is %s), so every request to a bound host is cut'
                        % (name, state.get('Status', 'not running')), fix='docker start %s' % name)
        bound = ', '.join('%s on %s' % (c.name, c.host) for c in creds)
        return Line('credentials.interceptor', 'ok',
                    'Credential interceptor running (%s), %d credentials bound: %s' % (name, len(creds), bound))

    @staticmethod
    def canary(ctx: DoctorContext, declared: Sequence[_credentials.Credential], interceptor: str) -> List[Line]:
        """The credential canary: the first MAX_PROBED credentials probed, every declared secret searched for."""
        creds = list(declared[:MAX_PROBED])
        job_id = canary_job_id(ctx.pid)
        container = probe_name('credentials', ctx.pid)
        paths = dict(ctx.credentials_probe_paths or {})
        try:
            try:
                net = _lifecycle.create_job_network(
                    ctx.client, job_id, proxy_name=ctx.proxy, pool=ctx.job_pool or _jobpool.DEFAULT_POOL,
                    prefix=ctx.job_prefix or _jobpool.DEFAULT_PREFIX, credentials_dir=ctx.deploy_dir, shard_bound=0)
            except Exception as exc:  # JobNetError, EngineError: said, nothing run
                why = ' '.join(str(exc).split())
                return [Line('credentials.setup', 'notrun',
                             'Credential canary could not be set up (%s), so no probe ran' % why)]
            ctx.actions.append('created %s' % net.network)
            text, why = run_job_probe(
                ctx, 'credentials', container, probe_script(creds, paths, ctx.probe_timeout), net.network,
                dict(net.env, HOME='/tmp'), (ctx.probe_timeout + 2) * (len(creds) + 1) + ctx.start_grace,
                binds=['%s:%s:ro' % (src, dst) for src, dst in sorted(net.ca_mounts.items())])
            if text is None:
                return [Line('credentials.setup', 'notrun',
                             'Credential canary could not be set up (%s), so no probe ran' % why)]
            results = parse_results(text)
            out = [swap_line(cred, paths.get(cred.name, PROBE_PATH), results.get(('swap', index)), interceptor)
                   for index, cred in enumerate(creds)]
            cred, host, where = elsewhere_target(creds)
            out.append(elsewhere_line(cred, host, where, results.get(('elsewhere', 0)), interceptor))
            secrets = {}
            for each in declared:
                try:
                    secrets[each.name] = _credentials.read_secret(each.secret_file)
                except Exception:
                    continue  # said by credentials.secret_unusable above
            out.extend(seen_lines(text, secrets, [c.host for c in creds], interceptor))
            del secrets, text
            return out
        finally:
            try:
                _teardown.teardown_job_network(ctx.client, job_id, proxy_name=ctx.proxy,
                                               credentials_dir=ctx.deploy_dir)
            except Exception:
                pass  # job_network_gc (with gc_credentials_dir) sweeps pi-job-doctor-<pid>-c-net later
