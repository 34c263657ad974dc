"""Certified object reuse on a small real fixture (g++ and nvcc from the wheels): each test asserts exactly
which objects compile."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from tests.support.builds import Project

ALL = {"bindings.cpp", "clock.cpp", "host.cpp", "kern.cu", "named.cpp", "other.cpp"}


def compiled(decisions: dict[str, str]) -> set[str]:
    return {s for s, d in decisions.items() if d.startswith("compiled")}


def test_cold_then_noop_then_header_change(tmp_path: Path, shared_root: Path) -> None:
    proj = Project(tmp_path / "p", "hdr", shared_root)
    first = proj.realize()
    assert compiled(first.decisions) == ALL
    assert first.decisions["clock.cpp"] == "compiled-uncacheable"  # __TIME__: never stored
    again = proj.realize()
    assert again.result["changed"] is False
    assert again.result["counts"]["objects_compiled"] == 0  # type: ignore[index]
    proj.edit("util.h", "2 * scale(x)", "2 * scale(x) + 0")
    third = proj.realize()
    # util.h is read by bindings.cpp and host.cpp; clock.cpp is never reused (time macro)
    assert compiled(third.decisions) == {"bindings.cpp", "host.cpp", "clock.cpp"}
    assert {third.decisions[s] for s in ("kern.cu", "named.cpp", "other.cpp")} == {"reused"}
    reasons = {o["source"]: o["reason"] for o in third.certificate["objects"]}  # type: ignore[index]
    assert reasons["host.cpp"].startswith("input ") and reasons["host.cpp"].endswith("/util.h changed")


def test_module_name_variant_waives_the_name_where_no_input_mentions_it(tmp_path: Path, shared_root: Path) -> None:
    proj = Project(tmp_path / "p", "rename", shared_root)
    proj.realize()
    res = proj.realize("--variant", "renamed")
    # bindings.cpp uses TORCH_EXTENSION_NAME; name.h mentions it (a comment is enough to block the waiver)
    assert compiled(res.decisions) == {"bindings.cpp", "named.cpp", "clock.cpp"}
    assert {res.decisions[s] for s in ("host.cpp", "other.cpp", "kern.cu")} == {"reused-variant"}
    waived = {o["source"]: o["waived"] for o in res.certificate["objects"]}  # type: ignore[index]
    assert waived["other.cpp"] == ["TORCH_EXTENSION_NAME"]
    reasons = {o["source"]: o["reason"] for o in res.certificate["objects"]}  # type: ignore[index]
    assert "name.h mentions" in reasons["named.cpp"]
    # the store keeps objects zstd-compressed where that pays; a reused one is placed with its own bytes
    objs = {o["source"]: o for o in res.certificate["objects"]}  # type: ignore[index]
    for source in ("host.cpp", "other.cpp", "kern.cu"):
        placed = Path(objs[source]["object"])
        assert hashlib.sha256(placed.read_bytes()).hexdigest() == objs[source]["digest"]
    packed = [o for o in objs.values() if o["blob"] and o["blob"] != o["digest"]]
    assert {o["source"] for o in packed} >= {"host.cpp", "other.cpp"}
    for o in packed:
        blob = shared_root / "store" / "blobs" / o["blob"][:2] / o["blob"]
        assert blob.stat().st_size < 0.75 * Path(o["object"]).stat().st_size
        assert not (shared_root / "store" / "blobs" / o["digest"][:2] / o["digest"]).exists()


def test_a_define_used_by_one_file_rebuilds_that_file_only(tmp_path: Path, shared_root: Path) -> None:
    proj = Project(tmp_path / "p", "define", shared_root)
    proj.realize()
    res = proj.realize("--variant", "feature")
    assert compiled(res.decisions) == {"host.cpp", "clock.cpp"}
    assert res.decisions["bindings.cpp"] == "reused-variant"


def test_nvcc_append_flags_recompile_cuda_objects(tmp_path: Path, shared_root: Path) -> None:
    proj = Project(tmp_path / "p", "nvccenv", shared_root)
    proj.realize()
    res = proj.realize("--explain", env={"NVCC_APPEND_FLAGS": "-DEXTRA_FROM_ENV=1"})
    assert compiled(res.decisions) == {"kern.cu", "clock.cpp"}
    assert "kern.cu: compiled (environment variable NVCC_APPEND_FLAGS changed: None -> '-DEXTRA_FROM_ENV=1')" \
        in res.out


def test_host_code_under_ifndef_cuda_arch_recompiles(tmp_path: Path, shared_root: Path) -> None:
    proj = Project(tmp_path / "p", "hostcode", shared_root)
    proj.realize()
    proj.edit("kern.cu", "return scale(4);", "return scale(5);")
    res = proj.realize()
    assert compiled(res.decisions) == {"kern.cu", "clock.cpp"}


def test_comment_only_edits_reuse_unless_a_line_moves(tmp_path: Path, shared_root: Path) -> None:
    proj = Project(tmp_path / "p", "comments", shared_root)
    proj.realize()
    proj.edit("common.h", "// Shared constants of the reuse fixture.", "// Shared constants (reworded comment).")
    res = proj.realize()
    assert compiled(res.decisions) == {"clock.cpp"}  # every user of common.h reused, without preprocessing
    proj.edit("common.h", "#pragma once\n", "#pragma once\n\n")  # a blank line moves every line after it
    res = proj.realize()
    assert compiled(res.decisions) == {"bindings.cpp", "host.cpp", "other.cpp", "kern.cu", "clock.cpp"}


def test_comment_edits_recompile_under_line_info(tmp_path: Path, shared_root: Path) -> None:
    proj = Project(tmp_path / "p", "lineinfo", shared_root, cuda_cflags='"-lineinfo"')
    proj.realize()
    proj.edit("common.h", "// Shared constants of the reuse fixture.", "// Shared constants (reworded).")
    res = proj.realize()
    # -lineinfo keys kern.cu on raw bytes; the C++ units have no debug flag and stay reused
    assert compiled(res.decisions) == {"kern.cu", "clock.cpp"}


def test_a_tampered_stored_object_is_detected_and_rebuilt(tmp_path: Path, shared_root: Path) -> None:
    proj = Project(tmp_path / "p", "tamper", shared_root)
    first = proj.realize()
    objs = {o["source"]: o for o in first.certificate["objects"]}  # type: ignore[index]
    stored = objs["other.cpp"]["blob"]  # the object's blob, zstd-compressed when that pays
    blob = shared_root / "store" / "blobs" / stored[:2] / stored
    os.chmod(blob, 0o644)
    blob.write_bytes(blob.read_bytes() + b"\0")
    proj.edit("util.h", "2 * scale(x)", "2 * scale(x) + 0")  # something must change for a rebuild
    res = proj.realize()
    assert "other.cpp" in compiled(res.decisions)
    reasons = {o["source"]: o["reason"] for o in res.certificate["objects"]}  # type: ignore[index]
    assert "corrupt" in reasons["other.cpp"]
