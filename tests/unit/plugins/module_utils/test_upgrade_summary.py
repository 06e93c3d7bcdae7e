"""The fleet summary of an upgrade: groups, lines, outcomes (the table the upgrade prints)."""

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._fleet import upgrade_summary as us


def report(**kw):
    base = dict(action='refresh', refreshed=False, backup=None, proxy_step=None, jobs_cut=0, rolled_back=False,
                refused=False, failed=False, message='done')
    base.update(kw)
    return base


@pytest.mark.parametrize('rep, groups, outcome', [
    (None, ['not reached'], 'not reached'),
    (report(), ['left alone'], 'unchanged'),
    (report(refreshed=True), ['refreshed'], 'upgraded'),
    (report(refreshed=True, proxy_step='restart'), ['refreshed', 'restarted'], 'upgraded'),
    (report(refreshed=True, proxy_step='unpause+restart'), ['refreshed', 'restarted'], 'upgraded'),
    (report(proxy_step='start'), ['started'], 'upgraded'),
    (report(proxy_step='create'), ['created'], 'upgraded'),
    (report(refreshed=True, proxy_step='replace'), ['refreshed', 'replaced'], 'upgraded'),
    (report(rolled_back=True, failed=True, refreshed=True), ['rolled back'], 'rolled back'),
    (report(refused=True, failed=True), ['refused'], 'refused'),
    (report(failed=True), ['failed'], 'failed'),
    # set_fact turns booleans of a templated dict into strings: they still count
    (report(rolled_back='True', failed='True'), ['rolled back'], 'rolled back'),
    (report(refused='False', failed='False', refreshed='True'), ['refreshed'], 'upgraded'),
    (report(proxy_step='something new'), ['left alone'], 'unchanged'),
])
def test_groups_and_outcome_table(rep, groups, outcome):
    assert us.groups_of(rep) == groups
    assert us.outcome_of(rep) == outcome


def test_summary_of_a_fleet_keeps_the_printed_shape():
    hosts = ['engine-a', 'engine-b', 'engine-c']
    reports = [report(refreshed=True, proxy_step='restart', backup='/x/egress-proxy.conf.bak-1',
                      message='refreshed\nsecond line'),
               report(rolled_back=True, failed=True, message='ROLLBACK: old rules restored'), None]
    out = us.summarize(hosts, reports)
    assert out['lines'][:10] == ['refreshed: engine-a', 'restarted: engine-a', 'started: -', 'created: -',
                                 'replaced: -', 'rolled back: engine-b', 'refused: -', 'failed: -',
                                 'left alone: -', 'not reached: engine-c']
    assert out['lines'][10:] == ['engine-a: refresh - refreshed Backup: /x/egress-proxy.conf.bak-1',
                                 'engine-b: refresh - ROLLBACK: old rules restored']
    assert [row['outcome'] for row in out['hosts']] == ['upgraded', 'rolled back', 'not reached']
    assert out['totals'] == {'upgraded': 1, 'unchanged': 0, 'rolled back': 1, 'refused': 0, 'failed': 0,
                             'not reached': 1}
    assert out['table'][0].split() == ['host', 'outcome', 'action']
    assert out['table'][3].split() == ['engine-c', 'not', 'reached', '-']


def test_check_mode_lines_say_so():
    out = us.summarize(['h'], [report()], check_mode=True)
    assert out['lines'][-1] == 'h: refresh (check mode) - done'


def test_hosts_and_reports_must_pair():
    with pytest.raises(ValueError) as caught:
        us.summarize(['a', 'b'], [None])
    assert 'one report (or null) per host' in str(caught.value)
