"""The fleet report of the doctor: each host's status, the table, the human report, the totals, the JSON file."""

import json

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._fleet import doctor_report as dr

RUNNING = dict(id='proxy.running', status='ok', message='Egress proxy running (pi-dispatch-egress-proxy)', fix=None)
MISSING = dict(id='proxy.missing', status='fail',
               message='Egress proxy missing: there is no container pi-dispatch-egress-proxy, so every job is refused',
               fix='ansible-playbook pi_dispatch.egress.site')
DENY = dict(id='canary.deny', status='fail', message='Egress canary deny: example.com was reached',
            fix='check the rules')
DIFFER = dict(id='proxy.rules_differ', status='warn', message='Egress proxy rules: x differs', fix='refresh the rules')
SKIPPED_LINE = dict(id='overlay.none', status='notrun', message='Overlay models.json not given', fix='give it')


def result(*lines, **kw):
    base = dict(changed=False, lines=list(lines), report='(not read)', json_lines='(not read)',
                summary=dict(ok=0, warn=0, fail=0, notrun=0), actions=[], timings={})
    base.update(kw)
    return base


ZERO = dict(ok=0, warn=0, fail=0, notrun=0)


@pytest.mark.parametrize('res, unreachable, reason, status, summary, failed_lines, shown', [
    # the doctor ran: fail on any fail line, ok otherwise (warn and not-run lines do not fail a host)
    (result(RUNNING), False, None, 'ok', dict(ZERO, ok=1), [], None),
    (result(RUNNING, DIFFER, SKIPPED_LINE), False, None, 'ok', dict(ZERO, ok=1, warn=1, notrun=1), [], None),
    (result(MISSING, RUNNING, DENY), False, None, 'fail', dict(ZERO, ok=1, fail=2), ['proxy.missing', 'canary.deny'],
     None),
    # failed_when marked the doctor task failed: its lines still decide
    (result(MISSING, failed=True, msg='doctor: 1 check(s) failed'), False, None, 'fail', dict(ZERO, fail=1),
     ['proxy.missing'], None),
    (result(), False, None, 'ok', ZERO, [], None),
    # unreachable: from the list, or the result says so; reasons first, then msg, then the default
    (None, True, None, 'unreachable', ZERO, [], dr.UNREACHABLE),
    (None, True, 'Failed to connect to the host via ssh', 'unreachable', ZERO, [],
     'Failed to connect to the host via ssh'),
    (dict(unreachable=True, msg='ssh: connect to host engine-c port 22: No route to host'), False, None,
     'unreachable', ZERO, [], 'ssh: connect to host engine-c port 22: No route to host'),
    (result(RUNNING), True, None, 'unreachable', ZERO, [], dr.UNREACHABLE),
    # not run: no result, an empty one, a failed task without lines (the preflight), a skipped task
    (None, False, None, 'not run', ZERO, [], dr.NOT_RUN),
    ({}, False, 'the play stopped at the preflight', 'not run', ZERO, [], 'the play stopped at the preflight'),
    (dict(failed=True, msg='the Docker SDK for Python is missing: pip install docker'), False, None, 'not run',
     ZERO, [], 'the Docker SDK for Python is missing: pip install docker'),
    (dict(failed=True, msg='from the task'), False, 'from reasons', 'not run', ZERO, [], 'from reasons'),
    (dict(failed=True), False, None, 'not run', ZERO, [], dr.NOT_RUN),
    (dict(skipped=True, skip_reason='Conditional result was False'), False, None, 'not run', ZERO, [], dr.SKIPPED),
    # a reason or msg is redacted; a blank one does not count
    (dict(failed=True, msg='cannot reach tcp://user:secret@engine:2376'), False, None, 'not run', ZERO, [],
     'cannot reach tcp://***@engine:2376'),
    (None, False, '   ', 'not run', ZERO, [], dr.NOT_RUN),
])
def test_host_status_table(res, unreachable, reason, status, summary, failed_lines, shown):
    row = dr.host_row(0, 'h', res, unreachable=unreachable, reason=reason)
    assert row['status'] == status
    assert row['summary'] == summary
    assert row['failed_lines'] == failed_lines
    assert row['reason'] == shown


def test_a_row_keeps_only_the_line_keys_and_never_the_rest_of_the_result():
    line = dict(MISSING, group='proxy', extra='not shown')
    row = dr.host_row(0, 'h', result(line, report='SECRET report', json_lines='SECRET', timings={'x': 1}))
    assert row['lines'] == [dict(MISSING, group='proxy')]
    assert 'SECRET' not in json.dumps(dr.aggregate(['h'], [result(line, report='SECRET')]))


@pytest.mark.parametrize('hosts, results, kw, message', [
    (['a', 'b'], [None], {}, 'hosts has 2 names but results has 1 entries; give one result (or null) per host'),
    (['a', 'b'], [None, 'ok'], {}, "results[1] (host b) is 'ok', not a result dict or null; give the host's "
                                   "registered egress_canary result"),
    (['a'], [['x']], {}, "results[0] (host a) is ['x'], not a result dict or null"),
    (['a'], [dict(lines='x')], {}, "results[0] (host a) has lines 'x', not a list"),
    (['a', 'b'], [None, result(RUNNING, 'x')], {}, 'results[1].lines[1] (host b) is '),
    (['a'], [result(dict(RUNNING, status='passed'))], {}, 'not a doctor line (a dict with a status of ok, warn, '
                                                          'fail, notrun)'),
    (['a'], [dict(changed=False, ansible_facts={})], {}, 'results[0] (host a) has no lines and is not a failed, '
                                                         'skipped or unreachable task result (keys: ansible_facts, '
                                                         'changed)'),
    (['a', 'a'], [None, None], {}, "hosts[1] 'a' is listed twice"),
    (['a'], [None], dict(unreachable=['b']), "unreachable[0] 'b' is not one of hosts"),
    (['a'], [None], dict(reasons={'b': 'x'}), "reasons has a key 'b' that is not one of hosts"),
])
def test_malformed_input_names_the_option_and_the_index(hosts, results, kw, message):
    with pytest.raises(ValueError) as caught:
        dr.aggregate(hosts, results, **kw)
    assert message in str(caught.value)


def fleet():
    return dr.aggregate(
        ['engine-a', 'engine-bb', 'engine-c'],
        [result(RUNNING, DIFFER, SKIPPED_LINE), result(MISSING, RUNNING, DENY, failed=True, msg='2 failed'), None],
        unreachable=['engine-c'], reasons={'engine-c': 'Failed to connect to the host via ssh: timed out'})


def test_the_table_of_three_hosts_is_aligned():
    assert fleet()['table'] == [
        u'host       status       ok  warn  fail  notrun  detail',
        u'engine-a   ok            1     1     0       1',
        u'engine-bb  fail          1     0     2       0  Egress proxy missing: there is no container '
        u'pi-dispatch-egress-proxy, so every job is refused (+1 more)',
        u'engine-c   unreachable   -     -     -       -  Failed to connect to the host via ssh: timed out',
    ]


def test_the_human_report_groups_each_hosts_lines_with_symbols_and_fixes():
    assert fleet()['lines'] == [
        u'== engine-a: ok ==',
        u'  Egress proxy:',
        u'    \u2713 Egress proxy running (pi-dispatch-egress-proxy)',
        u'    \u26a0 Egress proxy rules: x differs',
        u'        fix: refresh the rules',
        u'  Overlay models.json and allowlist:',
        u'    \u25cb Overlay models.json not given',  # no fix under a not-run line
        u'  3 checks: 1 \u2713, 1 \u26a0, 0 \u2717, 1 not run',
        u'== engine-bb: fail ==',
        u'  Egress proxy:',
        u'    \u2717 Egress proxy missing: there is no container pi-dispatch-egress-proxy, so every job is refused',
        u'        fix: ansible-playbook pi_dispatch.egress.site',
        u'    \u2713 Egress proxy running (pi-dispatch-egress-proxy)',
        u'  Egress canary:',
        u'    \u2717 Egress canary deny: example.com was reached',
        u'        fix: check the rules',
        u'  3 checks: 1 \u2713, 0 \u26a0, 2 \u2717, 0 not run',
        u'== engine-c: unreachable ==',
        u'  Failed to connect to the host via ssh: timed out',
        u'3 hosts: 1 ok, 1 fail, 1 unreachable, 0 not run; 6 checks: 2 \u2713, 1 \u26a0, 2 \u2717, 1 not run',
    ]


def test_totals_and_fleet_failed():
    out = fleet()
    assert out['totals'] == dict(hosts={'ok': 1, 'fail': 1, 'unreachable': 1, 'not run': 0},
                                 lines=dict(ok=2, warn=1, fail=2, notrun=1), consented={'limits_unenforced': []})
    assert out['fleet_failed'] is True
    assert [row['status'] for row in out['hosts']] == ['ok', 'fail', 'unreachable']
    assert dr.aggregate(['a'], [result(RUNNING, DIFFER)])['fleet_failed'] is False
    assert dr.aggregate(['a'], [None])['fleet_failed'] is True


@pytest.mark.parametrize('line, group', [
    (dict(RUNNING), 'Egress proxy'),                            # the catalogue's group of the id
    (dict(RUNNING, group='firewall'), 'Host firewall layer'),   # a known group the line carries wins
    (dict(RUNNING, group='new'), 'Egress proxy'),               # an unknown one does not
    (dict(RUNNING, id='proxy.from_a_newer_doctor'), 'Other checks'),
    (dict(status='ok', message='no id'), 'Other checks'),
])
def test_a_line_is_shown_under_its_group(line, group):
    assert dr.aggregate(['h'], [result(line)])['lines'][1] == u'  %s:' % group


def test_a_multi_line_message_or_reason_shows_its_first_line_in_the_table():
    out = dr.aggregate(['a', 'b'], [result(dict(MISSING, message='first\nsecond')), dict(failed=True, msg='one\ntwo')])
    assert out['table'][1].endswith('  first')
    assert out['table'][2].endswith('  one')
    assert out['lines'][-3:-1] == [u'  one', u'  two']


def test_an_ok_host_keeps_a_reason_it_was_given():
    out = dr.aggregate(['a'], [result(RUNNING)], reasons={'a': 'ran after a retry'})
    assert out['hosts'][0]['reason'] == 'ran after a retry'
    assert out['table'][1].endswith('  ran after a retry')
    assert out['lines'][1] == u'  ran after a retry'


def test_the_json_document_and_its_file(tmp_path):
    out = fleet()
    text = dr.json_document(out)
    document = json.loads(text)
    assert sorted(document) == ['failed', 'hosts', 'totals']
    assert document['failed'] is True and document['totals'] == out['totals']
    assert [row['host'] for row in document['hosts']] == ['engine-a', 'engine-bb', 'engine-c']
    path = str(tmp_path / 'fleet.json')
    assert dr.write_json(path, text, check_mode=True) is True
    assert not (tmp_path / 'fleet.json').exists()
    assert dr.write_json(path, text) is True
    assert (tmp_path / 'fleet.json').read_text() == text
    assert dr.write_json(path, text) is False
    (tmp_path / 'fleet.json').write_bytes(b'\xff\xfe not text')
    assert dr.write_json(path, text, check_mode=True) is True
    with pytest.raises((IOError, OSError)):
        dr.write_json(str(tmp_path / 'missing' / 'fleet.json'), text)


UNENFORCED = dict(id='proxy.limits_unenforced', status='warn',
                  message='Egress proxy limits not enforced: Podman 4.3.1 (rootless) on a cgroup v1 host ...',
                  fix='boot the host with cgroup v2')


def test_hosts_that_run_without_enforced_limits_are_counted_and_named():
    out = dr.aggregate(['a', 'b', 'c'], [result(RUNNING, UNENFORCED), result(RUNNING), result(UNENFORCED)])
    assert out['totals']['consented'] == {'limits_unenforced': ['a', 'c']}
    assert out['lines'][-1] == (u'2 of 3 hosts: the proxy runs without enforced memory and pids limits '
                                u'(rootless on cgroup v1): a, c')
    assert out['fleet_failed'] is False  # a consented weakening is a warning, not a failed host
    assert json.loads(dr.json_document(out))['totals']['consented'] == {'limits_unenforced': ['a', 'c']}
    clean = dr.aggregate(['a'], [result(RUNNING)])
    assert 'limits' not in clean['lines'][-1] and clean['totals']['consented'] == {'limits_unenforced': []}
