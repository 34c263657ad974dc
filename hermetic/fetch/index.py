"""A simple-repository client: which files do the configured indexes and find-links offer for a project?

Speaks PEP 691 JSON and PEP 503 HTML over http(s), reads ``file://`` indexes and find-links directories, and
records which locations failed, so that "not found" (bad lock, exit 2) can be told apart from "could not
look" (network, exit 1). requests is imported only inside functions: importing this module stays cheap.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from html.parser import HTMLParser
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import unquote, urldefrag, urljoin, urlsplit, urlunsplit

from packaging.tags import Tag
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from hermetic import fs
from hermetic.fetch.pipconfig import PipConfig
from hermetic.fetch.session import (
    TransferLimits,
    TransientError,
    UnavailableError,
    describe_error,
    http_get,
    read_body,
    transient_errors,
    with_retries,
)
from hermetic.fetch.watchdog import Watchdog
from hermetic.urls import file_url_path, redact, same_origin

if TYPE_CHECKING:
    import requests

    from hermetic.locks.types import LockedWheel

JSON_TYPE = "application/vnd.pypi.simple.v1+json"
ACCEPT = f"{JSON_TYPE}, text/html;q=0.1"
MAX_PAGE_BYTES = 256 << 20   # a project page (PyPI's torch page is a few MB); past this it is not one
T = TypeVar("T")


@dataclass(frozen=True)
class Candidate:
    url: str              # may carry the index's credentials: pass through redact() before showing it
    filename: str
    sha256: str | None    # what the index advertises (lowercase hex); the download is checked regardless
    size: int | None
    yanked: bool


def is_url(location: str) -> bool:
    return bool(re.match(r"^[A-Za-z][A-Za-z0-9+.\-]+://", location))


def file_url_to_path(url: str) -> Path:
    return file_url_path(url, redact(url))


class _Anchors(HTMLParser):
    """Collects (href, attrs) of every <a>, honouring <base href> as pip does."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.base: str | None = None
        self.anchors: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        d = dict(attrs)
        href = d.get("href")
        if tag == "base" and href and self.base is None:
            self.base = href
        elif tag == "a" and href:
            self.anchors.append((href, d))


class IndexClient:
    """Lists the files every configured index and find-links location offers for a project."""

    def __init__(self, config: PipConfig, session: requests.Session, *, backoff: float = 0.5,
                 on_retry: Callable[[str, TransientError, int, float], None] | None = None,
                 sleep: Callable[[float], None] = time.sleep, limits: TransferLimits | None = None) -> None:
        self.config, self.session, self.backoff = config, session, backoff
        self.limits = limits or TransferLimits.from_environment()
        self.on_retry, self.sleep = on_retry, sleep
        # Of the last candidates() call, redacted: what was searched, and what could not be read and why.
        self.searched: list[str] = []
        self.failures: dict[str, str] = {}

    def candidates(self, name: str, index_urls: Sequence[str] | None = None) -> list[Candidate]:
        """Every file of project ``name`` (wheels and sdists) offered anywhere, index order first."""
        project = canonicalize_name(name)
        self.searched, self.failures = [], {}
        found: list[Candidate] = []
        for index in self.config.index_urls if index_urls is None else index_urls:
            found += self._gather(index, partial(self._index_files, index, project))
        for link in self.config.find_links:
            found += self._gather(link, partial(self._find_links_files, link))
        seen: set[str] = set()
        out = []
        for c in found:
            if c.url not in seen and _project_of(c.filename) == project:
                seen.add(c.url)
                out.append(c)
        return out

    def _gather(self, location: str, read: Callable[[], list[Candidate]]) -> list[Candidate]:
        shown = redact(location)
        self.searched.append(shown)
        try:
            return read()
        except (TransientError, UnavailableError) as e:
            self.failures[shown] = str(e)
            return []

    def _retrying(self, url: str, fn: Callable[[], T]) -> T:
        def note(e: TransientError, attempt: int, delay: float) -> None:
            if self.on_retry is not None:
                self.on_retry(url, e, attempt, delay)
        return with_retries(fn, retries=self.config.retries, backoff=self.backoff, on_retry=note,
                            sleep=self.sleep)

    def _index_files(self, index: str, project: str) -> list[Candidate]:
        if not is_url(index) or index.startswith("file:"):
            root = file_url_to_path(index) if is_url(index) else Path(os.path.expanduser(index))
            if not root.is_dir():
                return self._missing()
            page = root / project / "index.html"
            if page.is_file():
                return _parse_html(_local_page(page), page.resolve().as_uri())
            return _list_dir(root / project) if (root / project).is_dir() else []
        url = index.rstrip("/") + f"/{project}/"
        return self._retrying(url, lambda: self._read_page(url) or [])

    def _find_links_files(self, link: str) -> list[Candidate]:
        if is_url(link) and not link.startswith("file:"):
            return self._retrying(link, lambda: self._read_page(link) or [])
        path = file_url_to_path(link) if is_url(link) else Path(os.path.expanduser(link))
        if path.is_dir():
            return _list_dir(path)
        if path.is_file():
            return _parse_html(_local_page(path), path.resolve().as_uri())
        return self._missing()

    def _missing(self) -> list[Candidate]:
        # Like pip: a local location that does not exist offers nothing. It is no network failure (that
        # would make "not found" exit 1), but the "not found" message says so.
        self.searched[-1] += " (does not exist)"
        return []

    def _read_page(self, url: str) -> list[Candidate] | None:
        """A project page over http(s); None for 404/410 ("no files here" is not an error). Under the transfer's
        deadline from the request on (``Watchdog``: its headers too) and a cap: a page that never ends or
        trickles holds nothing up."""
        with Watchdog(self.limits, "the index page") as watchdog:
            return self._read_page_watched(url, watchdog)

    def _read_page_watched(self, url: str, watchdog: Watchdog) -> list[Candidate] | None:
        resp = http_get(self.session, url, self.config, stream=True, headers={"Accept": ACCEPT})
        with resp:
            if resp.status_code in (404, 410):
                return None
            if resp.status_code >= 400:
                raise UnavailableError(f"HTTP {resp.status_code} {resp.reason or ''}".strip())
            ctype = resp.headers.get("Content-Type", "").split(";")[0].strip().lower()
            base = _with_credentials_of(url, resp.url or url)
            try:
                data = b"".join(read_body(resp, "the index page", self.limits, cap=MAX_PAGE_BYTES, decode=True,
                                          watchdog=watchdog))
            except transient_errors() as e:
                raise TransientError(describe_error(e)) from None
            if ctype == JSON_TYPE:
                try:
                    return _parse_json(json.loads(data), base)
                except ValueError as e:
                    raise UnavailableError(f"invalid PEP 691 JSON page: {e}") from None
            return _parse_html(data.decode(resp.encoding or "utf-8", errors="replace"), base)


def _with_credentials_of(page: str, url: str) -> str:
    """``url`` with ``page``'s user:password when both share an origin (else requests sends no auth)."""
    parts, page_parts = urlsplit(url), urlsplit(page)
    if "@" in parts.netloc or "@" not in page_parts.netloc or not same_origin(url, page):
        return url
    userinfo = page_parts.netloc.rsplit("@", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{parts.netloc}"))


def _candidate(page: str, href: str, sha256: str | None, size: int | None, yanked: bool) -> Candidate:
    url, fragment = urldefrag(urljoin(page, href))
    url = _with_credentials_of(page, url)
    if sha256 is None:
        m = re.search(r"(?:^|&)sha256=([0-9A-Fa-f]{64})", fragment)
        sha256 = m.group(1) if m else None
    filename = unquote(urlsplit(url).path.rsplit("/", 1)[-1])
    return Candidate(url, filename, sha256.lower() if sha256 else None, size, yanked)


def _parse_html(text: str, page: str) -> list[Candidate]:
    parser = _Anchors()
    parser.feed(text)
    base = urljoin(page, parser.base) if parser.base else page
    return [_candidate(base, href, None, None, "data-yanked" in attrs) for href, attrs in parser.anchors]


def _parse_json(data: Any, page: str) -> list[Candidate]:
    out = []
    for f in data.get("files", []) if isinstance(data, dict) else []:
        if not isinstance(f, dict) or not isinstance(f.get("url"), str):
            continue
        hashes = f.get("hashes")
        sha = hashes.get("sha256") if isinstance(hashes, dict) else None
        sha = sha if isinstance(sha, str) else None
        size = f.get("size") if isinstance(f.get("size"), int) else None
        out.append(_candidate(page, f["url"], sha, size, bool(f.get("yanked", False))))
    return out


def _local_page(path: Path) -> str:
    """A local index page (find-links' HTML file): a regular file (never a FIFO that would hang the read), read up
    to the cap of any index page."""
    try:
        data = fs.read_regular(path, MAX_PAGE_BYTES, follow=True)
    except (OSError, ValueError) as e:
        raise UnavailableError(f"cannot read {path}: {e.strerror if isinstance(e, OSError) else e}") from None
    return data.decode("utf-8", errors="replace")


def _list_dir(path: Path) -> list[Candidate]:
    return [Candidate(p.resolve().as_uri(), p.name, None, p.stat().st_size, False)
            for p in sorted(path.iterdir()) if p.is_file()]


def _project_of(filename: str) -> str | None:
    try:
        if filename.endswith(".whl"):
            return str(parse_wheel_filename(filename)[0])
        return str(parse_sdist_filename(filename)[0])
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        return None


def select(wheel: LockedWheel, candidates: Sequence[Candidate], tags: Sequence[Tag]) -> list[Candidate]:
    """The candidates that may be the locked wheel, most promising first; never an sdist.

    A candidate whose advertised sha256 is not locked cannot match and is dropped; one advertising no hash
    stays (it is checked after download). Without a locked filename, the best-ranked compatible tag wins,
    then an advertised matching hash (no wasted download), then not yanked, then index order.
    """
    hashes = {h.lower() for h in wheel.hashes}
    rank = {tag: i for i, tag in enumerate(tags)}
    want_name = canonicalize_name(wheel.name)
    scored: list[tuple[int, int, int, Candidate]] = []
    for c in candidates:
        if not c.filename.endswith(".whl") or (c.sha256 is not None and c.sha256 not in hashes):
            continue
        tag_rank = 0
        if wheel.filename is not None:
            if c.filename != wheel.filename:
                continue
        else:
            try:
                name, version, _build, file_tags = parse_wheel_filename(c.filename)
            except (InvalidWheelFilename, InvalidVersion):
                continue
            if name != want_name or not _same_version(version, wheel.version):
                continue
            ranks = [rank[t] for t in file_tags if t in rank]
            if not ranks:
                continue
            tag_rank = min(ranks)
        scored.append((tag_rank, 0 if c.sha256 in hashes else 1, int(c.yanked), c))
    scored.sort(key=lambda s: s[:3])  # stable: equal keys keep index order
    return [s[3] for s in scored]


def _same_version(version: Version, locked: str | None) -> bool:
    if locked is None:
        return True
    try:
        return version == Version(locked)
    except InvalidVersion:
        return str(version) == locked
