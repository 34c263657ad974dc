"""HTTP for everything hermetic downloads: one session with pip's network settings, retries with backoff,
and the error vocabulary the index client, the wheel fetcher and the remote cache share.

``TransientError`` is worth retrying (refused or reset connections, timeouts, 429, 5xx, a truncated body);
``UnavailableError`` is not (401/403/404, TLS verification, a missing local file). requests is imported only
inside functions: importing this module stays cheap.
"""

from __future__ import annotations

import os
import re
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, TypeVar
from urllib.parse import urlsplit

from hermetic.fetch.pipconfig import PipConfig
from hermetic.fetch.watchdog import Watchdog, current_watchdog
from hermetic.urls import redact_text

if TYPE_CHECKING:
    import requests

T = TypeVar("T")


class TransientError(Exception):
    """A failure worth retrying: refused or reset connection, timeout, 429, 5xx, truncated body."""


class UnavailableError(Exception):
    """A failure retrying will not fix: 401/403/404, TLS verification, a missing local file."""


class TooSlow(TransientError):
    """A transfer fell below the bytes-per-second floor of its whole-transfer deadline (a stalled server)."""


class TooLarge(UnavailableError):
    """A body longer than its declared size, or than the cap where nothing declares one."""

    def __init__(self, what: str, limit: int) -> None:
        super().__init__(what)
        self.limit = limit


# Every transfer has a whole-transfer deadline: after GRACE seconds, at least FLOOR bytes a second on
# average (a per-read timeout alone lets a server that sends a byte every few seconds hold a command for
# good); and a size cap where neither the lock, the index, the server nor the caller declares a size.
ENV_FLOOR, ENV_GRACE, ENV_CAP = "HERMETIC_TRANSFER_FLOOR", "HERMETIC_TRANSFER_GRACE", "HERMETIC_DOWNLOAD_CAP"
DEFAULT_FLOOR = 16 << 10        # bytes a second: a 2 GB wheel may take a day and a half, a stalled server not
DEFAULT_GRACE = 30.0            # seconds every transfer gets before the floor applies (connection, slow start)
DEFAULT_CAP = 4 << 30           # bytes of a body no one declared a size for (the largest wheels are ~3 GB)


@dataclass(frozen=True)
class TransferLimits:
    floor: int = DEFAULT_FLOOR
    grace: float = DEFAULT_GRACE
    cap: int = DEFAULT_CAP

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> TransferLimits:
        """The limits, each from its variable (``HERMETIC_TRANSFER_FLOOR`` bytes a second,
        ``HERMETIC_TRANSFER_GRACE`` seconds, ``HERMETIC_DOWNLOAD_CAP`` bytes) or its default."""
        from hermetic.errors import BadInput
        env = os.environ if environ is None else environ

        def number(name: str, default: float, low: float, high: float) -> float:
            raw = env.get(name, "").strip()
            if not raw:
                return default
            try:
                value = float(raw)
            except ValueError:
                value = float("nan")
            if not low <= value <= high:
                raise BadInput(f"{name}={raw!r} is not a number from {low:g} to {high:g}", where=name,
                               hint="unset it for the default, or see docs/remote.md#transfer-limits")
            return value

        return cls(floor=int(number(ENV_FLOOR, DEFAULT_FLOOR, 1, 1 << 40)),
                   grace=number(ENV_GRACE, DEFAULT_GRACE, 0, 86400),
                   cap=int(number(ENV_CAP, DEFAULT_CAP, 1, 1 << 50)))


class Deadline:
    """The whole-transfer deadline of one transfer: ``check(done)`` after each piece raises TooSlow once, past
    the grace period, fewer than ``floor`` bytes a second arrived on average."""

    def __init__(self, limits: TransferLimits, what: str) -> None:
        self.limits, self.what = limits, what
        self.started = time.monotonic()

    def check(self, done: int) -> None:
        elapsed = time.monotonic() - self.started
        late = elapsed - self.limits.grace
        if late > 0 and done < self.limits.floor * late:
            raise TooSlow(f"{self.what}: {done} bytes in {elapsed:.0f} s, below the floor of "
                          f"{self.limits.floor} bytes a second after {self.limits.grace:g} s ({ENV_FLOOR})")


def stopped(watchdog: Watchdog) -> TooSlow:
    """The error of a transfer its watchdog stopped at the deadline: before its response headers, or after."""
    elapsed = time.monotonic() - watchdog.started
    floor = f"below the floor of {watchdog.limits.floor} bytes a second after {watchdog.limits.grace:g} s"
    if watchdog.answered:
        return TooSlow(f"{watchdog.what}: {watchdog.done} bytes in {elapsed:.0f} s, {floor} ({ENV_FLOOR})")
    return TooSlow(f"{watchdog.what}: no complete response headers in {elapsed:.0f} s, {floor} ({ENV_GRACE}, "
                   f"{ENV_FLOOR})")


def stopped_or(watchdog: Watchdog | None, e: Exception) -> Exception:
    """What a failed transfer raises: ``stopped`` when its watchdog stopped it, else ``e`` itself."""
    return stopped(watchdog) if watchdog is not None and watchdog.fired else e


READ = 1 << 16


def read_body(resp: requests.Response, what: str, limits: TransferLimits, *, cap: int,
              decode: bool = False, watchdog: Watchdog | None = None) -> Iterator[bytes]:
    """The body of a streamed response in pieces as they arrive (``read1``: a slow server cannot hold one
    read for long), under its whole-transfer deadline, and never past ``cap`` bytes (TooLarge: nothing past
    the cap is read). ``watchdog``: the transfer's, started with its request (the deadline then counts from
    there, and a read it stops is TooSlow). ``decode``: undo a Content-Encoding (pages); wheels and blobs are
    hashed as sent."""
    deadline = Deadline(limits, what)
    if watchdog is not None:
        deadline.started = watchdog.started   # the deadline counts from the request
    raw = resp.raw
    done = 0
    while True:
        try:
            piece = raw.read1(READ, decode_content=decode)
        except Exception:
            if watchdog is not None and watchdog.fired:
                raise stopped(watchdog) from None
            raise
        if not piece:
            if watchdog is not None and watchdog.fired:   # the shut-down connection read as the body's end
                raise stopped(watchdog)
            return
        done += len(piece)
        if watchdog is not None:
            watchdog.done = done
        if done > cap:
            raise TooLarge(f"{what}: more than {cap} bytes", cap)
        deadline.check(done)
        yield piece


class PacedReader:
    """A file being uploaded, read by the HTTP client under the whole-transfer deadline (a server that reads
    a few bytes a second would otherwise hold an upload for good): each ``read`` checks it."""

    def __init__(self, f: IO[bytes], limits: TransferLimits, what: str, watchdog: Watchdog | None = None) -> None:
        self.f, self.deadline, self.done = f, Deadline(limits, what), 0
        self.watchdog = watchdog
        if watchdog is not None:
            self.deadline.started = watchdog.started

    def read(self, n: int = -1) -> bytes:
        self.deadline.check(self.done)
        data = self.f.read(n)
        self.done += len(data)
        if self.watchdog is not None:
            self.watchdog.done = self.done
        return data


def with_retries(fn: Callable[[], T], *, retries: int, backoff: float,
                 on_retry: Callable[[TransientError, int, float], None] | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> T:
    """``fn()``, retried with exponential backoff on TransientError at most ``retries`` times."""
    attempt = 0
    while True:
        try:
            return fn()
        except TransientError as e:
            if attempt >= retries:
                raise TransientError(f"{e} (gave up after {attempt + 1} attempts)") from None
            delay = backoff * (2 ** attempt)
            attempt += 1
            if on_retry is not None:
                on_retry(e, attempt, delay)
            sleep(delay)


def transient_errors() -> tuple[type[BaseException], ...]:
    import http.client

    import requests
    import urllib3.exceptions
    return (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError,
            requests.exceptions.ContentDecodingError, urllib3.exceptions.ProtocolError,
            urllib3.exceptions.ReadTimeoutError, http.client.IncompleteRead, ConnectionError, TimeoutError)


def describe_error(e: BaseException) -> str:
    """A short, credential-free reason: requests' messages bury "[Errno 111] Connection refused" deep."""
    text = redact_text(str(e))
    m = re.search(r"\[Errno -?\d+\] [^'\")\]]+", text)
    if m:
        return m.group(0).strip()
    m = re.search(r"IncompleteRead\((\d+) bytes read, (\d+) more expected\)", text)
    if m:
        return f"truncated download: connection closed after {m.group(1)} bytes, {m.group(2)} more expected"
    if "timed out" in text.lower():
        return "timed out"
    text = text if len(text) <= 300 else text[:300] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def http_get(session: requests.Session, url: str, config: PipConfig, *, stream: bool = False,
             headers: dict[str, str] | None = None) -> requests.Response:
    """One GET with pip's network settings; raises TransientError/UnavailableError, returns 2xx-4xx."""
    import requests
    import urllib3
    verify = verify_for(url, config)
    watchdog = current_watchdog()   # the caller's transfer (its request, then its body)
    try:
        with warnings.catch_warnings():
            if verify is False:  # the user chose --trusted-host: no warning per request, as in pip
                warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
            resp = session.get(url, headers=headers, stream=stream, timeout=config.timeout, verify=verify)
    except requests.exceptions.SSLError as e:
        if watchdog is not None and watchdog.fired:
            raise stopped(watchdog) from None
        raise UnavailableError(tls_failure(url, config, e)) from None
    except transient_errors() as e:
        if watchdog is not None and watchdog.fired:
            raise stopped(watchdog) from None
        raise TransientError(describe_error(e)) from None
    except requests.RequestException as e:
        if watchdog is not None and watchdog.fired:
            raise stopped(watchdog) from None
        raise UnavailableError(describe_error(e)) from None
    if watchdog is not None:
        if watchdog.fired:   # the headers "ended" because the watchdog shut the connection: no answer
            resp.close()
            raise stopped(watchdog)
        watchdog.answered = True
    if resp.status_code == 429 or resp.status_code >= 500:
        resp.close()
        raise TransientError(f"HTTP {resp.status_code} {resp.reason or ''}".strip())
    return resp


def tls_failure(url: str, config: PipConfig, e: BaseException) -> str:
    """The host and OpenSSL's reason; for a certificate not trusted, what it was checked against."""
    from hermetic.fetch.trust import description
    parts = urlsplit(url)
    host = f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)
    text = redact_text(str(e))
    m = re.search(r"certificate verify failed: [^(')\]]+", text) or re.search(r"\[SSL: \w+\] [^(')\]]+", text)
    reason = m.group(0).strip() if m else describe_error(e)
    if "certificate verify failed" not in text:
        return f"TLS connection to {host} failed ({reason})"
    return (f"TLS: the certificate of {host} is not trusted ({reason}); it was checked against "
            f"{description(config)}: add the index's CA to the system store, or name it in PIP_CERT or cert "
            "in pip.conf")


def verify_for(url: str, config: PipConfig) -> bool | None:
    """False for pip's --trusted-host hosts (pip skips TLS verification there); None: the session's."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    hostport = f"{host}:{parts.port}" if parts.port else host
    return False if (host in config.trusted_hosts or hostport in config.trusted_hosts) else None


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("hermetic")
    except PackageNotFoundError:
        return "dev"  # running from a source checkout


def make_session(config: PipConfig) -> requests.Session:
    """One session for every request: connection reuse, and pip's certificate and proxy settings."""
    import requests

    from hermetic.fetch import trust, watched
    session = requests.Session()
    watched.mount(session)   # every request under its transfer's watchdog, headers included
    session.headers["User-Agent"] = f"hermetic/{_version()}"
    session.verify = config.cert or True
    trust.mount(session, config)
    if config.client_cert:
        session.cert = config.client_cert
    if config.proxy:
        # requests still applies HTTP(S)_PROXY / NO_PROXY from the environment, as pip's session does.
        session.proxies.update({"http": config.proxy, "https": config.proxy})
    return session
