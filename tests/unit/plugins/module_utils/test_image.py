"""Local image building: the host's Debian mirror, version parsing, build hash."""

import os

import docker
import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import image as _image

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
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..', '..'))


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


# --- the Debian security suite ------------------------------------------------------------------------

SECURITY = [
    ([('debian.sources', DEB822)], 'http://deb.debian.org/debian-security'),
    ([('sources.list', 'deb http://security.debian.org/debian-security bookworm-security main\n')],
     'http://security.debian.org/debian-security'),
    ([('sources.list', 'deb [signed-by=/k.gpg] http://sec.example/debian-security/ trixie-security main\n')],
     'http://sec.example/debian-security'),
    ([('sources.list', 'deb http://mirror.example/debian bookworm main\n')], None),
    ([('sources.list', 'deb http://mirror.example/debian bookworm-updates main\n')], None),
    ([('sources.list', 'deb http://local.example/sec bookworm-security main\n')], 'http://local.example/sec'),
    ([('sources.list', '# deb http://security.debian.org/debian-security bookworm-security main\n')], None),
    ([('sources.list', 'deb-src http://security.debian.org/debian-security bookworm-security main\n')], None),
    ([('x.sources', 'Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\n'
                    'Enabled: no\n')], None),
    ([('sources.list', 'deb file:/srv/debian-security bookworm-security main\n')], 'file:/srv/debian-security'),
    ([('a.list', 'deb http://mirror.example/debian bookworm main\n'),
      ('b.sources', DEB822)], 'http://deb.debian.org/debian-security'),
    ([], None),
]


@pytest.mark.parametrize('sources, want', SECURITY)
def test_security_mirror(sources, want):
    assert _image.security_mirror(sources) == want


HOST_WITH = [('debian.sources', DEB822)]
HOST_WITHOUT = [('sources.list', 'deb http://mirror.example/debian bookworm main\n')]


@pytest.mark.parametrize('option, sources, want', [
    (None, HOST_WITH, 'http://deb.debian.org/debian-security'),
    (None, HOST_WITHOUT, _image.DEFAULT_SECURITY_MIRROR),
    ('http://sec.example/debian-security/', HOST_WITHOUT, 'http://sec.example/debian-security'),
    ('http://sec.example/debian-security', HOST_WITH, 'http://deb.debian.org/debian-security'),  # the host's wins
    ('', HOST_WITH, None),  # empty: off, even when the host carries one
    ('  ', HOST_WITHOUT, None),
])
def test_choose_security_mirror(option, sources, want):
    mirror, source = _image.choose_security_mirror(option, sources)
    assert mirror == want
    assert source  # always says where it came from


def test_default_security_mirror_is_documented():
    import os
    root = ROOT
    with open(os.path.join(root, 'roles', 'proxy', 'defaults', 'main.yml')) as handle:
        assert 'egress_proxy_security_mirror: %s' % _image.DEFAULT_SECURITY_MIRROR in handle.read()
    with open(os.path.join(root, 'docs', 'proxy.md')) as handle:
        assert _image.DEFAULT_SECURITY_MIRROR in handle.read()


def test_security_buildargs_and_the_containerfile_uses_them():
    assert _image.security_buildargs('http://s.example/debian-security', 'trixie') == {
        'SECURITY_MIRROR': 'http://s.example/debian-security', 'SECURITY_SUITE': 'trixie-security'}
    assert _image.security_buildargs(None, 'trixie') == {'SECURITY_MIRROR': '', 'SECURITY_SUITE': ''}
    import os
    root = ROOT
    with open(os.path.join(root, 'roles', 'proxy', 'files', 'Containerfile')) as handle:
        proxy = handle.read()
    with open(os.path.join(root, 'tests', 'images', 'tools', 'Containerfile')) as handle:
        tools = handle.read()
    assert _image.wants_security_args(proxy)
    assert not _image.wants_security_args(tools)  # the tools image gets no such argument (its hash stays)
    with open(os.path.join(root, 'roles', 'proxy', 'files', 'apt-refresh')) as handle:
        refresh = handle.read()
    # The proxy (and the gateway and the interceptor) run the shared apt step, which uses the arguments.
    assert 'sh /usr/lib/pi-dispatch/apt-refresh ' in proxy
    assert '$SECURITY_MIRROR $SECURITY_SUITE main' in refresh
    assert 'apt-get -y upgrade' in refresh


def test_security_args_change_the_build_hash():
    one = dict(BASE_IMAGE='b', **_image.security_buildargs('http://a.example/debian-security', 'trixie'))
    off = dict(BASE_IMAGE='b', **_image.security_buildargs(None, 'trixie'))
    assert _image.build_hash('FROM x', 'sha256:a', one, {}) != _image.build_hash('FROM x', 'sha256:a', off, {})


INSPECT_OUT = ('Squid Cache: Version 6.13\nService Name: squid\n' + _image.PACKAGES_MARK + '\n'
               'libc6 2.41-12\nsquid 6.13-2+deb13u4\nsquidclient 6.13-2+deb13u4\n')


def test_parse_inspect():
    facts = _image.parse_inspect(INSPECT_OUT)
    assert facts['squid_version'] == '6.13'
    assert facts['squid_package'] == '6.13-2+deb13u4'
    assert len(facts['packages_digest']) == 32
    newer = _image.parse_inspect(INSPECT_OUT.replace('libc6 2.41-12', 'libc6 2.41-12+deb13u1'))
    assert newer['packages_digest'] != facts['packages_digest']
    # the order dpkg lists them in does not matter
    shuffled = _image.parse_inspect(INSPECT_OUT.replace('libc6 2.41-12\nsquid 6.13-2+deb13u4\n',
                                                        'squid 6.13-2+deb13u4\nlibc6 2.41-12\n'))
    assert shuffled['packages_digest'] == facts['packages_digest']
    assert _image.parse_inspect('Squid Cache: Version 6.13\n') == dict(
        squid_version='6.13', squid_package=None, packages_digest=None)
    assert _image.parse_inspect('') == dict(squid_version=None, squid_package=None, packages_digest=None)


@pytest.mark.parametrize('packages, expected', [
    ('squid 6.13-2+deb13u4\nsquid-common 6.13-2+deb13u4\n', '6.13-2+deb13u4'),
    ('squid-common 6.13-2+deb13u5\nsquid-openssl 6.13-2+deb13u5\n', '6.13-2+deb13u5'),   # the OpenSSL build
    ('squid-openssl 6.13-2+deb13u5\n', None),                                            # no squid-common: unknown
    ('squid 6.13-2+deb13u4\n', '6.13-2+deb13u4'),                                        # an older image
])
def test_the_squid_package_version_is_squid_commons(packages, expected):
    text = 'Squid Cache: Version 6.13\n%s\nlibc6 2.41-12\n%s' % (_image.PACKAGES_MARK, packages)
    assert _image.parse_inspect(text)['squid_package'] == expected


# --- build_image with a fake daemon: the refresh ----------------------------------------------------------

class FakeImage(object):
    def __init__(self, image_id, labels):
        self.id = image_id
        self.labels = labels


class FakeDaemon(object):
    """Images by tag; builds record their nocache flag; the inspect container prints ``packages``."""

    def __init__(self, packages):
        self.tags = {'base:t': FakeImage('sha256:base', {})}
        self.packages = packages
        self.builds = []
        self.removed = []
        self.counter = 0
        self.images = self
        self.containers = self
        self.api = self

    # client.images
    def get(self, name):
        if name in self.tags:
            return self.tags[name]
        import docker
        raise docker.errors.ImageNotFound(name)

    def build(self, tag=None, labels=None, nocache=False, **kwargs):
        self.counter += 1
        image = FakeImage('sha256:new%d' % self.counter, dict(labels))
        self.tags[tag] = image
        self.builds.append((tag, nocache, sorted(labels)))
        return image, [{'stream': 'built\n'}]

    # client.containers
    def run(self, image_id, cmd, **kwargs):
        return ('Squid Cache: Version 6.13\n%s\n%s' % (_image.PACKAGES_MARK, self.packages)).encode()

    # client.api
    def tag(self, image_id, repo, tagname, force=False):
        self.tags['%s:%s' % (repo, tagname)] = [i for i in self.tags.values() if i.id == image_id][0]

    def remove_image(self, name, noprune=False):
        self.removed.append(name)
        self.tags.pop(name, None)


PKGS = 'libc6 2.41-12\nsquid 6.13-2+deb13u4\n'


def test_build_image_same_hash_builds_nothing():
    pytest.importorskip('docker')
    daemon = FakeDaemon(PKGS)
    first = _image.build_image(daemon, 'p:latest', 'FROM x', 'base:t')
    assert first['changed'] and first['squid_package'] == '6.13-2+deb13u4'
    assert [b[1] for b in daemon.builds] == [False, False]
    again = _image.build_image(daemon, 'p:latest', 'FROM x', 'base:t')
    assert not again['changed'] and again['id'] == first['id'] and len(daemon.builds) == 2
    assert again['squid_package'] == '6.13-2+deb13u4'


def test_refresh_without_new_packages_keeps_the_image():
    pytest.importorskip('docker')
    daemon = FakeDaemon(PKGS)
    first = _image.build_image(daemon, 'p:latest', 'FROM x', 'base:t')
    again = _image.build_image(daemon, 'p:latest', 'FROM x', 'base:t', refresh=True)
    assert daemon.builds[2][1] is True  # no layer cache: apt runs again
    assert daemon.builds[2][0] == 'p:latest-pi-egress-refresh'  # never under the live tag first
    assert not again['changed'] and again['refreshed'] and again['packages_changed'] is False
    assert daemon.tags['p:latest'].id == first['id']
    assert 'p:latest-pi-egress-refresh' in daemon.removed and 'p:latest-pi-egress-refresh' not in daemon.tags


def test_refresh_with_new_packages_replaces_the_image():
    pytest.importorskip('docker')
    daemon = FakeDaemon(PKGS)
    first = _image.build_image(daemon, 'p:latest', 'FROM x', 'base:t')
    daemon.packages = PKGS.replace('deb13u4', 'deb13u5')
    fresh = _image.build_image(daemon, 'p:latest', 'FROM x', 'base:t', refresh=True)
    assert fresh['changed'] and fresh['packages_changed'] and fresh['squid_package'] == '6.13-2+deb13u5'
    assert daemon.tags['p:latest'].id == fresh['id'] != first['id']
    assert daemon.tags['p:latest'].labels[_image.LABEL_SQUID_PACKAGE] == '6.13-2+deb13u5'
    assert 'p:latest-pi-egress-refresh' not in daemon.tags


def test_buildargs_reach_the_build_and_the_hash():
    pytest.importorskip('docker')
    daemon = FakeDaemon(PKGS)
    plain = _image.build_image(daemon, 'p:latest', 'FROM x', 'base:t')
    sec = _image.build_image(daemon, 'p:latest', 'FROM x', 'base:t',
                             buildargs=_image.security_buildargs('http://s.example/debian-security', 'trixie'))
    assert sec['changed'] and sec['build_hash'] != plain['build_hash']


# --- egress_image's run (ensure_image, module_security) ------------------------------------------
MODULE_PARAMS = dict(name='px:latest', containerfile='FROM ${BASE_IMAGE}\n', files={}, base_image='base:trixie',
                     base_build='none', base_suite='trixie', mirror=None, squid=True, security_mirror=None,
                     refresh=False, unless_present=None)


class _Images(object):
    def __init__(self, present):
        self.present = present

    def get(self, name):
        if name not in self.present:
            raise docker.errors.NotFound('no such image')
        return self.present[name]


class _ImageClient(object):
    def __init__(self, **present):
        self.images = _Images(dict((k.replace('_', ':'), v) for k, v in present.items()))


def _result():
    return dict(changed=False, base_built=False, id=None, build_hash=None, refreshed=False)


@pytest.mark.parametrize('containerfile, option, sources, args, warned', [
    ('FROM x\n', None, [], {}, False),
    ('ARG SECURITY_MIRROR\n', '', [], {'SECURITY_MIRROR': '', 'SECURITY_SUITE': ''}, True),
    ('ARG SECURITY_MIRROR\n', 'http://m/debian-security', [],
     {'SECURITY_MIRROR': 'http://m/debian-security', 'SECURITY_SUITE': 'trixie-security'}, False),
])
def test_module_security(monkeypatch, containerfile, option, sources, args, warned):
    monkeypatch.setattr(_image, 'host_sources', lambda root='/etc/apt': sources)
    result = _result()
    params = dict(MODULE_PARAMS, containerfile=containerfile, security_mirror=option)
    buildargs, warning = _image.module_security(params, result)
    assert buildargs == args
    assert bool(warning) is warned and (not warned or 'gets no Debian security suite' in warning)
    assert ('security_mirror' in result) is bool(args)


@pytest.mark.parametrize('params, present, check_mode, fragment, wanted', [
    (dict(unless_present='other:1'), ('other_1',), False, None, dict(present_instead='other:1', changed=False)),
    ({}, (), False, 'Base image base:trixie is not on this daemon and no registry is used', None),
    (dict(base_build='debootstrap'), (), False, 'No Debian mirror found in /etc/apt/sources.list*', None),
    (dict(base_build='debootstrap', mirror='http://m/debian'), (), True, None,
     dict(mirror='http://m/debian', changed=True, base_built=True, build_hash=None)),
])
def test_ensure_image_before_the_build(monkeypatch, params, present, check_mode, fragment, wanted):
    monkeypatch.setattr(_image, 'host_sources', lambda root='/etc/apt': [])
    monkeypatch.setattr(_image, 'build_base', lambda *a, **k: pytest.fail('no base build expected'))
    monkeypatch.setattr(_image, 'build_image', lambda *a, **k: pytest.fail('no build expected'))
    client = _ImageClient(**dict((name, FakeImage('sha256:' + name, {})) for name in present))
    result = _result()
    if fragment:
        with pytest.raises(_image.ImageError) as info:
            _image.ensure_image(client, dict(MODULE_PARAMS, **params), {}, result, check_mode=check_mode)
        assert str(info.value).startswith(fragment)
        assert result == _result()
        return
    _image.ensure_image(client, dict(MODULE_PARAMS, **params), {}, result, check_mode=check_mode)
    assert dict((k, result[k]) for k in wanted) == wanted


@pytest.mark.parametrize('label, refresh, changed', [
    ('same', False, False),
    ('old', False, True),
    ('same', True, True),
    (None, False, True),
])
def test_ensure_image_in_check_mode_compares_the_build_hash(label, refresh, changed):
    base = FakeImage('sha256:base', {})
    wanted = _image.build_hash(MODULE_PARAMS['containerfile'], base.id, {'BASE_IMAGE': 'base:trixie'}, {})
    present = dict(base_trixie=base)
    if label:
        present['px_latest'] = FakeImage('sha256:px', {_image.LABEL_BUILD_HASH: wanted if label == 'same' else 'x',
                                                       _image.LABEL_SQUID_VERSION: '6.13'})
    result = _result()
    _image.ensure_image(_ImageClient(**present), dict(MODULE_PARAMS, refresh=refresh), {}, result, check_mode=True)
    assert result['changed'] is changed and result['build_hash'] == wanted and result['refreshed'] is refresh
    assert result['id'] == ('sha256:px' if label else None)
    assert result['squid_version'] == ('6.13' if label else None)


@pytest.mark.parametrize('refresh', [False, True])
def test_ensure_image_builds_and_reports(monkeypatch, refresh):
    built = dict(id='sha256:new', build_hash='h', squid_version='6.13', squid_package='6.13-1', refreshed=refresh,
                 packages_changed=['squid'], changed=True)
    calls = []
    monkeypatch.setattr(_image, 'build_image', lambda *a, **k: calls.append((a, k)) or built)
    result = _result()
    client = _ImageClient(base_trixie=FakeImage('sha256:base', {}))
    _image.ensure_image(client, dict(MODULE_PARAMS, refresh=refresh), {'SECURITY_MIRROR': ''}, result)
    assert calls[0][1] == dict(squid=True, buildargs={'SECURITY_MIRROR': ''}, refresh=refresh)
    assert result['id'] == 'sha256:new' and result['changed'] is True
    assert ('packages_changed' in result) is refresh
