# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""Deprecated: the job-network API's old import path. Import ``jobnet`` instead.

Until 0.4.0 the published job-network API lived at ``module_utils/_jobnet.py``. It now lives at
``module_utils/jobnet.py`` (docs/job-network-api.md). This alias keeps a dispatcher that imported
the old path working for one release, with a ``DeprecationWarning`` when a name is read: it is
removed in 0.5.0.
Every name here is the very object ``jobnet`` defines (not a copy).
"""

from __future__ import annotations

import warnings
from typing import Any, List

from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as _api

__all__ = sorted(_api.__all__)  # the same names as jobnet's list (a copy, sorted)


def __getattr__(name: str) -> Any:
    """Every published name, from ``jobnet``, with a DeprecationWarning at the caller's line (PEP 562)."""
    if name not in _api.__all__:
        raise AttributeError('module %r has no attribute %r' % (__name__, name))
    warnings.warn('ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnet is deprecated and is '
                  'removed in pi_dispatch.egress 0.5.0: import '
                  'ansible_collections.pi_dispatch.egress.plugins.module_utils.jobnet instead (same names, '
                  'same objects).', DeprecationWarning, stacklevel=2)
    return getattr(_api, name)


def __dir__() -> List[str]:
    return sorted(__all__)
