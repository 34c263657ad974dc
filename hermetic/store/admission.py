"""What a record made elsewhere must be before this store takes it: an import's archive and a remote cache
hand the store records it did not write, and such a record is trusted only as far as its name is the key of
what it says (an object, an unpacked wheel, a content-addressed tree) and its fields have the format this
store reads. ``record_problem`` says why a record cannot be the entry it claims to be, or None.

A module's name is the key of its link command, which its record does not hold: a module record is checked
for its format only, and the host it was built for is matched by the importer (``archive``). An
input-addressed source tree names the patch files it was made with, not their bytes: its files are checked
as any tree's, its name cannot be.
"""

from __future__ import annotations

import re
from typing import Any

from hermetic.keys import UNPACKER_VERSION, lookup_key, object_key, split_defines, unpacked_key
from hermetic.store import KINDS, STORE_FORMAT, entry_name
from hermetic.store.trees import check_relpath, tree_entry_name, tree_problem

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_ENTRY_NAME = re.compile(r"^[0-9a-f]{32}-[\w.+-]{1,80}$")   # what store.entry_name makes


def record_problem(meta: Any, name: str) -> str | None:
    """Why ``meta`` cannot be the record of the entry ``name`` in this store, or None."""
    if not _ENTRY_NAME.match(name):
        return "its name is not an entry name of this store"
    if not isinstance(meta, dict):
        return "not a JSON object"
    if meta.get("format") != STORE_FORMAT:
        return f"its format {meta.get('format')!r} is not this store's ({STORE_FORMAT})"
    kind = meta.get("kind")
    if kind not in KINDS:
        return f"its kind {kind!r} is none this store knows ({', '.join(KINDS)})"
    if meta.get("name") != name:
        return "it names another entry"
    refs = meta.get("refs")
    if not (isinstance(refs, list) and all(isinstance(r, str) for r in refs)):
        return "malformed refs"
    if kind in ("unpacked", "tree"):
        why = _files_problem(meta.get("files"))
        if why is not None:
            return why
    if kind == "unpacked":
        wheel = meta.get("wheel")
        if not (isinstance(wheel, str) and SHA256_RE.match(wheel)):
            return "malformed wheel hash"
        # an earlier unpacker's entry is still bound to its wheel: a tree laid out from it before an upgrade
        # keeps naming it (trees are keyed by their files), and no lookup of this unpacker finds it
        if all(entry_name(unpacked_key(wheel, v), name[33:]) != name for v in range(1, UNPACKER_VERSION + 1)):
            return (f"its name is not the key of its wheel under this hermetic's unpacker (v{UNPACKER_VERSION}) "
                    "or an earlier one")
    elif kind == "tree":
        return _tree_problem(meta, name)
    elif kind == "object":
        return object_record_problem(meta, name)
    elif kind == "module":
        so, cert = meta.get("so"), meta.get("producer_certificate")
        if not (isinstance(so, str) and SHA256_RE.match(so) and isinstance(meta.get("file"), str)
                and isinstance(meta.get("module"), str) and isinstance(meta.get("host"), dict)
                and (cert is None or (isinstance(cert, str) and SHA256_RE.match(cert)))):
            return "malformed module record"
    return None


def _files_problem(files: Any) -> str | None:
    if not isinstance(files, dict):
        return "malformed files"
    for rel, spec in files.items():
        if not (isinstance(spec, list) and len(spec) == 2 and isinstance(spec[0], str) and SHA256_RE.match(spec[0])
                and isinstance(spec[1], bool)):
            return f"malformed file {rel!r}"
        try:
            check_relpath(rel)
        except ValueError:
            return f"its file {rel!r} leaves the tree"
    return None


def _tree_problem(meta: dict[str, Any], name: str) -> str | None:
    label, links, source = meta.get("label"), meta.get("links"), meta.get("source")
    if not (isinstance(label, str) and isinstance(links, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in links.items())):
        return "malformed tree record"
    files = {p: (d, x) for p, (d, x) in meta["files"].items()}
    why = tree_problem(files, links)  # the tree as a whole: links chained through links, paths through links
    if why is not None:
        return why
    if tree_entry_name(label, files, links) == name:
        return None
    # input-addressed (a source tree): named by what it was made from, which it carries
    if not (isinstance(source, dict) and isinstance(source.get("name"), str)
            and isinstance(source.get("origin"), str) and isinstance(source.get("subdir"), str)
            and isinstance(source.get("patches"), list)):
        return "its name is not the key of its files and it is no source tree"
    if name[33:] != entry_name("0" * 32, f"src-{source['name']}")[33:]:
        return "it names another source"
    return None


def object_record_problem(meta: dict[str, Any], name: str) -> str | None:
    """Why an object record is not the compile its name says (its key recomputed from its inputs and
    defines, its command the one its lookup key describes), or None. The remote cache adds its own checks
    (the lookup key it was listed under, the object the list names)."""
    inputs, defines, lookup = meta.get("inputs"), meta.get("defines"), meta.get("lookup")
    if not isinstance(lookup, str):
        return "malformed lookup key"
    if not (isinstance(inputs, list) and all(
            isinstance(i, list) and len(i) == 3 and all(isinstance(x, str) for x in i)
            and i[0].startswith("/") and i[1] in ("raw", "stripped") and SHA256_RE.match(i[2]) for i in inputs)):
        return "malformed inputs"
    if not (isinstance(defines, dict) and all(isinstance(v, str) or v is None for v in defines.values())):
        return "malformed defines"
    key = object_key(lookup, defines, inputs)
    if meta.get("key") != key or entry_name(key, name[33:]) != name:
        return "its name is not the key of its inputs"
    # the recorded command is run again by `verify --rebuild-sample`: it must be the one the key describes
    command, env, toolchain = meta.get("command"), meta.get("env"), meta.get("toolchain")
    host, root = meta.get("host"), meta.get("root")
    if not (isinstance(command, list) and command and all(isinstance(a, str) for a in command)
            and isinstance(env, dict) and isinstance(toolchain, dict) and isinstance(meta.get("output"), str)
            and isinstance(host, dict) and (root is None or isinstance(root, str))):
        return "malformed command"
    rest, command_defines = split_defines(command)
    if rest != meta.get("argv") or command_defines != defines or \
            all(lookup_key(kind, command, env, toolchain, host, root) != lookup for kind in ("cxx", "nvcc")):
        return "its command is not the one its lookup key describes"
    obj, size = meta.get("object"), meta.get("size")
    if not (isinstance(obj, str) and SHA256_RE.match(obj) and isinstance(size, int) and size >= 0):
        return "malformed object"
    return None
