# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""Credentials never leave the doctor: one redaction for every line and report.

:func:`redact` replaces the userinfo of any URL (``http://user:secret@host``
becomes ``http://***@host``) and the value of every query parameter whose
name carries key, token, secret, password, passwd or pwd (``api_key``,
``apikey``, ``access_token``, ``client_secret``, ...) with ``***``. It is
idempotent and leaves text without credentials exactly as it was.
"""

from __future__ import annotations

import re
from typing import Optional

MASK = '***'

# scheme://  then the authority up to its last '@' (greedy, but never past / ? # or a space/quote).
_USERINFO = re.compile(r'(?i)\b([a-z][a-z0-9+.\-]*://)[^/?#\s\'"<>@]*(?:@[^/?#\s\'"<>@]*)*@')
# ?name=value, &name=value or ;name=value where the name is credential-like.
_SECRET_PARAM = re.compile(r'(?i)([?&;][a-z0-9_.\-]*(?:key|token|secret|password|passwd|pwd)[a-z0-9_.\-]*=)'
                           r'([^&;#\s\'"<>]+)')


def redact(text: Optional[str]) -> Optional[str]:
    """``text`` with URL userinfo and credential-like query values replaced by ``***`` (None stays None)."""
    if not text:
        return text
    text = _USERINFO.sub(lambda m: m.group(1) + MASK + '@', text)
    return _SECRET_PARAM.sub(lambda m: m.group(1) + MASK, text)
