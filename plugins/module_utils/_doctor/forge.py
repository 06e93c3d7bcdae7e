# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The doctor's forge lines: a forge a job pushes to and fetches from must be https:// on 443.

The seed's reasons: a job gets the proxy variables in uppercase only, and git ignores
``HTTP_PROXY`` for an ``http://`` remote, so it never sends one through the proxy and, from behind
the job's ``--internal`` network, an ``http://`` forge fails on any port, 80 included; an
``https://`` remote is a CONNECT, which the proxy refuses to any port but 443. The forge's host
must also be listed. Which URLs: ``forge_urls`` (name -> URL, the role's ``doctor_forge_urls``),
else the seed's ``GITLAB_URL`` and ``FORGEJO_URL`` from the environment the doctor runs in.
:func:`forge_lines` is pure; :class:`ForgeCheck` reads the allowlist. Files only, no daemon.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Mapping, Optional
from urllib.parse import urlsplit

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import allowlist as _allowlist
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import hostnames as _hostnames
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy.decisions import Matcher
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.context import Check, DoctorContext
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.lines import Line, shape

# The seed's variables, read from the doctor's environment when forge_urls names none.
ENV_NAMES = ('GITLAB_URL', 'FORGEJO_URL')
HTTPS_FIX = 'serve the forge over https:// on port 443 and set %s to that URL, or run with egress_enabled: false'


def configured(forge_urls: Optional[Mapping[str, str]], environ: Mapping[str, str]) -> Dict[str, str]:
    """name -> URL: ``forge_urls`` when it names any, else GITLAB_URL and FORGEJO_URL where set."""
    if forge_urls:
        return dict((str(name), str(url)) for name, url in forge_urls.items() if str(url).strip())
    return dict((name, environ[name]) for name in ENV_NAMES if (environ.get(name) or '').strip())


def shown(url: str) -> str:
    """The URL as a line may show it: without a user or a password (a token in a URL is a secret)."""
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return '<an unparsable URL>'
    netloc = parts.netloc.rpartition('@')[2]
    return '%s://%s%s' % (parts.scheme, netloc, parts.path) if parts.scheme else netloc + parts.path


def forge_lines(urls: Mapping[str, str], listed: Optional[Callable[[str], bool]] = None,
                allowlist_problem: Optional[str] = None) -> List[Line]:
    """One line per configured forge. ``listed(host)``: whether the allowlist admits the host (None: unread)."""
    lines = []
    for name in sorted(urls):
        url = shown(urls[name])
        parsed = _hostnames.url_address(urls[name])
        if parsed is None:
            lines.append(Line('forge.unparsed', 'warn', shape('forge.unparsed', name=name, url=url),
                              fix='set %s to the forge\'s https:// URL (https://forge.example.com)' % name))
            continue
        scheme, host, port = parsed
        if scheme == 'http':
            lines.append(Line('forge.http', 'warn', shape('forge.http', name=name, url=url), fix=HTTPS_FIX % name))
        elif port != 443:
            lines.append(Line('forge.port', 'warn', shape('forge.port', name=name, url=url, port=str(port)),
                              fix=HTTPS_FIX % name))
        elif listed is not None and not listed(host):
            lines.append(Line('forge.unlisted', 'warn', shape('forge.unlisted', name=name, url=url, host=host),
                              fix='add %s to egress-allowlist.conf and run ansible-playbook '
                                  'pi_dispatch.egress.site' % host))
        else:
            said = 'listed' if listed is not None else 'not compared with the allowlist (%s)' % allowlist_problem
            lines.append(Line('forge.ok', 'ok', shape('forge.ok', name=name, url=url, listed=said)))
    return lines


class ForgeCheck(Check):
    """The forge lines (files only): every configured forge URL, and its host against the allowlist."""

    def lines(self, ctx: DoctorContext) -> List[Line]:
        urls = configured(ctx.forge_urls, ctx.environ or {})
        if not urls:
            return []
        path = _deployment.paths(ctx.deploy_dir)['allowlist']
        listed, problem = None, None
        try:
            with open(path, 'r') as handle:
                parsed = _allowlist.parse(handle.read(), path)
            if parsed.errors:
                problem = 'the allowlist is refused'
            else:
                listed = Matcher(entry for _lineno, entry in parsed.entries).covers
        except (IOError, OSError, UnicodeDecodeError) as exc:
            problem = '%s could not be read: %s' % (path, getattr(exc, 'strerror', None) or exc)
        return forge_lines(urls, listed, problem)
