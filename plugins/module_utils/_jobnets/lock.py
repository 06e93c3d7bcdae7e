# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""Job networks: one lock per daemon, shared by every creator on this host.

A create picks a subnet and a member of the proxy family from what it knows, then asks the daemon.
Two processes that pick at the same moment pick the same: the same lowest free subnet (the daemon
refuses all but one as overlapping) and the same shard with room (both attach, and it carries one
more than its bound). So the pick and the calls that make it true (create the network, start a
shard, attach) run under :func:`held`, an exclusive ``flock(2)`` on a file named after the daemon.

Why ``flock``: the kernel drops it when the holder's file is closed, which a process that dies in
any way (SIGKILL included) does, so a dead creator never leaves it held and nobody has to judge
whether a holder is stale. What a creator killed inside it leaves behind is a labelled job network
without its job container, or a shard without job networks: both are what the sweep
(``job_network_gc``, ``playbooks/gc.yml``) collects.

The file also carries a generation number that every holder that changed the daemon raises. A
client whose memory (the subnet book, the family picture) is of an older generation reads the
daemon again before it picks, so creators in different processes never pick from a stale picture
of each other's work.

Scope: this host. Creators on different hosts that share one remote daemon do not share the lock:
their subnets still never collide (the daemon refuses an overlap; a pick after a refusal starts at
a random place in the pool, so they spread instead of racing for the same few), but the shard bound
can be passed by the number of such hosts racing at once. docs/job-network-api.md says so.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import stat
import tempfile
import threading
import time
from typing import Any, Callable, Dict, Iterator, Mapping, Optional

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common.docker_client import EngineError

# Where the lock files live: PI_EGRESS_LOCK_DIR, else the first of these that is a writable folder.
# /run/lock is world-writable and sticky on Debian, so a root dispatcher and one in the docker group
# share the same file.
LOCK_DIR_ENV = 'PI_EGRESS_LOCK_DIR'
LOCK_DIRS = ('/run/lock', '/var/lock')
LOCK_PREFIX = 'pi-dispatch-egress-jobnet-'
# How long a creator waits for the lock (seconds) before it gives up, retryably. A holder that
# starts a shard holds it until the shard is healthy (at most _shard_clone.WAIT_HEALTHY, 60 s).
LOCK_WAIT = 180.0
_POLL_MAX = 0.05

_THREAD_LOCK = threading.RLock()


class LockTimeout(EngineError):
    """The lock was not free within the wait: another creator holds it (retryable)."""

    def __init__(self, message: str) -> None:
        super(LockTimeout, self).__init__(message, retryable=True)


def daemon_key(client: Any) -> str:
    """Text naming the daemon ``client`` talks to, the same for every client of it on this host.

    A local socket is named by its device and inode (two paths to one socket are one daemon);
    anything else by its URL.
    """
    api = getattr(client, 'api', client)
    adapter = getattr(api, '_custom_adapter', None)
    socket_path = getattr(adapter, 'socket_path', None)
    if socket_path:
        try:
            st = os.stat(socket_path)
            return 'unix:%d:%d' % (st.st_dev, st.st_ino)
        except OSError:
            return 'unix:' + os.path.realpath(socket_path)
    ssh_host = getattr(adapter, 'ssh_host', None)
    if ssh_host:
        return 'ssh:%s' % ssh_host
    return 'url:%s' % (getattr(api, 'base_url', None) or 'unknown')


def lock_dir(environ: Optional[Mapping[str, str]] = None) -> str:
    """The folder of the lock files (see LOCK_DIR_ENV, LOCK_DIRS); the system's temporary folder last."""
    environ = os.environ if environ is None else environ
    chosen = environ.get(LOCK_DIR_ENV)
    if chosen:
        return chosen
    for candidate in LOCK_DIRS:
        if os.path.isdir(candidate) and os.access(candidate, os.W_OK | os.X_OK):
            return candidate
    return tempfile.gettempdir()


def lock_path(key: str, directory: Optional[str] = None) -> str:
    digest = hashlib.sha256(key.encode('utf-8')).hexdigest()[:16]
    return os.path.join(directory or lock_dir(), '%s%s.lock' % (LOCK_PREFIX, digest))


def _open(path: str) -> int:
    """An fd of the lock file (created 0666 when missing); a symlink or a non-file is refused."""
    flags = os.O_RDWR | os.O_CREAT | getattr(os, 'O_NOFOLLOW', 0) | getattr(os, 'O_CLOEXEC', 0)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise EngineError('The job-network lock %s is a symlink; refused. Remove it (rm %s) and retry.'
                              % (path, path))
        if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise EngineError('Cannot open the job-network lock %s: %s. Set %s to a folder this account may '
                              'write, the same for every dispatcher on the host.' % (path, exc, LOCK_DIR_ENV))
        # Made by another account with its umask: a lock works on a read-only descriptor too.
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, 'O_NOFOLLOW', 0) | getattr(os, 'O_CLOEXEC', 0))
        except OSError as exc2:
            raise EngineError('Cannot open the job-network lock %s: %s. Set %s to a folder every dispatcher '
                              'on the host may write.' % (path, exc2, LOCK_DIR_ENV))
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise EngineError('The job-network lock %s is not a regular file; move it away and retry.' % path)
    if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != 0o666:
        try:
            os.fchmod(fd, 0o666)  # every dispatcher account on the host takes the same lock
        except OSError:
            pass
    return fd


def _read_state(fd: int) -> Dict[str, Any]:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        data = json.loads(os.read(fd, 4096).decode('utf-8') or '{}')
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_state(fd: int, state: Dict[str, Any]) -> None:
    data = json.dumps(state, sort_keys=True).encode('utf-8')
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, data)
        os.ftruncate(fd, len(data))
    except OSError:
        pass  # a read-only descriptor (another account's file): the generation is not raised


def forget_daemon(memo: Dict[Any, Any]) -> None:
    """Drop what a client remembers of its daemon's networks and proxy families (read again next)."""
    for key in list(memo):
        if key == 'subnets' or (isinstance(key, tuple) and key and key[0] == 'family'):
            memo.pop(key, None)


class Held(object):
    """What the holder knows: the ``generation`` it found and whether the client's memory was of it
    (``fresh``; when not, that memory is dropped here, so the holder reads the daemon again), and
    :meth:`changed` to raise it when the holder changed the daemon."""

    def __init__(self, fd: int, path: str, state: Dict[str, Any], memo: Optional[Dict[Any, Any]]) -> None:
        self.fd = fd
        self.path = path
        self.state = state
        found = state.get('generation')
        self.generation = found if isinstance(found, int) and not isinstance(found, bool) and found >= 0 else 0
        self.memo = memo
        self.fresh = memo is not None and memo.get('lock-generation') == self.generation
        if memo is not None and not self.fresh:
            forget_daemon(memo)
        self._changed = False

    def changed(self) -> None:
        self._changed = True

    def close(self) -> None:
        if self._changed:
            self.generation += 1
            _write_state(self.fd, dict(generation=self.generation, pid=os.getpid(), at=int(time.time())))
        if self.memo is not None:
            self.memo['lock-generation'] = self.generation


@contextlib.contextmanager
def held(client: Any, memo: Optional[Dict[Any, Any]] = None, wait: float = LOCK_WAIT, directory: Optional[str] = None,
         clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> Iterator[Held]:
    """Hold the daemon's job-network lock for the ``with`` block; yields a :class:`Held`.

    ``memo`` (``_jobnet_engine.client_memo``) learns the generation; when it was behind, what it
    remembers of the daemon is dropped first, so the block reads the daemon again. Raises
    LockTimeout (retryable) after ``wait`` seconds, EngineError when the lock file cannot be used.
    Threads of one process take it in turn.
    """
    path = lock_path(daemon_key(client), directory)
    with _THREAD_LOCK:
        fd = _open(path)
        try:
            deadline = clock() + wait
            pause = 0.002
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                        raise EngineError('Locking %s failed: %s.' % (path, exc))
                if clock() >= deadline:
                    holder = _read_state(fd).get('pid')
                    raise LockTimeout(
                        'Another creator held the job-network lock %s for more than %ds (last holder pid %s). '
                        'Nothing was created. Retry; if it stays held, see which process has it open '
                        '(fuser %s).' % (path, wait, holder or 'unknown', path))
                sleep(pause)
                pause = min(pause * 2, _POLL_MAX)
            state = _read_state(fd)
            token = Held(fd, path, state, memo)
            try:
                yield token
            finally:
                token.close()
        finally:
            os.close(fd)  # closing the descriptor drops the lock
