# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The one reload path of the proxy: validate, parse, reconfigure, record.

Every writer of something squid reads (the allowlist through ``egress_proxy``,
the endpoints include through ``model_endpoints``, the guard include through
``egress_guard``) reloads through :func:`reload`:

1. :func:`check_sources`: the allowlist parses (file and line of every refusal)
   and every include is a regular file, not a symlink;
2. ``squid -k parse`` of the rules with what is on disk now;
3. record the allowlist squid is about to read, then ``squid -k reconfigure``
   (no tunnel is cut);
4. return what squid read: the digest of every source file.

A refusal at 1 or 2 reconfigures nothing, so the running squid keeps its last good rules.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import allowlist as _allowlist
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import rules as _rules
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import shards as _shards
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy.spec import LOADED_ALLOWLIST, ProxyError


class ParseRefused(ProxyError):
    """squid -k parse refused the rules with what is on disk now; nothing was reloaded."""


class SourcesRefused(ParseRefused):
    """A file squid reads is refused before squid sees it (bad allowlist line, symlinked include)."""

    def __init__(self, message: str, problems: List[Dict[str, Any]]) -> None:
        super(SourcesRefused, self).__init__(message)
        self.problems = problems


PARSE_CMD = ['squid', '-k', 'parse', '-f', _rules.CONTAINER_RULES]


def allowlist_check_cmd() -> List[str]:
    """Exit 0 when the mounted allowlist is what squid last read, 1 when it changed, 2 when unknown."""
    return ['cmp', '-s', LOADED_ALLOWLIST, _rules.CONTAINER_ALLOWLIST]


# The TLS name check the image runs beside squid (roles/proxy/files/peek.conf, entrypoint). It includes
# the destination guard, so it rereads it when the guard changed since it last read it (the entrypoint
# records the copy it started with). It is reconfigured FIRST and must answer again before squid is:
# squid probes it once when it reconfigures, and a probe that finds its port closed (it closes its
# ports while it reconfigures) leaves every tunnel to 443 refused until the next request reprobes.
# An image without the check has no pid file there, and nothing of this runs.
PEEK_CONFIG = '/etc/squid/peek.conf'
PEEK_PID = '/run/squid/peek.pid'
PEEK_LOADED_GUARD = '/tmp/pi-egress-peek-guard.conf'
# The credential include it reads too (docs/credentials.md), recorded the same way.
PEEK_CREDENTIALS = '/etc/pi-dispatch/egress-credentials.conf'
PEEK_LOADED_CREDENTIALS = '/tmp/pi-egress-peek-credentials.conf'
PEEK_PORT = _rules.PEEK_PORT
# 127.0.0.1:<PEEK_PORT> as /proc/net/tcp writes a local address; state 0A is LISTEN.
PEEK_LISTEN = '0100007F:%04X' % PEEK_PORT
PEEK_WAIT_TENTHS = 50


def reconfigure_cmd() -> List[str]:
    """Record the allowlist; reconfigure the TLS name check when its guard or its credential include changed,
    and wait until it listens again; then make squid reread everything (rules, allowlist, includes)."""
    peek = ('if [ -s {pid} ] && {{ ! cmp -s {guard} {loaded} || '
            '{{ [ -e {cred} ] && ! cmp -s {cred} {loaded_cred}; }}; }}; then '
            'cp {guard} {loaded} && {{ cp {cred} {loaded_cred} 2>/dev/null || true; }} && '
            'squid -k reconfigure -f {conf} || exit 1; sleep 1; i=0; '
            'until grep -q " {listen} [0-9A-F]*:[0-9A-F]* 0A " /proc/net/tcp; do '
            'i=$((i + 1)); [ "$i" -lt {tenths} ] || exit 1; sleep 0.1; done; fi'
            ).format(pid=PEEK_PID, guard=_rules.CONTAINER_GUARD, loaded=PEEK_LOADED_GUARD, conf=PEEK_CONFIG,
                     cred=PEEK_CREDENTIALS, loaded_cred=PEEK_LOADED_CREDENTIALS, listen=PEEK_LISTEN,
                     tenths=PEEK_WAIT_TENTHS)
    return ['sh', '-c', 'cp %s %s && { %s; } && %s' % (
        _rules.CONTAINER_ALLOWLIST, LOADED_ALLOWLIST, peek, relisten_script(_rules.CONTAINER_RULES))]


# squid's job port as /proc/net/tcp and tcp6 write it (00000000:0C38, or [::]'s 32 hex digits where the proxy has
# IPv6 and squid's one socket is dual-stack); state 0A is LISTEN, field 10 the inode.
PROXY_LISTEN = ':%04X' % _rules.PROXY_PORT
RELISTEN_WAIT_TENTHS = 150
_LISTENER = ('cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk -v old="$1" '
             '\'$2 ~ /%s$/ && $4 == "0A" && $10 != old {f = 1; print $10} END {exit !f}\'')


def relisten_script(conf: str) -> str:
    """``squid -k reconfigure -f conf``, then wait (bounded) until squid listens on the job port again.

    Measured on the proxy image: ``squid -k reconfigure`` returns once the signal is sent; squid then closes its
    listening socket and opens a new one, and a job's connection in between is refused (curl exit 7, seen
    under load right after a reload). The wait is for a listener whose inode differs from the one before the
    signal, so the old socket, still open for a moment after the signal, does not count. Exits 1 when squid
    does not listen again within ~15 s.
    """
    listener = _LISTENER % PROXY_LISTEN
    return ('set -- "$({listener} | head -n 1)"; old="$1"; squid -k reconfigure -f {conf} || exit 1; '
            'i=0; until set -- "$old" && {listener} >/dev/null; do i=$((i + 1)); '
            '[ "$i" -lt {tenths} ] || {{ echo "squid did not listen on port {port} again within '
            '$((i / 10)) s of the reconfigure" >&2; exit 1; }}; sleep 0.1; done'
            ).format(listener=listener, conf=conf, tenths=RELISTEN_WAIT_TENTHS, port=_rules.PROXY_PORT)


def mounted_digests_cmd(destinations: Iterable[str]) -> List[str]:
    return ['sha256sum', '--'] + list(destinations)


def parse_digests(output: str) -> Dict[str, str]:
    """{path: sha256} from sha256sum output."""
    found = {}
    for line in output.splitlines():
        parts = line.strip().split(None, 1)
        if len(parts) == 2 and len(parts[0]) == 64:
            found[parts[1].lstrip('*')] = parts[0]
    return found


def stale_mounts(spec: Dict[str, Any], inside: Dict[str, str]) -> List[Tuple[str, str]]:
    """Mounted files whose content inside the proxy differs from the file on disk.

    A single-file bind mount pins the inode it was made with: a file saved by
    rename (``sed -i``, an editor, ``lineinfile``, ``template``) is a new inode
    the running proxy never sees, so squid keeps reading the old content.
    ``inside`` is :func:`parse_digests` of the proxy's view. Returns
    [(host path, container path)].
    """
    stale = []
    for src, dst in spec['mounts']:
        try:
            with open(src, 'rb') as handle:
                disk = hashlib.sha256(handle.read()).hexdigest()
        except (IOError, OSError):
            continue
        if dst in inside and inside[dst] != disk:
            stale.append((src, dst))
    return stale


def allowlist_problems(path: str) -> List[_allowlist.AllowlistProblem]:
    """Every refusal of the allowlist at ``path`` (AllowlistProblem), or a one-line problem for an unreadable file."""
    if os.path.islink(path):
        return [_allowlist.AllowlistProblem(path, 0, '', 'is a symlink',
                                            'replace it with the real file (the proxy mounts it as a single file)')]
    try:
        with open(path, 'r') as handle:
            text = handle.read()
    except (IOError, OSError) as exc:
        return [_allowlist.AllowlistProblem(path, 0, '', 'cannot be read (%s)' % exc,
                                            'lay out the deployment folder (playbooks/site.yml)')]
    return _allowlist.parse(text, path).errors


def check_sources(deploy_paths: Dict[str, str], includes: Sequence[str] = ('endpoints_conf', 'guard_conf')) -> None:
    """Raise SourcesRefused unless the allowlist parses and every present include is a regular file.

    ``deploy_paths`` is :func:`_deployment.paths` output; ``includes`` the keys of the include
    files the proxy reads (a missing include is the mount check's business, not this one's).
    """
    errors = allowlist_problems(deploy_paths['allowlist'])
    if errors:
        raise SourcesRefused('The allowlist is refused, so the proxy was not started or reloaded on it (squid keeps '
                             'its last good file):\n%s' % '\n'.join('  - %s' % e for e in errors),
                             [e.as_dict() for e in errors])
    for key in includes:
        path = deploy_paths.get(key)
        if path and os.path.lexists(path) and (os.path.islink(path) or not os.path.isfile(path)):
            raise SourcesRefused('%s is a symlink or not a regular file, so the proxy was not reloaded (squid keeps '
                                 'its last good rules). Replace it with the real file.' % path,
                                 [dict(path=path, line=0, text='', reason='is a symlink or not a regular file',
                                       fix='replace it with the real file',
                                       message='%s: is a symlink or not a regular file' % path)])


def digests(deploy_paths: Dict[str, str], keys: Sequence[str] = ('rules', 'allowlist', 'endpoints_conf', 'guard_conf')
            ) -> Dict[str, str]:
    """{path: sha256} of the source files that exist: the record of what squid read at a reload."""
    found = {}
    for key in keys:
        path = deploy_paths.get(key)
        if path and os.path.isfile(path):
            with open(path, 'rb') as handle:
                found[path] = hashlib.sha256(handle.read()).hexdigest()
    return found


def reload(container: Any, deploy_paths: Optional[Dict[str, str]] = None, parse_first: bool = True) -> Dict[str, Any]:
    """The one reload path (see the module docstring). Returns the record of what squid read.

    ``deploy_paths`` None skips step 1 (the caller has just checked the sources itself).
    Raises SourcesRefused or ParseRefused (nothing reloaded) or ProxyError (reconfigure failed).
    """
    if deploy_paths is not None:
        check_sources(deploy_paths)
    record = dict(parsed=False, reconfigured=False, files=digests(deploy_paths) if deploy_paths else {})
    if parse_first:
        rc, out = dc.exec_in(container, PARSE_CMD)
        if rc != 0:
            raise ParseRefused('squid refused its rules (squid -k parse exited %s), so the proxy was not reloaded '
                               'and keeps its last good rules. squid said:\n%s' % (rc, _tail(out)))
        record['parsed'] = True
    rc, out = dc.exec_in(container, reconfigure_cmd())
    if rc != 0:
        raise ProxyError('squid -k reconfigure exited %s: %s' % (rc, _tail(out)))
    record['reconfigured'] = True
    return record


def reload_family(client: Any, container: Any, deploy_paths: Optional[Dict[str, str]] = None,
                  parse_first: bool = True) -> Dict[str, Any]:
    """reload() in the proxy ``container``, then in each of its running shards (they mount the same files).

    The proxy goes first and a refusal there (SourcesRefused, ParseRefused) stops everything: no
    shard is touched. A shard that fails is reported in ``members`` and the others still reload.
    Returns the proxy's record plus ``members``: [{name, reconfigured, error}] for the proxy and
    every running shard. Raises ProxyError after the last shard when any shard failed.
    """
    record = reload(container, deploy_paths, parse_first=parse_first)
    record['members'] = [dict(name=container.name, reconfigured=True, error=None)]
    failed = []
    for member in _shards.members(client, container.name):
        if not member.is_shard or not member.running:
            continue
        try:
            shard = client.containers.get(member.name)
            reload(shard, None, parse_first=parse_first)
            record['members'].append(dict(name=member.name, reconfigured=True, error=None))
        except Exception as exc:  # one shard's failure must not stop the others
            record['members'].append(dict(name=member.name, reconfigured=False, error=str(exc)))
            failed.append('%s (%s)' % (member.name, exc))
    if failed:
        raise ProxyError('The proxy reloaded, but %d shard(s) did not: %s. docker exec <shard> squid -k '
                         'reconfigure reloads one by hand.' % (len(failed), '; '.join(failed)))
    return record


def _tail(text: Optional[str], lines: int = 15) -> str:
    return '\n'.join((text or '').strip().splitlines()[-lines:])
