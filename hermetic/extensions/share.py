"""What a build asks of a shared cache (the remote: ``remote.layout.Sharing``), beyond blobs: objects found
the way the local object cache finds them, and linked modules with the certificate of the build that
linked them. Defined here, by the build that needs it, so that the build never imports the remote."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from hermetic.store.records import ObjectRecord
from hermetic.store.substitute import Substituter

if TYPE_CHECKING:
    from hermetic.extensions.objects import ObjectCache
    from hermetic.extensions.plan import Compile


class ObjectShare(Substituter, Protocol):
    def record(self) -> dict[str, str]:
        """Where and how it is shared, for certificates (no credentials)."""

    def fetch_objects(self, cache: ObjectCache, compiles: Iterable[Compile]) -> set[str]:
        """Adopt into the local store every object of ``compiles`` it has that ``cache`` would accept;
        the sources (``Compile.rel``) it did that for."""

    def upload_objects(self, metas: Iterable[ObjectRecord]) -> None:
        """Offer object records (their blobs first)."""

    def fetch_module(self, key: str, filename: str) -> tuple[str, str] | None:
        """(module blob, certificate blob) linked elsewhere under ``key``, verified and in the store."""

    def upload_module(self, key: str, filename: str, so_digest: str, cert_blob: str) -> None: ...
