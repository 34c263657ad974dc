"""Signed action entries (issue 34, item 2): a writer with HERMETIC_SIGNING_KEY signs each action entry it
writes, in a sidecar entry of its own (an ActionResult naming one CAS blob), so the server stays a plain Bazel
HTTP cache; a reader with HERMETIC_TRUSTED_KEYS takes an entry only under a trusted signature. An unsigned
entry, or one whose files were replaced after signing (the planted module of a writer who is not trusted), is a
miss with a warning.

A real nginx with WebDAV (remote/nginx.conf), real HTTP, the real store, ``remote.layout.Sharing``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import zstandard

from hermetic.remote.actionresult import OutputFile, decode_action_result
from hermetic.remote.bazel import open_storage
from hermetic.remote.layout import SIGNATURE, Sharing, module_key, signature_key
from hermetic.remote.settings import RemoteOptions, resolve_settings
from hermetic.reporter import Reporter
from hermetic.store import Store, provenance
from tests.support.nginx import Nginx, nginx_binary

pytestmark = pytest.mark.needs("nginx", nginx_binary() is not None,
                               "apt-get install nginx-light; tools/install-test-deps installs it")
KEY = "0" * 64     # a module's store key (any string: module_key hashes it)
FILE = "m.cpython-311-x86_64-linux-gnu.so"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Nginx]:
    s = Nginx(tmp_path / "server")
    s.start()
    try:
        yield s
    finally:
        s.stop()


def _keys(folder: Path, name: str) -> tuple[provenance.SecretKey, provenance.PublicKey]:
    secret, public = provenance.generate(folder / name)
    return provenance.load_secret(secret), provenance.load_public(public)


def _sharing(url: str, store: Path, *, trusted: list[provenance.PublicKey] | None = None,
             signer: provenance.SecretKey | None = None, mode: str = "ro") -> Sharing:
    settings = resolve_settings(RemoteOptions(url, mode), {})
    assert settings is not None
    return Sharing(open_storage(settings, Reporter(quiet=True)), Store(store).open(), trusted=trusted or [],
                   signer=signer, from_environment=False)


def _module(store: Sharing, text: bytes) -> tuple[str, str]:
    """A module's bytes and the certificate that certifies them, as blobs of ``store``."""
    so = store.store.put_blob_bytes(b"\x7fELF" + text)
    cert = store.store.put_blob_bytes(zstandard.ZstdCompressor().compress(json.dumps({"module_sha256": so}).encode()))
    return so, cert


def test_a_signed_module_entry_is_taken_only_where_its_key_is_trusted(
        tmp_path: Path, server: Nginx, capsys: pytest.CaptureFixture[str]) -> None:
    builder, builder_pub = _keys(tmp_path / "keys", "ci")
    _stranger, stranger_pub = _keys(tmp_path / "keys", "stranger")
    writer = _sharing(server.writer_url, tmp_path / "w", signer=builder, mode="rw")
    so, cert = _module(writer, b"honest")
    writer.upload_module(KEY, FILE, so, cert)
    assert writer.counts["modules_uploaded"] == 1 and writer.counts["entries_signed"] == 1
    # the sidecar is a plain ActionResult naming one blob the server has: any Bazel HTTP cache keeps it
    sidecar = decode_action_result(server.path("ac", signature_key(module_key(KEY))).read_bytes())
    assert [f.path for f in sidecar] == [SIGNATURE] and server.path("cas", sidecar[0].digest).exists()

    trusting = _sharing(server.url, tmp_path / "r1", trusted=[stranger_pub, builder_pub])
    assert trusting.fetch_module(KEY, FILE) == (so, cert)
    stranger = _sharing(server.url, tmp_path / "r2", trusted=[stranger_pub])
    assert stranger.fetch_module(KEY, FILE) is None and stranger.counts["unsigned_ignored"] == 1
    assert "signed by ci, which HERMETIC_TRUSTED_KEYS does not name" in capsys.readouterr().err
    # no key configured: the cache is trusted as it was before signatures
    assert _sharing(server.url, tmp_path / "r3").fetch_module(KEY, FILE) == (so, cert)


def test_a_module_planted_over_a_signed_entry_is_a_miss(tmp_path: Path, server: Nginx,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Someone with write access but no trusted key replaces the entry with another module and its own
    certificate. Before signatures every reader took it; a reader that trusts the builder's key now sees that
    the signature no longer covers the entry."""
    builder, builder_pub = _keys(tmp_path / "keys", "ci")
    writer = _sharing(server.writer_url, tmp_path / "w", signer=builder, mode="rw")
    writer.upload_module(KEY, FILE, *_module(writer, b"honest"))
    attacker = _sharing(server.writer_url, tmp_path / "a", mode="rw")
    so, cert = _module(attacker, b"planted")
    assert attacker.remote.put_cas_file(so, attacker.store.blob_path(so))
    assert attacker.remote.put_cas_file(cert, attacker.store.blob_path(cert))
    size = attacker.store.blob_path
    assert attacker.remote.put_ac(module_key(KEY), [
        OutputFile(f"module/{FILE}", so, size(so).stat().st_size),
        OutputFile("certificate.json.zst", cert, size(cert).stat().st_size)])
    reader = _sharing(server.url, tmp_path / "r", trusted=[builder_pub])
    assert reader.fetch_module(KEY, FILE) is None
    assert "its signature by ci does not cover what it holds now" in capsys.readouterr().err
    assert not reader.store.has_blob(so)
    # what every reader got before signatures: the planted module, its certificate certifying it
    assert _sharing(server.url, tmp_path / "r0").fetch_module(KEY, FILE) == (so, cert)


def test_an_unsigned_entry_is_a_miss_where_keys_are_trusted_and_a_signer_replaces_it(
        tmp_path: Path, server: Nginx, capsys: pytest.CaptureFixture[str]) -> None:
    builder, builder_pub = _keys(tmp_path / "keys", "ci")
    old = _sharing(server.writer_url, tmp_path / "old", mode="rw")   # a writer from before signatures
    old.upload_module(KEY, FILE, *_module(old, b"old"))
    reader = _sharing(server.url, tmp_path / "r1", trusted=[builder_pub])
    assert reader.fetch_module(KEY, FILE) is None
    assert "it is signed by no key; ignoring it" in capsys.readouterr().err
    signer = _sharing(server.writer_url, tmp_path / "w", signer=builder, trusted=[builder_pub], mode="rw")
    so, cert = _module(signer, b"signed")
    signer.upload_module(KEY, FILE, so, cert)
    assert _sharing(server.url, tmp_path / "r2", trusted=[builder_pub]).fetch_module(KEY, FILE) == (so, cert)
