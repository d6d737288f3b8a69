"""Agent network modes on the real kernel: the allowlist namespace and its proxy.

Needs root (network namespaces). Traffic goes only to a server this test starts on the
host's loopback and to the proxy's socket inside the namespace the test creates.

The relay and the ``llm`` worker run end to end as real processes in
``tests/unit/test_llm_agent.py``; the same inside a booted machine needs the
coordinator's relay hook (see docs/agents.md).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from cairn.proc import run
from cairn.proxy import Allowlist, AllowlistProxy, listen_in_netns

pytestmark = pytest.mark.skipif(
    os.getuid() != 0 or shutil.which("nsenter") is None,
    reason="network namespaces need root and nsenter",
)


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


@pytest.fixture
def namespace() -> Iterator[tuple[str, Path]]:
    from cairn.broker.netns import create_netns, remove_netns

    run_id = "flow_" + secrets.token_hex(16)
    try:
        path = create_netns(run_id)
        assert create_netns(run_id) == path  # idempotent
        yield run_id, path
    finally:
        remove_netns(run_id)
    assert not path.exists()


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
def direct(host, port):
    socket.create_connection((host, port), timeout=3).close()
    return "connected"
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
attempt("direct_loopback", lambda: direct("127.0.0.1", server))
attempt("direct_outside", lambda: direct("192.0.2.1", 80))
attempt("links", lambda: sorted(l.split(":")[0].strip()
                                for l in open("/proc/net/dev").readlines()[2:]))
attempt("allowed", lambda: via_proxy("allowed.test"))
attempt("denied", lambda: via_proxy("denied.test"))
attempt("allowed_tunnel", lambda: tunnel("allowed.test"))
attempt("denied_tunnel", lambda: tunnel("denied.test"))
print(json.dumps(out))
"""


def test_allowlist_namespace_reaches_only_reviewed_domains_through_the_proxy(
    namespace: tuple[str, Path], server: int
) -> None:
    _run_id, path = namespace
    listener = listen_in_netns(path, "127.0.0.1", 0)
    proxy_port = int(listener.getsockname()[1])
    names = {"allowed.test": "127.0.0.1", "denied.test": "127.0.0.1"}
    proxy = AllowlistProxy(
        listener, Allowlist([f"allowed.test:{server}"]),
        resolve=lambda host, port: (names[host], port),
    ).start()
    try:
        proc = run(["nsenter", f"--net={path}", sys.executable, "-I", "-c", CLIENT,
                    str(proxy_port), str(server)], timeout=60)
    finally:
        proxy.close()
    out = json.loads(proc.stdout)
    assert out["links"] == ["lo"]
    # Nothing of the host is reachable from inside, not even its loopback server.
    assert out["direct_loopback"] == "error ConnectionRefusedError"
    assert out["direct_outside"].startswith("error ")
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
