# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""What a target host needs before the collection's modules can run there.

The modules run on the target (over SSH in a fleet), so the target's Python needs the Docker
SDK and a daemon that answers. :func:`check` turns each missing piece into one finding with the
fix, instead of the traceback a module would die with later.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, Optional, Sequence

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import venue as _venue
from ansible_collections.pi_dispatch.egress.plugins.module_utils._firewall import host as _firewall_host

MIN_PYTHON = (3, 8)
MIN_SDK = (7, 0)
MIN_API = (1, 41)


def _dotted(parts: Sequence[int]) -> str:
    return '.'.join(str(p) for p in parts)


def check_python(version_info: Optional[Sequence[int]] = None, executable: Optional[str] = None) -> Optional[str]:
    version_info = tuple(version_info or sys.version_info[:3])
    if version_info[:2] < MIN_PYTHON:
        return ('Python %s at %s is older than %s; set ansible_python_interpreter to a Python %s or newer'
                % (_dotted(version_info), executable or sys.executable, _dotted(MIN_PYTHON), _dotted(MIN_PYTHON)))
    return None


def check_sdk(sdk_version: Optional[str], executable: str) -> Optional[str]:
    """``sdk_version``: the installed docker SDK's version, or None when it cannot be imported."""
    fix = ("install it there (Debian: 'apt-get install python3-docker'; otherwise "
           "'%s -m pip install \"docker>=%s\"'), or set ansible_python_interpreter to a Python that has it"
           % (executable, _dotted(MIN_SDK)))
    if sdk_version is None:
        return 'the Docker SDK for Python is missing from %s on this host; %s' % (executable, fix)
    if _venue.version_tuple(sdk_version) < MIN_SDK:
        return ('the Docker SDK for Python at %s is %s, older than %s; %s'
                % (executable, sdk_version, _dotted(MIN_SDK), fix))
    return None


def check_libraries(missing: Optional[Sequence[str]], executable: str) -> Optional[str]:
    """``missing``: the Python packages the modules need here that did not import."""
    if not missing:
        return None
    return ('%s missing from %s on this host (the allowlist check reads the Public Suffix List through '
            'publicsuffixlist); install it there: \'%s -m pip install %s\', or set ansible_python_interpreter '
            'to a Python that has it' % (', '.join(missing) + (' is' if len(missing) == 1 else ' are'),
                                         executable, executable, ' '.join(missing)))


def check_api(api_version: Any, engine_version: Optional[str], where: str) -> Optional[str]:
    if _venue.version_tuple(api_version) < MIN_API:
        return ('the Docker Engine at %s is %s (API %s), older than API %s; upgrade the engine on this host'
                % (where, engine_version, api_version, _dotted(MIN_API)))
    return None


def iptables_variant(runner: _firewall_host.Runner) -> Dict[str, Optional[str]]:
    """dict(variant, version, why): this host's ``iptables`` as ``iptables -V`` names it (``runner``: a
    ``_firewall_host.Runner``). ``variant`` is 'nft' or 'legacy', None when it cannot be told (``why``)."""
    backend, why = _firewall_host.detect(runner, 'ipv4')
    if backend is None:
        return dict(variant=None, version=None, why=why)
    return dict(variant=backend.variant, version=backend.version, why=None)
