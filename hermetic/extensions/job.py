"""One extension module of one variant as it goes through a build: planned (``ModuleJob``: its commands, the
object cache that proves each reuse, what became of every object so far), then linked and certified
(``BuiltModule``). Apart from ``extension``, which makes and finishes them, so that the graph, the certificate
and realize read them without importing the steps."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hermetic.extensions.objects import Decision, ObjectCache, ObjectChoice
from hermetic.extensions.plan import BuildPlan
from hermetic.keys import PrefixMap
from hermetic.recipe import Extension, Variant
from hermetic.store.records import CompileCost, ObjectRecord, Producer


@dataclass
class ModuleJob:
    """One extension of one variant from its plan to its link: the commands, the object cache that proves each
    reuse, and what became of every object so far (``choices``, in the plan's order)."""
    ext: Extension
    variant: Variant
    plan: BuildPlan
    build_dir: Path
    pmap: PrefixMap
    env: dict[str, str]
    cache: ObjectCache
    choices: list[ObjectChoice]
    previous: dict[str, ObjectRecord]     # source -> the object record of this module's last build
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.variant.name}/{self.plan.module}"

    def todo(self) -> list[int]:
        return [i for i, d in enumerate(self.choices) if d.decision is Decision.COMPILED]

    def record(self, i: int, producer: Producer, cost: CompileCost | None) -> ObjectChoice:
        """After object ``i`` compiled: store it with its inputs and what it took."""
        recorded = self.cache.record(self.choices[i].compile, producer, cost)
        recorded.reason = self.choices[i].reason
        self.choices[i] = recorded
        return recorded

    def decisions(self) -> dict[str, int]:
        """How many of its objects ended in each decision (``Decision``'s names)."""
        out: dict[str, int] = {}
        for d in self.choices:
            out[d.decision] = out.get(d.decision, 0) + 1
        return out


@dataclass
class BuiltModule:
    module: str
    filename: str                  # module file name in the environment: NAME + the interpreter's suffix
    entry: str                     # the module's store entry
    digest: str                    # sha256 of the module file
    certificate: str               # sha256 of the certificate's uncompressed bytes
    certificate_blob: str          # blob holding the zstd-compressed certificate
    choices: list[ObjectChoice] = field(default_factory=list)
    linked: bool = False
    python_module: bool = True     # False: a torch operator library, loaded with torch.ops.load_library

    def counts(self) -> dict[str, int]:
        """The receipt's per-module tally: its objects, and how many ended in each decision."""
        c: dict[str, int] = {"objects": len(self.choices)}
        for d in self.choices:
            c[d.decision] = c.get(d.decision, 0) + 1
        return c
