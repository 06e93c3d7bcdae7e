# -*- coding: utf-8 -*-
"""The doctor's transparent check: the probe script, its parse, the lines it gives (pure parts)."""

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import transparent as T
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.lines import LINE_IDS

GOOD = {'https': (0, 0.01, 401), 'http': (0, 0.01, 401), 'deny': (6, 0.0, 0), 'dns': (6, 0.0, 0),
        'tcp': (28, 0.0, 0), 'udp123': (28, 0.0, 0), 'port': (28, 0.02, 0)}


def ids(lines):
    return [(line.id, line.status) for line in lines]


def with_(**changes):
    out = dict(GOOD)
    out.update(changes)
    return out


@pytest.mark.parametrize('case, results, port, nxdomain, dropped, expect', [
    ('all as it should be', GOOD, 'git.test:22', 2, 5,
     [('transparent.https', 'ok'), ('transparent.http', 'ok'), ('transparent.deny', 'ok'), ('transparent.dns', 'ok'),
      ('transparent.drop', 'ok'), ('transparent.port', 'ok')]),
    ('no port asked: no port line', GOOD, None, 2, 5,
     [('transparent.https', 'ok'), ('transparent.http', 'ok'), ('transparent.deny', 'ok'), ('transparent.dns', 'ok'),
      ('transparent.drop', 'ok')]),
    ('https not answered', with_(https=(28, 0.0, 0)), None, 2, 5,
     [('transparent.https_unreached', 'warn'), ('transparent.http', 'ok'), ('transparent.deny', 'ok'),
      ('transparent.dns', 'ok'), ('transparent.drop', 'ok')]),
    ('squid refused plain http: still an answer', with_(http=(0, 0.01, 403)), None, 2, 5,
     [('transparent.https', 'ok'), ('transparent.http', 'ok'), ('transparent.deny', 'ok'), ('transparent.dns', 'ok'),
      ('transparent.drop', 'ok')]),
    ('the deny host resolves and answers', with_(deny=(0, 0.01, 200)), None, 2, 5,
     [('transparent.https', 'ok'), ('transparent.http', 'ok'), ('transparent.deny_leaks', 'fail'),
      ('transparent.dns', 'ok'), ('transparent.drop', 'ok')]),
    ('the deny host resolves, connection refused', with_(deny=(7, 0.0, 0)), None, 2, 5,
     [('transparent.https', 'ok'), ('transparent.http', 'ok'), ('transparent.deny_leaks', 'fail'),
      ('transparent.dns', 'ok'), ('transparent.drop', 'ok')]),
    ('the unique name resolved', with_(dns=(7, 0.0, 0)), None, 2, 5,
     [('transparent.https', 'ok'), ('transparent.http', 'ok'), ('transparent.deny', 'ok'),
      ('transparent.dns_leaks', 'fail'), ('transparent.drop', 'ok')]),
    ('NXDOMAIN, but not from the gateway', GOOD, None, 0, 5,
     [('transparent.https', 'ok'), ('transparent.http', 'ok'), ('transparent.deny', 'ok'),
      ('transparent.dns_leaks', 'fail'), ('transparent.drop', 'ok')]),
    ('tcp 22 connected', with_(tcp=(0, 0.01, 0)), None, 2, 5,
     [('transparent.https', 'ok'), ('transparent.http', 'ok'), ('transparent.deny', 'ok'), ('transparent.dns', 'ok'),
      ('transparent.drop_leaks', 'fail')]),
    ('nothing counted as dropped', GOOD, None, 2, 0,
     [('transparent.https', 'ok'), ('transparent.http', 'ok'), ('transparent.deny', 'ok'), ('transparent.dns', 'ok'),
      ('transparent.drop_leaks', 'fail')]),
    ('the opted-in port does not connect', with_(port=(28, 0.0, 0)), 'git.test:22', 2, 5,
     [('transparent.https', 'ok'), ('transparent.http', 'ok'), ('transparent.deny', 'ok'), ('transparent.dns', 'ok'),
      ('transparent.drop', 'ok'), ('transparent.port_unreached', 'warn')]),
    ('a probe printed nothing', {k: v for k, v in GOOD.items() if k != 'http'}, None, 2, 5,
     [('transparent.https', 'ok'), ('transparent.notrun', 'notrun'), ('transparent.deny', 'ok'),
      ('transparent.dns', 'ok'), ('transparent.drop', 'ok')]),
    ('the probe image has no curl', {}, None, 0, 0,
     [('transparent.notrun', 'notrun')] * 5),
])
def test_classify(case, results, port, nxdomain, dropped, expect):
    lines = T.classify(results, 'api.test', 'deny.test', 'u1', port, nxdomain, dropped)
    assert ids(lines) == expect, case
    assert all(line.id in LINE_IDS for line in lines)


def test_the_script_asks_each_probe_and_its_output_parses():
    script = T.probe_script('api.test', 'deny.test', 'u1', 'git.test:22', 10)
    for probe, url in (('https', 'https://api.test/'), ('http', 'http://api.test/'), ('deny', 'https://deny.test/'),
                       ('dns', 'https://u1.deny.test/'), ('tcp', 'telnet://api.test:23'),
                       ('udp123', 'tftp://api.test:123/pi-doctor'), ('port', 'telnet://git.test:22')):
        assert "'%s'" % url in script and 'echo "%s $?' % probe in script
    other = T.probe_script('api.test', 'deny.test', 'u1', None, 10)
    assert 'telnet://git.test' not in other and "'telnet://api.test:22'" in other  # 22 when nothing opts it in
    assert T.drop_port('git.test:2222') == 22 and T.drop_port('git.test:22') == 23
    text = 'https 0 0.012 401\nhttp 0 0.010 401\nnoise line\ndeny 6 0.000000 000\ntcp 28 0.0 000\nbad x y z\n'
    assert T.parse_probe_lines(text) == {'https': (0, 0.012, 401), 'http': (0, 0.01, 401), 'deny': (6, 0.0, 0),
                                         'tcp': (28, 0.0, 0)}


@pytest.mark.parametrize('optins, expect', [
    ({'tcp': {}, 'udp': {}}, None),
    ({'tcp': {'22': ['github.com']}, 'udp': {}}, None),
    ({'tcp': {'22': True}, 'udp': {}}, 'tcp/22'),
    ({'tcp': {'22': True, '2222': ['a.test']}, 'udp': {'123': True}}, 'tcp/22, udp/123'),
])
def test_wide_opt_ins_are_warned(optins, expect):
    lines = T.wide_lines({'networks': [dict(network='pi-job-1-net', optins=optins, policy='/p/config.yaml')]})
    if expect is None:
        assert lines == []
    else:
        assert ids(lines) == [('transparent.wide', 'warn')]
        assert 'opens %s towards every name' % expect in lines[0].message and '/p/config.yaml' in lines[0].message


class _Ctx(object):
    gateway = None


def test_no_gateway_named_no_line():
    assert T.TransparentCheck().lines(_Ctx()) == []
