"""A real nginx with WebDAV on loopback, configured by the repository's own remote/nginx.conf.

Everything nginx writes (pid, logs, temp files, the cache) lies under the folder the test gives; it runs in
the foreground (``daemon off``) as our child and is stopped by its pid. Reads are open, writes need the
writer's basic-auth password, as in the config teams deploy.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "remote" / "nginx.conf"
WRITER, PASSWORD = "ci-writer", "s3cret-Pa55word"


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ssha(password: str) -> str:
    """An htpasswd {SSHA} entry (RFC 2307 salted SHA-1), which nginx's auth_basic_user_file reads."""
    salt = os.urandom(8)
    return "{SSHA}" + base64.b64encode(hashlib.sha1(password.encode() + salt).digest() + salt).decode()


class Nginx:
    def __init__(self, folder: Path) -> None:
        binary = nginx_binary()
        if binary is None:
            raise RuntimeError("nginx is not installed (apt-get install nginx-light)")
        self.binary = binary
        self.prefix = folder / "nginx"
        self.data = folder / "data"
        for d in (self.prefix / "tmp", self.data):
            d.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        (self.prefix / "writers.htpasswd").write_text(f"{WRITER}:{_ssha(PASSWORD)}\n")
        text = CONFIG.read_text()
        for name, value in (("@PREFIX@", str(self.prefix)), ("@DATA@", str(self.data)),
                            ("@LISTEN@", f"127.0.0.1:{self.port}")):
            text = text.replace(name, value)
        directives = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
        assert not re.search(r"@[A-Z]+@", directives), "a placeholder of remote/nginx.conf is left unfilled"
        self.config = self.prefix / "nginx.conf"
        self.config.write_text(text)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/cache"

    @property
    def writer_url(self) -> str:
        return f"http://{WRITER}:{PASSWORD}@127.0.0.1:{self.port}/cache"

    def path(self, kind: str, key: str) -> Path:
        """Where nginx keeps /cache/<kind>/<key> (kind: ac or cas)."""
        return self.data / "cache" / kind / key

    def access_log(self) -> list[str]:
        log = self.prefix / "access.log"
        return log.read_text().splitlines() if log.exists() else []

    def start(self) -> None:
        directives = "daemon off;"
        if os.geteuid() == 0:
            directives += " user root root;"  # workers must reach pytest's private temp folder (CI runs as root)
        self.proc = subprocess.Popen([self.binary, "-p", str(self.prefix), "-e", str(self.prefix / "error.log"),
                                      "-c", str(self.config), "-g", directives],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise RuntimeError(f"nginx exited ({self.proc.returncode}): {err}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("nginx did not start listening within 20 s")

    def stop(self) -> None:
        """Fast shutdown (SIGTERM) of the master by its pid; it takes its workers along."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.proc.stderr:
            self.proc.stderr.close()
        self.proc = None
