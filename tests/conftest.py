"""Shared fixtures: a loopback index of real wheels, hermetic on a scratch root, a session-wide toolchain.

Helpers live in tests/support: ``cli`` (the one way to run hermetic), ``recipes`` (the one recipe template,
test wheels and locks), ``trees`` (listings of trees and stores), and one module per kind of fixture.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import cli
from tests.support.cli import REPO, Hermetic, hermetic_env
from tests.support.clients import make_client_venv
from tests.support.index import LoopbackIndex, serve_index


def require_all() -> bool:
    """CI (.ci/run sets HERMETIC_REQUIRE_ALL=1; CI=true too): a test whose tool is missing fails, never skips."""
    return os.environ.get("HERMETIC_REQUIRE_ALL") == "1" or os.environ.get("CI", "").lower() in ("1", "true")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """``@pytest.mark.needs(TOOL, found, HOW)``: without the tool the test skips, saying how to install it (the
    README's set-up does: tools/install-test-deps); in CI it fails instead."""
    for mark in item.iter_markers("needs"):
        tool, found, how = mark.args
        if not found:
            message = f"{tool} is not installed ({how})"
            if require_all():
                pytest.fail(f"{message}, and CI (HERMETIC_REQUIRE_ALL=1 or CI=true) runs every test", pytrace=False)
            pytest.skip(message)


@pytest.fixture
def index() -> Iterator[LoopbackIndex]:
    with serve_index() as idx:
        yield idx


@pytest.fixture
def hermetic(tmp_path: Path, index: LoopbackIndex) -> Hermetic:
    """hermetic on an empty root, with a HOME of its own and the loopback index as its only index."""
    return Hermetic(tmp_path / "root", hermetic_env(tmp_path / "home", extra={"PIP_INDEX_URL": index.simple_url}))


@pytest.fixture(scope="session")
def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scratch root whose CUDA toolchain is realized once for the whole session (pip's own index)."""
    root = tmp_path_factory.mktemp("shared") / "root"
    cli.run(root, "realize", REPO / "recipes" / "toolchain.toml", env=hermetic_env(pip="machine"), check=True)
    return root


@pytest.fixture(scope="session")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding the real clients, pip>=25.1 and uv (tests/support/clients.py)."""
    return make_client_venv(tmp_path_factory.mktemp("clients"))
