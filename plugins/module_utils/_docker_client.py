# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The one place that talks to the Docker Engine.

Modules and the job-runner API get a client from :func:`connect`; every
daemon failure becomes an :class:`EngineError` whose message says what to
do. The Docker SDK for Python is imported lazily so that pure logic and
``ansible-doc`` never need it.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import traceback

DOCKER_IMPORT_ERROR = None
try:
    import docker  # noqa: F401  pylint: disable=unused-import
    from docker import errors as docker_errors
except ImportError:  # pragma: no cover - exercised only without the SDK
    docker = None
    docker_errors = None
    DOCKER_IMPORT_ERROR = traceback.format_exc()

DEFAULT_TIMEOUT = 60

# Connection options every module that talks to the engine accepts.
DOCKER_ARGUMENT_SPEC = dict(
    docker_host=dict(type='str', default=None, aliases=['docker_url']),
    docker_timeout=dict(type='int', default=DEFAULT_TIMEOUT),
)


class EngineError(Exception):
    """A Docker Engine call failed; the message names the fix."""

    def __init__(self, message, retryable=False):
        super(EngineError, self).__init__(message)
        self.retryable = retryable


class EngineUnavailable(EngineError):
    """The daemon did not answer (retryable: nothing was decided)."""

    def __init__(self, message):
        super(EngineUnavailable, self).__init__(message, retryable=True)


def sdk_missing_message():
    return ("The Docker SDK for Python is not installed on the target host. "
            "Install it with 'pip install docker' (the collection's "
            "requirements.txt pins the tested version).")


def describe_host(docker_host):
    return docker_host or 'the local daemon (DOCKER_HOST or unix:///var/run/docker.sock)'


def connect(docker_host=None, timeout=DEFAULT_TIMEOUT):
    """Return a ``docker.DockerClient`` that has answered a ping.

    Raises EngineUnavailable when the daemon does not answer.
    """
    if docker is None:
        raise EngineError(sdk_missing_message())
    try:
        if docker_host:
            client = docker.DockerClient(base_url=docker_host, timeout=timeout)
        else:
            client = docker.from_env(timeout=timeout)
        client.ping()
    except Exception as exc:  # the SDK raises several unrelated types here
        raise EngineUnavailable(
            "The Docker Engine at %s does not answer (%s). Start it "
            "(systemctl start docker, or dockerd in the background) or set "
            "docker_host to the daemon to use." % (describe_host(docker_host), exc))
    return client


def is_not_found(exc):
    return docker_errors is not None and isinstance(exc, docker_errors.NotFound)


def api_message(exc):
    """The daemon's own words for an API error."""
    explanation = getattr(exc, 'explanation', None)
    if explanation:
        if isinstance(explanation, bytes):
            explanation = explanation.decode('utf-8', 'replace')
        return str(explanation)
    return str(exc)


def get_container(client, name):
    """Container object or None when there is no such container."""
    try:
        return client.containers.get(name)
    except Exception as exc:
        if is_not_found(exc):
            return None
        raise EngineError("Inspecting container %s failed: %s" % (name, api_message(exc)))


def get_network(client, name):
    """Network object or None; matches the exact name, never an id prefix."""
    try:
        nets = client.networks.list(names=[name])
    except Exception as exc:
        raise EngineError("Listing networks failed: %s" % api_message(exc))
    for net in nets:
        if net.name == name:
            net.reload()
            return net
    return None


def get_image(client, name):
    try:
        return client.images.get(name)
    except Exception as exc:
        if is_not_found(exc):
            return None
        raise EngineError("Inspecting image %s failed: %s" % (name, api_message(exc)))


def exec_in(container, cmd, timeout_hint=None):
    """Run ``cmd`` (a list) in a running container; return (rc, output)."""
    try:
        result = container.exec_run(cmd, stdout=True, stderr=True)
    except Exception as exc:
        raise EngineError("Running %s in %s failed: %s" % (' '.join(cmd), container.name, api_message(exc)))
    output = result.output or b''
    if isinstance(output, bytes):
        output = output.decode('utf-8', 'replace')
    return result.exit_code, output
