"""A substituter: another content-addressed store that may hold a blob this one lacks, as Nix's binary
caches are for its store. The remote cache (``remote.layout.Sharing``) is one; wheels and source archives
are looked up there by the sha256 their pins name before anything is downloaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Substituter(Protocol):
    def fetch_blob(self, digests: Sequence[str], size: int | None = None, *, listed: bool = False,
                   what: str = "blob") -> str | None:
        """The first of ``digests`` it has, verified and put in the local store (pinned); None otherwise.
        ``what`` says what the blob is, for the substituter's own counts ("wheel", "blob")."""

    def upload_blob(self, digest: str) -> None:
        """Offer a local blob (once it proved sound: a wheel that unpacked whole, say)."""
