# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The doctor with the egress layer off (``egress_enabled: false``, the seed's ``PI_EGRESS=0``).

A dispatcher may run with the egress layer off: the preflight then admits every job without
asking the engine (``_jobnets/preflight.py``), and the doctor says so as one ⚠ and checks
nothing else, so it contacts no engine either. The OpenShell venue is the exception: its sandbox
policy is its egress control and the only path its credentials resolve through, so "off" would
mean a policy admitting everything; with an OpenShell policy or gateway configured the run fails
instead (the seed refuses the boot the same way). Pure; ``doctor.off_result`` is egress_canary's result.
"""

from __future__ import annotations

from typing import Any, Dict, List

from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.lines import Line, shape

ENABLE_FIX = ('set egress_enabled: true (the default) and run ansible-playbook pi_dispatch.egress.site, which '
              'deploys the proxy every job then goes through')
OPENSHELL_FIX = ('set egress_enabled: true, or stop configuring the OpenShell venue here (doctor_openshell_policy, '
                 'doctor_openshell_gateway)')


def off_lines(params: Dict[str, Any]) -> List[Line]:
    """The lines of a doctor run with the layer off: one ⚠, or ✗ when the OpenShell venue is configured."""
    configured = [key for key in ('openshell_policy', 'openshell_gateway') if params.get(key)]
    if configured:
        what = ', '.join('%s %s' % (key, params[key]) for key in configured)
        text = shape('egress.off_openshell', what=what)
        return [Line('egress.off_openshell', 'fail', text, fix=OPENSHELL_FIX)]
    return [Line('egress.off', 'warn', shape('egress.off'), fix=ENABLE_FIX)]
