# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""Job networks: the names, labels and environment a job's network and container get.

Pure (no daemon). The contract: job ``<id>`` (checked by
:func:`validate_job_id`) runs as the container ``pi-job-<id>`` on the network
``pi-job-<id>-net``, labelled with :func:`job_labels`, with the proxy
variables of :func:`job_env`. Part of the job-network API re-exported by
``jobnet.py`` (docs/job-network-api.md).
"""

from __future__ import annotations

import calendar
import re
import socket
import time
from typing import Any, Dict, Optional

from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy.spec import PROXY_NAME

# --------------------------------------------------------------------------
# Contract names (defaults; every one is a parameter)
# --------------------------------------------------------------------------

PROXY_PORT = 3128
NETWORK_PREFIX = 'pi-job-'
NETWORK_SUFFIX = '-net'
CONTAINER_PREFIX = 'pi-job-'

LABEL_PREFIX = 'io.pi-dispatch.egress.'
LABEL_JOB_ID = LABEL_PREFIX + 'job-id'
LABEL_CREATED = LABEL_PREFIX + 'created'
LABEL_OWNER_HOST = LABEL_PREFIX + 'owner-host'
# explicit (absent on networks made before 0.5.0) or transparent (docs/transparent.md)
LABEL_MODE = LABEL_PREFIX + 'mode'

NO_PROXY = 'localhost,127.0.0.1,::1'

JOB_ID_MAX = 64
_JOB_ID_RE = re.compile(r'^[A-Za-z0-9](?:[A-Za-z0-9_-]*[A-Za-z0-9])?\Z')  # \Z: '$' admits a trailing newline


class JobNetError(ValueError):
    """Bad input (a job id, a pool, a prefix): nothing was changed."""


# --------------------------------------------------------------------------
# Names, labels, environment (pure)
# --------------------------------------------------------------------------

def validate_job_id(job_id: Any, key: str = 'job_id') -> str:
    """Return ``job_id`` when it may name a network and a container; else raise JobNetError.

    Letters, digits, ``-`` and ``_``; it starts and ends with a letter or a
    digit; 1 to 64 characters. Checked before any name is built from it.
    """
    if not isinstance(job_id, str):
        raise JobNetError(
            "%s must be a string, got %s %r. Pass the job's id as text, e.g. '1234' or 'job-1234'."
            % (key, type(job_id).__name__, job_id))
    if len(job_id) > JOB_ID_MAX:
        raise JobNetError(
            "%s %r is refused: it is %d characters long and at most %d are allowed "
            "(it names the network %s<id>%s and the container %s<id>). Use a shorter id."
            % (key, job_id, len(job_id), JOB_ID_MAX, NETWORK_PREFIX, NETWORK_SUFFIX, CONTAINER_PREFIX))
    if not _JOB_ID_RE.match(job_id):
        raise JobNetError(
            "%s %r is refused: use only letters, digits, '-' and '_', starting and ending with a "
            "letter or a digit, 1 to %d characters (it names the network %s<id>%s and the "
            "container %s<id>). For example 'job-1234'."
            % (key, job_id, JOB_ID_MAX, NETWORK_PREFIX, NETWORK_SUFFIX, CONTAINER_PREFIX))
    return job_id


_ID_PREFIX_RE = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_-]*\Z')


def validate_id_prefix(id_prefix: Any, key: str = 'id_prefix') -> str:
    """An id prefix ('' for none) may end in '-' or '_' ('it5-'); else as a job id."""
    if id_prefix in (None, ''):
        return ''
    if not isinstance(id_prefix, str) or len(id_prefix) > JOB_ID_MAX or not _ID_PREFIX_RE.match(id_prefix):
        raise JobNetError(
            "%s %r is refused: use letters, digits, '-' and '_', starting with a letter or a digit, "
            "at most %d characters (for example 'it5-')." % (key, id_prefix, JOB_ID_MAX))
    return id_prefix


def network_name(job_id: str) -> str:
    """``pi-job-<id>-net``, the job's network; JobNetError for an invalid id."""
    return NETWORK_PREFIX + validate_job_id(job_id) + NETWORK_SUFFIX


def container_name(job_id: str) -> str:
    """``pi-job-<id>``, the name the job's container must get; JobNetError for an invalid id."""
    return CONTAINER_PREFIX + validate_job_id(job_id)


def looks_like_job_network(name: Any) -> bool:
    """True for ``pi-job-<anything>-net`` (valid id or not)."""
    return (isinstance(name, str) and name.startswith(NETWORK_PREFIX) and name.endswith(NETWORK_SUFFIX)
            and len(name) > len(NETWORK_PREFIX) + len(NETWORK_SUFFIX))


def job_id_from_network_name(name: Any) -> Optional[str]:
    """The job id when ``name`` is exactly a job network name, else None."""
    if not looks_like_job_network(name):
        return None
    job_id = name[len(NETWORK_PREFIX):-len(NETWORK_SUFFIX)]
    try:
        validate_job_id(job_id)
    except JobNetError:
        return None
    return job_id


def format_time(epoch: float) -> str:
    return time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(epoch))


_TIME_RE = re.compile(r'^(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$')


def parse_time(text: Any) -> Optional[float]:
    """Epoch seconds for an RFC 3339 time (ours or the daemon's ``Created``), else None."""
    if not isinstance(text, str):
        return None
    match = _TIME_RE.match(text.strip())
    if not match:
        return None
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    try:
        epoch = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    except (ValueError, OverflowError):
        return None
    frac = match.group(7)
    if frac:
        epoch += float('0' + frac[:10])
    zone = match.group(8)
    if zone != 'Z':
        sign = 1 if zone[0] == '+' else -1
        epoch -= sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    # The daemon reports 0001-01-01T00:00:00Z for "unknown".
    if year < 1971:
        return None
    return epoch


def job_labels(job_id: str, now: Optional[float] = None, host: Optional[str] = None) -> Dict[str, str]:
    """The labels that mark a job network as ours."""
    validate_job_id(job_id)
    return {
        LABEL_JOB_ID: job_id,
        LABEL_CREATED: format_time(time.time() if now is None else now),
        LABEL_OWNER_HOST: host if host is not None else socket.gethostname(),
    }


def proxy_url(proxy_name: str = PROXY_NAME, proxy_port: int = PROXY_PORT) -> str:
    return 'http://%s:%d' % (proxy_name, int(proxy_port))


def job_env(proxy_name: str = PROXY_NAME, proxy_port: int = PROXY_PORT, no_proxy: str = NO_PROXY) -> Dict[str, str]:
    """The environment a job container needs on its network (uppercase only).

    ``NODE_USE_ENV_PROXY=1`` makes Node's global fetch honour the variables;
    the seed's worker sets all four itself.
    """
    url = proxy_url(proxy_name, proxy_port)
    return {
        'HTTPS_PROXY': url,
        'HTTP_PROXY': url,
        'NO_PROXY': no_proxy,
        'NODE_USE_ENV_PROXY': '1',
    }


def ownership_problem(attrs: Dict[str, Any], job_id: str) -> Optional[str]:
    """None when the network may be treated as ours, else why not (for errors)."""
    labels = attrs.get('Labels') or {}
    if LABEL_JOB_ID in labels:
        if labels[LABEL_JOB_ID] != job_id:
            return 'its label %s says job %r' % (LABEL_JOB_ID, labels[LABEL_JOB_ID])
        return None
    if labels:
        return 'it carries labels that are not ours (%s)' % ', '.join(sorted(labels))
    return None
