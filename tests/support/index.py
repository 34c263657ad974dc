"""A real package index on loopback: PEP 503 HTML and PEP 691 JSON pages over http.server in a thread."""

from __future__ import annotations

import hashlib
import html
import json
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from tests.support.tls import Pki


@dataclass
class IndexState:
    files: dict[str, Path] = field(default_factory=dict)  # filename -> path
    requests: list[str] = field(default_factory=list)       # paths of GET requests, in order
    head_requests: list[str] = field(default_factory=list)  # paths of HEAD requests, in order
    fail_next: int = 0            # answer this many requests with 503
    truncate_files: bool = False  # send half of each file with a full Content-Length


def _project_files(state: IndexState, project: str) -> list[tuple[str, Path]]:
    out = []
    for fn, p in sorted(state.files.items()):
        if canonicalize_name(parse_wheel_filename(fn)[0]) == project:
            out.append((fn, p))
    return out


class _Handler(BaseHTTPRequestHandler):
    state: IndexState

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        self.state.requests.append(self.path)
        self._answer(with_body=True)

    def do_HEAD(self) -> None:  # noqa: N802
        # uv probes a wheel with HEAD (for range requests) when the index has no PEP 658 metadata.
        self.state.head_requests.append(self.path)
        self._answer(with_body=False)

    def _answer(self, *, with_body: bool) -> None:
        """The GET answer; for HEAD the same status and headers, no body (send_error already omits it)."""
        st = self.state
        if st.fail_next > 0:
            st.fail_next -= 1
            self.send_error(503)
            return
        parts = [p for p in self.path.split("?")[0].split("/") if p]
        if len(parts) == 2 and parts[0] == "files" and parts[1] in st.files:
            data = st.files[parts[1]].read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if with_body:
                self.wfile.write(data[: len(data) // 2] if st.truncate_files else data)
            return
        if len(parts) == 2 and parts[0] == "simple":
            project = canonicalize_name(parts[1])
            files = _project_files(st, project)
            if not files:
                self.send_error(404)
                return
            wants_json = "application/vnd.pypi.simple.v1+json" in self.headers.get("Accept", "")
            if wants_json:
                body = json.dumps({
                    "meta": {"api-version": "1.0"}, "name": project,
                    "files": [{"filename": fn, "url": f"/files/{fn}",
                               "hashes": {"sha256": hashlib.sha256(p.read_bytes()).hexdigest()}}
                              for fn, p in files]}).encode()
                ctype = "application/vnd.pypi.simple.v1+json"
            else:
                links = "".join(
                    f'<a href="../../files/{html.escape(fn)}#sha256='
                    f'{hashlib.sha256(p.read_bytes()).hexdigest()}">{html.escape(fn)}</a>\n'
                    for fn, p in files)
                body = f"<!DOCTYPE html><html><body>\n{links}</body></html>".encode()
                ctype = "text/html"
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if with_body:
                self.wfile.write(body)
            return
        if len(parts) == 1 and parts[0] == "simple":
            names = sorted({canonicalize_name(parse_wheel_filename(fn)[0]) for fn in st.files})
            body = "".join(f'<a href="{n}/">{n}</a>\n' for n in names).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if with_body:
                self.wfile.write(body)
            return
        self.send_error(404)


@dataclass
class LoopbackIndex:
    url: str          # base URL, e.g. http://127.0.0.1:PORT
    state: IndexState

    @property
    def simple_url(self) -> str:
        return self.url + "/simple"

    def add(self, *paths: Path) -> None:
        for p in paths:
            self.state.files[p.name] = p


@contextmanager
def serve_index(*wheels: Path, tls: Pki | None = None) -> Iterator[LoopbackIndex]:
    """Serve the given wheel files as a simple index on 127.0.0.1 (a random free port); over HTTPS with the
    server certificate of ``tls`` when given."""
    state = IndexState()
    handler = type("Handler", (_Handler,), {"state": state})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    if tls is not None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(tls.cert, tls.key)
        # the handshake waits for the first read, in the request's own thread, not in accept()
        server.socket = ctx.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        server.handle_error = lambda *_: None  # type: ignore[method-assign]  # a client that refused us
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    scheme = "https" if tls is not None else "http"
    index = LoopbackIndex(f"{scheme}://127.0.0.1:{server.server_address[1]}", state)
    index.add(*wheels)
    try:
        yield index
    finally:
        server.shutdown()
        server.server_close()


def dead_url() -> str:
    """A loopback URL where nothing listens (a port bound then released)."""
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/simple"
