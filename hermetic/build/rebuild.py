"""verify --rebuild-sample: compile stored objects again and compare, to catch a wrong object that every
hash check passes (one compiled with a different flag and filed under the wrong key, say).

Objects are compared after masking what nvcc makes differ from run to run: the names of its temporary
files (``tmpxft_<pid>_<counter>-<n>_``), which land in the host object's symbol table, also as the static
initializer ``_GLOBAL__sub_I_tmpxft_<pid>_<counter>_<n>_`` (the dash mangled to an underscore).
"""

from __future__ import annotations

import os
import random
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from hermetic import fs
from hermetic.build.objects import InputHasher, object_bytes
from hermetic.root import Root
from hermetic.store import Store

_TMPXFT = re.compile(rb"tmpxft_[0-9a-f]{8}_[0-9a-f]{8}[-_]\d+_")


@dataclass(frozen=True)
class Rebuilt:
    entry: str
    source: str
    outcome: str        # same, mismatch, skipped
    detail: str = ""


def normalized(data: bytes) -> bytes:
    return _TMPXFT.sub(b"tmpxft_", data)


def rebuild_sample(root: Root, store: Store, n: int, *, seed: int | None = None) -> list[Rebuilt]:
    objects = [e for e in store.iter_entries() if "-obj-" in e]
    rng = random.Random(seed)
    sample = rng.sample(objects, min(n, len(objects)))
    hasher = InputHasher(root)
    results = [_rebuild(root, store, hasher, name) for name in sorted(sample)]
    hasher.save()
    return results


def _rebuild(root: Root, store: Store, hasher: InputHasher, name: str) -> Rebuilt:
    rec = store.object_record(name)
    source = rec["source"]
    if "command" not in rec:
        return Rebuilt(name, source, "skipped", "recorded by an older hermetic without its command")
    for path, mode, h in rec["inputs"]:
        if hasher.hash(path, mode) != h:
            return Rebuilt(name, source, "skipped", f"input {path} changed since; not comparable")
    argv = list(rec["command"])
    with fs.scratch_dir(root.tmp, "rebuild-") as work_dir:
        work = str(work_dir)
        out = os.path.join(work, os.path.basename(rec["output"]))
        argv[argv.index("-o") + 1] = out
        env = root.child_env(dict(rec["env"]))
        env.setdefault("PATH", "/usr/bin:/bin")
        env["CUDA_VISIBLE_DEVICES"] = ""
        p = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=work)
        if p.returncode != 0:
            return Rebuilt(name, source, "mismatch", f"the recorded command failed now: {p.stderr[-500:]}")
        fresh = Path(out).read_bytes()
    stored = object_bytes(store, rec)
    if stored is None:
        return Rebuilt(name, source, "mismatch", "the stored object does not hash to its record")
    if normalized(fresh) != normalized(stored):
        return Rebuilt(name, source, "mismatch",
                       f"recompiled object differs ({len(fresh)} vs {len(stored)} bytes after masking temp names)")
    return Rebuilt(name, source, "same")
