"""Key computation as pure functions: defines, comment stripping, depfiles, identifier scans, prefix maps (and
g++ showing that what the map promises holds)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hermetic.keys import (
    PrefixMap,
    differing_defines,
    is_debug,
    key_env,
    lookup_key,
    parse_depfile,
    split_defines,
    strip_comments,
    unmappable,
)


def test_split_defines_takes_top_level_defines_and_the_output_only() -> None:
    rest, defines = split_defines(["nvcc", "-DA=1", "-D", "B", "-UC", "-Xcompiler", "-DHIDDEN", "-c", "x.cu",
                                   "-o", "/build/x.o"])
    assert defines == {"A": "1", "B": "1", "C": None}
    assert rest == ["nvcc", "-Xcompiler", "-DHIDDEN", "-c", "x.cu", "-o", "<OUT>"]


def test_lookup_key_ignores_defines_and_output_but_not_flags_or_env() -> None:
    tc = {"cuda": "t"}
    base = lookup_key("cxx", ["c++", "-DX=1", "-O2", "-c", "a.cpp", "-o", "/1/a.o"], {}, tc)
    assert base == lookup_key("cxx", ["c++", "-DX=2", "-O2", "-c", "a.cpp", "-o", "/2/a.o"], {}, tc)
    assert base != lookup_key("cxx", ["c++", "-DX=1", "-O3", "-c", "a.cpp", "-o", "/1/a.o"], {}, tc)
    assert base != lookup_key("cxx", ["c++", "-DX=1", "-O2", "-c", "a.cpp", "-o", "/1/a.o"], {"CPATH": "/x"}, tc)
    # nvcc's own variables change nvcc's output only
    assert key_env("cxx", {"NVCC_APPEND_FLAGS": "-O0", "CPATH": "/x"}) == {"CPATH": "/x"}
    assert key_env("nvcc", {"NVCC_APPEND_FLAGS": "-O0"}) == {"NVCC_APPEND_FLAGS": "-O0"}


def test_differing_defines() -> None:
    assert differing_defines({"A": "1", "B": "2"}, {"A": "1", "B": "3", "C": None}) == ["B", "C"]
    assert differing_defines({"A": "1"}, {"A": "1"}) == []


def test_strip_comments_keeps_lines_strings_raw_strings_and_continuations() -> None:
    src = (b'int a; // gone\n'
           b'/* gone\n   gone */ int b;\n'
           b'const char* u = "http://kept"; /* gone */\n'
           b'auto r = R"x(/* kept */ // kept)x";\n'
           b"char q = '\"'; // gone\n"
           b'// continued \\\nstill a comment\n'
           b'const char* s = "a \\" // kept";\n')
    out = strip_comments(src)
    assert out.count(b"\n") == src.count(b"\n")
    for kept in (b'"http://kept"', b'R"x(/* kept */ // kept)x"', b"'\"'", b'"a \\" // kept"', b"int b;"):
        assert kept in out
    assert b"gone" not in out and b"still a comment" not in out


def test_a_string_that_looks_like_a_comment_is_content() -> None:
    a = b'const char* s = "// one";\n'
    b = b'const char* s = "// two";\n'
    assert strip_comments(a) != strip_comments(b)
    assert strip_comments(b"x; // one\n") == strip_comments(b"x; // two\n")


def test_debug_flags() -> None:
    assert is_debug(["nvcc", "-lineinfo"]) and is_debug(["c++", "-g"]) and is_debug(["c++", "-g3"])
    assert not is_debug(["c++", "-O2", "-gencode=arch=compute_90,code=sm_90"])


def test_depfile_parsing() -> None:
    text = "obj.o : /s/a.cpp /usr/include/b\\ c.h \\\n    /s/d.h\n/s/d.h:\n"
    assert parse_depfile(text) == ["/s/a.cpp", "/usr/include/b c.h", "/s/d.h"]



# prefix maps ------------------------------------------------------------------------------------------------
def pmap() -> PrefixMap:
    return PrefixMap([("/r", "/hermetic/root"), ("/r/build/x/stock/src/s", "/hermetic/src/s"),
                      ("/r/profiles/x.toolchain/nvidia/cu13", "/hermetic/cuda"), ("/venv/lib/site", "/hermetic/site")])


def test_a_prefix_map_rebases_paths_both_ways_most_specific_first() -> None:
    m = pmap()
    assert m.canonical_path("/r/build/x/stock/src/s/a.h") == "/hermetic/src/s/a.h"
    assert m.canonical_path("/r/build/x/stock/src/s") == "/hermetic/src/s"
    assert m.canonical_path("/r/state/x") == "/hermetic/root/state/x"
    assert m.canonical_path("/r2/a") == "/r2/a" and m.canonical_path("/usr/include/stdio.h") == "/usr/include/stdio.h"
    assert m.local_path("/hermetic/src/s/a.h") == "/r/build/x/stock/src/s/a.h"
    assert m.local_path(m.canonical_path("/venv/lib/site/torch/include/t.h")) == "/venv/lib/site/torch/include/t.h"


def test_a_prefix_map_rewrites_the_paths_inside_arguments_and_environment() -> None:
    m = pmap()
    argv = ["/r/profiles/x.toolchain/nvidia/cu13/bin/nvcc", "-I/r/build/x/stock/src/s", "-isystem",
            "/venv/lib/site/torch/include", "-Xcudafe", "--orig_src_path_name=/r/build/x/stock/src/s/k.cu",
            "-gencode=arch=compute_90,code=sm_90", "-c", "/r/build/x/stock/src/s/k.cu"]
    assert m.canonical(argv) == ["/hermetic/cuda/bin/nvcc", "-I/hermetic/src/s", "-isystem",
                                 "/hermetic/site/torch/include", "-Xcudafe",
                                 "--orig_src_path_name=/hermetic/src/s/k.cu", "-gencode=arch=compute_90,code=sm_90",
                                 "-c", "/hermetic/src/s/k.cu"]
    assert m.local(m.canonical(argv)) == argv
    env = {"PATH": "/r/profiles/x.toolchain/nvidia/cu13/bin:/usr/bin", "NVCC_APPEND_FLAGS": "-I/r/inc -O3"}
    assert m.canonical_env(env) == {"PATH": "/hermetic/cuda/bin:/usr/bin",
                                    "NVCC_APPEND_FLAGS": "-I/hermetic/root/inc -O3"}
    assert m.local_env(m.canonical_env(env)) == env


def test_the_compiler_gets_the_most_specific_map_last() -> None:
    # gcc takes the last -ffile-prefix-map that matches (a folder inside the root must come after the root)
    flags = pmap().compiler_flags(cuda=False)
    assert flags.index("-ffile-prefix-map=/r=/hermetic/root") < flags.index(
        "-ffile-prefix-map=/r/build/x/stock/src/s=/hermetic/src/s")
    assert pmap().compiler_flags(cuda=True)[:2] == ["-Xcompiler", flags[0]]
    with pytest.raises(ValueError):
        PrefixMap([("/r", "/hermetic/root"), ("/r/", "/hermetic/other")])


def test_device_debug_flags_bind_a_compile_to_its_root_and_the_key_says_so() -> None:
    assert unmappable(["nvcc", "-G", "-c", "k.cu"], cuda=True) == "-G"
    assert unmappable(["nvcc", "-lineinfo"], cuda=True) == "-lineinfo"
    assert unmappable(["c++", "-g", "-c", "a.cpp"], cuda=False) is None  # g++'s DWARF follows the map
    args = (["nvcc", "-c", "k.cu"], {}, {"cuda": "tc"}, {"torch": "2.14.1"})
    assert lookup_key("nvcc", *args, root=None) != lookup_key("nvcc", *args, root="/r")
    assert lookup_key("nvcc", *args, root="/r") != lookup_key("nvcc", *args, root="/elsewhere")


GPP_UNIT = '#include "h.h"\nconst char* where() { return __FILE__; }\nint value() { return H; }\n'


@pytest.mark.parametrize("debug", [[], ["-g"]])
def test_gpp_objects_from_two_folders_are_identical_under_the_map(tmp_path: Path, debug: list[str]) -> None:
    # __FILE__, and with -g the DWARF file names and the compilation folder: all follow -ffile-prefix-map
    objects = []
    for folder in ("a", "b/deeper"):
        root = tmp_path / folder
        src, build = root / "src", root / "build"
        src.mkdir(parents=True)
        build.mkdir()
        (src / "u.cpp").write_text(GPP_UNIT)
        (src / "h.h").write_text("#define H 3\n")
        m = PrefixMap([(str(root), "/hermetic/root"), (str(src), "/hermetic/src/s"),
                       (str(build), "/hermetic/build/e")])
        subprocess.run(["g++", *m.compiler_flags(cuda=False), *debug, "-O2", "-c", str(src / "u.cpp"),
                        "-o", str(build / "u.o")], check=True, cwd=build)
        objects.append((build / "u.o").read_bytes())
    assert objects[0] == objects[1] and b"/hermetic/src/s/u.cpp" in objects[0]
    assert str(tmp_path).encode() not in objects[0]
