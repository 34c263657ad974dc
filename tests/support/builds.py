"""Helpers for build tests: a project folder with a recipe and sources, realized by the real CLI in a
shared scratch root (its toolchain realized once per session), and the decisions its certificate records."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from hermetic.extensions.certificate import read_certificate
from hermetic.extensions.plan import map_flags
from hermetic.keys import PrefixMap
from hermetic.root import Root
from hermetic.store import Store
from tests.support import cli
from tests.support.cli import REPO
from tests.support.recipes import recipe_toml

DATA = REPO / "tests" / "data"

VARIANTS = """\
[variants.base]

[variants.renamed]
default = false
module = "fixture_renamed_ext"

[variants.feature]
default = false
defines = { FEATURE = "2" }
"""


def fixture_recipe(name: str, *, limits: str = "", cuda_cflags: str = "") -> str:
    """The reuse fixture's recipe: one extension of every C++ and CUDA file in src/, in three variants."""
    return recipe_toml(name, toolchain=True, archs=["9.0"], sources={"src": "src"}, jobs=2, limits=limits,
                       extensions=['name = "fixture_ext"\nsource = "src"\nsources = ["*.cpp", "*.cu"]\n'
                                   f'include_dirs = ["."]\ncuda_cflags = [{cuda_cflags}]'],
                       variants=VARIANTS)


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
                 sources: Path = DATA / "reuse_src", recipe: str | None = None) -> None:
        self.folder, self.name, self.root = folder, name, root
        folder.mkdir(parents=True)
        shutil.copytree(sources, folder / "src")
        shutil.copy(REPO / "manifests" / "cuda-13.0-toolchain.txt", folder)
        self.recipe = folder / "recipe.toml"
        self.recipe.write_text(recipe if recipe is not None
                               else fixture_recipe(name, limits=limits, cuda_cflags=cuda_cflags))

    @classmethod
    def at(cls, folder: Path, name: str, root: Path) -> Project:
        """A project already in ``folder`` (a copy of another), realized in ``root``."""
        proj = cls.__new__(cls)
        proj.folder, proj.name, proj.root, proj.recipe = folder, name, root, folder / "recipe.toml"
        return proj

    def edit(self, rel: str, old: str, new: str) -> None:
        p = self.folder / "src" / rel
        text = p.read_text()
        assert old in text, (rel, old)
        p.write_text(text.replace(old, new, 1))

    def realize(self, *args: str, env: dict[str, str] | None = None, check: bool = True) -> Realized:
        p = cli.run(self.root, "realize", self.recipe, "--json", *args, env={**os.environ, **(env or {})})
        if check and p.rc != 0:
            raise AssertionError(f"realize failed ({p.rc}):\n{p.err[-3000:]}")
        result = p.result
        decisions: dict[str, str] = {}
        cert: dict[str, object] = {}
        receipt = result.get("receipt")
        if p.rc == 0 and receipt:
            modules = json.loads(Path(str(receipt)).read_text()).get("modules", [])
            if modules:
                cert = dict(read_certificate(Store(self.root / "store"), modules[-1]["certificate_blob"]))
                decisions = {o["source"]: o["decision"] for o in cert["objects"]}  # type: ignore[attr-defined]
        return Realized(p.rc, p.out, p.err, result, decisions, cert)


JOINT_VARIANTS = """\
[variants.plain]
defines = { JOINT_FLAVOR = "1" }

[variants.spiced]
module = "joint_spiced_ext"
defines = { JOINT_FLAVOR = "2" }
"""


def joint_recipe(name: str, *, heavy_parts: int = 2, computed: bool = True, jobs: int = 2,
                 variants: str = JOINT_VARIANTS) -> str:
    """tests/data/joint_src's recipe: a heavy unit each variant compiles (it reads JOINT_FLAVOR; about 1.5 s per
    part on the 2-core machine), light units
    a later variant may reuse, and (``computed``) a unit whose computed include defeats the waiver's
    prediction. Both variants are built by default."""
    units = '"heavy.cpp", "light_a.cpp", "light_b.cpp", "bindings.cpp"' + (', "computed.cpp"' if computed else "")
    defines = f'HEAVY_PARTS = "{heavy_parts}"' + (', WITH_COMPUTED = "1"' if computed else "")
    return recipe_toml(name, toolchain=True, archs=["9.0"], sources={"src": "src"}, jobs=jobs,
                       extensions=[f'name = "joint_ext"\nsource = "src"\nsources = [{units}]\n'
                                   f'include_dirs = ["."]\ndefines = {{ {defines} }}'],
                       variants=variants)


def local_command(root: Path, entry: str) -> list[str]:
    """An object record's command as this root's last build of it ran it: rebased from the record's fixed
    names onto the build's folders (its certificate's prefix map), with the map's compiler flags."""
    store = Store(root / "store")
    for blob in Root(root).cache("builds").values():
        cert = read_certificate(store, blob)
        if any(o.get("entry") == entry for o in cert["objects"]):
            pmap = PrefixMap((lo, f) for lo, f in cert["prefix_map"])
            rec = store.object_record(entry)
            canonical = rec["command"]
            command = pmap.local(canonical)
            flags = map_flags(pmap, command[0].endswith("nvcc"), canonical[canonical.index("-c") + 1],
                              rec.get("temps") == "objdir")
            return [command[0], *flags, *command[1:]]
    raise AssertionError(f"no build of {root} uses {entry}")


def linked_root(shared_root: Path, root: Path) -> Path:
    """A root of its own at ``root`` holding what ``shared_root`` holds (the toolchain among it): the store's files
    hard-linked (nothing copied, and what is done to the new root's store never reaches the shared one), the
    roots, profiles and derived state copied, and the marker."""
    shutil.copytree(shared_root / "store", root / "store", symlinks=True, copy_function=os.link)
    for folder in ("roots", "profiles", "state"):
        if (shared_root / folder).exists():
            shutil.copytree(shared_root / folder, root / folder, symlinks=True)
    shutil.copy2(shared_root / "HERMETIC_ROOT", root / "HERMETIC_ROOT")   # a root's files make a root with it
    return root
