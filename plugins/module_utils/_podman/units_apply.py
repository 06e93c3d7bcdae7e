# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""What ``egress_podman_units`` does: the proxy's wanted shape, its two unit files, written when they differ.

The shape is ``egress_proxy``'s own (``_proxy/deploy.wanted_spec``, then ``spec.for_venue`` for
Podman), so the container systemd starts is the one the drift comparison wants. The files are
Quadlet's (``format`` ``quadlet``, Podman 4.4 and later) or plain systemd services that run
``podman`` (``format`` ``systemd``, Podman 4.3: :mod:`systemd_units`). They are written atomically
(temporary file, rename) into the folder where Quadlet or systemd reads them, the system's or the
account's; a symlink or a directory where a unit file goes is refused and nothing is written. Running
systemd (``daemon-reload``, start, restart) is the role's, not this module's.
"""

from __future__ import annotations

import os
import stat
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import files as _files
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import venue as _venue
from ansible_collections.pi_dispatch.egress.plugins.module_utils._podman import account as _account
from ansible_collections.pi_dispatch.egress.plugins.module_utils._podman import quadlet as _quadlet
from ansible_collections.pi_dispatch.egress.plugins.module_utils._podman import systemd_units as _systemd
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import deploy as _deploy
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import spec as _spec

UPSTREAM_LABELS = {_spec.LABEL_NETWORK_ROLE: 'upstream'}
# format: (the system's folder, the account's under its home, the renderer)
FORMATS = {
    'quadlet': (_quadlet.SYSTEM_UNITS_DIR, _quadlet.USER_UNITS_DIR, _quadlet),
    'systemd': (_systemd.SYSTEM_UNITS_DIR, _systemd.USER_UNITS_DIR, _systemd),
}


class UnitsError(Exception):
    """Refused before anything was written: the message names the setting or the file and the fix."""


def units_dir(scope: str, account: Optional[str], given: Optional[str],
              fmt: str = 'quadlet') -> Tuple[str, Optional[Any]]:
    """(folder, the account's password entry or None) where Quadlet (or systemd) reads this scope's units."""
    entry = None
    if scope == 'user':
        if not account:
            raise UnitsError('scope user needs account (the service account whose Podman runs the proxy)')
        try:
            entry = _account.entry(account)
        except _account.AccountError as exc:
            raise UnitsError(str(exc)) from None
    if given:
        return given, entry
    system, user, _renderer = FORMATS[fmt]
    if scope == 'user':
        return os.path.join(entry.pw_dir, user), entry
    return system, entry


def host_cgroup_version(root: str = '/sys/fs/cgroup') -> str:
    """``2`` when ``root`` is the unified cgroup v2 tree (it has ``cgroup.controllers``), else ``1`` (v1 or hybrid)."""
    return '2' if os.path.exists(os.path.join(root, 'cgroup.controllers')) else '1'


def cgroups_for(scope: str, cgroup_version: str, root: str = '/sys/fs/cgroup') -> Optional[str]:
    """The ``--cgroups`` mode of a unit of ``scope`` (``quadlet.unit_cgroups``); ``auto`` reads this host."""
    version = host_cgroup_version(root) if cgroup_version == 'auto' else cgroup_version
    return _quadlet.unit_cgroups(scope, version)


def manager_args(scope: str, account: Optional[str]) -> List[str]:
    """What systemctl and journalctl need to reach the units' manager: none for the system's."""
    return ['--user', '-M', '%s@' % account] if scope == 'user' else []


def venue_refusal(scope: str, account: Optional[str], found: Any) -> Optional[str]:
    """Why the units' manager and the engine ``found`` (a ``venue.Venue``) are not the same Podman; None when
    they are. Units of one manager would start a container in another Podman than the one a module checks."""
    if scope == 'user' and not found.rootless:
        return ('units_scope user: the units would run under %s\'s user manager and its rootless Podman, but the '
                'engine reached is %s; point docker_host at the account\'s socket (the role '
                'pi_dispatch.egress.podman_account sets egress_docker_host), or use units_scope system'
                % (account, found.describe()))
    if scope == 'system' and found.rootless:
        return ('units_scope system: the system manager\'s units run the rootful Podman, but the engine reached '
                'is %s; set units_scope user and units_account to the account whose socket this is'
                % found.describe())
    return None


def wanted_spec(params: Dict[str, Any], deploy_paths: Dict[str, str]) -> Dict[str, Any]:
    """The proxy's shape the units say: ``egress_proxy``'s, for Podman, restarted by systemd (``for_unit``).

    The decision log is carried as ``egress_proxy`` carries it (its folder mounted read-write, its rotation in
    the environment) when the options ask for it; ``egress_podman_units`` alone has no such option, and its
    units mount none. ``cgroups`` (``quadlet.unit_cgroups``) overrides Quadlet's ``--cgroups=split`` where
    the account's manager cannot hold it.
    """
    options = dict(params, wait_timeout=1, mount_endpoints=True, shard_bound=None,
                   decision_log=bool(params.get('decision_log')))
    for key in ('decision_log_dir', 'decision_log_max_size', 'decision_log_keep'):
        options[key] = params.get(key)
    try:
        _deploy.check_options(options)
        spec = _deploy.wanted_spec(options, deploy_paths)
        spec = _spec.for_venue(spec, _venue.Venue(_venue.PODMAN))
    except _spec.ProxyError as exc:
        raise UnitsError(str(exc)) from None
    if '/' not in spec['image'].split(':', 1)[0]:
        # A name Podman built or loaded here is localhost/<name>; Quadlet warns on a short name.
        spec = dict(spec, image='localhost/' + spec['image'])
    if params.get('cgroups'):
        spec = dict(spec, unit_cgroups=params['cgroups'])
    return _quadlet.for_unit(spec)


def wanted_files(params: Dict[str, Any], deploy_paths: Dict[str, str]) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """(the shape, {file name: content} of the two units) for the module's options."""
    spec = wanted_spec(params, deploy_paths)
    fmt = params.get('format') or 'quadlet'
    renderer = FORMATS[fmt][2]
    container, network = renderer.unit_names(spec)
    try:
        if fmt == 'systemd':
            network_text = renderer.network_unit(spec, params['network_internal'], UPSTREAM_LABELS, params['scope'])
        else:
            network_text = renderer.network_unit(spec, params['network_internal'], UPSTREAM_LABELS)
        return spec, {container: renderer.container_unit(spec, params['scope']), network: network_text}
    except _quadlet.QuadletError as exc:
        raise UnitsError(str(exc)) from None


def _current(path: str) -> Optional[str]:
    """The unit file's content, None when absent; UnitsError for a symlink or anything not a regular file."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        raise UnitsError('%s is a symlink (to %s); it is refused rather than followed. Remove it, then run again'
                         % (path, os.readlink(path)))
    if not stat.S_ISREG(st.st_mode):
        raise UnitsError('%s is not a regular file; move it away, then run again' % path)
    with open(path, 'rb') as handle:
        return handle.read().decode('utf-8', 'replace')


def apply(params: Dict[str, Any], deploy_paths: Dict[str, str], check_mode: bool = False) -> Dict[str, Any]:
    """Write (or, with state absent, remove) the two units; the module's result."""
    fmt = params.get('format') or 'quadlet'
    folder, entry = units_dir(params['scope'], params.get('account'), params.get('units_dir'), fmt)
    if os.path.islink(folder):
        raise UnitsError('%s is a symlink; the unit folder is refused rather than followed' % folder)
    spec, wanted = wanted_files(params, deploy_paths)
    before, after, changed = {}, {}, []
    for name in sorted(wanted):
        path = os.path.join(folder, name)
        before[name] = _current(path)  # every file is checked before any is written
        after[name] = wanted[name] if params['state'] == 'present' else None
        if before[name] != after[name]:
            changed.append(path)
    if changed and not check_mode:
        if params['state'] == 'present' and not os.path.isdir(folder):
            _make_folder(folder, entry)
        for name in sorted(wanted):
            path = os.path.join(folder, name)
            if path not in changed:
                continue
            if after[name] is None:
                os.unlink(path)
                continue
            _files.write_atomic(path, after[name])
            os.chmod(path, 0o644)
            if entry is not None:
                os.chown(path, entry.pw_uid, entry.pw_gid)
    return dict(
        changed=bool(changed), units_dir=folder, written=changed if params['state'] == 'present' else [],
        removed=changed if params['state'] == 'absent' else [],
        units=[os.path.join(folder, name) for name in FORMATS[fmt][2].unit_names(spec)],
        services=list(_quadlet.service_names(spec)),
        diff=[dict(before=before[name] or '', after=after[name] or '', before_header=os.path.join(folder, name),
                   after_header=os.path.join(folder, name)) for name in sorted(wanted)])


def _make_folder(folder: str, entry: Optional[Any]) -> None:
    """Create the unit folder (and the account's parents under its home, owned by the account)."""
    missing: List[str] = []
    path = folder
    while path and not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for path in reversed(missing):
        os.mkdir(path, 0o755)
        if entry is not None and path.startswith(entry.pw_dir.rstrip('/') + '/'):
            os.chown(path, entry.pw_uid, entry.pw_gid)
