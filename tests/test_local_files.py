"""Local files hermetic reads as inputs (attack on issue 34, findings 3 and 4): a ``file://`` wheel in a lock, a
recipe source's ``file://`` archive and a source folder's files are regular files only, read never past the size
they have. Before the fix a lock's wheel that was a link to /dev/zero was read until the disk was full
(whatever HERMETIC_DOWNLOAD_CAP said), a FIFO in its place hung realize for good, and so did a FIFO in a source
folder. Now each is exit 2 naming the file, and nothing is left in store/tmp.

The roots of the /dev/zero cases lie on a 32 MiB tmpfs, so that the code before the fix fills that, not the
disk; the FIFO cases run under a time limit."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from hermetic.errors import BadInput
from hermetic.extensions.sources import realize_source
from hermetic.recipe import Source
from hermetic.reporter import Reporter
from hermetic.root import Root
from hermetic.store import Store
from tests.support.cli import REPO, Hermetic
from tests.support.recipes import write_recipe
from tests.support.tmpfs import small_tmpfs
from tests.support.trees import plant_special


def _store_tmp_empty(root: Path) -> bool:
    tmp = root / "store" / "tmp"
    return not tmp.exists() or not any(tmp.iterdir())


def _plant(path: Path, kind: str) -> None:
    if kind == "link to /dev/zero":
        path.symlink_to("/dev/zero")
    else:
        os.mkfifo(path)


@pytest.mark.parametrize(("kind", "said"), [("link to /dev/zero", "a character device"), ("fifo", "a FIFO")])
def test_a_file_url_wheel_that_is_no_regular_file_is_refused(tmp_path: Path, hermetic: Hermetic, kind: str,
                                                             said: str) -> None:
    wheel = tmp_path / "repo" / "alpha-1.0-py3-none-any.whl"
    wheel.parent.mkdir()
    _plant(wheel, kind)
    recipe = write_recipe(tmp_path / "repo", "z", f"alpha @ {wheel.as_uri()} --hash=sha256:{'e' * 64}\n")
    with small_tmpfs(tmp_path / "fs") as fs_mount:
        root = fs_mount / "root"
        res = hermetic("realize", recipe, root=root, env={"HERMETIC_DOWNLOAD_CAP": "10000000"}, timeout=60)
        assert res.rc == 2, (res.rc, res.err[-2000:])
        assert str(wheel) in res.err and said in res.err and "regular files" in res.err, res.err
        assert "Traceback" not in res.err
        assert _store_tmp_empty(root)


def test_a_source_url_that_is_a_link_to_dev_zero_is_refused(tmp_path: Path) -> None:
    """A recipe source ``url = "file://.../pkg-1.0.tar.gz"`` that is a link to /dev/zero: before the fix it
    filled a 200 MB tmpfs with a 10 MB cap set (exit 1)."""
    link = tmp_path / "sdz" / "pkg-1.0.tar.gz"
    link.parent.mkdir()
    link.symlink_to("/dev/zero")
    with small_tmpfs(tmp_path / "fs") as fs_mount:
        root = Root(fs_mount / "root")
        root.ensure()
        store = Store(root.store).open()
        src = Source("pkg", url=link.as_uri(), sha256="f" * 64, where="recipe.toml:3: key sources.pkg")
        with pytest.raises(BadInput) as caught:
            realize_source(root, store, src, (), Reporter(quiet=True))
        assert str(link) in caught.value.what and "a character device" in caught.value.what
        assert caught.value.where == "recipe.toml:3: key sources.pkg"
        assert _store_tmp_empty(root.path)


@pytest.mark.parametrize("kind", ["fifo", "socket"])
def test_a_fifo_or_a_socket_in_a_source_folder_is_refused_naming_it(tmp_path: Path, kind: str) -> None:
    """``repo/tinyf/`` = ``tiny.cpp`` and ``mkfifo pipe.h``: before the fix realize hung (killed at 60 s by the
    attacker; here the source step runs in a child under a 60 s limit)."""
    folder = tmp_path / "src"
    (folder / "inc").mkdir(parents=True)
    (folder / "tiny.cpp").write_text("int tiny() { return 1; }\n")
    special = folder / "inc" / "pipe.h"
    plant_special(special, kind)
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from hermetic.extensions.sources import realize_source\n"
        "from hermetic.errors import BadInput\n"
        "from hermetic.recipe import Source\n"
        "from hermetic.reporter import Reporter\n"
        "from hermetic.root import Root\n"
        "from hermetic.store import Store\n"
        "root = Root(Path(sys.argv[1])); root.ensure(); store = Store(root.store).open()\n"
        "src = Source('tiny', path=Path(sys.argv[2]), where='recipe.toml:4: key sources.tiny')\n"
        "try:\n"
        "    realize_source(root, store, src, (), Reporter(quiet=True))\n"
        "except BadInput as e:\n"
        "    print(e.render()); sys.exit(e.exit_code)\n")
    p = subprocess.run([sys.executable, "-c", script, str(tmp_path / "root"), str(folder)], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert f"a {'FIFO' if kind == 'fifo' else 'socket'}, not a regular file: {special}" in p.stdout, p.stdout
    assert "Traceback" not in p.stderr


def test_a_regular_file_url_wheel_still_works_and_is_read_no_further_than_its_size(tmp_path: Path,
                                                                                hermetic: Hermetic) -> None:
    """The control: a real wheel behind a file:// URL and behind a link to it (a wheelhouse of links) is
    copied and checked as before."""
    from tests.support.recipes import make_pkg
    w = make_pkg(tmp_path / "whl", "alpha", "1.0")
    linked = tmp_path / "house" / w.path.name
    linked.parent.mkdir()
    linked.symlink_to(w.path)
    recipe = write_recipe(tmp_path / "repo", "a", f"alpha @ {linked.as_uri()} --hash=sha256:{w.sha256}\n")
    res = hermetic("realize", recipe, timeout=120)
    assert res.rc == 0, res.err[-2000:]


def _tar_of(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_a_regular_source_archive_behind_a_file_url_still_works(tmp_path: Path) -> None:
    """The control for sources: a real sdist behind a file:// URL is fetched, checked and unpacked as before."""
    data = _tar_of({"pkg-1.0/src/a.cpp": b"int a;\n"})
    archive = tmp_path / "pkg-1.0.tar.gz"
    archive.write_bytes(data)
    root = Root(tmp_path / "root")
    root.ensure()
    store = Store(root.store).open()
    src = Source("pkg", url=archive.as_uri(), sha256=hashlib.sha256(data).hexdigest(), subdir="src",
                 where="recipe.toml:3: key sources.pkg")
    tree = realize_source(root, store, src, (), Reporter(quiet=True))
    assert set(tree.files) == {"a.cpp"}
