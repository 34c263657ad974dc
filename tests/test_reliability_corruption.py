"""Corruption: a flipped bit in an object, a module, a certificate, a materialized toolchain file, an entry's
record. `hermetic verify` reports each (exit 1); realize repairs it or fails clearly; a corrupt byte is never
built into a module. (A flipped byte in a wheel's file and `verify --repair` refetching it:
tests/test_gc_verify_archive.py; a tampered object rebuilt by an edit: tests/test_reuse.py.)"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest

from hermetic.extensions.certificate import read_certificate
from hermetic.extensions.rebuild import normalized
from hermetic.root import Root
from hermetic.store import Store
from tests.support import cli
from tests.support.builds import Project, Realized
from tests.support.cli import REPO
from tests.support.reliability import child_env, realize_toolchain, toolchain_wheels_from


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory, shared_root: Path) -> Path:
    work = tmp_path_factory.mktemp("corrupt")
    env = child_env(work / "home", work / "tmp")
    realize_toolchain(work / "root", env, REPO, toolchain_wheels_from(shared_root, work / "tc-wheels"))
    return work / "root"


def flip_bit(path: Path, offset: int | None = None) -> None:
    """Flip one bit of a (read-only) store file in place: same inode, every hard link sees it."""
    mode = stat.S_IMODE(os.stat(path).st_mode)
    os.chmod(path, mode | 0o200)
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0x10
    with open(path, "r+b") as f:
        f.write(data)
    os.chmod(path, mode)


def verify(root: Path) -> tuple[int, list[dict[str, str]], str]:
    run = cli.run(root, "verify", "--json", env=dict(os.environ), cwd=REPO)
    return run.rc, run.result.get("problems", []), run.err


def project(tmp_path: Path, root: Path, name: str) -> tuple[Project, Realized]:
    proj = Project(tmp_path / "p", name, root)
    proj.edit("clock.cpp", "__TIME__", '"fixed"')
    return proj, proj.realize()


def full_realize(proj: Project, check: bool = True) -> Realized:
    """A realize past the no-op check (--explain asks for every step; a touched input whose bytes are the
    same is a no-op now: docs/builds.md, "A fresh checkout of the same bytes")."""
    return proj.realize("--explain", check=check)


def module_file(root: Path, name: str) -> Path:
    return next((root / "profiles" / name).glob("fixture_ext*.so"))


def test_a_flipped_object_is_reported_and_never_reused(tmp_path: Path, root: Path) -> None:
    proj, first = project(tmp_path, root, "cobj")
    obj = next(o for o in first.certificate["objects"] if o["source"] == "other.cpp")  # type: ignore[union-attr]
    store = Store(root / "store")
    flip_bit(store.blob_path(obj["blob"]))
    rc, problems, err = verify(root)
    assert rc == 1 and "Traceback" not in err
    assert {(p["kind"], p["name"]) for p in problems} >= {("blob", obj["blob"]), ("entry", obj["entry"])}
    # the renamed variant would reuse other.cpp's object across variants: it finds it corrupt and compiles
    renamed = proj.realize("--variant", "renamed")
    cert_obj = next(o for o in renamed.certificate["objects"] if o["source"] == "other.cpp")  # type: ignore[union-attr]
    assert cert_obj["decision"] == "compiled" and "corrupt" in cert_obj["reason"]
    assert cert_obj["blob"] != obj["blob"] or hashlib.sha256(
        store.blob_path(cert_obj["blob"]).read_bytes()).hexdigest() == cert_obj["blob"]
    assert renamed.decisions["host.cpp"] == "reused-variant"  # the sound objects still are reused
    assert verify(root)[0] == 0


def test_a_flipped_module_is_reported_then_relinked_and_healed(tmp_path: Path, root: Path) -> None:
    proj, _first = project(tmp_path, root, "cmod")
    so = module_file(root, "cmod")
    good = so.read_bytes()
    flip_bit(so)  # the profile's file is the module's blob: one inode
    rc, problems, _err = verify(root)
    assert rc == 1 and any(p["kind"] == "blob" for p in problems)
    assert any(p["kind"] == "entry" and "-mod-" in p["name"] and "corrupt" in p["what"] for p in problems)
    again = full_realize(proj)
    receipt = json.loads(Path(str(again.result["receipt"])).read_text())
    assert receipt["modules"][0]["linked"] is True  # not reused: linked again from the stored objects
    assert set(again.decisions.values()) == {"reused"}
    assert normalized(module_file(root, "cmod").read_bytes()) == normalized(good)
    assert so.read_bytes() == good  # healed in place: the tree that held the bad bytes holds good ones
    assert verify(root)[0] == 0


def test_a_flipped_certificate_is_reported_and_never_stands_for_a_realize(tmp_path: Path, root: Path) -> None:
    proj, first = project(tmp_path, root, "ccert")
    receipt = json.loads(Path(str(first.result["receipt"])).read_text())
    cert_blob = receipt["modules"][0]["certificate_blob"]
    store = Store(root / "store")
    flip_bit(store.blob_path(cert_blob), offset=len(store.blob_path(cert_blob).read_bytes()) - 3)
    rc, problems, _err = verify(root)
    assert rc == 1 and [p["name"] for p in problems if p["kind"] == "blob"] == [cert_blob]
    again = full_realize(proj, check=False)  # nothing to build: the receipt it would keep names a corrupt certificate
    assert again.rc == 0, again.err[-2000:]
    new = json.loads(Path(str(again.result["receipt"])).read_text())
    assert new["modules"][0]["certificate_blob"] != cert_blob
    assert read_certificate(store, new["modules"][0]["certificate_blob"])["module"] == "fixture_ext"
    run = cli.run(root, "verify", "--repair", "--json", env=dict(os.environ), cwd=REPO)
    assert run.rc == 0, run.err[-2000:]
    assert not store.blob_path(cert_blob).exists() and verify(root)[0] == 0


def test_a_flipped_certificate_written_again_is_healed_in_place(tmp_path: Path, root: Path) -> None:
    proj, _first = project(tmp_path, root, "cheal")
    full_realize(proj)  # every object reused: the certificate of a reuse (the build's last, in state/builds)
    cert_blob = Root(root).cache("builds").get("cheal.base.fixture_ext")
    path = Store(root / "store").blob_path(cert_blob)
    flip_bit(path, offset=len(path.read_bytes()) - 3)
    assert verify(root)[0] == 1
    full_realize(proj)  # the same certificate again: its blob is rewritten in place
    assert hashlib.sha256(path.read_bytes()).hexdigest() == cert_blob
    assert verify(root)[0] == 0


def test_a_replaced_materialized_file_is_reported_and_repaired(root: Path) -> None:
    header = root / "profiles" / "cuda-13.0" / "nvidia" / "cu13" / "include" / "cuda_runtime_api.h"
    good = header.read_bytes()
    folder_mode = stat.S_IMODE(header.parent.stat().st_mode)
    os.chmod(header.parent, 0o755)
    header.unlink()
    header.write_bytes(good.replace(b"cudaError_t", b"cudaErrr_t", 1))  # a new inode, other bytes
    os.chmod(header.parent, folder_mode)
    rc, problems, _err = verify(root)
    assert rc == 1 and any(p["kind"] == "tree" and "cuda_runtime_api.h" in p["what"] for p in problems)
    run = cli.run(root, "verify", "--repair", "--json", env=dict(os.environ), cwd=REPO)
    assert run.rc == 0, run.err[-2000:]
    assert header.read_bytes() == good
    assert verify(root)[0] == 0


def test_a_damaged_entry_record_fails_clearly_then_repair_mends(tmp_path: Path, root: Path) -> None:
    proj, first = project(tmp_path, root, "cmeta")
    store = Store(root / "store")
    src_entry = next(e for e in store.iter_entries() if e.endswith("-src-src"))  # the fixture's source tree
    meta = store.entry_path(src_entry) / "meta.json"
    os.chmod(meta, 0o644)
    meta.write_bytes(meta.read_bytes()[:-20])  # truncated: not JSON any more
    os.chmod(meta, 0o444)
    rc, problems, _err = verify(root)
    assert rc == 1 and any(p["name"] == src_entry and "meta.json" in p["what"] for p in problems)
    res = full_realize(proj, check=False)
    assert res.rc == 2 and "Traceback" not in res.err, res.err[-3000:]  # a bad record: docs/layout.md
    assert src_entry in res.err and "verify --repair" in res.err
    run = cli.run(root, "verify", "--repair", "--json", env=dict(os.environ), cwd=REPO)
    assert run.rc == 0, run.err[-2000:]
    assert proj.realize().result["ok"] is True
    assert first.result["tree"]


@pytest.mark.parametrize("table", ["hashes-v1/inputs.json", "includes-v1/includes.json"])
def test_a_folder_where_a_derived_table_belongs_is_a_miss(tmp_path: Path, root: Path, table: str) -> None:
    """The outside attack on issue 35 (finding 9): a folder at state/hashes-v1/inputs.json made the build exit 2
    naming `.inputs.json.<random>.tmp is a folder, not a file`; layout.md says a folder where a derived cache's
    record belongs is a miss: the table is derived again and written in its place."""
    proj, _first = project(tmp_path, root, "tablefolder")
    path = root / "state" / table
    written = path.is_file()   # the include table is written only by a build that predicts; a miss either way
    path.unlink(missing_ok=True)
    (path / "inside").mkdir(parents=True)
    again = full_realize(proj, check=False)
    assert again.rc == 0, again.err[-3000:]
    assert not written or (path.is_file() and json.loads(path.read_text()))
