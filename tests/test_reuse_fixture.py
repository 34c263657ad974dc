"""bench/reuse's fixture recipe validates and stays what the bench says: exllamav3's wheel, a patch that
touches bindings.cpp only, bindings.cpp among six sources, and recipes/exl3.toml's rename variant."""

from __future__ import annotations

import re

from hermetic.recipe import load_recipe
from tests.support.builds import REPO

FIXTURE = REPO / "bench" / "reuse_fixture" / "exl3-subset.toml"


def test_fixture_recipe_validates() -> None:
    r = load_recipe(FIXTURE)
    exl3 = load_recipe(REPO / "recipes" / "exl3.toml")
    (src,) = r.sources.values()
    assert (src.wheel, src.sha256, src.subdir) == (exl3.sources["exllamav3"].wheel,
                                                   exl3.sources["exllamav3"].sha256, "exllamav3/exllamav3_ext")
    (patch,) = src.patches
    assert set(re.findall(r"(?m)^(?:---|\+\+\+) [ab]/(\S+)", patch.read_text())) == {"bindings.cpp"}
    (ext,) = r.extensions
    assert "bindings.cpp" in ext.sources and len(ext.sources) == 6
    assert (ext.cflags, ext.cuda_cflags) == (exl3.extensions[0].cflags, exl3.extensions[0].cuda_cflags)
    rename = {v.name: v for v in r.variants}["rename"]
    assert not rename.default and rename.module and rename.module != ext.name
    assert rename.defines == {v.name: v for v in exl3.variants}["rename"].defines
