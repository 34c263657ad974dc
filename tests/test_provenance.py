"""Provenance (issue 34, item 2), as Nix's signed substitutes: records that cannot be re-derived from their
bytes (objects, modules, unpacked wheels, source trees) come into a store from an archive only under a
signature by a trusted key (`export --sign KEY`, HERMETIC_TRUSTED_KEYS) or with `import --trust-unsigned`,
which the import's receipt records; everything else (blobs, content-addressed trees) is re-derived from its
bytes and always taken.

The attack the issue found: an archive carrying a module record under the key of an honest build, with another
`.so`. A later honest realize of that recipe linked nothing and used the planted module ("reused"). Here it is
made from a real build of a real C++ extension (the session's toolchain), and the realize that follows the
import compiles and links its own module instead."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from pathlib import Path

from hermetic.store.provenance import load_public, load_secret
from tests.support import cli
from tests.support.archives import honest_records, write_archive
from tests.support.cli import REPO, Hermetic, hermetic_env
from tests.support.fuzz import Model, read_archive, write_members
from tests.support.recipes import recipe_toml
from tests.support.reliability import realize_toolchain, toolchain_wheels_from


def _keys(h: Hermetic, folder: Path, name: str) -> tuple[Path, Path]:
    secret = folder / name
    res = h("key", "generate", secret, "--json")
    assert res.rc == 0, res.err
    return secret, Path(str(secret) + ".pub")


def test_key_generate_writes_a_pair_and_never_replaces_one(tmp_path: Path, hermetic: Hermetic) -> None:
    secret, public = _keys(hermetic, tmp_path / "keys", "team-a")
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600 and stat.S_IMODE(os.stat(public).st_mode) == 0o644
    assert load_secret(secret).public.raw == load_public(public).raw and load_public(public).name == "team-a"
    before = secret.read_bytes()
    again = hermetic("key", "generate", secret)
    assert again.rc == 2 and "never replaces a key file" in again.err and secret.read_bytes() == before
    bad = hermetic("key", "generate", tmp_path / "keys" / "x", "--name", "no spaces allowed")
    assert bad.rc == 2 and "key name" in bad.err
    assert not (hermetic.root).exists()  # a key is no business of the root


def _entries(root: Path) -> set[str]:
    folder = root / "store" / "entries"
    return set(os.listdir(folder)) if folder.exists() else set()


def _receipt(root: Path) -> dict[str, object]:
    [path] = sorted((root / "imports").glob("*.json"))
    return dict(json.loads(path.read_text()))


def test_an_unsigned_archive_brings_only_what_can_be_re_derived(tmp_path: Path, hermetic: Hermetic) -> None:
    """The honest closure: an unpacked wheel's record (the wheel is not in the archive: it cannot be re-derived)
    and a content-addressed tree of it. Unsigned: the tree comes, the unpacked record is left out, and said;
    --trust-unsigned takes both and the import's receipt says so."""
    entries, blobs, roots = honest_records()
    unpacked = next(n for n, m in entries.items() if m["kind"] == "unpacked")
    archive = write_archive(tmp_path / "plain.tar.zst", entries, blobs, roots)
    res = hermetic("import", archive, "--json")
    assert res.rc == 0, res.err
    assert "left out 1 records that cannot be re-derived" in res.err and unpacked in res.err
    assert _entries(hermetic.root) == set(entries) - {unpacked}
    assert res.result["left_out"] == [unpacked] and res.result["vouched_by"] is None
    assert _receipt(hermetic.root)["left_out"] == [unpacked]
    other = tmp_path / "other"
    res = hermetic("import", archive, "--trust-unsigned", "--json", root=other)
    assert res.rc == 0 and _entries(other) == set(entries), res.err
    receipt = _receipt(other)
    assert receipt["trust_unsigned"] is True and receipt["vouched_by"] == "--trust-unsigned"
    assert receipt["archive_sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()


def test_a_signed_archive_is_taken_whole_where_its_key_is_trusted(tmp_path: Path, hermetic: Hermetic) -> None:
    secret, public = _keys(hermetic, tmp_path / "keys", "builder")
    _other_secret, other_public = _keys(hermetic, tmp_path / "keys", "stranger")
    entries, blobs, roots = honest_records()
    source = tmp_path / "source"
    hermetic("import", write_archive(tmp_path / "plain.tar.zst", entries, blobs, roots), "--trust-unsigned",
             root=source, check=True)
    signed = tmp_path / "signed.tar.zst"
    res = hermetic("export", signed, "--sign", secret, "--json", root=source)
    assert res.rc == 0 and res.result["signed_by"] == "builder", res.err
    trusted = {"HERMETIC_TRUSTED_KEYS": f"{other_public}:{public}"}
    a = tmp_path / "a"
    res = hermetic("import", signed, "--json", root=a, env=trusted)
    assert res.rc == 0 and _entries(a) == set(entries) and res.result["vouched_by"] == "key builder", res.err
    # a key this machine does not trust vouches for nothing
    b = tmp_path / "b"
    res = hermetic("import", signed, root=b, env={"HERMETIC_TRUSTED_KEYS": str(other_public)})
    assert res.rc == 0 and "signed by builder, a key HERMETIC_TRUSTED_KEYS does not name" in res.err
    assert len(_entries(b)) == len(entries) - 1
    # changed after signing (a record replaced, the manifest made consistent again): refused whole
    model = Model.of(read_archive(signed))
    unpacked = next(n for n, m in model.entries.items() if m["kind"] == "unpacked")
    model.entries[unpacked]["filename"] = "other-1.0-py3-none-any.whl"
    members = model.members()
    manifest = json.loads(members[0][1])
    manifest["signatures"] = Model.of(read_archive(signed)).manifest["signatures"]
    members[0] = ("MANIFEST.json", json.dumps(manifest).encode())
    tampered = write_members(tmp_path / "tampered.tar.zst", members)
    c = tmp_path / "c"
    res = hermetic("import", tampered, root=c, env=trusted)
    assert res.rc == 2 and "signature by trusted key builder does not verify" in res.err, res.err
    assert not _entries(c)


SOURCE = """\
#include <Python.h>
static struct PyModuleDef planted_module = {PyModuleDef_HEAD_INIT, "planted_ext", nullptr, -1, nullptr};
PyMODINIT_FUNC PyInit_planted_ext(void) { return PyModule_Create(&planted_module); }
"""


def _project(folder: Path) -> Path:
    (folder / "src").mkdir(parents=True)
    (folder / "src" / "planted.cpp").write_text(SOURCE)
    shutil.copy(REPO / "manifests" / "cuda-13.0-toolchain.txt", folder)
    recipe = folder / "recipe.toml"
    recipe.write_text(recipe_toml("planted", toolchain=True, sources={"src": "src"}, jobs=2,
                                  extensions=['name = "planted_ext"\nsource = "src"\nsources = ["*.cpp"]']))
    return recipe


def _module_file(root: Path) -> bytes:
    [so] = sorted((root / "profiles" / "planted").glob("planted_ext*.so"))
    return so.read_bytes()


def test_a_planted_module_in_an_unsigned_archive_never_reaches_an_honest_realize(tmp_path: Path,
                                                                                shared_root: Path) -> None:
    env = hermetic_env(tmp_path / "home", pip="machine")
    recipe = _project(tmp_path / "project")
    honest = cli.run(shared_root, "realize", recipe, "--json", env=env)
    assert honest.rc == 0, honest.err[-3000:]
    honest_so = _module_file(shared_root)
    archive = tmp_path / "closure.tar.zst"
    cli.run(shared_root, "export", archive, "--name", "planted", "--level", "1", env=env, check=True)
    # the attack: the module record, under the honest build's key, names another library
    model = Model.of(read_archive(archive))
    [module] = [n for n, m in model.entries.items() if m["kind"] == "module"]
    planted = honest_so + b"\0planted by the archive's maker\n"   # still an ELF the loader takes
    digest = hashlib.sha256(planted).hexdigest()
    model.entries[module]["so"] = digest
    model.blobs[digest] = planted
    attack = write_members(tmp_path / "planted.tar.zst", model.members())
    victim = tmp_path / "victim" / "root"
    realize_toolchain(victim, env, tmp_path, toolchain_wheels_from(shared_root, tmp_path / "tc-wheels"))
    offline = hermetic_env(tmp_path / "home", pip="offline")
    imp = cli.run(victim, "import", attack, "--json", env=offline)
    assert imp.rc == 0, imp.err[-3000:]
    assert module in imp.result["left_out"] and "left out" in imp.err
    assert not (victim / "store" / "entries" / module).exists()
    res = cli.run(victim, "realize", recipe, "--json", env=offline)
    assert res.rc == 0, res.err[-3000:]
    got = _module_file(victim)
    assert hashlib.sha256(got).hexdigest() != digest and got == honest_so
    assert res.result["counts"]["objects_compiled"] >= 1
