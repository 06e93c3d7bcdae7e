"""Fake upstream for the egress tests: answers like a provider.

HTTPS (self-signed) on 443 and 8443, plain HTTP on 80 and 8080, and any
extra ports given with --http / --https; --banner PORT answers each TCP connection with an
SSH-style banner (a fake sshd), --udp PORT answers each datagram (a fake NTP server), --dns logs
every DNS query it gets and answers NXDOMAIN (the resolver outside a job network); on IPv6 and
IPv4 when the container has IPv6. Every answer is a 401 with a JSON
body naming the Host header and the port, so a test can tell which server
answered; GET /v1/models answers 200 with a model list (a model server).
Plain HTTP on 8931 is a streamable HTTP MCP server instead: POST /mcp answers a
JSON-RPC result, GET /mcp 405 (no event stream), anything else 404, so it serves
no /v1/models (the doctor's MCP server endpoint, issue 31).
"""
import argparse
import json
import os
import socket
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


MCP_PORT = 8931


def mcp_answer(command, path, request):
    """(code, body) of the fake streamable HTTP MCP server."""
    if path.split('?', 1)[0] != '/mcp':
        return 404, {'error': 'not found'}
    if command != 'POST':
        return 405, {'error': 'this server has no event stream; POST JSON-RPC to /mcp'}
    try:
        call = json.loads(request or b'{}')
    except ValueError:
        return 400, {'jsonrpc': '2.0', 'id': None, 'error': {'code': -32700, 'message': 'parse error'}}
    return 200, {'jsonrpc': '2.0', 'id': call.get('id'),
                 'result': {'protocolVersion': '2025-03-26', 'serverInfo': {'name': 'fake-mcp', 'version': '1'},
                            'capabilities': {}}}


def make_handler(port, scheme):
    class Handler(BaseHTTPRequestHandler):
        server_version = 'fake-upstream/1'

        def _answer(self):
            if port == MCP_PORT:
                length = int(self.headers.get('Content-Length') or 0)
                code, body = mcp_answer(self.command, self.path, self.rfile.read(length) if length else b'')
            elif self.path.startswith('/v1/models'):
                code, body = 200, {'object': 'list', 'data': [{'id': 'fake-model'}]}
            else:
                code, body = 401, {'error': 'unauthenticated'}
            body.update({'host': self.headers.get('Host', ''), 'port': port, 'scheme': scheme})
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header('Content-Type', 'application/json')
            self.send_header('Content-Length', str(len(data)))
            self.send_header('X-Fake-Upstream', '%s:%d' % (scheme, port))
            self.end_headers()
            if self.command != 'HEAD':
                self.wfile.write(data)

        do_GET = do_POST = do_HEAD = _answer

        def log_message(self, fmt, *args):
            print('%s:%d %s' % (scheme, port, fmt % args), flush=True)

    return Handler


class DualStackServer(ThreadingHTTPServer):
    """IPv6 and IPv4 on one socket (an IPv6 network's tests reach the same ports)."""
    address_family = socket.AF_INET6

    def server_bind(self):
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


# How long one connection may take to finish its TLS handshake before it is dropped.
HANDSHAKE_TIMEOUT_S = 20


class TLSMixin(object):
    """The TLS handshake in the connection's own thread, bounded, as a real server does it.

    Wrapping the listening socket would run every handshake inside accept(), on the one thread that
    serves the port: a single peer that connects and sends nothing (a spare connection, a probe
    cut off half way) would stall every later connection to the port until it closed, and a
    probe behind it would see no answer at all.
    """
    tls_context = None

    def finish_request(self, request, client_address):
        request.settimeout(HANDSHAKE_TIMEOUT_S)
        try:
            conn = self.tls_context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as exc:
            print('tls handshake from %s failed: %s' % (client_address[0], exc), flush=True)
            return
        try:
            conn.settimeout(None)
            super().finish_request(conn, client_address)
        finally:
            conn.close()


class TLSDualStackServer(TLSMixin, DualStackServer):
    pass


class TLSServer(TLSMixin, ThreadingHTTPServer):
    pass


def bind(port, tls, certdir):
    """Bind the listening socket now, so "ready" is printed only once every port accepts."""
    handler = make_handler(port, 'https' if tls else 'http')
    try:
        httpd = (TLSDualStackServer if tls else DualStackServer)(('::', port), handler)
    except OSError:  # IPv6 is off in this container (no IPv6 network): IPv4 only, as before
        httpd = (TLSServer if tls else ThreadingHTTPServer)(('', port), handler)
    if tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(os.path.join(certdir, 'cert.pem'), os.path.join(certdir, 'key.pem'))
        httpd.tls_context = ctx
    return httpd


def banner(port):
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(('', port))
    srv.listen(16)

    def run():
        while True:
            conn, peer = srv.accept()
            print('banner:%d from %s' % (port, peer[0]), flush=True)
            try:
                conn.sendall(b'SSH-2.0-pi-fake-sshd-%d\r\n' % port)
            finally:
                conn.close()
    return run


def udp(port):
    srv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    srv.bind(('', port))

    def run():
        while True:
            data, peer = srv.recvfrom(2048)
            print('udp:%d from %s' % (port, peer[0]), flush=True)
            srv.sendto(b'pi-fake-udp-%d:' % port + data[:64], peer)
    return run


def dns():
    srv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    srv.bind(('', 53))

    def run():
        while True:
            data, peer = srv.recvfrom(2048)
            labels, pos = [], 12
            while pos < len(data) and data[pos]:
                labels.append(data[pos + 1:pos + 1 + data[pos]].decode('ascii', 'replace'))
                pos += 1 + data[pos]
            print('dns query %s from %s' % ('.'.join(labels), peer[0]), flush=True)
            if len(data) > 12:
                srv.sendto(data[:2] + bytes([0x81, 0x83]) + data[4:6] + bytes(6) + data[12:pos + 5], peer)
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--http', type=int, action='append', default=[])
    ap.add_argument('--https', type=int, action='append', default=[])
    ap.add_argument('--banner', type=int, action='append', default=[])
    ap.add_argument('--udp', type=int, action='append', default=[])
    ap.add_argument('--dns', action='store_true')
    args = ap.parse_args()
    extra = [banner(p) for p in args.banner] + [udp(p) for p in args.udp] + ([dns()] if args.dns else [])
    for run in extra:
        threading.Thread(target=run, daemon=True).start()
    certdir = '/tmp/fake-upstream'
    os.makedirs(certdir, exist_ok=True)
    subprocess.run(['openssl', 'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '2',
                    '-subj', '/CN=fake-upstream.test', '-keyout', os.path.join(certdir, 'key.pem'),
                    '-out', os.path.join(certdir, 'cert.pem')], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    servers = [(p, False) for p in [80, 8080, MCP_PORT] + args.http] + [(p, True) for p in [443, 8443] + args.https]
    bound = [bind(p, tls, certdir) for p, tls in servers]
    threads = [threading.Thread(target=httpd.serve_forever, daemon=True) for httpd in bound]
    for t in threads:
        t.start()
    print('fake upstream ready on %s' % sorted(p for p, _tls in servers), flush=True)
    for t in threads:
        t.join()


if __name__ == '__main__':
    main()
