"""What hermetic needs of a remote cache: a content-addressed store (``cas``) and an action cache (``ac``) of
output-file lists. ``bazel.BazelHttpCache`` speaks Bazel's HTTP cache protocol; a second protocol (gRPC
REAPI, S3) is a new class with these methods, and ``layout`` works with it unchanged.

Every method turns failures into a miss (None or False) and a warning, never an exception: the remote is
an optional layer, never on the correctness path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from hermetic.remote.actionresult import OutputFile
from hermetic.remote.settings import RemoteSettings


class Backend(Protocol):
    settings: RemoteSettings

    @property
    def url(self) -> str: ...

    @property
    def usable(self) -> bool:
        """False once the server proved unreachable: every later call is a miss without a request."""

    @property
    def writable(self) -> bool:
        """Whether uploads are wanted (mode rw) and still accepted."""

    def summary(self) -> dict[str, Any]:
        """For the receipt: where, how, and what happened (no credentials)."""

    def close(self) -> None: ...

    def get_ac(self, key: str) -> list[OutputFile] | None:
        """The output files of action entry ``key``; None on a miss or any failure."""

    def put_ac(self, key: str, files: list[OutputFile]) -> bool:
        """Write action entry ``key``; the blobs it names must be uploaded first."""

    def get_cas_bytes(self, digest: str, max_size: int, *, listed: bool = False) -> bytes | None:
        """Blob ``digest`` in memory, verified; ``listed``: an action entry names it (a miss is a warning)."""

    def get_cas_file(self, digest: str, directory: Path, *, size: int | None = None, max_size: int = 1 << 40,
                     listed: bool = False) -> Path | None:
        """Blob ``digest`` streamed into a new file in ``directory`` and verified; None leaves no file."""

    def put_cas_file(self, digest: str, path: Path) -> bool:
        """Upload a local file as blob ``digest`` unless the server has it; True when it is there now."""

    def put_cas_bytes(self, digest: str, data: bytes) -> bool: ...

    def has(self, path: str) -> bool | None:
        """Whether the server has ``ac/<key>`` or ``cas/<digest>``; None when it could not say."""

    def failed(self, what: str) -> None:
        """Count a bad answer and warn (the layout's own checks found it wrong)."""
