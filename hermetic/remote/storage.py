"""The remote cache as hermetic uses it, over any ``backend.Backend`` (as ccache's ``Storage`` over its small
backends): the one place that verifies what comes back, counts what happened and warns about it, and gives up
on a server that keeps failing. The remote is an optional layer, never on the correctness path:

* every download is verified against its sha256 (and size where known) before anything sees it: nginx stores
  whatever body a PUT carries, under any name; a blob answered with other bytes is overwritten by the next
  upload of it (no HEAD first);
* any failure (refused, timeout, HTTP error, a bad body, a missing blob an action entry names) is a miss and a
  warning; after a transport failure, or ``FAILURES_BEFORE_GIVING_UP`` failures, the remote is left alone for
  the rest of the command, so a dead server costs one timeout, not one per object;
* a server that refuses uploads (401, 403, 405) is read from only; uploads ask first whether the server has the
  blob and skip what it has; CAS blobs go up before the action entry that names them (``remote.layout``).

Messages and records carry redacted URLs only.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermetic import fs
from hermetic.remote.actionresult import SHA256_RE, OutputFile, decode_action_result, encode_action_result
from hermetic.remote.backend import Area, Backend, Refused, TooLarge, Unreachable
from hermetic.remote.settings import RemoteSettings
from hermetic.reporter import Reporter
from hermetic.urls import redact_text

MAX_AC_BYTES = 4 << 20      # an action entry is a list of digests: anything larger is not ours
FAILURES_BEFORE_GIVING_UP = 5
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


@dataclass
class RemoteStats:
    hits: int = 0            # verified blobs and entries received
    misses: int = 0          # answered "not there"
    uploads: int = 0         # PUTs the server accepted
    skipped_uploads: int = 0  # the server had it already
    bytes_down: int = 0
    bytes_up: int = 0
    failures: int = 0        # anything else: each one a warning


class _BadBody(Exception):
    pass


class Storage:
    """A remote cache's reads and writes, verified and counted; every failure a miss (None or False) and a
    warning, never an exception. Thread-safe: uploads and fetches run side by side (``remote.layout``)."""

    def __init__(self, backend: Backend, settings: RemoteSettings, reporter: Reporter, *, cap: int,
                 close: Callable[[], None] = lambda: None) -> None:
        self.backend, self.settings, self.reporter = backend, settings, reporter
        self.cap = cap                              # a blob of no known size is not read past it
        self._close = close
        self.stats = RemoteStats()
        self.unreachable: str | None = None         # set after a transport failure or too many failures
        self.read_only_reason: str | None = None    # set when the server refuses our writes
        self.wrong: set[str] = set()  # digests the server answered with other bytes: uploads overwrite them
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return self.settings.url

    @property
    def usable(self) -> bool:
        """False once the server proved unreachable: every later call is a miss without a request."""
        return self.unreachable is None

    @property
    def writable(self) -> bool:
        """Whether uploads are wanted (mode rw) and still accepted."""
        return self.settings.writable and self.unreachable is None and self.read_only_reason is None

    def close(self) -> None:
        self._close()

    def summary(self) -> dict[str, Any]:
        """For the receipt: where, how, and what happened (no credentials)."""
        return {**self.settings.record(), **self.stats.__dict__,
                "unreachable": self.unreachable, "writes_refused": self.read_only_reason}

    # reads ----------------------------------------------------------------------
    def get_ac(self, key: str) -> list[OutputFile] | None:
        """The output files of action entry ``key``; None on a miss or any failure."""
        data = self._get_bytes("ac", key, MAX_AC_BYTES)
        if data is None:
            return None
        try:
            return decode_action_result(data)
        except (ValueError, UnicodeDecodeError) as e:
            self.failed(f"action entry ac/{key[:16]}… is not an ActionResult ({e}); ignoring it")
            return None

    def get_cas_bytes(self, digest: str, max_size: int, *, listed: bool = False) -> bytes | None:
        """Blob ``digest`` in memory, verified; None on a miss, a wrong body or any failure. ``listed``:
        an action entry names it, so its absence is a failure (a warning), not a plain miss."""
        if digest == EMPTY_SHA256:
            return b""
        data = self._get_bytes("cas", digest, max_size, listed=listed)
        if data is not None and hashlib.sha256(data).hexdigest() != digest:
            self._wrong_content(digest, f"other content (sha256 {hashlib.sha256(data).hexdigest()[:16]}…)")
            return None
        return data

    def get_cas_file(self, digest: str, directory: Path, *, size: int | None = None,
                     max_size: int = 1 << 40, listed: bool = False) -> Path | None:
        """Blob ``digest`` streamed into a new file in ``directory`` and verified (the caller moves it into
        the store); None, and no file left, on a miss, a wrong body or any failure."""
        if not self.usable or not SHA256_RE.match(digest):
            return None
        limit = size if size is not None else min(max_size, self.cap)
        try:
            body = self.backend.get("cas", digest, limit)
        except TooLarge as e:
            self._wrong_content(digest, f"a declared size of {e.declared} bytes, more than {limit}"
                                if e.declared is not None else f"more than {limit} bytes")
            return None
        except (Unreachable, Refused) as e:
            self._request_failed("GET", "cas", digest, e)
            return None
        if body is None:
            self._miss("cas", digest, listed)
            return None
        try:
            path = fs.new_temp_file(directory, ".remote-", ".part")
        except BaseException:
            body.close()   # nowhere to write it: the transfer ends unread
            raise
        try:
            try:
                sha256, got = fs.write_hashed(body, path, fresh=False)
            except TooLarge:
                raise _BadBody(f"more than {limit} bytes" + ("" if size is not None else " (HERMETIC_DOWNLOAD_CAP)")) \
                    from None
            finally:
                body.close()   # ends the transfer, read whole or not
            if size is not None and got != size:
                raise _BadBody(f"{got} bytes, expected {size}")
            if sha256 != digest:
                raise _BadBody(f"other content (sha256 {sha256[:16]}…)")
        except _BadBody as e:
            path.unlink(missing_ok=True)
            self._wrong_content(digest, str(e))
            return None
        except Unreachable as e:
            path.unlink(missing_ok=True)
            self._transport_failed(e)
            return None
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        with self._lock:
            self.stats.hits += 1
            self.stats.bytes_down += got
        return path

    def has_ac(self, key: str) -> bool | None:
        """Whether the server has action entry ``key``; None when it could not say."""
        return self._has("ac", key)

    # writes ---------------------------------------------------------------------
    def put_cas_file(self, digest: str, path: Path) -> bool:
        """Upload a local file as blob ``digest`` unless the server has it; True when it is there now."""
        return self._put_blob(digest, path)

    def put_cas_bytes(self, digest: str, data: bytes) -> bool:
        return self._put_blob(digest, data)

    def put_ac(self, key: str, files: list[OutputFile]) -> bool:
        """Write action entry ``key`` (the blobs it names must be uploaded first)."""
        return self._put("ac", key, encode_action_result(files))

    def _put_blob(self, digest: str, body: bytes | Path) -> bool:
        if digest == EMPTY_SHA256:
            return True  # bazel-remote always has the empty blob and refuses to be sent it
        if not self.writable:
            return False
        if digest not in self.wrong:
            there = self._has("cas", digest)
            if there:
                with self._lock:
                    self.stats.skipped_uploads += 1
                return True
            if there is None:
                return False
        return self._put("cas", digest, body)

    def _put(self, area: Area, key: str, body: bytes | Path) -> bool:
        if not self.writable:
            return False
        try:
            size = len(body) if isinstance(body, bytes) else body.stat().st_size
            self.backend.put(area, key, body)
        except (Unreachable, Refused) as e:
            self._request_failed("PUT", area, key, e)
            return False
        with self._lock:
            self.stats.uploads += 1
            self.stats.bytes_up += size
        return True

    # the rules every backend shares ---------------------------------------------
    def _get_bytes(self, area: Area, key: str, max_size: int, *, listed: bool = False) -> bytes | None:
        if not self.usable:
            return None
        data = bytearray()
        try:
            body = self.backend.get(area, key, max_size)
            if body is None:
                self._miss(area, key, listed)
                return None
            try:
                for chunk in body:
                    data += chunk
            finally:
                body.close()   # ends the transfer, read whole or not
        except TooLarge:
            self.failed(f"{area}/{key}"[:20] + f"… from the remote cache is larger than {max_size} bytes; "
                        "ignoring it")
            return None
        except (Unreachable, Refused) as e:
            self._request_failed("GET", area, key, e)
            return None
        with self._lock:
            self.stats.hits += 1
            self.stats.bytes_down += len(data)
        return bytes(data)

    def _has(self, area: Area, key: str) -> bool | None:
        if not self.usable:
            return None
        try:
            there = self.backend.has(area, key)
        except (Unreachable, Refused) as e:
            self._request_failed("HEAD", area, key, e)
            return None
        if not there:
            with self._lock:
                self.stats.misses += 1
        return there

    def _miss(self, area: Area, key: str, listed: bool) -> None:
        with self._lock:
            self.stats.misses += 1
        if listed:
            self.failed(f"{area}/{key}"[:20] + "… is named by an action entry but missing from the server")

    def _request_failed(self, method: str, area: Area, key: str, e: Unreachable | Refused) -> None:
        if isinstance(e, Unreachable):
            self._transport_failed(e)
            return
        what = f"{method} " + f"{area}/{key}"[:20] + f"…: {e}"
        if method == "PUT" and e.status in (401, 403, 405):
            with self._lock:
                first = self.read_only_reason is None
                self.read_only_reason = f"HTTP {e.status}"
            if first:
                self._warn(f"the remote cache {self.url} refuses uploads ({what}); reading only from now on",
                           hint="give the URL writer credentials (user:password@) or HERMETIC_REMOTE_CACHE_TOKEN, "
                                "or use --remote-cache-mode ro")
        elif method == "PUT" and e.status == 413:
            self.failed(f"{what}: the blob is larger than the server accepts (nginx: client_max_body_size)")
        else:
            self.failed(what)

    def _wrong_content(self, digest: str, what: str) -> None:
        with self._lock:
            self.wrong.add(digest)
        self.failed(f"blob cas/{digest[:16]}… from the remote cache has {what}; ignoring it")

    def _transport_failed(self, e: Unreachable) -> None:
        with self._lock:
            first = self.unreachable is None
            self.unreachable = str(e)
            self.stats.failures += 1
        if first:
            self._warn(f"the remote cache {self.url} is unreachable ({e}); continuing without it",
                       hint="builds fall back to local compiles; check the server or --remote-cache")

    def failed(self, what: str) -> None:
        """A bad answer (an HTTP error, a wrong body, an invalid entry): a miss and a warning; the remote is left
        alone after ``FAILURES_BEFORE_GIVING_UP`` of them."""
        with self._lock:
            self.stats.failures += 1
            give_up = self.stats.failures >= FAILURES_BEFORE_GIVING_UP and self.unreachable is None
            if give_up:
                self.unreachable = f"{self.stats.failures} failures"
        self._warn(f"remote cache {self.url}: {what}")
        if give_up:
            self._warn(f"the remote cache {self.url} failed {FAILURES_BEFORE_GIVING_UP} times; "
                       "continuing without it")

    def _warn(self, message: str, hint: str | None = None) -> None:
        text = redact_text(message) + (f" (hint: {hint})" if hint else "")
        with self._lock:
            self.reporter.warn(text, remote=self.url)
