"""A Podman account's containers.conf (_podman/containers_conf.py): what maps the host into containers, refused.

Every case is parsed twice where Python has tomllib (the real TOML parser and the subset a target without it
uses) and both must agree.
"""

import os

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._podman import containers_conf as _conf

CONF = 'conf/containers.conf'


def both(text):
    """Refusals by the subset parser, checked against tomllib's where it exists."""
    subset = _conf.refusals(_conf.parse_subset(text, CONF), CONF)
    if _conf._tomllib is not None:
        real = _conf.refusals(_conf._tomllib.loads(text), CONF)
        assert [r.as_dict() for r in real] == [r.as_dict() for r in subset]
    return subset


@pytest.mark.parametrize('text, refused', [
    # Nothing set, or settings that map nothing: passes.
    ('', []),
    ('# only comments\n[network]\n# pasta_options = ["--map-gw"]\n', []),
    ('[network]\ndefault_rootless_network_cmd = "pasta"\npasta_options = ["--no-map-gw", "-T", "none"]\n', []),
    ('[engine]\nnetwork_cmd_options = ["allow_host_loopback=true"]\n', []),  # 10.0.2.2: the guard refuses it
    ('[engine]\nnetwork_cmd_options = ["mtu=1500", "enable_ipv6=false"]\n', []),
    ('[containers]\nhttp_proxy = false\n[network]\npasta_options = []\n', []),
    ('[network]\npasta_options = ["--map-guest-addr", "169.254.1.2"]\n', []),
    # pasta, Podman 5's [network] pasta_options.
    ('[network]\npasta_options = ["--map-gw"]\n', [('[network] pasta_options', '--map-gw')]),
    ('[network]\npasta_options = ["--map-host-loopback", "10.0.2.2"]\n',
     [('[network] pasta_options', '--map-host-loopback 10.0.2.2')]),
    ('[network]\npasta_options = ["--map-host-loopback=169.254.9.9"]\n',
     [('[network] pasta_options', '--map-host-loopback 169.254.9.9')]),
    ("[network]\npasta_options = ['--map-gw', '--map-host-loopback', '10.9.9.9']\n",
     [('[network] pasta_options', '--map-gw'), ('[network] pasta_options', '--map-host-loopback 10.9.9.9')]),
    # A multi-line array with comments and a trailing comma.
    ('[network]\npasta_options = [\n  "-T", "none",  # ports\n  "--map-gw",\n]\n', [('[network] pasta_options',
                                                                                    '--map-gw')]),
    # Podman 4's [engine] network_cmd_options, for either helper.
    ('[engine]\nnetwork_cmd_options = ["--map-gw"]\n', [('[engine] network_cmd_options', '--map-gw')]),
    ('[engine]\nnetwork_cmd_options = ["allow_host_loopback=true", "cidr=10.41.0.0/24"]\n',
     [('[engine] network_cmd_options', 'cidr=10.41.0.0/24')]),
    ('[engine]\nnetwork_cmd_options = ["allow_host_loopback=true,cidr=192.168.9.0/24"]\n',
     [('[engine] network_cmd_options', 'cidr=192.168.9.0/24')]),
    # A quoted # stays part of the value; an inline comment does not.
    ('[network]\npasta_options = ["--map-gw"] # "--no-map-gw"\n', [('[network] pasta_options', '--map-gw')]),
    # A plain string where an array is expected is read as one option.
    ('[network]\npasta_options = "--map-gw"\n', [('[network] pasta_options', '--map-gw')]),
    # [containers] cgroups = "disabled": the proxy's limits hold nothing (the other values keep a cgroup).
    ('[containers]\ncgroups = "disabled"\n', [('[containers] cgroups', '"disabled"')]),
    ("[containers]\ncgroups = 'Disabled' # the proxy too\n", [('[containers] cgroups', '"Disabled"')]),
    ('[containers]\ncgroups = "enabled"\n', []),
    ('[containers]\ncgroups = "no-conmon"\n', []),
    ('[engine]\ncgroups = "disabled"\n', []),  # not a key of [engine]: Podman does not read it there
    ('[containers]\ncgroups = "disabled"\n[network]\npasta_options = ["--map-gw"]\n',
     [('[network] pasta_options', '--map-gw'), ('[containers] cgroups', '"disabled"')]),
    # Both tables in one file: each named.
    ('[engine]\nnetwork_cmd_options = ["cidr=10.1.0.0/24"]\n[network]\npasta_options = ["--map-gw"]\n',
     [('[network] pasta_options', '--map-gw'), ('[engine] network_cmd_options', 'cidr=10.1.0.0/24')]),
])
def test_what_maps_the_host_is_refused_naming_the_file_and_the_key(text, refused):
    found = both(text)
    assert [(r.key, r.value) for r in found] == refused
    for item in found:
        assert item.path == CONF and CONF in item.fix and item.key in item.fix and item.why
        assert str(item).startswith('%s: %s has %s' % (CONF, item.key, item.value))


@pytest.mark.parametrize('text, fragment', [
    ('[network\npasta_options = ["--map-gw"]\n', 'line 1'),
    ('[network]\npasta_options ["--map-gw"]\n', 'line 2'),
    ('[network]\npasta_options = ["--map-gw" "--x"]\n', 'line 2'),
    ('[network]\npasta_options = [\n "--map-gw",\n', 'line 2'),
    ('[network]\npasta_options = [--map-gw]\n', 'line 2'),
])
def test_a_file_that_is_not_toml_is_refused_naming_the_file_and_the_line(text, fragment):
    with pytest.raises(_conf.ConfError) as info:
        _conf.parse_subset(text, CONF)
    assert CONF in str(info.value) and fragment in str(info.value) and 'fix the file' in str(info.value)
    if _conf._tomllib is not None:
        with pytest.raises(_conf.ConfError) as real:
            _conf.parse(text, CONF)
        # tomllib says where (a line and column, or the end of the document): the message carries it.
        assert str(real.value).startswith('%s: not valid TOML (' % CONF) and 'fix the file' in str(real.value)


@pytest.mark.parametrize('text', ['[containers]\ncgroups = false\n', '[containers]\ncgroups = ["disabled"]\n'])
def test_a_cgroups_value_that_is_not_a_string_is_refused_naming_the_file(text):
    with pytest.raises(_conf.ConfError) as err:
        both(text)
    assert CONF in str(err.value) and '[containers] cgroups' in str(err.value)


def test_an_option_list_that_is_not_strings_is_refused():
    with pytest.raises(_conf.ConfError, match=r'\[network\] pasta_options must be an array of strings'):
        _conf.refusals({'network': {'pasta_options': [1, 2]}}, CONF)


@pytest.mark.parametrize('environ, rootless, expect_last', [
    ({}, True, '/home/w/.config/containers/containers.conf.d'),
    ({'XDG_CONFIG_HOME': '/cfg'}, True, '/cfg/containers/containers.conf.d'),
])
def test_the_account_files_in_podmans_order(environ, rootless, expect_last):
    files = _conf.account_files('/home/w', environ, rootless=rootless)
    assert files[0] == '/usr/share/containers/containers.conf' and files[-1] == expect_last
    assert files.index('/etc/containers/containers.conf') < files.index(expect_last.rsplit('.d', 1)[0])
    assert '/etc/containers/containers.rootless.conf' in files
    assert '/etc/containers/containers.rootless.conf' not in _conf.account_files('/home/w', environ, rootless=False)


def test_containers_conf_in_the_environment_is_the_only_file():
    assert _conf.account_files('/home/w', {'CONTAINERS_CONF': '/x/c.conf'}) == ['/x/c.conf']


def test_check_files_reads_folders_in_name_order_and_names_each_file(tmp_path):
    drop = tmp_path / 'containers.conf.d'
    drop.mkdir()
    (drop / '20-b.conf').write_text('[network]\npasta_options = ["--map-gw"]\n')
    (drop / '10-a.conf').write_text('[engine]\nnetwork_cmd_options = ["allow_host_loopback=true"]\n')
    (drop / 'notes.txt').write_text('[network]\npasta_options = ["--map-gw"]\n')  # not a .conf: Podman skips it
    main = tmp_path / 'containers.conf'
    main.write_text('[engine]\nnetwork_cmd_options = ["cidr=10.5.0.0/24"]\n')
    files, refused = _conf.check_files([str(main), str(drop), str(tmp_path / 'absent.conf')])
    assert files == [str(main), str(drop / '10-a.conf'), str(drop / '20-b.conf')]
    assert [(os.path.basename(r.path), r.value) for r in refused] == [('containers.conf', 'cidr=10.5.0.0/24'),
                                                                      ('20-b.conf', '--map-gw')]


def test_check_files_names_an_unreadable_file(tmp_path):
    bad = tmp_path / 'containers.conf'
    bad.write_bytes(b'[network]\npasta_options = ["\xff"]\n')
    with pytest.raises(_conf.ConfError, match='containers.conf: could not be read'):
        _conf.check_files([str(bad)])


# (file, consent, still refused, consented): the consent admits the cgroups setting only, never a host mapping.
CONSENT = [
    ('[containers]\ncgroups = "disabled"\n', False, ['[containers] cgroups'], []),
    ('[containers]\ncgroups = "disabled"\n', True, [], ['[containers] cgroups']),
    ('[containers]\ncgroups = "disabled"\n[network]\npasta_options = ["--map-gw"]\n', True,
     ['[network] pasta_options'], ['[containers] cgroups']),
    ('[network]\npasta_options = ["--map-host-loopback", "10.0.2.9"]\n', True, ['[network] pasta_options'], []),
    ('[engine]\nnetwork_cmd_options = ["cidr=10.1.0.0/24"]\n', True, ['[engine] network_cmd_options'], []),
    ('[containers]\ncgroups = "enabled"\n', True, [], []),
]


@pytest.mark.parametrize('text, consent, refused, consented', CONSENT)
def test_the_consent_admits_only_the_cgroups_setting(text, consent, refused, consented):
    still, admitted = _conf.split_consented(both(text), consent)
    assert [item.key for item in still] == refused
    assert [item.key for item in admitted] == consented
