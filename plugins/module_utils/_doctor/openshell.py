# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The doctor's OpenShell check: the deployed policy file against what the current sources render.

Runs only when ``openshell_policy`` names the policy file (as ``egress_openshell_policy`` wrote it with
``dest``); without it there is no line from here. The render is ``egress_openshell_policy``'s own
(``_openshell/apply.py`` :class:`PolicyRun`, with the module's defaults: ``plain_http``, the binaries ``/**``,
no private destination opened; every endpoint bound to ``openshell_credential_provider``, github.com
restricted to ``openshell_github_repository`` and the opt-ins of ``openshell_project_policy`` when they are
set, as the job's policy is), so the doctor and the module cannot disagree on what the sources mean. The file
is read back as the module's ``compare_with`` reads it, parsed by OpenShell's ``SandboxPolicy`` message, and
compared semantically (``_openshell/readback.py`` :func:`compare`): rule names, order, case and defaults do
not count, each endpoint that differs is named.

With ``openshell_gateway`` (a gateway, a sandbox, a workspace, the TLS files) the same comparison runs
against the sandbox's effective policy, fetched with ``GetSandboxConfig`` through the ``openshell``
package's own gRPC stub (``_openshell/gateway.py``): ``openshell.gateway_policy``,
``openshell.gateway_differs`` (each endpoint named) or ``openshell.gateway_unread``.

Lines: ``openshell.policy`` (the file reads back as the sources render), ``openshell.policy_differs``
(each endpoint that differs), ``openshell.policy_missing`` (absent, a symlink, unreadable or not a
policy), ``openshell.untranslatable`` (the sources cannot be rendered: the refused entries),
``openshell.package_missing`` (the pinned ``openshell`` package is not importable here) and
``openshell.unchecked`` (anything else that stopped the comparison). Nothing raises out of here.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.context import Check, DoctorContext
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.lines import Line
from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import apply as _apply
from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import gateway as _gateway
from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import readback as _readback
from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import schema as _schema
from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import translate as _translate
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment

MODULE = 'pi_dispatch.egress.egress_openshell_policy'
NO_JOB = (None, None, None)  # (credential provider, GitHub repository, project policy) of the compared job
Job = Tuple[Optional[str], Optional[str], Optional[str]]


def render_params(provider: Optional[str] = None, repository: Optional[str] = None,
                  project_policy: Optional[str] = None) -> Dict[str, Any]:
    """egress_openshell_policy's options at their defaults, with the job's provider, GitHub repository and
    project policy when given: render only."""
    return dict(deploy_dir=None, dest=None, format='yaml', compare_with=None, gateway=None, sandbox=None,
                workspace=None, gateway_ca=None, gateway_cert=None, gateway_key=None, gateway_timeout=30.0,
                private_destinations=[], plain_http=True, binaries=list(_translate.DEFAULT_BINARIES),
                credential_provider=provider, github_repository=repository, project_policy=project_policy)


def check_options(params: Dict[str, Any]) -> None:
    """ValueError for egress_canary's job options of the openshell venue that the render would refuse."""
    _translate.check_provider(params.get('openshell_credential_provider'), 'openshell_credential_provider')
    _translate.check_github_repository(params.get('openshell_github_repository'), 'openshell_github_repository')
    policy = params.get('openshell_project_policy')
    if policy and not os.path.isabs(policy):
        raise ValueError('openshell_project_policy %r is not an absolute path; give the absolute path of the '
                         'project\'s .pi-container/config.yaml' % (policy,))


def _said(text: str) -> str:
    """``text`` on one line, without the module's own 'Nothing was written.' (the doctor writes nothing)."""
    return ' '.join(str(text).replace(_apply.NOTHING_WRITTEN, '').split())


def _fix_render(deploy_dir: str, path: str) -> str:
    return ('run %s with deploy_dir %s and dest %s, then load it into the sandbox (openshell policy set --policy %s)'
            % (MODULE, deploy_dir, path, path))


class OpenShellCheck(Check):
    """The deployed OpenShell policy file, and a gateway's sandbox policy, against the current sources.

    No line without ``openshell_policy`` or ``openshell_gateway``; one line for each that is set.
    """

    def lines(self, ctx: DoctorContext) -> List[Line]:
        deploy_dir = ctx.deploy_dir or _deployment.DEFAULT_DEPLOY_DIR
        job = (getattr(ctx, 'openshell_credential_provider', None) or None,
               getattr(ctx, 'openshell_github_repository', None) or None,
               getattr(ctx, 'openshell_project_policy', None) or None)
        out = []
        path = getattr(ctx, 'openshell_policy', None)
        if path:
            out.append(self._guarded(deploy_dir, path, lambda: self.line(deploy_dir, path, job),
                                     'compare_with=%s' % path))
        gateway = getattr(ctx, 'openshell_gateway', None)
        if gateway:
            where = gateway_where(gateway)
            out.append(self._guarded(deploy_dir, where, lambda: self.gateway_line(deploy_dir, gateway, job),
                                     'gateway=%s sandbox=%s workspace=%s' % (
                                         gateway['endpoint'], gateway['sandbox'], gateway['workspace'])))
        return out

    @staticmethod
    def _guarded(deploy_dir: str, what: str, make: Any, how: str) -> Line:
        try:
            return make()
        except Exception as exc:  # pylint: disable=broad-except
            return Line('openshell.unchecked', 'warn',
                        'OpenShell policy %s could not be compared with the sources (%s)' % (what, _said(exc)),
                        fix='run %s deploy_dir=%s %s, which says the same with its reason' % (MODULE, deploy_dir, how))

    @staticmethod
    def _render(deploy_dir: str, what: str, fix_tail: str, job: Job = NO_JOB) -> Any:
        """The policy the sources render, or the line that says why there is none."""
        if not _schema.available():
            return Line('openshell.package_missing', 'warn',
                        'OpenShell policy %s not compared: the Python package %s (pinned %s) cannot be imported '
                        'on this host, and it carries the schema the comparison parses both policies with'
                        % (what, _schema.PACKAGE, _schema.PINNED_VERSION),
                        fix='%s (Python 3.11 or later) on the host that runs the doctor' % _schema.INSTALL)
        try:
            run = _apply.PolicyRun(render_params(*job), _deployment.Layout(deploy_dir))
            return run.render()
        except _apply.PolicyFailed as exc:
            refused = exc.extra.get('refused') or []
            said = '; '.join('%s: %s: %s' % (r['where'], r['entry'], r['reason']) for r in refused) or _said(exc)
            return Line('openshell.untranslatable', 'fail',
                        'OpenShell policy cannot be rendered from the current sources in %s, so %s cannot be '
                        'checked and the openshell venue refuses every job: %s' % (deploy_dir, what, said),
                        fix=('; '.join(r['fix'] for r in refused) if refused else
                             'correct the sources as the message says') + ', then ' + fix_tail)

    @staticmethod
    def gateway_line(deploy_dir: str, gateway: Dict[str, Any], job: Job = NO_JOB) -> Line:
        """The sandbox's effective policy, fetched from the gateway, against what the sources render."""
        where = gateway_where(gateway)
        fix = ('run %s with deploy_dir %s and dest set, then load it into the sandbox (openshell policy set '
               '--policy <file>, on %s)' % (MODULE, deploy_dir, where))
        rendered = OpenShellCheck._render(deploy_dir, where, fix, job)
        if isinstance(rendered, Line):
            return rendered
        try:
            _where, fetched = _gateway.fetch(gateway['endpoint'], gateway['sandbox'], gateway['workspace'],
                                             timeout=gateway.get('timeout') or _gateway.DEFAULT_TIMEOUT,
                                             ca_path=gateway.get('ca'), cert_path=gateway.get('cert'),
                                             key_path=gateway.get('key'))
        except _gateway.GatewayError as exc:
            return Line('openshell.gateway_unread', 'fail',
                        'OpenShell policy of %s could not be fetched (%s), so no job there runs under a policy read '
                        'back' % (where, _said(exc)),
                        fix='check the gateway address, the sandbox and workspace names and the TLS files '
                            '(doctor_openshell_gateway and its companions), then re-run doctor')
        differences = _readback.compare(rendered, fetched)
        if differences:
            return Line('openshell.gateway_differs', 'fail',
                        'OpenShell policy of %s differs from what the current sources in %s render in %d endpoint%s: '
                        '%s' % (where, deploy_dir, len(differences), '' if len(differences) == 1 else 's',
                                '; '.join(str(d) for d in differences)), fix=fix)
        return Line('openshell.gateway_policy', 'ok',
                    'OpenShell policy of %s reads back as the current sources in %s render (%d endpoints, %d rules)'
                    % (where, deploy_dir, len(_readback.endpoint_map(rendered)), len(rendered.network_policies)))

    @staticmethod
    def line(deploy_dir: str, path: str, job: Job = NO_JOB) -> Line:
        rendered = OpenShellCheck._render(deploy_dir, path, _fix_render(deploy_dir, path), job)
        if isinstance(rendered, Line):
            return rendered
        problem = _read(path)
        if isinstance(problem, str):
            return Line('openshell.policy_missing', 'fail',
                        'OpenShell policy file %s cannot be used (%s), so the openshell venue has no policy the '
                        'current sources render' % (path, problem), fix=_fix_render(deploy_dir, path))
        differences = _readback.compare(rendered, problem)
        if differences:
            return Line('openshell.policy_differs', 'fail',
                        'OpenShell policy %s differs from what the current sources in %s render in %d endpoint%s: %s'
                        % (path, deploy_dir, len(differences), '' if len(differences) == 1 else 's',
                           '; '.join(str(d) for d in differences)),
                        fix=_fix_render(deploy_dir, path))
        count = len(_readback.endpoint_map(rendered))
        return Line('openshell.policy', 'ok',
                    'OpenShell policy %s reads back as the current sources in %s render (%d endpoints, %d rules)'
                    % (path, deploy_dir, count, len(rendered.network_policies)))


def gateway_where(gateway: Dict[str, Any]) -> str:
    """How a line names the gateway's sandbox (as ``_openshell/gateway.py`` names it)."""
    return 'gateway %s, sandbox %s in workspace %s' % (gateway['endpoint'], gateway['sandbox'], gateway['workspace'])


def _read(path: str) -> Any:
    """The ``SandboxPolicy`` message in the file ``path``, or why it cannot be used (a str)."""
    if not os.path.lexists(path):
        return 'it does not exist'
    if os.path.islink(path):
        return 'it is a symlink, which is not followed'
    if not os.path.isfile(path):
        return 'it is not a regular file'
    try:
        with open(path, 'rb') as handle:
            text = handle.read().decode('utf-8')
    except (OSError, UnicodeDecodeError) as exc:
        return 'it cannot be read as UTF-8 text: %s' % exc
    try:
        return _schema.parse(_readback.loads(text, path), path)
    except (_readback.PolicyFileError, _schema.SchemaRefused) as exc:
        return _said(exc)
