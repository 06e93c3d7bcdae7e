"""A project's protocol opt-ins (.pi-container/config.yaml, egress.allow): validate, load and seed, describe."""

import os

import pytest
import yaml

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import optins as O

PATH = '/srv/project/.pi-container/config.yaml'


def allow(**keys):
    return {'egress': {'allow': keys}}


# (id, document, tcp ports, udp ports, wide)
VALID = [
    ('seed', yaml.safe_load(O.SEED), {}, {}, []),
    ('none', None, {}, {}, []),
    ('empty-mapping', {}, {}, {}, []),
    ('egress-absent', {'nested_containers': {'enabled': True}}, {}, {}, []),
    ('egress-null', {'egress': None}, {}, {}, []),
    ('allow-null', {'egress': {'allow': None}}, {}, {}, []),
    ('allow-empty', allow(), {}, {}, []),
    ('all-false', allow(ssh=False, smtp=False, git=False, ntp=False, tcp_ports=[], udp_ports=[]), {}, {}, []),
    ('all-null', allow(ssh=None, smtp=None, git=None, ntp=None, tcp_ports=None, udp_ports=None), {}, {}, []),
    ('ssh-true', allow(ssh=True), {22: True}, {}, ['ssh']),
    ('ssh-hosts', allow(ssh=['github.com']), {22: ['github.com']}, {}, []),
    ('ssh-hosts-normalised', allow(ssh=['GitHub.com.', ' github.com ', 'gitlab.com']),
     {22: ['github.com', 'gitlab.com']}, {}, []),
    ('ssh-hosts-keep-order', allow(ssh=['gitlab.com', 'github.com']), {22: ['gitlab.com', 'github.com']}, {}, []),
    ('smtp-true', allow(smtp=True), {25: True, 465: True, 587: True}, {}, ['smtp']),
    ('smtp-hosts', allow(smtp=['mail.example.com']),
     {25: ['mail.example.com'], 465: ['mail.example.com'], 587: ['mail.example.com']}, {}, []),
    ('git-true', allow(git=True), {9418: True}, {}, ['git']),
    ('git-hosts', allow(git=['git.kernel.org']), {9418: ['git.kernel.org']}, {}, []),
    ('ntp-true', allow(ntp=True), {}, {123: True}, ['ntp']),
    ('ntp-hosts', allow(ntp=['time.example.com']), {}, {123: ['time.example.com']}, []),
    ('tcp-ports', allow(tcp_ports=[2222, 8443]), {2222: True, 8443: True}, {},
     ['tcp_ports 2222', 'tcp_ports 8443']),
    ('udp-ports', allow(udp_ports=[51820]), {}, {51820: True}, ['udp_ports 51820']),
    ('udp-80-and-443-are-not-reserved', allow(udp_ports=[80, 443]), {}, {80: True, 443: True},
     ['udp_ports 80', 'udp_ports 443']),
    ('tcp-port-bounds', allow(tcp_ports=[1, 65535]), {1: True, 65535: True}, {}, ['tcp_ports 1', 'tcp_ports 65535']),
    ('tcp-port-with-hosts', allow(tcp_ports=[{'port': 2222, 'hosts': ['git.example.com']}]),
     {2222: ['git.example.com']}, {}, []),
    ('udp-port-with-hosts', allow(udp_ports=[{'port': 51820, 'hosts': ['vpn.example.com']}]),
     {}, {51820: ['vpn.example.com']}, []),
    ('same-port-twice-with-hosts', allow(tcp_ports=[{'port': 2222, 'hosts': ['b.example.com']},
                                                    {'port': 2222, 'hosts': ['a.example.com']}]),
     {2222: ['a.example.com', 'b.example.com']}, {}, []),
    ('merge-ssh-list-and-port-22-list', allow(ssh=['github.com'],
                                              tcp_ports=[{'port': 22, 'hosts': ['gitlab.com', 'github.com']}]),
     {22: ['github.com', 'gitlab.com']}, {}, []),
    ('merge-ssh-true-wins', allow(ssh=True, tcp_ports=[{'port': 22, 'hosts': ['gitlab.com']}]),
     {22: True}, {}, ['ssh']),
    ('merge-port-22-true-wins', allow(ssh=['github.com'], tcp_ports=[22]), {22: True}, {}, ['tcp_ports 22']),
    ('merge-ntp-and-udp-123', allow(ntp=['time.example.com'], udp_ports=[{'port': 123, 'hosts': ['ntp.example.org']}]),
     {}, {123: ['ntp.example.org', 'time.example.com']}, []),
    ('everything', allow(ssh=True, smtp=False, git=['git.example.com'], ntp=True, tcp_ports=[2222],
                         udp_ports=[{'port': 51820, 'hosts': ['vpn.example.com']}]),
     {22: True, 9418: ['git.example.com'], 2222: True}, {123: True, 51820: ['vpn.example.com']},
     ['ntp', 'ssh', 'tcp_ports 2222']),
]


@pytest.mark.parametrize('data, tcp, udp, wide', [row[1:] for row in VALID], ids=[row[0] for row in VALID])
def test_validate_accepts(data, tcp, udp, wide):
    result = O.validate(data, PATH)
    assert result.ports == {'tcp': tcp, 'udp': udp}
    assert result.wide == wide
    assert result.path == PATH
    assert result.seeded is False


def test_the_seed_is_deny_all():
    assert O.validate(yaml.safe_load(O.SEED), PATH).as_dict() == O.deny_all(PATH).as_dict()


def test_a_port_listed_twice_opens_it_once():
    result = O.validate(allow(tcp_ports=[2222, 2222]), PATH)
    assert result.ports == {'tcp': {2222: True}, 'udp': {}}


# (id, document, key the message names, a further fragment of the message)
REFUSED = [
    ('top-level-list', ['egress'], None, 'is not a mapping'),
    ('top-level-text', 'egress', None, 'is not a mapping'),
    ('egress-not-mapping', {'egress': ['allow']}, 'egress', 'must be a mapping'),
    ('egress-text', {'egress': 'allow'}, 'egress', 'must be a mapping'),
    ('egress-extra-key', {'egress': {'allow': {}, 'deny': {}}}, 'egress', "'deny'"),
    ('allow-not-mapping', {'egress': {'allow': ['ssh']}}, 'egress.allow', 'not a mapping'),
    ('allow-true', {'egress': {'allow': True}}, 'egress.allow', 'not a mapping'),
    ('unknown-key', allow(https=True), 'egress.allow.https', 'not a known key'),
    ('unknown-key-case', allow(SSH=True), 'egress.allow.SSH', 'not a known key'),
    ('unknown-key-beside-valid', allow(ssh=True, ftp=True), 'egress.allow.ftp', 'not a known key'),
    ('port-0', allow(tcp_ports=[0]), 'egress.allow.tcp_ports', '1 to 65535'),
    ('port-65536', allow(tcp_ports=[65536]), 'egress.allow.tcp_ports', '1 to 65535'),
    ('port-negative', allow(udp_ports=[-1]), 'egress.allow.udp_ports', '1 to 65535'),
    ('port-text', allow(tcp_ports=['22']), 'egress.allow.tcp_ports', '1 to 65535'),
    ('port-true', allow(tcp_ports=[True]), 'egress.allow.tcp_ports', '1 to 65535'),
    ('port-float', allow(tcp_ports=[22.0]), 'egress.allow.tcp_ports', '1 to 65535'),
    ('port-null', allow(udp_ports=[None]), 'egress.allow.udp_ports', '1 to 65535'),
    ('dict-port-text', allow(tcp_ports=[{'port': '2222', 'hosts': ['a.example.com']}]),
     'egress.allow.tcp_ports', '1 to 65535'),
    ('reserved-tcp-53', allow(tcp_ports=[53]), 'egress.allow.tcp_ports', "gateway's own port"),
    ('reserved-tcp-80', allow(tcp_ports=[80]), 'egress.allow.tcp_ports', "gateway's own port"),
    ('reserved-tcp-443', allow(tcp_ports=[443]), 'egress.allow.tcp_ports', "gateway's own port"),
    ('reserved-udp-53', allow(udp_ports=[53]), 'egress.allow.udp_ports', "gateway's own port"),
    ('reserved-tcp-443-with-hosts', allow(tcp_ports=[{'port': 443, 'hosts': ['a.example.com']}]),
     'egress.allow.tcp_ports', "gateway's own port"),
    ('hosts-ipv4-literal', allow(ssh=['192.0.2.10']), 'egress.allow.ssh', 'IP literal'),
    ('hosts-ipv6-literal', allow(ssh=['2001:db8::1']), 'egress.allow.ssh', 'IP literal'),
    ('hosts-leading-dot-wildcard', allow(ssh=['.github.com']), 'egress.allow.ssh', 'wildcard'),
    ('hosts-star-wildcard', allow(smtp=['*.example.com']), 'egress.allow.smtp', 'wildcard'),
    ('hosts-single-label', allow(ssh=['localhost']), 'egress.allow.ssh', 'fully qualified'),
    ('hosts-with-port', allow(ssh=['github.com:22']), 'egress.allow.ssh', 'fully qualified'),
    ('hosts-with-scheme', allow(git=['git://git.example.com']), 'egress.allow.git', 'fully qualified'),
    ('hosts-empty-label', allow(ssh=['git..example.com']), 'egress.allow.ssh', 'fully qualified'),
    ('hosts-long-label', allow(ssh=['%s.example.com' % ('a' * 64)]), 'egress.allow.ssh', 'fully qualified'),
    ('hosts-empty-name', allow(ssh=['']), 'egress.allow.ssh', 'fully qualified'),
    ('hosts-not-text', allow(ssh=[22]), 'egress.allow.ssh', 'is not a host name'),
    ('hosts-empty-list', allow(ssh=[]), 'egress.allow.ssh', 'non-empty list'),
    ('hosts-not-list', allow(ssh='github.com'), 'egress.allow.ssh', 'non-empty list'),
    ('hosts-mapping', allow(ntp={'host': 'time.example.com'}), 'egress.allow.ntp', 'non-empty list'),
    ('hosts-number', allow(git=1), 'egress.allow.git', 'non-empty list'),
    ('port-list-not-list', allow(tcp_ports=2222), 'egress.allow.tcp_ports', 'is not a list'),
    ('port-list-mapping', allow(udp_ports={'port': 51820}), 'egress.allow.udp_ports', 'is not a list'),
    ('dict-missing-hosts', allow(tcp_ports=[{'port': 2222}]), 'egress.allow.tcp_ports', 'port and hosts'),
    ('dict-missing-port', allow(tcp_ports=[{'hosts': ['a.example.com']}]), 'egress.allow.tcp_ports', 'port and hosts'),
    ('dict-extra-key', allow(udp_ports=[{'port': 51820, 'hosts': ['vpn.example.com'], 'proto': 'udp'}]),
     'egress.allow.udp_ports', 'port and hosts'),
    ('dict-hosts-empty', allow(tcp_ports=[{'port': 2222, 'hosts': []}]), 'egress.allow.tcp_ports.hosts',
     'non-empty list'),
    ('dict-hosts-ip', allow(tcp_ports=[{'port': 2222, 'hosts': ['198.51.100.7']}]),
     'egress.allow.tcp_ports.hosts', 'IP literal'),
]


@pytest.mark.parametrize('data, key, fragment', [row[1:] for row in REFUSED], ids=[row[0] for row in REFUSED])
def test_validate_refuses(data, key, fragment):
    with pytest.raises(O.OptinError) as info:
        O.validate(data, PATH)
    message = str(info.value)
    assert message.startswith(PATH)
    if key is not None:
        assert key in message
    assert fragment in message
    assert 'Fix:' in message
    assert 'Nothing was created.' in message


# --- load -----------------------------------------------------------------------------------------


@pytest.fixture
def folder(tmp_path):
    path = tmp_path / '.pi-container'
    path.mkdir()
    return path


def test_load_seeds_a_missing_file_once(folder):
    path = folder / 'config.yaml'
    first = O.load(str(path))
    assert first.seeded is True
    assert first.ports == {'tcp': {}, 'udp': {}}
    assert first.wide == []
    assert first.path == str(path)
    assert path.read_text(encoding='utf-8') == O.SEED
    stamp = path.stat().st_mtime_ns
    inode = path.stat().st_ino
    second = O.load(str(path))
    assert second.seeded is False
    assert second.as_config() == first.as_config()
    assert path.read_text(encoding='utf-8') == O.SEED
    assert path.stat().st_mtime_ns == stamp
    assert path.stat().st_ino == inode


def test_load_keeps_a_project_file(folder):
    path = folder / 'config.yaml'
    text = 'egress:\n  allow:\n    ssh: [github.com]\n'
    path.write_text(text, encoding='utf-8')
    result = O.load(str(path))
    assert result.seeded is False
    assert result.ports == {'tcp': {22: ['github.com']}, 'udp': {}}
    assert path.read_text(encoding='utf-8') == text
    assert sorted(os.listdir(str(folder))) == ['config.yaml']


def test_load_refuses_a_missing_folder(tmp_path):
    path = tmp_path / 'absent' / 'config.yaml'
    with pytest.raises(O.OptinError) as info:
        O.load(str(path))
    assert str(path) in str(info.value)
    assert str(path.parent) in str(info.value)
    assert 'Fix:' in str(info.value)
    assert not path.parent.exists()


def test_load_refuses_a_symlink(folder):
    target = folder / 'real.yaml'
    target.write_text(O.SEED, encoding='utf-8')
    link = folder / 'config.yaml'
    link.symlink_to(target)
    with pytest.raises(O.OptinError, match='symlink') as info:
        O.load(str(link))
    assert str(link) in str(info.value)
    assert 'Fix:' in str(info.value)


def test_load_refuses_a_dangling_symlink_and_writes_nothing(folder):
    link = folder / 'config.yaml'
    link.symlink_to(folder / 'nowhere.yaml')
    with pytest.raises(O.OptinError, match='symlink'):
        O.load(str(link))
    assert not (folder / 'nowhere.yaml').exists()


def test_load_refuses_a_directory(folder):
    path = folder / 'config.yaml'
    path.mkdir()
    with pytest.raises(O.OptinError, match='not a regular file') as info:
        O.load(str(path))
    assert str(path) in str(info.value)


@pytest.mark.parametrize('path', ['config.yaml', '.pi-container/config.yaml', './config.yaml', ''])
def test_load_refuses_a_relative_path(path):
    with pytest.raises(O.OptinError, match='not absolute') as info:
        O.load(path)
    assert repr(path) in str(info.value)
    assert 'Fix:' in str(info.value)


# (id, text, line the message names)
BAD_YAML = [
    ('unclosed-flow-mapping', 'egress:\n  allow: {ssh: true\n', 3),
    ('unclosed-flow-sequence', 'egress:\n  allow:\n    ssh: [a\n    git: true\n', 4),
    ('bad-indent', 'a: b\n c: d\n', 2),
    ('tab', 'egress:\n\tallow: {}\n', 2),
]


@pytest.mark.parametrize('text, line', [row[1:] for row in BAD_YAML], ids=[row[0] for row in BAD_YAML])
def test_load_refuses_invalid_yaml_naming_the_line(folder, text, line):
    path = folder / 'config.yaml'
    path.write_text(text, encoding='utf-8')
    with pytest.raises(O.OptinError) as info:
        O.load(str(path))
    message = str(info.value)
    assert message.startswith('%s line %d is not valid YAML' % (path, line))
    assert 'Fix:' in message


def test_load_accepts_a_byte_order_mark(folder):
    path = folder / 'config.yaml'
    path.write_bytes(b'\xef\xbb\xbf' + b'egress:\n  allow:\n    ssh: true\n')
    result = O.load(str(path))
    assert result.ports == {'tcp': {22: True}, 'udp': {}}
    assert result.wide == ['ssh']


def test_load_refuses_a_file_that_is_not_utf8(folder):
    path = folder / 'config.yaml'
    path.write_bytes(b'egress:\n  allow:\n    ssh: [caf\xe9.example.com]\n')
    with pytest.raises(O.OptinError, match='not UTF-8') as info:
        O.load(str(path))
    assert str(path) in str(info.value)
    assert 'byte %d' % len(b'egress:\n  allow:\n    ssh: [caf') in str(info.value)


@pytest.mark.parametrize('size, accepted', [(O.MAX_BYTES, True), (O.MAX_BYTES + 1, False), (O.MAX_BYTES * 4, False)])
def test_load_size_limit(folder, size, accepted):
    path = folder / 'config.yaml'
    body = b'egress:\n  allow:\n    git: true\n'
    path.write_bytes(body + b'#' * (size - len(body) - 1) + b'\n')
    assert path.stat().st_size == size
    if accepted:
        assert O.load(str(path)).ports == {'tcp': {9418: True}, 'udp': {}}
    else:
        with pytest.raises(O.OptinError, match='more than %d' % O.MAX_BYTES) as info:
            O.load(str(path))
        assert str(path) in str(info.value)


def test_load_ignores_the_other_tools_keys(folder):
    path = folder / 'config.yaml'
    path.write_text('nested_containers:\n  enabled: true\nimage: example/dev:1\negress:\n  allow:\n    ntp: true\n',
                    encoding='utf-8')
    result = O.load(str(path))
    assert result.ports == {'tcp': {}, 'udp': {123: True}}


def test_load_refuses_an_invalid_policy_naming_the_file(folder):
    path = folder / 'config.yaml'
    path.write_text('egress:\n  allow:\n    tcp_ports: [443]\n', encoding='utf-8')
    with pytest.raises(O.OptinError) as info:
        O.load(str(path))
    assert str(info.value).startswith('%s: egress.allow.tcp_ports = 443' % path)


def test_load_of_an_empty_file_is_deny_all(folder):
    path = folder / 'config.yaml'
    path.write_text('', encoding='utf-8')
    result = O.load(str(path))
    assert result.seeded is False
    assert result.as_config() == {'tcp': {}, 'udp': {}}


# --- the gateway's form, names, describe ------------------------------------------------------------


def test_as_config_has_text_port_keys_in_order():
    result = O.validate(allow(ssh=['github.com'], smtp=True, tcp_ports=[8443, 2222], ntp=True), PATH)
    config = result.as_config()
    assert config == {'tcp': {'22': ['github.com'], '25': True, '465': True, '587': True, '2222': True,
                              '8443': True},
                      'udp': {'123': True}}
    assert list(config['tcp']) == ['22', '25', '465', '587', '2222', '8443']
    assert result.as_dict() == dict(path=PATH, seeded=False, wide=['ntp', 'smtp', 'tcp_ports 8443', 'tcp_ports 2222'],
                                    ports=config)


def test_names_are_every_listed_host_once():
    result = O.validate(allow(ssh=['github.com', 'gitlab.com'], git=['github.com'],
                              udp_ports=[{'port': 51820, 'hosts': ['vpn.example.com']}], ntp=True), PATH)
    assert result.names() == ['github.com', 'gitlab.com', 'vpn.example.com']


DESCRIBED = [
    ('deny-all', allow(), []),
    ('ssh-true', allow(ssh=True), [('tcp/22', 'any name the resolver answers')]),
    ('ssh-hosts', allow(ssh=['github.com', 'gitlab.com']), [('tcp/22', 'github.com, gitlab.com')]),
    ('tcp-before-udp', allow(ntp=['time.example.com'], tcp_ports=[8443, 2222]),
     [('tcp/2222', 'any name the resolver answers'), ('tcp/8443', 'any name the resolver answers'),
      ('udp/123', 'time.example.com')]),
]


@pytest.mark.parametrize('data, expected', [row[1:] for row in DESCRIBED], ids=[row[0] for row in DESCRIBED])
def test_describe(data, expected):
    assert O.describe(O.validate(data, PATH)) == expected


def test_a_key_written_twice_is_refused_naming_the_line(tmp_path):
    path = tmp_path / 'config.yaml'
    path.write_text('egress:\n  allow:\n    ssh: true\n    ssh: false\n')
    with pytest.raises(O.OptinError) as caught:
        O.load(str(path))
    assert str(path) in str(caught.value) and 'line 4' in str(caught.value) and 'twice' in str(caught.value)


def test_a_port_listed_twice_is_one_wide_entry():
    got = O.validate({'egress': {'allow': {'tcp_ports': [2222, 2222]}}}, '/p/config.yaml')
    assert got.wide == ['tcp_ports 2222'] and got.ports['tcp'] == {2222: True}
