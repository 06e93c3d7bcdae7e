# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""A sandbox's policy fetched from an OpenShell gateway, through the ``openshell`` package's own gRPC stub.

The package's ``SandboxClient`` (0.1.5) has no call that returns a sandbox's policy, so the
package's generated ``OpenShellStub`` is used directly: ``GetSandboxConfig`` (the effective
configuration the supervisor polls) for a sandbox name in a workspace, over a plaintext channel
or TLS (a CA, and a client certificate and key for mTLS). Nothing here is imported until a
fetch is asked for, so the file imports cleanly without the package or ``grpcio``.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

DEFAULT_TIMEOUT = 30.0


class GatewayError(Exception):
    """The policy could not be fetched: the gateway, the sandbox, the status and the fix."""


def _read(path: Optional[str], what: str) -> Optional[bytes]:
    if not path:
        return None
    try:
        with open(path, 'rb') as handle:
            return handle.read()
    except OSError as exc:
        raise GatewayError('%s %s cannot be read (%s); name a readable PEM file' % (what, path, exc))


def channel(endpoint: str, ca_path: Optional[str] = None, cert_path: Optional[str] = None,
            key_path: Optional[str] = None) -> Any:
    """A gRPC channel to ``endpoint`` (host:port): TLS when any of the three files is given, else plaintext."""
    import grpc  # pylint: disable=import-outside-toplevel
    if not (ca_path or cert_path or key_path):
        return grpc.insecure_channel(endpoint)
    if bool(cert_path) != bool(key_path):
        raise GatewayError('a client certificate and its key go together (mTLS); give both or neither')
    credentials = grpc.ssl_channel_credentials(root_certificates=_read(ca_path, 'The gateway CA'),
                                               private_key=_read(key_path, 'The client key'),
                                               certificate_chain=_read(cert_path, 'The client certificate'))
    return grpc.secure_channel(endpoint, credentials)


def fetch(endpoint: str, sandbox: str, workspace: str, timeout: float = DEFAULT_TIMEOUT,
          ca_path: Optional[str] = None, cert_path: Optional[str] = None,
          key_path: Optional[str] = None) -> Tuple[str, Any]:
    """(where, the sandbox's ``SandboxPolicy`` message) from the gateway at ``endpoint``. Raises GatewayError."""
    import grpc  # pylint: disable=import-outside-toplevel
    from openshell._proto import (  # pylint: disable=import-outside-toplevel
        datamodel_pb2, openshell_pb2_grpc, sandbox_pb2)
    where = 'gateway %s, sandbox %s in workspace %s' % (endpoint, sandbox, workspace)
    chan = channel(endpoint, ca_path, cert_path, key_path)
    try:
        stub = openshell_pb2_grpc.OpenShellStub(chan)
        request = sandbox_pb2.GetSandboxConfigRequest(
            name=sandbox, workspace_scope=datamodel_pb2.WorkspaceSelector(workspace=workspace))
        response = stub.GetSandboxConfig(request, timeout=timeout)
    except grpc.RpcError as exc:
        code = exc.code() if hasattr(exc, 'code') else None
        name = code.name if code is not None else 'UNKNOWN'
        detail = exc.details() if hasattr(exc, 'details') else str(exc)
        raise GatewayError('%s: GetSandboxConfig failed (%s: %s); check the gateway address, the sandbox name and '
                           'workspace, and the TLS files' % (where, name, detail))
    finally:
        chan.close()
    if not response.HasField('policy'):
        raise GatewayError('%s: the gateway answered with no policy (configuration_error: %r); the sandbox has no '
                           'effective policy yet' % (where, response.configuration_error))
    return where, response.policy
