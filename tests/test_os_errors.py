"""Every OS error a user can cause with a path is a clear error: the path named, a hint, PRODUCT.md's exit code
(2: bad input), no traceback. The suite runs as root, which permission bits do not stop: EACCES comes from
running hermetic as an unprivileged user (uid 65534), EROFS from a read-only tmpfs in a private mount
namespace, ENOTDIR and ELOOP from real files and symlinks on the path."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from hermetic.errors import BadInput
from hermetic.reporter import Reporter
from hermetic.run.devices import take_lock
from tests.support.cli import REPO, Hermetic, Result, command
from tests.support.index import LoopbackIndex
from tests.support.recipes import pip_lock_line, write_recipe
from tests.support.wheels import build_wheel


def _recipe(tmp_path: Path, index: LoopbackIndex) -> Path:
    wheel = build_wheel(tmp_path / "whl", "small", "1.0", {"small/a.py": "A = 1\n"})
    index.add(wheel.path)
    return write_recipe(tmp_path / "repo", "small", pip_lock_line(wheel))


def _clear(res: Result, code: int, *names: str | Path) -> dict[str, object]:
    """The error is clear: its exit code, a first line `error: ...` naming every one of ``names``, a hint, no
    traceback; the JSON result says the same. Returns the result's error record."""
    assert res.rc == code, (res.rc, res.err[-3000:])
    assert "Traceback" not in res.err and "internal error" not in res.err, res.err[-3000:]
    lines = res.err.strip().splitlines()
    error_lines = [i for i, line in enumerate(lines) if line.startswith("error: ")]
    assert error_lines, res.err
    first = lines[error_lines[-1]]
    assert lines[error_lines[-1] + 1].startswith("  hint: "), res.err
    for name in names:
        assert str(name) in first, (name, first)
    error = res.result["error"]
    assert error["where"] and error["hint"], error
    return dict(error)


def test_a_root_below_a_regular_file_is_bad_input(tmp_path: Path, hermetic: Hermetic, index: LoopbackIndex) -> None:
    recipe = _recipe(tmp_path, index)
    plain = tmp_path / "FILE"
    plain.write_text("a regular file\n")
    for args in (("realize", recipe), ("show",), ("gc", "--dry-run"), ("verify",)):
        res = hermetic(*args, "--json", root=plain / "sub")
        error = _clear(res, 2, plain, plain / "sub")
        assert "not a folder" in str(error["what"]), error
    assert plain.read_text() == "a regular file\n"


def test_a_symlink_loop_is_bad_input(tmp_path: Path, hermetic: Hermetic, index: LoopbackIndex) -> None:
    recipe = _recipe(tmp_path, index)
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    res = hermetic("realize", recipe, "--json", root=tmp_path / "a" / "root")  # the root's path loops
    assert "loop of symbolic links" in str(_clear(res, 2, tmp_path / "a")["what"])
    res = hermetic("realize", tmp_path / "a", "--json")                  # the recipe loops
    assert "loop of symbolic links" in str(_clear(res, 2, tmp_path / "a")["what"])
    lock = recipe.parent / "small.lock.txt"                              # a lock the recipe names loops
    lock.unlink()
    lock.symlink_to(lock)
    res = hermetic("realize", recipe, "--json")
    _clear(res, 2, lock)


def test_a_cache_folder_that_became_a_file_is_bad_input(tmp_path: Path, hermetic: Hermetic,
                                                         index: LoopbackIndex) -> None:
    recipe = _recipe(tmp_path, index)
    hermetic("realize", recipe, check=True)
    state = hermetic.root / "state"
    shutil.rmtree(state)
    state.write_text("in the way\n")  # every cache lives below state/
    res = hermetic("realize", recipe, "--json", env={"PIP_NO_INDEX": "1"})
    error = _clear(res, 2, state)
    # one of the root's own folders that is no folder (docs/layout.md, "A bad record"): repair makes it again
    assert "a file where hermetic's own folder belongs" in str(error["what"]), error
    assert "verify --repair" in str(error["hint"]), error


def test_a_root_on_a_read_only_file_system_is_bad_input(tmp_path: Path, hermetic: Hermetic,
                                                        index: LoopbackIndex) -> None:
    recipe = _recipe(tmp_path, index)
    mnt = tmp_path / "ro"
    mnt.mkdir()
    root = mnt / "root"
    # a private mount namespace: the read-only tmpfs exists only for this hermetic, and goes with it
    script = f'mount -t tmpfs -o ro,size=1m tmpfs "{mnt}" || exit 99; exec "$@"'
    p = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                        *command(root, "realize", recipe, "--json")],
                       capture_output=True, text=True, env=hermetic.env, cwd=REPO, timeout=300)
    if p.returncode == 99 or "unshare failed" in p.stderr:
        pytest.skip(f"cannot mount a tmpfs in a private mount namespace here: {p.stderr.strip()}")
    res = Result(p.returncode, p.stdout, p.stderr)
    assert "read-only file system" in str(_clear(res, 2, root)["what"])
    assert not root.exists()  # the tmpfs was private: nothing of it is left here


def _as_nobody() -> list[str]:
    """Run as uid/gid 65534 with no groups. CAP_DAC_READ_SEARCH (reading and searching, never writing) is kept
    only so that this interpreter, under /root, can start: every write is checked against uid 65534."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
            "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]


def test_a_root_this_user_may_not_write_is_bad_input(tmp_path: Path, hermetic: Hermetic,
                                                     index: LoopbackIndex) -> None:
    recipe = _recipe(tmp_path, index)
    owned = tmp_path / "owned"   # root's folder, mode 755: uid 65534 may enter and read, not create
    owned.mkdir(mode=0o755)
    os.chmod(tmp_path, 0o755)
    home = tmp_path / "nobody-home"
    home.mkdir()
    os.chown(home, 65534, 65534)
    env = {**hermetic.env, "HOME": str(home)}
    for root in (owned / "root", owned):
        p = subprocess.run([*_as_nobody(), *command(root, "realize", recipe, "--json")],
                           capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
        res = Result(p.returncode, p.stdout, p.stderr)
        error = _clear(res, 2, owned)
        assert "permission denied for uid 65534" in str(error["what"]), error
    assert os.listdir(owned) == []


def test_a_lock_folder_that_cannot_be_made_is_bad_input(tmp_path: Path) -> None:
    plain = tmp_path / "FILE"
    plain.write_text("")
    with pytest.raises(BadInput) as caught:
        take_lock(plain / "locks", "gpu-x.lock", 1.0, Reporter(json_mode=True), "GPU x")
    err = caught.value
    assert str(plain) in err.what and "lock folder" in err.what and "HERMETIC_LOCK_DIR" in (err.hint or "")


def test_a_missing_recipe_names_its_path(tmp_path: Path, hermetic: Hermetic) -> None:
    res = hermetic("realize", tmp_path / "nowhere" / "r.toml", "--json")
    _clear(res, 2, tmp_path / "nowhere" / "r.toml")
