"""The doctor with the egress layer off (egress_enabled: false): one warning, or a failure when the
OpenShell venue is configured; egress_canary's result built without any engine."""

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import doctor as _doctor
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import off as _off


@pytest.mark.parametrize('params, line_id, status, says', [
    ({}, 'egress.off', 'warn', 'whole network in front of them'),
    ({'openshell_policy': None, 'openshell_gateway': None}, 'egress.off', 'warn', 'nothing else was checked'),
    ({'openshell_policy': '', 'openshell_gateway': ''}, 'egress.off', 'warn', 'egress_enabled: false'),
    ({'proxy_name': 'p', 'docker_host': 'unix:///x.sock'}, 'egress.off', 'warn', 'default network'),
    ({'openshell_policy': '/etc/pi/policy.json'}, 'egress.off_openshell', 'fail',
     '(openshell_policy /etc/pi/policy.json)'),
    ({'openshell_gateway': 'gw.test:8080'}, 'egress.off_openshell', 'fail', '(openshell_gateway gw.test:8080)'),
    ({'openshell_policy': '/p.json', 'openshell_gateway': 'gw.test:8080'}, 'egress.off_openshell', 'fail',
     '(openshell_policy /p.json, openshell_gateway gw.test:8080)'),
])
def test_off_lines(params, line_id, status, says):
    lines = _off.off_lines(params)
    assert [(line.id, line.status) for line in lines] == [(line_id, status)]
    assert says in lines[0].message and '<' not in lines[0].message
    assert lines[0].fix and 'egress_enabled: true' in lines[0].fix


def test_off_result_is_a_whole_canary_result_with_nothing_done():
    result = _doctor.off_result({})
    assert result['changed'] is False and result['actions'] == [] and result['timings'] == {}
    assert result['summary'] == {'ok': 0, 'warn': 1, 'fail': 0, 'notrun': 0}
    assert [row['id'] for row in result['lines']] == ['egress.off']
    assert 'Egress layer' in result['report'] and result['json_lines'].count('\n') == 1


def test_off_result_with_openshell_fails():
    result = _doctor.off_result({'openshell_gateway': 'gw.test:8080'})
    assert result['summary']['fail'] == 1 and result['lines'][0]['id'] == 'egress.off_openshell'
