# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The host side of a service account's API service: the collection's subreaper, the process table, the socket.

Where no systemd runs the account's ``podman.socket``, ``service_account`` starts ``podman system service``
as the account under :data:`SUBREAPER_SOURCE` and later knows it again by ``/proc`` alone
(:func:`proc_ours`, :func:`session_services`), never by a pid that may have been reused; :func:`ping` asks
the socket. :class:`Host` is everything a run asks of this host (the unit tests replace it with a fake).
"""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._podman import subids as _subids

SUBREAPER_MARK = 'pi-dispatch-egress subreaper'
PATH = '/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin'  # the only variable a started service inherits

# The subreaper, run as ``python3 -c SUBREAPER_SOURCE <command...>`` (also by tests/podman/subreaper.py, which
# reads it from this file). netavark starts aardvark-dns detached, so when aardvark-dns exits it is re-parented
# to the nearest subreaper, else to PID 1. Where PID 1 reaps late (a micro-VM's init, measured), the exited
# aardvark-dns stays a zombie; netavark finds its pid "alive" (kill -0 succeeds on a zombie), signals it instead
# of starting a new one, and name resolution on every Podman network stops. As a subreaper this program
# inherits those orphans and reaps them at once, as systemd does for podman.service. SIGTERM, SIGINT and SIGHUP
# are passed to the command; its exit status is this program's. Python 3.6 and later, standard library only.
SUBREAPER_SOURCE = r'''
# pi-dispatch-egress subreaper: run a command as a child subreaper, reaping every orphan it inherits.
import ctypes, errno, os, signal, subprocess, sys

def main(argv):
    if not argv:
        sys.stderr.write('usage: subreaper <command> [args...]\n')
        return 2
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
        sys.stderr.write('prctl(PR_SET_CHILD_SUBREAPER) failed: %s\n' % os.strerror(ctypes.get_errno()))
        return 1
    child = subprocess.Popen(argv)

    def forward(signum, _frame):
        child.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    status = 0
    while True:
        try:
            pid, raw = os.wait()
        except InterruptedError:
            continue
        except ChildProcessError:
            break
        if pid == child.pid:
            status = os.WEXITSTATUS(raw) if os.WIFEXITED(raw) else 128 + os.WTERMSIG(raw)
            break
    # The command ended: reap what has already exited; anything still running goes to PID 1.
    while True:
        try:
            pid, _raw = os.waitpid(-1, os.WNOHANG)
        except OSError as exc:
            if exc.errno == errno.ECHILD:
                break
            raise
        if pid == 0:
            break
    return status

sys.exit(main(sys.argv[1:]))
'''


def ping(sock: str, timeout: float = 2.0) -> bool:
    """The Docker-compatible API on ``sock`` answers ``GET /_ping`` with 200 OK."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout)
    try:
        conn.connect(sock)
        conn.sendall(b'GET /_ping HTTP/1.0\r\nHost: podman\r\n\r\n')
        data = b''
        while len(data) < 4096:
            chunk = conn.recv(4096)
            if not chunk:
                break
            data += chunk
    except OSError:
        return False
    finally:
        conn.close()
    head, _sep, body = data.partition(b'\r\n\r\n')
    return head.split(b'\r\n', 1)[0].split(b' ')[1:2] == [b'200'] and body.strip() == b'OK'


def proc_state(pid: int) -> Optional[str]:
    """The state letter of a process (``Z`` a zombie), or None when there is none."""
    try:
        with open('/proc/%d/stat' % pid, 'rb') as handle:
            return handle.read().decode('utf-8', 'replace').rsplit(')', 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def proc_ours(pid: int, sock_url: str) -> bool:
    """``pid`` is a live subreaper this module started (root's, for ``sock_url``), not a pid reused since."""
    if proc_state(pid) in (None, 'Z', 'X'):
        return False
    try:
        with open('/proc/%d/cmdline' % pid, 'rb') as handle:
            argv = handle.read().split(b'\0')
        with open('/proc/%d/status' % pid, 'rb') as handle:
            status = handle.read().decode('utf-8', 'replace')
    except OSError:
        return False
    uids = [line.split()[1:] for line in status.splitlines() if line.startswith('Uid:')]
    argv = [a.decode('utf-8', 'replace') for a in argv if a]
    return (bool(uids) and uids[0][0] == '0' and len(argv) > 3 and argv[1] == '-c'
            and SUBREAPER_MARK in argv[2] and argv[-1] == sock_url and 'service' in argv)


def session_services(sid: int, sock_url: str) -> List[int]:
    """Live ``podman system service ... sock_url`` processes of session ``sid`` (the subreaper's own session).

    Rootless ``podman`` re-executes itself inside the account's user namespace; on SIGTERM the outer process can
    exit first, and the inner one, an orphan, outlives the subreaper (measured with Podman 4.3.1 here).
    """
    found = []
    for name in os.listdir('/proc'):
        if not name.isdigit():
            continue
        try:
            with open('/proc/%s/stat' % name, 'rb') as handle:
                fields = handle.read().decode('utf-8', 'replace').rsplit(')', 1)[1].split()
            with open('/proc/%s/cmdline' % name, 'rb') as handle:
                argv = [a.decode('utf-8', 'replace') for a in handle.read().split(b'\0') if a]
        except (OSError, IndexError):
            continue
        tail = ['system', 'service', '--time=0', sock_url]
        if fields[0] not in ('Z', 'X') and int(fields[3]) == sid and argv[-4:] == tail:
            found.append(int(name))
    return found


Runner = Callable[..., Tuple[int, str, str]]


class Host(object):
    """What this host is and how to reach it: replaced by a fake in the unit tests."""

    subid_files = _subids.SUBID_FILES
    runtime_base = '/run/user'
    linger_dir = '/var/lib/systemd/linger'

    def __init__(self, runner: Runner) -> None:
        self.run = runner

    def euid(self) -> int:
        return os.geteuid()

    def account(self, name: str) -> Optional[Any]:
        try:
            return pwd.getpwnam(name)
        except KeyError:
            return None

    def systemd_pid1(self) -> bool:
        try:
            with open('/proc/1/comm') as handle:
                return handle.read().strip() == 'systemd' and os.path.isdir('/run/systemd/system')
        except OSError:
            return False

    def logind(self) -> bool:
        try:
            rc, _out, _err = self.run(['loginctl', '--no-pager', '--no-legend', 'list-sessions'])
        except OSError:
            return False
        return rc == 0

    def ping(self, sock: str) -> bool:
        return ping(sock)

    def proc_ours(self, pid: int, sock_url: str) -> bool:
        return proc_ours(pid, sock_url)

    def proc_gone(self, pid: int) -> bool:
        return proc_state(pid) in (None, 'Z', 'X')

    def session_services(self, sid: int, sock_url: str) -> List[int]:
        return session_services(sid, sock_url)

    def kill(self, pid: int, signum: int) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def spawn(self, argv: Sequence[str], cwd: str, log_fd: int) -> int:
        """Start ``argv`` detached (its own session, stdin /dev/null, output to ``log_fd``); its pid."""
        with open(os.devnull, 'rb') as null:
            proc = subprocess.Popen(list(argv), cwd=cwd, stdin=null, stdout=log_fd, stderr=log_fd,
                                    close_fds=True, start_new_session=True, env={'PATH': PATH})
        return proc.pid
