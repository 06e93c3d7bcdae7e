# -*- coding: utf-8 -*-
"""The host side of the gateway's root control socket (issue 43 item 3): where it is, its folder, and when the
job-network API falls back to ``docker exec`` (no socket answers) or stops (the gateway refused)."""

import json
import os
import socket
import threading

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import gateway as G


def test_the_control_folder_is_a_bind_of_the_deployment_folder_per_gateway():
    s = G.desired('/d', 'up', 'proxy', name='gw1')
    assert s['binds'][os.path.join(os.path.realpath('/d'), 'gateway-control', 'gw1')] == dict(
        bind=G.CONTROL_DIR, mode='rw')


def test_prepare_control_dir_makes_0700_and_refuses_a_link(tmp_path):
    folder = str(tmp_path / 'gateway-control' / 'gw1')
    G.prepare_control_dir(folder)
    assert oct(os.stat(folder).st_mode & 0o777) == '0o700'
    assert oct(os.stat(os.path.dirname(folder)).st_mode & 0o777) == '0o700'
    os.chmod(folder, 0o755)
    G.prepare_control_dir(folder)  # widened: narrowed again
    assert oct(os.stat(folder).st_mode & 0o777) == '0o700'
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir()
    os.symlink(str(elsewhere), str(tmp_path / 'gateway-control' / 'gw2'))
    with pytest.raises(G.GatewayError, match='is not a folder of uid'):
        G.prepare_control_dir(str(tmp_path / 'gateway-control' / 'gw2'))


@pytest.mark.parametrize('path', [None, '', '/nonexistent/control.sock', '/' + 'x' * 120 + '/control.sock',
                                  '/nonexistent/' + 'x' * 120 + '.sock'])
def test_no_socket_answers_means_the_exec_path(path):
    assert G.control_request(path, 'gw', dict(op='forget', network='n')) is None


def test_a_socket_nobody_listens_on_means_the_exec_path(tmp_path):
    path = str(tmp_path / 's')
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(path)
    dead.close()  # the file stays, nobody listens (a gateway whose control process is gone)
    assert G.control_request(path, 'gw', dict(op='forget', network='n')) is None


def _server(tmp_path, answer):
    path = str(tmp_path / 'c.sock')
    srv = socket.socket(socket.AF_UNIX)
    if len(path) > G.SUN_PATH_MAX:  # bind through the folder's descriptor, as the client connects
        folder = os.open(str(tmp_path), os.O_PATH | os.O_DIRECTORY)
        try:
            srv.bind('/proc/self/fd/%d/c.sock' % folder)
        finally:
            os.close(folder)
    else:
        srv.bind(path)
    srv.listen(1)
    got = []

    def run():
        conn, _a = srv.accept()
        with conn:
            data = b''
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            got.append(json.loads(data))
            conn.sendall(answer)
        srv.close()
    thread = threading.Thread(target=run)
    thread.start()
    return path, got, thread


@pytest.mark.parametrize('answer, words', [
    (b'{"ok": false, "error": "config keys [], wanted exactly [...]"}', 'The gateway gw refused forget: config keys'),
    (b'', 'gave no answer on its control socket'),
    (b'[1]', 'gave no answer on its control socket'),
    (b'{"ok": "yes"}', 'refused forget'),
])
def test_a_refusal_or_no_answer_stops_with_the_gateways_words(tmp_path, answer, words):
    path, got, thread = _server(tmp_path, answer)
    with pytest.raises(G.GatewayError, match=words):
        G.control_request(path, 'gw', dict(op='forget', network='n'), timeout=10)
    thread.join(10)
    assert got == [dict(op='forget', network='n')]


def test_an_answer_is_returned(tmp_path):
    path, got, thread = _server(tmp_path, b'{"ok": true, "networks": ["n"]}')
    assert G.control_request(path, 'gw', dict(op='forget', network='n'), timeout=10) == {'ok': True, 'networks': ['n']}
    thread.join(10)


def test_a_socket_whose_path_is_longer_than_sun_path_is_reached(tmp_path):
    """A deployment folder deep in the file system (pytest-xdist's tmp paths made one): the socket is still used,
    through its folder's descriptor, never silently the docker exec path."""
    deep = tmp_path / ('d' * 60) / ('e' * 60)
    deep.mkdir(parents=True)
    path, got, thread = _server(deep, b'{"ok": true, "networks": ["n"]}')
    assert len(path) > G.SUN_PATH_MAX
    assert G.control_request(path, 'gw', dict(op='forget', network='n'), timeout=10) == {'ok': True, 'networks': ['n']}
    thread.join(10)
    assert got == [dict(op='forget', network='n')]


def test_a_request_too_large_is_not_sent(tmp_path):
    with pytest.raises(G.GatewayError, match='more than its control socket takes'):
        G.control_request(str(tmp_path / 's'), 'gw', dict(op='forget', network='x' * G.CONTROL_LIMIT))
