"""Local image building: the host's Debian mirror, version parsing, build hash."""

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils import _image

DEB822 = """Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
"""

MIRRORS = [
    ([('debian.sources', DEB822)], 'http://deb.debian.org/debian'),
    ([('sources.list', 'deb http://mirror.example/debian bookworm main\n')], 'http://mirror.example/debian'),
    ([('sources.list', 'deb [arch=amd64 signed-by=/k.gpg] http://m.example/debian/ bookworm main\n')],
     'http://m.example/debian'),
    ([('sources.list', '# deb http://commented.example/debian bookworm main\n'
                       'deb http://security.debian.org/debian-security bookworm-security main\n'
                       'deb http://real.example/debian bookworm main\n')], 'http://real.example/debian'),
    ([('sources.list', 'deb http://m.example/debian bookworm-updates main\n')], None),
    ([('sources.list', 'deb-src http://src.example/debian bookworm main\n')], None),
    ([('x.sources', 'Types: deb\nURIs: http://off.example/debian\nSuites: bookworm\nEnabled: no\n')], None),
    ([('x.sources', 'Types: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\n')], None),
    ([('a.list', ''), ('b.sources', DEB822)], 'http://deb.debian.org/debian'),
    ([('sources.list', 'deb cdrom:[Debian]/ bookworm main\n'
                       'deb file:/srv/mirror bookworm main\n')], 'file:/srv/mirror'),
    ([], None),
]


@pytest.mark.parametrize('sources, want', MIRRORS)
def test_debian_mirror(sources, want):
    assert _image.debian_mirror(sources) == want


@pytest.mark.parametrize('text, want', [
    ('Squid Cache: Version 6.13\nService Name: squid\n', '6.13'),
    ('Squid Cache: Version 5.7-1\n', '5.7-1'),
    ('no squid here', None),
    ('', None),
])
def test_parse_squid_version(text, want):
    assert _image.parse_squid_version(text) == want


def test_build_hash_covers_every_input():
    base = _image.build_hash('FROM x', 'sha256:a', {'BASE_IMAGE': 'b'}, {'f': '1'})
    assert base == _image.build_hash('FROM x', 'sha256:a', {'BASE_IMAGE': 'b'}, {'f': '1'})
    others = [
        _image.build_hash('FROM y', 'sha256:a', {'BASE_IMAGE': 'b'}, {'f': '1'}),
        _image.build_hash('FROM x', 'sha256:b', {'BASE_IMAGE': 'b'}, {'f': '1'}),
        _image.build_hash('FROM x', 'sha256:a', {'BASE_IMAGE': 'c'}, {'f': '1'}),
        _image.build_hash('FROM x', 'sha256:a', {'BASE_IMAGE': 'b'}, {'f': '2'}),
        _image.build_hash('FROM x', 'sha256:a', {'BASE_IMAGE': 'b'}, {'g': '1'}),
    ]
    assert len(set(others + [base])) == 6


def test_context_tar_holds_the_containerfile_and_files():
    import tarfile
    buf = _image.context_tar('FROM x\n', {'a.py': 'print(1)\n'})
    with tarfile.open(fileobj=buf) as tar:
        assert sorted(tar.getnames()) == ['Containerfile', 'a.py']
        assert tar.extractfile('Containerfile').read() == b'FROM x\n'
