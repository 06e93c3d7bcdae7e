# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""What egress_openshell_policy does between its options and its result.

Read the sources through their own parsers (``_policy/allowlist.py`` ``parse()``, with the
ranges egress_private_destinations opens, and ``_policy/endpoints.py`` ``load()``), translate
(``translate.py``), parse the render into OpenShell's ``SandboxPolicy`` message with unknown
fields refused (``schema.py``), compare a policy read back with it (``readback.py``), and only
then write the policy file (atomically, when its content differs). Every refusal comes before
anything is written: a refused run changes nothing.

:class:`PolicyRun` keeps the result so far in ``result`` and raises :class:`PolicyFailed` (the
message and what goes beside the result) for the module to pass to ``fail_json``.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import files as _files
from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import gateway as _gateway
from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import readback as _readback
from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import schema as _schema
from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import translate as _translate
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import allowlist as _allowlist
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import endpoints as _endpoints
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import optins as _optins

NOTHING_WRITTEN = 'Nothing was written.'
FORMATS = ('yaml', 'json')


class PolicyFailed(Exception):
    """The run stops: the message, and ``extra`` (``problems``, ``refused``, ``differences``) beside the result."""

    def __init__(self, message: str, **extra: Any) -> None:
        super(PolicyFailed, self).__init__(message)
        self.extra = extra


def read_allowlist(path: str, opened: Optional[List[Any]] = None) -> Any:
    """The parsed allowlist at ``path`` (``_policy/allowlist.py`` ``parse()``), or None when there is none.

    A missing file lists nothing (the openshell venue then admits nothing listed). Raises
    PolicyFailed for a file that is not a regular file, cannot be read or is not UTF-8, and for
    an allowlist with refused lines (each with file, line, entry, reason and fix).
    """
    if not os.path.lexists(path):
        return None
    if os.path.islink(path) or not os.path.isfile(path):
        raise PolicyFailed('%s is not a regular file (a symlink, a directory or a device); replace it with the '
                           'allowlist itself. %s' % (path, NOTHING_WRITTEN), problems=[])
    try:
        with open(path, 'rb') as handle:
            text = handle.read().decode('utf-8')
    except UnicodeDecodeError as exc:
        raise PolicyFailed('%s is not UTF-8 text (%s); save it as plain ASCII/UTF-8. %s'
                           % (path, exc, NOTHING_WRITTEN), problems=[])
    except OSError as exc:
        raise PolicyFailed('Reading %s failed: %s; make it readable by the account that runs this. %s'
                           % (path, exc, NOTHING_WRITTEN), problems=[])
    parsed = _allowlist.parse(text, path, opened=opened)
    if parsed.errors:
        problems = [dict(p.as_dict(), severity='error') for p in parsed.errors]
        problems += [dict(p.as_dict(), severity='warning') for p in parsed.warnings]
        raise PolicyFailed('The allowlist is refused, so no OpenShell policy is rendered from it. %s. %s'
                           % (' | '.join(str(p) for p in parsed.errors), NOTHING_WRITTEN), problems=problems)
    return parsed


def read_policy_file(path: str) -> Dict[str, Any]:
    """A policy read back into a file (JSON or YAML). Raises PolicyFailed naming the file and the fix."""
    try:
        with open(path, 'rb') as handle:
            text = handle.read().decode('utf-8')
    except FileNotFoundError:
        raise PolicyFailed('compare_with: %s does not exist; read the sandbox policy back into it first '
                           '(openshell policy get, docs/openshell.md). %s' % (path, NOTHING_WRITTEN))
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyFailed('compare_with: %s cannot be read as UTF-8 text (%s). %s' % (path, exc, NOTHING_WRITTEN))
    try:
        return _readback.loads(text, path)
    except _readback.PolicyFileError as exc:
        raise PolicyFailed('compare_with: %s. %s' % (exc, NOTHING_WRITTEN))


class PolicyRun(object):
    """One run of egress_openshell_policy on the validated deployment folder ``layout``."""

    def __init__(self, params: Dict[str, Any], layout: Any, check_mode: bool = False, diff: bool = False) -> None:
        self.params = params
        self.layout = layout
        self.check_mode = check_mode
        self.diff = diff
        self.warnings = []  # type: List[str]
        self.result = dict(changed=False, policy={}, rules=[], skipped=[], limits=[], differences=[],
                           not_compared=[], dest=params.get('dest'), format=params.get('format') or 'yaml',
                           sources=dict(allowlist=layout.allowlist, allowlist_exists=False,
                                        endpoints=_endpoints.default_path(layout.deploy_dir), endpoints_exists=False),
                           schema=dict(package=_schema.PACKAGE, pinned=_schema.PINNED_VERSION,
                                       installed=_schema.installed_version()))  # type: Dict[str, Any]

    def render(self) -> Any:
        """Read, translate and validate: the rendered ``SandboxPolicy`` message (``result['policy']`` its text form)."""
        p, result = self.params, self.result
        try:
            binaries = _translate.check_binaries(p.get('binaries') or list(_translate.DEFAULT_BINARIES))
            provider = _translate.check_provider(p.get('credential_provider'))
            repository = _translate.check_github_repository(p.get('github_repository'))
        except ValueError as exc:
            raise PolicyFailed('%s. %s' % (exc, NOTHING_WRITTEN))
        optins = self.read_optins(p.get('project_policy'))
        opened = p.get('private_destinations') or []
        allowlist = read_allowlist(self.layout.allowlist, opened)
        result['sources']['allowlist_exists'] = allowlist is not None
        if allowlist is None:
            self.warnings.append('%s does not exist: nothing listed is admitted on the openshell venue (model '
                                 'endpoints only).' % self.layout.allowlist)
        else:
            self.warnings.extend(str(w) for w in allowlist.warnings)
        try:
            endpoints, path, exists = _endpoints.load(self.layout.deploy_dir)
        except _endpoints.EndpointsError as exc:
            raise PolicyFailed('%s %s' % (exc, NOTHING_WRITTEN), problems=[pr.as_dict() for pr in exc.problems])
        result['sources'].update(endpoints=path, endpoints_exists=exists)
        try:
            translation = _translate.translate(allowlist, endpoints, opened=opened,
                                               plain_http=p.get('plain_http', True), binaries=binaries,
                                               endpoints_path=path, credential_provider=provider,
                                               github_repository=repository, optins=optins)
        except _translate.Untranslatable as exc:
            raise PolicyFailed(str(exc), refused=[r.as_dict() for r in exc.refusals])
        result.update(policy=translation.policy, rules=translation.origins(),
                      skipped=[s.as_dict() for s in translation.skipped], limits=list(translation.limits))
        for skip in translation.skipped:
            self.warnings.append(str(skip))
        try:
            return _schema.parse(translation.policy, 'the rendered policy')
        except _schema.SchemaRefused as exc:
            raise PolicyFailed('%s %s' % (exc, NOTHING_WRITTEN))

    def read_optins(self, path: Optional[str]) -> Any:
        """A project's opt-ins (``_policy/optins.py``), None without ``project_policy``.

        A missing file is the seed's deny-all, read and not written: rendering a policy never writes into
        the project (the job network's ``job_network`` seeds the file).
        """
        if not path:
            return None
        if not os.path.isabs(path):
            raise PolicyFailed('project_policy %r is not an absolute path; give the absolute path of the project\'s '
                               '.pi-container/config.yaml. %s' % (path, NOTHING_WRITTEN))
        if not os.path.lexists(path):
            self.warnings.append('%s does not exist: the project opts in nothing (seed 001\'s deny-all); it was not '
                                 'created' % path)
            return _optins.deny_all(path)
        try:
            optins = _optins.load(path)
            # A job of the project can write the file: what it opens takes effect only as the operator approved
            # it into the deployment folder (docs/transparent.md, "Approving a project's opt-ins").
            _optins.check_approved(optins, self.layout.deploy_dir)
            return optins
        except _optins.OptinError as exc:
            raise PolicyFailed('%s %s' % (str(exc).replace(' Nothing was created.', ''), NOTHING_WRITTEN))

    def compare(self, rendered: Any, read_back: Dict[str, Any], where: str) -> None:
        """Refuse when the policy read back (authored or message form) differs from ``rendered``."""
        self.result['not_compared'] = _readback.not_compared(read_back)
        try:
            message = _schema.parse(read_back, where)
        except _schema.SchemaRefused as exc:
            raise PolicyFailed('%s %s' % (exc, NOTHING_WRITTEN))
        self.compare_message(rendered, message, where)

    def compare_message(self, rendered: Any, message: Any, where: str) -> None:
        differences = _readback.compare(rendered, message)
        self.result['differences'] = [d.as_dict() for d in differences]
        if differences:
            exc = _readback.ReadBackDiffers(differences, where)
            raise PolicyFailed('%s %s' % (exc, NOTHING_WRITTEN))

    def write(self) -> None:
        """Write the policy file when its content differs (atomically; not in check mode)."""
        dest, result = self.params.get('dest'), self.result
        text = _readback.dumps(result['policy'], result['format'])
        before = ''
        if os.path.lexists(dest):
            if os.path.islink(dest) or not os.path.isfile(dest):
                raise PolicyFailed('dest: %s is not a regular file (a symlink, a directory or a device); remove it '
                                   'or name another path. %s' % (dest, NOTHING_WRITTEN))
            try:
                with open(dest, 'rb') as handle:
                    before = handle.read().decode('utf-8', 'replace')
            except OSError as exc:
                raise PolicyFailed('dest: %s cannot be read (%s). %s' % (dest, exc, NOTHING_WRITTEN))
        elif not os.path.isdir(os.path.dirname(dest) or '.'):
            raise PolicyFailed('dest: the folder of %s does not exist; create it first. %s' % (dest, NOTHING_WRITTEN))
        if before == text:
            return
        result['changed'] = True
        if self.diff:
            result['diff'] = dict(before=before, after=text, before_header=dest, after_header=dest)
        if not self.check_mode:
            try:
                _files.write_atomic(dest, text)
            except OSError as exc:
                raise PolicyFailed('dest: writing %s failed (%s); the previous file is unchanged.' % (dest, exc))

    def fetch_from_gateway(self) -> Any:
        """(where, the ``SandboxPolicy`` message) of the sandbox named by the gateway options."""
        p = self.params
        try:
            return _gateway.fetch(p['gateway'], p['sandbox'], p['workspace'],
                                  timeout=p.get('gateway_timeout') or _gateway.DEFAULT_TIMEOUT,
                                  ca_path=p.get('gateway_ca'), cert_path=p.get('gateway_cert'),
                                  key_path=p.get('gateway_key'))
        except _gateway.GatewayError as exc:
            raise PolicyFailed('%s. %s' % (exc, NOTHING_WRITTEN))

    def run(self, fetch: Optional[Callable[[], Any]] = None) -> Dict[str, Any]:
        """Render, compare (``compare_with``, then ``fetch`` or the gateway: a read-back message), write."""
        if fetch is None and self.params.get('gateway'):
            fetch = self.fetch_from_gateway
        rendered = self.render()
        if self.params.get('compare_with'):
            path = self.params['compare_with']
            self.compare(rendered, read_policy_file(path), path)
        if fetch is not None:
            where, message = fetch()
            self.compare_message(rendered, message, where)
        if self.params.get('dest'):
            self.write()
        return self.result
