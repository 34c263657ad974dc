"""Object keys as pure functions: command normalization, prefix maps, define waivers, comment stripping,
depfiles.

Nothing here touches the store or runs a compiler, so every rule is tested directly (tests/test_keys.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hermetic.fs import canonical_json, sha256_bytes

# v2: keys, commands and inputs name the fixed prefixes of a PrefixMap, not the root's path
SALT = "hermetic-object-v2"
# Environment variables that change what nvcc or gcc produce (build-caches.md, section (c) 4).
KEY_ENV = ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN", "CPATH", "C_INCLUDE_PATH",
           "CPLUS_INCLUDE_PATH", "OBJC_INCLUDE_PATH", "COMPILER_PATH", "GCC_EXEC_PREFIX", "GCC_COMPARE_DEBUG",
           "LIBRARY_PATH", "SOURCE_DATE_EPOCH", "PATH")
DEBUG_FLAGS = ("-g", "-G", "-lineinfo", "--generate-line-info", "--device-debug", "--debug")
TEMPORAL = re.compile(rb"(?<![A-Za-z0-9_])__(?:DATE|TIME|TIMESTAMP)__(?![A-Za-z0-9_])")


# Options whose value is the next argument: a "-D..." there belongs to them, not to the compiler's defines.
VALUE_OPTS = frozenset({
    "-Xcompiler", "--compiler-options", "-Xcudafe", "-Xptxas", "-Xlinker", "--linker-options", "-Xnvlink",
    "-Xfatbin", "-Xarchive", "-ccbin", "--compiler-bindir", "-MF", "-MT", "-MQ", "-include", "-imacros",
    "-isystem", "-idirafter", "-iquote", "-I", "-L", "-x", "-arch", "-code", "-gencode", "--output-directory",
    "-odir", "-optf", "--options-file", "-Xclang"})


# 2: entry points are recorded, not written as launchers (wheels.scripts writes them per interpreter)
# 3: a script's #!python line is kept and recorded, rewritten per interpreter in trees (installer, given no
#    interpreter, wrote a bare "#!" there: such a script did not run); the scripts scheme's files are executable
UNPACKER_VERSION = 3


def unpacked_key(wheel_sha256: str, version: int = UNPACKER_VERSION) -> str:
    """The key of a wheel's unpacked entry: the unpacker's version and the wheel's sha256 (docs/layout.md)."""
    return sha256_bytes(f"unpacked-v{version}\0{wheel_sha256}".encode())


def split_defines(argv: Sequence[str]) -> tuple[list[str], dict[str, str | None]]:
    """(the command without its top-level -D/-U options and output path, {identifier: value or None}).

    ``-DNAME`` is NAME=1 as the compiler sees it; ``-UNAME`` maps NAME to None. Only top-level options are
    taken out: a -D hidden in -Xcompiler or --compiler-options stays in the command, and so in the key.
    """
    rest: list[str] = []
    defines: dict[str, str | None] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-D", "-U") and i + 1 < len(argv):
            a, i = a + argv[i + 1], i + 1
        if a.startswith("-D") and len(a) > 2:
            name, _, value = a[2:].partition("=")
            defines[name] = value if "=" in a else "1"
        elif a.startswith("-U") and len(a) > 2:
            defines[a[2:]] = None
        elif a == "-o" and i + 1 < len(argv):
            rest += ["-o", "<OUT>"]
            i += 1
        elif a in VALUE_OPTS and i + 1 < len(argv):
            rest += [a, argv[i + 1]]
            i += 1
        else:
            rest.append(a)
        i += 1
    return rest, defines


def is_debug(argv: Sequence[str]) -> bool:
    return any(a in DEBUG_FLAGS or a.startswith("-g") and a[2:].isdigit() for a in argv)


def key_env(kind: str, env: Mapping[str, str]) -> dict[str, str]:
    """The variables that change this compiler's output (nvcc's own only for nvcc)."""
    return {k: env[k] for k in KEY_ENV if k in env and (kind == "nvcc" or not k.startswith("NVCC_"))}


def lookup_key(kind: str, argv: Sequence[str], env: Mapping[str, str], toolchain: Mapping[str, Any],
               host: Mapping[str, Any] | None = None, root: str | None = None) -> str:
    """What must be equal for two compiles to be compared input by input: all but defines and inputs. ``argv``
    and ``env`` are canonical (``PrefixMap.canonical``); ``root`` is the scratch root's path for a compile whose
    flags defeat the prefix map (its objects hold that path), else None: such an object serves that root only."""
    rest, _defines = split_defines(argv)
    return sha256_bytes(canonical_json({"salt": SALT, "kind": kind, "argv": rest, "env": key_env(kind, env),
                                        "toolchain": dict(toolchain), "host": dict(host or {}), "root": root}))


def object_key(lookup: str, defines: Mapping[str, str | None], inputs: Iterable[Sequence[str]]) -> str:
    return sha256_bytes(canonical_json({"lookup": lookup, "defines": dict(sorted(defines.items())),
                                        "inputs": [list(i) for i in inputs]}))


def differing_defines(a: Mapping[str, str | None], b: Mapping[str, str | None]) -> list[str]:
    return sorted(k for k in set(a) | set(b) if a.get(k, "<absent>") != b.get(k, "<absent>"))


def identifier_re(names: Iterable[str]) -> re.Pattern[bytes]:
    alts = b"|".join(re.escape(n.encode()) for n in sorted(names))
    return re.compile(rb"(?<![A-Za-z0-9_])(?:" + alts + rb")(?![A-Za-z0-9_])")




# Comments out, every line kept: a comment-only edit leaves this unchanged and __LINE__ where it was.
_TOKENS = re.compile(rb"""
    (?P<raw>(?<![A-Za-z0-9_])(?:u8|u|U|L)?R"(?P<delim>[^()\\\s"]{0,16})\((?:.|\n)*?\)(?P=delim)")
  | (?P<str>"(?:\\(?:.|\n)|[^"\\\n])*")
  | (?P<chr>'(?:\\(?:.|\n)|[^'\\\n])*')
  | (?P<line>//(?:[^\n\\]|\\(?:.|\n))*)
  | (?P<block>/\*(?:.|\n)*?\*/)
""", re.VERBOSE)


def strip_comments(data: bytes) -> bytes:
    """C/C++/CUDA source without comments; strings, raw strings, character literals and line
    continuations are respected, and each comment keeps its newlines so no line moves."""
    def repl(m: re.Match[bytes]) -> bytes:
        if m.lastgroup in ("line", "block"):
            return b" " + b"\n" * m.group(0).count(b"\n")
        return m.group(0)
    return _TOKENS.sub(repl, data)


def parse_depfile(text: str) -> list[str]:
    """The prerequisites of a Makefile-syntax dependency file (gcc -MD, nvcc -MD), in order, unescaped."""
    body = text.replace("\\\r\n", " ").replace("\\\n", " ")
    deps: list[str] = []
    for line in body.splitlines():
        m = re.match(r"^(?:[^:\\]|\\.)*?:(?:\s|$)", line)
        if not m:
            continue
        for tok in re.findall(r"(?:\\.|[^\s\\])+", line[m.end():]):
            dep = re.sub(r"\\(.)", r"\1", tok).replace("$$", "$")
            if dep not in deps:
                deps.append(dep)
    return deps


# Prefix maps: compiles that do not depend on where the root is ------------------------------------------------
# Flags whose output keeps paths the host compiler's -ffile-prefix-map does not reach: nvcc's device debug and
# line information (cicc and ptxas take their file names from the preprocessed stream, whose line markers gcc
# does not map), and nvcc's host debug flags (unproven: treated alike). g++'s own -g is mapped (its DWARF
# names, the compilation folder included, follow -ffile-prefix-map: tests/test_keys.py).
UNMAPPABLE_NVCC = frozenset({"-G", "--device-debug", "-lineinfo", "--generate-line-info", "-g", "--debug"})
# options whose value is attached to them and may be a path
_ATTACHED = ("-isystem", "-idirafter", "-iquote", "-imacros", "-include", "-I", "-L")


def unmappable(argv: Sequence[str], cuda: bool) -> str | None:
    """The flag that keeps paths in this compile's output beyond any prefix map, or None."""
    if cuda:
        for a in argv:
            if a in UNMAPPABLE_NVCC or a.startswith("-g") and a[2:].isdigit():
                return a
    return None


class PrefixMap:
    """Local folders and the fixed names a compile knows them by: the scratch root, each variant's source and
    build folders, the toolchain, the host interpreter's site-packages (torch's headers and libraries) and its
    Python headers. Keys, commands and input paths in records are canonical (the fixed names); at use they are
    rebased onto this machine's folders. Compilers get the same map as ``-ffile-prefix-map`` (nvcc through
    ``-Xcompiler``), so what they write into objects (``__FILE__``, debug names) is canonical too.
    """

    def __init__(self, pairs: Iterable[tuple[str, str]]) -> None:
        seen: dict[str, str] = {}
        for local, fixed in pairs:
            local = local.rstrip("/") or "/"
            if local in seen and seen[local] != fixed:
                raise ValueError(f"{local} mapped twice: {seen[local]} and {fixed}")
            seen[local] = fixed
        # most specific first when rebasing; a compiler takes the last of its -ffile-prefix-map options that
        # matches, so it gets them the other way round
        self.pairs = tuple(sorted(seen.items(), key=lambda kv: -len(kv[0])))
        self._back = tuple(sorted(((f, lo) for lo, f in self.pairs), key=lambda kv: -len(kv[0])))

    @staticmethod
    def _swap(path: str, pairs: tuple[tuple[str, str], ...]) -> str:
        for old, new in pairs:
            if path == old or path.startswith(old + "/"):
                return new + path[len(old):]
        return path

    def canonical_path(self, path: str) -> str:
        return self._swap(path, self.pairs)

    def local_path(self, path: str) -> str:
        return self._swap(path, self._back)

    def _arg(self, arg: str, to: Any) -> str:
        mapped = to(arg)
        if mapped != arg:
            return str(mapped)
        for opt in _ATTACHED:
            if arg.startswith(opt) and len(arg) > len(opt):
                return opt + to(arg[len(opt):])
        if "=" in arg:  # --orig_src_path_name=PATH, -DNAME=PATH, ...
            head, _, tail = arg.partition("=")
            return f"{head}={to(tail)}"
        return arg

    def canonical(self, argv: Sequence[str]) -> list[str]:
        return [self._arg(a, self.canonical_path) for a in argv]

    def local(self, argv: Sequence[str]) -> list[str]:
        return [self._arg(a, self.local_path) for a in argv]

    def canonical_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """Search paths entry by entry, flag variables flag by flag, a single path as a path."""
        out = {}
        for k, v in env.items():
            if k.endswith("_FLAGS"):
                out[k] = " ".join(self.canonical(v.split()))
            elif k.endswith("PATH"):
                out[k] = ":".join(self.canonical_path(p) for p in v.split(":"))
            else:
                out[k] = self.canonical_path(v)
        return out

    def local_env(self, env: Mapping[str, str]) -> dict[str, str]:
        out = {}
        for k, v in env.items():
            if k.endswith("_FLAGS"):
                out[k] = " ".join(self.local(v.split()))
            elif k.endswith("PATH"):
                out[k] = ":".join(self.local_path(p) for p in v.split(":"))
            else:
                out[k] = self.local_path(v)
        return out

    def compiler_flags(self, cuda: bool) -> list[str]:
        """-ffile-prefix-map for every pair, the most specific last (the compiler takes the last match)."""
        flags = [f"-ffile-prefix-map={local}={fixed}" for local, fixed in reversed(self.pairs)]
        return [x for f in flags for x in ("-Xcompiler", f)] if cuda else flags

    def record(self) -> list[list[str]]:
        """For certificates: [local, canonical] pairs, most specific first."""
        return [[lo, f] for lo, f in self.pairs]
