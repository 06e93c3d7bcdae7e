"""The fake engine client the module_utils unit tests share:
``from ansible_collections.pi_dispatch.egress.tests.unit.plugins.module_utils.fakes import EngineClient``.

A test gives the ``api`` it records with; the client answers ``version`` and ``info`` as Docker Engine 20.10.24
does (or what the test says), which is all ``_common/venue.py`` asks before it decides anything per venue.
"""

DOCKER_VERSION = {'Version': '20.10.24', 'ApiVersion': '1.41',
                  'Components': [{'Name': 'Engine', 'Version': '20.10.24'}]}
DOCKER_INFO = {'CgroupVersion': '2', 'SecurityOptions': []}


class EngineClient(object):
    """``api`` as the test builds it; ``version`` and ``info`` as the engine (Docker Engine 20.10.24 by default)."""

    def __init__(self, api=None, version=None, info=None):
        self.api = api
        self._version = dict(DOCKER_VERSION if version is None else version)
        self._info = dict(DOCKER_INFO if info is None else info)

    def version(self):
        return self._version

    def info(self):
        return self._info
