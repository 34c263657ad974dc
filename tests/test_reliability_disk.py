"""Disk full: a realize whose root lives on a tiny tmpfs fails cleanly (exit 1, a clear error, no traceback),
leaves no partial entry (nothing new under entries/, nothing in store/tmp, verify clean) and realizes once
there is room. Needs `mount -t tmpfs` (root or CAP_SYS_ADMIN); skipped with the reason where not permitted."""

from __future__ import annotations

import json
import os
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import Hermetic
from tests.support.index import LoopbackIndex
from tests.support.recipes import pip_lock_line, write_recipe
from tests.support.trees import store_listing
from tests.support.wheels import build_wheel


@pytest.fixture
def tiny(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m,mode=0755", "tmpfs", str(mnt)], capture_output=True,
                       text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({p.stderr.strip() or p.returncode}): needs root or CAP_SYS_ADMIN")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _entries(root: Path) -> set[str]:
    folder = root / "store" / "entries"
    return set(os.listdir(folder)) if folder.exists() else set()


@pytest.mark.parametrize("step", ["download", "unpack"])
def test_a_full_disk_fails_cleanly_and_leaves_no_partial_entry(step: str, tmp_path: Path, tiny: Path,
                                                               hermetic: Hermetic, index: LoopbackIndex) -> None:
    rng = random.Random(3)
    small = build_wheel(tmp_path / "whl", "fits", "1.0", {"fits/a.py": "A = 1\n"})
    if step == "download":  # 4 MiB of random bytes: the download itself does not fit
        big = build_wheel(tmp_path / "whl", "big", "1.0", {"big/data.bin": rng.randbytes(4 << 20)})
    else:  # 60 KB that unpack to 6 MiB: the download fits, the unpacked files do not
        big = build_wheel(tmp_path / "whl", "big", "1.0", {f"big/f{i}.txt": f"{i}\n" * (1 << 17) for i in range(12)})
    index.add(small.path, big.path)
    root = tiny / "root"
    hermetic.root = root
    first = write_recipe(tmp_path / "r1", "first", pip_lock_line(small))
    hermetic("realize", first, check=True)  # something in the store already, which must stay as it was
    before_entries, before = _entries(root), store_listing(root)
    recipe = write_recipe(tmp_path / "r2", "full", pip_lock_line(small) + pip_lock_line(big))
    res = hermetic("realize", recipe, "--json")
    assert res.rc == 1, (res.rc, res.err[-3000:])
    assert "Traceback" not in res.err and "internal error" not in res.err, res.err[-3000:]
    assert res.err.startswith("error: ") and "hint: " in res.err
    assert "space" in res.err.splitlines()[0], res.err.splitlines()[0]
    error = json.loads(res.out.splitlines()[-1])["error"]
    assert error["where"] and error["hint"]
    assert _entries(root) == before_entries  # no partial entry, and no entry for a wheel that did not fit
    assert not any((root / "store" / "tmp").iterdir())
    assert {k: v for k, v in store_listing(root).items() if k in before} == before  # nothing touched
    assert hermetic("verify").rc == 0
    assert not (root / "profiles" / "full").exists()
    # room again: the same realize now succeeds
    subprocess.run(["mount", "-o", "remount,size=64m", str(tiny)], check=True)
    done = hermetic("realize", recipe, "--json")
    assert done.rc == 0, done.err[-3000:]
    assert hermetic("verify").rc == 0
