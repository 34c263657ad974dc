"""Helpers for build tests: a project folder with a recipe and sources, realized by the real CLI in a
shared scratch root (its toolchain realized once per session), and the decisions its certificate records."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from hermetic.build.certificate import read_certificate
from hermetic.store import Store

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"

RECIPE = """\
[recipe]
name = "{name}"

[toolchain]
cuda = "13.0"
lock = "cuda-13.0-toolchain.txt"
archs = ["9.0"]

[sources.src]
path = "src"

[limits]
jobs = 2
{limits}
[[extensions]]
name = "fixture_ext"
source = "src"
sources = ["*.cpp", "*.cu"]
include_dirs = ["."]
cuda_cflags = [{cuda_cflags}]

[variants.base]

[variants.renamed]
default = false
module = "fixture_renamed_ext"

[variants.feature]
default = false
defines = {{ FEATURE = "2" }}
"""


@dataclass
class Realized:
    rc: int
    out: str
    err: str
    result: dict[str, object]
    decisions: dict[str, str]          # source -> decision (for the one module)
    certificate: dict[str, object]


class Project:
    def __init__(self, folder: Path, name: str, root: Path, *, limits: str = "", cuda_cflags: str = "",
                 sources: Path = DATA / "reuse_src") -> None:
        self.folder, self.name, self.root = folder, name, root
        folder.mkdir(parents=True)
        shutil.copytree(sources, folder / "src")
        shutil.copy(REPO / "manifests" / "cuda-13.0-toolchain.txt", folder)
        self.recipe = folder / "recipe.toml"
        self.recipe.write_text(RECIPE.format(name=name, limits=limits, cuda_cflags=cuda_cflags))

    def edit(self, rel: str, old: str, new: str) -> None:
        p = self.folder / "src" / rel
        text = p.read_text()
        assert old in text, (rel, old)
        p.write_text(text.replace(old, new, 1))

    def realize(self, *args: str, env: dict[str, str] | None = None, check: bool = True) -> Realized:
        cmd = [sys.executable, "-m", "hermetic", "--root", str(self.root), "realize", str(self.recipe), "--json",
               *args]
        p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, cwd=REPO,
                           timeout=900)
        if check and p.returncode != 0:
            raise AssertionError(f"realize failed ({p.returncode}):\n{p.stderr[-3000:]}")
        result = json.loads(p.stdout.splitlines()[-1]) if p.stdout.strip() else {}
        decisions: dict[str, str] = {}
        cert: dict[str, object] = {}
        receipt = result.get("receipt")
        if p.returncode == 0 and receipt:
            modules = json.loads(Path(str(receipt)).read_text()).get("modules", [])
            if modules:
                cert = read_certificate(Store(self.root / "store"), modules[-1]["certificate_blob"])
                decisions = {o["source"]: o["decision"] for o in cert["objects"]}  # type: ignore[index]
        return Realized(p.returncode, p.stdout, p.stderr, result, decisions, cert)
