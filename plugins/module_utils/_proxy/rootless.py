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

import contextlib
import os
import pwd
import stat as _stat
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
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


# --- the rootless network keeper (Podman 4) ---------------------------------------------------------------
#
# Rootless Podman 4 runs every bridge network of its account inside one "rootless netns", reached from the host by
# one slirp4netns. Measured with 4.3.1 on this project's CI machine: detaching a RUNNING container from one of its
# networks while no other running container is on a bridge network tears that namespace down (slirp4netns exits,
# the netns file goes), and with slirp4netns goes the only route out of the host: the proxy, detached from a job
# or canary network on an idle host, would have lost its route out for every job until it restarted. With any
# other running container on a bridge network (an --internal one too) the namespace holds, and removing that
# other container afterwards, while the detached one still runs, keeps it. So a detach that would be the last is
# made while a short-lived keeper runs on the network being left.

KEEPER_LABEL = 'pi-dispatch.egress.keeper'
KEEPER_SECONDS = 60   # the keeper exits (and is removed) by itself if its run is killed
_PRIVATE_MODES = frozenset(['host', 'none', 'slirp4netns', 'pasta', 'private', 'bridge'])


def keeper_needed(venue: Any) -> bool:
    """Whether the venue's rootless network needs a keeper through a detach: rootless Podman before 5."""
    major = (_venue.version_tuple(venue.version) or (0,))[0]
    return bool(venue.is_podman and venue.rootless and 0 < major < 5)


def _is(summary: Dict[str, Any], container: str) -> bool:
    """Whether a container summary is ``container`` (a name, or an id or its prefix of 12 or more)."""
    if container in [str(n).lstrip('/') for n in (summary.get('Names') or [])]:
        return True
    return len(container) >= 12 and str(summary.get('Id') or '').startswith(container)


def holds_without(running: Iterable[Dict[str, Any]], leaving: str) -> bool:
    """Whether a running container other than ``leaving`` is on a bridge network of the rootless netns. Pure:
    ``running`` is the engine's list of running containers (``GET /containers/json``)."""
    for summary in running:
        if _is(summary, leaving):
            continue
        networks = ((summary.get('NetworkSettings') or {}).get('Networks') or {})
        if any(name not in _PRIVATE_MODES for name in networks):
            return True
    return False


def _is_running(running: Iterable[Dict[str, Any]], leaving: str) -> bool:
    return any(_is(summary, leaving) for summary in running)


@contextlib.contextmanager
def network_held(client: Any, leaving: str, net: str, image: Optional[str] = None,
                 actions: Optional[List[str]] = None) -> Iterator[Optional[str]]:
    """Around a detach of ``leaving`` from ``net``: on rootless Podman 4, when ``leaving`` runs and no other running
    container holds the account's rootless network, a keeper (``image``, or ``leaving``'s own; ``sleep``, every
    capability dropped, read-only, no-new-privileges) runs on ``net`` for the detach and is removed right after.
    Yields the keeper's name, or None when none was needed. An engine that refuses the keeper raises
    ``dc.EngineError`` before anything was detached."""
    if client is None or not keeper_needed(_venue.venue(client)):
        yield None
        return
    api = client.api
    running = dc.read('Listing the running containers', lambda: api.containers(filters={'status': 'running'}))
    if not _is_running(running or [], leaving) or holds_without(running or [], leaving):
        yield None
        return
    name = '%s-keeper-%d' % (leaving, os.getpid())
    try:
        source = image or api.inspect_container(leaving)['Image']
        created = api.create_container(
            source, [str(KEEPER_SECONDS)], name=name, detach=True, entrypoint=['sleep'], user='65534:65534',
            labels={KEEPER_LABEL: leaving},
            host_config=api.create_host_config(network_mode=net, cap_drop=['ALL'], read_only=True, auto_remove=True,
                                               security_opt=['no-new-privileges:true']))
        api.start(created['Id'])
    except Exception as exc:
        dc.remove_quietly(api, name)  # never made, or gone with auto_remove
        why = dc.api_message(exc)
        raise dc.EngineError('%s runs rootless and %s is the only running container on its rootless network: '
                             'detaching it from %s would tear that network down and cut its other networks '
                             '(Podman 4; docs/podman.md). The keeper that holds it through the detach could not '
                             'start: %s. Nothing was detached.' % (_venue.venue(client).describe(), leaving, net, why))
    if actions is not None:
        actions.append('keeper %s held the rootless network while %s left %s' % (name, leaving, net))
    for _attempt in range(50):   # bounded: started is running almost at once
        try:
            if (api.inspect_container(name).get('State') or {}).get('Running'):
                break
        except Exception:
            break
        time.sleep(0.1)
    try:
        yield name
    finally:
        dc.remove_quietly(api, name)  # it exits and is removed by itself within KEEPER_SECONDS
