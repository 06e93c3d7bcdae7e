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
