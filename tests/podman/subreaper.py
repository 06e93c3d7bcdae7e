"""Run a command as a child subreaper, reaping every orphan it inherits (./run gate podman).

``python3 subreaper.py podman system service ...``: netavark starts aardvark-dns detached, so when
aardvark-dns exits it is re-parented to the nearest subreaper, else to PID 1. On a machine whose
PID 1 reaps late (a micro-VM's init, measured here), the exited aardvark-dns stays a zombie; netavark
then finds its pid "alive" (kill -0 succeeds on a zombie), signals it instead of starting a new one,
and name resolution on every Podman network stops. As a subreaper this wrapper inherits those orphans
and reaps them at once, as systemd does for podman.service on a normal host.
"""

import ctypes
import errno
import os
import signal
import subprocess
import sys

PR_SET_CHILD_SUBREAPER = 36


def main(argv):
    if not argv:
        sys.exit('usage: subreaper.py <command> [args...]')
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sys.exit('prctl(PR_SET_CHILD_SUBREAPER) failed: %s' % os.strerror(ctypes.get_errno()))
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
            status = os.waitstatus_to_exitcode(raw)
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
    return status if status >= 0 else 128 - status


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
