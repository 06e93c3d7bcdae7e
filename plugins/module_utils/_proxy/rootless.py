# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""A rootless engine's account: what it can reach on the host, and who the proxy user is there (docs/podman.md).

Rootless Podman runs as a service account. It mounts the deployment's files as that account, inside a user
namespace where it is root only over the ids it maps (the account's own and its subordinate range), so a
folder the account cannot search (a root-only 0700 folder above the deployment) makes the container's
creation fail halfway with "permission denied". And squid's user in the proxy (uid 13) is a subordinate id of
the account on the host (measured: 100012 for ``subuid 100000:65536``), not host uid 13: a mounted file must be
readable by that id, and the decision log folder must belong to it.

The engine says both in its own info (libpod ``host.idMappings``): :func:`engine_ids` asks it once per
client; the rest is pure (``stat`` is a parameter) and unit-tested without a daemon. Only Podman says its
mappings; a rootless Docker Engine does not, and is treated as before.
"""

from __future__ import annotations

import os
import pwd
import stat as _stat
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import venue as _venue

SEARCH = 0o1
READ = 0o4
DEFAULT_DEPLOY_DIR = '/opt/pi-dispatch/egress'


def host_id(mapping: Sequence[Dict[str, int]], container_id: int) -> Optional[int]:
    """The host id of ``container_id`` under ``mapping`` (``[{container_id, host_id, size}]``), or None."""
    for entry in mapping:
        first, size = entry['container_id'], entry['size']
        if first <= container_id < first + size:
            return entry['host_id'] + container_id - first
    return None


def _mapped(mapping: Sequence[Dict[str, int]], host: int) -> bool:
    return any(entry['host_id'] <= host < entry['host_id'] + entry['size'] for entry in mapping)


class Ids(object):
    """The uid and gid mappings of a rootless engine; ``uid``/``gid`` are its account's own."""

    def __init__(self, uidmap: Sequence[Dict[str, int]], gidmap: Sequence[Dict[str, int]]) -> None:
        self.uidmap = list(uidmap)
        self.gidmap = list(gidmap)
        self.uid = host_id(self.uidmap, 0)
        self.gid = host_id(self.gidmap, 0)

    def host_uid(self, container_uid: int) -> Optional[int]:
        return host_id(self.uidmap, container_uid)

    def host_gid(self, container_gid: int) -> Optional[int]:
        return host_id(self.gidmap, container_gid)

    def maps(self, uid: int, gid: int) -> bool:
        """Whether a file owned by ``uid:gid`` is the engine's to override: its root holds capabilities over an
        inode only when both its owner and its group are mapped into the namespace."""
        return _mapped(self.uidmap, uid) and _mapped(self.gidmap, gid)


def _mapping(raw: Any) -> Optional[List[Dict[str, int]]]:
    if not isinstance(raw, list) or not raw:
        return None
    entries = []
    for entry in raw:
        try:
            entries.append(dict((key, int(entry[key])) for key in ('container_id', 'host_id', 'size')))
        except (KeyError, TypeError, ValueError):
            return None
    return entries


def parse_info(info: Any) -> Optional[Ids]:
    """The :class:`Ids` from Podman's ``GET /libpod/info``, or None when it is not rootless or says no mappings.

    Pure. Mappings that leave the account (container id 0) or the proxy user unmapped are not used.
    """
    host = (info or {}).get('host') if isinstance(info, dict) else None
    if not isinstance(host, dict) or not (host.get('security') or {}).get('rootless'):
        return None
    maps = host.get('idMappings') or {}
    uidmap, gidmap = _mapping(maps.get('uidmap')), _mapping(maps.get('gidmap'))
    if uidmap is None or gidmap is None:
        return None
    ids = Ids(uidmap, gidmap)
    return ids if ids.uid is not None and ids.gid is not None else None


_ATTR = '_pi_egress_rootless_ids'
_UNKNOWN = object()


def engine_ids(client: Any) -> Optional[Ids]:
    """The mappings of the rootless Podman behind ``client`` (asked once per client), else None."""
    if client is None:
        return None
    known = getattr(client, _ATTR, _UNKNOWN)
    if known is not _UNKNOWN:
        return known
    found = None
    venue = _venue.venue(client)
    if venue.is_podman and venue.rootless:
        api = client.api
        try:
            response = api.get(api.base_url + '/v4.0.0/libpod/info', timeout=30)
            response.raise_for_status()
            found = parse_info(response.json())
        except Exception:  # the engine then fails the create with its own words
            found = None
    try:
        setattr(client, _ATTR, found)
    except AttributeError:  # pragma: no cover - a client type that refuses attributes is asked again
        pass
    return found


def _account(ids: Ids) -> Tuple[str, List[int]]:
    """The account's name and its groups on this host (the uid alone when it has no password entry)."""
    try:
        entry = pwd.getpwuid(ids.uid)
    except KeyError:
        return 'uid %d' % ids.uid, [ids.gid]
    return entry.pw_name, sorted(set(os.getgrouplist(entry.pw_name, ids.gid)) | set([ids.gid]))


def permits(st: os.stat_result, uid: int, groups: Iterable[int], want: int) -> bool:
    """Whether ``uid`` (in ``groups``) gets ``want`` (READ, SEARCH) on an inode by its mode bits. Pure.

    The owner's bits alone decide for the owner, the group's for a member, the others' for the rest.
    """
    mode = st.st_mode
    if st.st_uid == uid:
        return bool((mode >> 6) & want)
    if st.st_gid in set(groups):
        return bool((mode >> 3) & want)
    return bool(mode & want)


def _folders_above(path: str) -> List[str]:
    """Every folder from ``/`` down to the one holding ``path``."""
    folders = []
    folder = os.path.dirname(os.path.normpath(path))
    while True:
        folders.append(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return list(reversed(folders))


def _search_refusal(path: str, what: str, ids: Ids, account: str, groups: Sequence[int],
                    stat: Callable[[str], os.stat_result]) -> Optional[str]:
    for folder in _folders_above(path):
        try:
            st = stat(folder)
        except OSError:
            return None   # not there (yet): made by the deploy, or refused as missing with its own fix
        if permits(st, ids.uid, groups, SEARCH) or ids.maps(st.st_uid, st.st_gid):
            continue
        return ('The engine runs rootless as %s (uid %d), which cannot search %s (mode %04o, owner uid %d, group '
                '%d): it could not mount %s into the proxy. Let the account through (chmod o+x %s, or a group it is '
                'in), or deploy under a folder it can reach (the default %s is 0755)'
                % (account, ids.uid, folder, _stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, what, folder,
                   DEFAULT_DEPLOY_DIR))
    return None


def mount_refusal(files: Iterable[str], log_dir: Optional[str], ids: Ids, proxy_uid: int = 13,
                  account: Optional[str] = None, groups: Optional[Sequence[int]] = None,
                  stat: Optional[Callable[[str], os.stat_result]] = None) -> Optional[str]:
    """Why the rootless engine of ``ids`` could not run the proxy on these mounts, or None. Reads modes only.

    ``files``: the read-only single-file mounts: every folder above each must be searchable by the account, and
    each file readable by the proxy user as the engine maps it. ``log_dir``: the decision log folder (made and
    given to the proxy user by the deploy): the folders above it that exist must be searchable.
    """
    stat = stat or os.stat
    if account is None or groups is None:
        account, groups = _account(ids)
    proxy = ids.host_uid(proxy_uid), ids.host_gid(proxy_uid)
    for path in files:
        refusal = _search_refusal(path, path, ids, account, groups, stat)
        if refusal:
            return refusal
        try:
            st = stat(path)
        except OSError:
            continue   # missing: refused by the caller with the layout's fix
        if proxy[0] is not None and not permits(st, proxy[0], [proxy[1]], READ):
            return ('%s is mode %04o, owner uid %d, group %d: the proxy\'s user (uid %d in the container, uid %d on '
                    'this host under the rootless engine) cannot read it. Make it readable (chmod o+r %s; the '
                    'deployment writes its files 0644)'
                    % (path, _stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, proxy_uid, proxy[0], path))
    if log_dir:
        return _search_refusal(log_dir, 'the decision log folder %s' % log_dir, ids, account, groups, stat)
    return None
