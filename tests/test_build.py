"""Hermetic extension builds: recipes/p2p.toml from an empty root with the wheel toolchain, no system CUDA
anywhere, the no-op, the recipe's limits on live compilers, and torch-identical compile commands."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from hermetic.root import Root
from tests.support import cli
from tests.support.builds import DATA, Project
from tests.support.cli import REPO
from tests.support.trees import store_listing, tree_snapshot

P2P = REPO / "recipes" / "p2p.toml"


def _hermetic(root: Path, *args: str, env: dict[str, str] | None = None) -> cli.Result:
    return cli.run(root, *args, env={**os.environ, **(env or {})})


def _tripwire(folder: Path) -> tuple[dict[str, str], Path]:
    """A system-CUDA trap: an nvcc first on PATH and CUDA_HOME at /usr/local/cuda; the marker proves a use."""
    folder.mkdir()
    marker = folder / "tripped"
    (folder / "nvcc").write_text(f"#!/bin/sh\ntouch {marker}\nexit 99\n")
    (folder / "nvcc").chmod(0o755)
    env = {"PATH": f"{folder}:{os.environ['PATH']}", "CUDA_HOME": "/usr/local/cuda", "CUDA_PATH": "/usr/local/cuda",
           "LD_LIBRARY_PATH": "/usr/local/cuda/lib64"}
    return env, marker


@pytest.fixture(scope="module")
def p2p_root(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("p2p")
    env, marker = _tripwire(base / "trip")
    root = base / "root"
    p = _hermetic(root, "realize", str(P2P), "--json", env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert not marker.exists(), "the system nvcc was run"
    return root, marker


def test_p2p_builds_from_an_empty_root_and_imports(p2p_root: tuple[Path, Path]) -> None:
    root, _marker = p2p_root
    receipt = json.loads(sorted((root / "receipts").glob("p2p-*.json"))[-1].read_text())
    assert receipt["modules"][0]["counts"] == {"objects": 2, "compiled": 2}
    check = receipt["import_check"]
    assert check["cuda_initialized"] is False and check["system_cuda"] == []
    assert all(not lib.startswith("/usr/local/cuda") for lib in check["cuda_libraries"])
    code = ("import torch, hermetic_p2p as p; a = torch.arange(8.); b = torch.empty(8); p.cpu_copy(b, a); "
            "p.accumulate(b, a); assert torch.equal(b, 2 * a); assert p.device_count() == 0; "
            "assert not torch.cuda.is_initialized(); print('ok')")
    env = {**os.environ, "PYTHONPATH": str(root / "profiles" / "p2p"), "CUDA_HOME": "/usr/local/cuda"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root)
    assert p.stdout.strip() == "ok", p.stderr


def test_no_system_cuda_in_dependency_files(p2p_root: tuple[Path, Path]) -> None:
    root, _ = p2p_root
    depfiles = list((root / "build" / "p2p").rglob("*.o.d"))
    assert len(depfiles) == 2
    for d in depfiles:
        text = d.read_text()
        assert "/usr/local/cuda" not in text and "/usr/local/include" not in text
        assert "profiles/p2p.toolchain/nvidia/cu13/include/cuda_runtime" in text


def test_second_realize_compiles_nothing_imports_no_torch_rewrites_nothing(p2p_root: tuple[Path, Path],
                                                                            tmp_path: Path) -> None:
    root, _ = p2p_root
    profile = root / "profiles" / "p2p"
    before, store_before = tree_snapshot(profile), store_listing(root)
    fake = tmp_path / "fake"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text(f"open({str(tmp_path / 'torch-imported')!r}, 'w').close()\n"
                                                "raise ImportError('the no-op imported torch')\n")
    imports_cache = sorted(Root(root).cache_dir("imports").iterdir())
    stamps = [p.stat().st_mtime_ns for p in imports_cache]
    t0 = time.perf_counter()
    p = _hermetic(root, "realize", str(P2P), "--json", env={"PYTHONPATH": str(fake)})
    elapsed = time.perf_counter() - t0
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout.splitlines()[-1])
    assert result["changed"] is False and result["counts"]["objects_compiled"] == 0
    assert not (tmp_path / "torch-imported").exists()
    assert [q.stat().st_mtime_ns for q in imports_cache] == stamps
    assert tree_snapshot(profile) == before and store_listing(root) == store_before
    assert elapsed < 5  # generous: the figure itself is measured in bench/, not here


def test_limits_apply_to_live_compilers(tmp_path: Path, shared_root: Path) -> None:
    proj = Project(tmp_path / "p", "limits", shared_root, limits='cpus = "1"\nnice = 7\naddress_space = "20G"\n')
    seen: dict[int, dict[str, Any]] = {}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for pid in os.listdir("/proc"):
                if not pid.isdigit() or int(pid) in seen:
                    continue
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                    # compilers of this build: their arguments name files under this test's scratch root
                    if not any(tool in cmd[0] for tool in (b"cicc", b"cc1plus", b"ptxas", b"nvcc")) \
                            or str(shared_root).encode() not in b" ".join(cmd):
                        continue
                    status = Path(f"/proc/{pid}/status").read_text()
                    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                    limits = Path(f"/proc/{pid}/limits").read_text()
                    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                except OSError:
                    continue
                if b"CUDA_VISIBLE_DEVICES=" not in environ:
                    continue  # not one of ours
                seen[int(pid)] = {
                    "cpus": next(ln.split()[-1] for ln in status.splitlines() if ln.startswith("Cpus_allowed_list")),
                    "nice": int(stat[16]),
                    "as": next(ln.split()[4] for ln in limits.splitlines() if ln.startswith("Max address space")),
                    "gpu": b"CUDA_VISIBLE_DEVICES=" in environ}
            time.sleep(0.005)

    t = threading.Thread(target=watch)
    t.start()
    try:
        proj.realize()
    finally:
        stop.set()
        t.join()
    assert seen, "no compiler process was observed"
    for facts in seen.values():
        assert facts == {"cpus": "1", "nice": 7, "as": str(20 << 30), "gpu": True}


def test_compile_commands_agree_with_torch(tmp_path: Path, shared_root: Path) -> None:
    from hermetic.extensions.host import qualify
    from hermetic.extensions.plan import CudaTarget, ModuleSite, plan_extension, prefix_map
    from hermetic.recipe import Extension, Variant
    from hermetic.root import Root

    facts = qualify(Root(shared_root), None, need_torch=True)
    cuda_home = shared_root / "profiles" / "cuda-13.0" / "nvidia" / "cu13"
    src = tmp_path / "src"
    shutil.copytree(DATA / "reuse_src", src)
    files = sorted(p.name for p in src.iterdir())
    ext = Extension("fixture_ext", "src", ("*.cpp", "*.cu"), include_dirs=(".",), cflags=("-O2",),
                    cuda_cflags=("-O3", "--use_fast_math"))
    pmap = prefix_map(tmp_path, "src", src, tmp_path / "b", cuda_home, facts)
    plan = plan_extension(ext, Variant("default"), facts, CudaTarget(cuda_home, ("9.0",)),
                          ModuleSite(src, files, tmp_path / "b", pmap))
    ours = {Path(c.source).name: c.command() for c in plan.compiles}

    writer = f"""
import os
from torch.utils import cpp_extension as ce
srcs = {[c.source for c in plan.compiles]!r}
ce._write_ninja_file_to_build_library({str(tmp_path / 'torch.ninja')!r}, 'fixture_ext', srcs, ['-O2'],
    ['-O3', '--use_fast_math'], [], ce._prepare_ldflags([], True, False, False, False), [{str(src)!r}],
    True, False, False)
"""
    env = {**os.environ, "CUDA_HOME": str(cuda_home), "TORCH_CUDA_ARCH_LIST": "9.0",
           "CUDA_INC_PATH": facts.torch.nvidia_include,
           "TORCH_NO_COMPILER_WRAPPER": "1"}  # torch would put a ccache or sccache found on PATH in front
    env.pop("CXX", None)
    env.pop("CC", None)
    p = subprocess.run([sys.executable, "-c", writer], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    theirs = _torch_commands(tmp_path / "torch.ninja")
    assert set(theirs) == set(ours) | {"<link>"}
    for name in ours:
        assert _normalize(ours[name]) == _normalize(theirs[name]), name
    assert _normalize(list(plan.link_argv)) == _normalize(theirs["<link>"])


def test_cold_order_counts_the_local_headers_a_unit_includes_and_its_own_source_twice(tmp_path: Path) -> None:
    from hermetic.extensions.extension import cold_weight
    from hermetic.extensions.plan import Compile
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "big.h").write_text("int x;\n" * 4000)
    (tmp_path / "bind.cpp").write_text('#include "big.h"\n#include "missing.h"\n#include <vector>\n')
    (tmp_path / "kern.cu").write_text("int y;\n" * 1000)
    def c(name: str) -> Compile:
        src = str(tmp_path / name)
        return Compile(src, name, src + ".o", False, ("c++", f"-I{tmp_path / 'inc'}", "-c", src), src + ".d")
    assert cold_weight(c("bind.cpp")) == 2 * len('#include "big.h"\n#include "missing.h"\n#include <vector>\n') + 28000
    assert cold_weight(c("bind.cpp")) > cold_weight(c("kern.cu")) == 14000 > cold_weight(c("gone.cpp")) == 0
    # a unit's own code is compiled whole, a header's templates only in part: 16,000 bytes of its own
    # outweigh 28,000 reached through a header (exllamav3's cpu/moe_mul1.cpp against its instantiation units)
    (tmp_path / "own.cpp").write_text("int z;\n" * 2286)
    assert cold_weight(c("own.cpp")) == 2 * 16002 > cold_weight(c("bind.cpp"))
    # an instantiation unit reaches its kernels through its header's own includes, each file counted once
    # (the cycle too), whichever folder it is found in
    (tmp_path / "inst.cuh").write_text('#include "inc/kernels.cuh"\n#include "inst.cuh"\n')
    (tmp_path / "inc" / "kernels.cuh").write_text('#include "big.h"\n#include "../inst.cuh"\n' + "k;\n" * 3000)
    (tmp_path / "inst_k8.cu").write_text('#include "inst.cuh"\n')
    kernels = len('#include "big.h"\n#include "../inst.cuh"\n') + 9000
    assert cold_weight(c("inst_k8.cu")) == 2 * len('#include "inst.cuh"\n') \
        + (tmp_path / "inst.cuh").stat().st_size + kernels + 28000
    memo: dict[str, tuple[int, list[str]]] = {}
    assert cold_weight(c("inst_k8.cu"), memo) == cold_weight(c("inst_k8.cu"), memo) > cold_weight(c("bind.cpp"))
    # a header the compiler finds outside the unit's tree (torch's, CUDA's: common to every unit) is not
    # counted, nor followed, even through a quoted include
    outside, tree = tmp_path / "torch", tmp_path / "proj"
    outside.mkdir()
    tree.mkdir()
    (outside / "torch_big.h").write_text('#include "torch_more.h"\n' + "t;\n" * 50000)
    (outside / "torch_more.h").write_text("m;\n" * 50000)
    (tree / "uses_torch.cu").write_text('#include "torch_big.h"\n')
    src = str(tree / "uses_torch.cu")
    unit = Compile(src, "uses_torch.cu", src + ".o", True, ("nvcc", f"-I{outside}", "-c", src), src + ".d")
    assert cold_weight(unit) == 2 * len('#include "torch_big.h"\n')


def _torch_commands(ninja: Path) -> dict[str, list[str]]:
    text = ninja.read_text()
    variables = dict(line.split(" = ", 1) for line in text.splitlines() if " = " in line and not line[0].isspace())
    rules: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("rule "):
            current = line.split()[1]
        elif line.startswith("  command = ") and current:
            rules[current] = line[len("  command = "):]
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if not line.startswith("build "):
            continue
        target, _, rest = line[len("build "):].partition(": ")
        rule, *inputs = rest.split()
        cmd = rules[rule].replace("$in", " ".join(inputs)).replace("$out", target)
        for k in sorted(variables, key=len, reverse=True):
            cmd = cmd.replace(f"${k}", variables[k])
        out["<link>" if rule == "link" else Path(inputs[0]).name] = shlex.split(cmd)
    return out


def _normalize(argv: list[str]) -> list[str]:
    """Drop what may differ: output and object paths, dependency-file flags, nvcc's module-id path, the prefix
    map (hermetic's -ffile-prefix-map, given to nvcc through -Xcompiler)."""
    out: list[str] = []
    skip = 0
    for i, a in enumerate(argv):
        if skip:
            skip -= 1
            continue
        if a == "-Xcudafe" and argv[i + 1].startswith("--orig_src_path_name="):
            skip = 1
            continue
        if a.startswith("-ffile-prefix-map="):
            continue
        if a == "-Xcompiler" and argv[i + 1].startswith("-ffile-prefix-map="):
            skip = 1
            continue
        if a in ("-MD", "-MMD", "--generate-dependencies-with-compile"):
            continue
        if a in ("-MF", "--dependency-output"):
            skip = 1
            continue
        if a == "-o":
            out.append("-o")
            out.append("<out>")
            skip = 1
            continue
        out.append("<obj>" if a.endswith(".o") else a)
    return out


@pytest.mark.parametrize("lock, cuda, found", [
    ("runtime-13.5.txt", "13.0", "CUDART_VERSION (nvidia-cuda-runtime headers) 13.5"),
    ("nvcc-13.5.txt", "13.5", "torch.version.cuda 13.0"),
])
def test_toolchain_mismatch_exits_3_before_compiling(tmp_path: Path, shared_root: Path, lock: str, cuda: str,
                                                     found: str) -> None:
    proj = Project(tmp_path / "p", f"mismatch-{cuda}", shared_root)
    shutil.copy(DATA / "locks" / lock, proj.folder / "cuda-13.0-toolchain.txt")
    proj.recipe.write_text(proj.recipe.read_text().replace('cuda = "13.0"', f'cuda = "{cuda}"'))
    res = proj.realize(check=False)
    assert res.rc == 3, res.err
    assert found in res.err and "nvidia-cuda-runtime==13.0.*" in res.err and "Traceback" not in res.err
    assert not (shared_root / "build" / f"mismatch-{cuda}").exists() or \
        not list((shared_root / "build" / f"mismatch-{cuda}").rglob("*.o"))


def test_built_closure_moves_and_a_foreign_torch_is_refused(p2p_root: tuple[Path, Path], tmp_path: Path) -> None:
    root, _ = p2p_root
    archive = tmp_path / "p2p.tar.zst"
    # signed, and the key trusted where it is imported: the objects and the module come too (issue 34)
    key = tmp_path / "keys" / "builder"
    assert _hermetic(root, "key", "generate", str(key)).returncode == 0
    trusted = {"HERMETIC_TRUSTED_KEYS": f"{key}.pub"}
    assert _hermetic(root, "export", str(archive), "--name", "p2p", "--level", "1", "--sign", str(key)).rc == 0
    other = tmp_path / "other"
    p = _hermetic(other, "import", str(archive), env=trusted)
    assert p.returncode == 0 and "vouched for by key builder" in p.stderr, p.stderr
    assert _hermetic(other, "verify").returncode == 0
    # the imported objects and module are indexed: the recipe realized in the new root (another path, no
    # package index) fetches nothing and compiles nothing
    p = _hermetic(other, "realize", str(P2P), "--json", env={"PIP_NO_INDEX": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    counts = p.result["counts"]
    assert isinstance(counts, dict) and counts["fetched"] == 0 and counts["objects_compiled"] == 0, counts
    assert counts["objects_reused"] == 2
    # the same closure, claiming a module built for another torch: refused, nothing imported
    module = next(e for e in (other / "store" / "entries").iterdir() if "-mod-" in e.name)
    meta_path = module / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["host"]["torch"] = "0.0.1"
    os.chmod(meta_path, 0o644)
    meta_path.write_text(json.dumps(meta))
    foreign = tmp_path / "foreign.tar.zst"
    assert _hermetic(other, "export", str(foreign), "--name", "p2p", "--level", "1").returncode == 0
    third = tmp_path / "third"
    p = _hermetic(third, "import", str(foreign), "--trust-unsigned")  # taken: then its host is checked
    assert p.returncode == 3 and "torch=0.0.1" in p.stderr and "Traceback" not in p.stderr
    assert not (third / "store" / "entries").exists() or not any((third / "store" / "entries").iterdir())


def test_a_missing_or_moved_toolchain_profile_is_work_to_do(p2p_root: tuple[Path, Path]) -> None:
    """Attack finding 5: with profiles/<name>.toolchain removed, `--check` said up to date and the realize was a
    no-op that never made it again (and `hermetic env` then said "run `hermetic realize` first"). The no-op record
    now holds the toolchain's profile as the realize left it: gone or pointing elsewhere, `--check` exits 4 and a
    realize makes it again, compiling nothing."""
    root, _ = p2p_root
    link = root / "profiles" / "p2p.toolchain"
    target = os.readlink(link)
    assert _hermetic(root, "realize", str(P2P), "--check").returncode == 0
    elsewhere = os.path.relpath(root / "profiles" / "p2p", root / "profiles")   # as a recipe p2p.toolchain would
    for damage in ("removed", "elsewhere"):
        link.unlink()
        if damage == "elsewhere":
            link.symlink_to(elsewhere)
        p = _hermetic(root, "realize", str(P2P), "--check")
        assert p.returncode == 4, (damage, p.stdout, p.stderr)
        p = _hermetic(root, "realize", str(P2P), "--json")
        assert p.returncode == 0, p.stderr[-3000:]
        assert p.result["counts"]["objects_compiled"] == 0, p.result
        assert os.readlink(link) == target, damage
        assert _hermetic(root, "realize", str(P2P), "--check").returncode == 0, damage
        p = _hermetic(root, "env", str(P2P), "--", "sh", "-c", 'test -x "$CUDA_HOME/bin/nvcc" && echo found')
        assert p.returncode == 0 and p.stdout.strip() == "found", (damage, p.stdout, p.stderr)
    # a record an older hermetic wrote names no links: its toolchain profile counts while it points at one of
    # the record's own entries (the upgrade's first realize stays a no-op: test_compat), and nowhere else
    records = Root(root).cache_dir("realize")
    for path in records.glob("*.json"):
        rec = json.loads(path.read_text())
        if isinstance(rec.get("value"), dict) and rec["value"].get("links"):
            del rec["value"]["links"]
            path.write_text(json.dumps(rec))
    assert _hermetic(root, "realize", str(P2P), "--check").returncode == 0
    link.unlink()
    link.symlink_to(elsewhere)
    assert _hermetic(root, "realize", str(P2P), "--check").returncode == 4
    link.unlink()
    assert _hermetic(root, "realize", str(P2P), "--check").returncode == 4
    assert _hermetic(root, "realize", str(P2P)).returncode == 0 and os.readlink(link) == target
