"""A fixed-seed sample of issue 34's fuzz (tests/support/fuzz.py; bench/soak runs the full round): archives
mutated from a real export (link targets and chains, names, sizes, record fields, roots, the manifest, damaged
bytes) imported by the real CLI, and patches mutated from a real git patch (headers, paths, hunks) applied by
the real GNU patch. None may change the sentinel folder outside the root; every refusal is exit 2 with no
traceback (1 only for an archive larger than the free space) and publishes nothing."""

from __future__ import annotations

from pathlib import Path

from tests.support.cli import hermetic_env
from tests.support.fuzz import ARCHIVE_MUTATIONS, PATCH_MUTATIONS, run_fuzz

SEED = 34
ARCHIVES = 40
PATCHES = 16


def test_a_fixed_seed_sample_of_mutated_archives_and_patches(tmp_path: Path) -> None:
    env = hermetic_env(tmp_path / "home", tmp=tmp_path / "tmp")
    report = run_fuzz(tmp_path / "fuzz", env, ARCHIVES, PATCHES, SEED)
    for kind in ("archives", "patches"):
        part = report[kind]
        assert part["ok"] == part["trials"], "\n".join(
            f"{f['kind']} {f['n']} {'+'.join(f['mutations'])}: {'; '.join(f['problems'])[:600]}"
            for f in part["failed"])
    # the sample reaches the checks it is meant to: most refused, some accepted, many kinds of mutation
    assert report["archives"]["refused_exit_2"] >= ARCHIVES // 2 and report["archives"]["accepted"] >= 1
    assert len({k for k in report["archives"]["by_mutation"]}) >= len(ARCHIVE_MUTATIONS) // 2
    assert len({k for k in report["patches"]["by_mutation"]}) >= len(PATCH_MUTATIONS) // 2
