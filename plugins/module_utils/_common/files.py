# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The three ways the collection writes a file of the deployment folder, and their guards.

* :func:`create_exclusive`: create-only (the layout): a file that exists always wins.
* :func:`write_in_place`: same inode, never a rename (the includes squid reads
  through a single-file bind mount).
* :func:`write_atomic`: temporary file, fsync, rename (the rules file, which is
  refreshed only with a backup, and read by a restarted or recreated proxy).

Write in place
--------------

A file the running proxy reads through a single-file bind mount must keep
its inode: the mount pins the inode, so a file replaced by rename (what an
atomic write or an editor's save does) leaves squid reading the old one
for as long as the container lives. So :func:`write_in_place` opens the
existing file, truncates it, writes, and fsyncs.

It refuses a missing file (it never creates one: the deployment layout
does, before the proxy mounts it), a symlink, a directory or anything that
is not a regular file, and a file with other hard links (writing it would
change the other names too). It keeps the last good content: a probe beside
the file checks the new content fits before the file is touched, and a write
that fails half-way is undone by writing the previous content back, so a
later reload (any site.yml) never reads a partial or emptied file.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from typing import Any, Dict, NoReturn, Optional, Union


class WriteError(Exception):
    """A write of the deployment folder was refused or failed; the message says what to do."""


class InPlaceError(WriteError):
    """The file was refused or the write failed; the message says what to do."""

    def __init__(self, message: str, fallback_written: bool = False) -> None:
        super(InPlaceError, self).__init__(message)
        self.fallback_written = fallback_written


def _to_bytes(content: Union[str, bytes]) -> bytes:
    if isinstance(content, bytes):
        return content
    return content.encode('utf-8')


def check_target(path: str) -> os.stat_result:
    """lstat ``path`` and refuse anything but a single-linked regular file. Returns the stat."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise InPlaceError('%s does not exist. It is written in place and never created here: lay out the '
                           'deployment folder first (pi_dispatch.egress.egress_deployment), which creates '
                           'it before the proxy mounts it.' % path)
    except OSError as exc:
        raise InPlaceError('Cannot inspect %s: %s' % (path, exc))
    if stat.S_ISLNK(st.st_mode):
        raise InPlaceError('%s is a symlink (to %s). The proxy mounts this file as a single file and it is '
                           'written in place, so a symlink is refused rather than followed: replace it with '
                           'the real file, then recreate the proxy.' % (path, os.readlink(path)))
    if stat.S_ISDIR(st.st_mode):
        raise InPlaceError('%s is a directory, not the file the proxy mounts. Move it away, lay out the '
                           'deployment folder again, then recreate the proxy.' % path)
    if not stat.S_ISREG(st.st_mode):
        raise InPlaceError('%s is not a regular file. Move it away, lay out the deployment folder again, '
                           'then recreate the proxy.' % path)
    if st.st_nlink > 1:
        raise InPlaceError('%s has %d hard links; writing it in place would change every other name too. '
                           'Remove the other links (find / -samefile %s), or copy the file to a fresh one '
                           'and recreate the proxy.' % (path, st.st_nlink, path))
    return st


def read(path: str) -> bytes:
    """Current bytes of ``path`` after the same refusals as a write."""
    check_target(path)
    with open(path, 'rb') as handle:
        return handle.read()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:  # pragma: no cover - os.write raises rather than returning 0 on a regular file
            raise OSError(errno.EIO, 'short write')
        view = view[written:]


def _replace_content(fd: int, data: bytes) -> None:
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    _write_all(fd, data)
    os.fsync(fd)


def _no_room_for(path: str, size: int) -> Optional[OSError]:
    """An OSError when ``size`` bytes cannot be written beside ``path`` now (a full or read-only file
    system), else None. The probe file is removed again either way."""
    try:
        fd, probe = tempfile.mkstemp(prefix='.%s.' % os.path.basename(path), suffix='.probe',
                                     dir=os.path.dirname(path))
    except OSError as exc:
        return exc
    try:
        block = b'\0' * min(size, 65536)
        left = size
        while left > 0:
            left -= os.write(fd, block[:left])
        os.fsync(fd)
        return None
    except OSError as exc:
        return exc
    finally:
        os.close(fd)
        os.unlink(probe)


def _cannot_open(path: str, exc: OSError) -> str:
    if exc.errno == errno.EROFS:
        return ('Cannot open %s for writing: the file system is mounted read-only (%s). Nothing was written. '
                'Remount it read-write (or move the deployment folder to a writable one), then run again.'
                % (path, exc))
    if os.geteuid() != 0:
        return ('Cannot open %s for writing: %s. Nothing was written. Run as an account that may write it '
                '(become: true).' % (path, exc))
    return ('Cannot open %s for writing although running as root: %s. Nothing was written. Check the file\'s '
            'attributes (lsattr %s: an immutable file refuses even root) and any security module, then run '
            'again.' % (path, exc, path))


def write_in_place(path: str, content: Union[str, bytes],
                   fallback: Optional[Union[str, bytes]] = None) -> Dict[str, Any]:
    """Replace the content of ``path`` keeping its inode. Returns a result dict.

    The file is never left partial and, as a rule, never left without the last good content:
    before the file is touched, a probe file beside it checks that the new content fits (a full or
    read-only file system refuses here, and nothing was written); should the write still fail
    half-way, the content the file had is written back. Only when that fails too is ``fallback``
    (str or bytes; default: the content the file had) written, and the error says so. The returned
    dict has ``path``, ``inode``, ``size`` and ``changed`` (False when the content was already the
    same and nothing was written). Raises :class:`InPlaceError`.
    """
    data = _to_bytes(content)
    st = check_target(path)
    flags = os.O_RDWR | getattr(os, 'O_NOFOLLOW', 0) | getattr(os, 'O_CLOEXEC', 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InPlaceError('%s became a symlink while being written; refused.' % path)
        raise InPlaceError(_cannot_open(path, exc))
    try:
        fst = os.fstat(fd)
        if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(fst.st_mode) \
                or fst.st_nlink > 1:
            raise InPlaceError('%s changed while being opened (another writer?); nothing was written. '
                               'Run again.' % path)
        current = _read_fd(fd)
        if current == data:
            return dict(path=path, inode=fst.st_ino, size=len(data), changed=False)
        no_room = _no_room_for(path, len(data)) if len(data) > len(current) else None
        if no_room is not None:
            raise InPlaceError('Writing %s failed before it was touched (%s). It still holds its previous '
                               'content. Free the disk (or fix the error), then run again.' % (path, no_room))
        try:
            _replace_content(fd, data)
        except OSError as exc:
            _restore(fd, path, exc, current, fallback)
        after = os.fstat(fd)
        return dict(path=path, inode=after.st_ino, size=len(data), changed=True)
    finally:
        os.close(fd)


def _restore(fd: int, path: str, exc: OSError, current: bytes, fallback: Optional[Union[str, bytes]]) -> NoReturn:
    """The write of ``path`` failed with ``exc``: put ``current`` back (else ``fallback``), then raise."""
    try:
        _replace_content(fd, current)
    except OSError as exc2:
        if fallback is None:
            raise InPlaceError('Writing %s failed (%s), and so did writing its previous content back (%s): the '
                               'file may be partial. Free the disk or fix the error, render again, and do not '
                               'reload the proxy until then.' % (path, exc, exc2))
        try:
            _replace_content(fd, _to_bytes(fallback))
        except OSError as exc3:
            raise InPlaceError('Writing %s failed (%s), and so did writing its previous content back (%s) and the '
                               'empty fallback (%s): the file may be partial. Free the disk or fix the error, '
                               'render again, and do not reload the proxy until then.' % (path, exc, exc2, exc3))
        raise InPlaceError('Writing %s failed (%s), and writing its previous content back failed too (%s). It '
                           'now holds the fallback (nothing declared), not a partial file. Fix the error and '
                           'render again.' % (path, exc, exc2), fallback_written=True)
    raise InPlaceError('Writing %s failed (%s). Its previous content was written back, so the proxy keeps what '
                       'it serves. Free the disk (or fix the error), then run again.' % (path, exc))


def _read_fd(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    return b''.join(chunks)


def _temp_beside(path: str, content: Union[str, bytes], mode: int, owner: Optional[os.stat_result] = None) -> str:
    """A temporary file in ``path``'s folder holding ``content`` (fsynced, ``mode``, ``owner``'s uid/gid)."""
    fd, tmp = tempfile.mkstemp(prefix='.%s.' % os.path.basename(path), suffix='.tmp', dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, 'w') as handle:
            handle.write(content)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            if owner is not None:
                keep_owner(handle.fileno(), owner)
            os.fsync(handle.fileno())
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def create_exclusive(path: str, content: Union[str, bytes], mode: int = 0o644) -> bool:
    """Create ``path`` with ``content`` unless it exists. True when created.

    Atomic and exclusive: the content goes to a temporary file beside the target, which is then
    hard-linked to the target name, so a concurrent writer or an existing file always wins and a
    reader never sees half a file. Raises WriteError when the link fails for another reason.
    """
    tmp = _temp_beside(path, content, mode)
    try:
        try:
            os.link(tmp, path)
        except OSError as exc:
            if os.path.lexists(path):
                return False
            raise WriteError('Creating %s failed: %s' % (path, exc))
        return True
    finally:
        os.unlink(tmp)


def fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def keep_owner(fd: int, st: os.stat_result) -> None:
    try:
        os.fchown(fd, st.st_uid, st.st_gid)
    except OSError:  # not root: the file stays ours, which is who wrote the original anyway
        pass


def write_atomic(path: str, content: Union[str, bytes], like: Optional[str] = None) -> None:
    """Write ``content`` to a temporary file beside ``path``, fsync, rename into place.

    The new file takes the mode and owner of ``like`` (default ``path`` itself) when it exists.
    """
    st = os.lstat(like or path) if os.path.lexists(like or path) else None
    tmp = _temp_beside(path, content, stat.S_IMODE(st.st_mode) if st is not None else 0o644, owner=st)
    try:
        os.rename(tmp, path)
        tmp = None
        fsync_dir(os.path.dirname(path))
    finally:
        if tmp is not None and os.path.lexists(tmp):
            os.unlink(tmp)
