"""Recipes: what to realize. Validated strictly; every error names the file, line and key.

A recipe so far names locks whose wheels form one environment, and optionally marks it as a CUDA
toolchain. docs/recipes.md documents every key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .errors import BadInput
from .tomlutil import TomlDoc, check_keys, expect_type, load_toml

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class Toolchain:
    cuda: str            # the CUDA release the toolchain must be (major.minor)


@dataclass(frozen=True)
class Recipe:
    path: Path
    name: str
    locks: tuple[Path, ...]
    toolchain: Toolchain | None
    doc: TomlDoc

    @property
    def folder(self) -> Path:
        return self.path.parent


def load_recipe(path: Path) -> Recipe:
    doc = load_toml(path)
    data = doc.data
    check_keys(doc, data, {"recipe", "toolchain"}, ())
    if "recipe" not in data:
        raise BadInput("the recipe has no [recipe] table", where=str(path),
                       hint="start the file with [recipe] and name = \"...\"")
    rec = expect_type(doc, data["recipe"], dict, ("recipe",))
    check_keys(doc, rec, {"name", "locks"}, ("recipe",))
    name = expect_type(doc, rec.get("name"), str, ("recipe", "name"))
    if not NAME_RE.match(name):
        raise BadInput(f"recipe name {name!r} is not a plain name", where=doc.where("recipe", "name"),
                       hint="use letters, digits, '.', '_' and '-' (at most 64)")
    locks = tuple(_lock_path(doc, path.parent, v, ("recipe", "locks", i))
                  for i, v in enumerate(expect_type(doc, rec.get("locks", []), list, ("recipe", "locks"))))
    toolchain = None
    if "toolchain" in data:
        tc = expect_type(doc, data["toolchain"], dict, ("toolchain",))
        check_keys(doc, tc, {"cuda", "lock"}, ("toolchain",))
        cuda = expect_type(doc, tc.get("cuda"), str, ("toolchain", "cuda"))
        if not re.fullmatch(r"\d+\.\d+", cuda):
            raise BadInput(f"toolchain.cuda must be MAJOR.MINOR, found {cuda!r}",
                           where=doc.where("toolchain", "cuda"), hint='for example cuda = "13.0"')
        if "lock" in tc:
            locks += (_lock_path(doc, path.parent, tc["lock"], ("toolchain", "lock")),)
        toolchain = Toolchain(cuda)
    if not locks:
        raise BadInput("the recipe names no lock", where=doc.where("recipe"),
                       hint='add locks = ["../manifests/NAME.txt"] under [recipe]')
    return Recipe(path, name, locks, toolchain, doc)


def _lock_path(doc: TomlDoc, folder: Path, value: object, key: tuple[str | int, ...]) -> Path:
    text = expect_type(doc, value, str, key)
    p = (folder / text).resolve()
    if not p.is_file():
        raise BadInput(f"lock file {text} does not exist (looked at {p})", where=doc.where(*key),
                       hint="paths are relative to the recipe's folder")
    return p
