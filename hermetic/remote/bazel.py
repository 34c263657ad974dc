"""Bazel's HTTP cache protocol: ``GET``/``HEAD``/``PUT`` on ``<url>/cas/<sha256>`` and ``<url>/ac/<key>``.

Any server of that protocol works: nginx with WebDAV (``remote/nginx.conf``), bazel-remote, and others
(docs/remote.md). ``BazelHttpCache`` is the ``backend.Backend`` of it; ``open_storage`` wraps it in the
``storage.Storage`` that verifies, counts and warns. What the protocol itself asks:

* 404, and 204 on a GET (nginx's answer for an empty entry, per Bazel), mean "not there"; redirects are not
  followed;
* uploads send Content-Length (bazel-remote answers 400 to chunked uploads);
* every transfer runs under the whole-transfer deadline and the size cap (``fetch.session.TransferLimits``),
  enforced by its watchdog (``fetch.watchdog``) from the request to the body's last byte, the response headers
  included: a stall anywhere is ``Unreachable``.

Credentials arrive in the settings (``remote.settings``) and are never printed. requests is imported only
when a client is made.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermetic.remote.backend import Area, Refused, TooLarge, Unreachable
from hermetic.remote.settings import RemoteSettings
from hermetic.reporter import Reporter

if TYPE_CHECKING:
    import requests

    from hermetic.fetch.watchdog import Watchdog
    from hermetic.remote.storage import Storage


class BazelHttpCache:
    """GET, PUT and HEAD on a Bazel HTTP cache (``backend.Backend``)."""

    def __init__(self, settings: RemoteSettings) -> None:
        import requests

        from hermetic.fetch import watched
        from hermetic.fetch.session import TransferLimits
        self.url, self.timeout = settings.url, settings.timeout
        self.session = requests.Session()
        watched.mount(self.session)   # every request under its transfer's watchdog, headers included
        self.session.headers["User-Agent"] = "hermetic"
        if settings.auth is not None:
            self.session.auth = settings.auth
        if settings.token is not None:
            self.session.headers["Authorization"] = f"Bearer {settings.token}"
        self.limits = TransferLimits.from_environment()

    def close(self) -> None:
        self.session.close()

    def get(self, area: Area, key: str, limit: int) -> _Body | None:
        what = f"{area}/{key[:16]}…"
        watchdog = self._watchdog(what).__enter__()   # until the body is closed: its request and every byte
        try:
            resp = self._request("GET", area, key, watchdog, stream=True)
            if resp is not None:
                length = resp.headers.get("Content-Length", "")
                if length.isdigit() and int(length) > limit:  # refused before a byte is read
                    resp.close()
                    raise TooLarge(limit, int(length))
        except BaseException:
            watchdog.__exit__(None, None, None)
            raise
        if resp is None:
            watchdog.__exit__(None, None, None)
            return None
        return _Body(resp, self._pieces(resp, what, limit, watchdog), watchdog)

    def _pieces(self, resp: requests.Response, what: str, limit: int, watchdog: Watchdog) -> Iterator[bytes]:
        from hermetic.fetch.session import TooLarge as BodyTooLarge
        from hermetic.fetch.session import read_body
        try:
            yield from read_body(resp, what, self.limits, cap=limit, decode=True, watchdog=watchdog)
        except BodyTooLarge:
            raise TooLarge(limit) from None
        except Exception as e:
            raise _transport(e) or e from None

    def put(self, area: Area, key: str, body: bytes | Path) -> None:
        # Content-Length always: bazel-remote refuses uploads without it, Bazel never sends chunked ones
        headers = {"Content-Type": "application/octet-stream"}
        what = f"PUT {area}/{key[:16]}…"
        with self._watchdog(what) as watchdog:
            if isinstance(body, bytes):
                self._request("PUT", area, key, watchdog, data=body,
                              headers={**headers, "Content-Length": str(len(body))})
                return
            from hermetic.fetch.session import PacedReader
            with open(body, "rb") as f:  # paced: a server that reads a byte a second fails the deadline
                size = os.fstat(f.fileno()).st_size
                self._request("PUT", area, key, watchdog, data=PacedReader(f, self.limits, what, watchdog),
                              headers={**headers, "Content-Length": str(size)})

    def has(self, area: Area, key: str) -> bool:
        with self._watchdog(f"HEAD {area}/{key[:16]}…") as watchdog:
            return self._request("HEAD", area, key, watchdog) is not None

    def _watchdog(self, what: str) -> Watchdog:
        """The whole-transfer deadline of one request and its body, its response headers included."""
        from hermetic.fetch.watchdog import Watchdog
        return Watchdog(self.limits, what)

    def _request(self, method: str, area: Area, key: str, watchdog: Watchdog,
                 **kwargs: Any) -> requests.Response | None:
        """A 2xx answer (its body unread where streamed, closed otherwise); None for "not there". Sent inside
        ``watchdog``'s block: a stall before the headers are complete is ``Unreachable`` too."""
        from hermetic.fetch.session import stopped_or
        try:
            resp = self.session.request(method, f"{self.url}/{area}/{key}", timeout=self.timeout,
                                        allow_redirects=False, **kwargs)
        except Exception as e:
            e = stopped_or(watchdog, e)   # stopped at the deadline: TooSlow
            raise _transport(e) or e from None
        if watchdog.fired:   # the headers "ended" because the watchdog shut the connection: no answer
            resp.close()
            raise _transport(stopped_or(watchdog, ConnectionError())) or ConnectionError() from None
        watchdog.answered = True
        status = resp.status_code
        if method in ("GET", "HEAD") and status in (404, 204):
            resp.close()
            return None
        if not 200 <= status < 300:
            resp.close()
            raise Refused(status, resp.reason or "")
        if not kwargs.get("stream"):
            resp.close()
        return resp


class _Body:
    """A response's body as ``backend.Body``: its pieces under the transfer's watchdog; closing it closes the
    response and ends the watchdog, whether or not a piece was read."""

    def __init__(self, resp: requests.Response, pieces: Iterator[bytes], watchdog: Watchdog) -> None:
        self.resp, self.pieces, self.watchdog = resp, pieces, watchdog
        self.closed = False

    def __iter__(self) -> Iterator[bytes]:
        return self.pieces

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            close = getattr(self.pieces, "close", None)
            if close is not None:
                close()
        finally:
            self.resp.close()
            self.watchdog.__exit__(None, None, None)


def _transport(e: Exception) -> Unreachable | None:
    """The transport's failure as ``Unreachable`` (said once, without credentials), else None."""
    import requests
    import urllib3

    from hermetic.fetch.session import TooSlow, describe_error
    if isinstance(e, requests.RequestException | OSError | TooSlow | urllib3.exceptions.HTTPError):
        return Unreachable(describe_error(e))
    return None


def open_storage(settings: RemoteSettings, reporter: Reporter) -> Storage:
    """The remote cache of ``settings``, as a Bazel HTTP cache, behind the storage that verifies and counts."""
    from hermetic.remote.storage import Storage
    backend = BazelHttpCache(settings)
    return Storage(backend, settings, reporter, cap=backend.limits.cap, close=backend.close)
