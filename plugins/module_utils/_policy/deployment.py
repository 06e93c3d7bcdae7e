# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The deployment folder: ``Layout`` (deploy_dir validated once, every path), the create-only layout.

Every file of the layout is created when missing and otherwise left exactly
as it is (not rewritten, not re-permissioned, not touched). A create is
atomic and exclusive: the content goes to a temporary file beside the
target, which is then hard-linked to the target name, so a concurrent
writer or an existing file always wins and a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import allowlist as _allowlist
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import files as _files
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import rules as _rules

ALLOWLIST = 'egress-allowlist.conf'
RULES = os.path.join('deploy', 'egress-proxy.conf')
ENDPOINTS_JSON = 'model-endpoints.json'
ENDPOINTS_CONF = 'model-endpoints.conf'
GUARD_CONF = 'egress-guard.conf'

DEFAULT_ALLOWLIST = [
    dict(host='api.anthropic.com', comment='the provider: every turn of every job'),
    dict(host='.github.com', comment='your forge: the push and the pull request'),
    dict(host='registry.npmjs.org', comment="only when a job installs the serviced repo's own dependencies"),
]

DEFAULT_DEPLOY_DIR = '/opt/pi-dispatch/egress'

EMPTY_DECLARATION = json.dumps({'version': 1, 'endpoints': []}, indent=2) + '\n'


class DeploymentError(Exception):
    pass


def empty_include() -> str:
    """The model-endpoints include with nothing declared (header only)."""
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import endpoints as _endpoints
    return _endpoints.render_include([])


def default_guard() -> str:
    """The guard include before the daemon's gateways are known: every non-public range refused."""
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import guard as _guard
    return _guard.default_render()


def layout(allowlist_entries: Optional[Sequence[Dict[str, str]]] = None) -> List[Tuple[str, str]]:
    """[(relative path, content)] in creation order."""
    entries = DEFAULT_ALLOWLIST if allowlist_entries is None else allowlist_entries
    return [
        (ALLOWLIST, _allowlist.render_seed(entries)),
        (RULES, _rules.packaged_rules()),
        (ENDPOINTS_JSON, EMPTY_DECLARATION),
        (ENDPOINTS_CONF, empty_include()),
        (GUARD_CONF, default_guard()),
    ]


def paths(deploy_dir: str) -> Dict[str, str]:
    return dict(
        deploy_dir=deploy_dir,
        allowlist=os.path.join(deploy_dir, ALLOWLIST),
        rules=os.path.join(deploy_dir, RULES),
        endpoints_json=os.path.join(deploy_dir, ENDPOINTS_JSON),
        endpoints_conf=os.path.join(deploy_dir, ENDPOINTS_CONF),
        guard_conf=os.path.join(deploy_dir, GUARD_CONF),
    )


def check_deploy_dir(deploy_dir: Optional[str], key: str = 'deploy_dir') -> str:
    """The one validation of a deployment folder option: absolute, normalised. Returns the normal form.

    Raises DeploymentError naming ``key`` (the module option or role variable) and the fix.
    """
    if not deploy_dir or not os.path.isabs(deploy_dir):
        raise DeploymentError('%s %r is not an absolute path; give the full path.' % (key, deploy_dir))
    return os.path.normpath(deploy_dir)


class Layout(object):
    """The deployment folder, validated and normalised once, with every path of the layout.

    Attributes: ``deploy_dir`` and each key of :func:`paths` (``allowlist``, ``rules``,
    ``endpoints_json``, ``endpoints_conf``, ``guard_conf``); ``paths`` is the dict itself, which
    is what modules return and the proxy role mounts.
    """

    def __init__(self, deploy_dir: Optional[str], key: str = 'deploy_dir') -> None:
        self.deploy_dir = check_deploy_dir(deploy_dir, key)
        self.paths = paths(self.deploy_dir)
        for name, path in self.paths.items():
            setattr(self, name, path)

    @property
    def rules_dir(self) -> str:
        return os.path.dirname(self.paths['rules'])

    def check_folders(self) -> None:
        """Refuse a symlinked deployment folder or rules folder (nothing is followed)."""
        refuse_symlinked_path(self.deploy_dir, 'deploy_dir')
        refuse_symlinked_path(self.rules_dir, 'The rules folder')

    def apply(self, allowlist_entries: Optional[Sequence[Dict[str, str]]] = None,
              check_mode: bool = False) -> Dict[str, Any]:
        """Lay the folder out create-only (see :func:`apply`)."""
        return apply(self.deploy_dir, allowlist_entries, check_mode=check_mode)


def module_layout(module: Any, key: str = 'deploy_dir', result: Optional[Dict[str, Any]] = None) -> Layout:
    """Layout of ``module.params[key]``, or the module fails naming the option and the fix (nothing changed)."""
    try:
        return Layout(module.params[key], key)
    except DeploymentError as exc:
        module.fail_json(msg='%s Nothing was changed.' % exc, **(result or {}))


def refuse_symlinked_path(path: str, what: str) -> None:
    """Refuse ``path`` when it, or any existing parent, is a symlink we did not expect.

    Only the path itself and its parents inside the deployment folder are
    checked by callers; system symlinks above the folder (e.g. /var/run) are
    the operator's business.
    """
    if os.path.islink(path):
        raise DeploymentError(
            '%s %s is a symlink (to %s). The deployment folder is refused rather than followed: '
            'replace the symlink with a real directory or file, or point deploy_dir at the real path.'
            % (what, path, os.readlink(path)))


def check_existing(path: str, what: str, want_dir: bool) -> bool:
    refuse_symlinked_path(path, what)
    if not os.path.lexists(path):
        return False
    mode = os.lstat(path).st_mode
    if want_dir and not stat.S_ISDIR(mode):
        raise DeploymentError('%s %s exists but is not a directory; move it away and rerun.' % (what, path))
    if not want_dir and not stat.S_ISREG(mode):
        raise DeploymentError('%s %s exists but is not a regular file; move it away and rerun.' % (what, path))
    return True


def plan(deploy_dir: Optional[str], allowlist_entries: Optional[Sequence[Dict[str, str]]] = None
         ) -> Tuple[List[str], List[Tuple[str, str, bool]]]:
    """Decide what to create. Returns (dirs_to_create, [(path, content, exists)]).

    Raises DeploymentError (and nothing has been written) on any refusal.
    """
    deploy_dir = check_deploy_dir(deploy_dir)
    dirs = []
    if not check_existing(deploy_dir, 'deploy_dir', True):
        dirs.append(deploy_dir)
    sub = os.path.join(deploy_dir, 'deploy')
    if not check_existing(sub, 'The rules folder', True):
        dirs.append(sub)
    files = []
    for rel, content in layout(allowlist_entries):
        path = os.path.join(deploy_dir, rel)
        files.append((path, content, check_existing(path, 'Deployment file', False)))
    return dirs, files


def apply(deploy_dir: str, allowlist_entries: Optional[Sequence[Dict[str, str]]] = None, check_mode: bool = False,
          dir_mode: int = 0o755, file_mode: int = 0o644) -> Dict[str, Any]:
    """Lay out the folder create-only. Returns a result dict (created / kept)."""
    dirs, files = plan(deploy_dir, allowlist_entries)
    created, kept = [], []
    for path, _content, exists in files:
        (kept if exists else created).append(path)
    if not check_mode:
        for directory in dirs:
            try:
                # Missing parents (e.g. /opt/pi-dispatch) are created too.
                os.makedirs(directory, dir_mode)
            except FileExistsError:
                check_existing(directory, 'Folder', True)
            except OSError as exc:
                raise DeploymentError('Creating the folder %s failed: %s. Check the parent folder '
                                      'exists and is writable, or choose another deploy_dir.' % (directory, exc))
        actually_created = []
        for path, content, exists in files:
            try:
                made = not exists and _files.create_exclusive(path, content, file_mode)
            except _files.WriteError as exc:
                raise DeploymentError(str(exc))
            if made:
                actually_created.append(path)
            elif not exists:
                kept.append(path)
        created = actually_created
    return dict(
        changed=bool(created or dirs),
        created=created,
        kept=sorted(kept),
        created_dirs=dirs,
        paths=paths(os.path.normpath(deploy_dir)),
        contents=dict((path, content) for path, content, exists in files if not exists),
    )
