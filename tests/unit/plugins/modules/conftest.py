"""The fake engines the module tests share: what an engine answered, and nothing that would change it."""

import types

import pytest


class _Response(object):
    def __init__(self, payload):
        self.payload = payload

    def raise_for_status(self):
        return None

    def json(self):
        return self.payload


class _Api(object):
    """libpod's info, the one call the limits decision makes beyond the version."""

    base_url = 'http+docker://localhost'

    def __init__(self, cgroup_version, rootless):
        self.info = {'host': {'security': {'rootless': rootless}, 'cgroupVersion': cgroup_version}}

    def get(self, url, timeout=None):
        assert url.endswith('/v4.0.0/libpod/info'), url
        return _Response(self.info)


class _Untouchable(object):
    def __getattr__(self, name):
        raise AssertionError('the engine was asked to %s' % name)


class PodmanClient(object):
    """What Podman 4.3.1 answered (version, libpod info): rootless on a cgroup v1 host unless told otherwise.
    Any call that would list or change containers, networks or images fails the test."""

    def __init__(self, cgroup_version='v1', rootless=True):
        self.api = _Api(cgroup_version, rootless)
        self.containers = _Untouchable()
        self.networks = _Untouchable()
        self.images = _Untouchable()

    def version(self):
        return {'Version': '4.3.1', 'ApiVersion': '1.41',
                'Components': [{'Name': 'Podman Engine', 'Version': '4.3.1'}]}


class DockerClient(PodmanClient):
    """A Docker Engine 20.10.24 on cgroup v2: no Podman component in its version."""

    def version(self):
        return {'Version': '20.10.24', 'ApiVersion': '1.41', 'Components': [{'Name': 'Engine', 'Version': '20.10.24'}]}

    def info(self):
        return {'CgroupVersion': '2', 'SecurityOptions': []}


@pytest.fixture
def fake_engine():
    """The fake engine classes: ``fake_engine.podman(cgroup_version, rootless)`` and ``fake_engine.docker()``."""
    return types.SimpleNamespace(podman=PodmanClient, docker=DockerClient)
