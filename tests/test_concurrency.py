"""Concurrent realizes of one recipe on one root: all succeed, each wheel is fetched and unpacked once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, Hermetic, make_pkg, pip_lock_line, tree_snapshot, write_recipe
from tests.support.index import LoopbackIndex


def test_four_realizes_at_once_build_each_entry_once(tmp_path: Path, hermetic: Hermetic,
                                                     index: LoopbackIndex) -> None:
    wheels = [make_pkg(tmp_path / "whl", f"pkg{i}", "1.0") for i in range(4)]
    index.add(*(w.path for w in wheels))
    recipe = write_recipe(tmp_path / "r", "conc", "".join(pip_lock_line(w) for w in wheels))
    cmd = [sys.executable, "-m", "hermetic", "--root", str(hermetic.root), "realize", str(recipe), "--json"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=hermetic.env, cwd=REPO) for _ in range(4)]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _out, err in outputs]
    records = [json.loads(line) for out, _err in outputs for line in out.splitlines()]
    unpacked = [r for r in records if r.get("event") == "unpacked"]
    fetched = [r for r in records if r.get("event") == "fetched"]
    assert len(unpacked) == 4 and len(fetched) == 4  # one per wheel, across all four processes
    file_gets = [r for r in index.state.requests if r.startswith("/files/")]
    assert len(file_gets) == 4
    trees = {json.loads(out.splitlines()[-1])["tree"] for out, _err in outputs}
    assert len(trees) == 1
    assert len(tree_snapshot(hermetic.root / "profiles" / "conc")) == 4 * (33 + 4)  # files + dist-info
    assert hermetic("verify").rc == 0
