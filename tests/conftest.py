"""Shared fixtures: the real CLI in a subprocess, a loopback index of real wheels, a scratch root."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.index import LoopbackIndex, serve_index
from tests.support.wheels import BuiltWheel, build_wheel

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Result:
    rc: int
    out: str
    err: str


class Hermetic:
    """Runs the real `python -m hermetic` with a private environment (pip config isolated)."""

    def __init__(self, root: Path, home: Path, index_url: str | None) -> None:
        self.root = root
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "HERMETIC_"))}
        self.env.update({"HOME": str(home), "PIP_CONFIG_FILE": os.devnull, "PIP_RETRIES": "1",
                         "PIP_DEFAULT_TIMEOUT": "5", "PYTHONDONTWRITEBYTECODE": "1"})
        if index_url:
            self.env["PIP_INDEX_URL"] = index_url

    def __call__(self, *args: str | Path, root: Path | None = None, check: bool = False,
                 env: dict[str, str] | None = None) -> Result:
        cmd = [sys.executable, "-m", "hermetic", "--root", str(root or self.root), *map(str, args)]
        p = subprocess.run(cmd, capture_output=True, text=True, env={**self.env, **(env or {})},
                           cwd=REPO, timeout=600)
        if check and p.returncode != 0:
            raise AssertionError(f"hermetic {args} failed ({p.returncode}):\n{p.stderr}")
        return Result(p.returncode, p.stdout, p.stderr)


@pytest.fixture
def index() -> Iterator[LoopbackIndex]:
    with serve_index() as idx:
        yield idx


@pytest.fixture
def hermetic(tmp_path: Path, index: LoopbackIndex) -> Hermetic:
    home = tmp_path / "home"
    home.mkdir()
    return Hermetic(tmp_path / "root", home, index.simple_url)


def pip_lock_line(w: BuiltWheel) -> str:
    return f"{w.name}=={w.version} \\\n    --hash=sha256:{w.sha256}\n"


def write_recipe(folder: Path, name: str, lock_text: str, *, lock_name: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / (lock_name or f"{name}.lock.txt")
    lock.write_text(lock_text)
    recipe = folder / f"{name}.toml"
    recipe.write_text(f'[recipe]\nname = "{name}"\nlocks = ["{lock.name}"]\n')
    return recipe


def shared_files(pkg: str, version: str, n: int = 30) -> dict[str, bytes | str]:
    """Files of a test package; most identical between versions, one file per version differs."""
    files: dict[str, bytes | str] = {f"{pkg}/include/h{i}.h": f"#define H{i} {i}\n" * 50 for i in range(n)}
    files[f"{pkg}/__init__.py"] = f"VERSION = {version!r}\n"
    files[f"{pkg}/only_{version.replace('.', '_')}.py"] = "X = 1\n"
    files[f"{pkg}/bin/tool"] = "#!/bin/sh\necho tool\n"
    return files


def make_pkg(out: Path, name: str, version: str) -> BuiltWheel:
    return build_wheel(out, name, version, shared_files(name, version),
                       executables=frozenset({f"{name}/bin/tool"}))


def tree_snapshot(top: Path) -> dict[str, tuple[int, int, str]]:
    """path -> (inode, mtime_ns, sha256) of every regular file under ``top`` (following the profile)."""
    snap = {}
    for dirpath, _dirs, files in os.walk(top, followlinks=False):
        for f in files:
            p = Path(dirpath) / f
            if p.is_symlink():
                continue
            st = p.stat()
            snap[str(p.relative_to(top))] = (st.st_ino, st.st_mtime_ns,
                                             hashlib.sha256(p.read_bytes()).hexdigest())
    return snap


def store_listing(root: Path) -> dict[str, tuple[int, int]]:
    """Everything under the store: path -> (size, mtime_ns), to show a failure left it as it was."""
    out = {}
    store = root / "store"
    if not store.exists():
        return out
    for dirpath, dirs, files in os.walk(store):
        rel = os.path.relpath(dirpath, store)
        if rel.split(os.sep)[0] in ("temproots", "locks", "tmp"):
            continue
        for f in files + dirs:
            p = Path(dirpath) / f
            st = p.lstat()
            out[str(p.relative_to(store))] = (st.st_size, st.st_mtime_ns if p.is_file() else 0)
    return out


@pytest.fixture(scope="session")
def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scratch root whose CUDA toolchain is realized once for the whole session (pip's own index)."""
    root = tmp_path_factory.mktemp("shared") / "root"
    p = subprocess.run([sys.executable, "-m", "hermetic", "--root", str(root), "realize",
                        str(REPO / "recipes" / "toolchain.toml")], capture_output=True, text=True, cwd=REPO,
                       timeout=900)
    assert p.returncode == 0, p.stderr
    return root
