"""Sources by URL: a ``file:`` URL is decoded as the lock readers decode a location (percent-escapes, so a
folder with a space in its name works; ``file://localhost/``), and one naming another host is bad input."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path
from urllib.parse import quote

import pytest

from hermetic.errors import BadInput
from hermetic.extensions.sources import realize_source
from hermetic.locks.validate import resolve_location
from hermetic.recipe import Source
from hermetic.reporter import Reporter
from hermetic.root import Root
from hermetic.store import Store


def _sdist(folder: Path) -> tuple[Path, str]:
    folder.mkdir(parents=True)
    path = folder / "spaced src-1.0.tar.gz"
    with tarfile.open(path, "w:gz") as tf:
        data = b"int answer() { return 42; }\n"
        info = tarfile.TarInfo("spaced-1.0/src/answer.cpp")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("host", ["", "localhost"])
def test_a_file_url_with_a_space_is_a_source(tmp_path: Path, host: str) -> None:
    archive, sha = _sdist(tmp_path / "with space")
    url = f"file://{host}{quote(str(archive))}"
    assert "%20" in url
    root = Root(tmp_path / "root")
    root.ensure()
    store = Store(root.store).open()
    src = Source("spaced", url=url, sha256=sha, subdir="src", where="recipe.toml:3: key sources.spaced")
    tree = realize_source(root, store, src, (), Reporter(json_mode=True))
    assert set(tree.files) == {"answer.cpp"}
    assert (tree.out(store) / "answer.cpp").read_text() == "int answer() { return 42; }\n"
    # the lock readers decode the same URL to the same path
    assert resolve_location(url, tmp_path, "lock:1") == (None, archive)


def test_a_file_url_of_another_host_is_bad_input(tmp_path: Path) -> None:
    root = Root(tmp_path / "root")
    root.ensure()
    src = Source("far", url="file://builder/srv/far-1.0.tar.gz", sha256="0" * 64, where="recipe.toml:3")
    with pytest.raises(BadInput) as caught:
        realize_source(root, Store(root.store).open(), src, (), Reporter(json_mode=True))
    assert "another host (builder)" in caught.value.what and caught.value.where == "recipe.toml:3"
