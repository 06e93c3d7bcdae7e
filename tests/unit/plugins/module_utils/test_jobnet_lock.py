"""The job-network lock (_jobnet_lock): one flock per daemon, dropped when its holder dies."""

import os
import signal
import subprocess
import sys
import threading

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import lock

from ansible_collections.pi_dispatch.egress.tests.unit.plugins.module_utils.fakes import EngineClient as _Client

HOLDER = r'''
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o666)
fcntl.flock(fd, fcntl.LOCK_EX)
sys.stdout.write("held\n")
sys.stdout.flush()
time.sleep(60)
'''


class _Adapter(object):
    def __init__(self, socket_path=None, ssh_host=None):
        self.socket_path, self.ssh_host = socket_path, ssh_host


class _Api(object):
    def __init__(self, base_url='http+docker://localhost', adapter=None):
        self.base_url, self._custom_adapter = base_url, adapter


def _holder(path):
    """A process (not this one) that holds the lock on ``path`` until it is killed."""
    proc = subprocess.Popen([sys.executable, '-c', HOLDER, path], stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b'held\n'
    return proc


def test_the_key_of_a_local_socket_is_its_inode_whatever_the_path(tmp_path):
    import socket
    sock_path = str(tmp_path / 'docker.sock')
    server = socket.socket(socket.AF_UNIX)
    server.bind(sock_path)
    os.symlink(sock_path, str(tmp_path / 'alias.sock'))
    try:
        one = lock.daemon_key(_Client(_Api(adapter=_Adapter(socket_path=sock_path))))
        two = lock.daemon_key(_Client(_Api(adapter=_Adapter(socket_path=str(tmp_path / 'alias.sock')))))
    finally:
        server.close()
    assert one == two and one.startswith('unix:')


@pytest.mark.parametrize('api, expected', [
    (_Api(base_url='tcp://engine.example:2376'), 'url:tcp://engine.example:2376'),
    (_Api(base_url='http+docker://ssh', adapter=_Adapter(ssh_host='ops@engine')), 'ssh:ops@engine'),
    (_Api(adapter=_Adapter(socket_path='/nonexistent/docker.sock')), 'unix:/nonexistent/docker.sock'),
])
def test_daemon_keys(api, expected):
    assert lock.daemon_key(_Client(api)) == expected


def test_two_daemons_have_two_locks(job_network_lock_dir):
    one = lock.lock_path('url:tcp://a:2376')
    two = lock.lock_path('url:tcp://b:2376')
    assert one != two and os.path.dirname(one) == job_network_lock_dir
    assert os.path.basename(one).startswith(lock.LOCK_PREFIX)


def test_the_lock_folder(monkeypatch):
    assert lock.lock_dir({'PI_EGRESS_LOCK_DIR': '/srv/locks'}) == '/srv/locks'
    monkeypatch.setattr(lock, 'LOCK_DIRS', ('/nonexistent-lock-dir',))
    assert lock.lock_dir({}) == __import__('tempfile').gettempdir()


def test_a_held_lock_makes_the_next_creator_wait_and_give_up_retryably():
    client = _Client(_Api(base_url='tcp://held:2376'))
    proc = _holder(lock.lock_path(lock.daemon_key(client)))
    try:
        with pytest.raises(lock.LockTimeout) as caught:
            with lock.held(client, wait=0.3):
                pytest.fail('the lock was taken while another process held it')
    finally:
        proc.kill()
        proc.wait()
    assert caught.value.retryable is True
    assert 'Nothing was created' in str(caught.value) and 'fuser' in str(caught.value)


def test_a_holder_killed_with_sigkill_leaves_the_lock_free():
    client = _Client(_Api(base_url='tcp://killed:2376'))
    proc = _holder(lock.lock_path(lock.daemon_key(client)))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with lock.held(client, wait=5) as token:
        assert token.generation == 0


def test_the_generation_is_raised_by_a_change_and_a_stale_memory_is_dropped():
    client = _Client(_Api(base_url='tcp://gen:2376'))
    mine, theirs = {}, {}
    with lock.held(client, mine) as token:
        assert not token.fresh                             # nothing known yet
        mine['subnets'] = 'book'
        mine[('family', 'p')] = 'picture'
        token.changed()
    assert mine['lock-generation'] == 1
    with lock.held(client, mine) as token:
        assert token.fresh and mine['subnets'] == 'book'   # nobody else changed the daemon: kept
    with lock.held(client, theirs) as token:               # another process creates
        token.changed()
    with lock.held(client, mine) as token:
        assert not token.fresh and token.generation == 2
    assert 'subnets' not in mine and ('family', 'p') not in mine and mine['lock-generation'] == 2


def test_threads_of_one_process_take_it_in_turn():
    client = _Client(_Api(base_url='tcp://threads:2376'))
    inside, most, errors = [0], [0], []
    guard = threading.Lock()

    def work():
        try:
            for _round in range(20):
                with lock.held(client, wait=30):
                    with guard:
                        inside[0] += 1
                        most[0] = max(most[0], inside[0])
                    with guard:
                        inside[0] -= 1
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == [] and most[0] == 1


def test_a_symlinked_lock_is_refused(tmp_path):
    client = _Client(_Api(base_url='tcp://link:2376'))
    path = lock.lock_path(lock.daemon_key(client))
    os.symlink(str(tmp_path / 'elsewhere'), path)
    with pytest.raises(lock.EngineError) as caught:
        with lock.held(client, wait=1):
            pass
    assert 'is a symlink' in str(caught.value) and not os.path.exists(str(tmp_path / 'elsewhere'))


def test_a_broken_state_reads_as_generation_zero():
    client = _Client(_Api(base_url='tcp://broken:2376'))
    with open(lock.lock_path(lock.daemon_key(client)), 'w') as handle:
        handle.write('{"generation": "x"')
    with lock.held(client, {}) as token:
        assert token.generation == 0
