"""The real CUDA 13.0 compiler wheels, realized from pip's configured index, used instead of any system CUDA."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support import cli
from tests.support.cli import REPO
from tests.support.index import dead_url
from tests.support.trees import tree_snapshot

RECIPE = REPO / "recipes" / "toolchain.toml"


def _run(root: Path, *args: str, env: dict[str, str] | None = None) -> cli.Result:
    return cli.run(root, *args, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def toolchain_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tc") / "root"
    p = _run(root, "realize", str(RECIPE))
    assert p.returncode == 0, p.stderr
    return root


def test_store_nvcc_wins_over_a_tripwire_and_system_cuda(toolchain_root: Path, tmp_path: Path) -> None:
    trip = tmp_path / "trip"
    trip.mkdir()
    marker = tmp_path / "tripped"
    (trip / "nvcc").write_text(f"#!/bin/sh\ntouch {marker}\necho SYSTEM NVCC USED\nexit 99\n")
    (trip / "nvcc").chmod(0o755)
    env = {"PATH": f"{trip}:{os.environ['PATH']}", "CUDA_HOME": "/usr/local/cuda"}
    p = _run(toolchain_root, "env", str(RECIPE), "--", "nvcc", "--version", env=env)
    assert p.returncode == 0, p.stderr
    assert "release 13.0, V13.0.88" in p.stdout
    assert not marker.exists()
    p = _run(toolchain_root, "env", str(RECIPE), "--", "sh", "-c", 'command -v nvcc; echo "$CUDA_HOME"',
             env=env)
    nvcc_path, cuda_home = p.stdout.split()
    assert nvcc_path.startswith(str(toolchain_root)) and cuda_home.startswith(str(toolchain_root))
    assert "/usr/local" not in nvcc_path + cuda_home


def test_toolchain_layout_has_the_links_nvcc_and_torch_need(toolchain_root: Path) -> None:
    cu = toolchain_root / "profiles" / "cuda-13.0" / "nvidia" / "cu13"
    assert os.readlink(cu / "lib64") == "lib"
    assert os.readlink(cu / "lib" / "libcudart.so") == "libcudart.so.13"
    for rel in ("bin/nvcc", "bin/ptxas", "nvvm/bin/cicc", "include/cuda_runtime.h", "include/crt/host_config.h",
                "include/cccl/cub/cub.cuh"):
        assert (cu / rel).exists(), rel
    assert os.access(cu / "bin" / "nvcc", os.X_OK)


def test_second_realize_is_offline_and_rewrites_nothing(toolchain_root: Path) -> None:
    profile = toolchain_root / "profiles" / "cuda-13.0"
    before = tree_snapshot(profile)
    offline = {"PIP_INDEX_URL": dead_url(), "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": "",
               "PIP_CONFIG_FILE": os.devnull}
    p = _run(toolchain_root, "realize", str(RECIPE), env=offline)
    assert p.returncode == 0, p.stderr
    assert "0 fetched" in p.stderr
    assert tree_snapshot(profile) == before
