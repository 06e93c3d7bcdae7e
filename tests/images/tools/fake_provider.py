"""Fake model provider for the credential tests: HTTPS under real-looking names, recording what it received.

It makes its own test CA and one server certificate naming every host given (--name, repeatable), writes
the CA certificate to <dir>/ca.pem (the interceptor checks the provider against it), and answers HTTPS on
443. Every request is appended as one JSON line to <dir>/requests.jsonl: method, Host, path and every
header as received (so a test can assert which credential value reached the provider, and that a refused
request reached nothing). The answer is 200 with a JSON body echoing the x-api-key and Authorization
values received and the same values in X-Echo-* headers, so a test can check the interceptor redacts a
secret the provider sends back. With ``--require-key <sha256>`` (repeatable), ``/v1/models`` answers 401
unless the key it received (x-api-key, the Bearer token, or the basic password) hashes to one of them, as a
real provider refuses a wrong key (the doctor's credential canary). ``GET /bytes/<n>`` answers n bytes (at
most 64 MiB) and is not recorded (benchmarks/credentials.py). Prints "fake provider ready" once the port accepts.
"""
import argparse
import base64
import binascii
import hashlib
import json
import os
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()


def make_certs(folder, names):
    def run(*argv):
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ca_key, ca = os.path.join(folder, 'ca-key.pem'), os.path.join(folder, 'ca.pem')
    run('openssl', 'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '2', '-subj', '/CN=fake provider test CA',
        '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign',
        '-keyout', ca_key, '-out', ca)
    key, csr, cert = (os.path.join(folder, n) for n in ('key.pem', 'server.csr', 'cert.pem'))
    run('openssl', 'req', '-newkey', 'rsa:2048', '-nodes', '-subj', '/CN=%s' % names[0], '-keyout', key, '-out', csr)
    ext = os.path.join(folder, 'ext.cnf')
    with open(ext, 'w') as handle:
        handle.write('subjectAltName=%s\nextendedKeyUsage=serverAuth\n' % ','.join('DNS:%s' % n for n in names))
    run('openssl', 'x509', '-req', '-in', csr, '-CA', ca, '-CAkey', ca_key, '-CAcreateserial', '-days', '2',
        '-extfile', ext, '-out', cert)
    return cert, key


def received_keys(headers):
    """Every key value the request carries: x-api-key, a Bearer token, a basic password."""
    keys = [headers.get('x-api-key') or '']
    auth = headers.get('Authorization') or ''
    scheme, _sep, value = auth.partition(' ')
    if scheme.lower() == 'bearer':
        keys.append(value.strip())
    elif scheme.lower() == 'basic':
        try:
            keys.append(base64.b64decode(value.strip()).decode('latin-1').partition(':')[2])
        except (binascii.Error, ValueError):
            pass
    return [k for k in keys if k]


def make_handler(log_path, required=()):
    class Handler(BaseHTTPRequestHandler):
        server_version = 'fake-provider/1'
        protocol_version = 'HTTP/1.1'

        def _answer(self):
            length = int(self.headers.get('Content-Length') or 0)
            body = self.rfile.read(length) if length else b''
            if self.path.startswith('/bytes/'):   # the benchmark's download: N bytes, not recorded
                size = min(int(self.path.split('/')[2] or 0), 64 * 1024 * 1024)
                self.send_response(200)
                self.send_header('Content-Type', 'application/octet-stream')
                self.send_header('Content-Length', str(size))
                self.end_headers()
                chunk = b'x' * 65536
                while size > 0:
                    self.wfile.write(chunk[:size])
                    size -= len(chunk)
                return
            record = dict(method=self.command, host=self.headers.get('Host', ''), path=self.path,
                          headers=[[k, v] for k, v in self.headers.items()], body=body.decode('latin-1'))
            with LOCK, open(log_path, 'a') as handle:
                handle.write(json.dumps(record) + '\n')
            if required and self.path.split('?')[0] == '/v1/models' and not any(
                    hashlib.sha256(k.encode('latin-1')).hexdigest() in required for k in received_keys(self.headers)):
                data = b'{"error": "invalid x-api-key"}'
                self.send_response(401)
                self.send_header('Content-Type', 'application/json')
                self.send_header('Content-Length', str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            echo = {'x-api-key': self.headers.get('x-api-key', ''),
                    'authorization': self.headers.get('Authorization', ''), 'host': self.headers.get('Host', '')}
            data = json.dumps({'echo': echo}).encode()
            self.send_response(200)
            self.send_header('Content-Type', 'application/json')
            self.send_header('Content-Length', str(len(data)))
            self.send_header('X-Echo-Api-Key', echo['x-api-key'])
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_TRACE = _answer

        def log_message(self, fmt, *args):
            return

    return Handler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--name', action='append', required=True)
    parser.add_argument('--dir', default='/tmp/fake-provider')
    parser.add_argument('--require-key', action='append', default=[], help='sha256 of a key /v1/models accepts')
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    cert, key = make_certs(args.dir, args.name)
    handler = make_handler(os.path.join(args.dir, 'requests.jsonl'), frozenset(args.require_key))
    server = ThreadingHTTPServer(('0.0.0.0', 443), handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    print('fake provider ready', flush=True)
    server.serve_forever()


if __name__ == '__main__':
    main()
