"""The error hierarchy. Every failure a user can cause or meet is one of these.

A message says what went wrong, where (file and line, or key), and what to do. The CLI maps each class to
the exit code of PRODUCT.md in one place (``exit_code``) and prints no traceback for them.
"""

from __future__ import annotations


class HermeticError(Exception):
    """Base class: the work failed (exit 1)."""

    exit_code = 1
    kind = "failed"

    def __init__(self, what: str, *, where: str | None = None, hint: str | None = None) -> None:
        super().__init__(what)
        self.what = what
        self.where = where
        self.hint = hint

    def render(self) -> str:
        head = f"{self.where}: {self.what}" if self.where else self.what
        return f"error: {head}" + (f"\n  hint: {self.hint}" if self.hint else "")

    def as_record(self) -> dict[str, object]:
        return {"kind": self.kind, "what": self.what, "where": self.where, "hint": self.hint}


class WorkFailed(HermeticError):
    """A compile error, a failed check, corruption found (exit 1)."""


class FetchFailed(WorkFailed):
    """A network or transfer failure after retries (exit 1)."""

    kind = "fetch-failed"


class BadInput(HermeticError):
    """Invalid TOML, unknown key, wrong type, missing file, hash or size mismatch, hostile archive (exit 2)."""

    exit_code = 2
    kind = "bad-input"


class PreconditionFailed(HermeticError):
    """A lock wait timed out, the GPU is busy, the toolchain does not match torch (exit 3)."""

    exit_code = 3
    kind = "precondition"
