"""Fetching locked wheels from a real loopback index, file:// indexes and find-links, with real wheels."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from packaging.tags import Tag

import hermetic.fetch.index
from hermetic.errors import BadInput, FetchFailed
from hermetic.fetch.download import Fetcher
from hermetic.fetch.index import Candidate, IndexClient, select
from hermetic.fetch.pipconfig import PipConfig
from hermetic.locks.types import LockedWheel
from hermetic.reporter import Reporter
from hermetic.urls import redact, redact_text
from tests.support.index import dead_url, serve_index
from tests.support.wheels import BuiltWheel, build_wheel

ANY = Tag("py3", "none", "any")
LINUX = Tag("cp311", "cp311", "manylinux_2_17_x86_64")
SECRET = "s3cr3t-t0ken"


@pytest.fixture(autouse=True)
def _loopback_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # A proxy from the environment would send loopback requests elsewhere; a netrc could add credentials.
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.fixture
def wheel(tmp_path: Path) -> BuiltWheel:
    return build_wheel(tmp_path / "wheels", "demo-pkg", "1.2.0", {"demo_pkg/__init__.py": "X = 1\n"})


def config(index: str | None = None, **kw: Any) -> PipConfig:
    kw.setdefault("retries", 1)
    kw.setdefault("timeout", 5.0)
    return PipConfig(index_url=index, **kw)


def locked(w: BuiltWheel, **kw: Any) -> LockedWheel:
    fields: dict[str, Any] = dict(name="demo-pkg", version=w.version, hashes=(w.sha256,), filename=None,
                                  url=None, path=None, size=None, where="manifests/demo.txt:3")
    fields.update(kw)
    return LockedWheel(**fields)


def fetcher(cfg: PipConfig, tmp_path: Path, **kw: Any) -> Fetcher:
    kw.setdefault("tags", [ANY])
    return Fetcher(cfg, tmp_path / "tmp", backoff=0.01, **kw)


def assert_fetched(got: Any, w: BuiltWheel, tmp_path: Path) -> None:
    assert got.path.parent == tmp_path / "tmp"
    assert got.path.read_bytes() == w.path.read_bytes()
    assert (got.sha256, got.size, got.filename) == (w.sha256, w.size, w.filename)


def leftovers(tmp_path: Path) -> list[Path]:
    return list((tmp_path / "tmp").iterdir()) if (tmp_path / "tmp").exists() else []


@pytest.mark.parametrize("accept", ["json", "html"])
def test_index_pages_json_and_html(tmp_path: Path, wheel: BuiltWheel, monkeypatch: pytest.MonkeyPatch,
                                   accept: str) -> None:
    if accept == "html":  # an index that only speaks PEP 503 answers HTML whatever we accept
        monkeypatch.setattr(hermetic.fetch.index, "ACCEPT", "text/html")
    with serve_index(wheel.path) as idx:
        cands = IndexClient(config(idx.simple_url), requests.Session()).candidates("Demo_Pkg")
        assert cands == [Candidate(f"{idx.url}/files/{wheel.filename}", wheel.filename, wheel.sha256,
                                   None, False)]
        got = fetcher(config(idx.simple_url), tmp_path).fetch(locked(wheel))
    assert_fetched(got, wheel, tmp_path)
    assert got.url == f"{idx.url}/files/{wheel.filename}"


def test_file_index_and_find_links(tmp_path: Path, wheel: BuiltWheel) -> None:
    other = build_wheel(tmp_path / "wheels", "other", "1.0", {"other.py": ""})
    simple = tmp_path / "simple" / "demo-pkg"
    simple.mkdir(parents=True)
    (simple / "index.html").write_text(
        f'<a href="../../wheels/{wheel.filename}#sha256={wheel.sha256}" data-yanked="">x</a>')
    cfg = config((tmp_path / "simple").as_uri())
    got = fetcher(cfg, tmp_path).fetch(locked(wheel))
    assert_fetched(got, wheel, tmp_path)
    [cand] = IndexClient(cfg, requests.Session()).candidates("demo-pkg")
    assert cand.yanked and cand.sha256 == wheel.sha256
    # find-links: a directory (path or file:// URL) and an HTML page listing files; no index at all
    page = tmp_path / "links.html"
    page.write_text(f'<a href="wheels/{other.filename}">o</a><a href="wheels/{wheel.filename}">w</a>')
    for link in (str(tmp_path / "wheels"), (tmp_path / "wheels").as_uri(), str(page)):
        cfg = config(None, no_index=True, find_links=(link,))
        got = fetcher(cfg, tmp_path).fetch(locked(wheel))
        assert_fetched(got, wheel, tmp_path)


def test_missing_local_locations_are_not_network_failures(tmp_path: Path, wheel: BuiltWheel) -> None:
    cfg = config(str(tmp_path / "nowhere"), find_links=(str(tmp_path / "gone"), str(wheel.path.parent)))
    assert_fetched(fetcher(cfg, tmp_path).fetch(locked(wheel)), wheel, tmp_path)
    cfg = config(str(tmp_path / "nowhere"))
    with pytest.raises(BadInput, match="nowhere \\(does not exist\\)"):
        fetcher(cfg, tmp_path).fetch(locked(wheel))


def test_file_index_as_plain_directory(tmp_path: Path) -> None:
    w = build_wheel(tmp_path / "simple" / "demo-pkg", "demo-pkg", "1.2.0", {"d.py": ""})
    got = fetcher(config(str(tmp_path / "simple")), tmp_path).fetch(locked(w))
    assert_fetched(got, w, tmp_path)


def test_wheel_chosen_by_tags(tmp_path: Path) -> None:
    files = {"demo_pkg/__init__.py": ""}
    built = [build_wheel(tmp_path / "wheels", "demo-pkg", "1.2.0", files, tag=t) for t in
             ("py3-none-any", "cp311-cp311-manylinux_2_17_x86_64", "cp312-cp312-win_amd64")]
    lock = locked(built[0], hashes=tuple(sorted(b.sha256 for b in built)))
    with serve_index(*(b.path for b in built)) as idx:
        cfg = config(idx.simple_url)
        assert fetcher(cfg, tmp_path, tags=[LINUX, ANY]).fetch(lock).filename == built[1].filename
        assert fetcher(cfg, tmp_path, tags=[ANY]).fetch(lock).filename == built[0].filename
        with pytest.raises(BadInput, match="no file for demo-pkg==1.2.0"):
            fetcher(cfg, tmp_path, tags=[Tag("cp39", "cp39", "macosx_11_0_arm64")]).fetch(lock)
        assert fetcher(cfg, tmp_path, tags=[]).fetch(
            locked(built[2], filename=built[2].filename)).filename == built[2].filename


def test_select_rules(wheel: BuiltWheel) -> None:
    good = Candidate("u1", wheel.filename, None, None, False)
    hashed = Candidate("u2", wheel.filename, wheel.sha256, None, False)
    wrong = Candidate("u3", wheel.filename, "f" * 64, None, False)
    yanked = Candidate("u4", wheel.filename, wheel.sha256, None, True)
    sdist = Candidate("u5", "demo_pkg-1.2.0.tar.gz", wheel.sha256, None, False)
    newer = Candidate("u6", "demo_pkg-1.3.0-py3-none-any.whl", None, None, False)
    got = select(locked(wheel), [good, wrong, yanked, sdist, newer, hashed], [ANY])
    assert got == [hashed, yanked, good]


def test_sha256_mismatch_is_bad_input_and_leaves_nothing(tmp_path: Path, wheel: BuiltWheel) -> None:
    wrong = "0" * 64
    with serve_index(wheel.path) as idx:
        url = f"{idx.url}/files/{wheel.filename}"
        with pytest.raises(BadInput) as err:
            fetcher(config(idx.simple_url), tmp_path).fetch(locked(wheel, hashes=(wrong,), url=url))
        text = err.value.render()
        assert err.value.exit_code == 2
        assert all(s in text for s in ("demo-pkg==1.2.0", "manifests/demo.txt:3", wrong, wheel.sha256))
        assert leftovers(tmp_path) == []
        # the index advertises the real hash, so nothing there can match the lock
        with pytest.raises(BadInput, match="matching the locked hashes.*127.0.0.1"):
            fetcher(config(idx.simple_url), tmp_path).fetch(locked(wheel, hashes=(wrong,)))
    # find-links advertises no hash: the file is downloaded, found different and removed
    cfg = config(None, no_index=True, find_links=(str(wheel.path.parent),))
    with pytest.raises(BadInput, match=wrong):
        fetcher(cfg, tmp_path).fetch(locked(wheel, hashes=(wrong,)))
    assert leftovers(tmp_path) == []


def test_size_mismatch_is_bad_input(tmp_path: Path, wheel: BuiltWheel) -> None:
    with serve_index(wheel.path) as idx:
        url = f"{idx.url}/files/{wheel.filename}"
        with pytest.raises(BadInput, match=f"is {wheel.size} bytes, the lock says {wheel.size + 1}") as err:
            fetcher(config(None, no_index=True), tmp_path).fetch(locked(wheel, url=url, size=wheel.size + 1))
    assert err.value.exit_code == 2 and leftovers(tmp_path) == []
    with pytest.raises(BadInput, match="the lock says"):
        fetcher(config(None, no_index=True), tmp_path).fetch(
            locked(wheel, path=wheel.path, size=wheel.size - 1))
    assert leftovers(tmp_path) == []


def test_local_path_and_missing_path(tmp_path: Path, wheel: BuiltWheel) -> None:
    before = wheel.path.read_bytes()
    got = fetcher(config(None, no_index=True), tmp_path).fetch(locked(wheel, path=wheel.path))
    assert_fetched(got, wheel, tmp_path)
    assert wheel.path.read_bytes() == before
    with pytest.raises(BadInput) as err:
        fetcher(config(None, no_index=True), tmp_path).fetch(locked(wheel, path=tmp_path / "missing.whl"))
    assert "manifests/demo.txt:3: demo-pkg==1.2.0: cannot read" in err.value.render()
    assert "missing.whl: No such file" in err.value.render()


def test_truncated_download_is_retried_then_fails(tmp_path: Path, wheel: BuiltWheel) -> None:
    with serve_index(wheel.path) as idx:
        idx.state.truncate_files = True
        url = f"{idx.url}/files/{wheel.filename}"
        with pytest.raises(FetchFailed) as err:
            fetcher(config(None, no_index=True, retries=2), tmp_path).fetch(locked(wheel, url=url))
        assert idx.state.requests.count(f"/files/{wheel.filename}") == 3
    assert err.value.exit_code == 1
    text = err.value.render()
    assert url in text and "truncated" in text and "3 attempts" in text and "hermetic import" in text
    assert leftovers(tmp_path) == []


def test_transient_503_then_success(tmp_path: Path, wheel: BuiltWheel) -> None:
    out = io.StringIO()
    reporter = Reporter(json_mode=True, stdout=out, stderr=io.StringIO())
    with serve_index(wheel.path) as idx:
        idx.state.fail_next = 2
        got = fetcher(config(idx.simple_url, retries=2), tmp_path, reporter=reporter).fetch(locked(wheel))
        assert idx.state.requests[:3] == ["/simple/demo-pkg/"] * 3
    assert_fetched(got, wheel, tmp_path)
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert sum(r["event"] == "fetch-retry" for r in records) == 2
    progress = [r for r in records if r["event"] == "progress"]
    assert progress[0]["total"] == wheel.size and progress[-1]["done"] == wheel.size
    assert progress[0]["unit"] == "bytes"


def test_unreachable_index_fails_fast_and_clearly(tmp_path: Path, wheel: BuiltWheel) -> None:
    dead = dead_url()
    start = time.monotonic()
    with pytest.raises(FetchFailed) as err:
        fetcher(config(dead, retries=1), tmp_path).fetch(locked(wheel))
    assert time.monotonic() - start < 5
    text = err.value.render()
    assert err.value.exit_code == 1
    assert dead in text and "Connection refused" in text and "PIP_INDEX_URL" in text
    assert "Traceback" not in text and leftovers(tmp_path) == []


def test_lock_index_is_searched_and_dead_index_tolerated(tmp_path: Path, wheel: BuiltWheel) -> None:
    with serve_index(wheel.path) as idx:
        got = fetcher(config(dead_url(), retries=0), tmp_path).fetch(locked(wheel, index=idx.simple_url))
    assert_fetched(got, wheel, tmp_path)


def test_credentials_never_appear_in_messages(tmp_path: Path, wheel: BuiltWheel) -> None:
    out, err_stream = io.StringIO(), io.StringIO()
    reporter = Reporter(json_mode=True, stdout=out, stderr=err_stream)
    dead = dead_url().replace("http://", f"http://user:{SECRET}@")
    with pytest.raises(FetchFailed) as err:
        fetcher(config(dead, retries=1), tmp_path, reporter=reporter).fetch(locked(wheel))
    assert SECRET not in err.value.render() and "***@127.0.0.1" in err.value.render()
    with serve_index(wheel.path) as idx:
        authed = idx.url.replace("http://", f"http://user:{SECRET}@")
        got = fetcher(config(authed + "/simple"), tmp_path, reporter=reporter).fetch(locked(wheel))
        assert SECRET not in got.url
        with pytest.raises(BadInput) as bad:
            fetcher(config(None, no_index=True), tmp_path).fetch(
                locked(wheel, hashes=("0" * 64,), url=f"{authed}/files/{wheel.filename}"))
        assert SECRET not in bad.value.render()
        with pytest.raises(BadInput) as bad:
            fetcher(config(authed + "/simple"), tmp_path).fetch(locked(wheel, hashes=("0" * 64,)))
        assert SECRET not in bad.value.render()
    assert SECRET not in out.getvalue() + err_stream.getvalue()


def test_redact() -> None:
    assert redact(f"https://u:{SECRET}@127.0.0.1:8/simple/") == "https://***@127.0.0.1:8/simple/"
    assert redact(f"https://{SECRET}@127.0.0.1/x") == "https://***@127.0.0.1/x"
    assert redact("http://127.0.0.1/x") == "http://127.0.0.1/x"
    assert redact_text(f"failed: http://a:{SECRET}@127.0.0.1/x and ftp://b:c@127.0.0.1") == \
        "failed: http://***@127.0.0.1/x and ftp://***@127.0.0.1"


def test_unlocked_hash_is_refused(tmp_path: Path, wheel: BuiltWheel) -> None:
    with pytest.raises(BadInput, match="no sha256 hash"):
        fetcher(config(None, no_index=True), tmp_path).fetch(locked(wheel, hashes=()))


def test_trusted_hosts_skip_tls_verification_only_there() -> None:
    from hermetic.fetch.session import verify_for
    cfg = config(None, trusted_hosts=("127.0.0.1", "localhost:8443"))
    assert verify_for("https://127.0.0.1:9/simple", cfg) is False
    assert verify_for("https://localhost:8443/simple", cfg) is False
    assert verify_for("https://localhost:9443/simple", cfg) is None  # None: the session's PIP_CERT setting
