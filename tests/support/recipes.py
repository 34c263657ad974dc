"""The one recipe template of the tests, and the small wheels and locks lock-only recipes name.

``recipe_toml`` writes any recipe the tests need from its parts: locks, a toolchain, a source folder, build
limits, extensions and variants, and whatever else a test adds verbatim (a ``[remote]`` table, a deliberate
mistake). The building fixtures (tests/data/reuse_src and friends) are small real C++/CUDA sources.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tests.support.cli import REPO
from tests.support.wheels import BuiltWheel, build_wheel

TOOLCHAIN_LOCK = REPO / "manifests" / "cuda-13.0-toolchain.txt"


def _strings(values: Sequence[str]) -> str:
    return ", ".join(f'"{v}"' for v in values)


def recipe_toml(name: str, *, locks: Sequence[str] = (), toolchain: bool = False, archs: Sequence[str] = (),
                sources: dict[str, str] | None = None, jobs: int | None = None, limits: str = "",
                extensions: Sequence[str] = (), variants: str = "", extra: str = "") -> str:
    """A recipe's TOML. ``sources`` maps a name to a folder (``path``); ``extensions`` are the bodies of
    ``[[extensions]]`` tables (``name = ...`` lines); ``limits``, ``variants`` and ``extra`` go in verbatim."""
    out = f'[recipe]\nname = "{name}"\n'
    if locks:
        out += f"locks = [{_strings(locks)}]\n"
    if toolchain:
        out += '\n[toolchain]\ncuda = "13.0"\nlock = "cuda-13.0-toolchain.txt"\n'
        if archs:
            out += f"archs = [{_strings(archs)}]\n"
    for src, path in (sources or {}).items():
        out += f'\n[sources.{src}]\npath = "{path}"\n'
    if jobs is not None or limits:
        out += "\n[limits]\n" + (f"jobs = {jobs}\n" if jobs is not None else "") + limits
    for ext in extensions:
        out += "\n[[extensions]]\n" + ext.strip("\n") + "\n"
    if variants:
        out += "\n" + variants.strip("\n") + "\n"
    if extra:
        out += "\n" + extra.strip("\n") + "\n"
    return out


def write_recipe(folder: Path, name: str, lock_text: str, *, lock_name: str | None = None) -> Path:
    """A lock-only recipe and its pip hash lock in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / (lock_name or f"{name}.lock.txt")
    lock.write_text(lock_text)
    recipe = folder / f"{name}.toml"
    recipe.write_text(recipe_toml(name, locks=[lock.name]))
    return recipe


def pip_lock_line(w: BuiltWheel) -> str:
    return f"{w.name}=={w.version} \\\n    --hash=sha256:{w.sha256}\n"


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
