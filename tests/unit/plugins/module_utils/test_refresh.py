"""The rules refresh: backup naming, collisions, refusals, the write, the rollback, the decision table."""

import datetime
import os
import stat

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import refresh as _refresh
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import rules as _rules

NOW = datetime.datetime(2026, 12, 3, 8, 20, 5, tzinfo=datetime.timezone.utc)
TS = '20261203T082005Z'
OLD_RULES = 'http_port 3128\nhttp_access deny all\n'


@pytest.fixture
def folder(tmp_path):
    deploy = tmp_path / 'egress'
    (deploy / 'deploy').mkdir(parents=True)
    rules = deploy / 'deploy' / 'egress-proxy.conf'
    rules.write_text(OLD_RULES)
    os.chmod(str(rules), 0o640)
    return deploy


def listing(folder):
    return sorted(os.listdir(str(folder / 'deploy')))


# --- naming ----------------------------------------------------------------------
@pytest.mark.parametrize('now, expected', [
    (NOW, TS),
    (datetime.datetime(2026, 1, 2, 3, 4, 5), '20260102T030405Z'),  # naive is taken as UTC
    (datetime.datetime(2026, 12, 3, 9, 20, 5, tzinfo=datetime.timezone(datetime.timedelta(hours=1))), TS),
])
def test_timestamp_is_utc(now, expected):
    assert _refresh.timestamp(now) == expected


@pytest.mark.parametrize('taken, expected', [
    ([], '/d/f.bak-' + TS),
    (['/d/f.bak-' + TS], '/d/f.bak-' + TS + '.1'),
    (['/d/f.bak-' + TS, '/d/f.bak-' + TS + '.1'], '/d/f.bak-' + TS + '.2'),
    (['/d/f.bak-' + TS + '.1'], '/d/f.bak-' + TS),  # a free base name is used first
])
def test_backup_name_and_collisions(taken, expected):
    assert _refresh.backup_name('/d/f', NOW, exists=lambda p: p in taken) == expected


def test_backup_name_gives_up_after_999():
    with pytest.raises(_refresh.RefreshError, match='taken'):
        _refresh.backup_name('/d/f', NOW, exists=lambda p: True)


def test_default_backup_name_matches_the_contract(folder):
    name = _refresh.backup_name(str(folder / 'deploy' / 'egress-proxy.conf'))
    base = os.path.basename(name)
    assert base.startswith('egress-proxy.conf.bak-') and base.endswith('Z') and len(base) == len(
        'egress-proxy.conf.bak-' + TS)


# --- comparison --------------------------------------------------------------------
def test_compare_names_both_files_in_the_diff(folder):
    result = _refresh.compare(str(folder))
    assert result['differs'] is True
    assert result['diff'].startswith('--- %s\n+++ %s\n' % (result['path'], _refresh.PACKAGED_NAME))
    assert '+include /etc/pi-dispatch/model-endpoints.conf' in result['diff']
    assert not result['current_includes_endpoints'] and result['packaged_includes_endpoints']


def test_compare_same_copy_has_no_diff(folder):
    (folder / 'deploy' / 'egress-proxy.conf').write_text(_rules.packaged_rules())
    result = _refresh.compare(str(folder))
    assert result['differs'] is False and result['diff'] == ''


# --- refusals: nothing written -----------------------------------------------------
def _symlinked_deploy(folder):
    real = folder / 'real-deploy'
    os.rename(str(folder / 'deploy'), str(real))
    os.symlink(str(real), str(folder / 'deploy'))


def _symlinked_file(folder):
    rules = folder / 'deploy' / 'egress-proxy.conf'
    os.rename(str(rules), str(folder / 'elsewhere.conf'))
    os.symlink(str(folder / 'elsewhere.conf'), str(rules))


def _directory_file(folder):
    rules = folder / 'deploy' / 'egress-proxy.conf'
    rules.unlink()
    rules.mkdir()


def _fifo_file(folder):
    rules = folder / 'deploy' / 'egress-proxy.conf'
    rules.unlink()
    os.mkfifo(str(rules))


def _missing_file(folder):
    (folder / 'deploy' / 'egress-proxy.conf').unlink()


@pytest.mark.parametrize('breaker, message', [
    (_symlinked_deploy, 'rules folder .* is a symlink'),
    (_symlinked_file, 'rules file .* is a symlink'),
    (_directory_file, 'not a regular file'),
    (_fifo_file, 'not a regular file'),
    (_missing_file, 'does not exist'),
])
@pytest.mark.parametrize('call', ['compare', 'plan_refresh', 'refresh'])
def test_refusals_write_nothing(folder, breaker, message, call):
    breaker(folder)
    before = sorted(os.listdir(str(folder))), sorted(os.listdir(os.path.realpath(str(folder / 'deploy'))))
    with pytest.raises(_refresh.RefreshError, match=message):
        getattr(_refresh, call)(str(folder))
    after = sorted(os.listdir(str(folder))), sorted(os.listdir(os.path.realpath(str(folder / 'deploy'))))
    assert before == after


def test_relative_deploy_dir_is_refused():
    with pytest.raises(_refresh.RefreshError, match='absolute'):
        _refresh.compare('relative/egress')


# --- the refresh --------------------------------------------------------------------
def test_plan_refresh_names_the_backup_and_writes_nothing(folder):
    result = _refresh.plan_refresh(str(folder), now=NOW)
    assert result['backup'] == str(folder / 'deploy' / ('egress-proxy.conf.bak-' + TS))
    assert listing(folder) == ['egress-proxy.conf']
    assert (folder / 'deploy' / 'egress-proxy.conf').read_text() == OLD_RULES


def test_refresh_keeps_a_backup_and_writes_the_packaged_copy(folder):
    rules = folder / 'deploy' / 'egress-proxy.conf'
    result = _refresh.refresh(str(folder), now=NOW)
    assert result['changed'] is True
    assert result['backup'] == str(folder / 'deploy' / ('egress-proxy.conf.bak-' + TS))
    assert open(result['backup']).read() == OLD_RULES
    assert rules.read_text() == _rules.packaged_rules()
    assert stat.S_IMODE(os.stat(str(rules)).st_mode) == 0o640  # mode kept
    assert stat.S_IMODE(os.stat(result['backup']).st_mode) == 0o640
    assert listing(folder) == ['egress-proxy.conf', 'egress-proxy.conf.bak-' + TS]  # no temp file left


def test_refresh_is_a_rename_not_an_in_place_write(folder):
    rules = folder / 'deploy' / 'egress-proxy.conf'
    inode = os.stat(str(rules)).st_ino
    _refresh.refresh(str(folder), now=NOW)
    assert os.stat(str(rules)).st_ino != inode


def test_second_refresh_changes_nothing(folder):
    _refresh.refresh(str(folder), now=NOW)
    again = _refresh.refresh(str(folder), now=NOW)
    assert again['changed'] is False and again['backup'] is None
    assert len(listing(folder)) == 2


def test_refresh_never_overwrites_an_existing_backup(folder):
    taken = folder / 'deploy' / ('egress-proxy.conf.bak-' + TS)
    taken.write_text('an older backup\n')
    result = _refresh.refresh(str(folder), now=NOW)
    assert result['backup'] == str(taken) + '.1'
    assert taken.read_text() == 'an older backup\n'
    assert open(result['backup']).read() == OLD_RULES


def test_refresh_from_another_source(folder):
    result = _refresh.refresh(str(folder), packaged='http_port 3128\n', now=NOW, packaged_name='/x/staged.conf')
    assert '+++ /x/staged.conf' in result['diff']
    assert (folder / 'deploy' / 'egress-proxy.conf').read_text() == 'http_port 3128\n'


# --- the rollback ---------------------------------------------------------------------
def test_restore_puts_the_backup_back(folder):
    rules = folder / 'deploy' / 'egress-proxy.conf'
    done = _refresh.refresh(str(folder), now=NOW)
    planned = _refresh.restore(str(folder), done['backup'], check_mode=True)
    assert planned['changed'] is True and rules.read_text() == _rules.packaged_rules()
    restored = _refresh.restore(str(folder), done['backup'])
    assert restored['changed'] is True
    assert rules.read_text() == OLD_RULES
    assert stat.S_IMODE(os.stat(str(rules)).st_mode) == 0o640
    assert os.path.isfile(done['backup'])  # the backup stays
    assert _refresh.restore(str(folder), done['backup'])['changed'] is False


@pytest.mark.parametrize('name', ['../elsewhere.conf', 'egress-proxy.conf', 'other.conf.bak-' + TS])
def test_restore_refuses_what_is_not_a_backup(folder, name):
    with pytest.raises(_refresh.RefreshError, match='not a backup'):
        _refresh.restore(str(folder), str(folder / 'deploy' / name))
    assert (folder / 'deploy' / 'egress-proxy.conf').read_text() == OLD_RULES


def test_restore_refuses_a_missing_backup(folder):
    with pytest.raises(_refresh.RefreshError, match='missing'):
        _refresh.restore(str(folder), str(folder / 'deploy' / ('egress-proxy.conf.bak-' + TS)))


# --- proxy facts -------------------------------------------------------------------------
def _obs(running=True, paused=False, mounts=3, jobs=0):
    dests = [_rules.CONTAINER_RULES, _rules.CONTAINER_ALLOWLIST, _rules.CONTAINER_ENDPOINTS][:mounts]
    return dict(running=running, paused=paused, mounts=[dict(destination=d) for d in dests],
                job_networks=['pi-job-%d-net' % i for i in range(jobs)])


@pytest.mark.parametrize('obs, expected', [
    (None, ('missing', False, 0)),
    (_obs(), ('running', False, 0)),
    (_obs(paused=True, jobs=2), ('paused', False, 2)),
    (_obs(running=False), ('stopped', False, 0)),
    (_obs(mounts=2, jobs=1), ('running', True, 1)),
])
def test_proxy_facts(obs, expected):
    assert _refresh.proxy_facts(obs) == expected


# --- the decision table ---------------------------------------------------------------------
# (state, two_mount, differs, refresh, jobs, allow_cut_jobs, allow_replace) -> (action, proxy_state, write, jobs_cut)
TABLE = [
    # nothing differs: nothing to do, except a missing proxy is created
    ('running', False, False, False, 0, False, False, 'none', None, False, 0),
    ('running', False, False, True, 3, False, False, 'none', None, False, 0),
    ('paused', False, False, True, 0, False, False, 'none', None, False, 0),
    ('stopped', False, False, True, 0, False, False, 'none', None, False, 0),
    ('missing', False, False, False, 0, False, False, 'create', 'started', False, 0),
    ('missing', False, False, True, 0, False, False, 'create', 'started', False, 0),
    # differs, refresh not asked: a warning; the proxy is left alone (a missing one is created)
    ('running', False, True, False, 0, False, False, 'warn-differs', None, False, 0),
    ('paused', False, True, False, 2, False, False, 'warn-differs', None, False, 0),
    ('stopped', False, True, False, 0, False, False, 'warn-differs', None, False, 0),
    ('missing', False, True, False, 0, False, False, 'warn-differs+create', 'started', False, 0),
    ('running', True, True, False, 0, False, False, 'warn-differs', None, False, 0),
    ('stopped', True, True, False, 0, False, False, 'warn-differs', None, False, 0),
    # differs, refresh asked, three-mount proxy
    ('running', False, True, True, 0, False, False, 'refresh+restart', 'restarted', True, 0),
    ('running', False, True, True, 2, False, False, 'refuse-needs-consent', None, False, 2),
    ('running', False, True, True, 2, True, False, 'refresh+restart', 'restarted', True, 2),
    ('paused', False, True, True, 0, False, False, 'refresh+unpause+restart', 'restarted', True, 0),
    ('paused', False, True, True, 1, False, False, 'refuse-needs-consent', None, False, 1),
    ('paused', False, True, True, 1, True, False, 'refresh+unpause+restart', 'restarted', True, 1),
    ('stopped', False, True, True, 0, False, False, 'refresh+start', 'started', True, 0),
    ('stopped', False, True, True, 4, False, False, 'refresh+start', 'started', True, 0),  # nothing live to cut
    ('missing', False, True, True, 0, False, False, 'refresh+create', 'started', True, 0),
    ('missing', True, True, True, 0, False, False, 'refresh+create', 'started', True, 0),  # no shape when missing
    # differs, refresh asked, two-mount proxy: refresh and replace as one step, with consent
    ('running', True, True, True, 0, False, False, 'refuse-needs-consent', None, False, 0),
    ('running', True, True, True, 0, False, True, 'refresh+replace', 'started', True, 0),
    ('running', True, True, True, 2, False, True, 'refuse-needs-consent', None, False, 2),
    ('running', True, True, True, 2, True, False, 'refuse-needs-consent', None, False, 2),
    ('running', True, True, True, 2, True, True, 'refresh+replace', 'started', True, 2),
    ('paused', True, True, True, 0, False, False, 'refuse-needs-consent', None, False, 0),
    ('paused', True, True, True, 1, True, True, 'refresh+replace', 'started', True, 1),
    ('stopped', True, True, True, 0, False, False, 'refuse-needs-consent', None, False, 0),
    ('stopped', True, True, True, 3, False, True, 'refresh+replace', 'started', True, 0),
]


@pytest.mark.parametrize('state, two_mount, differs, refresh, jobs, cut, replace, action, proxy_state, write, '
                         'jobs_cut', TABLE)
def test_decision_table(state, two_mount, differs, refresh, jobs, cut, replace, action, proxy_state, write, jobs_cut):
    got = _refresh.decide(state, two_mount, differs, refresh, jobs=jobs, allow_cut_jobs=cut, allow_replace=replace)
    assert (got['action'], got['proxy_state'], got['write'], got['jobs_cut']) == (action, proxy_state, write, jobs_cut)
    assert got['refuse'] == (action == 'refuse-needs-consent')
    assert got['mount_endpoints_before'] == (not two_mount or state == 'missing')


def test_every_state_and_flag_combination_is_decided():
    seen = set()
    for state in _refresh.PROXY_STATES:
        for two_mount in (False, True):
            for differs in (False, True):
                for refresh in (False, True):
                    for jobs in (0, 2):
                        for cut in (False, True):
                            for replace in (False, True):
                                got = _refresh.decide(state, two_mount, differs, refresh, jobs, cut, replace)
                                seen.add(got['action'])
                                if got['refuse']:
                                    assert got['write'] is False and got['proxy_state'] is None
                                if got['write']:
                                    assert differs and refresh and got['proxy_state']
    assert seen == {'none', 'create', 'warn-differs', 'warn-differs+create', 'refresh+restart',
                    'refresh+unpause+restart', 'refresh+start', 'refresh+create', 'refresh+replace',
                    'refuse-needs-consent'}


def test_refusal_says_how_many_jobs_and_which_consent():
    got = _refresh.decide('running', False, True, True, jobs=3)
    assert '3 jobs' in got['message'] and 'egress_upgrade_allow_cut_jobs' in got['message']
    assert 'nothing written' in got['message']
    got = _refresh.decide('running', True, True, True, jobs=1)
    assert 'egress_upgrade_allow_replace' in got['message'] and '1 job ' in got['message']


@pytest.mark.parametrize('refresh, replace, action, proxy_state', [
    (False, False, 'warn-needs-replace', None),
    (True, False, 'refuse-needs-consent', None),
    (True, True, 'replace', 'started'),
])
def test_two_mount_proxy_with_new_rules_already_in_the_folder(refresh, replace, action, proxy_state):
    got = _refresh.decide('running', True, False, refresh, allow_replace=replace, current_includes_endpoints=True)
    assert (got['action'], got['proxy_state'], got['write']) == (action, proxy_state, False)


def test_unknown_state_is_a_bug():
    with pytest.raises(ValueError):
        _refresh.decide('restarting', False, True, True)


def test_a_backup_that_cannot_be_written_whole_is_not_left(folder, monkeypatch):
    real_fdopen = os.fdopen

    class _Full(object):
        def __init__(self, handle):
            self.handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def write(self, data):
            self.handle.write(data[:3])
            self.handle.flush()
            raise OSError(28, 'No space left on device')

    monkeypatch.setattr(os, 'fdopen', lambda fd, mode='r': _Full(real_fdopen(fd, mode)))
    with pytest.raises(_refresh.RefreshError) as caught:
        _refresh.refresh(str(folder), now=NOW)
    text = str(caught.value)
    assert 'No space left' in text and 'partial backup was removed' in text and 'was not touched' in text
    assert listing(folder) == ['egress-proxy.conf']
    assert (folder / 'deploy' / 'egress-proxy.conf').read_text() == OLD_RULES


def test_a_failed_rules_write_takes_its_backup_away_again(folder, monkeypatch):
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import files as _files

    def full(path, content, like=None):
        raise OSError(28, 'No space left on device')

    monkeypatch.setattr(_files, 'write_atomic', full)
    with pytest.raises(_refresh.RefreshError) as caught:
        _refresh.refresh(str(folder), now=NOW)
    assert 'The file is unchanged' in str(caught.value) and 'removed again' in str(caught.value)
    assert listing(folder) == ['egress-proxy.conf']


def test_read_source_is_the_packaged_copy_or_a_regular_file(tmp_path):
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import refresh as R
    assert R.read_source(None) == (None, R.PACKAGED_NAME)
    good = tmp_path / 'rules.conf'
    good.write_text('http_access deny all\n')
    assert R.read_source(str(good)) == ('http_access deny all\n', str(good))
    link = tmp_path / 'link.conf'
    link.symlink_to(good)
    for bad in (str(link), str(tmp_path / 'missing.conf'), str(tmp_path)):
        with pytest.raises(R.RefreshError) as info:
            R.read_source(bad)
        assert 'missing, a symlink or not a regular file' in str(info.value) and bad in str(info.value)
