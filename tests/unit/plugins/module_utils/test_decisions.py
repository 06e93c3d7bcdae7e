# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The decision log's reader: times, files, filters, counts, and the replay of a candidate allowlist."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import contextlib
import json
import os
import signal
import socket

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import decisions as D

NOW = 1796500000.0  # 2026-12-05T...Z


@pytest.mark.parametrize('text,expect', [
    (None, None),
    ('', None),
    ('1h', NOW - 3600),
    ('30m', NOW - 1800),
    ('90s', NOW - 90),
    ('7d', NOW - 7 * 86400),
    ('2026-12-05T21:00:00Z', 1796504400.0),
    ('2026-12-05T21:00:00.250Z', 1796504400.25),
    ('2026-12-05 21:00:00', 1796504400.0),
    ('1796504400', 1796504400.0),
    ('1796504400.5', 1796504400.5),
    (1796504400, 1796504400.0),
])
def test_parse_time(text, expect):
    assert D.parse_time(text, now=NOW) == expect


@pytest.mark.parametrize('text', ['yesterday', '1w', '-1h', '2026-13-45T99:00:00Z', '2026/12/05', '1 h x'])
def test_parse_time_refuses_with_the_key_and_the_forms(text):
    with pytest.raises(D.DecisionsError) as info:
        D.parse_time(text, now=NOW, key='until')
    assert 'until = %r' % text in str(info.value) and '30m, 1h, 7d' in str(info.value)


def record(**kw):
    out = dict(time='2026-12-05T21:00:00.000Z', proxy='p', check='proxy', job='j1', network='pi-job-j1-net',
               client='10.47.0.2', method='CONNECT', host='api.example.test', port=443, sni=None,
               verdict='allowed', reason='sni_ok', status=200, squid_status='TCP_TUNNEL', bytes_from_client=1,
               bytes_to_client=2, duration_ms=3)
    out.update(kw)
    return out


def write(folder, name, records, extra=''):
    with open(os.path.join(folder, name), 'w') as handle:
        handle.write(''.join(json.dumps(r) + '\n' for r in records) + extra)


def test_files_in_rotation_order_symlinks_skipped_other_names_ignored(tmp_path):
    folder = str(tmp_path)
    for name in ('p.decisions.jsonl', 'p.decisions.jsonl.2', 'p.decisions.jsonl.1', 'notes.txt', '.hidden.jsonl',
                 'q.tls-decisions.jsonl'):
        write(folder, name, [])
    os.symlink('/etc/passwd', os.path.join(folder, 'evil.jsonl'))
    files, warnings = D.log_files(folder)
    assert [os.path.basename(f) for f in files] == ['p.decisions.jsonl.2', 'p.decisions.jsonl.1', 'p.decisions.jsonl',
                                                    'q.tls-decisions.jsonl']
    assert len(warnings) == 1 and 'evil.jsonl is a symlink' in warnings[0]


def test_a_symlinked_or_wrong_folder_is_refused_and_a_missing_one_is_empty(tmp_path):
    real = tmp_path / 'real'
    real.mkdir()
    (tmp_path / 'link').symlink_to(real)
    with pytest.raises(D.DecisionsError) as info:
        D.log_files(str(tmp_path / 'link'))
    assert 'is a symlink' in str(info.value) and 'Nothing was read' in str(info.value)
    (tmp_path / 'file').write_text('x')
    with pytest.raises(D.DecisionsError):
        D.log_files(str(tmp_path / 'file'))
    assert D.log_files(str(tmp_path / 'absent')) == ([], [])


def test_read_records_in_time_order_with_the_window_and_bad_lines_named(tmp_path):
    folder = str(tmp_path)
    write(folder, 'a.decisions.jsonl', [record(time='2026-12-05T21:00:02.000Z', host='b.test'),
                                        record(time='2026-12-05T20:00:00.000Z', host='old.test')],
          extra='{"cut": \n[1, 2]\n')
    write(folder, 'a.tls-decisions.jsonl', [record(time='2026-12-05T21:00:01.000Z', host='a.test')])
    records, problems, warnings = D.read_records(folder, since=D.parse_time('2026-12-05T20:30:00Z'))
    assert [r['host'] for r in records] == ['a.test', 'b.test']
    assert len(problems) == 2 and 'a.decisions.jsonl line 3 is not a decision record' in problems[0]
    assert warnings == []
    records, problems, _w = D.read_records(folder, until=D.parse_time('2026-12-05T20:30:00Z'), max_problems=0)
    assert [r['host'] for r in records] == ['old.test'] and problems == ['2 lines in all were not decision records']


@contextlib.contextmanager
def prompt(seconds=5):
    """Fails the test (instead of hanging it) when the body waits longer than ``seconds``: a FIFO opened for
    reading without O_NONBLOCK waits for a writer forever."""
    def expired(_signum, _frame):
        raise AssertionError('still waiting after %ss: a FIFO was opened or read' % seconds)
    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _swapping_log_files(monkeypatch, swap):
    """log_files lists the folder, then ``swap`` runs (the proxy user racing the reader), as between the
    listing and the open of a real read."""
    listed = D.log_files

    def racing(folder):
        found = listed(folder)
        swap(folder)
        return found
    monkeypatch.setattr(D, 'log_files', racing)


def _secret(tmp_path):
    """A file only root should read, written as a decision line (so a reader that follows a link would count it)."""
    path = tmp_path / 'shadow'
    path.write_text(json.dumps(record(host='secret-from-shadow.test')) + '\n')
    return str(path)


@pytest.mark.parametrize('kind', ['symlink', 'fifo'])
def test_a_file_swapped_after_the_listing_is_refused_never_read_or_waited_on(tmp_path, monkeypatch, kind):
    """Issue 42 item 15: the reader listed a regular file, then opened whatever the name was by then."""
    folder = tmp_path / 'decisions'
    folder.mkdir()
    write(str(folder), 'p.decisions.jsonl', [record(host='kept.test')])
    write(str(folder), 'p.tls-decisions.jsonl', [record(host='swapped.test')])
    secret = _secret(tmp_path)

    def swap(path):
        target = os.path.join(path, 'p.tls-decisions.jsonl')
        os.unlink(target)
        if kind == 'symlink':
            os.symlink(secret, target)
        else:
            os.mkfifo(target)
    _swapping_log_files(monkeypatch, swap)
    with prompt():
        log = D.read_log(str(folder))
    assert [r['host'] for r in log.records] == ['kept.test']
    swapped = os.path.join(str(folder), 'p.tls-decisions.jsonl')
    assert log.files == [os.path.join(str(folder), 'p.decisions.jsonl')]
    assert len(log.warnings) == 1, log.warnings
    what = 'a symlink' if kind == 'symlink' else 'a FIFO'
    assert log.warnings[0].startswith('%s is %s, not a file the proxy writes, and was not read' % (swapped, what))
    assert 'rm %s' % swapped in log.warnings[0], log.warnings


@pytest.mark.parametrize('kind', ['symlink', 'fifo', 'socket', 'folder'])
def test_a_log_name_that_is_not_a_regular_file_is_skipped_with_the_fix(tmp_path, kind):
    folder = tmp_path / 'decisions'
    folder.mkdir()
    write(str(folder), 'p.decisions.jsonl', [record(host='kept.test')])
    odd = os.path.join(str(folder), 'q.decisions.jsonl')
    if kind == 'symlink':
        os.symlink(_secret(tmp_path), odd)
    elif kind == 'fifo':
        os.mkfifo(odd)
    elif kind == 'socket':
        server = socket.socket(socket.AF_UNIX)
        server.bind(odd)
        server.close()
    else:
        os.mkdir(odd)
    with prompt():
        result, _matched, warnings = D.query(str(folder))
    assert [r['host'] for r in result['records']] == ['kept.test'] and result['files'] == [
        os.path.join(str(folder), 'p.decisions.jsonl')]
    assert len(warnings) == 1 and warnings[0].startswith('%s is a' % odd) and 'rm %s' % odd in warnings[0], warnings


@pytest.mark.parametrize('kind', ['symlink', 'fifo'])
def test_open_regular_refuses_a_link_or_a_fifo_at_once(tmp_path, kind):
    path = str(tmp_path / 'candidate.conf')
    if kind == 'symlink':
        os.symlink(_secret(tmp_path), path)
    else:
        os.mkfifo(path)
    with prompt():
        with pytest.raises(D.UnsafeFile) as info:
            D.open_regular(path)
        with pytest.raises(D.DecisionsError) as text_info:
            D.read_text(path, 'replay_allowlist')
    assert 'is a %s' % ('symlink' if kind == 'symlink' else 'FIFO') in str(info.value)
    assert str(text_info.value).startswith('%s is a' % path) and 'name the real file' in str(text_info.value)
    assert '(replay_allowlist)' in str(text_info.value) and 'Nothing was read' in str(text_info.value)


def test_a_folder_swapped_for_a_link_after_the_check_is_refused(tmp_path, monkeypatch):
    folder = tmp_path / 'decisions'
    folder.mkdir()
    write(str(folder), 'p.decisions.jsonl', [record()])
    elsewhere = tmp_path / 'elsewhere'

    def swap(path):
        os.rename(path, str(elsewhere))
        os.symlink(str(elsewhere), path)
    _swapping_log_files(monkeypatch, swap)
    with pytest.raises(D.DecisionsError) as info:
        D.read_log(str(folder))
    assert 'not a folder any more' in str(info.value) and 'Nothing was read' in str(info.value)


RECS = [
    record(job='j1', host='api.example.test', verdict='allowed', reason='sni_ok'),
    record(job='j1', host='evil.test', verdict='refused', reason='unlisted', time='2026-12-05T21:05:00.000Z'),
    record(job='j2', host='www.forge.test', verdict='refused', reason='sni_mismatch', sni='evil.test'),
    record(job=None, network='other', host='forge.test', method='GET', port=80, verdict='allowed', reason='listed'),
    record(job='j2', host='Evil.Test.', verdict='refused', reason='port', port=22),
]


@pytest.mark.parametrize('filters,expect', [
    (dict(), [0, 1, 2, 3, 4]),
    (dict(job='j1'), [0, 1]),
    (dict(job='j2', verdict='refused'), [2, 4]),
    (dict(verdict='allowed'), [0, 3]),
    (dict(reason='unlisted'), [1]),
    (dict(host='evil.test'), [1, 4]),
    (dict(host='EVIL.TEST.'), [1, 4]),
    (dict(host='.forge.test'), [2, 3]),
    (dict(host='forge.test'), [3]),
    (dict(host='.test', job='j1'), [0, 1]),
    (dict(since=D.parse_time('2026-12-05T21:01:00Z')), [1]),
    (dict(until=D.parse_time('2026-12-05T21:01:00Z'), job='j2'), [2, 4]),
    (dict(job='nobody'), []),
])
def test_select(filters, expect):
    records = [dict(r, epoch=D.parse_time(r['time'])) for r in RECS]
    assert D.select(records, **filters) == [records[i] for i in expect]


@pytest.mark.parametrize('filters,words', [
    (dict(verdict='maybe'), 'verdict'),
    (dict(reason='because'), 'not a reason the proxy records'),
])
def test_select_refuses_unknown_filters(filters, words):
    with pytest.raises(D.DecisionsError) as info:
        D.select([], **filters)
    assert words in str(info.value)


def test_summarize_counts_and_ranks():
    summary = D.summarize(RECS, top=2)
    assert (summary['total'], summary['allowed'], summary['refused']) == (5, 2, 3)
    assert summary['by_reason'] == {'listed': 1, 'port': 1, 'sni_mismatch': 1, 'sni_ok': 1, 'unlisted': 1}
    assert summary['jobs'] == [{'name': 'j1', 'count': 2}, {'name': 'j2', 'count': 2}]
    assert summary['refused_hosts'] == [{'name': 'evil.test', 'count': 2}, {'name': 'www.forge.test', 'count': 1}]
    assert summary['refused_jobs'] == [{'name': 'j2', 'count': 2}, {'name': 'j1', 'count': 1}]
    assert D.summarize([])['total'] == 0


@pytest.mark.parametrize('entries,host,covered', [
    (['api.example.test'], 'api.example.test', True),
    (['api.example.test'], 'API.Example.Test.', True),
    (['api.example.test'], 'x.api.example.test', False),
    (['api.example.test'], 'example.test', False),
    (['.example.test'], 'example.test', True),
    (['.example.test'], 'a.b.example.test', True),
    (['.example.test'], 'badexample.test', False),
    (['.example.test'], 'example.test.evil', False),
    (['Example.TEST.'], 'example.test', True),
    (['10.1.2.3'], '10.1.2.3', True),
    (['10.1.2.3'], '10.1.2.30', False),
    (['2001:db8::1'], '[2001:db8::1]', True),
    (['# .example.test', ''], 'example.test', False),
    ([], 'anything.test', False),
    (['.test'], 'a.test', True),
    (['api.example.test'], None, False),
])
def test_matcher_covers_what_dstdomain_matches(entries, host, covered):
    assert D.Matcher(entries).covers(host) is covered


def test_entries_of_allowlist_text():
    assert D.entries_of('# head\napi.a.test  # the provider\n\n.forge.test\n  b.test\t\n') == [
        'api.a.test', '.forge.test', 'b.test']


@pytest.mark.parametrize('rec,entries,expect', [
    (record(reason='sni_ok'), ['api.example.test'], 'allowed'),
    (record(reason='sni_ok'), [], 'refused'),
    (record(reason='unlisted', host='new.test'), ['new.test'], 'allowed'),
    (record(reason='unlisted', host='new.test', port=22), ['new.test'], 'refused'),
    (record(reason='listed', method='GET', port=80), ['api.example.test'], 'allowed'),
    (record(reason='plain_https', method='GET', port=443), ['api.example.test'], 'refused'),
    (record(reason='ip_literal', host='10.9.9.9'), ['10.9.9.9'], 'allowed'),
    (record(reason='endpoint', port=8443), [], None),
    (record(reason='guard'), [], None),
    (record(reason='sni_mismatch'), [], None),
    (record(reason='not_tls'), [], None),
])
def test_judge(rec, entries, expect):
    assert D.judge(rec, D.Matcher(entries)) == expect


def test_replay_reports_newly_refused_and_newly_allowed_with_their_jobs():
    current = ['api.example.test', '.forge.test']
    candidate = ['.forge.test', 'evil.test']
    result = D.replay(RECS + [record(job='j3', host='api.example.test', time='2026-12-05T22:00:00.000Z')],
                      current, candidate)
    assert result['newly_refused'] == [dict(kind='CONNECT', host='api.example.test', port=443, jobs=['j1', 'j3'],
                                            requests=2, last='2026-12-05T22:00:00.000Z')]
    assert result['newly_allowed'] == [dict(kind='CONNECT', host='evil.test', port=443, jobs=['j1'], requests=1,
                                            last='2026-12-05T21:05:00.000Z')]
    # judged: the allowlist decided 5 (the port-22 refusal stays refused; sni_mismatch is not the allowlist's)
    assert (result['judged'], result['unchanged']) == (5, 2)
    lines = D.replay_lines(result)
    assert lines == [
        '- CONNECT api.example.test:443 would be refused (2 recorded requests, last 2026-12-05T22:00:00.000Z; '
        'jobs: j1, j3)',
        '+ CONNECT evil.test:443 would pass (1 recorded request, last 2026-12-05T21:05:00.000Z; jobs: j1)']
    diff = D.replay_diff(result, 'cur', 'cand')
    assert diff['before'] == ('CONNECT api.example.test:443 (jobs: j1, j3) allowed\n'
                              'CONNECT evil.test:443 (jobs: j1) refused\n')
    assert diff['after'] == ('CONNECT api.example.test:443 (jobs: j1, j3) refused\n'
                             'CONNECT evil.test:443 (jobs: j1) allowed\n')
    assert D.replay(RECS, current, current)['newly_refused'] == []


def test_every_reason_has_a_description_and_the_allowed_ones_are_reasons():
    assert set(D.ALLOWED_REASONS) <= set(D.REASONS) and set(D.ALLOWLIST_REASONS) <= set(D.REASONS)


@pytest.mark.parametrize('text', ['2026-12-05T21:00:00.000Z', '2026-12-05T21:00:00.999Z', '2026-12-31T23:59:59.001Z',
                                  '2026-12-05T21:00:00Z', '2026-12-05T21:00:00.5Z', '1796504400.25'])
def test_a_lines_time_is_read_like_parse_time_with_the_seconds_cached(text):
    assert D._line_epoch(text) == pytest.approx(D.parse_time(text))
    assert D._line_epoch(text) == pytest.approx(D.parse_time(text))   # the cached second gives the same


@pytest.mark.parametrize('kwargs, count, shown, words', [
    (dict(), 3, 3, None),
    (dict(limit=1), 3, 1, None),
    (dict(limit=0), 3, 0, None),
    (dict(job='job-2'), 1, 1, None),
    (dict(verdict='refused'), 2, 2, None),
    (dict(host='b.test', verdict='refused'), 1, 1, None),
    (dict(limit=-1), None, None, 'limit must be 0 or more'),
    (dict(top=0), None, None, 'top at least 1'),
    (dict(since='yesterday'), None, None, 'since'),
    (dict(verdict='maybe'), None, None, 'verdict'),
])
def test_query_reads_the_folder_once_and_reports_what_it_shows(tmp_path, kwargs, count, shown, words):
    folder = str(tmp_path / 'decisions')
    os.mkdir(folder)
    write(folder, 'p.decisions.jsonl', [record(job='job-1', host='a.test', verdict='refused', reason='unlisted'),
                                        record(job='job-2', host='b.test', verdict='refused', reason='unlisted'),
                                        record(job='job-3', host='c.test')])
    if words:
        with pytest.raises(D.DecisionsError) as info:
            D.query(folder, **kwargs)
        assert words in str(info.value)
        return
    result, matched, warnings = D.query(folder, **kwargs)
    assert (result['count'], len(result['records']), len(matched), warnings) == (count, shown, count, [])
    assert result['files'] == [os.path.join(folder, 'p.decisions.jsonl')] and result['folder'] == folder
    assert result['changed'] is False and result['problems'] == []
