"""remote/storage.py, the one wrapper every remote backend goes through: verification, counts, warnings and the
give-up rule, tested over an in-memory backend of the three methods (get, put, has) whose answers a test sets:
a server that refuses, times out, errs, answers other bytes or more bytes than allowed. tests/test_remote.py runs
the same wrapper over the real Bazel HTTP backend against nginx on loopback."""

from __future__ import annotations

import hashlib
import io
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermetic.remote.actionresult import OutputFile, encode_action_result
from hermetic.remote.backend import Area, Refused, TooLarge, Unreachable
from hermetic.remote.settings import RemoteSettings
from hermetic.remote.storage import FAILURES_BEFORE_GIVING_UP, Storage
from hermetic.reporter import Reporter


class Tracked:
    """A body that says whether it was closed (a real one holds a connection and its watchdog until then)."""

    def __init__(self, pieces: Iterator[bytes]) -> None:
        self.pieces, self.closed = pieces, False

    def __iter__(self) -> Iterator[bytes]:
        return self.pieces

    def close(self) -> None:
        self.closed = True


class Memory:
    """A backend in memory: ``entries[(area, key)]``; ``fail`` raises the exception it holds at the next calls,
    ``refuse_put`` answers every PUT with that status, ``serve`` answers a GET with other bytes."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, str], bytes] = {}
        self.calls: list[tuple[str, str, str]] = []
        self.fail: Exception | None = None
        self.refuse_put: int | None = None
        self.serve: dict[str, bytes] = {}
        self.declared: int | None = None
        self.bodies: list[Tracked] = []

    def get(self, area: Area, key: str, limit: int) -> Iterator[bytes] | None:
        self.calls.append(("GET", area, key))
        if self.fail is not None:
            raise self.fail
        data = self.serve.get(key, self.entries.get((area, key)))
        if data is None:
            return None
        if self.declared is not None and self.declared > limit:
            raise TooLarge(limit, self.declared)

        def pieces() -> Iterator[bytes]:
            for i in range(0, len(data), 3):
                if i + 3 > limit:
                    raise TooLarge(limit)
                yield data[i:i + 3]
        body = Tracked(pieces())
        self.bodies.append(body)
        return body

    def put(self, area: Area, key: str, body: bytes | Path) -> None:
        self.calls.append(("PUT", area, key))
        if self.fail is not None:
            raise self.fail
        if self.refuse_put is not None:
            raise Refused(self.refuse_put, "Forbidden")
        self.entries[(area, key)] = body if isinstance(body, bytes) else body.read_bytes()

    def has(self, area: Area, key: str) -> bool:
        self.calls.append(("HEAD", area, key))
        if self.fail is not None:
            raise self.fail
        return (area, key) in self.entries


def storage(mode: str = "rw") -> tuple[Storage, Memory, io.StringIO]:
    out = io.StringIO()
    backend = Memory()
    settings = RemoteSettings("http://cache.example/c", mode, "the test", ("writer", "secret"), None, 5.0)
    return Storage(backend, settings, Reporter(stderr=out), cap=1 << 20), backend, out


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_what_comes_back_is_verified_and_counted(tmp_path: Path) -> None:
    s, b, _out = storage()
    assert s.put_cas_bytes(sha(b"abcdef"), b"abcdef") and s.get_cas_bytes(sha(b"abcdef"), 100) == b"abcdef"
    got = s.get_cas_file(sha(b"abcdef"), tmp_path, size=6)
    assert got is not None and got.read_bytes() == b"abcdef"
    files = [OutputFile("x/meta.json", sha(b"abcdef"), 6)]
    assert s.put_ac("k" * 64, files) and s.get_ac("k" * 64) == files
    assert s.has_ac("k" * 64) is True and s.has_ac("0" * 64) is False
    assert s.stats.hits == 3 and s.stats.uploads == 2 and s.stats.misses == 2 and s.stats.failures == 0
    assert s.summary()["url"] == "http://cache.example/c" and "secret" not in str(s.summary())


def test_the_empty_blob_costs_no_request() -> None:
    s, b, _out = storage()
    assert s.get_cas_bytes(sha(b""), 10) == b"" and s.put_cas_bytes(sha(b""), b"") and b.calls == []


def test_one_unreachable_server_is_one_warning_and_no_more_requests(tmp_path: Path) -> None:
    s, b, out = storage()
    b.fail = Unreachable("[Errno 111] Connection refused")
    assert s.get_ac("k" * 64) is None and not s.usable and not s.writable
    calls = len(b.calls)
    assert s.get_cas_bytes(sha(b"x"), 10) is None and s.get_cas_file(sha(b"x"), tmp_path) is None
    assert not s.put_cas_bytes(sha(b"x"), b"x") and s.has_ac("k" * 64) is None
    assert len(b.calls) == calls and out.getvalue().count("unreachable (") == 1
    assert "Connection refused" in out.getvalue() and s.summary()["unreachable"]


def test_failures_give_up_after_five(tmp_path: Path) -> None:
    s, b, out = storage()
    b.fail = Refused(503, "Service Unavailable")
    for i in range(FAILURES_BEFORE_GIVING_UP):
        assert s.get_cas_bytes(sha(bytes([i])), 10) is None
    assert "HTTP 503" in out.getvalue() and not s.usable
    calls = len(b.calls)
    assert s.get_cas_bytes(sha(b"later"), 10) is None and len(b.calls) == calls
    assert out.getvalue().count(f"failed {FAILURES_BEFORE_GIVING_UP} times; continuing without it") == 1


def test_a_server_that_refuses_uploads_is_read_from_only() -> None:
    s, b, out = storage()
    b.entries[("cas", sha(b"there"))] = b"there"
    b.refuse_put = 403
    assert not s.put_cas_bytes(sha(b"mine"), b"mine") and not s.writable and s.usable
    puts = [c for c in b.calls if c[0] == "PUT"]
    assert not s.put_ac("k" * 64, []) and [c for c in b.calls if c[0] == "PUT"] == puts
    assert s.get_cas_bytes(sha(b"there"), 10) == b"there"
    assert out.getvalue().count("refuses uploads (PUT cas/") == 1 and "HTTP 403" in out.getvalue()
    assert "secret" not in out.getvalue() and s.summary()["writes_refused"] == "HTTP 403"


def test_a_413_says_the_server_limit() -> None:
    s, b, out = storage()
    b.refuse_put = 413
    assert not s.put_cas_bytes(sha(b"big"), b"big") and "client_max_body_size" in out.getvalue() and s.writable


def test_other_bytes_are_a_miss_and_the_next_upload_overwrites_them(tmp_path: Path) -> None:
    s, b, out = storage()
    digest = sha(b"right")
    b.entries[("cas", digest)] = b"wrong"
    assert s.get_cas_bytes(digest, 100) is None and "has other content" in out.getvalue()
    assert s.get_cas_file(digest, tmp_path) is None and os.listdir(tmp_path) == []
    assert digest in s.wrong
    b.calls.clear()
    assert s.put_cas_bytes(digest, b"right") and b.calls == [("PUT", "cas", digest)]   # no HEAD first
    assert b.entries[("cas", digest)] == b"right"


def test_a_body_larger_than_allowed_leaves_no_file(tmp_path: Path) -> None:
    s, b, out = storage()
    data = b"x" * 30
    b.entries[("cas", sha(data))] = data
    assert s.get_cas_file(sha(data), tmp_path, max_size=10) is None and os.listdir(tmp_path) == []
    assert "more than 10 bytes" in out.getvalue()
    assert s.get_cas_file(sha(data), tmp_path, size=31) is None and "30 bytes, expected 31" in out.getvalue()
    b.declared = 1 << 30
    assert s.get_cas_file(sha(data), tmp_path) is None and "a declared size of 1073741824 bytes" in out.getvalue()
    assert s.get_cas_bytes(sha(data), 10) is None and "larger than 10 bytes" in out.getvalue()
    assert os.listdir(tmp_path) == []


def test_a_stalled_body_is_a_transport_failure_with_no_file_left(tmp_path: Path) -> None:
    s, b, out = storage()
    data = b"y" * 12
    b.entries[("cas", sha(data))] = data
    real = b.get

    def stalls(area: Area, key: str, limit: int) -> Iterator[bytes] | None:
        body = real(area, key, limit)
        assert body is not None

        def cut() -> Iterator[bytes]:
            yield next(iter(body))
            raise Unreachable("timed out")
        return cut()

    b.get = stalls  # type: ignore[method-assign]
    assert s.get_cas_file(sha(data), tmp_path) is None and os.listdir(tmp_path) == []
    assert "unreachable (timed out)" in out.getvalue() and not s.usable


def test_a_missing_blob_an_entry_names_is_a_failure_a_plain_miss_is_not() -> None:
    s, _b, out = storage()
    assert s.get_cas_bytes(sha(b"a"), 10) is None and s.stats.failures == 0 and out.getvalue() == ""
    assert s.get_cas_bytes(sha(b"a"), 10, listed=True) is None and s.stats.failures == 1
    assert "is named by an action entry but missing" in out.getvalue()


def test_an_action_entry_that_is_no_action_result_is_ignored() -> None:
    s, b, out = storage()
    b.entries[("ac", "k" * 64)] = b"\xff\xff\xff"
    assert s.get_ac("k" * 64) is None and "is not an ActionResult" in out.getvalue()
    b.entries[("ac", "j" * 64)] = b"x" * (5 << 20)
    assert s.get_ac("j" * 64) is None and "larger than" in out.getvalue()
    b.entries[("ac", "i" * 64)] = encode_action_result([])
    assert s.get_ac("i" * 64) == []


@pytest.mark.timeout(120)
def test_the_counts_add_up_across_threads() -> None:
    s, b, _out = storage()
    blobs = [os.urandom(8) for _ in range(400)]

    def work(part: list[bytes]) -> None:
        for data in part:
            assert s.put_cas_bytes(sha(data), data) and s.get_cas_bytes(sha(data), 100) == data

    threads = [threading.Thread(target=work, args=(blobs[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (s.stats.uploads, s.stats.hits, s.stats.misses, s.stats.bytes_up) == (400, 400, 400, 3200)


def test_every_body_is_closed_read_whole_or_not(tmp_path: Path) -> None:
    s, b, _out = storage()
    good, wrong, big = b"good bytes", sha(b"right"), b"z" * 40
    b.entries.update({("cas", sha(good)): good, ("cas", wrong): b"wrong", ("cas", sha(big)): big})
    assert s.get_cas_bytes(sha(good), 100) == good and s.get_cas_file(sha(good), tmp_path) is not None
    assert s.get_cas_bytes(wrong, 100) is None and s.get_cas_file(wrong, tmp_path) is None
    assert s.get_cas_bytes(sha(big), 10) is None and s.get_cas_file(sha(big), tmp_path, max_size=10) is None
    (tmp_path / "a-file").write_bytes(b"")
    with pytest.raises(OSError):   # nowhere to write it: an error of this machine, not of the server
        s.get_cas_file(sha(good), tmp_path / "a-file" / "below")
    assert len(b.bodies) == 7 and all(body.closed for body in b.bodies)
