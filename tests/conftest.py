"""Shared fixtures: a loopback index of real wheels, hermetic on a scratch root, a session-wide toolchain.

Helpers live in tests/support: ``cli`` (the one way to run hermetic), ``recipes`` (the one recipe template,
test wheels and locks), ``trees`` (listings of trees and stores), and one module per kind of fixture.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import cli
from tests.support.cli import REPO, Hermetic, hermetic_env
from tests.support.clients import make_client_venv
from tests.support.index import LoopbackIndex, serve_index


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
