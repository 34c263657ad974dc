"""Hostile input, one row per case (tests/support/hostile.py): path traversal and absolute paths in wheels and
sdists, escaping symlinks and hard links, decompression bombs, RECORD and hash and size mismatches, TOML with
unknown keys, wrong types and absurd values, recipe paths and patches leaving the repository, a package twice
in a lock, control characters in names, an export aimed at a read-only store file. Each must end with its exit
code and a clear error, leave the store exactly as it was and write nothing outside the root."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.hostile import CASES, Case, run_case, setup_root
from tests.support.reliability import FileServer, child_env, realize_toolchain, serve_files, toolchain_wheels_from


@dataclass
class Bench:
    work: Path
    root: Path
    server: FileServer
    env: dict[str, str]


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory, shared_root: Path) -> Iterator[Bench]:
    work = tmp_path_factory.mktemp("hostile")
    env = child_env(work / "home", work / "tmp")
    root = work / "root"
    realize_toolchain(root, env, work, toolchain_wheels_from(shared_root, work / "tc-wheels"))
    with serve_files(delay=0.0) as server:
        setup_root(root, work, env, server)
        yield Bench(work, root, server, env)


def test_the_table_has_every_kind_of_hostile_input() -> None:
    assert len(CASES) >= 20 and len({c.id for c in CASES}) == len(CASES)
    kinds = ("wheel-dotdot", "wheel-absolute", "sdist-dotdot", "sdist-absolute", "sdist-symlink", "wheel-bomb",
             "sdist-bomb", "wheel-record-mismatch", "lock-hash-mismatch", "lock-size-mismatch", "toml-unknown-key",
             "toml-wrong-type", "toml-absurd-cpus", "recipe-source-escapes", "patch-escapes", "lock-twice",
             "wheel-control-chars", "export-into-store", "archive-wrong-key", "archive-unknown-format",
             "archive-bad-tree-last")
    assert set(kinds) <= {c.id for c in CASES}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input(case: Case, bench: Bench) -> None:
    verdict = run_case(case, bench.work, bench.root, bench.server, bench.env)
    assert verdict.ok, "\n".join(verdict.problems)
    assert verdict.rc == case.code and verdict.clear and verdict.store_unchanged and not verdict.outside_root
    assert not os.path.exists(bench.work / case.id / "escape.py")
