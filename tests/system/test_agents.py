"""The allowlist proxy on real sockets: what it admits, tunnels and refuses.

Traffic goes only to a server this test starts on the host's loopback. The proxy inside
a run's namespace, reached from a real agent unit, is tested in a booted machine by
``tests/system/test_model_agents.py``.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from cairn.proc import run
from cairn.proxy import Allowlist, AllowlistProxy


class Hello(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        body = f"hello from {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def server() -> Iterator[int]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(httpd.server_address[1])
    finally:
        httpd.shutdown()
        httpd.server_close()


CLIENT = """\
import json, socket, sys, urllib.request, urllib.error
proxy, server = int(sys.argv[1]), int(sys.argv[2])
out = {}
def attempt(name, fn):
    try:
        out[name] = fn()
    except urllib.error.HTTPError as exc:
        out[name] = f"http {exc.code}"
    except OSError as exc:
        out[name] = f"error {type(exc).__name__}"
opener = urllib.request.build_opener(
    urllib.request.ProxyHandler({"http": f"http://127.0.0.1:{proxy}"}))
def via_proxy(host):
    return opener.open(f"http://{host}:{server}/x", timeout=10).read().decode()
def tunnel(host):
    s = socket.create_connection(("127.0.0.1", proxy), timeout=10)
    s.sendall(f"CONNECT {host}:{server} HTTP/1.1\\r\\nHost: {host}\\r\\n\\r\\n".encode())
    status = s.recv(1024).split(b"\\r\\n")[0].decode()
    if " 200 " not in status:
        return status
    s.sendall(b"GET /t HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n")
    data = b""
    while chunk := s.recv(4096):
        data += chunk
    return data.decode().split("\\r\\n\\r\\n", 1)[1]
attempt("allowed", lambda: via_proxy("allowed.test"))
attempt("denied", lambda: via_proxy("denied.test"))
attempt("allowed_tunnel", lambda: tunnel("allowed.test"))
attempt("denied_tunnel", lambda: tunnel("denied.test"))
print(json.dumps(out))
"""


def test_the_proxy_admits_only_reviewed_destinations(server: int) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    proxy_port = int(listener.getsockname()[1])
    names = {"allowed.test": "127.0.0.1", "denied.test": "127.0.0.1"}
    proxy = AllowlistProxy(
        listener, Allowlist([f"allowed.test:{server}"]),
        resolve=lambda host, port: (names[host], port),
    ).start()
    try:
        proc = run([sys.executable, "-I", "-c", CLIENT, str(proxy_port), str(server)],
                   timeout=60)
    finally:
        proxy.close()
    out = json.loads(proc.stdout)
    assert out["allowed"] == "hello from /x"
    assert out["denied"] == "http 403"
    assert out["allowed_tunnel"] == "hello from /t"
    assert out["denied_tunnel"] == "HTTP/1.1 403 Forbidden"
    assert sorted(proxy.refused) == [f"denied.test:{server}"] * 2


def test_allowlist_entries() -> None:
    allow = Allowlist(["pypi.org", "*.github.com", "Example.test:8443"])
    assert allow.admits("pypi.org", 443) and allow.admits("PYPI.org.", 80)
    assert not allow.admits("pypi.org", 22)
    assert not allow.admits("evil-pypi.org", 443)
    assert allow.admits("api.github.com", 443) and not allow.admits("github.com", 443)
    assert allow.admits("example.test", 8443) and not allow.admits("example.test", 443)
    assert not allow.admits("127.0.0.1", 80)


def test_the_proxy_exits_when_idle_but_not_while_a_connection_is_open() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    proxy = AllowlistProxy(listener, Allowlist([]))
    done = threading.Event()

    def serve() -> None:
        proxy.serve_forever(idle_exit=0.3)
        done.set()

    client = socket.create_connection(listener.getsockname()[:2], timeout=5)
    threading.Thread(target=serve, daemon=True).start()
    time.sleep(1.0)
    assert not done.is_set()  # a connection is open (waiting for its request head)
    client.close()
    assert done.wait(timeout=5)
    listener.close()
