"""Source trees: a folder of the repository, or a wheel or sdist pinned by sha256, with patches applied.

A source tree is a store entry named by its *inputs* (the archive's sha256 or the folder's file map, the
subdir, the patches' bytes), laid out like any tree as read-only links to blobs. A variant's compiles see it
through ``build/<recipe>/<variant>/src/<source>``, which the build's prefix map names
``/hermetic/src/<source>`` in keys, records and objects (PRODUCT.md: absolute paths inside objects are
handled deliberately).
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import stat
import tarfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING
from urllib.parse import urlsplit

from hermetic import fs
from hermetic.errors import BadInput, PreconditionFailed, WorkFailed, path_error
from hermetic.locks.types import LockedWheel
from hermetic.locks.validate import basename
from hermetic.procs import Limits, TimedOut, run_limited
from hermetic.recipe import Recipe, Source, Variant
from hermetic.reporter import Reporter, plural
from hermetic.root import Root
from hermetic.store import STORE_FORMAT, Store, blob_ref, entry_name
from hermetic.store.records import FileMap
from hermetic.store.trees import check_relpath
from hermetic.urls import file_url_path

if TYPE_CHECKING:
    from hermetic.extensions.share import ObjectShare

SOURCE_VERSION = 1
MAX_SOURCE_BYTES = 4 << 30   # a decompression bomb stops here, not at a full disk
MAX_SOURCE_FILES = 200_000
PATCH_TIMEOUT_S = 300.0
MAX_PATCH_BYTES = 256 << 20
SYSTEM_PATH = "/usr/bin:/bin"  # system tools (patch) come from here, never from a PATH


@dataclass(frozen=True)
class SourceTree:
    entry: str
    files: FileMap

    def out(self, store: Store) -> Path:
        return store.entry_path(self.entry) / "out"


def source_origin(src: Source) -> str:
    """What a source tree is made from: the folder's file map (hashed), or the archive's sha256."""
    origin = _folder_key(src.path) if src.path is not None else src.sha256
    assert origin is not None
    return origin


def source_entry_name(src: Source, patches: tuple[Path, ...], origin: str | None = None) -> str:
    """The source tree's entry: named by its inputs (the origin, the subdir, the patches' bytes)."""
    key = fs.sha256_bytes(fs.canonical_json({
        "v": SOURCE_VERSION, "origin": origin or source_origin(src), "subdir": src.subdir,
        "patches": [fs.sha256_file(p)[0] for p in patches]}))
    return entry_name(key, f"src-{src.name}")


@dataclass(frozen=True)
class SourceStep:
    """What a realize decides of one source of one variant: its tree's entry (named by its inputs: the origin,
    the subdir, the patches' bytes) and whether it is in the store (``reuse``), made from the folder or the
    stored archive (``prepare``), or needs its archive fetched first (``fetch``)."""
    variant: str
    source: Source
    patches: tuple[Path, ...]
    origin: str
    entry: str
    action: str


def plan_sources(store: Store, recipe: Recipe, variants: list[Variant]) -> list[SourceStep]:
    """Every source of every chosen variant, with the source's and the variant's patches (a variant's own
    patches with several sources: refused by ``variants.check_builds``, before any work)."""
    names = sorted({e.source for e in recipe.extensions})
    origins: dict[str, str] = {}   # a folder source is hashed once, whatever the variants
    out = []
    for variant in variants:
        for n in names:
            src = recipe.sources[n]
            patches = src.patches + variant.patches
            origin = origins[n] = origins.get(n) or source_origin(src)
            entry = source_entry_name(src, patches, origin)
            action = "reuse" if store.has_entry(entry) else \
                "prepare" if src.path is not None or store.has_blob(src.sha256 or "") else "fetch"
            out.append(SourceStep(variant.name, src, patches, origin, entry, action))
    return out


def preview_source(root: Root, store: Store, step: SourceStep) -> tuple[Path | None, list[str] | None]:
    """(the folder a plan reads the tree's files from, its files), as ``realize_source`` would lay them out:
    the stored tree's, else a copy made and patched in a folder outside the root (a dry run's); (None, None)
    when its archive would be fetched first. Variants that share a tree share its copy."""
    if step.action == "reuse":
        return store.entry_path(step.entry) / "out", sorted(store.tree_record(step.entry)["files"])
    folder = root.tmp / "sources" / step.entry   # the plan's own folder (outside the root): made once
    if not folder.is_dir() and not prepare_outside(store, step.source, step.patches, folder,
                                                   root.child_env({"PATH": SYSTEM_PATH, "LC_ALL": "C"})):
        return None, None
    return folder, sorted(os.path.relpath(os.path.join(d, f), folder) for d, _dirs, files in os.walk(folder)
                          for f in files)


def realize_source(root: Root, store: Store, src: Source, patches: tuple[Path, ...],
                   reporter: Reporter, share: ObjectShare | None = None, *, offline: bool = False,
                   origin: str | None = None) -> SourceTree:
    """The source's tree in the store (``origin``: ``source_origin``, where a plan computed it already)."""
    origin = origin or source_origin(src)
    name = source_entry_name(src, patches, origin)
    with store.build_entry(name) as staging:
        if staging is None:
            return _load(store, name)
        staging.out.mkdir()
        if src.path is not None:
            copy_folder(src.path, staging.out)
        else:
            fresh = not store.has_blob(src.sha256 or "")
            archive = _fetch_archive(store, src, reporter, None if offline else share, offline=offline)
            try:
                extract(archive, src, staging.out)
            except BadInput:
                if fresh:  # a hostile archive fetched just now does not stay in the store
                    store.drop_blob(archive.name)
                raise
        for patch in patches:
            apply_patch(patch, staging.out, root.child_env({"PATH": SYSTEM_PATH, "LC_ALL": "C"}))
        files = staging.ingest()
        refs = [blob_ref(src.sha256)] if src.path is None and src.sha256 is not None else []
        staging.record = {"format": STORE_FORMAT, "name": name, "kind": "tree", "label": f"src-{src.name}",
                          "files": files, "links": {}, "refs": refs,
                          "source": {"name": src.name, "origin": origin, "subdir": src.subdir,
                                     "patches": [str(p) for p in patches]}}
        reporter.event("source", f"prepared source {src.name} ({plural(len(files), 'files')}"
                                 + (f", {plural(len(patches), 'patches')}" if patches else "") + ")", source=src.name)
    return _load(store, name)


def _load(store: Store, name: str) -> SourceTree:
    rec = store.tree_record(name)
    return SourceTree(name, {p: (d, bool(x)) for p, (d, x) in rec["files"].items()})


def link_variant_source(root: Root, recipe: str, variant: str, source: str, store: Store,
                        tree: SourceTree) -> Path:
    """Point ``build/<recipe>/<variant>/src/<source>`` at the variant's source tree: the folder its compiles
    read, which the build's prefix map names ``/hermetic/src/<source>`` (callers hold the recipe's build
    lock)."""
    link = root.path / "build" / recipe / variant / "src" / source
    fs.refuse_linked_folders(root.path / "build", link.parent)   # nothing made through a planted link
    fs.atomic_symlink(os.path.relpath(tree.out(store), link.parent), link)
    return link


def _folder_key(folder: Path) -> str:
    """The hash of a source folder's file map; a symlink, a FIFO, a socket or a device in it is bad input (exit 2)
    naming it: hermetic would copy through the link, and a FIFO's read never ends."""
    entries = []
    for dirpath, dirnames, files in os.walk(folder):
        dirnames.sort()
        for f in sorted(files) + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            p = Path(dirpath) / f
            _only_regular(p)
            try:
                digest = fs.sha256_file(p, follow=False)[0]
            except fs.NotRegularFile:   # replaced since it was looked at: judged again
                _only_regular(p)
                raise
            entries.append([p.relative_to(folder).as_posix(), digest, os.access(p, os.X_OK)])
    return fs.sha256_bytes(fs.canonical_json(entries))


def _only_regular(p: Path) -> None:
    mode = os.lstat(p).st_mode
    if stat.S_ISLNK(mode):
        raise BadInput(f"source folder holds a symlink: {p} -> {os.readlink(p)}", where=str(p),
                       hint="sources must be regular files and folders: copy what it points at instead")
    if not stat.S_ISREG(mode):
        raise BadInput(f"source folder holds {fs.kind_of(mode)}, not a regular file: {p}", where=str(p),
                       hint="sources must be regular files and folders: move it out of the source folder")


def copy_folder(folder: Path, out: Path) -> None:
    """The folder's files copied into ``out``; a symlink, a FIFO, a socket or a device among them is bad input
    (exit 2) naming it, as ``_folder_key`` says (``recipe new FOLDER`` copies without hashing first)."""
    for dirpath, _dirnames, files in os.walk(folder):
        rel = Path(dirpath).relative_to(folder)
        (out / rel).mkdir(parents=True, exist_ok=True)
        for f in files:
            _only_regular(Path(dirpath) / f)
            try:
                fs.copy_file(Path(dirpath) / f, out / rel / f)
            except fs.NotRegularFile:   # replaced since it was looked at: judged again
                _only_regular(Path(dirpath) / f)
                raise


def prepare_outside(store: Store, src: Source, patches: tuple[Path, ...], out: Path, env: dict[str, str]) -> bool:
    """A dry run's copy of the tree ``realize_source`` would make, in ``out`` (a folder outside the root): the
    folder copied, or the stored archive extracted, then patched. False when the archive is not in the store
    (it would be fetched first): then nothing is made."""
    out.mkdir(parents=True, exist_ok=True)
    if src.path is not None:
        copy_folder(src.path, out)
    elif src.sha256 is not None and store.has_blob(src.sha256):
        extract(store.blob_path(src.sha256), src, out)
    else:
        return False
    for patch in patches:
        apply_patch(patch, out, env)
    return True


def _fetch_archive(store: Store, src: Source, reporter: Reporter, share: ObjectShare | None, *,
                   offline: bool = False) -> Path:
    assert src.sha256 is not None
    store.pin_blob(src.sha256)
    if store.use_blob(src.sha256) or (share is not None and share.fetch_blob([src.sha256])):
        return store.blob_path(src.sha256)
    if offline:
        from hermetic.wheels.unpacked import offline_error
        raise offline_error([(src.wheel or f"the archive of source {src.name} (sha256 {src.sha256[:16]}…)",
                              src.where)])
    from hermetic.fetch.download import Fetcher
    from hermetic.fetch.pipconfig import load_pip_config
    locked = archive_wheel(src)
    with Fetcher(load_pip_config(), store.tmp, reporter) as fetcher:
        got = fetcher.fetch(locked)
    blob = store.put_blob_file(got.path, got.sha256)
    if share is not None:
        share.upload_blob(got.sha256)
    return blob


def archive_wheel(src: Source) -> LockedWheel:
    """A source archive as the fetcher sees a locked file: by name==version from the indexes, or its URL."""
    assert src.sha256 is not None
    if src.wheel:
        name, _, version = src.wheel.partition("==")
        return LockedWheel(name.lower().replace("_", "-"), version, (src.sha256,), None, None, None, None, src.where)
    url = src.url or ""
    # decoded as the lock readers decode a location (percent-escapes, file://localhost/)
    local = file_url_path(url, src.where) if urlsplit(url).scheme.lower() == "file" else None
    return LockedWheel(src.name, None, (src.sha256,), basename(url), None if local else url, local, None, src.where)


def extract(archive: Path, src: Source, out: Path) -> None:
    """The archive's ``subdir`` into ``out``: regular files only, every path checked, size bounded."""
    try:
        count = _extract_members(archive, src, out)
    except (zipfile.BadZipFile, zlib.error, EOFError, gzip.BadGzipFile) as e:
        raise BadInput(f"source archive is damaged: {e}", where=src.where,
                       hint="the archive is damaged or hostile; check the pinned sha256 and where it comes from") \
            from None
    if count == 0:
        raise BadInput(f"source archive has no files under {src.subdir or '/'}", where=src.where,
                       hint="check subdir: it is relative to the sdist's top folder, which hermetic strips "
                            "(for pkg-1.0/src/ write subdir = \"src\", not \"pkg-1.0/src\")")


def _extract_members(archive: Path, src: Source, out: Path) -> int:
    prefix = f"{src.subdir}/" if src.subdir else ""
    total = count = 0
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            infos = zf.infolist()
            # a zip sdist (zip -r pkg-1.0.zip pkg-1.0, shutil.make_archive) has one top folder, stripped as a
            # tar's is; a wheel, or a zip of files at its top, is taken as it is
            tops = {i.filename.split("/", 1)[0] for i in infos}
            wheel = src.wheel is not None or (src.url or "").split("?")[0].endswith(".whl")
            top = next(iter(tops)) + "/" if (len(tops) == 1 and not wheel
                                            and all("/" in i.filename for i in infos)) else ""
            for info in infos:
                _check_member(info.filename.rstrip("/"), src)   # the whole name, before a top folder is cut off
                name = info.filename[len(top):]
                if info.is_dir() or not name.startswith(prefix):
                    continue
                rel = name[len(prefix):]
                _check_member(rel, src)
                if (info.external_attr >> 16) & 0o170000 == 0o120000:
                    raise BadInput(f"source archive member {info.filename} is a symlink", where=src.where,
                                   hint="the archive is hostile or damaged")
                total, count = _account(total + info.file_size, count + 1, src)
                dst = out / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as fin:
                    _write_member(fin, dst, info.file_size, src)
                if (info.external_attr >> 16) & 0o111:
                    os.chmod(dst, 0o755)
    else:
        try:
            with tarfile.open(archive) as tf:
                for member in tf:
                    full = member.name.removeprefix("./").rstrip("/")
                    if full not in ("", "."):
                        _check_member(full, src)  # the whole name, before the top folder is cut off
                    name = member.name.split("/", 1)[1] if "/" in member.name else ""  # sdists: one top folder
                    if member.isdir() or not name.startswith(prefix):
                        continue
                    rel = name[len(prefix):]
                    _check_member(rel, src)
                    if not member.isfile():
                        raise BadInput(f"source archive member {member.name} is not a regular file",
                                       where=src.where, hint="the archive is hostile or damaged")
                    total, count = _account(total + member.size, count + 1, src)
                    dst = out / rel
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    member_file = tf.extractfile(member)
                    assert member_file is not None
                    _write_member(member_file, dst, member.size, src)
                    if member.mode & 0o111:
                        os.chmod(dst, 0o755)
        except tarfile.TarError as e:
            raise BadInput(f"source archive is neither a zip nor a tar: {e}", where=src.where,
                           hint="give a wheel (.whl) or an sdist (.tar.gz)") from None
    return count


def _check_member(rel: str, src: Source) -> None:
    try:
        check_relpath(rel)
    except ValueError:
        raise BadInput(f"source archive member {rel!r} leaves the tree", where=src.where,
                       hint="the archive is hostile or damaged") from None


def _account(total: int, count: int, src: Source) -> tuple[int, int]:
    if total > MAX_SOURCE_BYTES or count > MAX_SOURCE_FILES:
        raise BadInput(f"source archive unpacks to more than {MAX_SOURCE_BYTES >> 30} GiB or "
                       f"{MAX_SOURCE_FILES} files", where=src.where, hint="a decompression bomb? check the pin")
    return total, count


def _write_member(fin: IO[bytes], dst: Path, declared: int, src: Source) -> None:
    try:
        fs.copy_hashed(fin, dst, limit=declared)
    except fs.TooLarge:
        raise BadInput("source archive member is larger than its header says", where=src.where,
                       hint="the archive is hostile or damaged") from None
    except FileExistsError:
        raise BadInput(f"source archive member {dst.name} appears twice", where=src.where,
                       hint="the archive is hostile or damaged") from None


_PATCH_PATH = re.compile(r"^(?:---|\+\+\+|\*\*\*) (\S+)")   # unified (---, +++) and context (***, ---) headers
# a context diff's hunk ranges ("*** 1,3 ****", "--- 1 ----") and separator: no path, whatever the format
_CONTEXT_RANGE = re.compile(r"^(?:\*\*\* \d+(?:,\d+)? \*\*\*\*|--- \d+(?:,\d+)? ----|\*{15})\s*$")
_GIT_DIFF = re.compile(r"^diff --git (.*)$")
_MODE_HEADERS = ("old mode", "new mode", "new file mode", "deleted file mode")
_INDEX_LINE = re.compile(r"^index [0-9a-f]{4,64}\.\.[0-9a-f]{4,64}(?: (\d+))?$")
_REFUSED_HEADERS = {"rename from ": "renames a file", "rename to ": "renames a file", "copy from ": "copies a file",
                    "copy to ": "copies a file", "similarity index ": "renames or copies a file",
                    "GIT binary patch": "is a binary patch", "Binary files ": "is a binary patch"}
REGULAR_MODES = ("100644", "100755")   # what a patch may give a file: a regular file, executable or not
_MODE_NAMES = {"120000": "a symlink", "160000": "a submodule (gitlink)", "040000": "a folder"}
PATCH_HINT = ("a patch may create, change and delete regular files inside the source tree and set or clear their "
              "executable bit; write the symlink, rename, copy or binary file into the source instead")


def check_patch(text: str, patch: Path) -> None:
    """Refuse a patch, before ``patch`` runs, that does more than create, change and delete regular files in the
    tree and set their executable bit: paths outside the tree, symlinks and other modes, renames and copies,
    binary patches (git's extended headers, which GNU patch applies). A line at column 0 is a header line in
    any unified diff (hunk lines start with a space, +, - or \\), so every such line is judged, wherever it is."""
    def refuse(lineno: int, why: str) -> BadInput:
        return BadInput(f"the patch {why}", where=f"{patch}:{lineno}", hint=PATCH_HINT)

    for lineno, line in enumerate(text.splitlines(), 1):
        if _CONTEXT_RANGE.match(line):
            continue
        if m := _PATCH_PATH.match(line):
            if m.group(1) != "/dev/null":
                _check_patch_path(m.group(1), patch, lineno)
        elif m := _GIT_DIFF.match(line):
            _check_git_paths(m.group(1), patch, lineno)
        elif line.startswith(_MODE_HEADERS):  # exactly as git writes it: GNU patch reads any octal number here
            head, _, mode = line.rstrip().rpartition(" ")
            if head not in _MODE_HEADERS or mode not in REGULAR_MODES:
                raise refuse(lineno, f"makes {_mode_name(mode)} ({line.strip()[:80]!r})")
        elif line.startswith("index "):
            m = _INDEX_LINE.match(line.rstrip())
            if m is None:
                raise refuse(lineno, f"has an index line that is not git's ({line.strip()[:80]!r})")
            if m.group(1) is not None and m.group(1) not in REGULAR_MODES:
                raise refuse(lineno, f"makes {_mode_name(m.group(1))} ({line.strip()[:80]!r})")
        else:
            for head, why in _REFUSED_HEADERS.items():
                if line.startswith(head):
                    raise refuse(lineno, f"{why} ({line.strip()[:80]!r})")


def _mode_name(mode: str) -> str:
    return _MODE_NAMES.get(mode.zfill(6), f"a file of mode {mode}")


def _check_patch_path(path: str, patch: Path, lineno: int) -> None:
    parts = path.split("/", 1)
    rel = parts[1] if len(parts) == 2 and parts[0] else ""  # an absolute path is never in the tree
    try:
        check_relpath(rel)
    except ValueError:
        raise BadInput(f"the patch touches {path!r}, outside the source tree",
                       where=f"{patch}:{lineno}", hint="patch paths are a/<path> and b/<path> inside the "
                                                       "source tree (applied with -p1)") from None


def _check_git_paths(names: str, patch: Path, lineno: int) -> None:
    """``diff --git a/P b/P``: GNU patch takes the path from here when no ---/+++ lines follow (a new empty
    file, a mode change). The two names are the same path (renames and copies are refused), so the line splits
    in its middle; a quoted name (git quotes unusual ones) is refused rather than unquoted by guesswork."""
    half = (len(names) - 1) // 2
    first, second = names[:half], names[half + 1:]
    tokens = names.split(" ")
    if len(tokens) == 2 and tokens[0].startswith("a/") and tokens[1].startswith("b/") and \
            tokens[0][2:] != tokens[1][2:]:
        raise BadInput(f"the patch renames or copies a file ({names[:120]!r})", where=f"{patch}:{lineno}",
                       hint=PATCH_HINT)
    if names.startswith('"') or names[half:half + 1] != " " or first[2:] != second[2:]:
        raise BadInput(f"the patch's header names paths hermetic cannot read as one file: {names[:120]!r}",
                       where=f"{patch}:{lineno}", hint=PATCH_HINT)
    _check_patch_path(first, patch, lineno)
    _check_patch_path(second, patch, lineno)


def check_patched_tree(tree: Path, patch: Path) -> None:
    """After ``patch`` ran: the tree holds only regular files and folders (no symlink, FIFO or device), before
    anything in it is hashed or chmodded, so nothing is ever read or changed through a link it made."""
    for dirpath, dirnames, files in os.walk(tree):
        for name in [*dirnames, *files]:
            p = os.path.join(dirpath, name)
            mode = os.lstat(p).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                what = "a symlink" if stat.S_ISLNK(mode) else "no regular file"
                raise BadInput(f"after the patch, {os.path.relpath(p, tree)} in the source tree is {what}",
                               where=str(patch), hint=PATCH_HINT)


def apply_patch(patch: Path, tree: Path, env: dict[str, str], *, timeout: float = PATCH_TIMEOUT_S) -> None:
    """Apply a unified diff with GNU patch (-p1), after checking that it only creates, changes and deletes
    regular files in the tree (``check_patch``), and check the tree again after it ran (``check_patched_tree``).

    patch is the system's (/usr/bin, /bin: never a PATH's), run like a compiler: in a session of its own that
    dies with hermetic, and stopped past ``timeout`` (a patch applies in milliseconds; one that does not is
    stuck, on a stalled file system say)."""
    try:   # a regular file (never a FIFO: its read would wait for good), of a patch's size
        text = fs.read_regular(patch, MAX_PATCH_BYTES, follow=True).decode(errors="replace")
    except fs.NotRegularFile as e:
        raise BadInput(f"the patch is {e.strerror}", where=str(patch), hint="a patch is a file of a unified diff") \
            from None
    except ValueError as e:
        raise BadInput(f"the patch is too large: {e}", where=str(patch), hint="a patch is a file of a unified diff") \
            from None
    except OSError as e:
        raise path_error(e, doing="cannot read the patch") or e from None
    check_patch(text, patch)
    exe = shutil.which("patch", path=SYSTEM_PATH)
    if exe is None:
        raise PreconditionFailed(f"GNU patch is not installed (looked in {SYSTEM_PATH})",
                                 hint="apt-get install patch")
    for dry in (True, False):
        args = [exe, "-p1", "--batch", "--forward", "--no-backup-if-mismatch", "--reject-file=-",
                "-d", os.path.abspath(tree), "-i", os.path.abspath(patch)] + (["--dry-run"] if dry else [])
        try:
            rc, tail = run_limited(args, cwd=str(tree), env=env, limits=Limits(), on_line=lambda _line: None,
                                   timeout=timeout, writable_too=(os.path.realpath(tree),))
        except TimedOut:
            raise WorkFailed(f"patch did not finish within {timeout:g} s and was stopped", where=str(patch),
                             hint="a patch applies in well under a second: is the patch or the source tree on a "
                                  "stalled file system?") from None
        if rc != 0:
            raise BadInput("the patch does not apply:\n" + "\n".join(tail).strip()[-1500:],
                           where=str(patch), hint="regenerate it against the pinned source")
    check_patched_tree(tree, patch)
