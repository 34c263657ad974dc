"""The store's records, typed: what ``entries/<name>/meta.json`` holds for each kind of entry (``KINDS`` and
the references between them live in the store itself, ``hermetic.store``).

These types name the on-disk format of docs/layout.md for mypy and for readers; they change nothing on disk.
A no-op realize does not import this module (creating TypedDicts costs more than the rest of its imports).
JSON has no tuples: a ``FileSpec`` or an ``InputHash`` is read back as a list, which unpacks the same.
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

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


class CompileCost(TypedDict):
    """What one compile took (``build/costwrap.py``): the next build starts the longest first and keeps the
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
