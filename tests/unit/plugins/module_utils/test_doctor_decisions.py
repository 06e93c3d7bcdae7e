# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The doctor's decision log line: the last hour's refusals, its own probes left out."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import time

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import decisions as DD

NOW = 1796504400.0


def line(minutes_ago, **kw):
    out = dict(time=time.strftime('%Y-%m-%dT%H:%M:%S.000Z', time.gmtime(NOW - minutes_ago * 60)), job='j1',
               network='pi-job-j1-net', host='evil.test', port=443, method='CONNECT', verdict='refused',
               reason='unlisted')
    out.update(kw)
    return json.dumps(out) + '\n'


@pytest.fixture
def folder(tmp_path):
    path = tmp_path / 'decisions'
    path.mkdir()
    return path


def test_refusals_of_the_last_hour_are_summarized(folder):
    (folder / 'p.decisions.jsonl').write_text(
        line(5) + line(10, host='evil.test') + line(20, job='j2', host='other.test', reason='port')
        + line(90, host='old.test')  # outside the hour
        + line(1, verdict='allowed', reason='sni_ok', host='api.test'))
    (folder / 'p.tls-decisions.jsonl').write_text(
        line(3, job='j2', host='api.test', reason='sni_mismatch')
        # the doctor's own canary and isolation probes are refused on purpose
        + line(2, job=None, network='pi-dispatch-egress-doctor-77', host='denied.test')
        + line(2, job='doctor-77-a', network='pi-job-doctor-77-a-net', host='x.test'))
    got = DD.decisions_line(str(folder), now=NOW)
    assert (got.id, got.status) == ('decisions.refusals', 'warn')
    assert got.message == ('Decision log: 4 requests refused in the last hour; top hosts: evil.test (2), api.test (1), '
                           'other.test (1); jobs: j1 (2), j2 (2); reasons: unlisted 2, port 1, sni_mismatch 1')
    assert 'egress_decisions_since=1h' in got.fix


def test_quiet_when_nothing_was_refused(folder):
    (folder / 'p.decisions.jsonl').write_text(line(5, verdict='allowed', reason='listed')
                                              + line(1, network='pi-dispatch-egress-doctor-9'))
    got = DD.decisions_line(str(folder), now=NOW)
    assert (got.id, got.status) == ('decisions.quiet', 'ok')
    assert '(2 decisions read from 1 files in %s)' % folder in got.message


def test_missing_and_unreadable_folders_warn_with_the_fix(tmp_path, folder):
    got = DD.decisions_line(str(tmp_path / 'nothing'), now=NOW)
    assert (got.id, got.status) == ('decisions.missing', 'warn') and 'site.yml' in got.fix
    os.symlink(str(folder), str(tmp_path / 'link'))
    got = DD.decisions_line(str(tmp_path / 'link'), now=NOW)
    assert (got.id, got.status) == ('decisions.unreadable', 'warn') and 'symlink' in got.message


def test_a_fifo_or_a_link_in_the_folder_is_named_with_the_fix_never_waited_on(tmp_path, folder):
    """Issue 42 item 15: the doctor reads as root; a FIFO would have held it, a link would have been followed."""
    import signal

    (folder / 'p.decisions.jsonl').write_text(line(5))
    os.mkfifo(str(folder / 'p.tls-decisions.jsonl'))
    os.symlink('/etc/shadow', str(folder / 'q.decisions.jsonl'))

    def expired(_signum, _frame):
        raise AssertionError('the doctor waited on the FIFO')
    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, 5)
    try:
        got = DD.decisions_line(str(folder), now=NOW)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert (got.id, got.status) == ('decisions.unreadable', 'warn'), got
    assert '%s is a FIFO' % (folder / 'p.tls-decisions.jsonl') in got.message, got
    assert '%s is a symlink' % (folder / 'q.decisions.jsonl') in got.message, got
    assert 'remove' in got.fix
