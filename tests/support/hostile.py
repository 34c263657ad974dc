"""The hostile-input table, shared by tests/test_reliability_hostile.py and bench/soak.

Each case writes real files (wheels, sdists, locks, recipes, patches) into a folder of its own, runs the real
CLI once, and is judged the same way: the exit code it must have; a clear error (a first line `error:`, no
traceback, a `hint:`, the file and line or the key, the words that say what was expected); the store exactly
as it was (every path, size and mtime; nothing left in store/tmp); nothing written outside the root (the
audit of a private HOME, TMPDIR, current folder, the case's folder and an `outside` folder some inputs aim
at by absolute path).

Bombs are real archives: a wheel and a zip sdist whose member inflates to 40 GiB and a tar.gz whose member is
5 GiB of zeros (a few MB on disk: the same compressed block repeated, with the right CRCs and sizes).
"""

from __future__ import annotations

import base64
import csv
import gzip
import hashlib
import io
import json
import os
import shutil
import struct
import tarfile
import time
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hermetic.audit import OutsideRootAudit
from tests.support import cli
from tests.support.archives import CRAFTED, climbing_links, crafted, tree_archive
from tests.support.cli import Result
from tests.support.recipes import TOOLCHAIN_LOCK, recipe_toml
from tests.support.reliability import FileServer
from tests.support.trees import store_listing
from tests.support.wheels import BuiltWheel, build_wheel

HOSTILE_RECIPE = "hostile"  # every build case uses this name: its toolchain tree exists before the case runs


# --- archives the stdlib will not write -------------------------------------------------------------------
def _gf2_times(mat: list[int], vec: int) -> int:
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _gf2_square(mat: list[int]) -> list[int]:
    return [_gf2_times(mat, mat[n]) for n in range(32)]


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """zlib's crc32_combine: the CRC of A+B from CRC(A), CRC(B) and len(B), without reading A or B."""
    if len2 <= 0:
        return crc1
    odd = [0xEDB88320] + [1 << n for n in range(31)]
    even = _gf2_square(odd)
    odd = _gf2_square(even)
    while True:
        even = _gf2_square(odd)
        if len2 & 1:
            crc1 = _gf2_times(even, crc1)
        len2 >>= 1
        if not len2:
            break
        odd = _gf2_square(even)
        if len2 & 1:
            crc1 = _gf2_times(odd, crc1)
        len2 >>= 1
        if not len2:
            break
    return crc1 ^ crc2


CHUNK = 16 << 20


def _zeros_deflate(total: int) -> tuple[bytes, int]:
    """A raw deflate stream of ``total`` zero bytes (a multiple of CHUNK) and its CRC-32, built from one
    compressed chunk repeated (a full flush resets the compressor, so every chunk compresses the same)."""
    assert total % CHUNK == 0
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = c.compress(bytes(CHUNK)) + c.flush(zlib.Z_FULL_FLUSH)
    tail = zlib.compressobj(9, zlib.DEFLATED, -15).flush(zlib.Z_FINISH)  # an empty final block
    crc, count = 0, total // CHUNK
    part_crc, part_len = zlib.crc32(bytes(CHUNK)), CHUNK
    while count:  # the CRC of count chunks, by doubling
        if count & 1:
            crc = crc32_combine(crc, part_crc, part_len)
        part_crc, part_len = crc32_combine(part_crc, part_crc, part_len), 2 * part_len
        count >>= 1
    return block * (total // CHUNK) + tail, crc


def write_zip(path: Path, members: list[tuple[str, bytes, int]], bomb: tuple[str, int] | None = None) -> Path:
    """A zip of (name, data, unix mode) members, names as given (absolute, '..', control characters), plus
    optionally one zip64 member of ``bomb[1]`` zero bytes stored as a repeated deflate block."""
    out = io.BytesIO()
    central = []
    for name, data, mode in members:
        info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
        info.external_attr = mode << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        offset = out.tell()
        comp = zlib.compressobj(6, zlib.DEFLATED, -15)
        raw = comp.compress(data) + comp.flush()
        central.append((name.encode(), zlib.crc32(data), len(raw), len(data), offset, mode, False))
        out.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 8, 0, 0x5021, zlib.crc32(data), len(raw),
                              len(data), len(name.encode()), 0) + name.encode() + raw)
    if bomb is not None:
        name, size = bomb
        stream, crc = _zeros_deflate(size)
        offset = out.tell()
        extra = struct.pack("<HHQQ", 1, 16, size, len(stream))
        out.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, 45, 0, 8, 0, 0x5021, crc, 0xFFFFFFFF, 0xFFFFFFFF,
                              len(name.encode()), len(extra)) + name.encode() + extra + stream)
        central.append((name.encode(), crc, len(stream), size, offset, 0o100644, True))
    cd_start = out.tell()
    for name_b, crc, csize, usize, offset, mode, z64 in central:
        extra = struct.pack("<HHQQ", 1, 16, usize, csize) if z64 else b""
        out.write(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, (3 << 8) | (45 if z64 else 20), 45 if z64 else 20,
                              0, 8, 0, 0x5021, crc, 0xFFFFFFFF if z64 else csize, 0xFFFFFFFF if z64 else usize,
                              len(name_b), len(extra), 0, 0, 0, mode << 16, offset) + name_b + extra)
    cd_size = out.tell() - cd_start
    out.write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(central), len(central), cd_size, cd_start, 0))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(out.getvalue())
    return path


def _record_line(name: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, f"sha256={digest}", str(len(data))]


def raw_wheel(out: Path, dist: str, members: list[tuple[str, bytes, int]], *, listed: bool = True,
              bomb: tuple[str, int] | None = None) -> Path:
    """A wheel with a valid METADATA/WHEEL/RECORD around arbitrary members (listed in RECORD when ``listed``)."""
    info = f"{dist}-1.0.dist-info"
    meta = [(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n".encode(), 0o100644),
            (f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: hostile\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
             0o100644)]
    rows = [_record_line(n, d) for n, d, _m in meta + (members if listed else [])]
    if bomb is not None:
        rows.append([bomb[0], f"sha256={'A' * 43}", str(bomb[1])])
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows([*rows, [f"{info}/RECORD", "", ""]])
    record = buf.getvalue().encode()
    return write_zip(out / f"{dist}-1.0-py3-none-any.whl", [*meta, *members, (f"{info}/RECORD", record, 0o100644)],
                     bomb)


def write_tar(path: Path, members: list[tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz", format=tarfile.GNU_FORMAT) as tf:
        for m in members:
            if isinstance(m, tuple):
                info, data = m
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
            else:
                tf.addfile(m)
    return path


def tar_bomb(path: Path, size: int) -> Path:
    """A .tar.gz whose one member is ``size`` zero bytes: gzip members concatenated (a header, the same
    compressed CHUNK of zeros repeated, the end of the archive)."""
    info = tarfile.TarInfo("pkg-1.0/src/zeros.bin")
    info.size = size
    chunk = gzip.compress(bytes(CHUNK), compresslevel=9, mtime=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(gzip.compress(info.tobuf(format=tarfile.GNU_FORMAT), mtime=0))
        for _ in range(size // CHUNK):
            f.write(chunk)
        f.write(gzip.compress(bytes(1024), mtime=0))
    return path


def _ti(name: str, **kw: Any) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    for k, v in kw.items():
        setattr(info, k, v)
    return info


# --- cases ---------------------------------------------------------------------------------------------------
@dataclass
class Ctx:
    """What a case may use: its own folder (a git repository's top: recipe paths must stay inside), a folder
    outside it that hostile paths aim at, the loopback file server and the root."""
    folder: Path
    outside: Path
    server: FileServer
    root: Path

    def sha(self, p: Path) -> str:
        return hashlib.sha256(p.read_bytes()).hexdigest()

    def lock_url(self, path: Path, name: str | None = None, sha: str | None = None) -> str:
        dist = name or path.name.split("-")[0]
        return f"{dist} @ {self.server.add(path)} --hash=sha256:{sha or self.sha(path)}\n"

    def lock_recipe(self, lock_text: str, lock_name: str = "env.lock.txt") -> list[str]:
        (self.folder / lock_name).write_text(lock_text)
        recipe = self.folder / "recipe.toml"
        recipe.write_text(recipe_toml("hostile-env", locks=[lock_name]))
        return ["realize", str(recipe)]

    def build_recipe(self, source: str, extra: str = "", src_files: dict[str, str] | None = None) -> list[str]:
        """A recipe that builds: [toolchain] (already realized) then a source that fails."""
        shutil.copy(TOOLCHAIN_LOCK, self.folder)
        for rel, text in (src_files or {}).items():
            (self.folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.folder / rel).write_text(text)
        recipe = self.folder / "recipe.toml"
        recipe.write_text(recipe_toml(HOSTILE_RECIPE, toolchain=True, extra=f"{source}\n{extra}",
                                      extensions=['name = "hostile_ext"\nsource = "s"\nsources = ["*.cpp"]']))
        return ["realize", str(recipe)]

    def archive_source(self, archive: Path, subdir: str = "") -> list[str]:
        url = self.server.add(archive)
        sub = f'subdir = "{subdir}"\n' if subdir else ""
        return self.build_recipe(f'[sources.s]\nurl = "{url}"\nsha256 = "{self.sha(archive)}"\n{sub}')


@dataclass(frozen=True)
class Case:
    id: str
    what: str
    code: int
    needles: tuple[str, ...]                 # the error names these (file, line, key, what was expected)
    make: Callable[[Ctx], list[str]]         # writes the inputs, returns hermetic's arguments
    builds: bool = False                     # needs the toolchain realized in the root


def _wheel(ctx: Ctx, dist: str, members: list[tuple[str, bytes, int]], **kw: Any) -> list[str]:
    return ctx.lock_recipe(ctx.lock_url(raw_wheel(ctx.folder / "w", dist, members, **kw)))


def _honest(ctx: Ctx, name: str = "honest") -> BuiltWheel:
    return build_wheel(ctx.folder / "w", name, "1.0", {f"{name}/__init__.py": "X = 1\n"})


REG = 0o100644


def _cases() -> list[Case]:
    c: list[Case] = []

    def case(id: str, what: str, code: int, needles: tuple[str, ...], builds: bool = False) -> Callable[
            [Callable[[Ctx], list[str]]], Callable[[Ctx], list[str]]]:
        def add(fn: Callable[[Ctx], list[str]]) -> Callable[[Ctx], list[str]]:
            c.append(Case(id, what, code, needles, fn, builds))
            return fn
        return add

    @case("wheel-dotdot", "a wheel member ../escape.py", 2, ("trav-1.0-py3-none-any.whl", "env.lock.txt:1"))
    def _(ctx: Ctx) -> list[str]:
        return _wheel(ctx, "trav", [("../escape.py", b"X = 1\n", REG)])

    @case("wheel-absolute", "a wheel member with an absolute path into a folder outside", 2,
          ("absw-1.0-py3-none-any.whl", "env.lock.txt:1"))
    def _(ctx: Ctx) -> list[str]:
        return _wheel(ctx, "absw", [(f"{ctx.outside}/abs-escape.py", b"X = 1\n", REG)])

    @case("wheel-data-dotdot", "a wheel .data/purelib member climbing out of the scheme", 2,
          ("datat-1.0-py3-none-any.whl",))
    def _(ctx: Ctx) -> list[str]:
        return _wheel(ctx, "datat", [("datat-1.0.data/purelib/../../../escape.py", b"X = 1\n", REG)])

    @case("wheel-symlink", "a wheel member that is a symlink to /etc/passwd", 2, ("symw-1.0-py3-none-any.whl",
                                                                                "symlink"))
    def _(ctx: Ctx) -> list[str]:
        return _wheel(ctx, "symw", [("symw/passwd", b"/etc/passwd", 0o120777)])

    @case("wheel-control-chars", "a wheel member whose name holds an escape sequence and a newline", 2,
          ("ctlw-1.0-py3-none-any.whl",))
    def _(ctx: Ctx) -> list[str]:
        return _wheel(ctx, "ctlw", [("ctlw/\x1b[31mred\nline.py", b"X = 1\n", REG)])

    @case("wheel-record-mismatch", "a wheel whose RECORD hash lies about a member", 2,
          ("liar-1.0-py3-none-any.whl", "RECORD"))
    def _(ctx: Ctx) -> list[str]:
        w = build_wheel(ctx.folder / "w", "liar", "1.0", {"liar/x.py": "A = 1\n"},
                        record_override={"liar/x.py": "sha256=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"})
        return ctx.lock_recipe(ctx.lock_url(w.path))

    @case("wheel-unlisted-member", "a wheel member RECORD does not list", 2, ("sneak-1.0-py3-none-any.whl",
                                                                            "RECORD"))
    def _(ctx: Ctx) -> list[str]:
        return _wheel(ctx, "sneak", [("sneak/x.py", b"A = 1\n", REG)], listed=False)

    @case("wheel-corrupt-deflate", "a wheel whose compressed bytes are damaged (locked with that hash)", 2,
          ("crpt-1.0-py3-none-any.whl",))
    def _(ctx: Ctx) -> list[str]:
        path = raw_wheel(ctx.folder / "w", "crpt", [("crpt/x.py", os.urandom(64) * 64, REG)])
        data = bytearray(path.read_bytes())
        start = data.index(b"crpt/x.py") + len("crpt/x.py")
        for i in range(start + 10, start + 60):
            data[i] ^= 0xFF
        path.write_bytes(bytes(data))
        return ctx.lock_recipe(ctx.lock_url(path))

    @case("wheel-bomb", "a 21 MB wheel whose member inflates to 20 GiB", 2, ("bombw-1.0-py3-none-any.whl",
                                                                            "GiB"))
    def _(ctx: Ctx) -> list[str]:
        return _wheel(ctx, "bombw", [], bomb=("bombw/zeros.bin", 20 << 30))

    @case("lock-hash-mismatch", "a lock whose sha256 is not the file's", 2, ("env.lock.txt:1", "sha256"))
    def _(ctx: Ctx) -> list[str]:
        return ctx.lock_recipe(ctx.lock_url(_honest(ctx).path, sha="0" * 64))

    @case("lock-size-mismatch", "a pylock.toml whose size is not the file's", 2, ("pylock.toml", "bytes"))
    def _(ctx: Ctx) -> list[str]:
        w = _honest(ctx)
        text = (f'lock-version = "1.0"\ncreated-by = "hostile"\n[[packages]]\nname = "honest"\nversion = "1.0"\n'
                f'[[packages.wheels]]\nurl = "{ctx.server.add(w.path)}"\nsize = {w.size + 1}\n'
                f'hashes = {{sha256 = "{w.sha256}"}}\n')
        return ctx.lock_recipe(text, "pylock.toml")

    @case("lock-twice", "a package twice in one lock", 2, ("env.lock.txt:2", "twice"))
    def _(ctx: Ctx) -> list[str]:
        w = _honest(ctx)
        return ctx.lock_recipe(ctx.lock_url(w.path) + ctx.lock_url(w.path, sha="1" * 64))

    @case("lock-twice-across-locks", "a package in two locks with different hashes", 2, ("twice", "b.lock.txt"))
    def _(ctx: Ctx) -> list[str]:
        w = _honest(ctx)
        (ctx.folder / "a.lock.txt").write_text(ctx.lock_url(w.path))
        (ctx.folder / "b.lock.txt").write_text(ctx.lock_url(w.path, sha="2" * 64))
        recipe = ctx.folder / "recipe.toml"
        recipe.write_text('[recipe]\nname = "hostile-env"\nlocks = ["a.lock.txt", "b.lock.txt"]\n')
        return ["realize", str(recipe)]

    @case("lock-control-chars", "a lock line with an escape sequence in the name", 2, ("env.lock.txt:1",
                                                                                     "control character"))
    def _(ctx: Ctx) -> list[str]:
        return ctx.lock_recipe(f"hon\x1b[2Jest==1.0 --hash=sha256:{'3' * 64}\n")

    @case("toml-unknown-key", "a recipe with an unknown key", 2, ("recipe.toml:3", "colour", "allowed keys"))
    def _(ctx: Ctx) -> list[str]:
        (ctx.folder / "x.lock.txt").write_text("")
        (ctx.folder / "recipe.toml").write_text('[recipe]\nname = "x"\ncolour = "red"\nlocks = ["x.lock.txt"]\n')
        return ["realize", str(ctx.folder / "recipe.toml")]

    @case("toml-wrong-type", "a recipe whose limits.jobs is a string", 2, ("recipe.toml:", "limits.jobs",
                                                                           "an integer"), builds=True)
    def _(ctx: Ctx) -> list[str]:
        return ctx.build_recipe('[sources.s]\npath = "src"\n', '[limits]\njobs = "8"\n', {"src/a.cpp": "int a;\n"})

    @case("toml-absurd-cpus", "a recipe asking for CPUs 0-99999999999", 2, ("recipe.toml:", "limits.cpus"),
          builds=True)
    def _(ctx: Ctx) -> list[str]:
        return ctx.build_recipe('[sources.s]\npath = "src"\n', '[limits]\ncpus = "0-99999999999"\n',
                                {"src/a.cpp": "int a;\n"})

    @case("toml-cpus-not-here", "a recipe asking for a CPU this machine lacks (cpus = \"4095\")", 2,
          ("recipe.toml:", "limits.cpus", "no CPU this machine"), builds=True)
    def _(ctx: Ctx) -> list[str]:   # it was a child's traceback and "fix the compile error above"
        return ctx.build_recipe('[sources.s]\npath = "src"\n', '[limits]\ncpus = "4095"\n', {"src/a.cpp": "int a;\n"})

    @case("toml-absurd-address-space", "a recipe with address_space = 99999999T", 2,
          ("recipe.toml:", "limits.address_space"), builds=True)
    def _(ctx: Ctx) -> list[str]:
        return ctx.build_recipe('[sources.s]\npath = "src"\n', '[limits]\naddress_space = "99999999T"\n',
                                {"src/a.cpp": "int a;\n"})

    @case("toml-zero-jobs", "a recipe with limits.jobs = 0", 2, ("recipe.toml:", "limits.jobs", "1-1024"),
          builds=True)
    def _(ctx: Ctx) -> list[str]:
        return ctx.build_recipe('[sources.s]\npath = "src"\n', '[limits]\njobs = 0\n', {"src/a.cpp": "int a;\n"})

    @case("recipe-source-escapes", "a recipe source path leaving the repository", 2,
          ("recipe.toml:", "sources.s.path", "leaves the repository"), builds=True)
    def _(ctx: Ctx) -> list[str]:
        return ctx.build_recipe(f'[sources.s]\npath = "../{ctx.outside.name}"\n')

    @case("recipe-lock-escapes", "a recipe lock path leaving the repository (/etc/passwd)", 2,
          ("recipe.toml:", "recipe.locks[0]", "leaves the repository"))
    def _(ctx: Ctx) -> list[str]:
        (ctx.folder / "recipe.toml").write_text('[recipe]\nname = "x"\nlocks = ["../../../../../../etc/passwd"]\n')
        return ["realize", str(ctx.folder / "recipe.toml")]

    @case("patch-escapes", "a patch that writes ../outside/owned.txt", 2, ("evil.patch:", "outside the source"),
          builds=True)
    def _(ctx: Ctx) -> list[str]:
        (ctx.folder / "evil.patch").write_text(
            "--- a/../outside/owned.txt\n+++ b/../outside/owned.txt\n@@ -0,0 +1 @@\n+owned\n")
        return ctx.build_recipe('[sources.s]\npath = "src"\npatches = ["evil.patch"]\n', "",
                                {"src/a.cpp": "int a;\n"})

    @case("patch-absolute", "a patch that writes an absolute path", 2, ("abs.patch:", "outside the source"),
          builds=True)
    def _(ctx: Ctx) -> list[str]:
        (ctx.folder / "abs.patch").write_text(
            f"--- {ctx.outside}/owned.txt\n+++ {ctx.outside}/owned.txt\n@@ -0,0 +1 @@\n+owned\n")
        return ctx.build_recipe('[sources.s]\npath = "src"\npatches = ["abs.patch"]\n', "",
                                {"src/a.cpp": "int a;\n"})

    @case("patch-symlink", "a git patch whose new file is a symlink to a file outside (new file mode 120000)", 2,
          ("link.patch:", "symlink"), builds=True)
    def _(ctx: Ctx) -> list[str]:
        secret = ctx.folder / "victim" / "secret.txt"  # an input the audit watches: a chmod of it is seen
        secret.parent.mkdir()
        secret.write_text("not for the store\n")
        (ctx.folder / "link.patch").write_text(
            f"diff --git a/leak.h b/leak.h\nnew file mode 120000\nindex 0000000..17984f4\n--- /dev/null\n"
            f"+++ b/leak.h\n@@ -0,0 +1 @@\n+{secret}\n\\ No newline at end of file\n")
        return ctx.build_recipe('[sources.s]\npath = "src"\npatches = ["link.patch"]\n', "",
                                {"src/a.cpp": "int a;\n"})

    @case("source-folder-symlink", "a source folder holding a symlink to /etc", 2, ("symlink",), builds=True)
    def _(ctx: Ctx) -> list[str]:
        args = ctx.build_recipe('[sources.s]\npath = "src"\n', "", {"src/a.cpp": "int a;\n"})
        os.symlink("/etc", ctx.folder / "src" / "etc")
        return args

    @case("sdist-dotdot", "an sdist member pkg-1.0/../../escape.cpp", 2, ("sources.s", "leaves the tree"),
          builds=True)
    def _(ctx: Ctx) -> list[str]:
        return ctx.archive_source(write_tar(ctx.folder / "a" / "pkg-1.0.tar.gz", [
            (_ti("pkg-1.0/a.cpp"), b"int a;\n"), (_ti("pkg-1.0/../../escape.cpp"), b"int e;\n")]))

    @case("sdist-absolute", "an sdist member with an absolute path into a folder outside", 2,
          ("sources.s", "leaves the tree"), builds=True)
    def _(ctx: Ctx) -> list[str]:
        return ctx.archive_source(write_tar(ctx.folder / "a" / "pkg-1.0.tar.gz", [
            (_ti("pkg-1.0/a.cpp"), b"int a;\n"), (_ti(f"{ctx.outside}/abs.cpp"), b"int e;\n")]))

    @case("sdist-symlink", "an sdist symlink member to /etc, then a member written through it", 2,
          ("sources.s", "not a regular file"), builds=True)
    def _(ctx: Ctx) -> list[str]:
        return ctx.archive_source(write_tar(ctx.folder / "a" / "pkg-1.0.tar.gz", [
            _ti("pkg-1.0/etc", type=tarfile.SYMTYPE, linkname=str(ctx.outside)),
            (_ti("pkg-1.0/etc/owned.cpp"), b"int e;\n")]))

    @case("sdist-hardlink", "an sdist hard-link member to /etc/passwd", 2, ("sources.s", "not a regular file"),
          builds=True)
    def _(ctx: Ctx) -> list[str]:
        return ctx.archive_source(write_tar(ctx.folder / "a" / "pkg-1.0.tar.gz", [
            (_ti("pkg-1.0/a.cpp"), b"int a;\n"), _ti("pkg-1.0/passwd", type=tarfile.LNKTYPE, linkname="/etc/passwd")]))

    @case("sdist-control-chars", "an sdist member whose name holds a newline and an escape", 2,
          ("sources.s", "leaves the tree"), builds=True)
    def _(ctx: Ctx) -> list[str]:
        return ctx.archive_source(write_tar(ctx.folder / "a" / "pkg-1.0.tar.gz", [
            (_ti("pkg-1.0/a\n\x1b[31m.cpp"), b"int a;\n")]))

    @case("sdist-bomb", "a 5 MB .tar.gz whose member is 5 GiB of zeros", 2, ("sources.s", "GiB"), builds=True)
    def _(ctx: Ctx) -> list[str]:
        return ctx.archive_source(tar_bomb(ctx.folder / "a" / "pkg-1.0.tar.gz", 5 << 30))

    @case("zip-source-bomb", "a 5 MB zip source whose member inflates to 5 GiB", 2, ("sources.s", "GiB"),
          builds=True)
    def _(ctx: Ctx) -> list[str]:
        return ctx.archive_source(write_zip(ctx.folder / "a" / "pkg-1.0.zip", [("a.cpp", b"int a;\n", REG)],
                                            bomb=("zeros.bin", 5 << 30)))

    @case("zip-source-symlink", "a zip source member that is a symlink", 2, ("sources.s", "symlink"), builds=True)
    def _(ctx: Ctx) -> list[str]:
        return ctx.archive_source(write_zip(ctx.folder / "a" / "pkg-1.0.zip", [
            ("a.cpp", b"int a;\n", REG), ("etc", b"/etc", 0o120777)]))

    @case("zip-source-corrupt", "a zip source whose compressed bytes are damaged", 2, ("sources.s", "damaged"),
          builds=True)
    def _(ctx: Ctx) -> list[str]:
        path = write_zip(ctx.folder / "a" / "pkg-1.0.zip", [("a.cpp", os.urandom(64) * 64, REG)])
        data = bytearray(path.read_bytes())
        for i in range(40, 90):
            data[i] ^= 0xFF
        path.write_bytes(bytes(data))
        return ctx.archive_source(path)

    @case("source-hash-mismatch", "a source archive whose sha256 is not the pinned one", 2,
          ("sources.s", "sha256"), builds=True)
    def _(ctx: Ctx) -> list[str]:
        archive = write_tar(ctx.folder / "a" / "pkg-1.0.tar.gz", [(_ti("pkg-1.0/a.cpp"), b"int a;\n")])
        url = ctx.server.add(archive)
        return ctx.build_recipe(f'[sources.s]\nurl = "{url}"\nsha256 = "{"4" * 64}"\n')

    @case("export-into-store", "`hermetic export` aimed at a read-only store file (a blob)", 2,
          ("store", "export"))
    def _(ctx: Ctx) -> list[str]:
        blob = next(p for p in sorted((ctx.root / "store" / "blobs").glob("*/*")) if p.is_file())
        return ["export", str(blob)]

    @case("export-into-profile", "`hermetic export` aimed at a file of a realized tree", 2, ("store", "export"))
    def _(ctx: Ctx) -> list[str]:
        target = next(p for p in sorted((ctx.root / "profiles").glob("*/nvidia/cu13/include/*.h")))
        return ["export", str(target)]

    @case("archive-chained-links", "an archive whose tree links chain through each other out of the root, at a "
                                   "file of a folder outside", 2, ("chained.tar.zst", "through its symlink"))
    def _(ctx: Ctx) -> list[str]:
        victim = ctx.folder / "victim" / "precious.txt"
        victim.parent.mkdir()
        victim.write_text("the user's file\n")
        # the staging tree is ROOT/store/tmp/entry-*/out: from out/a, six folders up is the root's parent
        victim = Path(os.path.relpath(victim, ctx.root.parent))
        return ["import", str(tree_archive(ctx.folder / "chained.tar.zst", climbing_links(6, str(victim))))]

    @case("archive-link-through-link", "an archive whose tree link leads out through another of its links", 2,
          ("through-link.tar.zst", "leaves the tree"))
    def _(ctx: Ctx) -> list[str]:
        # each link alone climbs no more than its depth (the check before issue 34); E passes L, which leads to
        # the tree's top, and climbs 7 more folders from there: out of the root
        folder = "m/n/o/p/q/r/s"
        links = {f"{folder}/L": "/".join([".."] * 7), f"{folder}/E": "L/" + "/".join([".."] * 7)}
        return ["import", str(tree_archive(ctx.folder / "through-link.tar.zst", links))]

    for kind, what in sorted(CRAFTED.items()):
        def make(ctx: Ctx, kind: str = kind) -> list[str]:
            return ["import", str(crafted(kind, ctx.folder / f"{kind}.tar.zst"))]
        c.append(Case(f"archive-{kind}", what, 2, (f"{kind}.tar.zst", "nothing was imported"), make))
    return c


CASES = _cases()


# --- judging ---------------------------------------------------------------------------------------------------
@dataclass
class Verdict:
    id: str
    what: str
    expected: int
    rc: int
    first_line: str
    clear: bool
    store_unchanged: bool
    outside_root: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems


def _clear(run: Result, needles: tuple[str, ...]) -> list[str]:
    problems = []
    err = run.err
    if "Traceback" in err or "internal error" in err:
        problems.append("a traceback or internal error")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    if not errors:
        problems.append("no line starting with 'error: '")
    if not any(ln.strip().startswith("hint: ") for ln in lines):
        problems.append("no hint (what to do)")
    record = run.result.get("error") or {}
    if not record.get("where"):
        problems.append("the JSON result names no file or key ('where')")
    for n in needles:
        if n not in err:
            problems.append(f"the error does not say {n!r}")
    return problems


def _facts(p: Path) -> tuple[int, int, int] | None:
    """What a change to an input shows: its mtime, mode (a chmod) and inode (replaced); None once removed."""
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_mode, st.st_ino


def run_case(case: Case, work: Path, root: Path, server: FileServer, env: dict[str, str]) -> Verdict:
    folder = work / case.id / "repo"
    outside = work / case.id / "outside"
    (folder / ".git").mkdir(parents=True)  # recipe paths must stay inside this repository
    outside.mkdir()
    ctx = Ctx(folder, outside, server, root)
    args = case.make(ctx)
    home, tmp, cwd = work / "home", work / "tmp", work / "cwd"
    for d in (home, tmp, cwd):
        d.mkdir(exist_ok=True)
    before = store_listing(root)
    inputs = {str(p): _facts(p) for p in folder.rglob("*") if p.is_file() and not p.is_symlink()}
    audit = OutsideRootAudit(root, home=home, temp_dirs=[tmp], cwd=cwd, extra=[outside, folder])
    audit.start()
    start = time.monotonic()
    # code=REPO: this checkout runs (its folder on the import path), not whichever hermetic is installed
    run = cli.run(root, *args, "--json", env={**env, "HOME": str(home), "TMPDIR": str(tmp)}, cwd=cwd,
                  code=cli.REPO)
    seconds = time.monotonic() - start
    seen = audit.finish()
    first = next((ln for ln in run.err.splitlines() if ln.strip()), "").replace(str(work), "…")
    v = Verdict(case.id, case.what, case.code, run.rc, first[:300], False, False, seconds=round(seconds, 2))
    if run.rc != case.code:
        v.problems.append(f"exit {run.rc}, expected {case.code}: {run.err[-1500:]}")
    unclear = _clear(run, case.needles)
    v.clear = not unclear
    v.problems += unclear
    after = store_listing(root)
    v.store_unchanged = after == before and not any((root / "store" / "tmp").iterdir())
    if not v.store_unchanged:
        changed = sorted(set(after.items()) ^ set(before.items()))[:5]
        v.problems.append(f"the store changed: {changed} / tmp: {list((root / 'store' / 'tmp').iterdir())[:5]}")
    # inputs the case wrote are not outputs: only what appeared besides them counts
    v.outside_root = [p for p in seen["created"] + seen["changed"] + seen["removed"]
                      if p not in inputs or _facts(Path(p)) != inputs[p]]
    if v.outside_root:
        v.problems.append(f"written outside the root: {v.outside_root[:5]}")
    if any(outside.iterdir()):
        v.problems.append(f"the outside folder holds {sorted(os.listdir(outside))[:5]}")
    return v


def summarize(verdicts: list[Verdict]) -> dict[str, Any]:
    return {"cases": len(verdicts), "ok": sum(v.ok for v in verdicts),
            "unclear_errors": sum(not v.clear for v in verdicts),
            "wrong_exit_codes": sum(v.rc != v.expected for v in verdicts),
            "store_changed": sum(not v.store_unchanged for v in verdicts),
            "outside_root_writes": sum(len(v.outside_root) for v in verdicts),
            "failed": [asdict(v) for v in verdicts if not v.ok]}


def table(verdicts: list[Verdict]) -> str:
    rows = ["| case | hostile input | exit | first line of the error |", "|---|---|---:|---|"]
    for v in verdicts:
        line = v.first_line.replace("|", "\\|")
        rows.append(f"| {v.id} | {v.what} | {v.rc} | {line[:140]} |")
    return "\n".join(rows)


def setup_root(root: Path, work: Path, env: dict[str, str], server: FileServer) -> None:
    """The root every case runs against: the toolchain realized (by the caller) and a first valid realize of
    the build recipe name the cases share, so that nothing before their hostile step writes to the store."""
    folder = work / "valid"
    (folder / "src").mkdir(parents=True)
    (folder / ".git").mkdir()
    (folder / "src" / "a.cpp").write_text('#include <Python.h>\nPyMODINIT_FUNC PyInit_hostile_ext(void) {\n'
                                          '  static PyModuleDef d = {PyModuleDef_HEAD_INIT, "hostile_ext", 0, -1, 0};\n'
                                          '  return PyModule_Create(&d);\n}\n')
    ctx = Ctx(folder, work / "valid-outside", server, root)
    args = ctx.build_recipe('[sources.s]\npath = "src"\n')
    run = cli.run(root, *args, env=env, cwd=work, code=cli.REPO)
    if run.rc != 0:
        raise RuntimeError(f"the valid build recipe failed:\n{run.err[-3000:]}")


def as_json(verdicts: list[Verdict]) -> str:
    return json.dumps([asdict(v) for v in verdicts], indent=1)
