"""Object keys as pure functions: command normalization, define waivers, comment stripping, depfiles.

Nothing here touches the store or runs a compiler, so every rule is tested directly (tests/test_keys.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hermetic.fs import canonical_json, sha256_bytes

SALT = "hermetic-object-v1"
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


def lookup_key(kind: str, argv: Sequence[str], env: Mapping[str, str], toolchain: Mapping[str, Any]) -> str:
    """What must be equal for two compiles to be compared input by input: all but defines and inputs."""
    rest, _defines = split_defines(argv)
    return sha256_bytes(canonical_json({"salt": SALT, "kind": kind, "argv": rest, "env": key_env(kind, env),
                                        "toolchain": dict(toolchain)}))


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
