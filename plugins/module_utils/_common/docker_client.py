# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The one place that talks to the Docker Engine.

Modules and the job-runner API get a client from :func:`connect`; every
daemon failure becomes an :class:`EngineError` whose message says what to
do. The Docker SDK for Python is imported lazily so that pure logic and
``ansible-doc`` never need it.
"""

from __future__ import annotations

import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar

T = TypeVar('T')

DOCKER_IMPORT_ERROR = None
try:
    import docker  # noqa: F401  pylint: disable=unused-import
    from docker import errors as docker_errors
except ImportError:  # pragma: no cover - exercised only without the SDK
    docker = None
    docker_errors = None
    DOCKER_IMPORT_ERROR = traceback.format_exc()

DEFAULT_TIMEOUT = 60
DEFAULT_RETRIES = 2
RETRY_DELAY = 1.0

# Connection options every module that talks to the engine accepts (doc fragment
# pi_dispatch.egress.docker; action group pi_dispatch.egress.docker in meta/runtime.yml, so
# module_defaults can set them once for every daemon-facing module).
DOCKER_ARGUMENT_SPEC = dict(
    docker_host=dict(type='str', default=None, aliases=['docker_url']),
    docker_timeout=dict(type='int', default=DEFAULT_TIMEOUT),
    docker_retries=dict(type='int', default=DEFAULT_RETRIES),
    tls=dict(type='bool', default=False),
    validate_certs=dict(type='bool', default=False, aliases=['tls_verify']),
    ca_path=dict(type='path', default=None, aliases=['ca_cert', 'tls_ca_cert']),
    client_cert=dict(type='path', default=None, aliases=['tls_client_cert']),
    client_key=dict(type='path', default=None, aliases=['tls_client_key']),
)

CONNECTION_KEYS = tuple(DOCKER_ARGUMENT_SPEC)


class EngineError(Exception):
    """A Docker Engine call failed; the message names the fix."""

    def __init__(self, message: str, retryable: bool = False) -> None:
        super(EngineError, self).__init__(message)
        self.retryable = retryable


class EngineUnavailable(EngineError):
    """The daemon did not answer (retryable: nothing was decided)."""

    def __init__(self, message: str) -> None:
        super(EngineUnavailable, self).__init__(message, retryable=True)


def sdk_missing_message() -> str:
    return ("The Docker SDK for Python is not installed on the target host. "
            "Install it with 'pip install docker' (the collection's "
            "requirements.txt pins the tested version).")


def describe_host(docker_host: Optional[str]) -> str:
    return docker_host or 'the local daemon (DOCKER_HOST or unix:///var/run/docker.sock)'


def argument_spec(own: Dict[str, Any]) -> Dict[str, Any]:
    """``own`` (a module's options) plus the shared connection options."""
    spec = dict(own)
    spec.update(DOCKER_ARGUMENT_SPEC)
    return spec


def check_connection_options(options: Dict[str, Any]) -> Optional[str]:
    """Refuse a TLS setup that cannot work, before any connection is tried.

    Returns the error text, or None when the options are consistent.
    """
    cert, key = options.get('client_cert'), options.get('client_key')
    if bool(cert) != bool(key):
        return ("client_cert and client_key go together (the daemon checks the pair); "
                "set both or neither.")
    uses_tls = options.get('tls') or options.get('validate_certs') or cert or options.get('ca_path')
    host = options.get('docker_host') or ''
    if uses_tls and host.startswith('unix://'):
        return ("TLS options were given for %s, a local socket; TLS needs a tcp:// docker_host "
                "(for example tcp://engine.example:2376)." % host)
    if options.get('validate_certs') and not options.get('ca_path'):
        return ("validate_certs needs ca_path, the CA that signed the daemon's certificate "
                "(docker's ca.pem).")
    timeout = options.get('docker_timeout', DEFAULT_TIMEOUT)
    if timeout is not None and timeout < 1:
        return "docker_timeout %s is not a number of seconds; use 1 or more (default %d)." % (timeout, DEFAULT_TIMEOUT)
    retries = options.get('docker_retries', DEFAULT_RETRIES)
    if retries is not None and not 0 <= retries <= 10:
        return "docker_retries %s is out of range; use 0 to 10 (default %d)." % (retries, DEFAULT_RETRIES)
    return None


def tls_config(options: Dict[str, Any]) -> Any:
    """``docker.tls.TLSConfig`` for the options, or None when TLS is off."""
    cert, key, ca = options.get('client_cert'), options.get('client_key'), options.get('ca_path')
    if not (options.get('tls') or options.get('validate_certs') or cert or ca):
        return None
    from docker.tls import TLSConfig  # pylint: disable=import-outside-toplevel
    return TLSConfig(client_cert=(cert, key) if cert else None,
                     ca_cert=ca if options.get('validate_certs') else None,
                     verify=bool(options.get('validate_certs')))


def _sleep(seconds: float) -> None:
    import time  # pylint: disable=import-outside-toplevel
    time.sleep(seconds)


def retry(call: Callable[[], T], retries: int = DEFAULT_RETRIES, delay: float = RETRY_DELAY,
          sleep: Callable[[float], None] = _sleep) -> T:
    """Run ``call()``; repeat it while it raises a retryable EngineError, at most ``retries`` more times.

    Only for calls that decide nothing (ping, inspect, list): a write is never repeated.
    """
    attempt = 0
    while True:
        try:
            return call()
        except EngineError as exc:
            if not exc.retryable or attempt >= retries:
                raise
            attempt += 1
            sleep(delay * attempt)


def build_client(docker_host: Optional[str] = None, timeout: int = DEFAULT_TIMEOUT, **options: Any) -> Any:
    """A ``docker.DockerClient`` for the options, not pinged (the SDK may still ask the API version once)."""
    tls = tls_config(options)
    if docker_host or tls:
        return docker.DockerClient(base_url=docker_host, timeout=timeout, tls=tls or False)
    return docker.from_env(timeout=timeout)


def tls_options(params: Dict[str, Any]) -> Dict[str, Any]:
    """The TLS and retry options of a module's params, as keyword arguments of connect() / build_client()."""
    return dict((key, params.get(key)) for key in CONNECTION_KEYS if key not in ('docker_host', 'docker_timeout'))


def connect(docker_host: Optional[str] = None, timeout: int = DEFAULT_TIMEOUT, **options: Any) -> Any:
    """Return a ``docker.DockerClient`` that has answered a ping.

    ``options`` are the other connection options (tls, validate_certs, ca_path, client_cert,
    client_key, docker_retries). Raises EngineError for bad options or a missing SDK and
    EngineUnavailable when the daemon does not answer after the retries.
    """
    if docker is None:
        raise EngineError(sdk_missing_message())
    options = dict(options, docker_host=docker_host, docker_timeout=timeout)
    problem = check_connection_options(options)
    if problem:
        raise EngineError(problem)
    retries = options.get('docker_retries')
    retries = DEFAULT_RETRIES if retries is None else retries

    def attempt() -> Any:
        try:
            others = dict((k, v) for k, v in options.items() if k not in ('docker_host', 'docker_timeout'))
            client = build_client(docker_host, timeout, **others)
            client.ping()
        except Exception as exc:  # the SDK raises several unrelated types here
            raise EngineUnavailable(
                "The Docker Engine at %s does not answer (%s). Start it "
                "(systemctl start docker, or dockerd in the background) or set "
                "docker_host to the daemon to use." % (describe_host(docker_host), exc))
        return client
    return retry(attempt, retries=retries)


def connect_with(params: Dict[str, Any]) -> Any:
    """connect() from a module's params (every key of DOCKER_ARGUMENT_SPEC)."""
    options = dict((key, params.get(key)) for key in CONNECTION_KEYS)
    return connect(options.pop('docker_host'), options.pop('docker_timeout') or DEFAULT_TIMEOUT, **options)


def fail(module: Any, exc: BaseException, result: Optional[Dict[str, Any]] = None,
         suffix: Optional[str] = None) -> None:
    """Fail ``module`` with ``exc``'s message (and its retryable flag); ``suffix`` says what was (not) changed."""
    msg = str(exc)
    if suffix:
        msg = '%s %s' % (msg, suffix)
    module.fail_json(msg=msg, retryable=bool(getattr(exc, 'retryable', False)), **(result or {}))


def module_client(module: Any, result: Optional[Dict[str, Any]] = None, suffix: Optional[str] = None,
                  why: Optional[str] = None) -> Any:
    """A connected client for ``module``, or the module fails with a message naming the fix.

    The one place modules check the SDK and map connection failures: a missing SDK fails with
    Ansible's standard missing_required_lib text (plus ``why``, when the module needs the SDK
    only for some of its work), a daemon that does not answer with ``retryable=True``.
    """
    if docker is None:
        from ansible.module_utils.basic import missing_required_lib  # pylint: disable=import-outside-toplevel
        msg = missing_required_lib('docker') + (' (%s)' % why if why else '')
        module.fail_json(msg=msg, exception=DOCKER_IMPORT_ERROR, **(result or {}))
    try:
        return connect_with(module.params)
    except EngineError as exc:
        fail(module, exc, result, suffix)


# Podman's compatible API answers 500, not 404, for a container removed while it was being read (a unit's
# container with --rm going away under an inspect; measured with Podman 5.4.2: 'no container with ID ... found
# in database: no such container').
PODMAN_GONE = 'no such container'


def is_not_found(exc: BaseException) -> bool:
    """The object is not there: Docker's 404, or Podman's 500 for a container removed while it was read."""
    if docker_errors is None:
        return False
    if isinstance(exc, docker_errors.NotFound):
        return True
    return (isinstance(exc, docker_errors.APIError) and getattr(exc, 'status_code', None) == 500
            and PODMAN_GONE in str(getattr(exc, 'explanation', '') or exc))


TRANSIENT_STATUS = (500, 502, 503, 504)


def is_transient(exc: BaseException) -> bool:
    """True for a failure that says nothing about the object: the daemon was busy or the socket dropped."""
    status = getattr(getattr(exc, 'response', None), 'status_code', None)
    if docker_errors is not None and isinstance(exc, docker_errors.APIError):
        return status in TRANSIENT_STATUS
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    # requests' and urllib3's own types, by name: the SDK does not re-export them.
    return type(exc).__name__ in ('ConnectionError', 'ReadTimeout', 'ConnectTimeout', 'Timeout', 'ProtocolError')


def api_message(exc: BaseException) -> str:
    """The daemon's own words for an API error."""
    explanation = getattr(exc, 'explanation', None)
    if explanation:
        if isinstance(explanation, bytes):
            explanation = explanation.decode('utf-8', 'replace')
        return str(explanation)
    return str(exc)


def engine_error(what: str, exc: BaseException) -> EngineError:
    """EngineError for a failed call: the daemon's words, retryable when the failure was transient."""
    return EngineError("%s failed: %s" % (what, api_message(exc)), retryable=is_transient(exc))


def read(what: str, call: Callable[[], T], retries: int = DEFAULT_RETRIES, missing: bool = False) -> Optional[T]:
    """Run a read-only SDK ``call()`` with retries of transient failures.

    Returns None for a 404 when ``missing`` is True; any other failure becomes EngineError.
    """
    def attempt() -> Optional[T]:
        try:
            return call()
        except Exception as exc:
            if missing and is_not_found(exc):
                return None
            raise engine_error(what, exc)
    return retry(attempt, retries=retries)


def get_container(client: Any, name: str) -> Any:
    """Container object or None when there is no such container."""
    return read("Inspecting container %s" % name, lambda: client.containers.get(name), missing=True)


def get_network(client: Any, name: str) -> Any:
    """Network object or None; matches the exact name, never an id prefix."""
    nets = read("Listing networks", lambda: client.networks.list(names=[name]))
    for net in nets:
        if net.name == name:
            read("Inspecting network %s" % name, net.reload)
            return net
    return None


def get_image(client: Any, name: str) -> Any:
    return read("Inspecting image %s" % name, lambda: client.images.get(name), missing=True)


def exec_in(container: Any, cmd: List[str]) -> Tuple[int, str]:
    """Run ``cmd`` (a list) in a running container; return (rc, output)."""
    try:
        result = container.exec_run(cmd, stdout=True, stderr=True)
    except Exception as exc:
        raise EngineError("Running %s in %s failed: %s" % (' '.join(cmd), container.name, api_message(exc)))
    output = result.output or b''
    if isinstance(output, bytes):
        output = output.decode('utf-8', 'replace')
    return result.exit_code, output


def remove_quietly(api: Any, container: str) -> bool:
    """Force-remove ``container`` where nobody waits on the outcome: a probe or helper container whose removal a
    later run (the sweep, its label, its own exit) or the caller's own report covers. True when removed; False
    when it was gone or the engine refused, which is said nowhere, on purpose. The one place that swallows it."""
    try:
        api.remove_container(container, force=True)
    except Exception:  # pylint: disable=broad-except
        return False
    return True
