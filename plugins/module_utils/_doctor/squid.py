# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The doctor's squid lines: the package inside the proxy against the mirror's candidate.

The installed version is read with dpkg-query inside the proxy (an exec, no
shell); the mirror's candidate with ``apt-get update`` and ``apt-cache policy``
in a throwaway container of the proxy's image on its upstream network, bounded
and removed. Versions are compared with dpkg's rules (``_debversion``). The
parsers and :func:`squid_lines` are pure; :class:`SquidCheck` makes the calls.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import debversion as _debversion
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import names as _jobnet_names
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.context import Check, DoctorContext
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.lines import Line
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.names import (
    LABEL, parse_doctor_network, probe_name)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.probes import PROBE_MARK


# --- squid inside the proxy against the mirror: pure ------------------------------------------------

SQUID_CANDIDATE_TIMEOUT = 60  # seconds apt-get update may take in the throwaway container
# The package whose version is squid's: squid-common comes with both builds of squid (squid, and
# squid-openssl, which the proxy image installs since rules version 3), at the same version.
SQUID_VERSION_PACKAGE = 'squid-common'
SQUID_IMAGE_REFRESH_FIX = ('ansible-playbook pi_dispatch.egress.site -e egress_proxy_image_refresh=true (rebuilds the '
                           'proxy image with the mirror\'s current packages; the proxy then moves onto it)')


def candidate_script(timeout: int = SQUID_CANDIDATE_TIMEOUT) -> str:
    """Shell for the throwaway container: a bounded apt-get update, then apt-cache policy of squid's version."""
    update = ('timeout %d apt-get update -o Acquire::Retries=0 -o Acquire::http::Timeout=10 '
              '-o Acquire::https::Timeout=10 -o Acquire::ftp::Timeout=10 -o APT::Sandbox::User=root' % int(timeout))
    return ('%s >/tmp/u 2>&1; echo "%s-apt-rc $?"; cat /tmp/u; echo "%s-policy"; apt-cache policy %s 2>&1'
            % (update, PROBE_MARK, PROBE_MARK, SQUID_VERSION_PACKAGE))


def parse_apt_policy(text: Optional[str]) -> Optional[Dict[str, Any]]:
    """dict(installed, candidate, candidate_from_mirror) from ``apt-cache policy squid``; None when absent.

    ``candidate_from_mirror`` is true only when the version table lists the
    candidate with a source other than dpkg's status file: after an update
    that fetched nothing, apt's "candidate" is just the installed version.
    """
    installed = candidate = None
    found = False
    table, current = {}, None
    for raw in (text or '').splitlines():
        line = raw.strip()
        if line.startswith('Installed:'):
            found = True
            installed = line.split(':', 1)[1].strip()
        elif line.startswith('Candidate:'):
            candidate = line.split(':', 1)[1].strip()
        elif raw.startswith('     ') or raw.startswith(' *** '):
            words = line.replace('***', '').split()
            if len(words) == 2 and words[1].isdigit() and not raw.startswith('        '):
                current = words[0]
                table.setdefault(current, [])
            elif current is not None and len(words) >= 2 and words[0].isdigit():
                table[current].append(words[1])
    if not found:
        return None
    none = ('(none)', '')
    installed = None if installed in none else installed
    candidate = None if candidate in none else candidate
    sources = table.get(candidate, []) if candidate else []
    return dict(installed=installed, candidate=candidate,
                candidate_from_mirror=any(src != '/var/lib/dpkg/status' for src in sources))


def parse_candidate_output(text: Optional[str]) -> Tuple[Optional[str], Optional[str]]:
    """(candidate version, None) or (None, why) from :func:`candidate_script`'s output. Never a guess."""
    text = text or ''
    rc_mark, policy_mark = PROBE_MARK + '-apt-rc ', PROBE_MARK + '-policy'
    if rc_mark not in text or policy_mark not in text:
        tail = ' '.join(text.split())[-200:]
        return None, 'the throwaway container printed no result%s' % ((' (%s)' % tail) if tail else '')
    head, _sep, policy = text.partition(policy_mark)
    rc_text, _sep, update = head.partition(rc_mark)[2].partition('\n')
    rc = int(rc_text.strip()) if rc_text.strip().lstrip('-').isdigit() else None
    problems = [line.strip() for line in update.splitlines()
                if line.startswith(('Err:', 'E: ', 'W: Failed to fetch')) or line.startswith('  ') and 'fail' in line]
    detail = ('; '.join(problems))[:300]
    if rc == 124:
        return None, 'apt-get update did not finish within %ds%s' % (SQUID_CANDIDATE_TIMEOUT,
                                                                     (': ' + detail) if detail else '')
    if rc != 0:
        return None, 'apt-get update exited %s%s' % (rc, (': ' + detail) if detail else '')
    if problems:
        return None, 'apt-get update could not fetch every source: %s' % detail
    parsed = parse_apt_policy(policy)
    if parsed is None or parsed['candidate'] is None:
        return None, ('the mirror offers no squid package (apt-cache policy %s names no candidate)'
                      % SQUID_VERSION_PACKAGE)
    if not parsed['candidate_from_mirror']:
        return None, ('apt-get update fetched no package list, so apt only knows the installed version (%s)'
                      % parsed['candidate'])
    return parsed['candidate'], None


def squid_lines(proxy: str, installed: Optional[str], installed_why: Optional[str], candidate: Optional[str],
                candidate_why: Optional[str]) -> List[Line]:
    """The squid lines: the package inside the proxy, then how it compares with the mirror's candidate."""
    lines = []
    if installed is not None:
        try:
            _debversion.parse(installed)
        except ValueError as exc:
            installed_why, installed = 'dpkg-query printed %s' % exc, None
    if installed is None:
        lines.append(Line('proxy.squid_unread', 'warn',
                          'Egress proxy squid: the package version inside %s could not be read (%s)'
                          % (proxy, installed_why or 'no answer'),
                          fix="docker exec %s dpkg-query -W %s" % (proxy, SQUID_VERSION_PACKAGE)))
        lines.append(Line('proxy.squid_mirror_unread', 'notrun',
                          "Egress proxy squid: could not read the mirror's version (the installed version is "
                          "unknown), so whether the package is current was not checked"))
        return lines
    lines.append(Line('proxy.squid', 'ok', 'Egress proxy squid: package %s inside %s' % (installed, proxy)))
    order = None
    if candidate is not None:
        try:
            order = _debversion.compare(installed, candidate)
        except ValueError as exc:
            candidate_why = 'apt-cache policy printed %s' % exc
    if order is None:
        lines.append(Line('proxy.squid_mirror_unread', 'notrun',
                          "Egress proxy squid: could not read the mirror's version (%s), so whether %s is current "
                          "was not checked" % (candidate_why or 'no answer', installed)))
    elif order < 0:
        lines.append(Line('proxy.squid_outdated', 'warn',
                          "Egress proxy squid is out of date: %s is older than the mirror's candidate %s, so the "
                          "proxy lacks the mirror's fixes" % (installed, candidate),
                          fix=SQUID_IMAGE_REFRESH_FIX))
    else:
        lines.append(Line('proxy.squid_current', 'ok',
                          "Egress proxy squid is current: %s is not older than the mirror's candidate %s"
                          % (installed, candidate)))
    return lines


def squid_unfinished_line(proxy: str) -> Line:
    """The squid line when the check did not finish in time."""
    return Line('proxy.squid_unread', 'warn',
                'Egress proxy squid: the package version inside %s could not be read (the check did not finish)'
                % proxy, fix='docker exec %s dpkg-query -W squid-common' % proxy)


def upstream_network(names: Iterable[str], labelled_upstream: Callable[[str], bool]) -> Optional[str]:
    """The network the proxy reaches the mirror through: one labelled upstream, else the first that is
    neither a job network nor a doctor network; None when there is none."""
    candidates = sorted(name for name in names
                        if not _jobnet_names.looks_like_job_network(name) and parse_doctor_network(name) is None)
    for name in candidates:
        if labelled_upstream(name):
            return name
    return candidates[0] if candidates else None


# --- the daemon side -------------------------------------------------------------------------------

def squid_installed(ctx: DoctorContext) -> Tuple[Optional[str], Optional[str]]:
    """(version, None) or (None, why): dpkg's squid version inside the running proxy (an exec, no shell)."""
    try:
        rc, out = dc.exec_in(ctx.client.containers.get(ctx.proxy),
                             ['dpkg-query', '-W', '-f=${Version}', SQUID_VERSION_PACKAGE])
    except dc.EngineError as exc:
        return None, ' '.join(str(exc).split())
    except Exception as exc:
        return None, ' '.join(dc.api_message(exc).split())
    if rc != 0 or not out.strip():
        return None, 'dpkg-query -W %s exited %s%s' % (SQUID_VERSION_PACKAGE, rc,
                                                       (': ' + ' '.join(out.split())[:200]) if out else '')
    return out.strip(), None


def _labelled_upstream(ctx: DoctorContext, name: str) -> bool:
    try:
        labels = (ctx.client.api.inspect_network(name) or {}).get('Labels') or {}
    except Exception:
        return False
    return labels.get('io.pi-dispatch.egress.network') == 'upstream'


def squid_candidate_version(ctx: DoctorContext) -> Tuple[Optional[str], Optional[str]]:
    """(candidate, None) or (None, why): apt's candidate in a throwaway container of the proxy's image.

    The container runs as root (apt-get update writes its lists) with every
    capability dropped, on the proxy's upstream network, so it asks the
    mirror the way the proxy's own traffic leaves; bounded by
    SQUID_CANDIDATE_TIMEOUT, then removed. On an ``--internal`` upstream (the
    tests) nothing answers and the why says so.
    """
    if not ctx.squid_candidate:
        return None, 'the mirror check is switched off (squid_mirror: false; the role\'s doctor_squid_mirror)'
    networks = list(((ctx.attrs.get('NetworkSettings') or {}).get('Networks') or {}).keys())
    net = upstream_network(networks, lambda name: _labelled_upstream(ctx, name))
    if net is None:
        return None, 'the proxy is on no upstream network'
    image = ctx.attrs.get('Image') or (ctx.attrs.get('Config') or {}).get('Image')
    # Not in ctx.launched: the canary's teardown must not remove it while it runs. This function
    # removes it; a killed run's is swept with that run's canary network (its name carries the pid).
    name = probe_name('squid', ctx.pid)
    api = ctx.client.api
    started = time.monotonic()
    try:
        try:
            created = api.create_container(
                image, ['sh', '-c', candidate_script()], name=name, detach=True, user='root',
                labels={LABEL: str(ctx.pid)}, entrypoint=[],
                host_config=api.create_host_config(network_mode=net, security_opt=['no-new-privileges:true'],
                                                   cap_drop=['ALL']))
            api.start(created['Id'])
        except Exception as exc:
            return None, 'the throwaway container could not start on %s: %s' % (net, dc.api_message(exc))
        wait = SQUID_CANDIDATE_TIMEOUT + ctx.start_grace + 10
        try:
            api.wait(created['Id'], timeout=wait)
        except Exception:
            return None, 'the throwaway container did not finish within %ss' % wait
        try:
            logs = api.logs(created['Id'], stdout=True, stderr=True)
        except Exception as exc:
            return None, 'the throwaway container\'s output could not be read: %s' % dc.api_message(exc)
        text = logs.decode('utf-8', 'replace') if isinstance(logs, bytes) else str(logs)
        candidate, why = parse_candidate_output(text)
        return candidate, (None if why is None else '%s, from a throwaway container on %s' % (why, net))
    finally:
        ctx.timings['squid'] = time.monotonic() - started
        dc.remove_quietly(api, name)  # not found, or the teardown/sweep reports it


class SquidCheck(Check):
    """The squid lines of the running proxy (``ctx.attrs``): its package, and the mirror's candidate."""

    def lines(self, ctx: DoctorContext) -> List[Line]:
        installed, installed_why = squid_installed(ctx)
        candidate, candidate_why = (None, 'the installed version is unknown')
        if installed is not None:
            try:
                candidate, candidate_why = squid_candidate_version(ctx)
            except Exception as exc:  # a daemon surprise is a line, never a dead thread
                candidate, candidate_why = None, 'the mirror check failed: %s' % ' '.join(str(exc).split())
        return squid_lines(ctx.proxy, installed, installed_why, candidate, candidate_why)
