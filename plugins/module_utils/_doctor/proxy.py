# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The doctor's proxy lines: the container, its rules, the destination guard, the mounts, the include.

The pure part (:func:`proxy_lines`, :func:`rules_line`, :func:`guard_line`,
:func:`mounts_line`, :func:`include_line`, ...) takes what was read and returns
lines; :class:`ProxyCheck`, :class:`RulesCheck`, :class:`GuardCheck` and
:class:`IncludeCheck` read the proxy (inspect, files inside it with an exec,
the files it mounts when the daemon is on this host).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import venue as _venue
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import endpoints as _endpoints
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import guard as _guard
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import lifecycle as _proxy
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import reload as _reload
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import rules as _rules
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.context import Check, DoctorContext
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.lines import Line, shape
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.names import daemon_locality


# --- the model-endpoints include: pure -------------------------------------------------------

def include_line(proxy: str, declared_ids: Sequence[str], render: str, running: Optional[str], mounted: Optional[str],
                 mounted_path: Optional[str], declaration_path: str, mounts_include: bool) -> Optional[Line]:
    """The include line, or None when nothing is declared and all agrees (doctor then says nothing).

    ``running``: the include as the running proxy reads it (None: unknown);
    ``mounted``: the host file the proxy mounts (None: not readable here, e.g. a remote daemon);
    ``render``: what the declaration renders.
    """
    ids = ', '.join(declared_ids) if declared_ids else 'nothing declared'
    if not mounts_include:
        if not declared_ids:
            return None
        return Line('endpoints.include_unmounted', 'fail',
                    'Model endpoints: the proxy does not mount the include, so the declared endpoints (%s) stay '
                    'unreachable until it is recreated' % ids,
                    fix='ansible-playbook pi_dispatch.egress.site (recreates the proxy with the third mount)')
    if running is None:
        return Line('endpoints.include_unchecked', 'warn',
                    'Model endpoints: the include could not be checked (reading it inside %s failed)' % proxy,
                    fix='docker exec %s cat %s' % (proxy, _rules.CONTAINER_ENDPOINTS))
    if mounted is not None and mounted != running:
        return Line('endpoints.include_replaced', 'fail',
                    "Model endpoints: the include inside the running proxy differs from the file it mounts (%s): "
                    "the file was replaced (a rename, an editor's save) instead of written in place, and the proxy "
                    "still reads the old one" % mounted_path,
                    fix='recreate the proxy: docker rm -f %s, then ansible-playbook pi_dispatch.egress.site' % proxy)
    if running != render:
        return Line('endpoints.include_stale', 'fail',
                    'Model endpoints: the include inside the running proxy is not the render of %s (%s)'
                    % (declaration_path, ids),
                    fix='ansible-playbook pi_dispatch.egress.endpoints (renders and reloads the proxy)')
    if not declared_ids:
        return None
    return Line('endpoints.include', 'ok',
                'Model endpoints: the include inside the running proxy matches model-endpoints.json (%s)' % ids)


# --- the destination guard and the mounts: pure ---------------------------------------------------

GUARD_REFRESH_FIX = ('ansible-playbook pi_dispatch.egress.upgrade -e egress_upgrade_refresh_rules=true (takes the '
                     'packaged rules with a backup, lays out egress-guard.conf and renders it)')


def _guard_comment(text: str, label: str) -> Optional[str]:
    prefix = '# %s: ' % label
    for line in text.splitlines():
        if line.startswith(prefix):
            return line[len(prefix):].strip()
    return None


def attrs_gateways(attrs: Dict[str, Any]) -> Dict[str, str]:
    """{gateway: network name} of every network in a container inspect."""
    found = {}
    for name, settings in sorted(((attrs.get('NetworkSettings') or {}).get('Networks') or {}).items()):
        for key in ('Gateway', 'IPv6Gateway'):
            if (settings or {}).get(key):
                found.setdefault(settings[key], name)
    return found


def guard_line(proxy: str, running_rules: Optional[str], running_guard: Optional[str], mounts_guard: bool,
               gateways: Optional[Dict[str, str]] = None, host_gateway: Optional[str] = None,
               why: Optional[str] = None) -> Line:
    """The guard line from what the running proxy reads.

    ``running_rules``/``running_guard``: the rules and the guard include as read inside the proxy
    (None: not readable, ``why`` says why); ``gateways``: {address: network} of the proxy's networks now;
    ``host_gateway``: what host.docker.internal is inside the proxy.
    """
    if running_rules is None:
        return Line('proxy.guard_unchecked', 'warn', 'Destination guard could not be checked (%s)'
                    % (why or 'the rules inside %s could not be read' % proxy),
                    fix='docker exec %s cat %s' % (proxy, _rules.CONTAINER_RULES))
    if not _rules.includes_guard(running_rules):
        return Line('proxy.guard_missing', 'fail',
                    'Destination guard missing: the rules %s runs do not include egress-guard.conf, so a listed '
                    'name can lead a job to another job, the host or a private range' % proxy, fix=GUARD_REFRESH_FIX)
    if not mounts_guard:
        return Line('proxy.guard_unmounted', 'fail',
                    'Destination guard not mounted: %s does not mount egress-guard.conf, so squid cannot read it'
                    % proxy, fix='ansible-playbook pi_dispatch.egress.site -e egress_proxy_allow_cut_jobs=true '
                                 '(recreates the proxy with the guard mount)')
    if running_guard is None:
        return Line('proxy.guard_unchecked', 'warn', 'Destination guard could not be checked (%s)'
                    % (why or '%s could not be read inside %s' % (_rules.CONTAINER_GUARD, proxy)),
                    fix='docker exec %s cat %s' % (proxy, _rules.CONTAINER_GUARD))
    nets = _guard.acl_networks(running_guard)
    if not nets:
        return Line('proxy.guard_empty', 'fail',
                    'Destination guard empty: egress-guard.conf inside %s defines no pi_guard addresses' % proxy,
                    fix='ansible-playbook pi_dispatch.egress.site (renders the guard and reloads squid)')
    pool = _guard_comment(running_guard, 'Job-network pool')
    gaps = []
    try:
        pool_net = _guard.ipaddress.ip_network(pool, strict=False) if pool else None
    except ValueError:
        pool_net = None
    ends = (pool_net.network_address, pool_net.broadcast_address) if pool_net is not None else ()
    if pool_net is None or not all(_guard.covers(nets, a) for a in ends):
        gaps.append('the job-network pool %s' % (pool or '(not named)'))
    for address, network in sorted((gateways or {}).items()):
        if not _guard.covers(nets, address):
            gaps.append('the gateway %s of %s' % (address, network))
    if host_gateway and not _guard.covers(nets, host_gateway):
        gaps.append('the host-gateway address %s' % host_gateway)
    if gaps:
        return Line('proxy.guard_gap', 'fail', 'Destination guard gap: egress-guard.conf inside %s does not refuse %s'
                    % (proxy, ', '.join(gaps)),
                    fix='ansible-playbook pi_dispatch.egress.site (renders the guard from the daemon\'s gateways '
                        'and reloads squid; no job is cut)')
    refused = ['the job pool %s' % pool_net]
    outside = _guard_comment(running_guard, 'Network gateways outside the pool (this host)')
    if outside and outside != 'none known':
        refused.append('the gateways %s' % outside)
    if host_gateway:
        refused.append('the host %s' % host_gateway)
    refused.append('every other non-public range')
    opened = _guard_comment(running_guard, 'Opened private ranges') or 'none'
    return Line('proxy.guard', 'ok',
                'Destination guard in force in %s: a listed name that resolves to %s is refused (%d ranges; '
                'opened: %s)' % (proxy, ', '.join(refused), len(nets), opened))


def endpoints_rules_line(proxy: str, running_rules: Optional[str], declared_ids: Sequence[str]) -> Optional[Line]:
    """A fail line when endpoints are declared and the running rules cannot load them, else None."""
    if running_rules is None or not declared_ids or _rules.includes_endpoints(running_rules):
        return None
    return Line('endpoints.rules_without_include', 'fail',
                'Model endpoints: the rules %s runs do not include model-endpoints.conf, so the declared endpoints '
                '(%s) stay unreachable until the rules are refreshed' % (proxy, ', '.join(declared_ids)),
                fix=GUARD_REFRESH_FIX)


def mounts_line(proxy: str, stale: Sequence[str], count: int, why: Optional[str] = None) -> Line:
    """``stale``: host paths whose content inside the proxy differs; ``why``: why nothing was compared."""
    if why:
        return Line('proxy.mounts_unchecked', 'notrun',
                    'Egress proxy mounts were not compared with the files on disk (%s)' % why)
    if stale:
        return Line('proxy.mounts_stale', 'fail',
                    'Egress proxy mounts: %s inside %s differ from the file on disk: it was saved by rename (sed -i, '
                    'an editor, lineinfile, template) and the proxy still reads the old one'
                    % (', '.join(stale), proxy),
                    fix='ansible-playbook pi_dispatch.egress.site -e egress_proxy_allow_cut_jobs=true (recreates the '
                        'proxy on the current files), and write these files in place from now on')
    return Line('proxy.mounts', 'ok', 'Egress proxy mounts: each of the %d files inside %s has the content of the '
                                      'file on disk' % (count, proxy))


# --- proxy lines: pure ---------------------------------------------------------------------------

def proxy_lines(proxy: str, attrs: Optional[Dict[str, Any]]) -> List[Line]:
    """Running and health lines from the proxy's inspect (None: no such container)."""
    if attrs is None:
        return [Line('proxy.missing', 'fail',
                     'Egress proxy missing: there is no container %s, so every new job is refused' % proxy,
                     fix='ansible-playbook pi_dispatch.egress.site')]
    state = attrs.get('State') or {}
    if not state.get('Running') or state.get('Paused'):
        status = 'paused' if state.get('Paused') else (state.get('Status') or 'not running')
        return [Line('proxy.stopped', 'fail',
                     'Egress proxy stopped (%s is %s), so every new job is refused' % (proxy, status),
                     fix=('docker unpause %s' if state.get('Paused') else 'docker start %s') % proxy)]
    lines = [Line('proxy.running', 'ok', 'Egress proxy running (%s)' % proxy)]
    health = (state.get('Health') or {}).get('Status')
    if health == 'healthy':
        lines.append(Line('proxy.health', 'ok', 'Egress proxy health: healthy'))
    elif health == 'unhealthy':
        lines.append(Line('proxy.health', 'fail', 'Egress proxy health: unhealthy (squid does not answer its own '
                                                  'health check)',
                          fix='docker logs --tail 50 %s, then docker restart %s' % (proxy, proxy)))
    elif health == 'starting':
        lines.append(Line('proxy.health', 'warn', 'Egress proxy health: starting',
                          fix='wait a few seconds and re-run doctor; docker inspect %s shows the health log' % proxy))
    else:
        lines.append(Line('proxy.health', 'warn', 'Egress proxy health: no health check is configured',
                          fix='ansible-playbook pi_dispatch.egress.site (recreates the proxy with its health check)'))
    return lines


PACKAGED_FILE = 'plugins/module_utils/_policy/rules.py'


def first_difference(text: str, packaged: str) -> Optional[Tuple[int, str, str]]:
    """(line number, folder's line, packaged line) of the first differing line, 1-based."""
    ours, theirs = text.splitlines(), packaged.splitlines()
    for number in range(max(len(ours), len(theirs))):
        left = ours[number] if number < len(ours) else '<end of file>'
        right = theirs[number] if number < len(theirs) else '<end of file>'
        if left != right:
            return number + 1, left, right
    return None


def rules_line(rules_path: str, text: Optional[str], error: Optional[str] = None) -> Line:
    packaged = "%s in the pi_dispatch.egress collection, rules version %d" % (PACKAGED_FILE, _rules.RULES_VERSION)
    if error is not None:
        return Line('proxy.rules_unreadable', 'warn', 'Egress proxy rules: %s could not be read (%s)'
                    % (rules_path, error), fix='ls -l %s; ansible-playbook pi_dispatch.egress.site lays it out '
                                               'when missing' % rules_path)
    if text == _rules.packaged_rules():
        return Line('proxy.rules', 'ok', "Egress proxy rules: %s matches the collection's copy (%s)"
                    % (rules_path, packaged))
    where = first_difference(text, _rules.packaged_rules())
    detail = ''
    if where:
        detail = '; first difference at line %d: %r, packaged %r' % where
    return Line('proxy.rules_differ', 'warn', "Egress proxy rules: %s differs from the collection's copy (%s%s)"
                % (rules_path, packaged, detail),
                fix='review the difference; to go back to the packaged rules keep a backup '
                    '(cp -p %s %s.bak-$(date -u +%%Y%%m%%dT%%H%%M%%SZ)), write the packaged copy in place, then '
                    'restart the proxy (ansible-playbook pi_dispatch.egress.site -e egress_proxy_state=restarted)'
                % (rules_path, rules_path))


# --- the daemon side -------------------------------------------------------------------------------

def proxy_attrs(ctx: DoctorContext) -> Optional[dict]:
    """The proxy's inspect; None when there is no such container (any other failure raises EngineError)."""
    try:
        return ctx.client.api.inspect_container(ctx.proxy)
    except Exception as exc:
        if dc.is_not_found(exc):
            return None
        raise dc.EngineError('Inspecting container %s failed: %s' % (ctx.proxy, dc.api_message(exc)))


LIMITS_FIX = ('boot the host with cgroup v2 (systemd.unified_cgroup_hierarchy=1; the default of Debian 11, RHEL 9, '
              'Ubuntu 21.10 and later), or run the proxy on the rootful engine; until then the deploy runs only with '
              'egress_proxy_limits_unenforced_ok: true (docs/podman.md)')


def limits_line(proxy: str, attrs: Optional[Dict[str, Any]], venue: Any) -> Optional[Line]:
    """⚠ when the engine cannot apply the proxy's memory and pids limits (rootless on cgroup v1), else None. Pure."""
    if attrs is None or venue is None or venue.limits_problem() is None:
        return None
    host = attrs.get('HostConfig') or {}
    return Line('proxy.limits_unenforced', 'warn',
                shape('proxy.limits_unenforced', engine=venue.describe(), version=venue.cgroup_version, proxy=proxy,
                      memory=str(host.get('Memory') or 0), pids=str(host.get('PidsLimit') or 0)),
                fix=LIMITS_FIX)


class ProxyCheck(Check):
    """The running and health lines (and the limits warning); leaves the proxy's inspect in ``ctx.attrs``."""

    def lines(self, ctx: DoctorContext) -> List[Line]:
        ctx.attrs = proxy_attrs(ctx)
        lines = proxy_lines(ctx.proxy, ctx.attrs)
        if ctx.attrs is None:
            return lines
        try:
            venue = _venue.venue(ctx.client)
        except dc.EngineError:  # the engine answered the inspect: a later check says what it does not answer
            return lines
        limits = limits_line(ctx.proxy, ctx.attrs, venue)
        return lines + ([limits] if limits else [])


class RulesCheck(Check):
    """The rules file in the deployment folder against the collection's copy."""

    def lines(self, ctx: DoctorContext) -> List[Line]:
        path = _deployment.paths(ctx.deploy_dir)['rules']
        try:
            with open(path, 'r') as handle:
                return [rules_line(path, handle.read())]
        except (IOError, OSError) as exc:
            return [rules_line(path, None, error=exc.strerror or str(exc))]


class IncludeCheck(Check):
    """The include check: the running proxy's model-endpoints include against the declaration."""

    def lines(self, ctx: DoctorContext) -> List[Line]:
        declaration = _endpoints.default_path(ctx.deploy_dir)
        try:
            endpoints, declaration, _exists = _endpoints.load(ctx.deploy_dir)
            render = _endpoints.render_include(endpoints)
        except Exception as exc:  # EndpointsError names the file, the key and the fix
            return [Line('endpoints.include_unchecked', 'warn',
                         'Model endpoints: the include could not be checked (%s)' % ' '.join(str(exc).split()),
                         fix='fix %s as the message says, then ansible-playbook pi_dispatch.egress.endpoints'
                             % declaration)]
        mount = [m for m in ctx.attrs.get('Mounts') or [] if m.get('Destination') == _rules.CONTAINER_ENDPOINTS]
        running = mounted = None
        mounted_path = mount[0].get('Source') if mount else None
        if mount:
            try:
                rc, out = dc.exec_in(ctx.client.containers.get(ctx.proxy), ['cat', _rules.CONTAINER_ENDPOINTS])
                running = out if rc == 0 else None
            except Exception:
                running = None
            if daemon_locality(ctx.docker_host, ctx.environ)[0] and mounted_path:
                try:
                    with open(mounted_path, 'r') as handle:
                        mounted = handle.read()
                except (IOError, OSError):
                    mounted = None
        line = include_line(ctx.proxy, [e.id for e in endpoints], render, running, mounted, mounted_path,
                            declaration, bool(mount))
        return [line] if line else []


class GuardCheck(Check):
    """The guard line, the rules-without-endpoints line and the stale-mount line (running proxy)."""

    def lines(self, ctx: DoctorContext) -> List[Line]:
        attrs, proxy = ctx.attrs, ctx.proxy
        lines = []
        mounts = [(m.get('Source'), m.get('Destination')) for m in attrs.get('Mounts') or []
                  if m.get('Type') == 'bind' and m.get('Source') and m.get('Destination')]
        mounts_guard = any(dst == _rules.CONTAINER_GUARD for _src, dst in mounts)
        running_rules = running_guard = host_gateway = why = None
        try:
            container = ctx.client.containers.get(proxy)
            rc, out = dc.exec_in(container, ['cat', _rules.CONTAINER_RULES])
            running_rules = out if rc == 0 else None
            if mounts_guard:
                rc, out = dc.exec_in(container, ['cat', _rules.CONTAINER_GUARD])
                running_guard = out if rc == 0 else None
            rc, out = dc.exec_in(container, ['cat', '/etc/hosts'])
            host_gateway = _proxy.hosts_address(out) if rc == 0 else None
        except Exception as exc:
            why = ' '.join((dc.api_message(exc) if not isinstance(exc, dc.EngineError) else str(exc)).split())
            container = None
        lines.append(guard_line(proxy, running_rules, running_guard, mounts_guard, attrs_gateways(attrs),
                                host_gateway, why=why))
        line = endpoints_rules_line(proxy, running_rules, sorted(e.id for e in ctx.declared_endpoints() or []))
        if line:
            lines.append(line)
        if not daemon_locality(ctx.docker_host, ctx.environ)[0]:
            lines.append(mounts_line(proxy, [], len(mounts), why='the daemon is on another host, so its files '
                                                                 'are not readable here'))
        elif container is None or not mounts:
            lines.append(mounts_line(proxy, [], 0, why=why or 'the proxy mounts no file'))
        else:
            try:
                rc, out = dc.exec_in(container, _reload.mounted_digests_cmd([dst for _src, dst in mounts]))
                inside = _reload.parse_digests(out)
                stale = [src for src, _dst in _reload.stale_mounts(dict(mounts=mounts), inside)]
                lines.append(mounts_line(proxy, stale, len(mounts)))
            except Exception as exc:
                lines.append(mounts_line(proxy, [], len(mounts), why=' '.join(str(exc).split())))
        return lines
