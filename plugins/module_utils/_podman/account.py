# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The service account whose Podman runs the proxy: its password entry, found once for every module.

``egress_podman_conf`` reads the account's ``containers.conf`` under its home and
``egress_podman_units`` writes its Quadlet units there, owned by it: both look the account up
here, and both refuse an account that does not exist with the same words.
"""

from __future__ import annotations

import os
import pwd
from typing import Any, Optional


class AccountError(ValueError):
    """The account does not exist on this host: the message names it and the fix."""


def entry(account: Optional[str]) -> Any:
    """The password entry of ``account``, or of the user running the module when it is empty."""
    try:
        return pwd.getpwnam(account) if account else pwd.getpwuid(os.getuid())
    except KeyError:
        raise AccountError('account %r does not exist on this host; create it first' % account) from None
