"""The certificate of one build: every object with its key, inputs and decision, and the module it made.

Stored zstd-compressed as a blob; the receipt holds the sha256 of its uncompressed bytes (PRODUCT.md).
"""

from __future__ import annotations

import json
from typing import TypedDict, cast

import zstandard

from hermetic.extensions.context import BuildContext
from hermetic.extensions.job import ModuleJob
from hermetic.extensions.objects import stored_blob
from hermetic.store import Store
from hermetic.store.records import CompileCost, HostIdentity, InputHash, Producer, ToolchainId

CERTIFICATE_FORMAT = 3  # 2: canonical inputs, the build's prefix map, path_bound; 3: waited_for, cost


class ModuleBuild(TypedDict):
    decision: str                       # linked, reused, fetched-remote
    entry: str
    producer_certificate: str | None    # the certificate of the build that linked it elsewhere
    remote: dict[str, str] | None       # the remote cache's URL and mode (no credentials)


class CertifiedObject(TypedDict):
    source: str
    object: str                         # its path in the build folder
    decision: str
    entry: str | None
    key: str | None
    digest: str | None
    blob: str | None
    waived: list[str]
    reason: str
    first_built_by: Producer | None
    inputs: list[InputHash]
    path_bound: str | None              # the flag that keeps this root's path in the object (nvcc -G), if any
    waited_for: str | None              # the other variant's compile whose object it waited for (extensions/graph.py)
    cost: CompileCost | None            # what its compile took (its record's), if it compiled


class Certificate(TypedDict):
    format: int
    recipe: str
    variant: str
    module: str
    host: HostIdentity
    toolchain: ToolchainId
    module_sha256: str
    link: list[str]
    module_build: ModuleBuild
    prefix_map: list[list[str]]         # [local folder, its fixed name], most specific first
    objects: list[CertifiedObject]


def certificate(ctx: BuildContext, job: ModuleJob, so_digest: str, module: ModuleBuild) -> Certificate:
    """What one module's build certifies: every object with its key, inputs and decision, and the module."""
    objects: list[CertifiedObject] = []
    for d in job.choices:
        rec = d.record
        objects.append({"source": d.compile.rel, "object": d.compile.object, "decision": d.decision,
                        "entry": d.entry, "key": rec["key"] if rec else None,
                        "digest": rec["object"] if rec else None, "blob": stored_blob(rec) if rec else None,
                        "waived": d.waived, "reason": d.reason, "first_built_by": rec["built_by"] if rec else None,
                        "inputs": rec["inputs"] if rec else [], "path_bound": d.compile.path_bound,
                        "waited_for": d.waited_for, "cost": rec.get("cost") if rec else None})
    return {"format": CERTIFICATE_FORMAT, "recipe": ctx.recipe.name, "variant": job.variant.name,
            "module": job.plan.module, "host": ctx.host.identity(), "toolchain": ctx.toolchain.id,
            "module_sha256": so_digest, "link": list(job.plan.link_argv), "module_build": module,
            "prefix_map": job.pmap.record(), "objects": objects}


def read_certificate(store: Store, blob: str) -> Certificate:
    data = zstandard.ZstdDecompressor().decompress(store.blob_path(blob).read_bytes(), max_output_size=1 << 31)
    return cast(Certificate, json.loads(data))
