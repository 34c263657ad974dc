"""verify --rebuild-sample: compile stored objects again and compare, to catch a wrong object that every
hash check passes (one compiled with a different flag and filed under the wrong key, say).

An object is compiled again as it was: with nvcc's intermediate files beside it when its record says so
(``temps: objdir``, ``plan.map_flags``), and then compared byte for byte. Objects an nvcc put its temporary
files in TMPDIR for (an older hermetic, an nvcc before 12.4) are compared after masking what that makes differ
from run to run: the temporary files' names (``tmpxft_<pid>_<counter>-<n>_``), which land in the host
object's symbol table, also as the static initializer ``_GLOBAL__sub_I_tmpxft_<pid>_<counter>_<n>_`` (the
dash mangled to an underscore).
"""

from __future__ import annotations

import os
import random
import re
from dataclasses import dataclass
from pathlib import Path

import zstandard

from hermetic import fs
from hermetic.extensions.certificate import read_certificate
from hermetic.extensions.objects import InputHasher, object_bytes
from hermetic.extensions.plan import map_flags
from hermetic.keys import PrefixMap
from hermetic.procs import Limits, run_limited
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
    """Compile again up to ``n`` objects the last builds of this root use, each in the folders of a build that
    used it (its certificate's prefix map), and compare."""
    maps = _build_maps(root, store)
    objects = sorted(e for e in store.iter_entries() if "-obj-" in e and e in maps)
    rng = random.Random(seed)
    # objects a build server compiled first (extensions.dist: a server decides an object's bytes), then the rest
    remote = [e for e in objects if _remote_built(store, e)]
    sample = rng.sample(remote, min(n, len(remote)))
    sent = set(remote)
    rest = [e for e in objects if e not in sent]
    sample += rng.sample(rest, min(n - len(sample), len(rest)))
    hasher = InputHasher(root)
    results = [_rebuild(root, store, hasher, name, maps[name]) for name in sorted(sample)]
    hasher.save()
    return results


def _remote_built(store: Store, name: str) -> bool:
    try:
        built_by = store.object_record(name).get("built_by")
    except (OSError, ValueError):
        return False
    return isinstance(built_by, dict) and bool(built_by.get("remote"))


def _build_maps(root: Root, store: Store) -> dict[str, PrefixMap]:
    """Object entry -> the prefix map of a last build (per module) that used it."""
    maps: dict[str, PrefixMap] = {}
    for blob in root.cache("builds").values():
        try:
            cert = read_certificate(store, str(blob))
        except (OSError, ValueError, zstandard.ZstdError):
            continue
        pmap = PrefixMap((lo, f) for lo, f in cert.get("prefix_map", []))
        for o in cert["objects"]:
            if o.get("entry"):
                maps.setdefault(str(o["entry"]), pmap)
    return maps


def _rebuild(root: Root, store: Store, hasher: InputHasher, name: str, pmap: PrefixMap) -> Rebuilt:
    rec = store.object_record(name)
    source = rec["source"]
    if "command" not in rec:
        return Rebuilt(name, source, "skipped", "recorded by an older hermetic without its command")
    for path, mode, h in rec["inputs"]:
        if hasher.hash(pmap.local_path(path), mode) != h:
            return Rebuilt(name, source, "skipped", f"input {path} changed since; not comparable")
    canonical = rec["command"]
    command = pmap.local(canonical)
    cuda = command[0].endswith("nvcc")
    objdir_temps = rec.get("temps") == "objdir"
    argv = [command[0], *map_flags(pmap, cuda, canonical[canonical.index("-c") + 1], objdir_temps), *command[1:]]
    # the build's own folder (the compilation folder is in debug information, mapped)
    build_dir = pmap.local_path("/".join(rec["output"].split("/")[:4]))
    with fs.scratch_dir(root.tmp, "rebuild-") as work_dir:
        work = str(work_dir)
        out = os.path.join(work, os.path.basename(rec["output"]))
        argv[argv.index("-o") + 1] = out
        env = root.child_env(pmap.local_env(rec["env"]))
        env.setdefault("PATH", "/usr/bin:/bin")
        env["CUDA_VISIBLE_DEVICES"] = ""
        # like the build's own compiles: a session of its own, which dies with hermetic (kill -9 too); no
        # time limit, as a build has none (one unit of a large extension compiles for minutes on 2 cores)
        rc, tail = run_limited(argv, cwd=build_dir if os.path.isdir(build_dir) else work, env=env,
                               limits=Limits(), on_line=lambda _line: None)
        if rc != 0:
            return Rebuilt(name, source, "mismatch", f"the recorded command failed now: {chr(10).join(tail)[-500:]}")
        fresh = Path(out).read_bytes()
    stored = object_bytes(store, rec)
    if stored is None:
        return Rebuilt(name, source, "mismatch", "the stored object does not hash to its record")
    if objdir_temps and fresh != stored:
        return Rebuilt(name, source, "mismatch", f"recompiled object differs ({len(fresh)} vs {len(stored)} bytes)")
    if normalized(fresh) != normalized(stored):
        return Rebuilt(name, source, "mismatch",
                       f"recompiled object differs ({len(fresh)} vs {len(stored)} bytes after masking temp names)")
    remote = rec.get("built_by", {}).get("remote")
    return Rebuilt(name, source, "same", f"compiled by the build cluster {remote}; the same bytes here"
                   if remote else "")
