# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""Job networks: the Engine calls create, teardown and the sweep share, and how their failures read.

Each helper is exactly one low-level ``client.api`` call (``client`` is a
``docker.DockerClient`` from ``_docker_client.connect``), with the daemon's
refusals told apart from a daemon that does not answer:
:func:`connection_failed` / :func:`as_engine_error` turn an SDK exception
into ``EngineError`` (answered) or ``EngineUnavailable`` (no answer,
retryable). :func:`client_memo` is what create and teardown remember about
one client's daemon between calls (the subnet book, the proxy family's
loads), so that a job's start and end do not re-read the whole daemon.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Dict, List, Optional

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common.docker_client import (
    EngineError,
    EngineUnavailable,
    api_message,
    docker_errors,
)


# --------------------------------------------------------------------------
# An answer, or no answer
# --------------------------------------------------------------------------

def status_404(exc: BaseException) -> bool:
    """True when the daemon answered 404 (no such network or container)."""
    return getattr(getattr(exc, 'response', None), 'status_code', None) == 404


def connection_failed(exc: BaseException) -> bool:
    """True when the daemon gave no answer at all (nothing was decided).

    docker.errors.APIError derives from requests' HTTPError, which derives
    from IOError/OSError, so an OSError test alone would call every refusal
    the daemon DID answer ("pool overlaps", "already exists", 404) a
    connection failure. An exception carrying an HTTP response is an answer.
    """
    if isinstance(exc, EngineError):
        return isinstance(exc, EngineUnavailable)
    if docker_errors is not None and isinstance(exc, docker_errors.APIError):
        return False
    if getattr(exc, 'response', None) is not None:
        return False
    name = type(exc).__name__
    return name in ('ConnectionError', 'ReadTimeout', 'ConnectTimeout', 'Timeout') or isinstance(exc, OSError)


def as_engine_error(what: str, exc: BaseException) -> EngineError:
    """``exc`` as EngineError (the daemon answered) or EngineUnavailable (it did not); ``what`` prefixes it."""
    if isinstance(exc, EngineError):
        return exc
    if connection_failed(exc):
        return EngineUnavailable('%s: the Docker Engine does not answer (%s)' % (what, exc))
    return EngineError('%s: %s' % (what, api_message(exc)))


# --------------------------------------------------------------------------
# What a client remembers
# --------------------------------------------------------------------------

_MEMOS = weakref.WeakKeyDictionary()
_MEMO_LOCK = threading.Lock()


def client_memo(client: Any) -> Dict[Any, Any]:
    """A dict that lives as long as ``client`` does: what create and teardown learnt about its daemon.

    Keyed by the client object (one client talks to one daemon), so a new client starts with
    nothing remembered. A client that cannot be weakly referenced gets a fresh dict each time
    (nothing is remembered, every call reads the daemon).
    """
    with _MEMO_LOCK:
        try:
            return _MEMOS.setdefault(client, {})
        except TypeError:
            return {}


# --------------------------------------------------------------------------
# One Engine call each
# --------------------------------------------------------------------------

def inspect_job_network(client: Any, name: str) -> Optional[Dict[str, Any]]:
    """The network's inspect dict, or None. Exact name only.

    Inspecting by a ``pi-job-...`` name cannot match an id prefix (ids are
    hex), and the returned name is compared anyway.
    """
    try:
        attrs = client.api.inspect_network(name)
    except Exception as exc:
        if status_404(exc):
            return None
        raise as_engine_error('Inspecting network %s failed' % name, exc)
    if attrs.get('Name') != name:
        return None
    return attrs


def proxy_on(attrs: Dict[str, Any], proxy_name: str) -> bool:
    """True when ``proxy_name`` has an active endpoint in a network's inspect dict."""
    return any((c or {}).get('Name') == proxy_name for c in (attrs.get('Containers') or {}).values())


def _already_connected(message: str) -> bool:
    text = message.lower()
    return 'already exists in network' in text or 'already attached' in text or 'already connected' in text


def _not_connected(message: str) -> bool:
    text = message.lower()
    return ('is not connected' in text or 'not connected to' in text or 'no such container' in text
            or ('container' in text and 'not found' in text))


def connect_proxy(client: Any, net_ref: str, proxy_name: str, aliases: Optional[List[str]] = None) -> bool:
    """Attach the proxy (or a shard, with ``aliases``); True when attached now, False when it already was."""
    try:
        client.api.connect_container_to_network(proxy_name, net_ref, aliases=aliases)
    except Exception as exc:
        if connection_failed(exc):
            raise as_engine_error('Attaching %s failed' % proxy_name, exc)
        if _already_connected(api_message(exc)):
            return False
        raise EngineError(api_message(exc))
    return True


def disconnect(client: Any, container: str, net_ref: str) -> bool:
    """Force-detach; True when detached, False when it was not attached."""
    try:
        client.api.disconnect_container_from_network(container, net_ref, force=True)
    except Exception as exc:
        if connection_failed(exc):
            raise as_engine_error('Detaching %s failed' % container, exc)
        message = api_message(exc)
        if status_404(exc) or _not_connected(message):
            return False
        raise EngineError(message)
    return True


def remove_network(client: Any, net_ref: str) -> bool:
    """True when removed, False when it was already gone."""
    try:
        client.api.remove_network(net_ref)
    except Exception as exc:
        if status_404(exc):
            return False
        if connection_failed(exc):
            raise as_engine_error('Removing network %s failed' % net_ref, exc)
        raise EngineError(api_message(exc))
    return True


def summary_name(summary: Dict[str, Any]) -> str:
    """A container's name from its ``containers()`` summary (else its short id)."""
    names = summary.get('Names') or []
    return names[0].lstrip('/') if names else summary.get('Id', '')[:12]


def list_networks(client: Any) -> List[Dict[str, Any]]:
    """Every network the daemon has (one listing)."""
    try:
        return client.api.networks()
    except Exception as exc:
        raise as_engine_error('Listing networks failed', exc)
