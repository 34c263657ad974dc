"""Key computation as pure functions: defines, comment stripping, depfiles, identifier scans."""

from __future__ import annotations

from hermetic.keys import (
    differing_defines,
    is_debug,
    key_env,
    lookup_key,
    parse_depfile,
    split_defines,
    strip_comments,
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

