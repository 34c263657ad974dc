"""A remote cache that speaks Bazel's HTTP cache protocol: ``/cas/<sha256>`` and ``/ac/<key>``.

Any server of that protocol works: nginx with WebDAV (``remote/nginx.conf``), bazel-remote, and others
(docs/remote.md). The remote is an optional layer, never on the correctness path:

* every download is verified against its sha256 (and size where known) before anything sees it: nginx
  stores whatever body a PUT carries, under any name;
* any failure (refused, timeout, HTTP error, bad body, a missing blob) is a miss and a warning; after a
  connection failure the remote is left alone for the rest of the command, so a dead server costs one
  timeout, not one per object;
* uploads send Content-Length (bazel-remote answers 400 to chunked uploads), ask HEAD first and skip what
  the server has; CAS blobs go up before the action entry that names them (``hermetic.remote.layout``).

Credentials arrive in the settings (``remote.settings``) and are never printed: messages and records carry
``redact``'ed URLs only. requests is imported only when a client is made.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermetic import fs
from hermetic.remote.actionresult import SHA256_RE, OutputFile, decode_action_result, encode_action_result
from hermetic.remote.settings import RemoteSettings
from hermetic.reporter import Reporter
from hermetic.urls import redact_text

if TYPE_CHECKING:
    import requests

    from hermetic.fetch.watchdog import Watchdog

MAX_AC_BYTES = 4 << 20      # an action entry is a list of digests: anything larger is not ours
FAILURES_BEFORE_GIVING_UP = 5
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
CHUNK = 1 << 20


@dataclass
class RemoteStats:
    hits: int = 0            # verified blobs and entries received
    misses: int = 0          # answered "not there"
    uploads: int = 0         # PUTs the server accepted
    skipped_uploads: int = 0  # HEAD said the server had it
    bytes_down: int = 0
    bytes_up: int = 0
    failures: int = 0        # anything else: each one a warning


class BazelHttpCache:
    """GET/HEAD/PUT on a Bazel HTTP cache; every failure is a miss (None/False) and a warning."""

    def __init__(self, settings: RemoteSettings, reporter: Reporter) -> None:
        import requests

        from hermetic.fetch import watched
        self.settings, self.reporter = settings, reporter
        self.session = requests.Session()
        watched.mount(self.session)   # every request under its transfer's watchdog, headers included
        self.session.headers["User-Agent"] = "hermetic"
        if settings.auth is not None:
            self.session.auth = settings.auth
        if settings.token is not None:
            self.session.headers["Authorization"] = f"Bearer {settings.token}"
        from hermetic.fetch.session import TransferLimits
        self.limits = TransferLimits.from_environment()
        self.stats = RemoteStats()
        self.unreachable: str | None = None    # set after a connection failure: reads and writes stop
        self.read_only_reason: str | None = None  # set when the server refuses our writes
        self.wrong: set[str] = set()  # digests the server answered with other bytes: uploads overwrite them
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return self.settings.url

    @property
    def usable(self) -> bool:
        return self.unreachable is None

    @property
    def writable(self) -> bool:
        return self.settings.writable and self.unreachable is None and self.read_only_reason is None

    def close(self) -> None:
        self.session.close()

    def summary(self) -> dict[str, Any]:
        """For the receipt: where, how, and what happened (no credentials)."""
        return {**self.settings.record(), **self.stats.__dict__,
                "unreachable": self.unreachable, "writes_refused": self.read_only_reason}

    # reads ----------------------------------------------------------------------
    def get_ac(self, key: str) -> list[OutputFile] | None:
        """The output files of action entry ``key``; None on a miss or any failure."""
        data = self._get_bytes(f"ac/{key}", MAX_AC_BYTES)
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
        data = self._get_bytes(f"cas/{digest}", max_size, listed=listed)
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
        with self._watchdog(f"cas/{digest[:16]}…") as watchdog:
            return self._get_cas_file(digest, directory, size, max_size, listed, watchdog)

    def _get_cas_file(self, digest: str, directory: Path, size: int | None, max_size: int, listed: bool,
                      watchdog: Watchdog) -> Path | None:
        resp = self._request("GET", f"cas/{digest}", listed=listed, stream=True)
        if resp is None or isinstance(resp, _Miss):
            return None
        from hermetic.fetch.session import TooLarge, read_body
        limit = size if size is not None else min(max_size, self.limits.cap)
        length = resp.headers.get("Content-Length", "")
        if length.isdigit() and int(length) > limit:  # refused before a byte is read
            resp.close()
            self._wrong_content(digest, f"a declared size of {length} bytes, more than {limit}")
            return None
        path = fs.new_temp_file(directory, ".remote-", ".part")
        try:
            with resp:
                try:  # under the whole-transfer deadline (a stall is a transport failure: a miss, a warning)
                    body = read_body(resp, f"cas/{digest[:16]}…", self.limits, cap=limit, decode=True,
                                     watchdog=watchdog)
                    sha256, got = fs.write_hashed(body, path, fresh=False)
                except TooLarge:
                    raise _BadBody(f"more than {limit} bytes"
                                   + ("" if size is not None else " (HERMETIC_DOWNLOAD_CAP)")) from None
            if size is not None and got != size:
                raise _BadBody(f"{got} bytes, expected {size}")
            if sha256 != digest:
                raise _BadBody(f"other content (sha256 {sha256[:16]}…)")
        except _BadBody as e:
            path.unlink(missing_ok=True)
            self._wrong_content(digest, str(e))
            return None
        except BaseException as e:
            path.unlink(missing_ok=True)
            if isinstance(e, Exception) and self._is_transport_error(e):
                self._transport_failed(e)
                return None
            raise
        with self._lock:
            self.stats.hits += 1
            self.stats.bytes_down += got
        return path

    def _wrong_content(self, digest: str, what: str) -> None:
        with self._lock:
            self.wrong.add(digest)
        self.failed(f"blob cas/{digest[:16]}… from the remote cache has {what}; ignoring it")

    def has(self, path: str) -> bool | None:
        """HEAD: True, False, or None when the remote could not say."""
        with self._watchdog(f"HEAD {path[:20]}…"):
            resp = self._request("HEAD", path)
        if isinstance(resp, _Miss):
            return False
        return None if resp is None else True

    # writes ---------------------------------------------------------------------
    def put_cas_file(self, digest: str, path: Path) -> bool:
        """Upload a local file as blob ``digest`` unless the server has it; True when it is there now."""
        if digest == EMPTY_SHA256:
            return True  # bazel-remote always has the empty blob and refuses to be sent it
        from hermetic.fetch.session import PacedReader
        with open(path, "rb") as f:  # paced: a server that reads a byte a second fails the deadline
            return self._put(f"cas/{digest}", lambda w: PacedReader(f, self.limits, f"cas/{digest[:16]}…", w),
                             os.fstat(f.fileno()).st_size, skip_existing=True)

    def put_cas_bytes(self, digest: str, data: bytes) -> bool:
        if digest == EMPTY_SHA256:
            return True
        return self._put(f"cas/{digest}", lambda _w: data, len(data), skip_existing=True)

    def put_ac(self, key: str, files: list[OutputFile]) -> bool:
        """Write action entry ``key`` (the blobs it names must be uploaded first)."""
        data = encode_action_result(files)
        return self._put(f"ac/{key}", lambda _w: data, len(data), skip_existing=False)

    def _put(self, path: str, body: Callable[[Watchdog], Any], size: int, *, skip_existing: bool) -> bool:
        """PUT ``body(watchdog)`` (the upload's body, paced by the transfer's watchdog where it is a file)."""
        if not self.writable:
            return False
        if skip_existing and path.rsplit("/", 1)[-1] not in self.wrong:
            there = self.has(path)
            if there:
                with self._lock:
                    self.stats.skipped_uploads += 1
                return True
            if there is None:
                return False
        # Content-Length always: bazel-remote refuses uploads without it, Bazel never sends chunked ones
        with self._watchdog(f"PUT {path[:20]}…") as watchdog:
            resp = self._request("PUT", path, data=body(watchdog),
                                 headers={"Content-Length": str(size), "Content-Type": "application/octet-stream"})
            if resp is None or isinstance(resp, _Miss):
                return False
            resp.close()
        with self._lock:
            self.stats.uploads += 1
            self.stats.bytes_up += size
        return True

    # transport ------------------------------------------------------------------
    def _get_bytes(self, path: str, max_size: int, *, listed: bool = False) -> bytes | None:
        with self._watchdog(f"{path[:20]}…") as watchdog:
            return self._get_bytes_watched(path, max_size, listed, watchdog)

    def _get_bytes_watched(self, path: str, max_size: int, listed: bool, watchdog: Watchdog) -> bytes | None:
        resp = self._request("GET", path, listed=listed, stream=True)
        if resp is None or isinstance(resp, _Miss):
            return None
        from hermetic.fetch.session import TooLarge, read_body
        try:
            with resp:
                data = bytearray()
                try:
                    for chunk in read_body(resp, f"{path[:20]}…", self.limits, cap=max_size, decode=True,
                                           watchdog=watchdog):
                        data += chunk
                except TooLarge:
                    self.failed(f"{path[:20]}… from the remote cache is larger than {max_size} bytes; "
                                "ignoring it")
                    return None
        except Exception as e:
            if self._is_transport_error(e):
                self._transport_failed(e)
                return None
            raise
        with self._lock:
            self.stats.hits += 1
            self.stats.bytes_down += len(data)
        return bytes(data)

    def _request(self, method: str, path: str, *, listed: bool = False,
                 **kwargs: Any) -> requests.Response | _Miss | None:
        """A 2xx answer; MISS for "not there" (404, and 204 on a GET: nginx's answer for an empty entry,
        per Bazel); None for a refusal or a transport failure, each with a warning."""
        if not self.usable:
            return None
        url = f"{self.url}/{path}"
        from hermetic.fetch.session import current_watchdog, stopped_or
        try:
            resp = self.session.request(method, url, timeout=self.settings.timeout, allow_redirects=False,
                                        **kwargs)
        except Exception as e:
            watchdog = current_watchdog()
            err = stopped_or(watchdog, e)   # stopped at the deadline: TooSlow
            if self._is_transport_error(err):
                self._transport_failed(err)
                return None
            raise
        watchdog = current_watchdog()
        if watchdog is not None:
            if watchdog.fired:   # the headers "ended" because the watchdog shut the connection: no answer
                resp.close()
                self._transport_failed(stopped_or(watchdog, ConnectionError()))
                return None
            watchdog.answered = True
        status = resp.status_code
        if method in ("GET", "HEAD") and status in (404, 204):
            resp.close()
            with self._lock:
                self.stats.misses += 1
            if listed:
                self.failed(f"{path[:20]}… is named by an action entry but missing from the server")
            return MISS
        if 200 <= status < 300:
            return resp
        resp.close()
        what = f"{method} {path[:20]}…: HTTP {status} {resp.reason or ''}".strip()
        if method == "PUT" and status in (401, 403, 405):
            with self._lock:
                first = self.read_only_reason is None
                self.read_only_reason = f"HTTP {status}"
            if first:
                self._warn(f"the remote cache {self.url} refuses uploads ({what}); reading only from now on",
                           hint="give the URL writer credentials (user:password@) or HERMETIC_REMOTE_CACHE_TOKEN, "
                                "or use --remote-cache-mode ro")
            return None
        if method == "PUT" and status == 413:
            self.failed(f"{what}: the blob is larger than the server accepts (nginx: client_max_body_size)")
            return None
        self.failed(what)
        return None

    def _watchdog(self, what: str) -> Watchdog:
        """The whole-transfer deadline of one request and its body, its response headers included."""
        from hermetic.fetch.watchdog import Watchdog
        return Watchdog(self.limits, what)

    def _is_transport_error(self, e: Exception) -> bool:
        import requests
        import urllib3

        from hermetic.fetch.session import TooSlow
        return isinstance(e, requests.RequestException | OSError | TooSlow | urllib3.exceptions.HTTPError)

    def _transport_failed(self, e: Exception) -> None:
        from hermetic.fetch.session import describe_error
        why = describe_error(e)
        with self._lock:
            first = self.unreachable is None
            self.unreachable = why
            self.stats.failures += 1
        if first:
            self._warn(f"the remote cache {self.url} is unreachable ({why}); continuing without it",
                       hint="builds fall back to local compiles; check the server or --remote-cache")

    def failed(self, what: str) -> None:
        """A bad answer (an HTTP error, a wrong body, an invalid entry): a miss and a warning."""
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


class _BadBody(Exception):
    pass


class _Miss:
    """The server answered that it does not have it."""


MISS = _Miss()
