"""The gateway's root control socket (roles/proxy/files/gateway/gatewayd ``control``, issue 43 item 3).

The request parser as a table (every refusal names what is wrong, and nothing is run), and one connection
handled end to end on a real Unix socket: a peer of another uid is refused before a byte is read, a
malformed request is answered with its error, a good one is run and answered.
"""

import importlib.machinery
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PROGRAM = os.path.join(ROOT, 'roles', 'proxy', 'files', 'gateway', 'gatewayd')


def _load_gatewayd():
    # Loaded here, not imported from test_gatewayd: ansible-test units cannot import one test module from another.
    loader = importlib.machinery.SourceFileLoader('pi_egress_gatewayd_control', PROGRAM)
    spec = importlib.util.spec_from_loader('pi_egress_gatewayd_control', loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


GW = _load_gatewayd()

GOOD = dict(network='pi-job-a1-net', job_id='a1', subnet='10.99.0.0/26', gateway='10.99.0.2',
            vrange='10.99.0.32/27', proxy='10.99.0.3', proxy_port=3128,
            optins={'tcp': {'22': ['git.forge.test']}, 'udp': {'123': True}}, policy='/p/config.yaml',
            written=1700000000)


def _req(**config_changes):
    conf = dict(GOOD)
    for key, value in config_changes.items():
        if value is KeyError:
            conf.pop(key)
        else:
            conf[key] = value
    return json.dumps(dict(op='configure', config=conf)).encode()


REFUSED = [
    (b'', 'not JSON'),
    (b'\xff\xfe', 'not UTF-8'),
    (b'[]', 'not an object'),
    (b'{"op": "apply"}', "op 'apply' is not configure or forget"),
    (b'{"op": "forget", "op": "configure"}', "duplicate key 'op'"),
    (b'{"op": "forget"}', 'forget takes exactly op, network'),
    (b'{"op": "forget", "network": "../../etc/passwd"}', 'is not a network name'),
    (b'{"op": "forget", "network": ".hidden"}', 'is not a network name'),
    (b'{"op": "forget", "network": "a/b"}', 'is not a network name'),
    (b'{"op": "forget", "network": "x", "extra": 1}', 'forget takes exactly op, network'),
    (b'{"op": "configure", "config": NaN}', 'NaN is not JSON'),
    (b'{"op": "configure", "config": []}', 'config is not an object'),
    (b'{"op": "configure", "config": {}, "x": 1}', 'configure takes exactly op, config'),
    (_req(network='pi-job/../x'), 'is not a network name'),
    (_req(network=7), 'is not a network name'),
    (_req(extra=1), 'config keys'),
    (_req(written=KeyError), 'config keys'),
    (_req(subnet='10.99.0.0/33'), 'config:'),
    (_req(subnet='fd00::/64'), 'config:'),
    (_req(gateway='10.98.0.2'), 'must be in 10.99.0.0/26'),
    (_req(gateway='10.99.0.40'), 'outside the per-name range'),
    (_req(vrange='10.98.0.32/27'), 'must be in'),
    (_req(proxy='squid.test'), 'config:'),
    (_req(proxy_port=True), 'proxy_port is not a port'),
    (_req(proxy_port=70000), 'proxy_port is not a port'),
    (_req(proxy_port='3128'), 'proxy_port is not a port'),
    (_req(written=-1), 'written is not'),
    (_req(written=1.5), 'written is not'),
    (_req(policy=['x']), 'policy is not null'),
    (_req(job_id='x' * 300), 'job_id is not text'),
    (_req(optins={'sctp': {}}), 'optins is not an object of tcp/udp'),
    (_req(optins={'tcp': []}), 'optins.tcp is not an object'),
    (_req(optins={'tcp': {'0': True}}), 'is not a port'),
    (_req(optins={'tcp': {'022': True}}), 'is not a port'),
    (_req(optins={'tcp': {'２２': True}}), 'is not a port'),
    (_req(optins={'tcp': {'22': False}}), 'is not true or a list of host names'),
    (_req(optins={'tcp': {'22': []}}), 'is not true or a list of host names'),
    (_req(optins={'tcp': {'22': ['a.test\n']}}), 'is not true or a list of host names'),
    (_req(optins={'tcp': {'22': ['a b.test']}}), 'is not true or a list of host names'),
    (b'{"op": "forget", "network": "' + b'a' * GW.CONTROL_LIMIT + b'"}', 'larger than 65536 bytes'),
]


@pytest.mark.parametrize('data,words', REFUSED, ids=[str(i) for i in range(len(REFUSED))])
def test_parse_control_refuses(data, words):
    with pytest.raises(GW.ControlError) as info:
        GW.parse_control(data)
    assert words in str(info.value)


def test_parse_control_takes_what_the_job_network_api_writes():
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import transparent as tp
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import optins as O
    conf = tp.config('a1', 'pi-job-a1-net', '10.99.0.0/26', '10.99.0.2', '10.99.0.3', 3128, O.deny_all())
    op, arg = GW.parse_control(json.dumps(dict(op='configure', config=conf)).encode())
    assert (op, arg) == ('configure', conf)
    assert GW.parse_control(_req()) == ('configure', GOOD)
    assert GW.parse_control(b'{"op": "forget", "network": "pi-job-a1-net"}') == ('forget', 'pi-job-a1-net')


def _serve_one(tmp_path, allowed_uid):
    """A real listening Unix socket; handle_control on the first connection; what was run."""
    path = str(tmp_path / 'c.sock')
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    os.chmod(str(tmp_path), 0o755)
    os.chmod(path, 0o666)
    server.listen(1)
    return server, path


def _exchange(server, path, payload, allowed_uid, as_uid=None):
    ran = []
    # the send may break when the server refuses first (it answers, then closes): the answer is read anyway
    client_code = ('import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\n'
                   'try:\n s.sendall(sys.stdin.buffer.read())\n s.shutdown(socket.SHUT_WR)\nexcept OSError:\n pass\n'
                   'print(s.recv(65536).decode())\n')
    python = sys.executable if as_uid is None else (shutil.which('python3', path='/usr/bin:/bin') or sys.executable)
    proc = subprocess.Popen([python, '-c', client_code, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            preexec_fn=(lambda: os.setuid(as_uid)) if as_uid is not None else None)
    proc.stdin.write(payload)
    proc.stdin.close()
    conn, _addr = server.accept()
    with conn:
        GW.handle_control(conn, allowed_uid=allowed_uid, run=lambda op, arg: ran.append((op, arg)) or {'networks': []})
    out = proc.stdout.read().decode()
    assert proc.wait(timeout=10) == 0
    return json.loads(out), ran


def test_handle_control_on_a_real_socket(tmp_path):
    server, path = _serve_one(tmp_path, os.geteuid())
    with server:
        reply, ran = _exchange(server, path, b'{"op": "forget", "network": "pi-job-a1-net"}', os.geteuid())
        assert reply == {'ok': True, 'networks': []} and ran == [('forget', 'pi-job-a1-net')]
        reply, ran = _exchange(server, path, b'{"op": "forget", "network": "../x"}', os.geteuid())
        assert reply['ok'] is False and 'is not a network name' in reply['error'] and ran == []
        # the same good request from a peer of another uid: refused by its credentials, nothing run
        reply, ran = _exchange(server, path, b'{"op": "forget", "network": "pi-job-a1-net"}', os.geteuid() + 4242)
        assert reply['ok'] is False and 'only uid %d may use the control socket' % (os.geteuid() + 4242) in \
            reply['error'] and ran == []


@pytest.mark.skipif(os.geteuid() != 0, reason='needs root to run a peer as another user')
def test_handle_control_refuses_a_non_root_peer():
    folder = tempfile.mkdtemp(prefix='pigw-ctl-', dir='/tmp')  # a path the other user can reach
    try:
        import pathlib
        server, path = _serve_one(pathlib.Path(folder), 0)
        with server:
            reply, ran = _exchange(server, path, b'{"op": "forget", "network": "pi-job-a1-net"}', 0, as_uid=65534)
    finally:
        shutil.rmtree(folder)
    assert reply == {'ok': False, 'error': 'refused: the peer is uid 65534, only uid 0 may use the control socket'}
    assert ran == []


def test_run_control_failure_is_answered_not_raised(tmp_path):
    server, path = _serve_one(tmp_path, os.geteuid())

    def failing(op, arg):
        raise SystemExit('iptables-restore failed (1): boom')
    with server:
        proc = subprocess.Popen([sys.executable, '-c', 'import socket,sys\ns=socket.socket(socket.AF_UNIX)\n'
                                 's.connect(sys.argv[1])\ns.sendall(b\'{"op":"forget","network":"n1"}\')\n'
                                 's.shutdown(socket.SHUT_WR)\nprint(s.recv(9999).decode())', path],
                                stdout=subprocess.PIPE)
        conn, _addr = server.accept()
        with conn:
            GW.handle_control(conn, allowed_uid=os.geteuid(), run=failing)
        reply = json.loads(proc.stdout.read().decode())
        assert proc.wait(timeout=10) == 0
    assert reply == {'ok': False, 'error': 'iptables-restore failed (1): boom'}
