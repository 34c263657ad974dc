"""The store's records, typed: what ``entries/<name>/meta.json`` holds for each kind of entry (``KINDS`` and
the references between them live in the store itself, ``hermetic.store``).

These types name the on-disk format of docs/layout.md for mypy and for readers; they change nothing on disk.
A no-op realize does not import this module (creating TypedDicts costs more than the rest of its imports).
JSON has no tuples: a ``FileSpec`` or an ``InputHash`` is read back as a list, which unpacks the same.

Below the types, the hand-written checks of what is read back (``entry_problem``, ``root_problem``,
``receipt_problem``, ``read_checked``): docs/layout.md's "A bad record" says what each command does with one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict

from hermetic import fs
from hermetic.errors import BadRecord, path_error

FileSpec = tuple[str, bool]            # (sha256 of the bytes, executable)
FileMap = dict[str, FileSpec]          # path in the tree -> its blob
InputHash = tuple[str, str, str]       # (input path, "raw" or "stripped", sha256 of that content)
EntryPoint = tuple[str, str, str, str]  # (script name, module, attribute, "console" or "gui")


# what records name ----------------------------------------------------------------------------------------
class Packed(TypedDict):
    """An object stored compressed: the blob holding its zstd stream."""
    codec: Literal["zstd"]
    blob: str
    size: int


class Producer(TypedDict):
    """Which build compiled an object first."""
    recipe: str
    variant: str
    module: str
    host: str
    time: str
    remote: NotRequired[str]   # the build cluster's scheduler where a build server compiled it (extensions.dist)


class CompileCost(TypedDict):
    """What one compile took (``extensions/costwrap.py``): the next build starts the longest first and keeps the
    largest within the memory it has."""
    seconds: float         # wall time
    cpu_seconds: float     # user + system, the compiler and every process it waited for
    max_rss: int           # bytes: the largest resident set of any one of them


class HostCompiler(TypedDict):
    path: str
    version: str
    sha256: str
    cc1plus: str
    cc1plus_sha256: str


class ToolchainId(TypedDict):
    """The toolchain in an object's key: the CUDA tree entry (content-addressed) and the host compilers."""
    cuda: str
    host_compilers: dict[str, HostCompiler]


class HostIdentity(TypedDict):
    """What a linked module depends on: one built for another interpreter or torch is never reused."""
    python: str
    implementation: str
    soabi: str | None
    machine: str
    torch: str | None
    torch_cuda: str | None
    cxx11_abi: bool | None
    triton: NotRequired[str]   # in records and import checks (host_record), not in keys


class SourceOrigin(TypedDict):
    name: str
    origin: str            # the archive's sha256, or the folder's file-map hash
    subdir: str
    patches: list[str]


# the records ---------------------------------------------------------------------------------------------
class UnpackedRecord(TypedDict):
    """A wheel unpacked once by installer: each installed path and its blob."""
    format: int
    name: str
    kind: Literal["unpacked"]
    wheel: str             # the wheel's sha256 (its blob)
    filename: str
    files: FileMap
    scripts: NotRequired[list[EntryPoint]]   # entry points: launchers are written per interpreter, in trees
    shebangs: NotRequired[list[str]]   # its files of the scripts scheme starting #!python: rewritten in trees
    refs: list[str]


class TreeRecord(TypedDict):
    """A tree of hard links to blobs (an environment, a toolchain, a source tree) and its symlinks."""
    format: int
    name: str
    kind: Literal["tree"]
    label: str
    files: FileMap
    links: dict[str, str]
    refs: list[str]
    source: NotRequired[SourceOrigin]   # an input-addressed source tree: what it was made from


class ObjectRecord(TypedDict):
    """One compile: its keys, every input it read with its hash, the command, and the object's blob. Paths
    (inputs, command, output, environment) are canonical: the fixed names of ``keys.PrefixMap``."""
    format: int
    name: str
    kind: Literal["object"]
    key: str               # the object key: lookup key, defines, inputs
    lookup: str            # what must be equal to compare inputs: toolchain, command without defines, env
    source: str            # the source's path in its tree
    object: str            # sha256 of the object's bytes
    size: int
    inputs: list[InputHash]
    defines: dict[str, str | None]
    argv: list[str]        # the command without defines and output
    command: list[str]     # the whole command, for verify --rebuild-sample
    output: str
    env: dict[str, str]
    toolchain: ToolchainId
    host: HostIdentity     # the interpreter and torch the compile was for (torch's identity is in the key)
    root: str | None       # the root's path when the compile's flags keep it in the object (nvcc -G), else None
    built_by: Producer
    refs: list[str]
    packed: NotRequired[Packed]
    cost: NotRequired[CompileCost]     # what its compile took (not part of any key)
    temps: NotRequired[Literal["objdir"]]  # nvcc wrote its intermediate files beside the object (deterministic)


class ModuleRecord(TypedDict):
    """A linked module: its file's blob, the host it is for, and the certificate of the build that linked it
    elsewhere when it came from a remote cache."""
    format: int
    name: str
    kind: Literal["module"]
    module: str
    file: str
    so: str
    host: HostIdentity
    producer_certificate: str | None
    refs: list[str]


EntryRecord = UnpackedRecord | TreeRecord | ObjectRecord | ModuleRecord


def files_of(rec: EntryRecord) -> FileMap:
    """The files of a record that lists some (unpacked wheels and trees); none for the others."""
    if rec["kind"] == "unpacked" or rec["kind"] == "tree":
        return rec["files"]
    return {}


# records read back from the root or an archive ------------------------------------------------------------
class RootRecord(TypedDict):
    """``roots/<name>.json``: the gc root of a recipe (or one variant of it), written by realize."""
    format: int
    name: str
    recipe: str            # the recipe's path when it was written (repair realizes it again from there)
    profile: str
    refs: list[str]
    imported_from: NotRequired[str]   # the archive it came from: its recipe is the exporter's, repair never runs it
    owner: NotRequired[dict[str, str]]   # {"recipe", "variant" ("" for none)}: which realize's name it is (roots.py)


class ReceiptHead(TypedDict):
    """What gc, show and repair read of a receipt (``receipts/*.json``): realize and run receipts hold much
    more (realize/receipt.py, run/pipeline.py), which only people and the digest pins read."""
    format: int
    kind: Literal["realize", "run"]
    refs: NotRequired[list[str]]   # entries the receipt keeps alive (gc roots); a run's, or a realize's
    recipe: NotRequired[dict[str, object]]   # a realize receipt's recipe: {"name", "path", "sha256"}


# The checks are written by hand, one per record type, against the TypedDicts above (no schema library): each
# says why a value read back is not a record of its type, or None. A record that fails is *bad*, and each
# command treats a bad record as docs/layout.md's table says ("A bad record: one rule for every command").
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# a reference a record holds: an entry's name (store.entry_name: 32 hex digits, a dash, a label of safe
# characters) or a blob's (its sha256, an x for an executable); nothing else, so never a path (``../``)
_REF = re.compile(r"^(?:entry:[0-9a-f]{32}-[A-Za-z0-9._+-]+|blob:[0-9a-f]{64}x?)$")
_HEX = re.compile(r"^[0-9a-f]{1,64}$")
# a path a record names inside its entry: relative, no empty, '.' or '..' part, no control character
_UNSAFE_PATH = re.compile(r"(^|/)\.{0,2}(/|$)|^/|[\x00-\x1f\x7f]")


def check_relpath(rel: str) -> None:
    """A relative path with no empty, '.' or '..' part and no control character (ValueError otherwise)."""
    if not rel or _UNSAFE_PATH.search(rel):
        raise ValueError(f"unsafe path {rel!r}")


def _plain(rel: str) -> bool:
    return bool(rel) and not _UNSAFE_PATH.search(rel)
RECORD_LIMIT = 256 << 20   # no record of this store is near it (the largest, a toolchain tree's, is a few MB)


def _is_str_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _is_ref_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) and _REF.match(v) for v in value)


def _is_str_map(value: object, *, values: tuple[type, ...] = (str,)) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, values) for k, v in value.items())


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _missing(record: dict[str, object], fields: dict[str, Callable[[object], bool]]) -> str | None:
    for key, ok in fields.items():
        if key not in record:
            return f"it has no {key!r}"
        if not ok(record[key]):
            return f"its {key!r} is malformed ({type(record[key]).__name__} {_short(record[key])})"
    return None


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_sha(value: object) -> bool:
    return isinstance(value, str) and bool(_SHA256.match(value))


def _is_file_map(value: object) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, list) and len(v) == 2 and _is_sha(v[0]) and isinstance(v[1], bool)
        for k, v in value.items())


def _is_host(value: object) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) for k in value) and \
        all(isinstance(value.get(k), str) for k in ("python", "implementation", "machine"))


_COMMON: dict[str, Callable[[object], bool]] = {
    "format": _is_int, "name": lambda v: isinstance(v, str), "refs": _is_ref_list}
_FIELDS: dict[str, dict[str, Callable[[object], bool]]] = {
    "unpacked": {"wheel": _is_sha, "filename": lambda v: isinstance(v, str), "files": _is_file_map},
    "tree": {"label": lambda v: isinstance(v, str), "files": _is_file_map, "links": _is_str_map},
    "object": {
        "key": lambda v: isinstance(v, str) and bool(_HEX.match(v)),
        "lookup": lambda v: isinstance(v, str) and bool(_HEX.match(v)),
        "source": lambda v: isinstance(v, str), "object": _is_sha, "size": _is_int,
        "inputs": lambda v: isinstance(v, list) and all(
            isinstance(i, list) and len(i) == 3 and all(isinstance(p, str) for p in i) for i in v),
        "defines": lambda v: _is_str_map(v, values=(str, type(None))), "argv": _is_str_list,
        "command": _is_str_list, "output": lambda v: isinstance(v, str), "env": _is_str_map,
        "toolchain": lambda v: isinstance(v, dict) and isinstance(v.get("cuda"), str)
        and isinstance(v.get("host_compilers"), dict),
        "built_by": lambda v: isinstance(v, dict)},
    "module": {"module": lambda v: isinstance(v, str), "file": lambda v: isinstance(v, str), "so": _is_sha,
               "host": _is_host, "producer_certificate": lambda v: v is None or _is_sha(v)},
}


def entry_problem(meta: object, name: str) -> str | None:
    """Why ``meta`` is not a well-formed record of the entry ``name`` (its TypedDict of this module), or None.
    The shape only: whether its name is the key of what it says is admission.py's question, for records made
    elsewhere."""
    if not isinstance(meta, dict):
        return f"it is a JSON {type(meta).__name__}, not an object"
    kind = meta.get("kind")
    if kind not in _FIELDS:
        return f"its kind {_short(kind)} is none this store knows ({', '.join(_FIELDS)})"
    why = _missing(meta, {**_COMMON, **_FIELDS[kind]})
    if why is not None:
        return why
    if meta["name"] != name:
        return f"it names another entry ({_short(meta['name'])})"
    # every path it names lies inside its entry: never absolute, never through '..' (outside attack r1, finding 9)
    for key, what in (("files", "file"), ("links", "link")):
        for rel in meta.get(key) or ():
            if not _plain(rel):
                return f"its {what} path {_short(rel)} is absolute or leaves the entry (not a plain relative path)"
    if kind == "module" and not _plain(meta["file"]):
        return f"its 'file' {_short(meta['file'])} is absolute or leaves the entry (not a plain relative path)"
    if kind == "unpacked":
        for key, ok in (("scripts", lambda v: isinstance(v, list) and all(
                isinstance(s, list) and len(s) == 4 and all(isinstance(p, str) for p in s) for s in v)),
                ("shebangs", _is_str_list)):
            if key in meta and not ok(meta[key]):
                return f"its {key!r} is malformed"
    if kind == "tree" and "source" in meta and not (
            isinstance(meta["source"], dict) and isinstance(meta["source"].get("name"), str)
            and isinstance(meta["source"].get("origin"), str) and _is_str_list(meta["source"].get("patches"))):
        return "its 'source' is malformed"
    if kind == "object":  # an object record of an earlier hermetic (tests/test_compat.py) lacks both
        for key, ok in (("host", _is_host), ("root", lambda v: v is None or isinstance(v, str))):
            if key in meta and not ok(meta[key]):
                return f"its {key!r} is malformed"
    if kind == "object" and "packed" in meta and not (
            isinstance(meta["packed"], dict) and meta["packed"].get("codec") == "zstd"
            and _is_sha(meta["packed"].get("blob")) and _is_int(meta["packed"].get("size"))):
        return "its 'packed' is malformed"
    return None


def root_problem(record: object) -> str | None:
    """Why ``record`` is not a gc root (``RootRecord``), or None."""
    if not isinstance(record, dict):
        return f"it is a JSON {type(record).__name__}, not an object"
    why = _missing(record, {"format": _is_int, "name": lambda v: isinstance(v, str) and bool(v),
                            "recipe": lambda v: isinstance(v, str), "profile": lambda v: isinstance(v, str),
                            "refs": _is_ref_list})
    if why is None and "imported_from" in record and not isinstance(record["imported_from"], str):
        return f"its 'imported_from' is malformed ({_short(record['imported_from'])})"
    if why is None and "owner" in record and not _is_owner(record["owner"]):
        return f"its 'owner' is malformed ({_short(record['owner'])})"
    return why


_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")   # a recipe's or variant's name (recipe.NAME_RE)


def _is_owner(value: object) -> bool:
    """A root's owner: ``{"recipe": NAME, "variant": NAME or ""}``, plain names (letters, digits, . _ -)."""
    def plain(v: object, empty: bool) -> bool:
        return isinstance(v, str) and ((empty and v == "") or _PLAIN.fullmatch(v) is not None)
    return isinstance(value, dict) and set(value) == {"recipe", "variant"} and plain(value["recipe"], False) \
        and plain(value["variant"], True)


def receipt_problem(record: object) -> str | None:
    """Why ``record`` is not a receipt (``ReceiptHead``: what gc, show and repair read of one), or None."""
    if not isinstance(record, dict):
        return f"it is a JSON {type(record).__name__}, not an object"
    why = _missing(record, {"format": _is_int, "kind": lambda v: v in ("realize", "run")})
    if why is not None:
        return why
    if "refs" in record and not _is_ref_list(record["refs"]):
        return f"its 'refs' is malformed ({_short(record['refs'])})"
    if record["kind"] == "realize" and not (isinstance(record.get("recipe"), dict)
                                            and isinstance(record["recipe"].get("name"), str)):
        return "it names no recipe"
    return None


def read_checked(path: Path, problem: Callable[[object], str | None], what: str, *,
                 limit: int = RECORD_LIMIT) -> Any:
    """A JSON record read back from ``path`` (a regular file, never a link, a FIFO or a folder) that passes
    ``problem``; else ``BadRecord`` naming the file (``what`` says which record: "gc root", "receipt", ...).
    A file that does not exist raises FileNotFoundError, as open does: missing is not bad."""
    hint = "run `hermetic verify --repair`, which removes it (docs/layout.md: a bad record)"
    try:
        data = fs.read_regular(path, limit)
        value = json.loads(data)
    except FileNotFoundError:
        raise
    except fs.NotRegularFile as e:
        raise BadRecord(f"the {what} is {e.strerror}", where=str(path), hint=hint) from None
    except (ValueError, UnicodeDecodeError) as e:   # JSONDecodeError is a ValueError; so is "too large"
        raise BadRecord(f"the {what} is not a readable JSON record: {e}", where=str(path), hint=hint) from None
    except OSError as e:
        raise path_error(e, doing=f"the {what} cannot be read") or e from None
    why = problem(value)
    if why is not None:
        raise BadRecord(f"the {what} is bad: {why}", where=str(path), hint=hint)
    return value
