"""Sharing between machines through a real nginx WebDAV server (remote/nginx.conf) on loopback.

Machine A builds a small real fixture (g++ and nvcc from the wheels) with a read-write remote; machine B is
an empty root with its own HOME and no package index, at the same root path, and gets everything from the
server; so does a root at another path (objects name no folder of their machine: keys.PrefixMap), whose
module equals a local compile there, and an air-gapped root elsewhere through an archive. Then the server
lies, loses blobs, refuses writes, stops mid-build and takes concurrent uploads; every time the build stays
correct.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from hermetic.extensions.certificate import read_certificate
from hermetic.keys import lookup_key, object_key, split_defines
from hermetic.remote.actionresult import OutputFile, decode_action_result, encode_action_result
from hermetic.remote.bazel import open_storage
from hermetic.remote.layout import Sharing, objects_key
from hermetic.remote.settings import RemoteOptions, RemoteSettings, resolve_settings
from hermetic.remote.storage import Storage
from hermetic.reporter import Reporter
from hermetic.store import STORE_FORMAT, Store, entry_name
from tests.support import cli
from tests.support.builds import DATA, Project
from tests.support.cli import REPO, hermetic_env
from tests.support.nginx import PASSWORD, WRITER, Nginx, nginx_binary
from tests.support.recipes import recipe_toml

pytestmark = pytest.mark.needs("nginx", nginx_binary() is not None,
                              "tools/install-test-deps installs it: apt-get install nginx-light")

SOURCES = ("bindings.cpp", "kern.cu", "table.cpp")
TABLE_SUM = 256 * sum(range(1, 17))  # table.cpp: 4 KiB of 1..16, then zeros


@dataclass
class Run:
    rc: int
    out: str
    err: str
    receipt: dict[str, Any] = field(default_factory=dict)
    certificate: dict[str, Any] = field(default_factory=dict)

    @property
    def decisions(self) -> dict[str, str]:
        return {o["source"]: o["decision"] for o in self.certificate.get("objects", [])}

    @property
    def digests(self) -> dict[str, str]:
        return {o["source"]: o["digest"] for o in self.certificate.get("objects", [])}


def realize(root: Path, recipe: Path, home: Path, *args: str, env: dict[str, str] | None = None,
            wait: bool = True) -> Run | subprocess.Popen[str]:
    """The real CLI as another machine would run it: its own HOME, no pip configuration, no index."""
    full = hermetic_env(home, pip="offline", extra=env)
    if not wait:
        return cli.popen(root, "realize", recipe, "--json", *args, env=full)
    p = cli.run(root, "realize", recipe, "--json", *args, env=full)
    return _finish(root, p.rc, p.out, p.err)


def _finish(root: Path, rc: int, out: str, err: str) -> Run:
    run = Run(rc, out, err)
    if rc == 0:
        result = json.loads(out.splitlines()[-1])
        run.receipt = json.loads(Path(result["receipt"]).read_text())
        run.certificate = read_certificate(Store(root / "store"), run.receipt["modules"][0]["certificate_blob"])
    return run


def module_values(root: Path, profile: str = "remotefix") -> tuple[int, int]:
    """What the realized module computes, imported next to torch (it links torch's libraries)."""
    p = subprocess.run([sys.executable, "-c", "import torch, fixture_ext; print(list(fixture_ext.values()))"],
                       capture_output=True, text=True, cwd=root,
                       env={**os.environ, "PYTHONPATH": str(root / "profiles" / profile)})
    assert p.returncode == 0, p.stderr
    a, b = json.loads(p.stdout)
    return int(a), int(b)


def toolchain_wheels(shared_root: Path, folder: Path) -> list[str]:
    """A find-links folder of the toolchain wheels, linked from the session's store (machine A's 'index');
    returns their sha256."""
    folder.mkdir()
    receipt = json.loads(sorted((shared_root / "receipts").glob("cuda-13.0-*.json"))[-1].read_text())
    for w in receipt["wheels"]:
        meta = json.loads((shared_root / "store" / "entries" / w["entry"] / "meta.json").read_text())
        os.link(shared_root / "store" / "blobs" / w["sha256"][:2] / w["sha256"], folder / meta["filename"])
    return [w["sha256"] for w in receipt["wheels"]]


@dataclass
class Team:
    server: Nginx
    base: Path
    project: Project
    root: Path           # the root path every machine of the team uses (HERMETIC_ROOT=/scratch/... in real life)
    first: Run           # machine A's build
    first_root: Path     # where machine A's root went afterwards
    wheels: list[str]    # sha256 of the toolchain wheels


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory, shared_root: Path) -> Iterator[Team]:
    base = tmp_path_factory.mktemp("remote")
    server = Nginx(base / "server")
    server.start()
    try:
        wheels = toolchain_wheels(shared_root, base / "wheels")
        assert len(wheels) == 5
        project = Project(base / "project", "remotefix", base / "unused", sources=DATA / "remote_src")
        root = base / "team-root"
        # the writer's credentials come in the environment (the command line would show them in ps)
        first = realize(root, project.recipe, base / "home-a",
                        env={"PIP_FIND_LINKS": str(base / "wheels"), "HERMETIC_REMOTE_CACHE": server.writer_url,
                             "HERMETIC_REMOTE_CACHE_MODE": "rw"})
        assert isinstance(first, Run) and first.rc == 0, first.err[-3000:]
        first_root = base / "machine-a"
        root.rename(first_root)  # machine A is elsewhere now; the path is free for machine B
        yield Team(server, base, project, root, first, first_root, wheels)
    finally:
        server.stop()


def _log_since(server: Nginx, mark: int) -> list[str]:
    return server.access_log()[mark:]


def test_a_second_machine_builds_nothing_and_says_where_everything_came_from(team: Team) -> None:
    a = team.first
    assert a.decisions == dict.fromkeys(SOURCES, "compiled")
    assert a.receipt["remote"]["objects_uploaded"] == 3 and a.receipt["remote"]["modules_uploaded"] == 1
    mark = len(team.server.access_log())
    assert not team.root.exists()
    b = realize(team.root, team.project.recipe, team.base / "home-b", env={"HERMETIC_REMOTE_CACHE": team.server.url})
    assert isinstance(b, Run) and b.rc == 0, b.err[-3000:]
    # zero compiles: every object, the module and its certificate, and the toolchain wheels came from nginx
    assert b.decisions == dict.fromkeys(SOURCES, "fetched-remote")
    assert b.receipt["counts"]["objects_fetched-remote"] == 3 and b.receipt["counts"]["objects_compiled"] == 0
    assert b.digests == a.digests
    assert [o["first_built_by"] for o in b.certificate["objects"]] == \
        [o["first_built_by"] for o in a.certificate["objects"]]   # machine A, where each was compiled
    assert b.certificate["module_build"]["decision"] == "fetched-remote"
    assert b.certificate["module_build"]["producer_certificate"] == a.receipt["modules"][0]["certificate_blob"]
    assert b.certificate["module_build"]["remote"] == {"url": team.server.url, "mode": "ro"}
    assert b.receipt["modules"][0]["sha256"] == a.receipt["modules"][0]["sha256"]
    assert b.receipt["remote"]["wheels_fetched"] == 5 and b.receipt["remote"]["uploads"] == 0
    assert module_values(team.root) == (7, TABLE_SUM)
    # nginx saw B's GETs: each wheel and object from /cas, each object list from /ac; B wrote nothing
    log = _log_since(team.server, mark)
    ok_gets = {line.split()[4] for line in log if '"GET ' in line and line.split()[6] == "200"}
    for digest in [*a.digests.values(), *team.wheels]:
        assert f"/cache/cas/{digest}" in ok_gets
    assert sum(p.startswith("/cache/ac/") for p in ok_gets) == 4  # three object lists and the module
    assert not [line for line in log if '"PUT ' in line]


def module_file(run: Run) -> bytes:
    return (Path(run.receipt["profile"]) / run.receipt["modules"][0]["file"]).read_bytes()


def rebuild_sample(root: Path, home: Path) -> list[dict[str, Any]]:
    v = cli.run(root, "verify", "--rebuild-sample", "20", "--json", env=hermetic_env(home, pip="offline"))
    assert v.rc == 0, v.err[-3000:]
    return list(v.result["rebuilt"])


def test_a_root_at_another_path_gets_everything_and_the_module_it_would_compile(team: Team) -> None:
    """Objects do not depend on where the root is: a root elsewhere fetches every object and the module, and
    compiling there gives the same objects and module byte for byte (nvcc's intermediate files are named after
    the object, not its pid); rebuilding the fetched objects there gives them again."""
    a = team.first
    elsewhere = team.base / "elsewhere" / "deeper" / "root"
    c = realize(elsewhere, team.project.recipe, team.base / "home-c", env={"HERMETIC_REMOTE_CACHE": team.server.url})
    assert isinstance(c, Run) and c.rc == 0, c.err[-3000:]
    assert c.decisions == dict.fromkeys(SOURCES, "fetched-remote") and c.receipt["counts"]["objects_compiled"] == 0
    assert c.certificate["module_build"]["decision"] == "fetched-remote"
    assert c.receipt["modules"][0]["sha256"] == a.receipt["modules"][0]["sha256"]  # the very module A linked
    assert module_values(elsewhere) == (7, TABLE_SUM)
    local = team.base / "local-compile" / "root"
    d = realize(local, team.project.recipe, team.base / "home-d", env={"PIP_FIND_LINKS": str(team.base / "wheels")})
    assert isinstance(d, Run) and d.rc == 0, d.err[-3000:]
    assert d.decisions == dict.fromkeys(SOURCES, "compiled")
    assert {o["source"]: o["digest"] for o in d.certificate["objects"]} == a.digests  # nvcc's too: byte for byte
    assert module_file(d) == module_file(c)
    assert d.receipt["modules"][0]["sha256"] == a.receipt["modules"][0]["sha256"]
    rebuilt = rebuild_sample(elsewhere, team.base / "home-c")
    assert sorted(r["source"] for r in rebuilt) == sorted(SOURCES) and {r["outcome"] for r in rebuilt} == {"same"}


def test_an_archive_moves_objects_to_a_root_at_another_path(team: Team) -> None:
    a_root = team.first_root
    archive = team.base / "closure.tar.zst"
    home = team.base / "home-x"
    out = cli.run(a_root, "export", archive, "--level", "1", "--json", env=hermetic_env(home, pip="offline"))
    assert out.rc == 0, out.err[-3000:]
    target = team.base / "air-gapped" / "root"
    imp = cli.run(target, "import", archive, "--trust-unsigned", "--json", env=hermetic_env(home, pip="offline"))
    assert imp.rc == 0, imp.err[-3000:]
    x = realize(target, team.project.recipe, home)
    assert isinstance(x, Run) and x.rc == 0, x.err[-3000:]
    assert x.decisions == dict.fromkeys(SOURCES, "reused") and x.receipt["counts"]["fetched"] == 0
    assert x.receipt["modules"][0]["sha256"] == team.first.receipt["modules"][0]["sha256"]
    assert module_values(target) == (7, TABLE_SUM)
    assert {r["outcome"] for r in rebuild_sample(target, home)} == {"same"}


def test_the_p2p_extension_travels_to_a_root_at_another_path(team: Team, shared_root: Path) -> None:
    """The worker's own extension, the same way: the session's root (which builds p2p, or has it) shares it
    with a read-write client; a root elsewhere gets every object and the module, which a compile there gives
    too, byte for byte."""
    p2p = REPO / "recipes" / "p2p.toml"
    writer = hermetic_env(pip="machine", extra={"HERMETIC_REMOTE_CACHE": team.server.writer_url,
                                               "HERMETIC_REMOTE_CACHE_MODE": "rw"})
    shared = cli.run(shared_root, "realize", p2p, "--explain", "--json", env=writer)  # every step: it shares all
    assert shared.rc == 0, shared.err[-3000:]
    e = realize(team.base / "p2p-elsewhere" / "root", p2p, team.base / "home-p2p-e",
                env={"HERMETIC_REMOTE_CACHE": team.server.url})
    assert isinstance(e, Run) and e.rc == 0, e.err[-3000:]
    assert set(e.decisions.values()) == {"fetched-remote"} and len(e.decisions) == 2
    assert e.certificate["module_build"]["decision"] == "fetched-remote"
    f = realize(team.base / "p2p-local" / "root", p2p, team.base / "home-p2p-f",
                env={"PIP_FIND_LINKS": str(team.base / "wheels")})
    assert isinstance(f, Run) and f.rc == 0, f.err[-3000:]
    assert set(f.decisions.values()) == {"compiled"}
    assert module_file(f) == module_file(e)


def test_device_debug_keeps_the_root_in_the_key_and_explain_says_why(team: Team) -> None:
    """nvcc -G writes this machine's paths into device debug information, which no prefix map reaches: such an
    object serves its own root only. The g++ units of the same recipe still travel."""
    base = team.base / "debug"
    proj = Project(base / "project", "remotefix", base / "unused", sources=DATA / "remote_src", cuda_cflags='"-G"')
    first = realize(base / "root-1", proj.recipe, base / "home-1", "--explain",
                    env={"PIP_FIND_LINKS": str(team.base / "wheels"), "HERMETIC_REMOTE_CACHE": team.server.writer_url,
                         "HERMETIC_REMOTE_CACHE_MODE": "rw"})
    assert isinstance(first, Run) and first.rc == 0, first.err[-3000:]
    assert first.decisions["kern.cu"] == "compiled"  # -G: another key than team A's kern.cu
    second = realize(base / "root-2", proj.recipe, base / "home-2", "--explain",
                     env={"HERMETIC_REMOTE_CACHE": team.server.url})
    assert isinstance(second, Run) and second.rc == 0, second.err[-3000:]
    assert second.decisions == {"bindings.cpp": "fetched-remote", "kern.cu": "compiled", "table.cpp": "fetched-remote"}
    kern = next(o for o in second.certificate["objects"] if o["source"] == "kern.cu")
    assert kern["path_bound"] == "-G"
    explained = [r["message"] for r in map(json.loads, second.out.splitlines()) if r.get("event") == "explain"]
    assert any("kern.cu: compiled" in line and "bound to this root by -G" in line for line in explained), explained


def test_uploads_are_framed_for_bazel_remote_and_large_objects_pass(team: Team) -> None:
    a = team.first
    puts = [line for line in team.server.access_log() if '"PUT ' in line]
    assert puts and all(" length=" in line and "length=-" not in line and line.endswith("chunked=-") for line in puts)
    # CAS blobs before the action entry that names them
    order = [line.split()[4] for line in puts]
    objects_list = f"/cache/ac/{objects_key(_entry_meta(team, 'table.cpp')['lookup'])}"
    assert order.index(f"/cache/cas/{a.digests['table.cpp']}") < order.index(objects_list)
    # table.cpp's object is above nginx's default 1 MiB body limit; the repository's config lets it through
    size = _entry_meta(team, "table.cpp")["size"]  # the object's own size (the store may keep it compressed)
    assert size > 1 << 20
    assert any(f"/cache/cas/{a.digests['table.cpp']} " in line and '" 201 ' in line for line in puts)
    stored = team.server.path("cas", a.digests["table.cpp"])
    assert hashlib.sha256(stored.read_bytes()).hexdigest() == a.digests["table.cpp"]


def _entry_meta(team: Team, source: str) -> dict[str, Any]:
    entry = next(o["entry"] for o in team.first.certificate["objects"] if o["source"] == source)
    meta: dict[str, Any] = json.loads((team.first_root / "store" / "entries" / entry / "meta.json").read_text())
    return meta


def test_credentials_never_leave_the_environment(team: Team) -> None:
    a = team.first
    assert PASSWORD not in a.out + a.err
    leaks = [str(p) for p in team.first_root.rglob("*")
             if p.is_file() and not p.is_symlink() and p.stat().st_size < 64 << 20 and PASSWORD.encode() in
             (p.read_bytes() if not p.name.endswith(".zst") else _unzstd(p))]
    assert leaks == []
    assert a.receipt["remote"]["url"] == team.server.url and "@" not in json.dumps(a.receipt)
    # a writer the server refuses: a warning without the password, and the build would go on reading
    out = io.StringIO()
    wrong = resolve_settings(RemoteOptions(team.server.url.replace("://", f"://{WRITER}:not-{PASSWORD}@"), "rw"), {})
    assert wrong is not None
    cache = open_storage(wrong, Reporter(stderr=out))
    assert cache.put_cas_bytes(hashlib.sha256(b"x").hexdigest(), b"x") is False
    assert "refuses uploads (PUT" in out.getvalue() and "401" in out.getvalue()
    assert PASSWORD not in out.getvalue() and cache.usable and not cache.writable


def _unzstd(p: Path) -> bytes:
    import zstandard
    try:
        return zstandard.ZstdDecompressor().decompress(p.read_bytes(), max_output_size=1 << 30)
    except zstandard.ZstdError:
        return p.read_bytes()


def _drop_objects(root: Path) -> None:
    """Forget the recipe and collect: the toolchain stays (its profile is a root), objects and modules go."""
    p = cli.run(root, "gc", "--drop-root", "remotefix", env=dict(os.environ))
    assert p.returncode == 0, p.stderr
    assert not list((root / "store" / "entries").glob("*-obj-*"))


def test_a_corrupt_or_missing_blob_on_the_server_is_rebuilt_locally(team: Team) -> None:
    a = team.first
    _drop_objects(team.root)
    corrupt = team.server.path("cas", a.digests["kern.cu"])
    corrupt.write_bytes(corrupt.read_bytes()[:-64] + b"\0" * 64)   # nginx serves it without a blink
    team.server.path("cas", a.digests["table.cpp"]).unlink()       # listed by its entry, gone from the disk
    run = realize(team.root, team.project.recipe, team.base / "home-b",
                  env={"HERMETIC_REMOTE_CACHE": team.server.writer_url, "HERMETIC_REMOTE_CACHE_MODE": "rw"})
    assert isinstance(run, Run) and run.rc == 0, run.err[-3000:]
    assert run.decisions == {"bindings.cpp": "fetched-remote", "kern.cu": "compiled", "table.cpp": "compiled"}
    assert f"blob cas/{a.digests['kern.cu'][:16]}… from the remote cache has other content" in run.err
    assert "missing from the server" in run.err
    assert module_values(team.root) == (7, TABLE_SUM)
    # the read-write machine put correct bytes back under the names it compiled again
    for source in ("kern.cu", "table.cpp"):
        digest = run.digests[source]
        assert hashlib.sha256(team.server.path("cas", digest).read_bytes()).hexdigest() == digest


def test_the_server_stopped_in_the_middle_of_a_build_leaves_a_correct_build(team: Team) -> None:
    _drop_objects(team.root)
    kern = team.project.folder / "src" / "kern.cu"
    original = kern.read_text()
    kern.write_text(original.replace("return 7;", "return 8;"))  # kern.cu must compile: a miss everywhere
    try:
        proc = realize(team.root, team.project.recipe, team.base / "home-b", wait=False,
                       env={"HERMETIC_REMOTE_CACHE": team.server.writer_url, "HERMETIC_REMOTE_CACHE_MODE": "rw"})
        assert isinstance(proc, subprocess.Popen)
        try:
            _wait_for_compiler(team.root, proc)
            team.server.stop()                                    # while nvcc runs: uploads and lookups fail
            out, err = proc.communicate(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
        run = _finish(team.root, proc.returncode, out, err)
        assert run.rc == 0, run.err[-3000:]
        assert run.decisions == {"bindings.cpp": "fetched-remote", "kern.cu": "compiled",
                                 "table.cpp": "fetched-remote"}
        assert f"the remote cache {team.server.url} is unreachable" in run.err
        assert run.receipt["remote"]["unreachable"] and run.certificate["module_build"]["decision"] == "linked"
        assert module_values(team.root) == (8, TABLE_SUM)
    finally:
        kern.write_text(original)
        team.server.start()


def _wait_for_compiler(root: Path, proc: subprocess.Popen[str], source: str = "kern.cu") -> None:
    """Until nvcc compiles ``source`` in this build (its command names files under the root). Any nvcc is not
    enough: nvcc also answers the toolchain's probe (`--version`, when its cached answer is stale) before the
    plan asks the remote cache, and stopping the server then could turn every lookup into a miss (CI at
    c5373fe failed so, once)."""
    needle = str(root).encode()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            with contextlib.suppress(OSError):
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if (os.path.basename(argv[0]) == b"nvcc" and any(needle in a for a in argv)
                        and any(a.endswith(source.encode()) for a in argv)):
                    return
        time.sleep(0.01)
    raise AssertionError(f"no compiler of this build was seen (realize exited {proc.poll()})")


# concurrency ------------------------------------------------------------------------------------------------

def _upload_same_record(args: tuple[str, str, int]) -> dict[str, int]:
    """One writer process: its own store holding the same object record and blobs as every other writer."""
    folder, url, rounds = args
    store = Store(Path(folder)).open()
    meta, blob = _record()
    digest = store.put_blob_bytes(blob)
    settings = resolve_settings(RemoteOptions(url, "rw"), {})
    assert settings is not None
    share = Sharing(open_storage(settings, Reporter(stderr=io.StringIO())), store)
    for _ in range(rounds):
        share.remote.wrong.add(digest)  # force the PUT (no HEAD short cut): writers really collide
        share.upload_objects([meta])
        share.upload_blob(digest)
    return dict(share.remote.stats.__dict__)


def _record() -> tuple[dict[str, Any], bytes]:
    """A real object record (keys from hermetic.keys) with a 3 MiB object."""
    blob = bytes(range(256)) * (12 << 10)
    command = ["c++", "-DX=1", "-c", "/nonexistent/concurrency.cpp", "-o", "/nonexistent/concurrency.o"]
    argv, defines = split_defines(command)
    lookup = lookup_key("cxx", command, {}, {"host_compilers": "test"}, {"torch": "test"}, None)
    inputs = [["/nonexistent/concurrency.cpp", "raw", hashlib.sha256(b"src").hexdigest()]]
    key = object_key(lookup, defines, inputs)
    name = entry_name(key, "obj-concurrency.o")
    digest = hashlib.sha256(blob).hexdigest()
    meta = {"format": STORE_FORMAT, "kind": "object", "name": name, "key": key, "lookup": lookup,
            "source": "concurrency.cpp", "object": digest, "size": len(blob), "inputs": inputs, "defines": defines,
            "argv": argv, "command": command, "output": command[-1], "env": {},
            "toolchain": {"host_compilers": "test"}, "host": {"torch": "test"}, "root": None,
            "built_by": {"host": "test"}, "refs": [f"blob:{digest}"]}
    return meta, blob


def test_concurrent_uploads_of_the_same_keys(team: Team, tmp_path: Path) -> None:
    meta, blob = _record()
    mark = len(team.server.access_log())
    jobs = [(str(tmp_path / f"store{i}"), team.server.writer_url, 4) for i in range(4)]
    with ProcessPoolExecutor(4) as pool:
        stats = list(pool.map(_upload_same_record, jobs))
    assert all(s["failures"] == 0 for s in stats), stats
    puts = [line for line in _log_since(team.server, mark) if '"PUT ' in line]
    # every writer put the blob in every round (16 colliding PUTs), the first round also record and list
    assert len(puts) > 4 * 4 and all(line.split()[6] in ("201", "204") for line in puts)
    # the server holds whole, correct blobs and one list naming the record once
    assert team.server.path("cas", meta["object"]).read_bytes() == blob
    files = decode_action_result(team.server.path("ac", objects_key(meta["lookup"])).read_bytes())
    assert [f.path for f in files] == [f"{meta['name']}/meta.json", f"{meta['name']}/object"]
    # and a reader accepts it: every check of a fetched record passes
    settings = resolve_settings(RemoteOptions(team.server.url), {})
    assert settings is not None
    reader = Sharing(open_storage(settings, Reporter(stderr=io.StringIO())), Store(tmp_path / "reader").open())
    assert reader._records(meta["lookup"]) == [meta]


def test_a_record_whose_command_its_key_does_not_describe_is_refused(team: Team, tmp_path: Path) -> None:
    """`verify --rebuild-sample` runs a record's command again: a writer cannot slip another one in."""
    meta, blob = _record()
    meta = {**meta, "command": ["sh", "-c", "touch /tmp/pwned", "-DX=1", "-o", "x.o"],
            "lookup": hashlib.sha256(b"another lookup").hexdigest()}
    writer = Sharing(open_storage(_settings(team.server.writer_url, "rw"), Reporter(stderr=io.StringIO())),
                     Store(tmp_path / "writer").open())
    writer.store.put_blob_bytes(blob)
    writer.upload_objects([meta])
    assert writer.counts["objects_uploaded"] == 1  # the server takes anything from a writer
    out = io.StringIO()
    reader = Sharing(open_storage(_settings(team.server.url, "ro"), Reporter(stderr=out)),
                     Store(tmp_path / "reader").open())
    assert reader._records(meta["lookup"]) == []
    assert "is not valid (its name is not the key of its inputs)" in out.getvalue()
    meta["key"] = object_key(meta["lookup"], meta["defines"], meta["inputs"])
    meta["name"] = entry_name(meta["key"], "obj-concurrency.o")  # consistent key, foreign command
    writer.upload_objects([meta])
    assert reader._records(meta["lookup"]) == []
    assert "its command is not the one its lookup key describes" in out.getvalue()


def _settings(url: str, mode: str) -> RemoteSettings:
    settings = resolve_settings(RemoteOptions(url, mode), {})
    assert settings is not None
    return settings


# failures a loopback server can produce on demand -------------------------------------------------------------

class _Answer(BaseHTTPRequestHandler):
    status = 503
    body = b""
    seen: list[dict[str, str]] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        type(self).seen.append(dict(self.headers))
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)


@contextlib.contextmanager
def _serve(status: int, body: bytes = b"") -> Iterator[tuple[str, type[_Answer]]]:
    """A loopback server answering every GET with ``status`` and ``body``; its handler class records headers."""
    handler = type("Handler", (_Answer,), {"status": status, "body": body, "seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/cache", handler
    finally:
        server.shutdown()
        server.server_close()


def _client(url: str, environ: dict[str, str] | None = None) -> tuple[Storage, io.StringIO]:
    out = io.StringIO()
    settings = resolve_settings(RemoteOptions(url), environ or {})
    assert settings is not None
    return open_storage(settings, Reporter(stderr=out)), out


def test_refused_timeout_5xx_and_bad_bodies_are_misses_with_a_warning() -> None:
    key = hashlib.sha256(b"k").hexdigest()
    with socket.socket() as s:  # refused: a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cache, out = _client(f"http://127.0.0.1:{port}/cache")
    assert cache.get_ac(key) is None and "unreachable" in out.getvalue() and not cache.usable
    assert cache.get_cas_bytes(key, 100) is None and out.getvalue().count("unreachable") == 1  # no retry storm

    with socket.socket() as listener:  # accepts, never answers: the bounded timeout ends it
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        cache, out = _client(f"http://127.0.0.1:{listener.getsockname()[1]}/cache",
                             {"HERMETIC_REMOTE_CACHE_TIMEOUT": "0.5"})
        assert cache.get_ac(key) is None and "unreachable (timed out)" in out.getvalue()

    with _serve(503) as (url, _handler):
        cache, out = _client(url)
        assert cache.get_ac(key) is None and "HTTP 503" in out.getvalue() and cache.usable
    with _serve(200, b"\xff\xff\xff") as (url, _handler):
        cache, out = _client(url)
        assert cache.get_ac(key) is None and "is not an ActionResult" in out.getvalue()
        assert cache.get_cas_bytes(key, 100) is None and "has other content" in out.getvalue()


def test_a_bearer_token_is_sent_and_never_printed() -> None:
    token = "tok-" + "9" * 20
    with _serve(500) as (url, handler):
        cache, out = _client(url, {"HERMETIC_REMOTE_CACHE_TOKEN": token})
        assert cache.get_ac(hashlib.sha256(b"k").hexdigest()) is None
    assert handler.seen and handler.seen[-1].get("Authorization") == f"Bearer {token}"
    assert token not in out.getvalue() and "HTTP 500" in out.getvalue()


# settings and encoding ----------------------------------------------------------------------------------------

def test_settings_come_from_the_command_line_then_the_environment_then_the_recipe() -> None:
    env = {"HERMETIC_REMOTE_CACHE": "http://env.example/c", "HERMETIC_REMOTE_CACHE_MODE": "rw"}
    s = resolve_settings(RemoteOptions("https://u:p%40ss@cli.example/c/"), env, "http://recipe.example/c", "ro")
    assert s is not None and (s.url, s.mode, s.auth) == ("https://cli.example/c", "rw", ("u", "p@ss"))
    assert "p@ss" not in repr(s)
    s = resolve_settings(None, {}, "http://recipe.example/c", None)
    assert s is not None and (s.url, s.mode) == ("http://recipe.example/c", "ro")  # read-only by default
    assert resolve_settings(RemoteOptions(mode="off"), env) is None
    assert resolve_settings(None, {}) is None


def test_bad_remote_settings_are_bad_input(tmp_path: Path) -> None:
    recipe = tmp_path / "r.toml"
    recipe.write_text(recipe_toml("r", locks=["l.txt"], extra='[remote]\nurl = "https://u:hunter2@cache.example/c"'))
    (tmp_path / "l.txt").write_text("")
    root = tmp_path / "root"

    def realize_it(*args: str, env: dict[str, str] | None = None) -> cli.Result:
        return cli.run(root, "realize", recipe, *args, env={**os.environ, **(env or {})})

    bad_url = realize_it("--remote-cache", "ftp://u:hunter2@cache.example/c")
    assert bad_url.returncode == 2 and "--remote-cache" in bad_url.stderr and "not an http(s) URL" in bad_url.stderr
    bad_mode = realize_it(env={"HERMETIC_REMOTE_CACHE_MODE": "sometimes"})
    assert bad_mode.returncode == 2 and "HERMETIC_REMOTE_CACHE_MODE" in bad_mode.stderr
    in_recipe = realize_it()
    assert in_recipe.returncode == 2 and f"{recipe}:6: key remote.url" in in_recipe.stderr
    assert "credentials" in in_recipe.stderr
    for p in (bad_url, bad_mode, in_recipe):
        assert "hunter2" not in p.stderr and "Traceback" not in p.stderr


def test_action_entries_are_reapi_action_results() -> None:
    """Checked against the protobuf runtime with the field numbers of remote_execution.proto: bazel-remote
    parses what hermetic writes, and hermetic reads what bazel-remote stores (it adds execution_metadata)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fd = descriptor_pb2.FileDescriptorProto(name="reapi_subset.proto", package="build.bazel.remote.execution.v2",
                                            syntax="proto3")
    T = descriptor_pb2.FieldDescriptorProto  # noqa: N806
    msgs = {"Digest": [("hash", 1, T.TYPE_STRING, None, False), ("size_bytes", 2, T.TYPE_INT64, None, False)],
            "OutputFile": [("path", 1, T.TYPE_STRING, None, False), ("digest", 2, T.TYPE_MESSAGE, "Digest", False),
                           ("is_executable", 4, T.TYPE_BOOL, None, False)],
            "ExecutedActionMetadata": [("worker", 1, T.TYPE_STRING, None, False)],
            "ActionResult": [("output_files", 2, T.TYPE_MESSAGE, "OutputFile", True),
                             ("exit_code", 4, T.TYPE_INT32, None, False),
                             ("execution_metadata", 9, T.TYPE_MESSAGE, "ExecutedActionMetadata", False)]}
    for name, fields in msgs.items():
        m = fd.message_type.add(name=name)
        for fname, number, ftype, tname, repeated in fields:
            f = m.field.add(name=fname, number=number, type=ftype,
                            label=T.LABEL_REPEATED if repeated else T.LABEL_OPTIONAL)
            if tname:
                f.type_name = f".build.bazel.remote.execution.v2.{tname}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    action_result = message_factory.GetMessageClass(pool.FindMessageTypeByName(
        "build.bazel.remote.execution.v2.ActionResult"))
    files = [OutputFile("a/meta.json", hashlib.sha256(b"a").hexdigest(), 1),
             OutputFile("module/x.so", hashlib.sha256(b"b").hexdigest(), 3 << 30, executable=True)]
    parsed = action_result.FromString(encode_action_result(files))
    assert [(f.path, f.digest.hash, f.digest.size_bytes, f.is_executable) for f in parsed.output_files] == \
        [(f.path, f.digest, f.size, f.executable) for f in files]
    parsed.execution_metadata.worker = "127.0.0.1"  # what bazel-remote adds before storing
    assert decode_action_result(parsed.SerializeToString()) == files
    with pytest.raises(ValueError):
        decode_action_result(b"\x12\x05\x0a\x03")
