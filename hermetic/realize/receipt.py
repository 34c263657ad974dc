"""Step 9 of realize: the receipt (PRODUCT.md's list, stable key order so two receipts diff cleanly)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from hermetic import __version__, fs
from hermetic.locks.types import Lock
from hermetic.realize.noop import Outcome
from hermetic.root import Root
from hermetic.wheels.unpacked import Unpacked

RECEIPT_FORMAT = 2   # 2: the counts say "objects" (1: "objects_objects"), every object count and "modules_linked"


def write_receipt(root: Root, outcome: Outcome, locks: list[Lock], unpacked: list[Unpacked],
                  report: dict[str, Any]) -> Path:
    import sys
    uname = os.uname()  # platform.platform() also reads the interpreter's binary for its libc: too slow here
    python = report.get("interpreter") or {}  # the recipe's; a build's qualification (report["host"]) says more
    body: dict[str, Any] = {
        "format": RECEIPT_FORMAT, "kind": "realize", "hermetic": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "recipe": {"name": outcome.name, "path": str(outcome.recipe_path),
                   "sha256": fs.sha256_file(outcome.recipe_path)[0]},
        "locks": [{"path": str(lk.path), "sha256": lk.sha256, "format": lk.format} for lk in locks],
        "host": {"python": python.get("python", ".".join(map(str, sys.version_info[:3]))),
                 "executable": python.get("executable", sys.executable),
                 "platform": f"{uname.sysname}-{uname.release}-{uname.machine}"},
        "wheels": [{"entry": u.entry, "sha256": u.wheel_sha256} for u in unpacked],
        "tree": outcome.tree, "profile": str(outcome.profile),
        "refs": [f"entry:{e}" for e in outcome.entries],
        "counts": outcome.counts.to_json(), "timings": outcome.timings, **report,
    }
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    digest = fs.sha256_bytes(fs.canonical_json(body))[:12]
    path = root.receipts / f"{outcome.name}-{stamp}-{digest}.json"
    fs.atomic_write_json(path, body, pretty=True)
    return path
