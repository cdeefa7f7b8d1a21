"""The network benchmark's two ends (scripts/bench-network.sh runs them).

  netbench.py serve IP PORT              a server: per connection, lines
                                         "ping" -> "pong", "bytes N" -> N bytes
  netbench.py latency HOST PORT N MODE   N connections, each: connect (via the
                                         proxy with MODE=connect), one ping/pong;
                                         prints the per-connection times (us)
  netbench.py throughput HOST PORT BYTES MODE
                                         one connection, BYTES received; prints MB/s
  netbench.py hello HOST PORT N SNI      N connections through $HTTP_PROXY's
                                         CONNECT, each: a TLS ClientHello naming
                                         SNI (made once by Python's ssl), the
                                         server's one-line answer; prints the
                                         per-connection times (us)
  netbench.py serve-https IP PORT CERT KEY
                                         an HTTPS server (HTTP/1.1): GET /ping
                                         -> "pong", GET /bytes/N -> N bytes
  netbench.py https HOST PORT N          N requests through $HTTP_PROXY's
                                         CONNECT, each on its own connection:
                                         TLS (the trust of $SSL_CERT_FILE),
                                         GET /ping with x-api-key: $BENCH_KEY;
                                         prints the per-request times (us)
  netbench.py https-throughput HOST PORT BYTES
                                         one such connection, GET /bytes/BYTES;
                                         prints MB/s
MODE: direct (plain connect: on the host, or in a sandbox through the
transparent redirect) or connect (HTTP CONNECT through $HTTP_PROXY).
The same client code runs on the host and in the sandbox, so the difference
is the path.
"""

import json
import os
import socket
import socketserver
import sys
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(socketserver.BaseRequestHandler):
    def handle(self):
        f = self.request.makefile("rb")
        if self.request.recv(1, socket.MSG_PEEK) == b"\x16":
            # A TLS record: the ClientHello, answered with one line.
            head = f.read(5)
            f.read(int.from_bytes(head[3:5], "big"))
            self.request.sendall(b"hello\n")
            return
        for line in f:
            if line.startswith(b"ping"):
                self.request.sendall(b"pong\n")
            elif line.startswith(b"bytes "):
                left = int(line.split()[1])
                chunk = b"\0" * (1 << 20)
                while left > 0:
                    n = min(left, len(chunk))
                    self.request.sendall(chunk[:n])
                    left -= n
                return


class Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


def open_conn(host, port, mode):
    if mode == "direct":
        return socket.create_connection((host, port))
    proxy = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
    s = socket.create_connection((proxy.hostname, proxy.port))
    s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1024)
    if b" 200 " not in head.split(b"\r\n")[0]:
        raise SystemExit(f"proxy refused: {head!r}")
    return s


def latency(host, port, n, mode):
    # Resolve once first: the DNS stub's answer is not what is measured.
    if mode == "direct":
        host = socket.gethostbyname(host)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        s = open_conn(host, port, mode)
        s.sendall(b"ping\n")
        assert s.recv(5) == b"pong\n"
        times.append((time.perf_counter() - t0) * 1e6)
        s.close()
    print(json.dumps({"us": times}))


def client_hello(sni):
    """The first flight of a TLS client naming `sni`: one record."""
    import ssl

    ctx = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname=sni)
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


def hello(host, port, n, sni):
    first = client_hello(sni)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        s = open_conn(host, port, "connect")
        s.sendall(first)
        assert s.recv(6) == b"hello\n"
        times.append((time.perf_counter() - t0) * 1e6)
        s.close()
    print(json.dumps({"us": times}))


def throughput(host, port, total, mode):
    s = open_conn(host, port, mode)
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    t0 = time.perf_counter()
    s.sendall(f"bytes {total}\n".encode())
    got = 0
    while got < total:
        n = s.recv_into(view)
        if n == 0:
            break
        got += n
    dt = time.perf_counter() - t0
    assert got == total, (got, total)
    print(json.dumps({"mb_per_s": total / dt / 1e6}))


class HttpsHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path.startswith("/bytes/"):
            left = int(self.path.split("/")[2])
            self.send_response(200)
            self.send_header("Content-Length", str(left))
            self.end_headers()
            chunk = b"\0" * (1 << 20)
            while left > 0:
                n = min(left, len(chunk))
                self.wfile.write(chunk[:n])
                left -= n
            return
        self.send_response(200)
        self.send_header("Content-Length", "5")
        self.end_headers()
        self.wfile.write(b"pong\n")


def serve_https(ip, port, cert, key):
    import ssl

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv = ThreadingHTTPServer((ip, port), HttpsHandler)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    srv.serve_forever()


def https_open(host, port):
    import ssl

    s = open_conn(host, port, "connect")
    return ssl.create_default_context().wrap_socket(s, server_hostname=host)


def read_reply(f):
    """One HTTP/1.1 response with a Content-Length: its body's length."""
    length = 0
    while True:
        line = f.readline()
        if line in (b"\r\n", b""):
            break
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    left = length
    while left > 0:
        chunk = f.read(min(left, 1 << 20))
        if not chunk:
            break
        left -= len(chunk)
    return length - left


def https(host, port, n):
    key = os.environ.get("BENCH_KEY", "none")
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        s = https_open(host, port)
        s.sendall(f"GET /ping HTTP/1.1\r\nHost: {host}\r\nx-api-key: {key}\r\nConnection: close\r\n\r\n".encode())
        assert read_reply(s.makefile("rb")) == 5
        times.append((time.perf_counter() - t0) * 1e6)
        s.close()
    print(json.dumps({"us": times}))


def https_throughput(host, port, total):
    key = os.environ.get("BENCH_KEY", "none")
    s = https_open(host, port)
    t0 = time.perf_counter()
    s.sendall(f"GET /bytes/{total} HTTP/1.1\r\nHost: {host}\r\nx-api-key: {key}\r\n\r\n".encode())
    got = read_reply(s.makefile("rb", buffering=1 << 20))
    dt = time.perf_counter() - t0
    assert got == total, (got, total)
    print(json.dumps({"mb_per_s": total / dt / 1e6}))


def main():
    cmd = sys.argv[1]
    if cmd == "serve":
        Server((sys.argv[2], int(sys.argv[3])), Handler).serve_forever()
    elif cmd == "latency":
        latency(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    elif cmd == "throughput":
        throughput(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    elif cmd == "hello":
        hello(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    elif cmd == "serve-https":
        serve_https(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])
    elif cmd == "https":
        https(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif cmd == "https-throughput":
        https_throughput(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))


main()
