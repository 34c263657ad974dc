"""What hermetic needs of a remote cache's server, and no more (as ccache's storage backends: get, put, has): a
content-addressed store (``cas``) and an action cache (``ac``) of output-file lists, each entry read, written
or asked for by its key. ``bazel.BazelHttpCache`` speaks Bazel's HTTP cache protocol; a second protocol (gRPC
REAPI, S3) is a class with these three methods and an ``open_storage`` of its own.

A backend verifies nothing, counts nothing and warns nothing: it moves bytes and says how a request failed.
``storage.Storage`` wraps one with what every protocol shares: verifying what comes back, the stats, the
warnings and the rule that gives up on a server that keeps failing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Literal, Protocol

Area = Literal["ac", "cas"]


class Unreachable(Exception):
    """The transport failed: refused, timed out, reset, or stalled below the transfer floor (the message says
    why, without credentials)."""


class Refused(Exception):
    """The server answered with an error."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"HTTP {status} {reason}".strip())
        self.status, self.reason = status, reason


class TooLarge(Exception):
    """A body longer than the caller allows: ``declared`` (its Content-Length) before a byte is read, else
    counted as it came (nothing past the limit is read)."""

    def __init__(self, limit: int, declared: int | None = None) -> None:
        super().__init__(f"more than {limit} bytes" if declared is None else f"{declared} bytes declared")
        self.limit, self.declared = limit, declared


class Body(Protocol):
    """An entry's bytes in pieces as they arrive (a generator is one). ``close`` ends the transfer, read to its
    end or not: the caller closes every body it was given."""

    def __iter__(self) -> Iterator[bytes]: ...

    def close(self) -> None: ...


class Backend(Protocol):
    def get(self, area: Area, key: str, limit: int) -> Body | None:
        """The entry's bytes, never past ``limit`` (TooLarge); None: the server has none."""

    def put(self, area: Area, key: str, body: bytes | Path) -> None:
        """Store the entry (a file is read as it is sent), its length declared."""

    def has(self, area: Area, key: str) -> bool:
        """Whether the server has the entry."""
