"""Writing the proxy's include in place: same inode, refusals, failure fallback."""
import os

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import files as _files


def test_inode_preserved(tmp_path):
    target = tmp_path / 'model-endpoints.conf'
    target.write_text('old content that is longer than the new one\n')
    inode = os.stat(target).st_ino
    result = _files.write_in_place(str(target), 'new\n')
    assert result['changed'] is True
    assert result['inode'] == inode == os.stat(target).st_ino
    assert target.read_text() == 'new\n'


def test_open_reader_sees_new_content(tmp_path):
    target = tmp_path / 'f.conf'
    target.write_text('a\n')
    with open(target) as reader:  # like a bind mount: holds the inode
        _files.write_in_place(str(target), 'b\n')
        reader.seek(0)
        assert reader.read() == 'b\n'


def test_unchanged_not_written(tmp_path):
    target = tmp_path / 'f.conf'
    target.write_text('same\n')
    mtime = os.stat(target).st_mtime_ns
    assert _files.write_in_place(str(target), 'same\n')['changed'] is False
    assert os.stat(target).st_mtime_ns == mtime


def test_mode_kept(tmp_path):
    target = tmp_path / 'f.conf'
    target.write_text('a')
    os.chmod(target, 0o640)
    _files.write_in_place(str(target), b'bytes too')
    assert os.stat(target).st_mode & 0o777 == 0o640
    assert target.read_bytes() == b'bytes too'


def test_missing_refused(tmp_path):
    with pytest.raises(_files.InPlaceError, match='does not exist'):
        _files.write_in_place(str(tmp_path / 'nope.conf'), 'x')
    assert not (tmp_path / 'nope.conf').exists()


def test_symlink_refused(tmp_path):
    real = tmp_path / 'real.conf'
    real.write_text('keep')
    link = tmp_path / 'link.conf'
    link.symlink_to(real)
    with pytest.raises(_files.InPlaceError, match='symlink'):
        _files.write_in_place(str(link), 'x')
    assert real.read_text() == 'keep'


def test_dangling_symlink_refused(tmp_path):
    link = tmp_path / 'link.conf'
    link.symlink_to(tmp_path / 'gone')
    with pytest.raises(_files.InPlaceError, match='symlink'):
        _files.write_in_place(str(link), 'x')


def test_directory_refused(tmp_path):
    (tmp_path / 'd.conf').mkdir()
    with pytest.raises(_files.InPlaceError, match='directory'):
        _files.write_in_place(str(tmp_path / 'd.conf'), 'x')


def test_fifo_refused(tmp_path):
    fifo = tmp_path / 'p.conf'
    os.mkfifo(fifo)
    with pytest.raises(_files.InPlaceError, match='not a regular file'):
        _files.write_in_place(str(fifo), 'x')


def test_hard_link_refused(tmp_path):
    target = tmp_path / 'f.conf'
    target.write_text('keep')
    os.link(target, tmp_path / 'other.conf')
    with pytest.raises(_files.InPlaceError, match='hard links'):
        _files.write_in_place(str(target), 'x')
    assert target.read_text() == 'keep'


def test_read_refuses_the_same(tmp_path):
    link = tmp_path / 'l'
    link.symlink_to(tmp_path)
    with pytest.raises(_files.InPlaceError):
        _files.read(str(link))


def _failing_writes(monkeypatch, failures, partial=False):
    """The first ``failures`` content writes fail (ENOSPC; the first after writing 5 bytes when ``partial``)."""
    real = _files._write_all
    calls = []

    def failing(fd, data):
        calls.append(data)
        if len(calls) <= failures:
            if partial and len(calls) == 1:
                os.write(fd, data[:5])
            raise OSError(28, 'No space left on device')
        return real(fd, data)

    monkeypatch.setattr(_files, '_write_all', failing)
    return calls


def test_a_failed_write_puts_the_previous_content_back(tmp_path, monkeypatch):
    target = tmp_path / 'f.conf'
    target.write_text('# old\nacl m1 port 1\n')
    inode = os.stat(target).st_ino
    calls = _failing_writes(monkeypatch, 1, partial=True)
    with pytest.raises(_files.InPlaceError) as info:
        _files.write_in_place(str(target), '# header\nacl x port 1\nacl y port 2\n', fallback='# header\n')
    assert info.value.fallback_written is False
    assert 'No space left' in str(info.value) and 'previous content was written back' in str(info.value)
    assert target.read_text() == '# old\nacl m1 port 1\n'           # the last good file, not the fallback
    assert os.stat(target).st_ino == inode and len(calls) == 2


def test_the_fallback_only_when_the_previous_content_cannot_go_back(tmp_path, monkeypatch):
    target = tmp_path / 'f.conf'
    target.write_text('# old\n')
    _failing_writes(monkeypatch, 2)
    with pytest.raises(_files.InPlaceError) as info:
        _files.write_in_place(str(target), 'new', fallback='# header\n')
    assert info.value.fallback_written is True and target.read_text() == '# header\n'


@pytest.mark.parametrize('fallback', [None, '# h\n'])
def test_every_write_failing_is_reported_as_maybe_partial(tmp_path, monkeypatch, fallback):
    target = tmp_path / 'f.conf'
    target.write_text('# old\n')
    _failing_writes(monkeypatch, 3)
    with pytest.raises(_files.InPlaceError) as info:
        _files.write_in_place(str(target), 'new', fallback=fallback)
    assert info.value.fallback_written is False
    assert 'may be partial' in str(info.value) and 'do not reload' in str(info.value)


def test_no_room_for_the_new_content_refuses_before_the_file_is_touched(tmp_path, monkeypatch):
    target = tmp_path / 'f.conf'
    target.write_text('# old\n')
    monkeypatch.setattr(_files, '_no_room_for', lambda path, size: OSError(28, 'No space left on device'))
    calls = _failing_writes(monkeypatch, 0)
    with pytest.raises(_files.InPlaceError) as info:
        _files.write_in_place(str(target), '# a longer content than before\n')
    assert 'before it was touched' in str(info.value) and 'still holds its previous content' in str(info.value)
    assert target.read_text() == '# old\n' and calls == []
    assert sorted(os.listdir(str(tmp_path))) == ['f.conf']


def test_the_probe_leaves_nothing_behind(tmp_path):
    target = tmp_path / 'f.conf'
    target.write_text('x')
    assert _files._no_room_for(str(target), 200000) is None
    assert os.listdir(str(tmp_path)) == ['f.conf']


@pytest.mark.parametrize('err, euid, words', [
    (30, 0, 'mounted read-only'),
    (30, 1000, 'mounted read-only'),
    (13, 1000, 'become: true'),
    (1, 0, 'lsattr'),
])
def test_why_a_file_cannot_be_opened(monkeypatch, err, euid, words):
    monkeypatch.setattr(os, 'geteuid', lambda: euid)
    text = _files._cannot_open('/d/model-endpoints.conf', OSError(err, os.strerror(err)))
    assert words in text and '/d/model-endpoints.conf' in text and 'Nothing was written' in text
    if err == 30 or euid == 0:
        assert 'become' not in text
