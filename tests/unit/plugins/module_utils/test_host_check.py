"""What a target host needs: the findings of _host_check, as tables."""

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import venue as _venue
from ansible_collections.pi_dispatch.egress.plugins.module_utils._fleet import host_check as _host_check


@pytest.mark.parametrize('text, expect', [
    ('7.1.0', (7, 1, 0)),
    ('7.0', (7, 0)),
    ('1.45', (1, 45)),
    ('26.1.5+dfsg1', (26, 1, 5)),
    ('20.10.24+dfsg1', (20, 10, 24)),
    ('5.0.3-1', (5, 0, 3)),
    ('7.1.0rc1', (7, 1, 0)),
    ('', ()),
    ('x.y', ()),
])
def test_version_tuple(text, expect):
    assert _venue.version_tuple(text) == expect


@pytest.mark.parametrize('version, problem', [
    ((3, 13, 5), None),
    ((3, 8, 0), None),
    ((3, 7, 17), 'Python 3.7.17 at /usr/bin/python3 is older than 3.8'),
    ((2, 7, 18), 'Python 2.7.18 at /usr/bin/python3 is older than 3.8'),
])
def test_check_python(version, problem):
    found = _host_check.check_python(version, '/usr/bin/python3')
    if problem is None:
        assert found is None
    else:
        assert found.startswith(problem) and 'ansible_python_interpreter' in found


@pytest.mark.parametrize('sdk, problem', [
    ('7.1.0', None),
    ('7.0.0', None),
    ('8.0.0', None),
    (None, 'the Docker SDK for Python is missing from /opt/py/bin/python on this host'),
    ('6.1.3', 'the Docker SDK for Python at /opt/py/bin/python is 6.1.3, older than 7.0'),
    ('5.0.3', 'the Docker SDK for Python at /opt/py/bin/python is 5.0.3, older than 7.0'),
])
def test_check_sdk(sdk, problem):
    found = _host_check.check_sdk(sdk, '/opt/py/bin/python')
    if problem is None:
        assert found is None
    else:
        assert found.startswith(problem)
        # the fix names both ways to install it and the interpreter way out
        assert "apt-get install python3-docker" in found
        assert '/opt/py/bin/python -m pip install "docker>=7.0"' in found
        assert 'ansible_python_interpreter' in found


@pytest.mark.parametrize('missing, problem', [
    ([], None),
    (['publicsuffixlist'], "publicsuffixlist is missing from /usr/bin/python3 on this host"),
    (['publicsuffixlist', 'requests'], "publicsuffixlist, requests are missing from /usr/bin/python3"),
])
def test_check_libraries(missing, problem):
    found = _host_check.check_libraries(missing, '/usr/bin/python3')
    if problem is None:
        assert found is None
    else:
        assert found.startswith(problem)
        assert "/usr/bin/python3 -m pip install %s" % ' '.join(missing) in found


@pytest.mark.parametrize('api, problem', [
    ('1.45', None),
    ('1.41', None),
    ('1.40', 'the Docker Engine at unix:///x.sock is 19.03.15 (API 1.40), older than API 1.41'),
    ('1.9', 'the Docker Engine at unix:///x.sock is 19.03.15 (API 1.9), older than API 1.41'),
])
def test_check_api(api, problem):
    found = _host_check.check_api(api, '19.03.15', 'unix:///x.sock')
    assert found == (None if problem is None else problem + '; upgrade the engine on this host')


class _FakeIptables(object):
    """A Runner whose ``iptables -V`` answers ``answer`` (rc, stdout, stderr); netns set, so no PATH lookup."""

    netns = 'fake'

    def __init__(self, answer):
        self.answer = answer
        self.calls = []

    def run(self, argv, stdin=None):
        self.calls.append(list(argv))
        return self.answer


@pytest.mark.parametrize('answer, variant, why', [
    ((0, 'iptables v1.8.9 (nf_tables)\n', ''), 'nft', None),
    ((0, 'iptables v1.8.9 (legacy)\n', ''), 'legacy', None),
    ((0, 'iptables v1.6.1\n', ''), 'legacy', None),               # before 1.8 there is no variant: legacy
    ((127, '', 'iptables: not found'), None, 'iptables -V failed (rc 127)'),
    ((0, 'something else\n', ''), None, 'neither iptables-nft nor iptables-legacy'),
])
def test_iptables_variant(answer, variant, why):
    runner = _FakeIptables(answer)
    found = _host_check.iptables_variant(runner)
    assert runner.calls == [['iptables', '-V']]
    assert found['variant'] == variant
    if why is None:
        assert found['why'] is None and found['version'] == answer[1].strip()
    else:
        assert why in found['why'] and found['version'] is None
