"""A project's protocol opt-ins (.pi-container/config.yaml, egress.allow): validate, load and seed, describe."""

import json
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
    # The gateway opens a listener per TCP port and sockets per UDP port on each job network: a project opens
    # at most MAX_PORTS of each (issue 42, item 5), counted after the protocols are expanded.
    ('tcp-ports-over-the-cap', allow(tcp_ports=list(range(2000, 2000 + O.MAX_PORTS['tcp'] + 1))),
     'egress.allow', '%d TCP ports' % (O.MAX_PORTS['tcp'] + 1)),
    ('tcp-cap-with-protocols', allow(smtp=True, ssh=True, git=True,
                                     tcp_ports=list(range(2000, 2000 + O.MAX_PORTS['tcp'] - 4))),
     'egress.allow', 'at most %d' % O.MAX_PORTS['tcp']),
    ('udp-ports-over-the-cap', allow(udp_ports=list(range(5000, 5000 + O.MAX_PORTS['udp'] + 1))),
     'egress.allow', '%d UDP ports' % (O.MAX_PORTS['udp'] + 1)),
    ('hosts-over-the-cap', allow(ssh=['h%d.example.com' % i for i in range(O.MAX_HOSTS + 1)]),
     'egress.allow.ssh', 'at most %d names' % O.MAX_HOSTS),
]


def test_the_caps_are_reachable():
    """Exactly the cap is accepted (the refusals above are one past it)."""
    data = allow(tcp_ports=list(range(2000, 2000 + O.MAX_PORTS['tcp'])),
                 udp_ports=list(range(5000, 5000 + O.MAX_PORTS['udp'])),
                 ssh=None, git=['h%d.example.com' % i for i in range(O.MAX_HOSTS)])
    data['egress']['allow'].pop('ssh')
    data['egress']['allow']['tcp_ports'] = data['egress']['allow']['tcp_ports'][:-1]
    optins = O.validate(data, PATH)
    assert len(optins.ports['tcp']) == O.MAX_PORTS['tcp'] and len(optins.ports['udp']) == O.MAX_PORTS['udp']


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


# --- no link followed: the .pi-container folder and the file (issue 42, item 10) --------------------------


def test_load_does_not_seed_through_a_symlinked_folder(tmp_path):
    """A job points .pi-container elsewhere: the seed is not written there, and the path and the fix are named."""
    project = tmp_path / 'project'
    project.mkdir()
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir()
    (project / '.pi-container').symlink_to(elsewhere)
    path = project / '.pi-container' / 'config.yaml'
    with pytest.raises(O.OptinError) as info:
        O.load(str(path))
    message = str(info.value)
    assert str(project / '.pi-container') in message and 'is a symlink' in message
    assert 'Fix: replace the symlink with a real folder' in message and 'Nothing was created.' in message
    assert os.listdir(str(elsewhere)) == []


def test_load_does_not_read_through_a_symlinked_folder(tmp_path):
    project = tmp_path / 'project'
    project.mkdir()
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir()
    (elsewhere / 'config.yaml').write_text('egress:\n  allow:\n    ssh: true\n')
    (project / '.pi-container').symlink_to(elsewhere)
    with pytest.raises(O.OptinError, match='is a symlink'):
        O.load(str(project / '.pi-container' / 'config.yaml'))


def test_load_refuses_a_fifo_without_waiting_on_it(folder):
    path = folder / 'config.yaml'
    os.mkfifo(str(path))
    with pytest.raises(O.OptinError, match='not a regular file') as info:
        O.load(str(path))
    assert str(path) in str(info.value)


def test_the_seed_leaves_no_temporary_file(folder):
    O.load(str(folder / 'config.yaml'))
    assert sorted(os.listdir(str(folder))) == ['config.yaml']
    assert (folder / 'config.yaml').stat().st_mode & 0o777 == 0o644


def test_load_without_seed_refuses_a_missing_file(folder):
    with pytest.raises(O.OptinError, match='nothing to approve'):
        O.load(str(folder / 'config.yaml'), seed=False)
    assert os.listdir(str(folder)) == []


# --- the digest, the lines, the diff, the refusal (pure) --------------------------------------------------


def _policy(**keys):
    return O.validate(allow(**keys), PATH)


# (id, policy a, policy b, same digest?)
DIGESTS = [
    ('same', dict(ssh=['github.com']), dict(ssh=['github.com']), True),
    ('host-order-opens-nothing-more', dict(ssh=['github.com', 'gitlab.com']), dict(ssh=['gitlab.com', 'github.com']),
     True),
    ('spelling-of-the-same-port', dict(ssh=['github.com']), dict(tcp_ports=[{'port': 22, 'hosts': ['github.com']}]),
     True),
    ('another-host', dict(ssh=['github.com']), dict(ssh=['gitlab.com']), False),
    ('a-host-more', dict(ssh=['github.com']), dict(ssh=['github.com', 'gitlab.com']), False),
    ('list-to-any', dict(ssh=['github.com']), dict(ssh=True), False),
    ('a-port-more', dict(ssh=True), dict(ssh=True, tcp_ports=[8443]), False),
    ('tcp-is-not-udp', dict(tcp_ports=[123]), dict(udp_ports=[123]), False),
]


@pytest.mark.parametrize('a, b, same', [row[1:] for row in DIGESTS], ids=[row[0] for row in DIGESTS])
def test_the_digest_is_of_what_opens(a, b, same):
    da, db = O.digest(_policy(**a)), O.digest(_policy(**b))
    assert da.startswith('sha256:') and len(da) == len('sha256:') + 64
    assert (da == db) is same


def test_the_digest_ignores_the_other_tools_keys():
    a = O.validate({'egress': {'allow': {'ssh': True}}, 'image': 'x:1'}, PATH)
    b = O.validate({'egress': {'allow': {'ssh': True}}, 'nested_containers': {'enabled': True}}, PATH)
    assert O.digest(a) == O.digest(b)


# (id, policy, opens anything?)
OPENS = [
    ('seed', yaml.safe_load(O.SEED), False),
    ('none', None, False),
    ('all-false', allow(ssh=False, smtp=False, git=False, ntp=False, tcp_ports=[], udp_ports=[]), False),
    ('ssh-host', allow(ssh=['github.com']), True),
    ('ntp-true', allow(ntp=True), True),
    ('a-udp-port', allow(udp_ports=[51820]), True),
]


@pytest.mark.parametrize('data, opens', [row[1:] for row in OPENS], ids=[row[0] for row in OPENS])
def test_a_policy_that_opens_nothing_needs_no_approval(data, opens):
    optins = O.validate(data, PATH)
    assert O.opens_anything(optins) is opens
    message = O.refusal(optins, None, '/opt/pi-dispatch/egress')
    assert (message is not None) is opens


def test_lines_sort_ports_numerically_and_hosts():
    assert O.lines_of(_policy(ssh=['b.example.com', 'a.example.com'], tcp_ports=[8443, 2222], ntp=True)
                      .as_config()) == [
        'tcp/22 towards a.example.com, b.example.com', 'tcp/2222 towards any name the resolver answers',
        'tcp/8443 towards any name the resolver answers', 'udp/123 towards any name the resolver answers']


def _record(optins, when='2026-12-01T09:00:00Z'):
    config = optins.as_config()
    return dict(version=1, policy=PATH, digest=O.digest(optins), ports=config, opens=O.lines_of(config),
                approved_at=when, approved_by='operator')


def test_the_approved_policy_is_not_refused():
    optins = _policy(ssh=['github.com'])
    assert O.refusal(optins, _record(optins), '/d') is None
    assert O.refusal(_policy(ssh=['github.com']), _record(optins), '/d') is None


def test_a_never_approved_policy_is_refused_with_its_lines_and_the_command():
    optins = _policy(tcp_ports=[{'port': 8443, 'hosts': ['attacker.example']}])
    message = O.refusal(optins, None, '/opt/pi-dispatch/egress')
    assert message.startswith(PATH + ' opens ports that were never approved')
    assert '/opt/pi-dispatch/egress/optins-approved' in message
    assert '    +tcp/8443 towards attacker.example' in message
    command = ('python3 -m ansible_collections.pi_dispatch.egress.plugins.module_utils.jobnet_cli approve-optins '
               '--project /srv/project --deploy-dir /opt/pi-dispatch/egress --digest %s' % O.digest(optins))
    assert 'approve exactly this policy with: %s ; otherwise' % command in message
    assert message.endswith('Nothing was created.')


def test_a_changed_policy_is_refused_with_the_diff_against_the_approval():
    approved = _policy(ssh=['github.com'])
    now = _policy(ssh=['github.com'], tcp_ports=[{'port': 8443, 'hosts': ['attacker.example']}])
    message = O.refusal(now, _record(approved), '/d')
    assert 'changed since its opt-ins were approved on 2026-12-01T09:00:00Z' in message
    assert '(approved %s, now %s)' % (O.digest(approved), O.digest(now)) in message
    diff = [line.strip() for line in message.splitlines() if line.startswith('    ')]
    assert diff == ['--- approved 2026-12-01T09:00:00Z', '+++ %s now' % PATH, 'tcp/22 towards github.com',
                    '+tcp/8443 towards attacker.example']
    assert '--digest %s' % O.digest(now) in message and 'git checkout' in message


def test_a_narrowed_policy_still_needs_its_approval():
    """Only the approved form takes effect; the diff shows what was taken away."""
    approved = _policy(ssh=['github.com', 'gitlab.com'])
    message = O.refusal(_policy(ssh=['github.com']), _record(approved), '/d')
    assert '-tcp/22 towards github.com, gitlab.com' in message and '+tcp/22 towards github.com' in message


def test_the_refusal_shows_the_policy_never_the_files_other_keys():
    optins = O.validate({'egress': {'allow': {'ssh': True}}, 'secrets': {'token': 'sk-live-SECRET'}}, PATH)
    message = O.refusal(optins, None, '/d')
    assert 'sk-live-SECRET' not in message and 'secrets' not in message


@pytest.mark.parametrize('path, where', [
    ('/srv/p/.pi-container/config.yaml', '--project /srv/p'),
    ('/srv/my project/.pi-container/config.yaml', "--project '/srv/my project'"),
    ('/etc/pi/project-a.yaml', '--policy /etc/pi/project-a.yaml'),
])
def test_the_approve_command_names_the_project_quoted(path, where):
    command = O.approve_command(path, '/opt/d d', 'sha256:ab')
    assert command.endswith("approve-optins %s --deploy-dir '/opt/d d' --digest sha256:ab" % where)


def test_the_approval_is_kept_per_policy_path_in_the_deployment_folder():
    a = O.approval_path('/opt/d', '/srv/a/.pi-container/config.yaml')
    assert a.startswith('/opt/d/optins-approved/') and a.endswith('.json')
    assert a == O.approval_path('/opt/d', '/srv/a/./.pi-container//config.yaml')
    assert a != O.approval_path('/opt/d', '/srv/b/.pi-container/config.yaml')


# --- approve and check (the files) ------------------------------------------------------------------------


@pytest.fixture
def project(tmp_path):
    (tmp_path / 'project' / '.pi-container').mkdir(parents=True)
    (tmp_path / 'deploy').mkdir()
    return dict(policy=tmp_path / 'project' / '.pi-container' / 'config.yaml', deploy=str(tmp_path / 'deploy'))


def test_approve_then_check_then_a_change_is_refused(project):
    policy, deploy = project['policy'], project['deploy']
    policy.write_text('egress:\n  allow:\n    ssh: [github.com]\n')
    optins = O.load(str(policy))
    with pytest.raises(O.OptinError, match='never approved'):
        O.check_approved(optins, deploy)
    shown = O.approve(str(policy), deploy, check_mode=True)
    assert shown['changed'] is True and shown['approved_before'] is None
    assert not os.path.exists(os.path.join(deploy, O.APPROVALS)), 'check mode approves nothing'
    got = O.approve(str(policy), deploy, shown['digest'], now=0)
    assert got['changed'] is True and got['opens'] == ['tcp/22 towards github.com']
    record = json.loads(open(got['approval']).read())
    assert record['digest'] == got['digest'] and record['approved_at'] == '1970-01-01T00:00:00Z'
    assert record['policy'] == str(policy)
    O.check_approved(O.load(str(policy)), deploy)
    assert O.approve(str(policy), deploy, got['digest'])['changed'] is False
    # a job adds a port
    policy.write_text('egress:\n  allow:\n    ssh: [github.com]\n    tcp_ports: [8443]\n')
    with pytest.raises(O.OptinError) as info:
        O.check_approved(O.load(str(policy)), deploy)
    assert 'changed since' in str(info.value) and '+tcp/8443 towards any name' in str(info.value)
    # a comment, another tool's key, the order of the names: the same policy
    policy.write_text('# mine\nimage: x\negress:\n  allow:\n    ssh: [github.com]\n')
    O.check_approved(O.load(str(policy)), deploy)


def test_approve_refuses_a_digest_other_than_the_policy_now(project):
    """The file changed between the operator's review and the approval: nothing is approved."""
    policy, deploy = project['policy'], project['deploy']
    policy.write_text('egress:\n  allow:\n    ssh: [github.com]\n')
    reviewed = O.approve(str(policy), deploy, check_mode=True)['digest']
    policy.write_text('egress:\n  allow:\n    ssh: true\n')
    with pytest.raises(O.OptinError) as info:
        O.approve(str(policy), deploy, reviewed)
    message = str(info.value)
    assert 'changed since it was reviewed' in message and reviewed in message and 'tcp/22 towards any name' in message
    assert 'Nothing was approved.' in message
    assert not os.path.exists(os.path.join(deploy, O.APPROVALS))


def test_approve_needs_the_digest(project):
    project['policy'].write_text('egress:\n  allow:\n    git: true\n')
    with pytest.raises(O.OptinError, match='--digest sha256:'):
        O.approve(str(project['policy']), project['deploy'])


@pytest.mark.parametrize('deploy, fragment', [('relative/dir', 'not absolute'),
                                              ('/nonexistent/pi-42', 'does not exist')])
def test_approve_refuses_a_bad_deployment_folder(project, deploy, fragment):
    project['policy'].write_text('egress:\n  allow:\n    git: true\n')
    with pytest.raises(O.OptinError, match=fragment):
        O.approve(str(project['policy']), deploy, check_mode=True)


def test_a_deny_all_policy_needs_no_deployment_folder_at_all(folder):
    O.check_approved(O.load(str(folder / 'config.yaml')), '/nonexistent/pi-42')


def test_an_edited_approval_is_refused(project):
    policy, deploy = project['policy'], project['deploy']
    policy.write_text('egress:\n  allow:\n    ssh: [github.com]\n')
    got = O.approve(str(policy), deploy, O.digest(O.load(str(policy))))
    record = json.loads(open(got['approval']).read())
    record['ports']['tcp']['8443'] = True  # widened by hand, digest kept
    with open(got['approval'], 'w') as handle:
        json.dump(record, handle)
    policy.write_text('egress:\n  allow:\n    ssh: [github.com]\n    tcp_ports: [8443]\n')
    with pytest.raises(O.OptinError, match='not a valid approval') as info:
        O.check_approved(O.load(str(policy)), deploy)
    assert got['approval'] in str(info.value)


def test_a_symlinked_approval_is_not_followed(project, tmp_path):
    policy, deploy = project['policy'], project['deploy']
    policy.write_text('egress:\n  allow:\n    ssh: [github.com]\n')
    optins = O.load(str(policy))
    forged = tmp_path / 'forged.json'
    config = optins.as_config()
    forged.write_text(json.dumps(dict(version=1, policy=str(policy), digest=O.digest(optins), ports=config,
                                      opens=O.lines_of(config), approved_at='x', approved_by='y')))
    record = O.approval_path(deploy, str(policy))
    os.makedirs(os.path.dirname(record))
    os.symlink(str(forged), record)
    with pytest.raises(O.OptinError, match='is a symlink'):
        O.check_approved(optins, deploy)


class _NoDaemon(object):
    def __getattr__(self, name):
        raise AssertionError('the daemon was asked (%s) before the policy was judged' % name)


@pytest.mark.parametrize('check_mode', [False, True])
def test_create_refuses_an_unapproved_policy_before_the_daemon_is_asked(project, check_mode):
    from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as jn
    project['policy'].write_text('egress:\n  allow:\n    tcp_ports: [{port: 8443, hosts: [attacker.example]}]\n')
    with pytest.raises(jn.JobNetError) as info:
        jn.create_job_network(_NoDaemon(), 'job-1', mode=jn.TRANSPARENT, project_policy=str(project['policy']),
                              deploy_dir=project['deploy'], check_mode=check_mode)
    assert 'never approved' in str(info.value) and '--deploy-dir %s' % project['deploy'] in str(info.value)


def test_create_looks_for_approvals_in_credentials_dir_when_no_deploy_dir_is_given(project):
    from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as jn
    project['policy'].write_text('egress:\n  allow:\n    ssh: true\n')
    with pytest.raises(jn.JobNetError) as info:
        jn.create_job_network(_NoDaemon(), 'job-1', mode=jn.TRANSPARENT, project_policy=str(project['policy']),
                              credentials_dir=project['deploy'])
    assert '--deploy-dir %s' % project['deploy'] in str(info.value)
    with pytest.raises(jn.JobNetError) as info:
        jn.create_job_network(_NoDaemon(), 'job-1', mode=jn.TRANSPARENT, project_policy=str(project['policy']))
    assert '--deploy-dir /opt/pi-dispatch/egress' in str(info.value)
