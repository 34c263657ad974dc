"""Hostile HTTP servers on loopback (issue 34, item 6): one that answers a GET with its headers and then one
byte every few seconds (a per-read timeout never fires), one that sends its status line and then its headers one
byte every few seconds (``headers``: the attack on issue 34's fix), and one that streams bytes with no
Content-Length until the client hangs up. Each counts what it sent. ``/ac/`` is always a miss (404), so any
can stand in for a Bazel HTTP cache whose blobs (``/cas/``) are the hostile part."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Sent:
    bytes: int = 0
    requests: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(BaseHTTPRequestHandler):
    mode = "trickle"          # "trickle", "headers" or "flood"
    interval = 2.0            # trickle: seconds between bytes
    declared = 1 << 20        # trickle: the Content-Length it claims
    flood_total = 64 << 20    # flood: bytes it sends at most, then closes
    sent: Sent

    def log_message(self, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:  # noqa: N802
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_PUT(self) -> None:  # noqa: N802
        self.send_response(403)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:  # noqa: N802
        with self.sent.lock:
            self.sent.requests.append(self.path)
        if "/ac/" in self.path:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        try:
            if self.mode == "trickle":
                self._trickle()
            elif self.mode == "headers":
                self._header_trickle()
            else:
                self._flood()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up: that is the point

    def _trickle(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(self.declared))
        self.end_headers()
        for _ in range(self.declared):
            self.wfile.write(b"x")
            self.wfile.flush()
            with self.sent.lock:
                self.sent.bytes += 1
            time.sleep(self.interval)

    def _header_trickle(self) -> None:
        """The status line, then one byte of a header every ``interval`` seconds: the headers never end."""
        self.wfile.write(b"HTTP/1.1 200 OK\r\n")
        self.wfile.flush()
        for _ in range(100_000):
            self.wfile.write(b"X")
            self.wfile.flush()
            with self.sent.lock:
                self.sent.bytes += 1
            time.sleep(self.interval)

    def _flood(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        block = b"\xa5" * (64 << 10)
        done = 0
        while done < self.flood_total:
            self.wfile.write(block)
            done += len(block)
            with self.sent.lock:
                self.sent.bytes += len(block)
        self.close_connection = True


@dataclass
class SlowServer:
    url: str
    sent: Sent


@contextmanager
def serve(mode: str, **settings: float) -> Iterator[SlowServer]:
    """``mode``: "trickle" (``interval``, ``declared``), "headers" (``interval``) or "flood" (``flood_total``)."""
    sent = Sent()
    handler = type("H", (_Handler,), {"mode": mode, "sent": sent, **settings})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield SlowServer(f"http://127.0.0.1:{server.server_address[1]}", sent)
    finally:
        server.shutdown()
        server.server_close()
