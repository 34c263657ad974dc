"""The package's shape (docs/architecture.md): rooms with one-way arrows and no import cycles, a no-op realize
that imports only what it needs, bench scripts that ruff lints, and a typed package."""

from __future__ import annotations

import ast
import json
import os
import site
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.support.cli import REPO, Hermetic
from tests.support.index import LoopbackIndex
from tests.support.recipes import make_pkg, pip_lock_line, write_recipe

PACKAGE = REPO / "hermetic"

# The rooms, highest first: a module may import from its own room and from rooms ranked below it, never above
# (docs/architecture.md draws the same table). Single modules are rooms of their own.
RANK = {
    "__main__": 100, "cli": 90, "run": 80, "realize": 70, "remote": 60, "extensions": 50, "wheels": 40, "fetch": 35,
    "locks": 30, "store": 20, "recipe": 15, "config": 13, "keys": 12, "interpreter": 11, "sandbox": 11, "audit": 11,
    "procs": 10, "reporter": 10, "tomlutil": 10, "urls": 10, "root": 6, "fs": 5, "errors": 0,
}

# What a no-op realize imports (tests/test_architecture.py::test_noop_realize_imports_no_more_than_before): every
# hermetic module, and every top-level standard-library module, beyond what the interpreter imports at start-up
# by itself (``python -S``: the same list in a pyenv interpreter and a fresh venv, whatever .pth files they hold).
# A change that makes a no-op import more must add it here, on purpose.
NOOP_HERMETIC = {
    "hermetic", "hermetic.cli", "hermetic.cli.commands", "hermetic.cli.main", "hermetic.cli.parser",
    "hermetic.errors", "hermetic.fs", "hermetic.realize", "hermetic.realize.noop", "hermetic.reporter",
    "hermetic.root", "hermetic.store", "hermetic.urls",
}
NOOP_STDLIB = {
    "__future__", "_ast", "_bisect", "_blake2", "_bz2", "_collections", "_collections_abc", "_compression",
    "_functools", "_hashlib", "_json", "_locale", "_lzma", "_opcode", "_operator", "_random", "_sha512", "_sre",
    "_stat", "_typing", "_weakrefset", "argparse", "ast", "bisect", "bz2", "collections", "contextlib", "copy",
    "copyreg", "dataclasses", "dis", "enum", "errno", "fcntl", "fnmatch", "functools", "genericpath", "gettext",
    "hashlib", "importlib", "inspect", "ipaddress", "itertools", "json", "keyword", "linecache", "locale", "lzma",
    "math", "ntpath", "opcode", "operator", "os", "pathlib", "posixpath", "random", "re", "reprlib", "shutil",
    "signal", "stat", "tempfile", "threading", "token", "tokenize", "types", "typing", "urllib", "warnings",
    "weakref", "zlib",
}


def module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Every hermetic module ``name`` imports anywhere: top level, inside functions, under TYPE_CHECKING."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                up = up[:len(up) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            # `from hermetic.store import gc` imports the module hermetic.store.gc; `from hermetic.store import
            # Store` imports hermetic.store
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        found.update(t for t in targets if t in known and t != name)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "hermetic"


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_cycles_in_functions_and_type_checking(tmp_path: Path) -> None:
    # the finder itself, on a package with the three kinds of import the real one must not cycle through
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "a.py").write_text("from p import b\n")
    (pkg / "b.py").write_text("def f():\n    from p.c import x\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p import a\n")
    known = {"p.a", "p.b", "p.c"}
    edges = {f"p.{n}": imports_of(f"p.{n}", pkg / f"{n}.py", known) for n in "abc"}
    assert edges == {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}}
    assert cycles(edges) == [["p.a", "p.b", "p.c"]]


def test_no_import_cycle_between_modules() -> None:
    found = cycles(graph())
    assert not found, f"import cycles: {found}"


def test_no_import_cycle_between_rooms_and_arrows_point_down() -> None:
    rooms: dict[str, set[str]] = {}
    upward = []
    for src, targets in graph().items():
        for dst in targets:
            a, b = room(src), room(dst)
            if a == b or b == "hermetic":  # the package's own __init__ holds the version only
                continue
            rooms.setdefault(a, set()).add(b)
            assert a in RANK and b in RANK, f"{src} or {dst} is in no room of RANK: add it there and to the doc"
            if RANK[a] <= RANK[b]:
                upward.append(f"{src} -> {dst}")
    assert not cycles(rooms), cycles(rooms)
    assert not upward, "imports against the arrows of docs/architecture.md:\n" + "\n".join(sorted(upward))


def test_every_room_is_documented() -> None:
    doc = (REPO / "docs" / "architecture.md").read_text()
    missing = [r for r in RANK if f"`{r}`" not in doc and f"`{r}/`" not in doc]
    assert not missing, f"docs/architecture.md does not describe: {missing}"
    assert sorted({room(m) for m in modules()} - {"hermetic"}) == sorted(RANK)


def test_measuring_child_imports_nothing_from_hermetic() -> None:
    # it runs in the host interpreter inside the realized environment: hermetic is not its library
    # ...but for its sibling compiling (compiled kernel sets, the kernel caches), which imports nothing either
    assert imports_of("hermetic.run.child", PACKAGE / "run" / "child.py", set(modules())) == {"hermetic.run.compiling"}
    assert imports_of("hermetic.run.compiling", PACKAGE / "run" / "compiling.py", set(modules())) == set()
    init = ast.parse((PACKAGE / "run" / "__init__.py").read_text())
    assert all(isinstance(n, ast.Expr) for n in init.body), "run/__init__.py holds a docstring only"


# Run with -S: the baseline is what this interpreter imports at start-up by itself, not what the .pth files of
# its site-packages happen to import (a pyenv interpreter's imported 20 more modules than a fresh venv's, which
# hid them from this budget there). Site-packages still go on the path, unprocessed: a third-party import is
# found, and named below.
NOOP_DRIVER = """
import sys
before = set(sys.modules)
sys.path.extend(sys.argv[2].split(":"))
from hermetic.cli.main import main
code = main(sys.argv[3:])
new = sorted(set(sys.modules) - before)
import json
with open(sys.argv[1], "w") as f:
    json.dump({"code": code, "new": new}, f)
"""


def test_noop_realize_imports_no_more_than_before(tmp_path: Path, hermetic: Hermetic, index: LoopbackIndex) -> None:
    a = make_pkg(tmp_path / "whl", "alpha", "1.0")
    index.add(a.path)
    recipe = write_recipe(tmp_path / "r", "env1", pip_lock_line(a))
    hermetic("realize", recipe, check=True)
    out = tmp_path / "imported.json"
    p = subprocess.run([sys.executable, "-S", "-c", NOOP_DRIVER, str(out), os.pathsep.join(site.getsitepackages()),
                        "--root", str(hermetic.root), "realize", str(recipe)],
                       capture_output=True, text=True, env=hermetic.env, cwd=REPO, timeout=120)
    assert p.returncode == 0, p.stderr
    got = json.loads(out.read_text())
    assert got["code"] == 0 and "up to date" in p.stderr
    new = set(got["new"])
    ours = {m for m in new if m == "hermetic" or m.startswith("hermetic.")}
    stdlib = {m.split(".")[0] for m in new - ours if m.split(".")[0] in sys.stdlib_module_names}
    other = sorted(m for m in new - ours if m.split(".")[0] not in sys.stdlib_module_names)
    assert not other, f"a no-op imports third-party modules: {other}"
    assert ours <= NOOP_HERMETIC, f"a no-op imports more of hermetic: {sorted(ours - NOOP_HERMETIC)}"
    grown = sorted(m for m in stdlib if m not in NOOP_STDLIB)
    assert not grown, f"a no-op imports more of the standard library: {grown}"


def test_ruff_lints_every_bench_script() -> None:
    scripts = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "bench").iterdir()
                     if p.is_file() and not p.suffix and p.read_bytes().startswith(b"#!/usr/bin/env python"))
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert scripts and sorted(config["tool"]["ruff"]["extend-include"]) == scripts


def test_package_is_typed() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert (PACKAGE / "py.typed").is_file()
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["hermetic"]
    assert os.path.getsize(PACKAGE / "py.typed") == 0


# Who may write files by hand: fs (the primitives) and the store (its own files). Everyone else calls them.
WRITERS = {"hermetic/fs.py"}
WRITER_ROOMS = ("hermetic/store/",)
# The few other writers, each with its reason.
WRITE_ALLOWED = {
    "hermetic/run/child.py": "the measuring process imports nothing from hermetic (it runs in the host "
                             "interpreter inside the realized environment); it writes its results file once",
    "hermetic/extensions/costwrap.py": "the compile wrapper runs under ninja without site or hermetic (python -S); "
                                       "it writes one small JSON file, through a temp file renamed into place",
    "hermetic/extensions/distwrap.py": "runs ninja beside sccache's daemon without site or hermetic (python -S); "
                                       "it writes the daemon's statistics once",
    "hermetic/extensions/distguard.py": "one compile sent to the build cluster, under ninja without site or "
                                        "hermetic (python -S); it makes an empty mark file once",
    "hermetic/extensions/nvccsplit.py": "one nvcc compile as its steps, under ninja without site or hermetic "
                                        "(python -S); it writes the compile's dependency file, as nvcc -MD does",
    "hermetic/run/pipeline.py": "the worker's log, written line by line while the child prints: a growing log "
                                "cannot be written atomically",
}


def _writes(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of every hand-made write: a write-mode open, os.replace/rename, shutil.copy*, tempfile.*,
    Path.write_text/write_bytes."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = ast.unparse(f)
        if isinstance(f, ast.Name) and f.id == "open" or isinstance(f, ast.Attribute) and f.attr in ("open", "fdopen"):
            # open(path, mode) and os.fdopen(fd, mode); Path.open(mode)
            positional = 0 if isinstance(f, ast.Attribute) and f.attr == "open" and ast.unparse(f.value) != "os" else 1
            mode = node.args[positional] if len(node.args) > positional else None
            mode = next((k.value for k in node.keywords if k.arg == "mode"), mode)
            if isinstance(mode, ast.Constant) and isinstance(mode.value, str) and set(mode.value) & set("wax+"):
                found.append((node.lineno, f"{name}(..., {mode.value!r})"))
        elif name in ("os.replace", "os.rename", "os.renames") or name.startswith(("shutil.copy", "tempfile.")) \
                or isinstance(f, ast.Attribute) and f.attr in ("write_text", "write_bytes"):
            found.append((node.lineno, name))
    return found


def test_writes_by_hand_only_in_fs_and_the_store() -> None:
    offenders = []
    for path in modules().values():
        rel = path.relative_to(REPO).as_posix()
        if rel in WRITERS or rel.startswith(WRITER_ROOMS) or rel in WRITE_ALLOWED:
            continue
        offenders += [f"{rel}:{line}: {what}" for line, what in _writes(ast.parse(path.read_text()))]
    assert not offenders, "write through hermetic.fs or the store instead:\n" + "\n".join(offenders)


def test_the_write_check_sees_each_kind_of_write() -> None:
    code = ("open(p, 'w')\nopen(p, mode='ab')\nPath(p).open('x')\nos.replace(a, b)\nshutil.copyfile(a, b)\n"
            "tempfile.mkstemp()\np.write_text('x')\nos.fdopen(fd, 'wb')\nopen(p)\nopen(p, 'rb')\nPath(p).open()\n")
    assert [line for line, _ in _writes(ast.parse(code))] == [1, 2, 3, 4, 5, 6, 7, 8]
    for rel in WRITE_ALLOWED:  # an allowed writer that no longer writes leaves the list
        assert _writes(ast.parse((REPO / rel).read_text())), rel
