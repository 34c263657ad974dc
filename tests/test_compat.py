"""What an earlier hermetic wrote is read unchanged: its store, its receipts, its gc roots and the entries it
put in a remote cache.

``COMPAT_BASE`` is the newest commit whose formats this code must read as they are. The code of that commit
(``git archive``) realizes a small recipe that builds (a C++ extension and a wheel from a loopback index)
into a root with a read-write remote cache. This checkout's first realize there fetches, compiles and links
nothing and rewrites no file of the store; it may re-derive the caches under state/ once (they are caches,
versioned by folder: root.CACHES), and so certify the build again; its second realize is a no-op that
writes nothing at all. It reuses every object and module, verifies the root clean, and fills an empty root
at the same path from the remote alone. Move COMPAT_BASE forward only with a deliberate format change of
the store, the receipts or the remote entries (and a format bump or salt that says so).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermetic.root import Root
from tests.support import cli
from tests.support.cli import REPO, hermetic_env
from tests.support.index import LoopbackIndex
from tests.support.nginx import Nginx
from tests.support.recipes import make_pkg, pip_lock_line, recipe_toml
from tests.support.trees import bad_records, listing, store_listing

# the last commit before object keys became path-independent (keys.SALT v2, remote.layout.AC_SALT v2)
COMPAT_BASE = "0528f64184f4d247568de11ab74ef50400c0d464"
# True while this code's object keys differ from COMPAT_BASE's (a salt bump): the base's objects and action
# entries are misses then, compiled again, and gc removes the old ones. Back to False when the base moves on.
KEYS_CHANGED = True
# the last commit whose unpacker was at version 2 (keys.UNPACKER_VERSION): entries are unpacked again under
# version 3's keys, and the files of the toolchain's tree, hence every object key, stay as they were
UNPACKER_BASE = "ea6189e624e9e960eb492221a9bfd5be1cb10d8c"

SOURCE = """\
// A module that needs nothing but Python.h: the build is real (g++, torch's flags, the link against torch)
// and takes a second.
#include <Python.h>
static struct PyModuleDef compat_module = {PyModuleDef_HEAD_INIT, "compat_ext", nullptr, -1, nullptr};
PyMODINIT_FUNC PyInit_compat_ext(void) { return PyModule_Create(&compat_module); }
"""

RECIPE = recipe_toml("compat", locks=["env.txt"], toolchain=True, sources={"src": "src"}, jobs=2,
                     extensions=['name = "compat_ext"\nsource = "src"\nsources = ["*.cpp"]'])


def code_of(commit: str, out: Path) -> Path:
    """The package as ``commit`` had it, unpacked from this repository's history into ``out``."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "hermetic"], capture_output=True)
    assert archive.returncode == 0, (
        f"commit {commit[:12]} is not in this clone (git says: {archive.stderr.decode().strip()}); the "
        "compatibility test needs the repository's history (a full `git clone`)")
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    return out


@pytest.fixture(scope="module")
def base_code(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return code_of(COMPAT_BASE, tmp_path_factory.mktemp("base"))


@pytest.fixture
def nginx(tmp_path: Path) -> Iterator[Nginx]:
    server = Nginx(tmp_path / "server")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def hermetic(code: Path | None, root: Path, home: Path, *args: str | Path,
             env: dict[str, str] | None = None) -> tuple[int, dict[str, object], str]:
    """``python -m hermetic`` from ``code`` (an old checkout) or this one; (exit code, result record, stderr)."""
    p = cli.run(root, *args, "--json", env=hermetic_env(home, extra=env), code=code)
    return p.rc, p.result, p.err



def seed_wheels(shared_root: Path, root: Path) -> None:
    """The toolchain's wheel files from the session's shared root (so nothing is downloaded again), in a root
    made as hermetic makes one (its marker first: a folder of files without it is no root, issue 34)."""
    Root(root).ensure()
    store = shared_root / "store"
    for meta_path in (store / "entries").glob("*/meta.json"):
        meta = json.loads(meta_path.read_text())
        if meta.get("kind") == "unpacked":
            digest = meta["wheel"]
            dst = root / "store" / "blobs" / digest[:2] / digest
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.link(store / "blobs" / digest[:2] / digest, dst)


def test_a_root_and_a_remote_cache_written_by_the_base_commit_are_read_unchanged(
        tmp_path: Path, base_code: Path, shared_root: Path, index: LoopbackIndex, nginx: Nginx) -> None:
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "compat.cpp").write_text(SOURCE)
    (project / "cuda-13.0-toolchain.txt").write_text((REPO / "manifests" / "cuda-13.0-toolchain.txt").read_text())
    wheel = make_pkg(tmp_path / "whl", "alpha", "1.0")
    index.add(wheel.path)
    (project / "env.txt").write_text(pip_lock_line(wheel))
    recipe = project / "recipe.toml"
    recipe.write_text(RECIPE)
    root = tmp_path / "root"
    seed_wheels(shared_root, root)
    writer = {"PIP_INDEX_URL": index.simple_url, "HERMETIC_REMOTE_CACHE": nginx.writer_url,
              "HERMETIC_REMOTE_CACHE_MODE": "rw"}

    rc, old, err = hermetic(base_code, root, tmp_path / "home-a", "realize", recipe, env=writer)
    assert rc == 0, err
    assert old["counts"]["objects_compiled"] == 1 and old["changed"] is True  # type: ignore[index]
    assert bad_records(root) == {}  # what the base wrote passes today's checks of records read back
    before = store_listing(root)
    receipts = sorted((root / "receipts").iterdir())

    # this checkout: nothing fetched, compiled, linked or rewritten (new blobs at most: a certificate)...
    rc, first, err = hermetic(None, root, tmp_path / "home-a", "realize", recipe, env={"PIP_NO_INDEX": "1"})
    assert rc == 0, err
    assert first["changed"] is False and first["tree"] == old["tree"], (first, err[-3000:])
    assert first["counts"]["fetched"] == 0 and first["counts"].get("objects_compiled", 0) == 0  # type: ignore[index,union-attr]
    after = store_listing(root)
    assert before.items() <= after.items(), "a file of the store was rewritten or removed"
    assert all(p.startswith("blobs/") for p in set(after) - set(before)), sorted(set(after) - set(before))
    # the receipts there stay; a realize that went past the no-op check adds its own (issue 16)
    assert set(receipts) <= set((root / "receipts").iterdir()) <= {*receipts, Path(str(first["receipt"]))}
    # ... then a no-op that writes nothing anywhere in the root
    whole = listing(root, skip=("store",)) | store_listing(root)
    rc, noop, err = hermetic(None, root, tmp_path / "home-a", "realize", recipe, env={"PIP_NO_INDEX": "1"})
    assert rc == 0 and noop["changed"] is False and noop["receipt"] == first["receipt"], err
    assert listing(root, skip=("store",)) | store_listing(root) == whole
    rc, again, err = hermetic(None, root, tmp_path / "home-a", "realize", recipe, "--explain",
                              env={"PIP_NO_INDEX": "1"})
    assert rc == 0, err
    counts = again["counts"]
    receipt_a = json.loads(Path(str(again["receipt"])).read_text())
    assert counts["fetched"] == 0  # type: ignore[index]
    if KEYS_CHANGED:  # every step, asked for: the object's new key misses, so it is compiled beside the old one
        assert counts["objects_compiled"] == 1 and counts["objects_reused"] == 0  # type: ignore[index]
    else:
        assert counts["objects_compiled"] == 0 and counts["objects_reused"] == 1  # type: ignore[index]
        assert again["tree"] == old["tree"]
    rc, verified, err = hermetic(None, root, tmp_path / "home-a", "verify")
    assert rc == 0 and verified["problems"] == [], err
    rc, shown, err = hermetic(None, root, tmp_path / "home-a", "show")
    assert rc == 0 and "compat" in shown["roots"], err  # type: ignore[operator]
    if KEYS_CHANGED:
        # the base's object stays while its realize receipt names it (receipts are gc roots); forgetting the
        # recipe's realizations lets gc remove it with the rest
        def objects() -> list[str]:
            return [e for e in os.listdir(root / "store" / "entries") if "-obj-" in e]
        rc, collected, err = hermetic(None, root, tmp_path / "home-a", "gc")
        assert rc == 0 and len(objects()) == 2, err
        rc, collected, err = hermetic(None, root, tmp_path / "home-a", "gc", "--drop-root", "compat")
        assert rc == 0 and objects() == [], err

    # an empty root at the same path, no index: the wheel, the object and the module come from the base
    # commit's remote entries (the toolchain's wheels were never uploaded: they were not fetched there); with
    # new keys only the wheel does, and the object is compiled
    root.rename(tmp_path / "root-a")
    seed_wheels(shared_root, root)
    rc, fresh, err = hermetic(None, root, tmp_path / "home-b", "realize", recipe,
                              env={"PIP_NO_INDEX": "1", "HERMETIC_REMOTE_CACHE": nginx.url})
    assert rc == 0, err
    counts = fresh["counts"]
    assert counts["fetched"] == 1  # type: ignore[index]  # the alpha wheel, from the remote cache
    receipt = json.loads(Path(str(fresh["receipt"])).read_text())
    if KEYS_CHANGED:
        assert counts["objects_compiled"] == 1 and counts["objects_fetched-remote"] == 0, err  # type: ignore[index]
        assert receipt["remote"]["modules_fetched"] == 0
    else:
        assert counts["objects_compiled"] == 0 and counts["objects_fetched-remote"] == 1, err  # type: ignore[index]
        assert receipt["remote"]["modules_fetched"] == 1
    assert receipt["modules"][0]["sha256"] == receipt_a["modules"][0]["sha256"]


def test_an_unpacker_upgrade_keeps_the_toolchains_objects(tmp_path: Path, shared_root: Path) -> None:
    """Unpacker version 3 re-keys every unpacked entry (it keeps ``#!python`` lines); the toolchain's files do
    not change with it, so a root built by version 2 keeps its object: the first full realize of this code
    unpacks the wheels again and compiles nothing."""
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "compat.cpp").write_text(SOURCE)
    (project / "cuda-13.0-toolchain.txt").write_text((REPO / "manifests" / "cuda-13.0-toolchain.txt").read_text())
    recipe = project / "recipe.toml"
    recipe.write_text(recipe_toml("compat", toolchain=True, sources={"src": "src"}, jobs=2,
                                  extensions=['name = "compat_ext"\nsource = "src"\nsources = ["*.cpp"]']))
    root = tmp_path / "root"
    seed_wheels(shared_root, root)
    older = code_of(UNPACKER_BASE, tmp_path / "v2")
    offline = {"PIP_NO_INDEX": "1"}
    rc, old, err = hermetic(older, root, tmp_path / "home", "realize", recipe, env=offline)
    assert rc == 0 and old["counts"]["objects_compiled"] == 1, err  # type: ignore[index]
    assert bad_records(root) == {}
    rc, new, err = hermetic(None, root, tmp_path / "home", "realize", recipe, "--explain", env=offline)
    assert rc == 0, err
    counts = new["counts"]
    assert counts["unpacked"] == 5, counts  # type: ignore[index]  # under version 3's keys
    assert counts.get("objects_compiled", 0) == 0 and counts["objects_reused"] == 1, counts  # type: ignore[union-attr,index]
    assert new["tree"] == old["tree"]
