# -*- coding: utf-8 -*-
"""The transparent gateway's wanted shape, what differs from it, and what it carries (pure parts)."""

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import gateway as G
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import transparent as T


def spec(**more):
    return G.desired('/d', 'up', 'proxy', **more)


def test_the_wanted_shape_holds_no_more_than_it_needs():
    s = spec()
    assert s['cap_drop'] == ['ALL'] and sorted(s['cap_add']) == ['KILL', 'NET_ADMIN', 'SETGID', 'SETPCAP', 'SETUID']
    assert s['security_opt'] == ['no-new-privileges'] and s['sysctls']['net.ipv4.ip_forward'] == '0'
    ro = dict((src, b['bind']) for src, b in s['binds'].items() if b['mode'] == 'ro')
    assert sorted(ro.values()) == ['/etc/pi-dispatch/egress-allowlist.conf', '/etc/pi-dispatch/egress-guard.conf',
                                   '/etc/pi-dispatch/model-endpoints.json']
    assert all(src.startswith('/d/') for src in ro)  # the folder's own files only, never the whole folder
    assert s['binds']['pi-dispatch-egress-gateway-nets'] == dict(bind=G.NETS_DIR, mode='rw')
    assert s['labels'] == {G.LABEL_ROLE: 'gateway', G.LABEL_PROXY: 'proxy'} and s['network'] == 'up'
    # bounded as the proxy is (issue 42 item 5): memory, processes, open files
    assert s['mem_limit'] == '256m' and s['pids_limit'] == 256
    assert s['ulimits'] == [dict(name='nofile', soft=G.NOFILE, hard=G.NOFILE)] and 1024 <= G.NOFILE <= 65536


def attrs(image='sha256:a', caps=None, mounts=None, nets=None, ulimits=None):
    s = spec()
    if mounts is None:
        mounts = [dict(Type='bind' if b['mode'] == 'ro' else 'volume', Source=src, Name=src,
                       Destination=b['bind']) for src, b in s['binds'].items()]
    if ulimits is None:
        ulimits = [dict(Name='nofile', Soft=G.NOFILE, Hard=G.NOFILE)]
    return dict(Image=image, HostConfig=dict(CapAdd=caps if caps is not None else list(G.CAPS), Ulimits=ulimits),
                Mounts=mounts, NetworkSettings=dict(Networks=nets or {}))


@pytest.mark.parametrize('case, got, image_id, expect', [
    ('as wanted', attrs(), 'sha256:a', []),
    ('the image was rebuilt', attrs(), 'sha256:b', ['image']),
    ('a capability more', attrs(caps=list(G.CAPS) + ['SYS_ADMIN']), 'sha256:a', ['capabilities']),
    ('a capability less', attrs(caps=['NET_ADMIN']), 'sha256:a', ['capabilities']),
    ('a mount missing', attrs(mounts=[]), 'sha256:a', ['mounts']),
    ('image and mounts', attrs(mounts=[]), 'sha256:c', ['image', 'mounts']),
    ('image unknown: not compared', attrs(), None, []),
    ('no open-files bound (made before issue 42)', attrs(ulimits=[]), 'sha256:a', ['ulimits']),
    ('another open-files bound', attrs(ulimits=[dict(Name='nofile', Soft=1048576, Hard=1048576)]), 'sha256:a',
     ['ulimits']),
])
def test_differences(case, got, image_id, expect):
    diffs = G.differences(spec(), got, image_id)
    assert [d.split()[0] for d in diffs] == expect, (case, diffs)


def test_job_attachments_are_every_network_but_the_upstream():
    got = attrs(nets={'up': dict(IPAddress='172.20.0.3'), 'pi-job-a-net': dict(IPAddress='10.47.0.2'),
                      'pi-job-b-net': dict(IPAddress='10.47.0.66'), 'pi-job-c-net': dict(IPAddress='')})
    assert G.job_attachments(got, 'up') == {'pi-job-a-net': '10.47.0.2', 'pi-job-b-net': '10.47.0.66'}


@pytest.mark.parametrize('mode, prefix, expect', [
    ('explicit', 29, 29), ('explicit', 28, 28), ('transparent', 29, 26), ('transparent', 27, 27),
    ('transparent', 24, 24), ('transparent', 28, 'error'),
])
def test_the_prefix_a_mode_gets(mode, prefix, expect):
    if expect == 'error':
        with pytest.raises(Exception) as caught:
            T.prefix_for(mode, prefix, 29)
        assert '/28 is too small' in str(caught.value) and 'Nothing was created' in str(caught.value)
    else:
        assert T.prefix_for(mode, prefix, 29) == expect


def test_a_transparent_network_is_split_in_halves_and_its_file_says_so():
    import ipaddress
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import optins
    low, high = T.halves(ipaddress.ip_network('10.47.0.64/26'))
    assert (str(low), str(high)) == ('10.47.0.64/27', '10.47.0.96/27')
    conf = T.config('j1', 'pi-job-j1-net', '10.47.0.64/26', '10.47.0.66', '10.47.0.67', 3128,
                    optins.validate({'egress': {'allow': {'ssh': ['github.com']}}}, '/p/config.yaml'))
    assert conf['vrange'] == '10.47.0.96/27' and conf['optins'] == {'tcp': {'22': ['github.com']}, 'udp': {}}
    assert conf['policy'] == '/p/config.yaml' and T.chain_name(conf['subnet']) == 'PIGW-10-47-0-64'


def test_an_unknown_mode_is_refused():
    with pytest.raises(Exception) as caught:
        T.check_mode_name('intercept')
    assert 'explicit' in str(caught.value) and 'transparent' in str(caught.value)


# --- state=absent: the container and its <name>-nets volume ----------------------------------------------------

docker = pytest.importorskip('docker')


class _API(object):
    def __init__(self, container, volume):
        self.container, self.volume = container, volume
        self.calls = []

    def inspect_container(self, name):
        if self.container is None:
            raise docker.errors.NotFound('No such container: %s' % name)
        return self.container

    def remove_container(self, name, force=False):
        self.calls.append('remove_container %s' % name)

    def inspect_volume(self, name):
        if not self.volume:
            raise docker.errors.NotFound('no such volume')
        return {'Name': name}

    def remove_volume(self, name):
        self.calls.append('remove_volume %s' % name)


class _Client(object):
    def __init__(self, container, volume):
        self.api = _API(container, volume)


def _gateway(jobs=()):
    nets = dict((n, {'IPAddress': '10.47.0.%d' % i}) for i, n in enumerate(['pi-dispatch-egress-out'] + list(jobs)))
    return {'Config': {'Labels': {G.LABEL_ROLE: G.ROLE}}, 'HostConfig': {'NetworkMode': 'pi-dispatch-egress-out'},
            'NetworkSettings': {'Networks': nets}}


REMOVE_CASES = [
    # id, container, volume, check_mode, changed, actions, calls
    ('both', _gateway(), True, False, True, ['remove gw', 'remove volume gw-nets'],
     ['remove_container gw', 'remove_volume gw-nets']),
    ('both-check-mode', _gateway(), True, True, True, ['remove gw', 'remove volume gw-nets'], []),
    ('container-only', _gateway(), False, False, True, ['remove gw'], ['remove_container gw']),
    ('volume-left-by-a-half-removal', None, True, False, True, ['remove volume gw-nets'], ['remove_volume gw-nets']),
    ('nothing', None, False, False, False, [], []),
]


@pytest.mark.parametrize('container,volume,check_mode,changed,actions,calls', [c[1:] for c in REMOVE_CASES],
                         ids=[c[0] for c in REMOVE_CASES])
def test_remove_takes_the_volume_with_it(container, volume, check_mode, changed, actions, calls):
    client = _Client(container, volume)
    result = G.remove(client, 'gw', check_mode=check_mode)
    assert result['changed'] is changed and result['actions'] == actions
    assert client.api.calls == calls


def test_remove_is_refused_while_a_job_network_has_it_and_keeps_the_volume():
    client = _Client(_gateway(['pi-job-a-net']), True)
    with pytest.raises(G.GatewayError) as info:
        G.remove(client, 'gw')
    assert 'pi-job-a-net' in str(info.value) and client.api.calls == []
