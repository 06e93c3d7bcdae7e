"""The rootless Podman service account (_podman/service_account.py): subordinate ranges, runtime dir, API socket.

The pure parts are tables (parse, allocate, refusals). The run is tested against a fake host: its commands are
recorded by a fake runner (the systemd branch: unmeasured on an engine) and its supervised service is a fake
process, so check mode, idempotence and every refusal can be shown to change nothing.
"""

import ast
import os
import signal
import subprocess
import sys
import time

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._podman import service_account as _sa
from ansible_collections.pi_dispatch.egress.plugins.module_utils._podman import subids as _subids
from ansible_collections.pi_dispatch.egress.plugins.module_utils._podman import supervision as _supervision

UID, GID = 1500, 1500
SUBUID, SUBGID = '/etc/subuid', '/etc/subgid'


def plan(subuid, subgid, count=65536, account='worker', uid=UID):
    return _subids.plan_subids({SUBUID: subuid, SUBGID: subgid}, account, uid, count)


@pytest.mark.parametrize('subuid, subgid, wanted', [
    # Empty files: the first range at 100000, the same in both.
    ('', '', {SUBUID: 'add worker:100000:65536', SUBGID: 'add worker:100000:65536'}),
    # After every range of BOTH files, even one only the other file has.
    ('a:100000:65536\n', 'a:100000:65536\nb:300000:65536\n',
     {SUBUID: 'add worker:365536:65536', SUBGID: 'add worker:365536:65536'}),
    # A gap below the last range is not used (first free after every range).
    ('a:100000:10\nb:500000:65536\n', '', {SUBUID: 'add worker:565536:65536', SUBGID: 'add worker:565536:65536'}),
    # Ranges below 100000 do not pull the start down.
    ('a:1000:10\n', '', {SUBUID: 'add worker:100000:65536', SUBGID: 'add worker:100000:65536'}),
    # Kept: by name, and by uid (`1500:...` names the account too); comments and blank lines skipped.
    ('# comment\n\nworker:200000:65536\n', '1500:200000:70000\n', {SUBUID: 'keep 3', SUBGID: 'keep 1'}),
    # One file has it, the other gets a new range after every range (the kept one included).
    ('worker:200000:65536\n', 'a:100000:65536\n', {SUBUID: 'keep 1', SUBGID: 'add worker:265536:65536'}),
    # A second, big enough line of the account is kept after a small one.
    ('worker:100000:10\nworker:200000:65536\n', 'worker:200000:65536\n', {SUBUID: 'keep 2', SUBGID: 'keep 1'}),
    # Touching ranges do not overlap.
    ('a:100000:65536\nworker:165536:65536\n', 'worker:165536:65536\n', {SUBUID: 'keep 2', SUBGID: 'keep 1'}),
])
def test_allocate_or_keep(subuid, subgid, wanted):
    got = {}
    for path, step in plan(subuid, subgid).items():
        got[path] = ('add ' + step['add']) if 'add' in step else 'keep %d' % step['keep'].line
    assert got == wanted


@pytest.mark.parametrize('subuid, subgid, words', [
    ('worker:100000:1000\n', 'worker:100000:65536\n',
     ['/etc/subuid line 1', 'worker:100000:1000', '1000 ids', 'needs 65536', 'delete it', 'podman system migrate']),
    ('a:100000:65536\nworker:150000:65536\n', '',
     ['/etc/subuid line 2', 'overlaps line 1', 'a:100000:65536', 'Delete line 2']),
    ('', '1500:90000:20000\nb:100000:65536\n', ['/etc/subgid line 1', 'overlaps line 2']),
    ('a:100000\n', '', ['/etc/subuid line 1', 'account:start:count']),
    ('ok:1:2\n\nx:y:z\n', '', ['/etc/subuid line 3']),
    ('', 'a:100000:0\n', ['/etc/subgid line 1']),
    ('', ':100000:5\n', ['/etc/subgid line 1']),
    ('a:-5:10\n', '', ['/etc/subuid line 1']),
])
def test_refusals_name_file_line_and_fix(subuid, subgid, words):
    with pytest.raises(_sa.Refusal) as info:
        plan(subuid, subgid)
    for word in words:
        assert word in str(info.value)
    assert 'Nothing was changed' in str(info.value)


def test_a_range_of_another_account_overlapping_a_third_is_not_ours_to_refuse():
    got = plan('a:100000:65536\nb:120000:65536\n', '')
    assert got[SUBUID] == {'add': 'worker:185536:65536'}


# -- the run, on a fake host ----------------------------------------------------------------------------------

class Entry(object):
    def __init__(self, home):
        self.pw_name, self.pw_uid, self.pw_gid, self.pw_dir = 'worker', UID, GID, home


class FakeHost(_sa.Host):
    def __init__(self, tmp_path, systemd=False, logind=False, exists=True):
        super().__init__(self.fake_run)
        self.tmp = tmp_path
        self.subid_files = (str(tmp_path / 'subuid'), str(tmp_path / 'subgid'))
        self.runtime_base = str(tmp_path / 'run-user')
        self.linger_dir = str(tmp_path / 'linger')
        os.makedirs(self.linger_dir)
        (tmp_path / 'home').mkdir()
        self.entry = Entry(str(tmp_path / 'home')) if exists else None
        self.systemd, self.logind_up = systemd, logind
        self.commands, self.spawned, self.killed = [], [], []
        self.answering, self.alive = set(), set()
        self.enabled = False
        self.leftover = {}

    def fake_run(self, argv, cwd=None):
        self.commands.append(' '.join(argv))
        if argv[0] == 'loginctl' and argv[1] != 'enable-linger':
            return (0 if self.logind_up else 1), '', ''
        if argv[0] == 'systemctl':
            verb = argv[4]
            if verb == 'is-enabled':
                return (0, 'enabled\n', '') if self.enabled else (1, 'disabled\n', '')
            if verb == 'is-active':
                return (0, 'active\n', '') if self.enabled else (3, 'inactive\n', '')
            if verb == 'enable':
                self.enabled = True
                self.answering.add('%s/%d/podman/podman.sock' % (self.runtime_base, UID))
            if verb == 'disable':
                self.enabled = False
        if argv[0] == 'loginctl' and argv[1] == 'enable-linger':
            open(os.path.join(self.linger_dir, argv[2]), 'w').close()
            os.makedirs('%s/%d' % (self.runtime_base, UID))
        if argv[0] == 'useradd':
            self.entry = Entry(str(self.tmp / 'home'))
        return 0, '', ''

    def euid(self):
        return 0

    def account(self, name):
        return self.entry

    def systemd_pid1(self):
        return self.systemd

    def ping(self, sock):
        return sock in self.answering

    def proc_ours(self, pid, sock_url):
        return pid in self.alive

    def proc_gone(self, pid):
        return pid not in self.alive

    def kill(self, pid, signum):
        self.killed.append((pid, signum))
        self.alive.discard(pid)
        self.answering.clear()

    def session_services(self, sid, sock_url):
        # The inner podman of a rootless service that outlived the subreaper (measured on Podman 4.3.1).
        return [p for p in self.leftover.get(sid, []) if p in self.alive]

    def sleep(self, seconds):
        pass

    def spawn(self, argv, cwd, log_fd):
        pid = 40000 + len(self.spawned)
        self.spawned.append((list(argv), cwd))
        self.alive.add(pid)
        self.answering.add(argv[-1][len('unix://'):])
        return pid


def snapshot(host):
    """Every file under the fake host's folders, with content, mode and owner."""
    found = {}
    for base in (host.tmp,):
        for root, dirs, files in os.walk(str(base)):
            for name in dirs + files:
                path = os.path.join(root, name)
                st = os.lstat(path)
                content = open(path).read() if os.path.isfile(path) else None
                found[path] = (content, st.st_mode, st.st_uid)
    return found


def run(host, **kwargs):
    return _sa.ServiceAccount(host, 'worker', **kwargs).apply()


def test_supervised_first_run_adds_ranges_makes_the_runtime_dir_and_starts_the_service(tmp_path):
    host = FakeHost(tmp_path)
    with open(host.subid_files[0], 'w') as handle:
        handle.write('other:100000:65536')  # no final newline: the new line still starts on its own
    result = run(host)
    sock = '%s/%d/podman/podman.sock' % (host.runtime_base, UID)
    assert result['changed'] is True
    assert result['socket'] == 'supervised' and result['docker_host'] == 'unix://' + sock
    assert open(host.subid_files[0]).read() == 'other:100000:65536\nworker:165536:65536\n'
    assert open(host.subid_files[1]).read() == 'worker:165536:65536\n'
    assert oct(os.stat(host.subid_files[1]).st_mode & 0o777) == '0o644'
    assert result['migrated'] is True
    assert any('podman system migrate' in c and '--reuid=%d' % UID in c for c in host.commands)
    runtime = os.stat('%s/%d' % (host.runtime_base, UID))
    assert (oct(runtime.st_mode & 0o777), runtime.st_uid) == ('0o700', UID)
    (argv, cwd), = host.spawned
    assert argv[1] == '-c' and _supervision.SUBREAPER_MARK in argv[2]
    assert argv[3:8] == ['setpriv', '--reuid=%d' % UID, '--regid=%d' % GID, '--init-groups', 'env']
    assert 'XDG_RUNTIME_DIR=%s/%d' % (host.runtime_base, UID) in argv and argv[-5:] == [
        'podman', 'system', 'service', '--time=0', 'unix://' + sock]
    assert cwd == host.entry.pw_dir
    pid_file = result['service']['pid_file']
    assert open(pid_file).read() == '40000\n' and oct(os.stat(pid_file).st_mode & 0o777) == '0o600'
    assert result['supervision'] == _sa.SUPERVISED_NOTE
    assert 'not restarted after a crash or a reboot; run the role again, or use systemd' in _sa.SUPERVISED_NOTE
    assert [d['before_header'] for d in result['diff']] == list(host.subid_files) + ['podman system service']


def test_supervised_second_run_changes_nothing_and_a_dead_service_is_started_again(tmp_path):
    host = FakeHost(tmp_path)
    run(host)
    before = snapshot(host)
    host.commands.clear()
    again = run(host)
    assert again['changed'] is False and again['actions'] == [] and again['migrated'] is False
    assert snapshot(host) == before and len(host.spawned) == 1
    assert not any('migrate' in c for c in host.commands)
    host.alive.clear()  # crashed: the recorded pid is gone
    host.answering.clear()
    third = run(host)
    assert third['changed'] is True and len(host.spawned) == 2 and third['service']['pid'] == 40001


def test_an_alive_service_that_does_not_answer_is_restarted(tmp_path):
    host = FakeHost(tmp_path)
    run(host)
    host.answering.clear()
    result = run(host)
    assert host.killed[0] == (40000, signal.SIGTERM) and result['service']['pid'] == 40001


def test_a_socket_answered_by_another_supervisor_is_refused_and_nothing_changes(tmp_path):
    host = FakeHost(tmp_path)
    run(host, state='absent')
    os.makedirs('%s/%d' % (host.runtime_base, UID), mode=0o700)
    os.chown('%s/%d' % (host.runtime_base, UID), UID, GID)
    for path in host.subid_files:
        with open(path, 'w') as handle:
            handle.write('worker:100000:65536\n')
    host.answering.add('%s/%d/podman/podman.sock' % (host.runtime_base, UID))
    before = snapshot(host)
    with pytest.raises(_sa.Refusal, match='another supervisor'):
        run(host)
    assert snapshot(host) == before and host.spawned == []


def test_check_mode_says_everything_and_changes_nothing(tmp_path):
    host = FakeHost(tmp_path)
    before = snapshot(host)
    result = run(host, check_mode=True)
    assert snapshot(host) == before and host.spawned == []
    assert result['changed'] is True
    assert result['actions'][:2] == ['%s: add worker:100000:65536' % p for p in host.subid_files]
    assert any('podman system migrate' in a for a in result['actions'])
    assert any(a.startswith('start podman system service') for a in result['actions'])
    assert not any('migrate' in c for c in host.commands)


def test_absent_stops_the_recorded_pid_only(tmp_path):
    host = FakeHost(tmp_path)
    first = run(host)
    pid_file = first['service']['pid_file']
    check = run(host, state='absent', check_mode=True)
    assert check['changed'] is True and os.path.exists(pid_file) and host.killed == []
    host.leftover[40000] = [41000]  # the inner podman system service, in the subreaper's session
    host.alive.add(41000)
    result = run(host, state='absent')
    assert host.killed == [(40000, signal.SIGTERM), (41000, signal.SIGTERM)] and not os.path.exists(pid_file)
    assert result['changed'] is True
    assert run(host, state='absent')['changed'] is False
    # A pid file naming a process this module did not start: removed, nothing signalled.
    with open(pid_file, 'w') as handle:
        handle.write('1\n')
    stale = run(host, state='absent')
    assert len(host.killed) == 2 and not os.path.exists(pid_file)
    assert 'nothing stopped' in stale['actions'][0]


def test_a_state_dir_the_account_made_is_refused_and_nothing_is_signalled(tmp_path):
    host = FakeHost(tmp_path)
    run(host)
    folder = os.path.join(host.runtime_base, str(UID), _sa.STATE_DIR)
    os.chown(folder, UID, GID)
    with pytest.raises(_sa.Refusal, match="not root's own folder"):
        run(host, state='absent')
    assert host.killed == []
    # Swapped for a symlink to a folder of root's, holding a pid file of its choice: refused too (never followed).
    os.chown(folder, 0, 0)
    os.rename(folder, folder + '.moved')
    os.symlink(folder + '.moved', folder)
    with pytest.raises(_sa.Refusal, match="not root's own folder"):
        run(host, state='absent')
    with pytest.raises(_sa.Refusal, match="not root's own folder"):
        run(host)
    assert host.killed == [] and len(host.spawned) == 1


def test_a_missing_account_is_refused_without_create_and_made_with_it(tmp_path):
    host = FakeHost(tmp_path, exists=False)
    before = snapshot(host)
    with pytest.raises(_sa.Refusal) as info:
        run(host)
    assert "account 'worker' does not exist" in str(info.value) and 'create: true' in str(info.value)
    assert snapshot(host) == before and host.commands == []
    check = run(host, create=True, check_mode=True)
    assert check['changed'] and host.entry is None and snapshot(host) == before
    assert check['diff'] == [dict(before_header='account', after_header='account', before='', after='worker (new)\n')]
    result = run(host, create=True)
    useradd, = [c for c in host.commands if c.startswith('useradd')]
    assert 'SUB_UID_COUNT=0' in useradd and useradd.endswith(' worker')
    assert result['actions'][0] == 'create account worker (useradd)' and result['service']['pid'] == 40000


@pytest.mark.parametrize('what', ['symlinked subuid', 'symlinked conf', 'symlinked conf dir', 'small range'])
def test_every_refusal_comes_before_any_change(tmp_path, what):
    host = FakeHost(tmp_path)
    conf = tmp_path / 'home' / '.config' / 'containers'
    conf.mkdir(parents=True)
    if what == 'symlinked subuid':
        (tmp_path / 'real').write_text('')
        os.symlink(str(tmp_path / 'real'), host.subid_files[0])
        match = 'subuid is a symlink'
    elif what == 'symlinked conf':
        os.symlink('/etc/shadow', str(conf / 'containers.conf'))
        match = r'containers\.conf \(account worker\) is a symlink'
    elif what == 'symlinked conf dir':
        os.symlink('/etc', str(conf / 'containers.conf.d'))
        match = 'containers.conf.d .* is a symlink'
    else:
        with open(host.subid_files[1], 'w') as handle:
            handle.write('worker:100000:100\n')
        match = 'subgid line 1'
    before = snapshot(host)
    with pytest.raises(_sa.Refusal, match=match):
        run(host)
    assert snapshot(host) == before and host.spawned == [] and not any('migrate' in c for c in host.commands)


def test_systemd_branch_enables_the_user_socket_with_linger_and_is_idempotent(tmp_path):
    host = FakeHost(tmp_path, systemd=True, logind=True)
    result = run(host)
    assert result['socket'] == 'systemd' and result['linger'] is True
    assert 'loginctl enable-linger worker' in host.commands
    assert 'systemctl --user -M worker@ enable --now podman.socket' in host.commands
    assert host.spawned == [] and 'supervision' not in result
    host.commands.clear()
    again = run(host)
    assert again['changed'] is False
    assert not any('enable' in c.split() for c in host.commands) and 'loginctl enable-linger worker' not in \
        host.commands
    gone = run(host, state='absent')
    assert gone['changed'] and host.commands[-1] == 'systemctl --user -M worker@ disable --now podman.socket'


def test_auto_is_supervised_without_systemd_or_without_logind_and_systemd_needs_logind(tmp_path):
    assert run(FakeHost(tmp_path / 'a', systemd=False, logind=True))['socket'] == 'supervised'
    assert run(FakeHost(tmp_path / 'b', systemd=True, logind=False))['socket'] == 'supervised'
    host = FakeHost(tmp_path / 'c')
    with pytest.raises(_sa.Refusal, match='needs systemd and logind'):
        run(host, socket_mode='systemd')
    assert host.spawned == []


@pytest.mark.parametrize('name', ['', '-r', 'a:b', 'worker\nroot:0:65536', 'Worker', '../x', 'a' * 33])
def test_a_name_that_is_not_a_user_name_is_refused_before_anything(tmp_path, name):
    host = FakeHost(tmp_path, exists=False)
    with pytest.raises(_sa.Refusal, match='is not a user name'):
        _sa.ServiceAccount(host, name, create=True).apply()
    assert host.commands == [] and not os.path.exists(host.subid_files[0])


def test_not_root_is_refused():
    class NotRoot(_sa.Host):
        def euid(self):
            return 1000
    with pytest.raises(_sa.Refusal, match='become: true'):
        _sa.ServiceAccount(NotRoot(None), 'worker').apply()


def test_ping_speaks_http_on_a_unix_socket(tmp_path):
    import socket
    import threading
    path = str(tmp_path / 's.sock')
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(2)

    def serve(answers):
        for answer in answers:
            conn, _peer = server.accept()
            conn.recv(1024)
            conn.sendall(answer)
            conn.close()
    thread = threading.Thread(target=serve, args=([b'HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK',
                                                   b'HTTP/1.1 500 Error\r\n\r\nOK'],))
    thread.start()
    assert _supervision.ping(path) is True
    assert _supervision.ping(path) is False
    thread.join(5)
    server.close()
    assert _supervision.ping(str(tmp_path / 'none.sock')) is False


def test_the_subreaper_runs_the_command_and_passes_its_exit_status(tmp_path):
    # The command leaves a grandchild that outlives it (the subreaper's orphan): the exit status is still the command's.
    script = 'import os,sys,time\nif os.fork()==0:\n    time.sleep(0.3); os._exit(0)\nsys.exit(3)'
    proc = subprocess.run([sys.executable, '-c', _supervision.SUBREAPER_SOURCE, sys.executable, '-c', script],
                          timeout=30, check=False)
    assert proc.returncode == 3
    # tests/podman/subreaper.py runs the same program, read from the product's file.
    wrapper = os.path.join(os.path.dirname(__file__), '..', '..', '..', 'podman', 'subreaper.py')
    proc = subprocess.run([sys.executable, wrapper, sys.executable, '-c', 'import sys; sys.exit(5)'], timeout=30,
                          check=False)
    assert proc.returncode == 5
    tree = ast.parse(open(_supervision.__file__).read())
    assert any(isinstance(n, ast.Assign) and getattr(n.targets[0], 'id', '') == 'SUBREAPER_SOURCE' for n in tree.body)


def test_the_subreaper_passes_sigterm_to_the_command(tmp_path):
    proc = subprocess.Popen([sys.executable, '-c', _supervision.SUBREAPER_SOURCE, sys.executable, '-c',
                             'import time; time.sleep(30)'])
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 128 + signal.SIGTERM
