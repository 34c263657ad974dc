"""Bounded work (issue 34, item 6): every transfer has a whole-transfer deadline (a bytes-per-second floor
after a grace period, HERMETIC_TRANSFER_FLOOR and HERMETIC_TRANSFER_GRACE) and a size cap where nothing
declares a size (HERMETIC_DOWNLOAD_CAP); a stalled or flooding remote cache is a miss with a warning; an
archive that declares more than the free space is refused before anything is extracted.

The servers are real, on loopback (tests/support/slow_servers.py): one sends a byte every two seconds, one
streams without a Content-Length. Before the fix the first held realize for good (the timeout is per read):
here the command's own time limit (60 s) would fail the test instead."""

from __future__ import annotations

import hashlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermetic.errors import BadInput
from hermetic.fetch.session import TransferLimits
from tests.support import slow_servers
from tests.support.archives import honest_records, write_archive
from tests.support.cli import Hermetic
from tests.support.index import LoopbackIndex
from tests.support.recipes import make_pkg, pip_lock_line, write_recipe

FAST_LIMITS = {"HERMETIC_TRANSFER_FLOOR": "1024", "HERMETIC_TRANSFER_GRACE": "3"}


def _store_tmp_empty(root: Path) -> bool:
    tmp = root / "store" / "tmp"
    return not tmp.exists() or not any(tmp.iterdir())


def test_a_wheel_server_that_sends_a_byte_every_two_seconds_fails_within_the_deadline(
        tmp_path: Path, hermetic: Hermetic) -> None:
    with slow_servers.serve("trickle", interval=2.0, declared=1 << 20) as server:
        recipe = write_recipe(tmp_path / "r", "slow", f"slow @ {server.url}/slow-1.0-py3-none-any.whl "
                                                      f"--hash=sha256:{'a' * 64}\n")
        start = time.monotonic()
        res = hermetic("realize", recipe, env={**FAST_LIMITS, "PIP_RETRIES": "0"}, timeout=60)
        took = time.monotonic() - start
    assert res.rc == 1, (res.rc, res.err)
    assert "below the floor of 1024 bytes a second" in res.err and "HERMETIC_TRANSFER_FLOOR" in res.err
    assert "Traceback" not in res.err
    assert took < 30, took            # grace 3 s + one or two reads of 2 s
    assert server.sent.bytes < 10
    assert _store_tmp_empty(hermetic.root)


@pytest.mark.parametrize("where", ["a wheel URL in the lock", "the index"])
def test_a_server_that_sends_its_headers_a_byte_every_two_seconds_fails_within_the_deadline(
        tmp_path: Path, hermetic: Hermetic, where: str) -> None:
    """The attack on issue 34's fix (finding 2): the status line, then one header byte every 2 s. The deadline
    used to start with the body, so realize hung for good (killed at 200 s by the attacker; here the command's
    60 s limit would fail the test); a watchdog now shuts the connection at the deadline, headers included."""
    with slow_servers.serve("headers", interval=2.0) as server:
        if where == "the index":
            recipe = write_recipe(tmp_path / "r", "slowidx", f"slowidx==1.0 --hash=sha256:{'a' * 64}\n")
            env = {**FAST_LIMITS, "PIP_RETRIES": "0", "PIP_INDEX_URL": f"{server.url}/simple"}
        else:
            recipe = write_recipe(tmp_path / "r", "slow", f"slow @ {server.url}/slow-1.0-py3-none-any.whl "
                                                          f"--hash=sha256:{'a' * 64}\n")
            env = {**FAST_LIMITS, "PIP_RETRIES": "0"}
        start = time.monotonic()
        res = hermetic("realize", recipe, env=env, timeout=60)
        took = time.monotonic() - start
    assert res.rc == 1, (res.rc, res.err)
    assert "no complete response headers" in res.err and "HERMETIC_TRANSFER_GRACE" in res.err, res.err
    assert "Traceback" not in res.err
    assert took < 30, took            # grace 3 s, then the monitor's next look
    assert _store_tmp_empty(hermetic.root)


@pytest.fixture
def wheel_in_index(tmp_path: Path, index: LoopbackIndex) -> Iterator[Path]:
    w = make_pkg(tmp_path / "whl", "remotely", "1.0")
    index.add(w.path)
    yield write_recipe(tmp_path / "r", "remotely", pip_lock_line(w))


def test_a_stalled_remote_cache_is_a_miss_with_a_warning(tmp_path: Path, hermetic: Hermetic,
                                                          wheel_in_index: Path) -> None:
    """The remote answers /cas/ with a byte every two seconds: the realize warns, leaves the remote and
    fetches the wheel from the index."""
    with slow_servers.serve("trickle", interval=2.0, declared=1 << 20) as remote:
        start = time.monotonic()
        res = hermetic("realize", wheel_in_index, "--remote-cache", remote.url, env=FAST_LIMITS, timeout=60)
        took = time.monotonic() - start
    assert res.rc == 0, res.err
    assert "is unreachable" in res.err and "below the floor" in res.err, res.err
    assert took < 30, took
    assert _store_tmp_empty(hermetic.root)


def test_a_remote_cache_that_sends_its_headers_a_byte_at_a_time_is_a_miss(tmp_path: Path, hermetic: Hermetic,
                                                                          wheel_in_index: Path) -> None:
    """The remote answers /cas/ with its status line and then a header byte every two seconds: before the fix
    realize hung for good (even with HERMETIC_TRANSFER_GRACE=5 HERMETIC_REMOTE_CACHE_TIMEOUT=5); now the
    watchdog stops the request at the deadline, the realize warns, leaves the remote and fetches from the
    index."""
    with slow_servers.serve("headers", interval=2.0) as remote:
        start = time.monotonic()
        res = hermetic("realize", wheel_in_index, "--remote-cache", remote.url, env=FAST_LIMITS, timeout=60)
        took = time.monotonic() - start
    assert res.rc == 0, res.err
    assert "is unreachable" in res.err and "no complete response headers" in res.err, res.err
    assert took < 30, took
    assert _store_tmp_empty(hermetic.root)


def test_a_remote_body_of_no_declared_size_stops_at_the_cap(tmp_path: Path, hermetic: Hermetic,
                                                              wheel_in_index: Path) -> None:
    """The remote streams 64 MiB with no Content-Length for a blob of no known size. Before the fix all of
    it went into store/tmp (the limit was 1 TiB) before the hash refused it; now the transfer stops at the cap
    (1 MiB here) and what the server managed to send is bounded by the sockets' buffers."""
    with slow_servers.serve("flood", flood_total=64 << 20) as remote:
        res = hermetic("realize", wheel_in_index, "--remote-cache", remote.url,
                       env={"HERMETIC_DOWNLOAD_CAP": str(1 << 20)}, timeout=120)
        time.sleep(0.5)
        sent = remote.sent.bytes
    assert res.rc == 0, res.err
    assert "more than 1048576 bytes" in res.err and "HERMETIC_DOWNLOAD_CAP" in res.err, res.err
    assert sent < 16 << 20, sent
    assert _store_tmp_empty(hermetic.root)


@pytest.mark.parametrize(("name", "value"), [("HERMETIC_TRANSFER_FLOOR", "fast"),
                                             ("HERMETIC_TRANSFER_GRACE", "-1"),
                                             ("HERMETIC_DOWNLOAD_CAP", "0")])
def test_the_limits_are_checked(name: str, value: str) -> None:
    with pytest.raises(BadInput) as caught:
        TransferLimits.from_environment({name: value})
    assert caught.value.where == name
    assert TransferLimits.from_environment({}) == TransferLimits()


def _mount_tmpfs(mnt: Path, size: str) -> None:
    mnt.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({p.stderr.strip() or p.returncode}): needs root or CAP_SYS_ADMIN")


def test_an_archive_larger_than_the_free_space_is_refused_before_extracting(tmp_path: Path,
                                                                           hermetic: Hermetic) -> None:
    """96 MiB of zeros (a 4 KB archive) into a root on a 32 MiB tmpfs: refused from the manifest, nothing
    written. Before the fix the import wrote into store/tmp until the file system was full."""
    entries, blobs, roots = honest_records()
    zeros = bytes(96 << 20)
    digest = hashlib.sha256(zeros).hexdigest()
    blobs[digest] = zeros
    archive = write_archive(tmp_path / "zeros.tar.zst", entries, blobs, roots)
    assert archive.stat().st_size < 64 << 10
    mnt = tmp_path / "small"
    _mount_tmpfs(mnt, "32m")
    try:
        res = hermetic("import", archive, root=mnt / "root")
        assert res.rc == 1, (res.rc, res.err)
        assert "zeros.tar.zst holds" in res.err and "bytes free" in res.err and "nothing was imported" in res.err
        assert "no space left" not in res.err
        assert _store_tmp_empty(mnt / "root")
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
