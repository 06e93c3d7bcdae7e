"""The destination guard: what is refused, what can be opened, what is rendered (no daemon)."""

import ipaddress

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import guard as G

GATEWAYS = ['172.18.0.1', '10.47.0.1']
HOST_GW = '172.17.0.1'


def _denied(opened=()):
    return G.denied([ipaddress.ip_network(o) for o in opened], gateways=GATEWAYS, host_gateway=HOST_GW)


@pytest.mark.parametrize('address', [
    '10.1.2.3', '172.16.0.1', '172.31.255.254', '192.168.1.1', '100.64.0.1', '100.100.100.200', '198.18.0.1',
    '0.0.0.0', '127.0.0.1', '169.254.169.254', '224.0.0.1', '240.0.0.1', '255.255.255.255', '192.0.2.1',
    '10.47.3.9',     # another job's container (the pool)
    '172.18.0.1',    # a network gateway
    '172.17.0.1',    # host-gateway
    '::1', 'fe80::1', 'fc00::1', 'fd00:ec2::254', 'ff02::1', '2001:db8::1',
])
def test_refused_by_default(address):
    assert G.covers(_denied(), address)


@pytest.mark.parametrize('address', ['93.184.215.14', '1.1.1.1', '8.8.8.8', '2606:4700::1111', '172.32.0.1',
                                     '11.0.0.1', '192.169.0.1'])
def test_public_addresses_are_not_refused(address):
    assert not G.covers(_denied(), address)


def test_an_opened_range_is_reached_but_its_gateway_and_the_rest_stay_refused():
    opened = G.validate(['172.18.0.0/16'], gateways=GATEWAYS, host_gateway=HOST_GW)
    nets = G.denied(opened, gateways=GATEWAYS, host_gateway=HOST_GW)
    assert not G.covers(nets, '172.18.0.2')
    assert G.covers(nets, '172.18.0.1')      # the gateway inside it
    assert G.covers(nets, '172.19.0.2')      # the rest of 172.16/12
    assert G.kept_inside(opened, GATEWAYS, HOST_GW) == ['172.18.0.1']


@pytest.mark.parametrize('cidr, needle', [
    ('10.47.0.0/16', 'job-network pool'),
    ('10.0.0.0/8', 'never be opened'),         # contains 10.0.2.2 (and the pool)
    ('10.47.8.0/24', 'job-network pool'),
    ('172.16.0.0/12', 'host-gateway'),          # contains 172.17.0.1
    ('172.17.0.0/16', 'host-gateway'),
    ('127.0.0.0/8', 'never be opened'),
    ('169.254.0.0/16', 'never be opened'),
    ('169.254.169.254/32', 'never be opened'),
    ('100.64.0.0/10', 'never be opened'),       # contains 100.100.100.200
    ('224.0.0.0/4', 'never be opened'),
    ('fd00:ec2::/64', 'never be opened'),
    ('fe80::/10', 'never be opened'),
    ('172.18.0.1/32', 'nothing but network gateways'),
    ('8.8.8.0/24', 'public range'),
    ('192.168.1.1/24', 'host bits'),
    ('not-a-cidr', 'is not a CIDR'),
    (7, 'must be a string'),
])
def test_refused_ranges_name_the_reason(cidr, needle):
    with pytest.raises(G.GuardError) as info:
        G.validate([cidr], gateways=GATEWAYS, host_gateway=HOST_GW)
    text = str(info.value)
    assert needle in text and 'egress_private_destinations[0]' in text and 'nothing was rendered' in text


@pytest.mark.parametrize('cidr', ['192.168.50.0/24', '10.20.0.0/16', '172.18.0.0/16', '100.65.0.0/16',
                                  'fd12:3456::/48', '192.168.50.7/32'])
def test_openable_ranges(cidr):
    assert [str(n) for n in G.validate([cidr], gateways=GATEWAYS, host_gateway=HOST_GW)] == \
        [str(ipaddress.ip_network(cidr))]


def test_every_problem_is_reported_at_once():
    with pytest.raises(G.GuardError) as info:
        G.validate(['10.47.0.0/24', 'x', '192.168.0.0/16'], gateways=GATEWAYS, host_gateway=HOST_GW)
    assert len(info.value.problems) == 2


def test_render_is_deterministic_and_names_what_it_refuses():
    opened = G.validate(['172.18.0.0/16'], gateways=GATEWAYS, host_gateway=HOST_GW)
    text = G.render(opened, gateways=GATEWAYS, host_gateway=HOST_GW, client_max_connections=64)
    assert text == G.render(opened, gateways=list(reversed(GATEWAYS)), host_gateway=HOST_GW,
                            client_max_connections=64)
    assert '# Opened private ranges: 172.18.0.0/16' in text
    assert '# Refused although inside an opened range: 172.18.0.1' in text
    assert 'acl pi_client_conns maxconn 64' in text.splitlines()
    nets = G.acl_networks(text)
    assert G.covers(nets, '172.18.0.1') and not G.covers(nets, '172.18.0.2') and G.covers(nets, '10.47.0.9')
    # No IPv4-mapped IPv6 form: squid reads ::ffff:0:0/96 as the whole IPv4 space.
    assert '::ffff' not in text
    for line in text.splitlines():
        if line.startswith('acl pi_guard'):
            assert line.split()[:3] == ['acl', 'pi_guard', 'dst'] and len(line.split()) <= 11


@pytest.mark.parametrize('pool_gateways', [['10.47.0.1'], ['10.47.0.1', '10.47.3.1', '10.47.255.1']])
def test_job_network_gateways_inside_the_pool_leave_the_render_unchanged(pool_gateways):
    """Job networks come and go all day: their gateways are refused with the pool, the file keeps its bytes."""
    outside = ['172.18.0.1']
    opened = G.validate(['172.18.0.0/16'], gateways=outside, host_gateway=HOST_GW)
    text = G.render(opened, gateways=outside, host_gateway=HOST_GW)
    assert G.render(opened, gateways=outside + pool_gateways, host_gateway=HOST_GW) == text
    assert all(G.covers(G.acl_networks(text), g) for g in pool_gateways)
    assert G.outside_pool(outside + pool_gateways) == outside


def test_default_render_refuses_every_private_range_and_opens_none():
    nets = G.acl_networks(G.default_render())
    for address in ('10.0.0.1', '172.20.0.1', '192.168.0.1', '10.47.0.1'):
        assert G.covers(nets, address)
    assert '# Opened private ranges: none' in G.default_render()


@pytest.mark.parametrize('value', [0, -1, 70000, True, '64', None])
def test_client_bound_is_checked(value):
    with pytest.raises(G.GuardError):
        G.check_client_max_connections(value)


def test_subtract_is_exact():
    nets = G.subtract([ipaddress.ip_network('10.0.0.0/8')], [ipaddress.ip_network('10.47.0.0/16')])
    assert not any(ipaddress.ip_address('10.47.1.1') in n for n in nets)
    assert sum(n.num_addresses for n in nets) == 2 ** 24 - 2 ** 16


def test_a_daemon_with_an_ipv6_network_renders_and_opens_its_ula_but_never_its_gateway():
    # found by test_ipv6.py: the gateways of an IPv6-enabled network are of both versions (they did not sort)
    gateways = ['fd47:25:12ab::1', '172.19.0.1', '10.47.0.1', 'fd47:25:1::1']
    opened = G.validate(['fd47:25:12ab::/64'], gateways=gateways, host_gateway=HOST_GW)
    text = G.render(opened, gateways=gateways, host_gateway=HOST_GW)
    assert text == G.render(opened, gateways=list(reversed(gateways)), host_gateway=HOST_GW)
    assert '# Network gateways outside the pool (this host): 172.19.0.1, fd47:25:1::1, fd47:25:12ab::1' in text
    assert '# Refused although inside an opened range: fd47:25:12ab::1' in text
    nets = G.acl_networks(text)
    assert not G.covers(nets, 'fd47:25:12ab::10') and G.covers(nets, 'fd47:25:12ab::1')
    for address in ('::1', 'fe80::1', 'fd12:3456::5', 'fd00:ec2::254', '::', 'fd47:25:1::9'):
        assert G.covers(nets, address), address


@pytest.mark.parametrize('gateways, host_gw, refused', [
    # Docker: host-gateway is docker0's gateway, not one of the proxy's networks: a range holding it is refused
    (['10.89.0.1'], '172.17.0.1', True),
    # rootful Podman: host.containers.internal is the gateway of the proxy's first network, kept refused inside
    (['10.89.0.1', '10.47.0.1'], '10.89.0.1', False),
    # no host address known: nothing to refuse for it
    (['10.89.0.1'], None, False),
])
def test_a_range_holding_the_host_address_is_refused_unless_it_is_a_gateway(gateways, host_gw, refused):
    cidr = '172.17.0.0/16' if host_gw == '172.17.0.1' else '10.89.0.0/24'
    if refused:
        with pytest.raises(G.GuardError) as raised:
            G.validate([cidr], gateways=gateways, host_gateway=host_gw)
        assert 'host-gateway address %s' % host_gw in str(raised.value)
    else:
        opened = G.validate([cidr], gateways=gateways, host_gateway=host_gw)
        assert [str(n) for n in opened] == [cidr]
        denied = [str(n) for n in G.denied(opened, gateways=gateways, host_gateway=host_gw)]
        assert '10.89.0.1/32' in denied


# Issue 42, item 11: addresses that embed an IPv4 address are judged by it. NAT64 (64:ff9b::/96,
# RFC 6052: the last 32 bits) and 6to4 (2002::/16, RFC 3056: bits 16-47) reach the embedded IPv4
# address through a translator or relay; IPv4-mapped (::ffff:0:0/96) is squid's own form of IPv4.
@pytest.mark.parametrize('address, v4', [
    ('64:ff9b::a00:1', '10.0.0.1'),
    ('64:ff9b::7f00:1', '127.0.0.1'),
    ('64:ff9b::a9fe:a9fe', '169.254.169.254'),
    ('64:ff9b::a2f:309', '10.47.3.9'),          # another job (the pool)
    ('64:ff9b::ac12:1', '172.18.0.1'),          # a network gateway
    ('64:ff9b::ac11:1', '172.17.0.1'),          # host-gateway
    ('64:ff9b::c0a8:101', '192.168.1.1'),
    ('64:ff9b::6464:64c8', '100.100.100.200'),
    ('64:ff9b::ffff:ffff', '255.255.255.255'),
    ('64:ff9b::', '0.0.0.0'),
    ('2002:a00:1::', '10.0.0.1'),
    ('2002:7f00:1::1', '127.0.0.1'),
    ('2002:a9fe:a9fe:ffff:ffff:ffff:ffff:ffff', '169.254.169.254'),
    ('2002:a2f:309::1', '10.47.3.9'),
    ('2002:ac11:1::', '172.17.0.1'),
    ('2002:c0a8:101:1::1', '192.168.1.1'),
    ('64:ff9b:1::a00:1', '10.0.0.1'),           # local-use NAT64 (RFC 8215): refused whole, as before
])
def test_an_address_embedding_a_refused_ipv4_address_is_refused(address, v4):
    assert G.covers(_denied(), v4)
    assert G.covers(_denied(), address)
    assert G.covers(G.acl_networks(G.render(gateways=GATEWAYS, host_gateway=HOST_GW)), address)


@pytest.mark.parametrize('address', ['64:ff9b::101:101', '64:ff9b::5db8:d70e', '2002:101:101::1',
                                     '2002:5db8:d70e::', '64:ff9b::ac20:1', '2002:ac20:1::'])
def test_an_address_embedding_a_public_ipv4_address_is_judged_like_it(address):
    # 1.1.1.1, 93.184.215.14, 172.32.0.1: public, so their NAT64 and 6to4 forms pass like them (a
    # DNS64 resolver answers the NAT64 form for every IPv4-only name on an IPv6-only network)
    assert not G.covers(_denied(), address)


def test_an_opened_range_opens_its_embedded_forms_and_its_gateway_stays_refused_in_every_form():
    opened = G.validate(['172.18.0.0/16'], gateways=GATEWAYS, host_gateway=HOST_GW)
    nets = G.denied(opened, gateways=GATEWAYS, host_gateway=HOST_GW)
    for reached in ('172.18.0.2', '64:ff9b::ac12:2', '2002:ac12:2::'):
        assert not G.covers(nets, reached), reached
    for refused in ('172.18.0.1', '64:ff9b::ac12:1', '2002:ac12:1::', '64:ff9b::ac13:2', '2002:ac13:2::'):
        assert G.covers(nets, refused), refused


@pytest.mark.parametrize('cidr', ['64:ff9b::c0a8:3200/120', '64:ff9b::/96', '2002:c0a8:3200::/40', '2002::/16'])
def test_an_embedded_range_is_not_opened_itself_the_fix_names_its_ipv4_range(cidr):
    with pytest.raises(G.GuardError) as info:
        G.validate([cidr], gateways=GATEWAYS, host_gateway=HOST_GW)
    text = str(info.value)
    assert 'embeds an IPv4 address' in text and 'open the IPv4 range' in text, text


def test_the_embedded_forms_render_on_squid_lines_and_never_the_mapped_form():
    text = G.render(gateways=GATEWAYS, host_gateway=HOST_GW)
    words = [w for line in text.splitlines() if line.startswith('acl pi_guard dst') for w in line.split()[3:]]
    assert '64:ff9b::a00:0/104' in words and '2002:a00::/24' in words
    assert '::ffff' not in text
    assert G.render(gateways=GATEWAYS, host_gateway=HOST_GW) == text
