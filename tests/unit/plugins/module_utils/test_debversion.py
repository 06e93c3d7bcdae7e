"""Debian version comparison (dpkg's rules: epoch, upstream, revision; ~ sorts before everything)."""

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import debversion as _debversion

# (a, b, sign of compare(a, b)); every row is also checked reversed.
TABLE = [
    ('6.13-2', '6.13-2', 0),
    ('6.13-2', '6.13-2+deb13u1', -1),
    ('6.13-2+deb13u4', '6.13-2+deb13u1', 1),
    ('6.13-2+deb13u9', '6.13-2+deb13u10', -1),
    ('6.13-2+deb13u1', '6.13-3', -1),
    ('6.13', '6.13-0', 0),            # no revision equals revision 0
    ('6.13', '6.13-1', -1),
    ('6.9-1', '6.13-1', -1),          # numbers compare as numbers, not text
    ('1:6.13-1', '7.0-1', 1),         # an epoch beats any upstream
    ('0:6.13-1', '6.13-1', 0),        # epoch 0 is no epoch
    ('2:1.0', '1:9.9', 1),
    ('6.13~rc1-1', '6.13-1', -1),     # a tilde sorts before the release
    ('6.13~rc1-1', '6.13~rc2-1', -1),
    ('6.13~~', '6.13~', -1),          # the classic dpkg example: ~~ < ~ < '' < a
    ('6.13~', '6.13', -1),
    ('6.13', '6.13a', -1),
    ('6.13a', '6.13+', -1),           # letters before non-letters
    ('1.0-1ubuntu1', '1.0-1', 1),
    ('1.0.0', '1.0', 1),
    ('1.0-1.1', '1.0-1', 1),
    ('10', '9', 1),
    ('1.001', '1.1', 0),              # leading zeros do not count
]


@pytest.mark.parametrize('older, newer, sign', TABLE)
def test_compare(older, newer, sign):
    assert _debversion.compare(older, newer) == sign
    assert _debversion.compare(newer, older) == -sign


@pytest.mark.parametrize('bad', ['', 'a:1.0', '1.0 2', None, ':1', '1.0-'])
def test_refuses_what_is_not_a_version(bad):
    with pytest.raises(ValueError) as info:
        _debversion.compare(bad, '1.0')
    assert 'Debian version' in str(info.value)
