"""The certificate of one build: every object with its key, inputs and decision, and the module it made.

Stored zstd-compressed as a blob; the receipt holds the sha256 of its uncompressed bytes (PRODUCT.md).
"""

from __future__ import annotations

import json
from typing import Any

import zstandard

from hermetic.build.host import host_identity
from hermetic.build.objects import Decision, stored_blob
from hermetic.build.plan import BuildPlan
from hermetic.recipe import Recipe, Variant
from hermetic.store import Store


def certificate(recipe: Recipe, variant: Variant, plan: BuildPlan, facts: dict[str, Any],
                 toolchain_id: dict[str, Any], decisions: list[Decision], so_digest: str,
                 module: dict[str, Any]) -> dict[str, Any]:
    objects = []
    for d in decisions:
        meta = d.meta or {}
        objects.append({"source": d.compile.rel, "object": d.compile.object, "decision": d.decision,
                        "entry": d.entry, "key": meta.get("key"), "digest": meta.get("object"),
                        "blob": stored_blob(meta) if meta.get("object") else None,
                        "waived": d.waived, "reason": d.reason, "first_built_by": meta.get("built_by"),
                        "inputs": meta.get("inputs", [])})
    return {"format": 1, "recipe": recipe.name, "variant": variant.name, "module": plan.module,
            "host": host_identity(facts), "toolchain": toolchain_id, "module_sha256": so_digest,
            "link": list(plan.link_argv), "module_build": module, "objects": objects}


def read_certificate(store: Store, blob: str) -> dict[str, Any]:
    data = zstandard.ZstdDecompressor().decompress(store.blob_path(blob).read_bytes(), max_output_size=1 << 31)
    cert: dict[str, Any] = json.loads(data)
    return cert
