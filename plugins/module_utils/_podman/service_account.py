# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""What ``egress_podman_account`` does: a service account ready to run rootless Podman, and its API socket.

In order, each step said in the result and skipped in check mode after saying what it would do:

1. the account (``useradd`` only with ``create``; a missing one is refused, naming it and the fix);
2. its subordinate ranges: a range of at least ``subid_count`` ids in both ``/etc/subuid`` and
   ``/etc/subgid`` is kept; a missing one is added (the first free range after every range of both
   files, never below 100000, written atomically); a range too small, one that overlaps another
   account's, a malformed line or a symlinked file is refused naming the file, the line and the fix,
   and never rewritten. After an addition, ``podman system migrate`` runs as the account;
3. ``/run/user/<uid>`` (0700, the account's) where no logind makes it; linger where logind runs;
4. the API socket: the account's ``podman.socket`` (``systemctl --user -M <account>@``) where systemd
   and logind run, else ``podman system service`` started as the account (``setpriv``, a clean
   environment), detached (its own session), under a subreaper (``supervision.SUBREAPER_SOURCE``) that reaps
   the exited ``aardvark-dns`` and ``conmon`` it inherits; its pid is kept in a root-owned folder of
   the runtime dir. Such a service is not restarted after a crash or a reboot: the result says so.

Every refusal comes before anything changes. The pure parts (``subids``: the parse and the allocation)
are unit-tested as tables; the rest takes a command runner so the systemd branch is tested with a fake.
"""

from __future__ import annotations

import os
import re
import signal
import stat
import sys
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import files as _files
from ansible_collections.pi_dispatch.egress.plugins.module_utils._podman import subids as _subids
from ansible_collections.pi_dispatch.egress.plugins.module_utils._podman import supervision as _supervision

SUPERVISED_NOTE = ('supervised by this module: not restarted after a crash or a reboot; run the role again, '
                   'or use systemd')
STATE_DIR = 'pi-egress'  # under /run/user/<uid>, root's own (0700): the pid file and the service's log
PID_FILE = 'podman-service.pid'
LOG_FILE = 'podman-service.log'
# useradd's default NAME_REGEX: a name that is neither an option to useradd nor a line break or `:` in /etc/subuid
ACCOUNT_NAME = re.compile(r'^[a-z_][a-z0-9_-]{0,30}\$?$')

# One refusal for the whole run: the subid plan's and this module's own.
Refusal = _subids.Refusal
# The host as the run sees it (a fake in the unit tests).
Host = _supervision.Host


class ServiceAccount(object):
    """One run of ``egress_podman_account``: :meth:`apply` returns the module's result or raises Refusal."""

    def __init__(self, host: Host, account: str, create: bool = False, subid_count: int = 65536,
                 socket_mode: str = 'auto', state: str = 'present', check_mode: bool = False) -> None:
        self.host = host
        self.account = account
        self.create = create
        self.count = subid_count
        self.socket_mode = socket_mode
        self.state = state
        self.check = check_mode
        self.actions = []  # type: List[str]
        self.diff = []  # type: List[Dict[str, str]]
        self.result = dict(changed=False, account=account, actions=self.actions)  # type: Dict[str, Any]

    # -- helpers ---------------------------------------------------------------------------------------
    def _act(self, text: str) -> None:
        self.actions.append(text)
        self.result['changed'] = True

    def _as_account(self, entry: Any) -> List[str]:
        return ['setpriv', '--reuid=%d' % entry.pw_uid, '--regid=%d' % entry.pw_gid, '--init-groups',
                'env', '-i', 'PATH=' + _supervision.PATH, 'HOME=' + entry.pw_dir, 'USER=' + self.account,
                'LOGNAME=' + self.account, 'XDG_RUNTIME_DIR=%s/%d' % (self.host.runtime_base, entry.pw_uid)]

    def _must(self, argv: List[str], what: str, **kwargs: Any) -> str:
        rc, out, err = self.host.run(argv, **kwargs)
        if rc != 0:
            raise RuntimeError('%s failed (rc %d): %s: %s'
                               % (what, rc, ' '.join(argv[:12]), (err or out).strip()[-600:]))
        return out

    def _systemctl(self, *args: str) -> List[str]:
        return ['systemctl', '--user', '-M', '%s@' % self.account] + list(args)

    # -- checks before anything changes -----------------------------------------------------------------
    def _read_subid_files(self) -> Dict[str, str]:
        texts = {}
        for path in self.host.subid_files:
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                texts[path] = ''
                continue
            if stat.S_ISLNK(st.st_mode):
                raise Refusal('%s is a symlink (to %s): it is written atomically (a new file renamed into place), '
                              'so a symlink is refused rather than followed or replaced. Replace it with the real '
                              'file (cp --remove-destination "$(readlink -f %s)" %s), then run again. Nothing was '
                              'changed.' % (path, os.readlink(path), path, path))
            if not stat.S_ISREG(st.st_mode):
                raise Refusal('%s is not a regular file: move it away, then run again. Nothing was changed.' % path)
            with open(path, 'rb') as handle:
                try:
                    texts[path] = handle.read().decode('utf-8')
                except UnicodeDecodeError:
                    raise Refusal('%s is not UTF-8 text: fix it (man subuid), then run again. Nothing was '
                                  'changed.' % path) from None
        return texts

    def _refuse_symlinked_config(self, home: str) -> None:
        """Root reads the account's containers.conf next (egress_podman_conf): never through its symlinks."""
        conf = os.path.join(home, '.config', 'containers')
        paths = [os.path.join(home, '.config'), conf, os.path.join(conf, 'containers.conf'),
                 os.path.join(conf, 'containers.conf.d'), os.path.join(conf, 'storage.conf')]
        if os.path.isdir(paths[3]) and not os.path.islink(paths[3]):
            paths += [os.path.join(paths[3], name) for name in sorted(os.listdir(paths[3]))]
        for path in paths:
            if os.path.islink(path):
                raise Refusal('%s (account %s) is a symlink (to %s): this role reads the account\'s Podman '
                              'configuration as root and does not follow links the account controls. Replace it '
                              'with the real file or folder, then run again. Nothing was changed.'
                              % (path, self.account, os.readlink(path)))

    def _resolve_socket(self, logind: bool) -> str:
        if self.socket_mode != 'auto':
            return self.socket_mode
        return 'systemd' if logind and self.host.systemd_pid1() else 'supervised'

    # -- the run ---------------------------------------------------------------------------------------
    def apply(self) -> Dict[str, Any]:
        if not ACCOUNT_NAME.match(self.account or ''):
            raise Refusal('account %r is not a user name this module takes (lower case letters, digits, `_` and `-`, '
                          'starting with a letter or `_`, at most 32): it is written into /etc/subuid and given to '
                          'useradd. Nothing was changed.' % (self.account,))
        if self.host.euid() != 0:
            raise Refusal('egress_podman_account changes /etc/subuid, /etc/subgid and /run/user and starts a service '
                          'as account %s: run it as root (become: true). Nothing was changed.' % self.account)
        entry = self.host.account(self.account)
        if entry is None:
            if not self.create:
                raise Refusal('account %r does not exist on this host: create it first (useradd --create-home '
                              '--shell /usr/sbin/nologin %s), or set create: true (the role\'s '
                              'egress_podman_account_create). Nothing was changed.' % (self.account, self.account))
            if self.state == 'absent':
                self.result.update(service={'state': 'absent'})
                return self.result
            texts = self._read_subid_files()
            _subids.plan_subids(texts, self.account, -1, self.count)  # the files are readable: refusals come first
            argv = ['useradd', '--create-home', '--shell', '/usr/sbin/nologin', '--comment',
                    'pi-dispatch egress rootless Podman', '-K', 'SUB_UID_COUNT=0', '-K', 'SUB_GID_COUNT=0',
                    self.account]
            self._act('create account %s (useradd)' % self.account)
            self.diff.append(dict(before_header='account', after_header='account', before='',
                                  after='%s (new)\n' % self.account))
            if self.check:
                self.result['msg'] = 'would create account %s; the rest is decided once it exists' % self.account
                self.result['diff'] = self.diff
                return self.result
            self._must(argv, 'useradd')
            entry = self.host.account(self.account)
            if entry is None:
                raise RuntimeError('useradd succeeded but account %s is not in the password database' % self.account)
        uid = entry.pw_uid
        runtime = '%s/%d' % (self.host.runtime_base, uid)
        sock = '%s/podman/podman.sock' % runtime
        sock_url = 'unix://' + sock
        self.result.update(uid=uid, runtime_dir=runtime, docker_host=sock_url)
        if self.state == 'present':
            self._refuse_symlinked_config(entry.pw_dir)
            texts = self._read_subid_files()
            plan = _subids.plan_subids(texts, self.account, uid, self.count)
        logind = self.host.logind()
        mode = self._resolve_socket(logind)
        self.result['socket'] = mode
        if mode == 'systemd' and not logind:
            raise Refusal('socket: systemd needs systemd and logind on this host (account %s\'s user manager); '
                          'loginctl does not answer here. Use socket: supervised (or auto). Nothing was changed.'
                          % self.account)
        if self.state == 'absent':
            if mode == 'systemd':
                self._systemd_absent()
            else:
                self._supervised_absent(runtime, sock_url)
            self.result['diff'] = self.diff
            return self.result
        added = self._subids(plan, texts)
        self._runtime(entry, runtime, logind)
        if added:
            if self.check:
                self._act('podman system migrate as %s (a range was added)' % self.account)
            else:
                self._must(self._as_account(entry) + ['podman', 'system', 'migrate'], 'podman system migrate',
                           cwd=entry.pw_dir)
                self._act('podman system migrate as %s (a range was added)' % self.account)
        self.result['migrated'] = bool(added)
        if mode == 'systemd':
            self._systemd_present(sock)
        else:
            self._supervised_present(entry, runtime, sock, sock_url)
        self.result['diff'] = self.diff
        return self.result

    def _subids(self, plan: Dict[str, Dict[str, Any]], texts: Dict[str, str]) -> bool:
        subids = {}
        added = False
        for path, step in plan.items():
            if 'keep' in step:
                subids[path] = dict(step['keep'].as_dict(), added=False)
                continue
            line = step['add']
            _owner, start, count = line.split(':')
            subids[path] = dict(path=path, owner=self.account, start=int(start), count=int(count), added=True)
            before = texts[path]
            after = before + ('' if not before or before.endswith('\n') else '\n') + line + '\n'
            self.diff.append(dict(before_header=path, after_header=path, before=before, after=after))
            self._act('%s: add %s' % (path, line))
            added = True
            if not self.check:
                existed = os.path.lexists(path)
                _files.write_atomic(path, after)
                if not existed:
                    os.chmod(path, 0o644)
        self.result['subids'] = subids
        return added

    def _runtime(self, entry: Any, runtime: str, logind: bool) -> None:
        if logind:
            marker = os.path.join(self.host.linger_dir, self.account)
            self.result['linger'] = True
            if not os.path.exists(marker):
                self._act('loginctl enable-linger %s' % self.account)
                if not self.check:
                    self._must(['loginctl', 'enable-linger', self.account], 'loginctl enable-linger')
                    for _i in range(30):  # logind starts the user manager, which makes the runtime dir
                        if os.path.isdir(runtime):
                            break
                        self.host.sleep(0.5)
            if self.check or os.path.isdir(runtime):
                return
            raise RuntimeError('logind did not make %s for %s after enable-linger; see `loginctl user-status %s`'
                               % (runtime, self.account, self.account))
        self.result['linger'] = False
        try:
            st = os.lstat(runtime)
        except FileNotFoundError:
            st = None
        if st is not None and (stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode)):
            raise Refusal('%s (account %s\'s runtime dir) is not a directory (a symlink or a file): remove it, then '
                          'run again. Nothing was changed.' % (runtime, self.account))
        if st is not None and st.st_uid == entry.pw_uid and stat.S_IMODE(st.st_mode) == 0o700:
            return
        what = 'mode and owner' if st else 'create'
        self._act('%s: %s (0700, %s\'s; no logind here)' % (runtime, what, self.account))
        if self.check:
            return
        if not os.path.isdir(self.host.runtime_base):
            os.makedirs(self.host.runtime_base, 0o755)
        if st is None:
            os.mkdir(runtime, 0o700)
        os.chown(runtime, entry.pw_uid, entry.pw_gid)
        os.chmod(runtime, 0o700)

    # -- the socket, systemd -------------------------------------------------------------------------------
    def _systemd_present(self, sock: str) -> None:
        enabled = self.host.run(self._systemctl('is-enabled', 'podman.socket'))
        active = self.host.run(self._systemctl('is-active', 'podman.socket'))
        ok = enabled[0] == 0 and enabled[1].strip() == 'enabled' and active[0] == 0
        self.result['service'] = dict(unit='podman.socket', scope='user', enabled=True)
        if not ok:
            self._act('systemctl --user -M %s@ enable --now podman.socket' % self.account)
            self.diff.append(dict(before_header='podman.socket', after_header='podman.socket',
                                  before='%s, %s\n' % (enabled[1].strip() or 'disabled', active[1].strip() or
                                                       'inactive'), after='enabled, active\n'))
            if self.check:
                return
            self._must(self._systemctl('enable', '--now', 'podman.socket'), 'enabling podman.socket')
        if not self.check:
            self._wait_ping(sock, 'the account\'s podman.socket (journalctl --user -M %s@ -u podman.service)'
                            % self.account)

    def _systemd_absent(self) -> None:
        enabled = self.host.run(self._systemctl('is-enabled', 'podman.socket'))
        active = self.host.run(self._systemctl('is-active', 'podman.socket'))
        self.result['service'] = dict(unit='podman.socket', scope='user', enabled=False)
        if enabled[1].strip() == 'enabled' or active[0] == 0:
            self._act('systemctl --user -M %s@ disable --now podman.socket' % self.account)
            if not self.check:
                self._must(self._systemctl('disable', '--now', 'podman.socket'), 'disabling podman.socket')

    def _wait_ping(self, sock: str, what: str, tries: int = 30) -> bool:
        for _i in range(tries):
            if self.host.ping(sock):
                return True
            self.host.sleep(1)
        raise RuntimeError('%s does not answer GET /_ping on %s within %ds' % (what, sock, tries))

    # -- the socket, supervised ------------------------------------------------------------------------
    def _state_dir(self, runtime: str, make: bool) -> Optional[int]:
        """A descriptor of root's folder in the runtime dir (0700); a folder there that is not root's is refused.

        The account owns the runtime dir and could swap the folder between a check and a use, so everything in it
        is opened relative to this descriptor (``dir_fd``), never by path.
        """
        path = os.path.join(runtime, STATE_DIR)
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            if not make:
                return None
            os.mkdir(path, 0o700)  # root's, as this module runs; FileExistsError if the account raced us to it
            fd = os.open(path, flags)
        except OSError:  # ELOOP: a symlink; ENOTDIR: a file
            fd = None
        st = os.fstat(fd) if fd is not None else None
        if st is None or st.st_uid != 0 or stat.S_IMODE(st.st_mode) & 0o077:
            if fd is not None:
                os.close(fd)
            raise Refusal('%s is not root\'s own folder (0700): the account may have put it there, and the pid it '
                          'holds decides what this module stops. Remove it (rm -rf %s) after stopping any '
                          '`podman system service` of %s by hand, then run again. Nothing was changed.'
                          % (path, path, self.account))
        return fd

    def _recorded_pid(self, runtime: str) -> Tuple[Optional[str], Optional[int], bool]:
        """(pid file's path, the pid it holds, whether the file exists)."""
        folder = self._state_dir(runtime, make=False)
        if folder is None:
            return None, None, False
        path = os.path.join(runtime, STATE_DIR, PID_FILE)
        try:
            fd = os.open(PID_FILE, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=folder)
        except FileNotFoundError:
            return path, None, False
        except OSError as exc:
            raise Refusal('%s cannot be read (%s): remove it, then run again. Nothing was changed.' % (path, exc)) \
                from None
        finally:
            os.close(folder)
        with os.fdopen(fd, 'rb') as handle:
            text = handle.read(32).decode('ascii', 'replace').strip()
        return path, int(text) if text.isdigit() else None, True

    def _supervised_present(self, entry: Any, runtime: str, sock: str, sock_url: str) -> None:
        self.result['supervision'] = SUPERVISED_NOTE
        pid_path, pid, _found = ((None, None, False) if self.check and not os.path.isdir(runtime)
                                 else self._recorded_pid(runtime))
        service = dict(supervised=True, pid_file=pid_path or os.path.join(runtime, STATE_DIR, PID_FILE))
        self.result['service'] = service
        if pid is not None and self.host.proc_ours(pid, sock_url):
            for _i in range(5):
                if self.host.ping(sock):
                    service.update(pid=pid, running=True)
                    return
                self.host.sleep(1)
            self._act('restart podman system service (pid %d does not answer on %s)' % (pid, sock))
            if not self.check:
                self._stop(pid, sock_url)
        elif self.host.ping(sock):
            raise Refusal('a Podman API answers on %s, but no service this module started (no live pid in %s): '
                          'another supervisor runs it. Stop that one, or leave it and do not run this module on %s '
                          '(socket: systemd where systemd runs). Nothing was changed.'
                          % (sock, service['pid_file'], self.account))
        else:
            self._act('start podman system service as %s on %s (%s)' % (self.account, sock_url, SUPERVISED_NOTE))
        self.diff.append(dict(before_header='podman system service', after_header='podman system service',
                              before='stopped\n' if pid is None else 'pid %d, not answering\n' % pid,
                              after='running, answering on %s\n' % sock))
        if self.check:
            service.update(running=True)
            return
        folder = self._state_dir(runtime, make=True)
        try:
            self._start(entry, runtime, sock, sock_url, folder, service)
        finally:
            os.close(folder)

    def _start(self, entry: Any, runtime: str, sock: str, sock_url: str, folder: int, service: Dict[str, Any]) -> None:
        podman_dir = os.path.join(runtime, 'podman')
        if not os.path.isdir(podman_dir):
            os.mkdir(podman_dir, 0o700)
            os.chown(podman_dir, entry.pw_uid, entry.pw_gid, follow_symlinks=False)
        try:
            if stat.S_ISSOCK(os.lstat(sock).st_mode):
                os.unlink(sock)  # stale: nothing answered on it
        except FileNotFoundError:
            pass
        argv = [sys.executable, '-c', _supervision.SUBREAPER_SOURCE] + self._as_account(entry) + [
            'podman', 'system', 'service', '--time=0', sock_url]
        log_path = os.path.join(runtime, STATE_DIR, LOG_FILE)
        log_fd = os.open(LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600, dir_fd=folder)
        try:
            new = self.host.spawn(argv, entry.pw_dir, log_fd)
        finally:
            os.close(log_fd)
        tmp = PID_FILE + '.tmp'
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600, dir_fd=folder)
        with os.fdopen(fd, 'w') as handle:
            handle.write('%d\n' % new)
        os.rename(tmp, PID_FILE, src_dir_fd=folder, dst_dir_fd=folder)
        service.update(pid=new, running=True, log=log_path)
        try:
            self._wait_ping(sock, 'podman system service (pid %d, log %s)' % (new, log_path))
        except RuntimeError as exc:
            self._stop(new, sock_url)
            os.unlink(PID_FILE, dir_fd=folder)
            tail = ''
            try:
                fd = os.open(LOG_FILE, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=folder)
                with os.fdopen(fd, 'rb') as handle:
                    tail = handle.read()[-1500:].decode('utf-8', 'replace')
            except OSError:
                pass
            raise RuntimeError('%s; it was stopped again. Its log: %s' % (exc, tail.strip())) from None

    def _stop(self, pid: int, sock_url: str) -> None:
        """SIGTERM the subreaper (it passes it on), then any ``podman system service`` of its session left over."""
        self._stop_one(pid)
        for target in self.host.session_services(pid, sock_url):  # found again now: only what is still running
            self._stop_one(target)

    def _stop_one(self, pid: int) -> None:
        self.host.kill(pid, signal.SIGTERM)
        for _i in range(30):
            if self.host.proc_gone(pid):
                return
            self.host.sleep(0.5)
        self.host.kill(pid, signal.SIGKILL)

    def _supervised_absent(self, runtime: str, sock_url: str) -> None:
        pid_path, pid, found = self._recorded_pid(runtime)
        self.result['service'] = dict(supervised=True, pid_file=pid_path, running=False)
        if not found:
            return
        if pid is not None and self.host.proc_ours(pid, sock_url):
            self._act('stop podman system service (pid %d, the pid recorded in %s)' % (pid, pid_path))
            self.diff.append(dict(before_header='podman system service', after_header='podman system service',
                                  before='running, pid %d\n' % pid, after='stopped\n'))
            if not self.check:
                self._stop(pid, sock_url)
        else:
            self._act('remove %s (pid %s is not a service this module started: nothing stopped)' % (pid_path, pid))
        if self.check:
            return
        folder = self._state_dir(runtime, make=False)
        if folder is not None:
            try:
                os.unlink(PID_FILE, dir_fd=folder)
            except FileNotFoundError:
                pass
            finally:
                os.close(folder)
