"""Which CAs an HTTPS index must chain to (hermetic.fetch.trust): pip's rule, checked through a loopback HTTPS
index whose CA is made by the test and placed only in a system-style store (OpenSSL's default verify paths,
SSL_CERT_FILE and SSL_CERT_DIR, which is what truststore reads on Linux), and against pip itself.
"""

from __future__ import annotations

import os
import ssl
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.tags import Tag

from hermetic.errors import FetchFailed
from hermetic.fetch.download import Fetcher
from hermetic.fetch.pipconfig import PipConfig
from hermetic.locks.types import LockedWheel
from tests.support.cli import Hermetic, hermetic_env
from tests.support.clients import isolated_env, run
from tests.support.index import LoopbackIndex, serve_index
from tests.support.recipes import pip_lock_line, write_recipe
from tests.support.tls import Pki, connect_proxy, make_pki
from tests.support.wheels import BuiltWheel, build_wheel

# requests adds these bundles to whatever else is trusted (and alone under legacy-certs): not in these tests
_BUNDLE_VARS = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")


@pytest.fixture
def wheel(tmp_path: Path) -> BuiltWheel:
    return build_wheel(tmp_path / "wheels", "demo-pkg", "1.2.0", {"demo_pkg/__init__.py": "X = 1\n"})


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


@pytest.fixture
def https_index(wheel: BuiltWheel, pki: Pki) -> Iterator[LoopbackIndex]:
    with serve_index(wheel.path, tls=pki) as idx:
        yield idx


def system_store(tmp_path: Path, *cas: Path) -> dict[str, str]:
    """A system-style store holding ``cas`` alone: a bundle file and an empty hashed-certs folder."""
    store = tmp_path / "system-store"
    (store / "certs").mkdir(parents=True, exist_ok=True)
    (store / "cert.pem").write_text("".join(ca.read_text() for ca in cas))
    return {"SSL_CERT_FILE": str(store / "cert.pem"), "SSL_CERT_DIR": str(store / "certs")}


def tls_env(tmp_path: Path, index: LoopbackIndex, store: dict[str, str], **pip: str) -> dict[str, str]:
    env = hermetic_env(tmp_path / "home", extra={"PIP_INDEX_URL": index.simple_url, "NO_PROXY": "127.0.0.1",
                                                 **store, **pip})
    return {k: v for k, v in env.items() if k not in _BUNDLE_VARS}


@pytest.mark.parametrize("via", ["cryptography", "openssl"])
def test_the_test_ca_signs_a_certificate_python_verifies(tmp_path: Path, wheel: BuiltWheel, via: str) -> None:
    pki = make_pki(tmp_path / via, via=via)
    with serve_index(wheel.path, tls=pki) as idx:
        trusting = ssl.create_default_context(cafile=pki.ca)
        with urllib.request.urlopen(idx.simple_url + "/demo-pkg/", context=trusting, timeout=10) as page:
            assert wheel.filename in page.read().decode()
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            urllib.request.urlopen(idx.simple_url + "/demo-pkg/", context=ssl.create_default_context(
                cafile=make_pki(tmp_path / "other", via=via).ca), timeout=10)


def test_system_store_is_trusted_and_legacy_certs_is_certifi_alone(
        tmp_path: Path, wheel: BuiltWheel, pki: Pki, https_index: LoopbackIndex) -> None:
    recipe = write_recipe(tmp_path / "r", "tls", pip_lock_line(wheel))
    store = system_store(tmp_path, pki.ca)

    h = Hermetic(tmp_path / "root", tls_env(tmp_path, https_index, store))
    done = h("--json", "realize", recipe)
    assert done.rc == 0, done.err
    assert f"/files/{wheel.filename}" in https_index.state.requests
    assert (h.root / "profiles" / "tls" / "demo_pkg" / "__init__.py").read_text() == "X = 1\n"

    # pip's --use-deprecated=legacy-certs, from the environment and from pip.conf: certifi alone
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nuse-deprecated = legacy-certs\n")
    for legacy in ({"PIP_USE_DEPRECATED": "legacy-certs"}, {"PIP_CONFIG_FILE": str(conf)}):
        failed = Hermetic(tmp_path / "root-legacy", tls_env(tmp_path, https_index, store, **legacy))("realize",
                                                                                                  recipe)
        host = https_index.url.removeprefix("https://")
        assert failed.rc == 1, failed.err
        assert f"the certificate of {host} is not trusted" in failed.err, failed.err
        assert "certificate verify failed" in failed.err and "legacy-certs" in failed.err, failed.err
        assert "Traceback" not in failed.err and not (tmp_path / "root-legacy" / "profiles" / "tls").exists()

    # legacy-certs still honours cert (PIP_CERT); without legacy-certs a cert is trusted beside the system store
    for n, env in enumerate(({"PIP_USE_DEPRECATED": "legacy-certs", "PIP_CERT": str(pki.ca)},
                             {"PIP_CERT": str(make_pki(tmp_path / "other").ca)})):
        again = Hermetic(tmp_path / f"root-cert{n}", tls_env(tmp_path, https_index, store, **env))("realize",
                                                                                                  recipe)
        assert again.rc == 0, again.err


def _fetch(cfg: PipConfig, tmp_path: Path, wheel: BuiltWheel) -> None:
    fetcher = Fetcher(cfg, tmp_path / "tmp", tags=[Tag("py3", "none", "any")], backoff=0.01)
    with fetcher:
        got = fetcher.fetch(LockedWheel("demo-pkg", "1.2.0", (wheel.sha256,), None, None, None, None, "x:1"))
    assert got.sha256 == wheel.sha256


def test_trusted_host_skips_verification_there_only(tmp_path: Path, wheel: BuiltWheel,
                                                    https_index: LoopbackIndex,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # The CA is trusted nowhere; the shared truststore context must not be switched off for other hosts.
    for var, value in system_store(tmp_path, make_pki(tmp_path / "other").ca).items():
        monkeypatch.setenv(var, value)
    for var in _BUNDLE_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    for trusted in (("127.0.0.1",), (f"127.0.0.1:{https_index.url.rsplit(':', 1)[1]}",)):
        _fetch(PipConfig(https_index.simple_url, trusted_hosts=trusted, retries=0, timeout=5.0), tmp_path, wheel)
    for trusted in ((), ("localhost",), ("127.0.0.1:1",)):
        with pytest.raises(FetchFailed, match="not trusted"):
            _fetch(PipConfig(https_index.simple_url, trusted_hosts=trusted, retries=0, timeout=5.0), tmp_path,
                   wheel)


def test_a_proxied_connection_trusts_the_system_store_too(tmp_path: Path, wheel: BuiltWheel,
                                                          https_index: LoopbackIndex, pki: Pki,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # A proxy manager replaces requests' pool manager: the truststore context must reach it too (pip 13288)
    for var, value in system_store(tmp_path, pki.ca).items():
        monkeypatch.setenv(var, value)
    for var in _BUNDLE_VARS:
        monkeypatch.delenv(var, raising=False)
    with connect_proxy() as (proxy, tunnels):
        _fetch(PipConfig(https_index.simple_url, proxy=proxy, retries=0, timeout=5.0), tmp_path, wheel)
        assert tunnels and set(tunnels) == {https_index.url.removeprefix("https://")}
        with pytest.raises(FetchFailed, match="legacy-certs"):
            _fetch(PipConfig(https_index.simple_url, proxy=proxy, retries=0, timeout=5.0,
                             use_deprecated=("legacy-certs",)), tmp_path, wheel)


def test_pip_agrees(client_venv: Path, tmp_path: Path, wheel: BuiltWheel, pki: Pki,
                    https_index: LoopbackIndex) -> None:
    """pip itself (>= 25.1) reaches the index exactly when hermetic does, setting by setting."""
    recipe = write_recipe(tmp_path / "r", "tls", pip_lock_line(wheel))
    other = make_pki(tmp_path / "other").ca
    cases = [  # (system store, pip settings, reachable)
        ((pki.ca,), {}, True),
        ((other,), {}, False),
        ((pki.ca,), {"PIP_USE_DEPRECATED": "legacy-certs"}, False),
        ((other,), {"PIP_USE_DEPRECATED": "legacy-certs", "PIP_CERT": str(pki.ca)}, True),
        ((pki.ca,), {"PIP_CERT": str(other)}, True),
        ((other,), {"PIP_CERT": str(pki.ca)}, True),
        ((other,), {"PIP_TRUSTED_HOST": "127.0.0.1"}, True),
    ]
    for n, (cas, settings, reachable) in enumerate(cases):
        store = system_store(tmp_path / f"case{n}", *cas)
        env = tls_env(tmp_path, https_index, store, **settings)
        pip_env = {**isolated_env(tmp_path / f"pip{n}"), "PIP_CONFIG_FILE": os.devnull, "NO_PROXY": "127.0.0.1",
                   "PIP_INDEX_URL": https_index.simple_url, "PIP_RETRIES": "0", **store, **settings}
        pip_env = {k: v for k, v in pip_env.items() if k not in _BUNDLE_VARS}
        pip = run([str(client_venv / "bin/python"), "-m", "pip", "download", "--no-deps", "--no-cache-dir",
                   "--disable-pip-version-check", "-d", str(tmp_path / f"pip{n}" / "out"),
                   f"demo-pkg=={wheel.version}"], pip_env)
        ours = Hermetic(tmp_path / f"root{n}", env)("realize", recipe)
        assert (pip.returncode == 0, ours.rc == 0) == (reachable, reachable), (n, pip.stderr[-2000:], ours.err)
        assert ours.rc in (0, 1), ours.err
