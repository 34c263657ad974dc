"""Download locked wheels into a temp file, verified against the lock before anyone sees them.

Order of sources: the lock's path, else its URL, else the configured indexes and find-links (pip's own
configuration). Every byte is hashed while it is written; a complete file whose size or sha256 differs
from the lock is bad input (exit 2), a transfer that keeps failing is a fetch failure (exit 1). Either way
nothing is left in ``tmp_dir``. Importing this module imports requests: callers import it only when
something must actually be fetched, so a no-op realize stays fast.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING

from packaging.tags import Tag, sys_tags

from hermetic import fs
from hermetic.errors import BadInput, FetchFailed
from hermetic.fetch.index import Candidate, IndexClient, file_url_to_path, select
from hermetic.fetch.pipconfig import PipConfig
from hermetic.fetch.session import (
    TooLarge,
    TransferLimits,
    TransientError,
    UnavailableError,
    describe_error,
    http_get,
    make_session,
    read_body,
    transient_errors,
    with_retries,
)
from hermetic.fetch.watchdog import Watchdog
from hermetic.reporter import ProgressTask, Reporter
from hermetic.urls import redact

if TYPE_CHECKING:
    from hermetic.locks.types import LockedWheel

CHUNK = 1 << 20
FETCH_HINT = ("check PIP_INDEX_URL / PIP_EXTRA_INDEX_URL / PIP_FIND_LINKS (or pip.conf) and the network "
              "(proxy, PIP_CERT); on an air-gapped machine bring the wheels in with `hermetic import`")


@dataclass(frozen=True)
class Downloaded:
    path: Path       # a temp file inside tmp_dir; the caller moves it into the store
    sha256: str
    size: int
    filename: str
    url: str         # where it came from, credentials redacted (safe for receipts)


@dataclass(frozen=True)
class Located:
    """Where a locked wheel would be fetched from, and its size, found without fetching it (a dry run)."""
    filename: str
    size: int | None  # None: neither the lock, the index nor the server says
    url: str          # credentials redacted


class Fetcher:
    def __init__(self, config: PipConfig, tmp_dir: Path, reporter: Reporter | None = None, *,
                 tags: Sequence[Tag] | None = None, backoff: float = 0.5,
                 limits: TransferLimits | None = None) -> None:
        self.config, self.tmp_dir, self.reporter, self.backoff = config, Path(tmp_dir), reporter, backoff
        self.limits = limits or TransferLimits.from_environment()
        self.tags = list(tags) if tags is not None else list(sys_tags())
        self.session = make_session(config)
        self.index = IndexClient(config, self.session, backoff=backoff, on_retry=self._note_retry,
                                 limits=self.limits)

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> Fetcher:
        return self

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def fetch(self, wheel: LockedWheel) -> Downloaded:
        """The locked wheel as a verified temp file in tmp_dir; BadInput or FetchFailed otherwise."""
        if not wheel.hashes:
            raise BadInput(f"{_label(wheel)} has no sha256 hash in the lock; hermetic fetches only "
                           "hash-pinned files", where=wheel.where,
                           hint="lock it with --hash=sha256:... (pip-compile --generate-hashes, uv, "
                                "pip lock)")
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        if wheel.path is not None:
            return self._local(wheel, Path(wheel.path), Path(wheel.path).absolute().as_uri())
        if wheel.url is not None:
            return self._from_url(wheel, wheel.url)
        return self._from_indexes(wheel)

    def locate(self, wheel: LockedWheel) -> Located:
        """The file ``fetch`` would get and its size, reading no more than index pages and a response's headers
        (nothing is written); the same errors as ``fetch`` when it cannot be found."""
        if wheel.path is not None:
            return self._located(wheel, wheel.filename or Path(wheel.path).name, Path(wheel.path).as_uri())
        if wheel.url is not None:
            return self._located(wheel, wheel.filename or _basename(wheel.url), wheel.url)
        index_urls = list(self.config.index_urls)
        if wheel.index and wheel.index not in index_urls:
            index_urls.insert(0, wheel.index)
        chosen = select(wheel, self.index.candidates(wheel.name, index_urls), self.tags)
        if not chosen:
            why = "; ".join(f"{loc}: {err}" for loc, err in self.index.failures.items())
            raise FetchFailed(f"could not find {_label(wheel)} in the configured indexes"
                              + (f": {why}" if why else f" (searched: {', '.join(self.index.searched) or 'none'})"),
                              where=wheel.where, hint=FETCH_HINT)
        cand = chosen[0]
        return self._located(wheel, cand.filename, cand.url, cand.size)

    def _located(self, wheel: LockedWheel, filename: str, url: str, size: int | None = None) -> Located:
        size = wheel.size if wheel.size is not None else size
        if size is None and url.startswith("file:"):
            try:
                size = file_url_to_path(url).stat().st_size
            except OSError:
                size = None
        elif size is None and url.split(":", 1)[0].lower() in ("http", "https"):
            try:  # the response's headers only (under the deadline): its body is never read
                with Watchdog(self.limits, filename):
                    resp = http_get(self.session, url, self.config, stream=True,
                                    headers={"Accept-Encoding": "identity"})
                    with resp:
                        length = resp.headers.get("Content-Length", "")
                        size = int(length) if resp.status_code < 400 and length.isdigit() else None
            except (TransientError, UnavailableError):
                size = None
        return Located(filename, size, redact(url))

    # sources ------------------------------------------------------------------
    def _local(self, wheel: LockedWheel, path: Path, url: str) -> Downloaded:
        try:
            return self._copy_local(wheel, path, url, wheel.filename or path.name)
        except UnavailableError as e:
            raise BadInput(f"{_label(wheel)}: {e}", where=wheel.where,
                           hint="fix the path in the lock, or restore the file") from None

    def _copy_local(self, wheel: LockedWheel, path: Path, url: str, filename: str) -> Downloaded:
        """A local file (a path or a file: URL) copied like a download: a regular file only (a FIFO would hang the
        read, a link to /dev/zero never end), never past the size it has when opened (a file's size declares it,
        as a Content-Length does) nor the lock's."""
        try:
            fd = fs.open_regular(path)
        except fs.NotRegularFile as e:
            raise UnavailableError(f"{path} is {e.strerror}: hermetic copies only regular files") from None
        except OSError as e:
            raise UnavailableError(f"cannot read {path}: {e.strerror or e}") from None
        with open(fd, "rb") as f:
            total = os.fstat(f.fileno()).st_size
            self._check_size(wheel, total, url, filename)
            try:
                return self._write(wheel, _at_most(f, total), total, filename, url)
            except TooLarge:
                raise UnavailableError(f"{path} grew past the {total} bytes it held when it was opened; it is "
                                       "being written: copy it again once it is complete") from None

    def _from_url(self, wheel: LockedWheel, url: str) -> Downloaded:
        scheme = url.split(":", 1)[0].lower()
        filename = wheel.filename or _basename(url)
        if scheme == "file":
            return self._local(wheel, file_url_to_path(url), url)
        if scheme not in ("http", "https"):
            raise BadInput(f"{_label(wheel)}: unsupported URL scheme in {redact(url)}", where=wheel.where,
                           hint="use an http(s):// or file:// URL, or a path")
        try:
            return self._download(wheel, url, filename)
        except (TransientError, UnavailableError) as e:
            raise FetchFailed(f"could not download {_label(wheel)} from {redact(url)}: {e}",
                              where=wheel.where, hint=FETCH_HINT) from None

    def _from_indexes(self, wheel: LockedWheel) -> Downloaded:
        index_urls = list(self.config.index_urls)
        if wheel.index and wheel.index not in index_urls:
            index_urls.insert(0, wheel.index)  # the lock says where it was found: look there first
        if not index_urls and not self.config.find_links:
            raise BadInput(f"{_label(wheel)} has no URL or path in the lock, and no index or find-links is "
                           "configured (pip's no-index is set)", where=wheel.where,
                           hint="set PIP_FIND_LINKS to a directory holding the wheel, or unset PIP_NO_INDEX")
        chosen = select(wheel, self.index.candidates(wheel.name, index_urls), self.tags)
        searched = ", ".join(self.index.searched) or "none"
        if not chosen:
            if self.index.failures:
                why = "; ".join(f"{loc}: {err}" for loc, err in self.index.failures.items())
                raise FetchFailed(f"could not look up {_label(wheel)}: {why}", where=wheel.where,
                                  hint=FETCH_HINT)
            raise BadInput(f"no file for {_label(wheel)} matching the locked hashes in the configured "
                           f"indexes (searched: {searched})", where=wheel.where,
                           hint="check the lock's hashes against the index, or point PIP_INDEX_URL / "
                                "PIP_FIND_LINKS at the place the wheel was locked from")
        mismatch: BadInput | None = None
        failures: list[str] = []
        for cand in chosen:
            try:
                return self._from_candidate(wheel, cand)
            except BadInput as e:
                # A file that merely shares the name (another index, a rebuilt wheel) is not ours.
                mismatch = mismatch or e
            except (TransientError, UnavailableError) as e:
                failures.append(f"{redact(cand.url)}: {e}")
        if failures:  # the locked file may be the one we could not get: a transfer problem, not bad input
            raise FetchFailed(f"could not download {_label(wheel)}: " + "; ".join(failures),
                              where=wheel.where, hint=FETCH_HINT)
        assert mismatch is not None
        raise mismatch

    def _from_candidate(self, wheel: LockedWheel, cand: Candidate) -> Downloaded:
        if cand.size is not None:
            self._check_size(wheel, cand.size, cand.url, cand.filename)
        if cand.url.startswith("file:"):
            return self._copy_local(wheel, file_url_to_path(cand.url), cand.url, cand.filename)
        return self._download(wheel, cand.url, cand.filename, cand.size)

    # transfer -----------------------------------------------------------------
    def _download(self, wheel: LockedWheel, url: str, filename: str, listed: int | None = None) -> Downloaded:
        return with_retries(lambda: self._download_once(wheel, url, filename, listed), retries=self.config.retries,
                            backoff=self.backoff, on_retry=lambda e, n, d: self._note_retry(url, e, n, d))

    def _download_once(self, wheel: LockedWheel, url: str, filename: str, listed: int | None) -> Downloaded:
        """One GET under the transfer's deadline, never past the size the lock, the index (``listed``) or the
        server declares (the smallest), or the cap where none does."""
        # identity: Content-Length and the locked hash are about the bytes of the file, not a gzip of them; the
        # deadline from the request on, its headers included (a server may send those a byte at a time too)
        with Watchdog(self.limits, filename) as watchdog:
            return self._download_watched(wheel, url, filename, listed, watchdog)

    def _download_watched(self, wheel: LockedWheel, url: str, filename: str, listed: int | None,
                          watchdog: Watchdog) -> Downloaded:
        resp = http_get(self.session, url, self.config, stream=True, headers={"Accept-Encoding": "identity"})
        with resp:
            if resp.status_code >= 400:
                raise UnavailableError(f"HTTP {resp.status_code} {resp.reason or ''}".strip())
            length = resp.headers.get("Content-Length", "")
            total = int(length) if length.isdigit() else None
            if total is not None:
                self._check_size(wheel, total, url, filename)
            declared = [n for n in (wheel.size, listed, total) if n is not None]
            cap = min(declared) if declared else self.limits.cap
            body = read_body(resp, filename, self.limits, cap=cap, watchdog=watchdog)
            try:
                return self._write(wheel, body, total, filename, url)
            except TooLarge as e:
                if wheel.size is not None and e.limit == wheel.size:
                    raise BadInput(f"{_label(wheel)}: {filename} from {redact(url)} is more than {wheel.size} "
                                   "bytes, the lock says", where=wheel.where,
                                   hint="the file differs from the locked one: check where it comes from, or "
                                        "re-lock") from None
                why = "the size its index or server declares" if declared else \
                    "the cap for a download of no declared size (HERMETIC_DOWNLOAD_CAP)"
                raise UnavailableError(f"{e}: {why}") from None

    def _write(self, wheel: LockedWheel, chunks: Iterable[bytes], total: int | None, filename: str,
               url: str) -> Downloaded:
        """Stream ``chunks`` into a temp file, hashing as it goes; verify; remove it on any failure."""
        path = fs.new_temp_file(self.tmp_dir, ".fetch-", ".part")
        if self.reporter is not None:
            self.reporter.detail("fetch-from", f"fetching {filename} from {redact(url)}", wheel=filename,
                                 url=redact(url))
        task: ProgressTask | None = (self.reporter.task(filename, total, "bytes", closing_line=False)
                                     if self.reporter else None)  # the fetch's own event says what it got
        try:
            try:
                sha256, size = fs.write_hashed(_guarded(chunks), path, fresh=False,
                                               progress=task.advance if task is not None else None)
            except OSError as e:  # writing (a broken transfer arrives as TransientError, from _guarded)
                raise FetchFailed(f"cannot write {path}: {e.strerror or e}", where=wheel.where,
                                  hint="check free space and permissions of the hermetic root") from None
            if total is not None and size < total:
                raise TransientError(f"truncated download: got {size} of {total} bytes")
            self._check_size(wheel, size, url, filename)
            self._check_hash(wheel, sha256, url, filename)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        finally:
            if task is not None:
                task.close()
        return Downloaded(path, sha256, size, filename, redact(url))

    # checks and messages ------------------------------------------------------
    def _check_size(self, wheel: LockedWheel, size: int, url: str, filename: str) -> None:
        if wheel.size is not None and size != wheel.size:
            raise BadInput(f"{_label(wheel)}: {filename} from {redact(url)} is {size} bytes, the lock says "
                           f"{wheel.size}", where=wheel.where,
                           hint="the file differs from the locked one: check where it comes from, or re-lock")

    def _check_hash(self, wheel: LockedWheel, sha256: str, url: str, filename: str) -> None:
        expected = [h.lower() for h in wheel.hashes]
        if sha256 not in expected:
            raise BadInput(f"{_label(wheel)}: sha256 of {filename} from {redact(url)} is {sha256}, the lock "
                           f"expects {' or '.join(expected)}", where=wheel.where,
                           hint="the file differs from the locked one: check where it comes from, or re-lock")

    def _note_retry(self, url: str, err: TransientError, attempt: int, delay: float) -> None:
        if self.reporter is not None:
            self.reporter.event("fetch-retry", f"{redact(url)}: {err}; retry {attempt} of "
                                f"{self.config.retries} in {delay:.1f}s", url=redact(url), error=str(err),
                                attempt=attempt)


def _at_most(f: IO[bytes], limit: int) -> Iterator[bytes]:
    """A local file's bytes in pieces, never more than ``limit`` (TooLarge past it: nothing more is read)."""
    done = 0
    while chunk := f.read(min(CHUNK, limit + 1 - done)):
        done += len(chunk)
        if done > limit:
            raise TooLarge(f"more than {limit} bytes", limit)
        yield chunk


def _guarded(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """``chunks``, with a broken transfer turned into TransientError and a local read error into
    UnavailableError (requests' errors are OSErrors too, so the order of these checks matters)."""
    it = iter(chunks)
    transient = transient_errors()
    while True:
        try:
            chunk = next(it)
        except StopIteration:
            return
        except transient as e:
            why = describe_error(e)
            raise TransientError(why if why.startswith("truncated") else f"transfer broken: {why}") from None
        except OSError as e:
            raise UnavailableError(f"read error: {e.strerror or e}") from None
        yield chunk


def _label(wheel: LockedWheel) -> str:
    if wheel.version:
        return f"{wheel.name}=={wheel.version}"
    return wheel.filename or wheel.name


def _basename(url: str) -> str:
    from urllib.parse import unquote, urlsplit
    return unquote(urlsplit(url).path.rsplit("/", 1)[-1]) or "download"
