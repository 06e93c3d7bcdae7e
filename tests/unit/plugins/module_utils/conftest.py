"""Shared fixtures of the module_utils unit tests."""

import pytest


class FakeModule(object):
    """Stands in for AnsibleModule where module_utils only read params and call fail_json."""

    def __init__(self, params):
        self.params = params
        self.failed = None

    def fail_json(self, **kwargs):
        self.failed = kwargs
        raise SystemExit(1)


@pytest.fixture
def fake_module():
    return FakeModule


@pytest.fixture(autouse=True)
def job_network_lock_dir(tmp_path_factory, monkeypatch):
    """Each test takes the job-network lock (_jobnet_lock) in a folder of its own, never /run/lock."""
    folder = tmp_path_factory.mktemp('locks')
    monkeypatch.setenv('PI_EGRESS_LOCK_DIR', str(folder))
    return str(folder)


class FakeGateway(object):
    """GetSandboxConfig answered from ``policies`` ({(workspace, name): SandboxPolicy}); every request recorded."""

    def __init__(self):
        from concurrent import futures

        import grpc
        from openshell._proto import openshell_pb2_grpc, sandbox_pb2

        self.policies = {}
        self.requests = []
        gateway = self

        class Servicer(openshell_pb2_grpc.OpenShellServicer):
            def GetSandboxConfig(self, request, context):  # noqa: N802 - the service's method name
                gateway.requests.append((request.workspace_scope.workspace, request.name))
                key = (request.workspace_scope.workspace, request.name)
                if key not in gateway.policies:
                    context.abort(grpc.StatusCode.NOT_FOUND, 'sandbox %s not found' % request.name)
                policy = gateway.policies[key]
                if policy is None:
                    return sandbox_pb2.GetSandboxConfigResponse(configuration_error='not admitted yet')
                return sandbox_pb2.GetSandboxConfigResponse(policy=policy, version=3, policy_hash='h')

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        openshell_pb2_grpc.add_OpenShellServicer_to_server(Servicer(), self.server)
        self.port = self.server.add_insecure_port('127.0.0.1:0')
        self.endpoint = '127.0.0.1:%d' % self.port
        self.server.start()

    def serve(self, workspace, name, policy):
        from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import schema as _schema
        self.policies[(workspace, name)] = _schema.parse(policy, 'served') if policy is not None else None


@pytest.fixture
def fake_gateway():
    """A gRPC server of the openshell package's own OpenShell service on 127.0.0.1 (skipped without the package)."""
    pytest.importorskip('grpc')
    pytest.importorskip('openshell')
    gateway = FakeGateway()
    yield gateway
    gateway.server.stop(None)
