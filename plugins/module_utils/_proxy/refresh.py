# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""Refreshing ``deploy/egress-proxy.conf`` from the packaged copy, with backup.

The rules file is create-only: an upgrade never rewrites it on its own. This
module is the explicit, operator-asked refresh (the ``pi-dispatch up`` refresh):

* :func:`compare` tells whether the folder's copy differs from the packaged
  copy, with a unified diff naming both files;
* :func:`backup_name` names the backup ``<file>.bak-YYYYMMDDTHHMMSSZ`` (UTC).
  An existing backup is never overwritten: when that name is taken (two
  refreshes in the same second, or a file left by hand) the first free of
  ``<name>.1``, ``<name>.2`` ... ``<name>.999`` is used instead, and the backup
  itself is created exclusively (O_EXCL), so even a race cannot overwrite one;
* :func:`refresh` copies the current file to the backup, writes the packaged
  copy to a temporary file beside it, fsyncs it and renames it into place.
  The proxy mounts the rules as a single file, so a rename is invisible to a
  running squid (it keeps the inode it started with); the proxy must be
  restarted or recreated to read the new rules, which :func:`decide` plans;
* :func:`restore` puts a backup back the same way (the rollback);
* :func:`decide` is the pure decision table: proxy state x refresh asked x
  consent -> the action.

Every refusal (``deploy/`` or the file a symlink, the file not a regular file
or missing) raises :class:`RefreshError` before anything is written.
"""

from __future__ import annotations

import datetime
import difflib
import errno
import os
import stat
from typing import Any, Callable, Dict, List, Optional, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import files as _files
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import rules as _rules

BACKUP_INFIX = '.bak-'
TIMESTAMP_FORMAT = '%Y%m%dT%H%M%SZ'
MAX_COLLISION_SUFFIX = 999

PACKAGED_NAME = 'pi_dispatch.egress plugins/module_utils/_policy/rules.py (packaged rules, version %d)' % \
    _rules.RULES_VERSION

# Proxy states as the decision table sees them.
RUNNING, PAUSED, STOPPED, MISSING = 'running', 'paused', 'stopped', 'missing'
PROXY_STATES = (RUNNING, PAUSED, STOPPED, MISSING)


class RefreshError(Exception):
    pass


# --- naming --------------------------------------------------------------------
def timestamp(now: Optional[datetime.datetime] = None) -> str:
    """UTC timestamp as used in backup names (``now`` may be naive UTC or aware)."""
    if now is None:
        now = datetime.datetime.now(datetime.timezone.utc)
    elif now.tzinfo is not None:
        now = now.astimezone(datetime.timezone.utc)
    return now.strftime(TIMESTAMP_FORMAT)


def backup_name(path: str, now: Optional[datetime.datetime] = None,
                exists: Callable[[str], bool] = os.path.lexists) -> str:
    """The first free backup name for ``path``: ``<path>.bak-<ts>``, else ``.1`` ... ``.999``."""
    base = path + BACKUP_INFIX + timestamp(now)
    if not exists(base):
        return base
    for n in range(1, MAX_COLLISION_SUFFIX + 1):
        candidate = '%s.%d' % (base, n)
        if not exists(candidate):
            return candidate
    raise RefreshError('Every backup name %s, %s.1 ... %s.%d is taken; move old backups away and rerun.'
                       % (base, base, base, MAX_COLLISION_SUFFIX))


def is_backup_of(path: str, candidate: str) -> bool:
    return os.path.basename(candidate).startswith(os.path.basename(path) + BACKUP_INFIX)


# --- refusals ------------------------------------------------------------------
def rules_path(deploy_dir: str) -> str:
    return _deployment.paths(os.path.normpath(deploy_dir))['rules']


def check_target(deploy_dir: str) -> str:
    """Refuse a symlinked deploy/ or rules file, or a rules file that is not a regular file.

    Returns the rules path. Raises RefreshError; nothing is written either way.
    """
    try:
        path = _deployment.Layout(deploy_dir).rules
    except _deployment.DeploymentError as exc:
        raise RefreshError(str(exc))
    folder = os.path.dirname(path)
    for candidate, what in ((folder, 'The rules folder'), (path, 'The rules file')):
        try:
            _deployment.refuse_symlinked_path(candidate, what)
        except _deployment.DeploymentError as exc:
            raise RefreshError('%s Nothing was written.' % exc)
    if not os.path.isdir(folder):
        raise RefreshError('The rules folder %s does not exist or is not a directory. Lay out the deployment '
                           'folder first (pi_dispatch.egress.egress_deployment or playbooks/site.yml).' % folder)
    if not os.path.lexists(path):
        raise RefreshError('The rules file %s does not exist. Lay out the deployment folder first '
                           '(pi_dispatch.egress.egress_deployment creates it from the packaged copy).' % path)
    if not stat.S_ISREG(os.lstat(path).st_mode):
        raise RefreshError('The rules file %s is not a regular file; move it away (the deployment role then '
                           'creates the packaged copy) and rerun. Nothing was written.' % path)
    return path


def _read(path: str) -> str:
    with open(path, 'r') as handle:
        return handle.read()


# --- comparison ------------------------------------------------------------------
def unified_diff(current: str, packaged: str, path: str, packaged_name: str = PACKAGED_NAME) -> str:
    return ''.join(difflib.unified_diff(current.splitlines(True), packaged.splitlines(True),
                                        fromfile=path, tofile=packaged_name))


def compare(deploy_dir: str, packaged: Optional[str] = None, packaged_name: str = PACKAGED_NAME) -> Dict[str, Any]:
    """Compare the folder's rules with the packaged copy (or ``packaged``)."""
    path = check_target(deploy_dir)
    if packaged is None:
        packaged = _rules.packaged_rules()
    current = _read(path)
    differs = _rules.digest(current) != _rules.digest(packaged)
    return dict(
        path=path,
        packaged_name=packaged_name,
        differs=differs,
        current=current,
        packaged=packaged,
        diff=unified_diff(current, packaged, path, packaged_name) if differs else '',
        current_includes_endpoints=_rules.includes_endpoints(current),
        packaged_includes_endpoints=_rules.includes_endpoints(packaged),
        current_digest=_rules.digest(current),
        packaged_digest=_rules.digest(packaged),
    )


# --- writing ---------------------------------------------------------------------
def _create_backup(path: str, now: Optional[datetime.datetime] = None) -> str:
    """Copy ``path`` to a fresh backup (exclusive create). Returns the backup path."""
    st = os.lstat(path)
    data = _read(path)
    for _attempt in range(MAX_COLLISION_SUFFIX + 1):
        name = backup_name(path, now)
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, stat.S_IMODE(st.st_mode))
        except OSError as exc:
            if exc.errno == errno.EEXIST:  # taken between the check and the create: next name
                continue
            raise RefreshError('Creating the backup %s failed: %s. Nothing was changed.' % (name, exc))
        try:
            with os.fdopen(fd, 'w') as handle:
                handle.write(data)
                handle.flush()
                _files.keep_owner(handle.fileno(), st)
                os.fsync(handle.fileno())
        except OSError as exc:
            # A backup holds the whole old file or does not exist: a partial one would be restored as rules.
            try:
                os.unlink(name)
                left = 'the partial backup was removed'
            except OSError as exc2:
                left = 'removing the partial backup ALSO failed (%s): delete %s, it is not a whole copy' % (exc2, name)
            raise RefreshError('Writing the backup %s failed: %s; %s. The rules file %s was not touched. Free the '
                               'disk (or fix the error), then run again.' % (name, exc, left, path))
        return name
    raise RefreshError('Could not find a free backup name beside %s; nothing was changed.' % path)


def read_source(source: Optional[str]) -> Tuple[Optional[str], str]:
    """(text, name) of the rules to compare against: the packaged copy, or the file ``source`` names.

    RefreshError for a source that is missing, a symlink or not a regular file (nothing was read).
    """
    if not source:
        return None, PACKAGED_NAME
    if os.path.islink(source) or not os.path.isfile(source):
        raise RefreshError('source %s is missing, a symlink or not a regular file.' % source)
    with open(source, 'r') as handle:
        return handle.read(), source


def plan_refresh(deploy_dir: str, packaged: Optional[str] = None, now: Optional[datetime.datetime] = None,
                 packaged_name: str = PACKAGED_NAME) -> Dict[str, Any]:
    """What a refresh would do (check mode): the comparison plus the backup it would make."""
    result = compare(deploy_dir, packaged, packaged_name)
    result['backup'] = backup_name(result['path'], now) if result['differs'] else None
    return result


def refresh(deploy_dir: str, packaged: Optional[str] = None, now: Optional[datetime.datetime] = None,
            packaged_name: str = PACKAGED_NAME) -> Dict[str, Any]:
    """Back up the folder's rules and put the packaged copy in place (only when they differ).

    Returns the comparison plus ``backup`` (None when nothing differed) and ``changed``.
    """
    result = compare(deploy_dir, packaged, packaged_name)
    result['backup'] = None
    result['changed'] = False
    if not result['differs']:
        return result
    path = result['path']
    backup = _create_backup(path, now)
    try:
        _files.write_atomic(path, result['packaged'])
    except OSError as exc:
        try:
            os.unlink(backup)
            left = 'the backup made for it (%s, the same content) was removed again' % backup
        except OSError as exc2:
            left = 'the backup %s (a whole copy of it) could not be removed (%s)' % (backup, exc2)
        raise RefreshError('Writing the packaged rules into %s failed: %s. The file is unchanged and %s. Free '
                           'the disk (or fix the error), then run again.' % (path, exc, left))
    result['backup'] = backup
    result['changed'] = True
    return result


def restore(deploy_dir: str, backup: str, check_mode: bool = False) -> Dict[str, Any]:
    """Roll back: put ``backup`` back as the rules file (atomically). Returns a result dict."""
    path = check_target(deploy_dir)
    if not is_backup_of(path, backup) or os.path.dirname(os.path.abspath(backup)) != os.path.dirname(path):
        raise RefreshError('%s is not a backup of %s (expected %s%s<timestamp> beside it); nothing was written.'
                           % (backup, path, os.path.basename(path), BACKUP_INFIX))
    if os.path.islink(backup) or not os.path.isfile(backup):
        raise RefreshError('The backup %s is missing, a symlink or not a regular file; nothing was written. '
                           'Restore the rules by hand from another backup beside it.' % backup)
    old = _read(backup)
    current = _read(path)
    changed = _rules.digest(old) != _rules.digest(current)
    if changed and not check_mode:
        try:
            _files.write_atomic(path, old, like=path)
        except OSError as exc:
            raise RefreshError('Restoring %s from %s failed: %s' % (path, backup, exc))
    return dict(path=path, backup=backup, changed=changed,
                diff=unified_diff(current, old, path, backup) if changed else '')


# --- the decision table ----------------------------------------------------------
def proxy_facts(obs: Optional[Dict[str, Any]]) -> Tuple[str, bool, int]:
    """(state, two_mount, job_count) from ``_proxy_spec.observed`` output (None when missing)."""
    if obs is None:
        return MISSING, False, 0
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import spec as _proxy_spec
    if obs['paused']:
        state = PAUSED
    elif obs['running']:
        state = RUNNING
    else:
        state = STOPPED
    return state, not _proxy_spec.mounts_endpoints(obs), len(obs['job_networks'])


def _plural(n: int) -> str:
    return '%d job%s' % (n, '' if n == 1 else 's')


def decide(state: str, two_mount: bool, differs: bool, refresh: bool, jobs: int = 0, allow_cut_jobs: bool = False,
           allow_replace: bool = False, current_includes_endpoints: bool = False) -> Dict[str, Any]:
    """The action for one host. Pure.

    ``state``: running / paused / stopped / missing; ``two_mount``: the proxy
    mounts only the rules and the allowlist (made before model endpoints);
    ``differs``: the folder's rules differ from the packaged copy;
    ``refresh``: the operator asked for the refresh; ``jobs``: job networks
    attached; the two consents. ``current_includes_endpoints`` matters only
    for a two-mount proxy whose rules are already the new ones.

    Returns dict(action, write, proxy_state, proxy_step, refuse, jobs_cut, mount_endpoints_before, message).
    ``write``: refresh the rules file; ``proxy_state``: the egress_proxy
    state to ask for afterwards (None: leave the proxy alone).
    """
    if state not in PROXY_STATES:
        raise ValueError('unknown proxy state %r' % (state,))
    two_mount = bool(two_mount) and state != MISSING
    live = state in (RUNNING, PAUSED)
    cuts = jobs if live else 0
    out = dict(action='none', write=False, proxy_state=None, proxy_step=None, refuse=False,
               jobs_cut=0, mount_endpoints_before=not two_mount, message='')

    def refuse(reasons: List[str]) -> Dict[str, Any]:
        out.update(action='refuse-needs-consent', refuse=True, jobs_cut=cuts,
                   message='Refused, nothing written: %s.' % '; '.join(reasons))
        return out

    def consent(step: str) -> List[str]:
        reasons = []
        if step == 'replace' and not allow_replace:
            reasons.append('the proxy mounts only two files (made before model endpoints), so the new rules need '
                           'its replacement as one step with the refresh; set egress_upgrade_allow_replace '
                           '(allow_replace) to consent')
        if cuts and not allow_cut_jobs:
            reasons.append('the %s would cut %s attached to it (their tunnels drop); set '
                           'egress_upgrade_allow_cut_jobs (allow_cut_jobs) to consent, or wait until they end'
                           % ('replacement' if step == 'replace' else 'restart', _plural(cuts)))
        return reasons

    needs_new_rules = differs and refresh
    if two_mount and (needs_new_rules or (refresh and current_includes_endpoints)):
        reasons = consent('replace')
        if reasons:
            return refuse(reasons)
        out.update(action='refresh+replace' if needs_new_rules else 'replace', write=needs_new_rules,
                   proxy_state='started', proxy_step='replace', jobs_cut=cuts,
                   message='%sreplace the two-mount proxy with one that mounts model-endpoints.conf%s.'
                           % ('refresh the rules and ' if needs_new_rules else '',
                              ' (cuts %s, reconnected after)' % _plural(cuts) if cuts else ''))
        return out
    if two_mount and current_includes_endpoints:
        out.update(action='warn-needs-replace',
                   message='The rules include model-endpoints.conf but the proxy mounts only two files: its next '
                           'restart would exit. Run the upgrade with refresh and egress_upgrade_allow_replace.')
        return out
    if needs_new_rules:
        step = {RUNNING: 'restart', PAUSED: 'unpause+restart', STOPPED: 'start', MISSING: 'create'}[state]
        if live:
            reasons = consent(step)
            if reasons:
                return refuse(reasons)
        out.update(action='refresh+' + step, write=True, jobs_cut=cuts, proxy_step=step,
                   proxy_state='restarted' if live else 'started',
                   message='refresh the rules, then %s the proxy so squid reads them%s.'
                           % (step.replace('+', ' and '), ' (cuts %s)' % _plural(cuts) if cuts else ''))
        return out
    if state == MISSING:
        out.update(action='warn-differs+create' if differs else 'create', proxy_state='started', proxy_step='create',
                   message='create the missing proxy%s.' % (
                       ' on the current (differing) rules; refresh not asked' if differs else ''))
        return out
    if differs:
        out.update(action='warn-differs',
                   message='The rules differ from the packaged copy and the refresh was not asked for; the copy '
                           'still enforces the allowlist. Set egress_upgrade_refresh_rules (refresh) to take it.')
        return out
    out['message'] = 'rules are the packaged copy; proxy left as it is.'
    return out
