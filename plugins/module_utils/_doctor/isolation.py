# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The doctor's job-to-job isolation check: two peers on two real job networks.

Two job networks from the job pool (``pi-job-doctor-<pid>-<a|b>-net``, made and
torn down with ``_jobnet`` like a job's), each with the proxy and one peer at a
fixed address. Each peer, directly (no proxy), must reach the proxy and neither
the other peer (by name or address) nor the proxy's address on the other
network. The pure part (:func:`isolation_script`, :func:`parse_isolation_output`,
:func:`classify_isolation`) is unit-tested; :class:`IsolationCheck` runs it.
"""

from __future__ import annotations

import ipaddress
import threading
from typing import Any, Dict, List, Optional, Sequence

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import lifecycle as _jobnet_lifecycle
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import teardown as _jobnet_teardown
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import rules as _rules
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.containers import run_container
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.context import Check, DoctorContext
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.lines import Line
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.names import (
    PEERS, daemon_locality, isolation_job_id, isolation_network_name, peer_name)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.probes import PROBE_MARK

ISOLATION_CONNECT_TIMEOUT = 3  # a dropped packet is a timeout; 3 s is plenty on one host


def peer_address(subnet: str, peer: str = 'a') -> str:
    """The fixed address a peer takes on its job network: the subnet's last usable one for a, the one before for b.

    Distinct per peer, so that two peers that end up on one network (the
    failure this check exists to catch) still both start and can be told apart.
    """
    hosts = list(ipaddress.ip_network(subnet, strict=False).hosts())
    return str(hosts[-1 - PEERS.index(peer)])


ISOLATION_CHECKS = ('proxy', 'peer_name', 'peer_address', 'proxy_other')
# What a connect that never left the peer says (curl -v): no route, so not reached.
UNROUTED = ('Network is unreachable', 'No route to host')
ERRNO_LINES = '^curl: |Network is unreachable|No route to host|Connection refused'


def isolation_script(targets: Dict[str, str], timeout: int = ISOLATION_CONNECT_TIMEOUT, settle: int = 1) -> str:
    """Shell for one peer: the checks of ``targets`` (key -> URL) at once, each bounded, then a parseable trailer.

    Direct (``--noproxy '*'``): a job that ignores its proxy variables is what
    isolation must hold against. ``settle`` seconds first, so the other peer is
    up, and as long again at the end, so it stays up while the other probes it.
    """
    parts = ['sleep %d' % int(settle)]
    for key in ISOLATION_CHECKS:
        url = targets[key]
        # -v: curl's exit 7 is both a refusal (packets got there) and "Network is unreachable" (no
        # route: Docker 26 and newer give an internal network's container none); only the verbose
        # lines tell them apart, so the error kept is those lines plus curl's own.
        parts.append("(curl -sS -v --noproxy '*' --connect-timeout %d --max-time %d -o /dev/null -w '%%{http_code}' "
                     "'%s' >/tmp/o-%s 2>/tmp/v-%s; echo $? >/tmp/r-%s; grep -E '%s' /tmp/v-%s >/tmp/e-%s) &"
                     % (int(timeout), int(timeout) + 2, url, key, key, key, ERRNO_LINES, key, key))
    parts.append('wait')
    for key in ISOLATION_CHECKS:
        parts.append('echo "%s-ISO %s $(cat /tmp/o-%s 2>/dev/null) $(cat /tmp/r-%s 2>/dev/null) '
                     '$(head -c 200 /tmp/e-%s 2>/dev/null | tr \'\\n\' \' \')"' % (PROBE_MARK, key, key, key, key))
    parts.append('sleep %d' % int(settle))
    return '\n'.join(parts) + '\n'


def parse_isolation_output(text: Optional[str]) -> Optional[Dict[str, Dict[str, Any]]]:
    """key -> dict(code, rc, error) from a peer's output; None when a check's trailer is missing."""
    found = {}
    for raw in (text or '').splitlines():
        if not raw.startswith(PROBE_MARK + '-ISO '):
            continue
        words = raw.split(None, 4)
        if len(words) < 4 or words[1] not in ISOLATION_CHECKS:
            continue
        code = int(words[2]) if words[2].isdigit() else 0
        rc = int(words[3]) if words[3].lstrip('-').isdigit() else None
        found[words[1]] = dict(code=code, rc=rc, error=(words[4].strip() if len(words) > 4 else ''))
    return found if all(key in found for key in ISOLATION_CHECKS) else None


def reached(check: Dict[str, Any]) -> bool:
    """Whether a direct connection got anything back: an HTTP answer, or a refused connection (curl exit 7).

    Docker drops traffic between networks, which is a timeout (exit 28), a
    name that does not resolve (exit 6), or, where the container has no route
    there at all, exit 7 with "Network is unreachable" / "No route to host"; a
    refusal means packets got there.
    """
    if check['code']:
        return True
    if check['rc'] != 7:
        return False
    return not any(text in (check['error'] or '') for text in UNROUTED)


def _check_text(check: Dict[str, Any]) -> str:
    if check['code']:
        return 'HTTP %d' % check['code']
    return 'curl exit %s%s' % (check['rc'], ': ' + check['error'] if check['error'] else '')


def classify_isolation(peers: Sequence[Dict[str, Any]]) -> Line:
    """One line from both peers' results.

    ``peers``: list of dict(peer, net, other, targets, result, why), ``result``
    from :func:`parse_isolation_output` (None: the peer gave no reading).
    """
    for peer in peers:
        if peer['result'] is None:
            return Line('isolation.notrun', 'notrun', 'Job-to-job isolation was not checked (%s on %s: %s)'
                        % (peer['peer'], peer['net'], peer['why'] or 'it printed no result'))
    leaks = []
    for peer in peers:
        result = peer['result']
        for key, what in (('peer_name', "%s's name"), ('peer_address', "%s's address"),
                          ('proxy_other', "the proxy's address on %s's network")):
            if reached(result[key]):
                leaks.append('%s on %s reached %s (%s: %s)' % (
                    peer['peer'], peer['net'], what % peer['other'], peer['targets'][key], _check_text(result[key])))
    if leaks:
        return Line('isolation.leaks', 'fail', 'Job-to-job isolation is broken: %s' % '; '.join(leaks),
                    fix='job networks must be created --internal, one per job (pi_dispatch.egress.job_network); '
                        'docker network inspect <net> shows Internal and what is attached')
    for peer in peers:
        check = peer['result']['proxy']
        if not check['code']:
            return Line('isolation.proxy_unreached', 'fail',
                        'Job-to-job isolation: %s on %s does not reach the proxy (%s: %s), so a job there gets no '
                        'egress' % (peer['peer'], peer['net'], peer['targets']['proxy'], _check_text(check)),
                        fix='docker network connect %s <proxy>; pi_dispatch.egress.job_network attaches it'
                            % peer['net'])
    a, b = peers
    return Line('isolation.peers', 'ok',
                "Job-to-job isolation: %s on %s and %s on %s each reach the proxy and not each other (by name, by "
                "address, nor through the proxy's address on the other network)"
                % (a['peer'], a['net'], b['peer'], b['net']))


# --- the daemon side -------------------------------------------------------------------------------

def isolation_skipped(why: str) -> List[Line]:
    """The line of an isolation check that did not run, for ``why``."""
    return [Line('isolation.notrun', 'notrun', 'Job-to-job isolation was not checked (%s)' % why)]


class IsolationCheck(Check):
    """Two peers on two real job networks: each must reach the proxy and not the other.

    The canary runs it beside its probes (``canary.py``); its teardown is its own.
    """

    def lines(self, ctx: DoctorContext) -> List[Line]:
        made, lines = [], []
        local = daemon_locality(ctx.docker_host, ctx.environ)[0]
        try:
            nets = {}
            try:
                # One after the other: a's network first (tests/integration/test_doctor.py's broken layout, b
                # sharing a's network, depends on it; made at once they saved about 0.5 s of a 10 s run).
                for peer in PEERS:
                    nets[peer] = _jobnet_lifecycle.create_job_network(
                        ctx.client, isolation_job_id(ctx.pid, peer), proxy_name=ctx.proxy, pool=ctx.job_pool,
                        prefix=ctx.job_prefix, routes=None if local else [])
                    made.append(peer)
                proxy_ips = {}
                for peer in PEERS:
                    # The member of the proxy's family that carries it: the proxy, or a shard (under the
                    # proxy's name as its alias, so the peer still dials the proxy's name).
                    carrier = getattr(nets[peer], 'proxy', None) or ctx.proxy
                    attrs = ctx.client.api.inspect_network(nets[peer].network)
                    ours = [c for c in (attrs.get('Containers') or {}).values() if c.get('Name') == carrier]
                    proxy_ips[peer] = (ours[0].get('IPv4Address') or '').split('/')[0] if ours else ''
                    if not proxy_ips[peer]:
                        raise dc.EngineError('the proxy has no address on %s' % nets[peer].network
                                             if carrier == ctx.proxy else
                                             'the proxy shard %s has no address on %s' % (carrier, nets[peer].network))
            except Exception as exc:
                return [Line('isolation.notrun', 'notrun', 'Job-to-job isolation was not checked (setting up the '
                             'job networks failed: %s)' % ' '.join(str(exc).split()),
                             fix='ansible-playbook pi_dispatch.egress.gc, then re-run doctor')]
            addresses = dict((peer, peer_address(nets[peer].subnet, peer)) for peer in PEERS)
            port = _rules.PROXY_PORT
            specs = []
            for peer, other in (('a', 'b'), ('b', 'a')):
                targets = dict(proxy='http://%s:%d/' % (ctx.proxy, port),
                               peer_name='http://%s:%d/' % (peer_name(other, ctx.pid), port),
                               peer_address='http://%s:%d/' % (addresses[other], port),
                               proxy_other='http://%s:%d/' % (proxy_ips[other], port))
                specs.append(dict(peer=peer_name(peer, ctx.pid), net=nets[peer].network,
                                  other=peer_name(other, ctx.pid), targets=targets, address=addresses[peer],
                                  key='peer-%s' % peer))
            raw = {}
            wait = ISOLATION_CONNECT_TIMEOUT + 2 + 2 + ctx.start_grace
            threads = [threading.Thread(target=run_container,
                                        args=(ctx, spec['key'], spec['peer'], isolation_script(spec['targets']),
                                              spec['net'], raw, wait),
                                        kwargs=dict(address=spec['address'])) for spec in specs]
            for thread in threads:
                thread.daemon = True
                thread.start()
            for thread in threads:
                thread.join(wait + 15)
            for spec in specs:
                text, why = raw.get(spec['key'], (None, 'it did not finish within %ss' % wait))
                spec['result'] = parse_isolation_output(text) if text is not None else None
                spec['why'] = why if text is None else (None if spec['result'] else
                                                        'it printed no result (%s)' % ' '.join(text.split())[-200:])
            lines.append(classify_isolation(specs))
            return lines
        finally:
            lines.extend(_teardown(ctx, made))


def _each_at_once(fn: Any, peers: Sequence[str]) -> Dict[str, Optional[Exception]]:
    """peer -> None, or what ``fn(peer)`` raised; every peer's call in its own thread, all joined."""
    out: Dict[str, Optional[Exception]] = {}

    def one(peer: str) -> None:
        try:
            fn(peer)
            out[peer] = None
        except Exception as exc:
            out[peer] = exc
    threads = [threading.Thread(target=one, args=(peer,)) for peer in peers]
    for thread in threads:
        thread.daemon = True
        thread.start()
    for thread in threads:
        thread.join()
    return out


def _teardown(ctx: DoctorContext, made: List[str]) -> List[Line]:
    """Every peer first (a peer may sit on either network), then the job networks; the two of each at once."""
    lines = []
    removed = _each_at_once(lambda peer: ctx.client.api.remove_container(peer_name(peer, ctx.pid), force=True),
                            PEERS)
    stuck = dict((peer, (peer_name(peer, ctx.pid), dc.api_message(exc))) for peer, exc in removed.items()
                 if exc is not None and not dc.is_not_found(exc))
    left = [peer for peer in made if peer not in stuck]
    torn = _each_at_once(lambda peer: _jobnet_teardown.teardown_job_network(
        ctx.client, isolation_job_id(ctx.pid, peer), proxy_name=ctx.proxy), left)
    for peer in made:
        net = isolation_network_name(ctx.pid, peer)
        if peer in stuck:
            name, why = stuck[peer]
            lines.append(Line('isolation.cleanup', 'warn', 'Job-to-job isolation: %s could not be torn down '
                              '(the peer %s would not go: %s)' % (net, name, why),
                              fix='docker rm -f %s; the next doctor run sweeps %s' % (name, net)))
        elif torn.get(peer) is not None:
            lines.append(Line('isolation.cleanup', 'warn', 'Job-to-job isolation: %s could not be torn down (%s)'
                              % (net, ' '.join(str(torn[peer]).split())),
                              fix='docker network inspect %s, then docker network rm %s' % (net, net)))
    return lines
