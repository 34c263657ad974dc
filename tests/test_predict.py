"""The include graph behind the joint graph's predictions (extensions/predict.py), on real files: what a source
reaches through include cycles, through quoted and angle includes in the compiler's order, and what a later
source adds to a graph whose earlier sets are already settled."""

from __future__ import annotations

from pathlib import Path

from hermetic.extensions.plan import Compile
from hermetic.extensions.predict import IncludeScanner
from hermetic.root import Root


def _files(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


def _compile(src: Path, rel: str, *flags: str) -> Compile:
    return Compile(str(src / rel), rel, str(src / (rel + ".o")), False, ("g++", *flags, "-c", str(src / rel)),
                   str(src / (rel + ".o.d")))


def _names(paths: list[str], base: Path) -> set[str]:
    return {str(Path(p).relative_to(base)) for p in paths}


def test_closures_through_cycles_search_order_and_a_growing_graph(tmp_path: Path) -> None:
    src, inc, sys_inc = tmp_path / "src", tmp_path / "inc", tmp_path / "sys"
    _files(src, {
        "a.cpp": '#include "a.h"\n',
        "a.h": '#pragma once\n#include "b.h"\n#include <lib.h>\n',
        "b.h": '#pragma once\n#include "c.h"\n',
        "c.h": '#pragma once\n#include "a.h"\n  #  include "d.h"\n',  # a cycle a -> b -> c -> a
        "d.h": "int d;\n",
        "e.cpp": '#include "e.h"\n#include <c.h>\n',
        "e.h": '#include "missing.h"\n',
    })
    _files(inc, {"lib.h": '#include "lib2.h"\n', "lib2.h": "", "c.h": "// the angle include's c.h\n"})
    _files(sys_inc, {"lib.h": "// never: -I comes before -isystem\n"})
    scanner = IncludeScanner(Root(tmp_path / "root"))
    flags = ("-I" + str(inc), "-isystem", str(sys_inc))
    a = scanner.closure(_compile(src, "a.cpp", *flags))
    assert _names(a, tmp_path) == {"src/a.cpp", "src/a.h", "src/b.h", "src/c.h", "src/d.h", "inc/lib.h",
                                   "inc/lib2.h"}
    # every member of the cycle reaches every other
    g = scanner.graph(_compile(src, "a.cpp", *flags))
    for h in ("a.h", "b.h", "c.h"):
        assert _names(g.files(g.reach(g.index[str(src / h)])), tmp_path) >= {"src/a.h", "src/b.h", "src/c.h",
                                                                           "src/d.h", "inc/lib.h"}
    # a later source in the same graph: its new files are added and settled, the earlier sets stay as they were;
    # <c.h> is searched in -I only (inc/c.h), not next to the includer; a missing header is left out
    e = scanner.closure(_compile(src, "e.cpp", *flags))
    assert _names(e, tmp_path) == {"src/e.cpp", "src/e.h", "inc/c.h"}
    assert _names(scanner.closure(_compile(src, "a.cpp", *flags)), tmp_path) == _names(a, tmp_path)
    # other search folders: another graph (without -I, <lib.h> comes from -isystem)
    other = scanner.closure(_compile(src, "a.cpp", "-isystem", str(sys_inc)))
    assert _names(other, tmp_path) == {"src/a.cpp", "src/a.h", "src/b.h", "src/c.h", "src/d.h", "sys/lib.h"}
