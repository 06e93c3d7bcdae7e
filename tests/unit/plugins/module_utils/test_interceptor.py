"""The credential interceptor's include and container shape (_proxy/interceptor.py): pure, table-driven."""

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import credentials as _credentials
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import interceptor as _interceptor


def _directives(text):
    return [line for line in text.splitlines() if line.strip() and not line.startswith('#')]


def test_no_bound_host_renders_only_comments():
    text = _interceptor.render_include([], '172.30.0.0/24')
    assert _directives(text) == []
    assert text.startswith(_interceptor.INCLUDE_HEADER)


@pytest.mark.parametrize('hosts, subnet, expected_hosts', [
    (['api.anthropic.com'], '172.30.0.0/24', 'api.anthropic.com'),
    (['github.com', 'api.anthropic.com'], '10.9.0.0/16', 'api.anthropic.com github.com'),
    (['API.Anthropic.com', 'api.anthropic.com'], '192.168.16.0/20', 'api.anthropic.com'),
])
def test_bound_hosts_are_routed_and_the_way_out_opened(hosts, subnet, expected_hosts):
    lines = _directives(_interceptor.render_include(hosts, subnet, interceptor_host='icpt', interceptor_port=8081,
                                                    return_port=3131))
    assert 'http_port 3131 %s' % _interceptor.RETURN_PORT_OPTIONS in lines
    assert 'acl pi_interceptor_net src %s' % subnet in lines
    assert 'acl pi_bound_hosts dstdomain %s' % expected_hosts in lines
    assert 'cache_peer icpt parent 8081 0 no-query no-digest no-netdb-exchange name=pi_interceptor' in lines
    # The way out: refused to anyone off the interceptor's network, and to any host but a bound one.
    deny_off_net = lines.index('http_access deny pi_interceptor_port !pi_interceptor_net')
    allow_bound = lines.index('http_access allow pi_interceptor_port CONNECT pi_port_443 pi_bound_hosts')
    deny_rest = lines.index('http_access deny pi_interceptor_port')
    assert deny_off_net < allow_bound < deny_rest
    # Never back to the interceptor from its own way out (the loop), never direct for a job's bound tunnel.
    assert 'cache_peer_access pi_interceptor allow pi_bound_hosts !pi_interceptor_port' in lines
    assert 'cache_peer_access pi_interceptor deny all' in lines
    assert 'never_direct allow pi_bound_hosts !pi_interceptor_port' in lines
    # The job's address is carried to the interceptor: the connection is tagged by client-tag (a line that
    # only asks, never matches), and only the CONNECT to the interceptor carries the tag.
    assert any(line.startswith('external_acl_type pi_client_tag ttl=0 ') and
               line.endswith(' %{X-Pi-Client}>h /usr/bin/perl /usr/lib/pi-dispatch/client-tag') for line in lines)
    assert 'http_access deny pi_from_front CONNECT pi_bound_hosts pi_client_tagged !all' in lines
    assert lines.index('http_access deny pi_from_front CONNECT pi_bound_hosts pi_client_tagged !all') > deny_rest
    assert 'request_header_add X-Pi-Client "%{clt_conn_tag}note" pi_bound_hosts !pi_interceptor_port' in lines


def test_the_render_is_deterministic():
    one = _interceptor.render_include(['b.example.com', 'a.example.com'], '172.30.0.0/24')
    two = _interceptor.render_include(['a.example.com', 'b.example.com'], '172.30.0.0/24')
    assert one == two


@pytest.mark.parametrize('subnet', ['172.30.0.1/24', 'not-a-subnet', ''])
def test_a_bad_subnet_is_refused(subnet):
    with pytest.raises(ValueError):
        _interceptor.render_include(['api.anthropic.com'], subnet)


def test_secret_folders_are_mounted_once_each_read_only():
    mounts = _interceptor.secret_mounts(['/etc/s/a', '/etc/s/b', '/srv/other/c'])
    assert sorted(mounts) == ['/etc/s', '/srv/other']
    for folder, bind in mounts.items():
        assert bind == {'bind': _credentials.secret_folder_in_container(folder), 'mode': 'ro'}
    assert _credentials.secret_in_container('/etc/s/a').startswith(mounts['/etc/s']['bind'] + '/')


def test_the_container_is_hardened():
    kwargs = _interceptor.container_kwargs('img', '/d/conf', '/d/jobs', '/d/ca', ['/etc/s/a'],
                                           upstream='http://proxy:3130', upstream_ca=True)
    assert kwargs['cap_drop'] == ['ALL'] and 'cap_add' not in kwargs
    assert kwargs['read_only'] is True
    assert kwargs['security_opt'] == ['no-new-privileges:true']
    assert kwargs['network'] == _interceptor.NETWORK
    writable = [src for src, bind in kwargs['volumes'].items() if bind['mode'] != 'ro']
    assert writable == ['/d/ca']
    assert kwargs['environment'] == {'PI_INTERCEPTOR_UPSTREAM': 'http://proxy:3130',
                                     'PI_INTERCEPTOR_UPSTREAM_CA': '/etc/pi-interceptor/upstream-ca.pem'}
    plain = _interceptor.container_kwargs('img', '/d/conf', '/d/jobs', '/d/ca', [], upstream='http://p:3130')
    assert 'PI_INTERCEPTOR_UPSTREAM_CA' not in plain['environment']


def test_the_proxy_mounts_the_include_only_when_given(tmp_path):
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import spec as _spec
    files = [str(tmp_path / name) for name in ('rules', 'allow', 'endpoints', 'include')]
    without = _spec.desired_spec('img', files[0], files[1], files[2])
    assert _spec.CONTAINER_CREDENTIALS_INCLUDE not in [dst for _src, dst in without['mounts']]
    declared = _spec.desired_spec('img', files[0], files[1], files[2], credentials_include=files[3])
    assert (files[3], _spec.CONTAINER_CREDENTIALS_INCLUDE) in declared['mounts']
    assert declared['mounts'][:len(without['mounts'])] == without['mounts']
