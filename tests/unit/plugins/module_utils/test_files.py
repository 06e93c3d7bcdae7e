"""Writing the proxy's include in place: same inode, refusals, failure fallback."""
import os

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils import _files


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


def test_failed_write_leaves_fallback(tmp_path, monkeypatch):
    target = tmp_path / 'f.conf'
    target.write_text('# old\n')
    inode = os.stat(target).st_ino
    real = _files._write_all
    calls = []

    def failing(fd, data):
        calls.append(data)
        if len(calls) == 1:
            os.write(fd, data[:5])  # a partial write, then the disk fills up
            raise OSError(28, 'No space left on device')
        return real(fd, data)

    monkeypatch.setattr(_files, '_write_all', failing)
    with pytest.raises(_files.InPlaceError) as info:
        _files.write_in_place(str(target), '# header\nacl x port 1\n', fallback='# header\n')
    assert info.value.fallback_written is True
    assert 'No space left' in str(info.value)
    assert target.read_text() == '# header\n'
    assert os.stat(target).st_ino == inode


def test_failed_write_default_fallback_is_empty(tmp_path, monkeypatch):
    target = tmp_path / 'f.conf'
    target.write_text('# old\n')
    real = _files._write_all
    state = {'n': 0}

    def failing(fd, data):
        state['n'] += 1
        if state['n'] == 1:
            raise OSError(5, 'Input/output error')
        return real(fd, data)

    monkeypatch.setattr(_files, '_write_all', failing)
    with pytest.raises(_files.InPlaceError):
        _files.write_in_place(str(target), 'new')
    assert target.read_bytes() == b''


def test_fallback_failing_too_is_reported(tmp_path, monkeypatch):
    target = tmp_path / 'f.conf'
    target.write_text('# old\n')

    def failing(fd, data):
        raise OSError(5, 'Input/output error')

    monkeypatch.setattr(_files, '_write_all', failing)
    with pytest.raises(_files.InPlaceError) as info:
        _files.write_in_place(str(target), 'new', fallback='# h\n')
    assert info.value.fallback_written is False
    assert 'may be partial' in str(info.value)
