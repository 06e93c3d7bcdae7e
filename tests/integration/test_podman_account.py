"""The podman_account role on this host: a throwaway account's rootless Podman and its supervised API socket.

Runs with ``PI_EGRESS_IT_ENGINE=podman-rootless`` as root (``./run gate podman-rootless``); skipped elsewhere. It
needs no job containers and none of the gate's services: the role makes account ``pi-egress-sa`` (``create``),
its subordinate ranges, its runtime dir and a ``podman system service`` of its own (this host's PID 1 is not
systemd, so ``socket: supervised``). The test's teardown stops what was started (by the recorded pid), removes
the account (``userdel -r``), its subid lines and its runtime dir.
"""

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time

import pytest

from conftest import run_playbook

WANTED = os.environ.get('PI_EGRESS_IT_ENGINE', '')
pytestmark = [
    pytest.mark.skipif(WANTED != 'podman-rootless',
                       reason='not the rootless Podman venue (./run gate podman-rootless runs this file)'),
    pytest.mark.skipif(os.geteuid() != 0, reason='makes an account and edits /etc/subuid: root only'),
]

ACCOUNT = 'pi-egress-sa'
SUBID_FILES = ('/etc/subuid', '/etc/subgid')
PLAYBOOK = """
- name: The podman_account role (test_podman_account.py)
  hosts: localhost
  gather_facts: false
  roles:
    - role: pi_dispatch.egress.podman_account
  post_tasks:
    - name: Write what the module returned
      ansible.builtin.copy:
        content: "{{ egress_podman_account_result | to_json }}"
        dest: "{{ sa_result_file }}"
        mode: "0600"
      changed_when: false
"""


def _lines(account, uid=None):
    names = (account + ':',) + ((str(uid) + ':',) if uid is not None else ())
    found = {}
    for path in SUBID_FILES:
        with open(path) as handle:
            found[path] = [line for line in handle.read().splitlines() if line.startswith(names)]
    return found


def _proc_state(pid):
    try:
        with open('/proc/%d/stat' % pid) as handle:
            return handle.read().rsplit(')', 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _children(pid):
    try:
        with open('/proc/%d/task/%d/children' % (pid, pid)) as handle:
            return [int(p) for p in handle.read().split()]
    except OSError:
        return []


def _cmdline(pid):
    try:
        with open('/proc/%d/cmdline' % pid, 'rb') as handle:
            return handle.read().replace(b'\0', b' ').decode('utf-8', 'replace')
    except OSError:
        return ''


def _uid_of(pid):
    with open('/proc/%d/status' % pid) as handle:
        return int([line for line in handle.read().splitlines() if line.startswith('Uid:')][0].split()[1])


def _get(sock, path):
    """GET ``path`` on the unix socket ``sock``: (status, body)."""
    conn = socket.socket(socket.AF_UNIX)
    conn.settimeout(30)
    conn.connect(sock)
    conn.sendall(('GET %s HTTP/1.0\r\nHost: podman\r\n\r\n' % path).encode())
    data = b''
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    conn.close()
    head, _sep, body = data.partition(b'\r\n\r\n')
    return int(head.split(b' ')[1]), body


def _account_processes(uid):
    found = []
    for name in os.listdir('/proc'):
        if name.isdigit() and _proc_state(int(name)) not in (None, 'Z'):
            try:
                if _uid_of(int(name)) == uid:
                    found.append(int(name))
            except (OSError, IndexError):
                pass
    return found


def _account_services(uid):
    return [p for p in _account_processes(uid) if 'podman system service' in _cmdline(p)]


def _stop_recorded(uid):
    pid_file = '/run/user/%d/pi-egress/podman-service.pid' % uid
    try:
        pid = int(open(pid_file).read().strip())
    except (OSError, ValueError):
        return
    if _proc_state(pid) not in (None, 'Z'):
        os.kill(pid, signal.SIGTERM)
        for _i in range(40):
            if _proc_state(pid) in (None, 'Z'):
                break
            time.sleep(0.25)


def _remove_account():
    try:
        entry = pwd.getpwnam(ACCOUNT)
    except KeyError:
        entry = None
    uid = entry.pw_uid if entry else None
    if uid is not None:
        _stop_recorded(uid)
    for path in SUBID_FILES:
        with open(path) as handle:
            lines = handle.read().splitlines(True)
        keep = [line for line in lines
                if not line.startswith((ACCOUNT + ':',) + ((str(uid) + ':',) if uid is not None else ()))]
        if keep != lines:
            with open(path, 'w') as handle:
                handle.writelines(keep)
    if entry is not None:
        # What the account's Podman left running (its pause process): started by this test, for its throwaway account.
        for pid in _account_processes(uid):
            os.kill(pid, signal.SIGTERM)
        for _i in range(20):
            if not _account_processes(uid):
                break
            time.sleep(0.25)
        subprocess.run(['userdel', '-r', ACCOUNT], check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree('/run/user/%d' % uid, ignore_errors=True)


@pytest.fixture(scope='module')
def account_world(tmp_path_factory):
    _remove_account()  # a run killed before its teardown
    folder = tmp_path_factory.mktemp('sa')
    playbook = folder / 'play.yml'
    playbook.write_text(PLAYBOOK)
    result_file = folder / 'result.json'

    def play(check=False, **extra):
        if result_file.exists():
            result_file.unlink()
        extra = dict({'egress_podman_account': ACCOUNT, 'egress_podman_account_create': True,
                      'egress_podman_account_socket': 'supervised', 'egress_proxy_limits_unenforced_ok': False,
                      'sa_result_file': str(result_file)}, **extra)
        rc, out, recap = run_playbook(str(playbook), extra, check=check, timeout=300)
        result = json.loads(result_file.read_text()) if result_file.exists() else None
        return rc, out, recap, result

    yield play
    _remove_account()


def test_the_role_makes_a_rootless_account_whose_supervised_socket_answers_and_reruns_change_nothing(account_world):
    before = _lines(ACCOUNT)
    assert before == {'/etc/subuid': [], '/etc/subgid': []}
    # Check mode (with --diff): says it would create the account, creates nothing.
    rc, out, recap, _result = account_world(check=True)
    assert rc == 0 and '+%s (new)' % ACCOUNT in out, out[-3000:]
    with pytest.raises(KeyError):
        pwd.getpwnam(ACCOUNT)
    assert _lines(ACCOUNT) == before
    rc, out, recap, result = account_world()
    assert rc == 0, out[-3000:]
    uid = pwd.getpwnam(ACCOUNT).pw_uid
    sock = '/run/user/%d/podman/podman.sock' % uid
    # Ranges added to both files, the same free range, and podman system migrate said.
    lines = _lines(ACCOUNT)
    assert len(lines['/etc/subuid']) == 1 and lines['/etc/subuid'] == lines['/etc/subgid'], lines
    assert lines['/etc/subuid'][0].endswith(':65536')
    assert result['subids']['/etc/subuid']['added'] is True and result['migrated'] is True
    assert any('podman system migrate' in a for a in result['actions'])
    assert result['docker_host'] == 'unix://' + sock and result['socket'] == 'supervised'
    assert 'not restarted after a crash or a reboot; run the role again, or use systemd' in result['supervision']
    runtime = os.stat('/run/user/%d' % uid)
    assert (oct(runtime.st_mode & 0o777), runtime.st_uid) == ('0o700', uid)
    pid = result['service']['pid']
    pid_file = result['service']['pid_file']
    assert int(open(pid_file).read()) == pid and oct(os.stat(pid_file).st_mode & 0o777) == '0o600'
    # The subreaper is root's; the service under it runs as the account.
    assert _uid_of(pid) == 0
    service = [child for child in _children(pid) if 'podman system service' in _cmdline(child)]
    assert len(service) == 1 and _uid_of(service[0]) == uid, _children(pid)
    # The socket answers, and libpod says rootless.
    assert _get(sock, '/_ping') == (200, b'OK')
    status, body = _get(sock, '/v4.0.0/libpod/info')
    assert status == 200, body[:500]
    info = json.loads(body)
    assert info['host']['security']['rootless'] is True, info['host']['security']
    # The same run again changes nothing: same pid, same lines.
    rc, out, recap, again = account_world()
    assert rc == 0 and recap['changed'] == 0 and again['changed'] is False, out[-3000:]
    assert again['service']['pid'] == pid and again['actions'] == [] and _lines(ACCOUNT) == lines

    # A symlinked containers.conf of the account: refused, nothing changed (the running service kept).
    home = pwd.getpwnam(ACCOUNT).pw_dir
    conf_dir = os.path.join(home, '.config', 'containers')
    os.makedirs(conf_dir, exist_ok=True)
    conf = os.path.join(conf_dir, 'containers.conf')
    os.symlink('/etc/hostname', conf)
    try:
        rc, out, recap, refused = account_world()
        assert rc != 0 and '%s (account %s) is a symlink' % (conf, ACCOUNT) in out, out[-3000:]
        assert 'Nothing was changed' in out and refused is None
        assert _lines(ACCOUNT) == lines and int(open(pid_file).read()) == pid and _proc_state(pid) not in (None, 'Z')
        # absent: the recorded pid stopped, and so the service under it.
        rc, out, recap, gone = account_world(egress_podman_account_state='absent')
        assert rc == 0 and recap['changed'] == 1, out[-3000:]
        assert _proc_state(pid) in (None, 'Z') and _proc_state(service[0]) in (None, 'Z')
        assert _account_services(uid) == []
        assert not os.path.exists(pid_file) and _lines(ACCOUNT) == lines
        # With the link still there, present is refused before anything starts.
        rc, out, recap, refused = account_world()
        assert rc != 0 and 'is a symlink' in out and not os.path.exists(pid_file)
        with pytest.raises(OSError):
            _get(sock, '/_ping')
    finally:
        os.unlink(conf)
