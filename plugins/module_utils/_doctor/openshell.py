# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The doctor's OpenShell check: the deployed policy file against what the current sources render.

Runs only when ``openshell_policy`` names the policy file (as ``egress_openshell_policy`` wrote it
with ``dest``); without it there is no line from here. The render is ``egress_openshell_policy``'s
own (``_openshell/apply.py`` :class:`PolicyRun`, with the module's defaults: ``plain_http``, the
binaries ``/**``, no private destination opened), so the doctor and the module cannot disagree on
what the sources mean. The file is read back as the module's ``compare_with`` reads it, parsed by
OpenShell's ``SandboxPolicy`` message, and compared semantically (``_openshell/readback.py``
:func:`compare`): rule names, order, case and defaults do not count, each endpoint that differs
is named.

Lines: ``openshell.policy`` (the file reads back as the sources render), ``openshell.policy_differs``
(each endpoint that differs), ``openshell.policy_missing`` (absent, a symlink, unreadable or not a
policy), ``openshell.untranslatable`` (the sources cannot be rendered: the refused entries),
``openshell.package_missing`` (the pinned ``openshell`` package is not importable here) and
``openshell.unchecked`` (anything else that stopped the comparison). Nothing raises out of here.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List

from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.context import Check, DoctorContext
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.lines import Line
from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import apply as _apply
from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import readback as _readback
from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import schema as _schema
from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import translate as _translate
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment

MODULE = 'pi_dispatch.egress.egress_openshell_policy'


def render_params() -> Dict[str, Any]:
    """egress_openshell_policy's options at their defaults: render only (no dest, no comparison)."""
    return dict(deploy_dir=None, dest=None, format='yaml', compare_with=None, gateway=None, sandbox=None,
                workspace=None, gateway_ca=None, gateway_cert=None, gateway_key=None, gateway_timeout=30.0,
                private_destinations=[], plain_http=True, binaries=list(_translate.DEFAULT_BINARIES))


def _said(text: str) -> str:
    """``text`` on one line, without the module's own 'Nothing was written.' (the doctor writes nothing)."""
    return ' '.join(str(text).replace(_apply.NOTHING_WRITTEN, '').split())


def _fix_render(deploy_dir: str, path: str) -> str:
    return ('run %s with deploy_dir %s and dest %s, then load it into the sandbox (openshell policy set --policy %s)'
            % (MODULE, deploy_dir, path, path))


class OpenShellCheck(Check):
    """The deployed OpenShell policy file against the current sources (no line without ``openshell_policy``)."""

    def lines(self, ctx: DoctorContext) -> List[Line]:
        path = getattr(ctx, 'openshell_policy', None)
        if not path:
            return []
        try:
            return [self.line(ctx.deploy_dir or _deployment.DEFAULT_DEPLOY_DIR, path)]
        except Exception as exc:  # pylint: disable=broad-except
            return [Line('openshell.unchecked', 'warn',
                         'OpenShell policy %s could not be compared with the sources (%s)' % (path, _said(exc)),
                         fix='run %s deploy_dir=%s compare_with=%s, which says the same with its reason'
                             % (MODULE, ctx.deploy_dir, path))]

    @staticmethod
    def line(deploy_dir: str, path: str) -> Line:
        if not _schema.available():
            return Line('openshell.package_missing', 'warn',
                        'OpenShell policy %s not compared: the Python package %s (pinned %s) cannot be imported '
                        'on this host, and it carries the schema the comparison parses both policies with'
                        % (path, _schema.PACKAGE, _schema.PINNED_VERSION),
                        fix='%s (Python 3.11 or later) on the host that runs the doctor' % _schema.INSTALL)
        try:
            run = _apply.PolicyRun(render_params(), _deployment.Layout(deploy_dir))
            rendered = run.render()
        except _apply.PolicyFailed as exc:
            refused = exc.extra.get('refused') or []
            what = '; '.join('%s: %s: %s' % (r['where'], r['entry'], r['reason']) for r in refused) or _said(exc)
            return Line('openshell.untranslatable', 'fail',
                        'OpenShell policy cannot be rendered from the current sources in %s, so %s cannot be '
                        'checked and the openshell venue refuses every job: %s' % (deploy_dir, path, what),
                        fix=('; '.join(r['fix'] for r in refused) if refused else
                             'correct the sources as the message says') + ', then ' + _fix_render(deploy_dir, path))
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
