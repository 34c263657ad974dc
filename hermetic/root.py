"""The scratch root: where everything hermetic and its children write.

``--root``, else ``HERMETIC_ROOT``, else ``.hermetic/`` in the current folder. The layout is documented in
docs/layout.md; this module is its single source of truth.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from hermetic import fs
from hermetic.errors import BadInput, WorkFailed, path_error

ROOT_MARKER = "HERMETIC_ROOT"
ROOT_FORMAT = 1   # the root's layout (docs/layout.md); the store inside it has its own (store/FORMAT)
LAYOUT = frozenset({"store", "profiles", "roots", "receipts", "state", "tmp", "home", "build", "imports"})
MARKER_TEXT = (f"This folder is a hermetic scratch root. `hermetic gc --all` removes it.\n"
               f"format: hermetic-root {ROOT_FORMAT}\n").encode()
DEFAULT_LOCK_DIRS = ("/run/lock/hermetic", "/var/lock/hermetic", "/tmp/hermetic-locks")
CHECKOUT_SEARCH = 200_000   # entries `gc --all` looks through for a checkout someone put in the root


def lock_dir(configured: str | None) -> Path:
    """The machine-wide lock folder: shared by every user (the one deliberate place outside the root).
    ``HERMETIC_LOCK_DIR``, else the runner's ``gpu.lock_dir`` (``configured``), else the first default whose
    parent this user may write (docs/run.md): the environment before the file, as every setting."""
    chosen = os.environ.get("HERMETIC_LOCK_DIR") or configured
    if chosen:
        return Path(chosen)
    for d in DEFAULT_LOCK_DIRS:
        parent = Path(d).parent
        if parent.is_dir() and os.access(parent, os.W_OK | os.X_OK):
            return Path(d)
    return Path(DEFAULT_LOCK_DIRS[-1])


class Cache:
    """A bucket of derived facts under ``state/``, as uv-cache's CacheBucket: its folder carries its format
    version (``<name>-v<version>``), so a format change is a new folder and the old one is garbage. (A plain
    class: every command imports this table, and a dataclass costs its import more than the rest of it.)"""

    __slots__ = ("name", "version", "holds")

    def __init__(self, name: str, version: int, holds: str) -> None:
        self.name, self.version, self.holds = name, version, holds

    @property
    def folder(self) -> str:
        return f"{self.name}-v{self.version}"


# Every derived cache, in one table. All are safe to delete: each is re-derived (more slowly) when missing.
CACHES = {c.name: c for c in (
    Cache("realize", 1, "no-op records: the fingerprints of a realize's inputs and what it produced"),
    Cache("locks", 2, "parsed locks per interpreter, while the lock file and the interpreter are unchanged"),
    Cache("interpreters", 5, "host interpreter facts (qualification: torch, triton), while the interpreter, torch and "
                             "triton are unchanged"),
    Cache("pythons", 2, "a recipe's interpreter: version, tags, markers and scheme (asked with hermetic's own "
                        "packaging), while the interpreter and that packaging are unchanged"),
    Cache("tools", 1, "tools' answers (nvcc --version, g++ -dumpfullversion) and their binaries' hashes"),
    Cache("hashes", 1, "content hashes of compile inputs, while each input is unchanged"),
    Cache("includes", 1, "each source's and header's include directives and identifier mentions (the waiver's "
                         "prediction), while the file is unchanged"),
    Cache("imports", 1, "the import check of each environment tree that passed it"),
    Cache("builds", 1, "the certificate of each module's last build, for --explain"),
    Cache("sandbox", 1, "whether bubblewrap sets up the build sandbox here, per bwrap binary (its fingerprint), "
                        "kernel and user"),
    Cache("kernels", 2, "`hermetic run`'s compiled kernels (Inductor, Triton, CUDA's JIT, torch extensions): a "
                        "folder per runner (2: v1 was one for all), in it one per torch, CUDA, triton, Python and "
                        "CPU capability: a change never reuses an entry"),
)}


DRY_RUN_SCRATCH = "hermetic-dry-run-"
NO_CUDA = "/dev/null/hermetic-no-cuda"   # Root.no_cuda: below a device file, a folder no write can make


def not_a_folder(path: Path) -> str | None:
    """What stands at ``path`` where one of hermetic's own folders belongs when it is no real folder ("a symbolic
    link to /x", "a file", "a FIFO"), else None (a folder, or nothing). Read with lstat: never followed."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except PermissionError:   # a folder above it this user may not search: what uses the path says so
        return None
    mode = st.st_mode
    if stat.S_ISDIR(mode):
        return None
    if stat.S_ISLNK(mode):
        try:
            return f"a symbolic link to {os.readlink(path)}"
        except OSError:
            return "a symbolic link"
    return "a file" if stat.S_ISREG(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" \
        if stat.S_ISSOCK(mode) else "a device file"


REPAIR_FOLDER = ("run `hermetic verify --repair`, which replaces it with an empty folder (what a link points at is "
                 "left as it is)")


def refuse_folders(problems: list[tuple[Path, str]]) -> None:
    """BadInput (exit 2) naming the first of hermetic's own folders that is no real folder: nothing is written,
    made or deleted through it (docs/layout.md, "A bad record")."""
    if problems:
        path, what = problems[0]
        more = f" (and {len(problems) - 1} more such)" if len(problems) > 1 else ""
        raise BadInput(f"{path} is {what} where hermetic's own folder belongs: hermetic never writes or deletes "
                       f"through it{more}", where=str(path), hint=REPAIR_FOLDER)


def _outside_scratch() -> Path:
    """The folder a read-only root's children get for their homes and temp files, outside the root: removed at
    exit, and by the next dry run or gc after a kill -9 (``sweep_outside_scratch``)."""
    return fs.process_scratch_dir(DRY_RUN_SCRATCH)


def sweep_outside_scratch() -> list[Path]:
    """Remove dry runs' folders outside the root that a process killed with kill -9 left."""
    return fs.sweep_scratch_dirs(DRY_RUN_SCRATCH)


@dataclass(frozen=True)
class Root:
    path: Path
    named_by: str = "--root"   # --root, HERMETIC_ROOT or the default: said in errors about the root's path
    # a dry run's view (``realize --dry-run``): caches are read and never written, children's homes and temp
    # files go to a scratch folder outside the root, and ``ensure`` refuses; nothing is written under ``path``
    read_only: bool = False

    @staticmethod
    def locate(cli_root: str | None, environ: dict[str, str] | None = None) -> Root:
        env = os.environ if environ is None else environ
        named_by = "--root" if cli_root else "HERMETIC_ROOT" if env.get("HERMETIC_ROOT") else \
            "the default, .hermetic/ in the current folder"
        raw = cli_root or env.get("HERMETIC_ROOT") or ".hermetic"
        path = Path(raw).expanduser().absolute()
        hint = f"the scratch root comes from {named_by}: choose another with --root or HERMETIC_ROOT"
        try:  # a root that cannot be reached is said now, for every command, not at the first write
            st = path.stat()
        except FileNotFoundError:
            return Root(path, named_by)
        except OSError as e:
            raise path_error(e, doing="the scratch root cannot be used", hint=hint) or e from None
        if not stat.S_ISDIR(st.st_mode):
            raise BadInput(f"the scratch root {path} exists and is not a folder", where=named_by, hint=hint)
        return Root(path, named_by)

    # layout -------------------------------------------------------------
    @property
    def store(self) -> Path:
        return self.path / "store"

    @property
    def profiles(self) -> Path:
        return self.path / "profiles"

    @property
    def roots(self) -> Path:
        return self.path / "roots"

    @property
    def receipts(self) -> Path:
        return self.path / "receipts"

    @property
    def state(self) -> Path:
        """Caches of derived facts (``CACHES``); safe to delete."""
        return self.path / "state"

    def cache_dir(self, name: str) -> Path:
        return self.state / CACHES[name].folder

    def build_lock(self, recipe: str) -> Path:
        """The lock a realize of ``recipe`` holds from before its first compile to its last link, and `gc
        --drop-root` of it waits for (docs/layout.md, the lock discipline)."""
        return self.path / "build" / recipe / ".lock"

    def cache(self, name: str) -> fs.FingerprintCache:
        return fs.FingerprintCache(self.cache_dir(name), read_only=self.read_only)

    @property
    def tmp(self) -> Path:
        return (_outside_scratch() if self.read_only else self.path) / "tmp"

    @property
    def home(self) -> Path:
        return (_outside_scratch() if self.read_only else self.path) / "home"

    @property
    def pycache(self) -> Path:
        """The children's bytecode cache (``PYTHONPYCACHEPREFIX``): derived, cleared whole when damaged."""
        return self.home / ".cache" / "pycache"

    def clear_pycache(self) -> bool:
        """Remove the children's bytecode cache, renamed aside first so that a child writing into it meanwhile
        finds it gone (and starts a new one) rather than half removed; False when there was none."""
        return fs.remove_aside(self.pycache)

    def marker_problem(self) -> str | None:
        """Why this folder is not a hermetic scratch root, in the words every command that refuses one says
        ("it is not a hermetic scratch root (no HERMETIC_ROOT file)"), else None: its marker is a regular file
        (any text: one naming no format is an earlier hermetic's marker, format 0). Read with lstat: a marker that
        is a link, a folder or a FIFO is none."""
        marker = self.path / ROOT_MARKER
        try:
            st = os.lstat(marker)
        except (FileNotFoundError, NotADirectoryError):
            return f"it is not a hermetic scratch root (no {ROOT_MARKER} file)"
        except PermissionError:
            return f"it is not a hermetic scratch root ({marker} cannot be read)"
        if stat.S_ISREG(st.st_mode):
            return None
        what = "a folder" if stat.S_ISDIR(st.st_mode) else not_a_folder(marker)
        return f"it is not a hermetic scratch root (no {ROOT_MARKER} file: {what} stands there)"

    def refuse_unmarked(self, command: str) -> None:
        """BadInput (exit 2) when this folder holds anything and has no marker (``marker_problem``): ``command``
        (gc, verify, verify --repair, gc --drop-root, env) never reads, writes or deletes in a folder of someone's
        files that a mistyped --root named, nor in one a store/FORMAT was planted in. A missing or empty folder
        holds nothing to refuse."""
        try:
            if not any(True for _ in os.scandir(self.path)):
                return
        except (FileNotFoundError, NotADirectoryError):
            return
        problem = self.marker_problem()
        if problem is not None:
            raise BadInput(f"hermetic {command} will not run in {self.path}: {problem}", where=str(self.path),
                           hint=f"the scratch root comes from {self.named_by}: check --root and HERMETIC_ROOT (if "
                                f"this folder really is a root whose marker was lost, create an empty "
                                f"{ROOT_MARKER} file in it)")

    def marker_format(self) -> int | None:
        """The format its marker names (0: a marker of an earlier hermetic, which names none); None when the
        folder has no marker (a regular file named HERMETIC_ROOT): then it is no scratch root."""
        marker = self.path / ROOT_MARKER
        try:   # opened without following a link or waiting on a FIFO (one swapped in after a look is refused)
            fd = fs.open_regular(marker, follow=False)
        except (FileNotFoundError, NotADirectoryError, fs.NotRegularFile):
            return None
        except OSError as e:
            if e.errno == errno.ELOOP:   # a symbolic link: no marker
                return None
            raise
        try:
            text = os.read(fd, 4096).decode(errors="replace")
        finally:
            os.close(fd)
        for line in text.splitlines():
            word, _, number = line.partition("format: hermetic-root ")
            if not word and number.strip().isdigit():
                return int(number.strip())
        return 0

    def ensure(self) -> None:
        """Make the root ready for writing. Only a missing or empty folder becomes a root (its marker written
        first, so that a second process making it at once sees a root); a folder that holds anything and no marker
        (``marker_problem``: none, or a link, a folder or a FIFO in its place) is refused, whatever it holds: a
        mistyped --root must never become a root that `gc --all` removes with the user's files, and a planted
        store/FORMAT proves nothing (a root copied without its marker: create an empty one). An earlier hermetic's
        marker (a regular file naming no format) is upgraded to name the format."""
        if self.read_only:
            raise RuntimeError(f"a read-only view of {self.path} cannot be made ready for writing")
        found = self.marker_format()
        if found is None:
            self.path.mkdir(parents=True, exist_ok=True)
            others = sorted(n for n in os.listdir(self.path)
                            if not (n.startswith(f".{ROOT_MARKER}.") and n.endswith(".tmp")))
            found = self.marker_format() if others else None  # another process making it just now wrote it first
            if others and found is None:
                raise self.unmarked_error(others)
        if found is not None and found > ROOT_FORMAT:
            raise self.too_new_error(found)
        if found != ROOT_FORMAT:
            fs.atomic_write(self.path / ROOT_MARKER, MARKER_TEXT)
        refuse_folders(self.folder_problems())
        for d in (self.profiles, self.roots, self.receipts, self.state, self.tmp):
            d.mkdir(parents=True, exist_ok=True)

    def unmarked_error(self, others: list[str]) -> BadInput:
        """Why a folder holding ``others`` and no marker is no root (ensure's refusal; ``realize --check`` says
        the same without writing)."""
        return BadInput(
            f"{self.path} holds files ({', '.join(others[:3])}{', ...' if len(others) > 3 else ''}) and "
            f"{(self.marker_problem() or 'it is not a hermetic scratch root').removeprefix('it ')}: hermetic "
            "makes a root only in a missing or empty folder", where=str(self.path),
            hint=f"the scratch root comes from {self.named_by}: choose a new folder with --root or "
                 f"HERMETIC_ROOT (if this folder really is a root whose marker was lost, create an empty "
                 f"{ROOT_MARKER} file in it)")

    def too_new_error(self, found: int) -> WorkFailed:
        return WorkFailed(f"the scratch root {self.path} has format {found}; this hermetic reads format "
                          f"{ROOT_FORMAT}", where=str(self.path / ROOT_MARKER),
                          hint="use a matching hermetic, or another --root")

    def folder_problems(self) -> list[tuple[Path, str]]:
        """The root's own folders (``LAYOUT``; under state/, the buckets of ``CACHES``) that are no real folder:
        a symbolic link (never followed: a link to a folder outside would have hermetic write or delete there),
        a file, a FIFO. (path, what stands there) for each; the store's are ``Store.folder_problems``."""
        found = []
        for name in sorted(LAYOUT):
            what = not_a_folder(self.path / name)
            if what is not None:
                found.append((self.path / name, what))
        if not any(p == self.state for p, _w in found):
            for cache in CACHES.values():
                what = not_a_folder(self.state / cache.folder)
                if what is not None:
                    found.append((self.state / cache.folder, what))
        return found

    def refuse_removal(self) -> None:
        """Why ``gc --all`` must not remove this folder, raised: it is no marked scratch root, or it is /, the
        user's home or a folder holding it, the current folder or one holding it, or a repository checkout."""
        real = Path(os.path.realpath(self.path))
        home = Path(os.path.realpath(os.path.expanduser("~")))
        here = Path(os.path.realpath(os.getcwd()))
        hint = f"the scratch root comes from {self.named_by}: check --root and HERMETIC_ROOT"
        for what, bad in (("the file system's top", real == Path("/")),
                          ("your home folder, or holds it", home == real or home.is_relative_to(real)),
                          ("the current folder, or holds it", here == real or here.is_relative_to(real)),
                          ("a repository checkout (it holds .git)", os.path.lexists(real / ".git"))):
            if bad:
                raise BadInput(f"hermetic gc --all will not remove {self.path}: it is {what}", where=str(self.path),
                               hint=hint)
        problem = self.marker_problem()
        if problem is not None:
            raise BadInput(f"hermetic gc --all will not remove {self.path}: {problem}", where=str(self.path),
                           hint=hint)
        checkout = self._checkout_inside()
        if checkout is not None:
            raise BadInput(f"hermetic gc --all will not remove {self.path}: it holds a repository checkout, "
                           f"{checkout} (hermetic never makes one there: someone put it in the root)",
                           where=str(checkout), hint="move the checkout out of the scratch root (or remove it "
                                                     "yourself), then run gc --all again")

    def _checkout_inside(self, budget: int = CHECKOUT_SEARCH) -> Path | None:
        """A repository checkout (a folder holding ``.git``) anywhere below the root but in the store, whose trees
        are hermetic's own read-only copies (a source folder copied with its .git is one): nothing hermetic
        makes elsewhere holds one. Links are not followed; past ``budget`` entries the search stops."""
        seen = 0
        for dirpath, dirnames, filenames in os.walk(self.path):
            if dirpath == str(self.path):
                dirnames[:] = [d for d in dirnames if d != "store"]
            if ".git" in dirnames or ".git" in filenames:
                return Path(dirpath)
            seen += len(dirnames) + len(filenames)
            if seen > budget:
                return None
        return None

    @property
    def no_cuda(self) -> Path:
        """What a child's CUDA_HOME names when hermetic gives it no toolchain: a folder that can never exist. Unset,
        torch (and other tools) would look for nvcc on PATH, then take /usr/local/cuda. It lies below /dev/null, a
        device file, so no write can make it (tmp/no-cuda, its earlier place, could be made by any write inside the
        root, with a planted bin/nvcc that torch then took: outside attack r1, finding 10)."""
        return Path(NO_CUDA)

    def child_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for child processes: every home, temp and cache they may write points inside; no system
        CUDA: CUDA_HOME names none (a caller with a toolchain sets it and PATH to that), and from the caller's
        own environment (``base`` None) no folder holding an nvcc stays on PATH. A ``base`` is the caller's
        choice: its PATH is kept as it is (a recorded compile's, the toolchain first)."""
        env = dict(os.environ if base is None else base)
        env.pop("CUDA_INC_PATH", None)
        if base is None or "CUDA_HOME" not in base:
            env["CUDA_HOME"] = env["CUDA_PATH"] = str(self.no_cuda)
        if base is None and env.get("PATH"):
            env["PATH"] = os.pathsep.join(d for d in env["PATH"].split(os.pathsep)
                                          if not (d and os.path.isfile(os.path.join(d, "nvcc"))))
        home = self.home
        cache = home / ".cache"
        # the temp folder is home/tmp, not tmp/: `hermetic env` runs the user's commands unconfined with it,
        # and home/ is read-only in the sandbox, where tmp/ is not (a stranger's setup.py planted links there
        # that nvcc, run under `hermetic env`, followed outside the root: the re-attack's B1); a sandboxed
        # child's moves to its trust domain's home with the rest (procs.Confinement.moved)
        temp = home / "tmp"
        env.update({
            "HOME": str(home),
            "TMPDIR": str(temp),
            "TMP": str(temp),
            "TEMP": str(temp),
            "XDG_CACHE_HOME": str(cache),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_DATA_HOME": str(home / ".local" / "share"),
            "XDG_STATE_HOME": str(home / ".local" / "state"),
            "PIP_CACHE_DIR": str(cache / "pip"),
            "UV_CACHE_DIR": str(cache / "uv"),
            "CUDA_CACHE_PATH": str(cache / "nv"),
            "TRITON_CACHE_DIR": str(cache / "triton"),
            "TORCHINDUCTOR_CACHE_DIR": str(cache / "torchinductor"),
            "TORCH_EXTENSIONS_DIR": str(cache / "torch_extensions"),
            "PYTHONPYCACHEPREFIX": str(self.pycache),
            "MPLCONFIGDIR": str(cache / "matplotlib"),
            "CCACHE_DIR": str(cache / "ccache"),
            "SCCACHE_DIR": str(cache / "sccache"),
        })
        for d in (home, cache, temp, self.tmp):
            d.mkdir(parents=True, exist_ok=True)
        return env
