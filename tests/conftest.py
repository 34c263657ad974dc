"""Shared fixtures: a loopback index of real wheels, hermetic on a scratch root, a session-wide toolchain.

Helpers live in tests/support: ``cli`` (the one way to run hermetic), ``recipes`` (the one recipe template,
test wheels and locks), ``trees`` (listings of trees and stores), and one module per kind of fixture.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from tests.support import cli
from tests.support.cli import REPO, Hermetic, hermetic_env
from tests.support.clients import make_client_venv
from tests.support.index import LoopbackIndex, serve_index

# Everything the tests and the tools they run write stays in the repository's ignored .cache/ (README): pytest's
# temp folders (a folder per session under .cache/pytest: a green session removes its own, the next session
# those of sessions no longer running, so that two sessions in one checkout never delete each other's), the
# temp files of the tests and of every process they start (TMPDIR: torch's Inductor, pip, openssl), and the
# caches a tool keeps in the home folder otherwise (matplotlib's font cache and config, pip's and uv's caches,
# torch's, triton's, CUDA's compute cache). hermetic's own children get the root's; these are for the rest.
CACHE = REPO / ".cache"
SESSIONS = CACHE / "pytest"
CONTAINED = {"TMPDIR": CACHE / "tmp", "MPLCONFIGDIR": CACHE / "matplotlib", "XDG_CACHE_HOME": CACHE / "xdg-cache",
             "TRITON_CACHE_DIR": CACHE / "triton", "CUDA_CACHE_PATH": CACHE / "nv"}
for _key, _folder in CONTAINED.items():
    _folder.mkdir(parents=True, exist_ok=True)
    os.environ[_key] = str(_folder)

_OURS = pytest.StashKey[Path]()


def _remove(folder: Path) -> None:
    """A session's temp folder, whose stores hold read-only folders (hermetic's own removal: any mode, any depth,
    a test's planted tree of 3000 nested folders among them)."""
    from hermetic import fs
    with contextlib.suppress(OSError):
        fs.remove_tree(folder)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """This session's temp folders under .cache/pytest/session-PID unless --basetemp names others (set before
    pytest's tmpdir plugin reads the option); those of sessions that ended are removed."""
    if config.option.basetemp is not None:
        return
    SESSIONS.mkdir(parents=True, exist_ok=True)
    for old in SESSIONS.glob("session-*"):
        pid = old.name.removeprefix("session-")
        if not (pid.isdigit() and _running(int(pid))):
            _remove(old)
    mine = SESSIONS / f"session-{os.getpid()}"
    config.option.basetemp = str(mine)
    config.stash[_OURS] = mine


_PASSED = pytest.StashKey[dict[str, bool]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Each phase's outcome, for ``_passed_tests_leave_no_temp_folder``."""
    report = yield
    item.stash.setdefault(_PASSED, {})[report.when] = report.passed
    return report


@pytest.fixture(autouse=True)
def _passed_tests_leave_no_temp_folder(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that passed has its ``tmp_path`` removed as soon as it ends (after every other fixture of it, its
    servers and children among them), not when the session ends: the suite's roots (a toolchain is 400 MB) would
    otherwise pile up to about 15 GB on one disk, and a machine with less free than that fails every test after
    the disk fills. A failed test's folder stays for its reader, as pytest keeps it."""
    if "tmp_path" not in request.fixturenames:
        yield
        return
    path: Path = request.getfixturevalue("tmp_path")
    yield
    if all(request.node.stash.get(_PASSED, {}).values()):
        _remove(path)


_MADE_BY: dict[int, list[Path]] = {}


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[object],
                         request: pytest.FixtureRequest) -> Generator[None, object, object]:
    """The temp folders a module's fixture makes (its roots: up to 3.8 GB for test_remote's) are noted, to be
    removed when it is torn down at the module's end; a session's fixtures (the shared toolchain) stay. The
    fixtures it depends on are set up before this hook runs, so their folders are not counted as its."""
    if fixturedef.scope not in ("module", "class", "package"):
        return (yield)
    base = request.config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    before = set(base.iterdir())
    try:
        return (yield)
    finally:
        _MADE_BY[id(fixturedef)] = [path for path in base.iterdir() if path not in before]


def pytest_fixture_post_finalizer(fixturedef: pytest.FixtureDef[object], request: pytest.FixtureRequest) -> None:
    """A module's fixture torn down takes its temp folders with it, unless a test of the session has failed (its
    reader may want them)."""
    made = _MADE_BY.pop(id(fixturedef), [])
    if request.session.testsfailed == 0:
        for path in made:
            if path.is_symlink():
                path.unlink()
            else:
                _remove(path)


# The suite's own peak on the disk of .cache/ (the venv apart): 4.2 GB as .ci/run measured it (README,
# docs/measurements/ci-durations.md), with a margin; the header says it beside what is free, and the summary says
# when the disk came near full while the tests ran
PEAK_GIB = 5
_lowest_free = [1 << 62]


def _free() -> int:
    return shutil.disk_usage(CACHE).free


def pytest_report_header(config: pytest.Config) -> str:
    return f"hermetic's tests: {_free() / 2**30:.1f} GiB free on the disk of {CACHE}; they need about {PEAK_GIB} GiB"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "teardown":
        _lowest_free[0] = min(_lowest_free[0], _free())


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The lowest free space seen after a test, said always (-q hides the header); in red, with what it may
    mean, below 1 GiB."""
    lowest = _lowest_free[0]
    if lowest == 1 << 62:
        return
    full = lowest < 1 << 30
    terminalreporter.write_line(
        f"hermetic's tests: the disk of {CACHE} had {lowest / 2**30:.1f} GiB free at its fullest"
        + (f"; errors from when it came near full may be a full disk, not the code (the tests need about "
           f"{PEAK_GIB} GiB)" if full else ""), red=full)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A green session leaves no temp folders behind."""
    mine = session.config.stash.get(_OURS, None)
    if exitstatus == 0 and mine is not None and mine.is_dir():
        _remove(mine)


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
