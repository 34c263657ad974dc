"""Who vouches for what the store takes from elsewhere, as Nix's signed substitutes: ed25519 keys.

Some records can be re-derived from what they hold: a blob is named by its bytes' sha256, a content-addressed
tree by its files and links. Others cannot: an object record says which compiled bytes a compile's key gets, a
module record which linked library, an unpacked wheel's record which files a wheel holds (the wheel is not in
an archive), a source tree which files its recipe's archive and patches give. Those come into a store only
under a signature by a key this machine trusts (``HERMETIC_TRUSTED_KEYS``: ``:``-separated public key files),
or where the user says so (``import --trust-unsigned``), which the import's receipt records.

Keys are files of one line, as Nix writes them: ``NAME:BASE64``; the secret key file holds the 32-byte seed and
the public key (64 bytes), the public one (``PATH.pub``) the 32-byte public key. ``hermetic key generate PATH``
writes both. What is signed starts with a domain line, so that a signature made for one purpose (an archive's
manifest, a remote cache's action entry) is never valid for another. ``cryptography`` is imported inside the
functions that sign or verify: no command that neither signs nor verifies pays for it.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermetic import fs
from hermetic.errors import BadInput

ENV_TRUSTED = "HERMETIC_TRUSTED_KEYS"
ENV_SIGNING = "HERMETIC_SIGNING_KEY"      # a secret key file: action entries a read-write remote client writes
ARCHIVE_DOMAIN = b"hermetic-archive-manifest-v1\n"
REMOTE_DOMAIN = b"hermetic-remote-action-entry-v1\n"
_NAME = re.compile(r"^[A-Za-z0-9._+-]{1,80}$")
MAX_SIGNATURES = 16
KEY_HINT = "make a key pair with `hermetic key generate PATH` (PATH is the secret key, PATH.pub the public one)"


@dataclass(frozen=True)
class PublicKey:
    name: str
    raw: bytes          # 32 bytes
    path: str = ""

    def line(self) -> str:
        return f"{self.name}:{base64.b64encode(self.raw).decode()}\n"

    def verifies(self, message: bytes, signature: str) -> bool:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
        try:
            sig = base64.b64decode(signature, validate=True)
            Ed25519PublicKey.from_public_bytes(self.raw).verify(sig, message)
        except (InvalidSignature, binascii.Error, ValueError, TypeError):
            return False
        return True


@dataclass(frozen=True)
class SecretKey:
    name: str
    seed: bytes         # 32 bytes
    public: PublicKey

    def sign(self, message: bytes) -> dict[str, str]:
        """``{"key": NAME, "sig": BASE64}``: the form archives and action entries carry."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        sig = Ed25519PrivateKey.from_private_bytes(self.seed).sign(message)
        return {"key": self.name, "sig": base64.b64encode(sig).decode()}


def generate(path: Path, name: str | None = None) -> tuple[Path, Path]:
    """A new key pair: ``path`` (the secret key, 0600) and ``path.pub``; an existing file is never replaced."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    name = name or path.name.removesuffix(".key").removesuffix(".secret")
    if not _NAME.match(name):
        raise BadInput(f"key name {name!r} is not 1-80 letters, digits or ._+-", where=str(path),
                       hint="choose one with --name")
    pub_path = path.with_name(path.name + ".pub")
    for p in (path, pub_path):
        if os.path.lexists(p):
            raise BadInput("a file is there already: hermetic never replaces a key file", where=str(p),
                           hint="choose another PATH, or remove the old key first")
    key = Ed25519PrivateKey.generate()
    seed = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                             serialization.NoEncryption())
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    fs.atomic_write(path, f"{name}:{base64.b64encode(seed + raw).decode()}\n".encode(), mode=0o600)
    fs.atomic_write(pub_path, PublicKey(name, raw).line().encode(), mode=0o644)
    return path, pub_path


def _read_line(path: Path, what: str) -> tuple[str, bytes]:
    try:
        text = fs.read_regular(path, 4096).decode("ascii").strip()
    except FileNotFoundError:
        raise BadInput(f"{what} {path} does not exist", where=str(path), hint=KEY_HINT) from None
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise BadInput(f"{what} {path} cannot be read: {e}", where=str(path), hint=KEY_HINT) from None
    name, _, data = text.partition(":")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if not _NAME.match(name) or "\n" in text:
        raw = b""
    return name, raw


def load_secret(path: Path) -> SecretKey:
    name, raw = _read_line(path, "the secret key")
    if len(raw) != 64:
        raise BadInput(f"{path} is not a hermetic secret key (NAME:BASE64 of 64 bytes)", where=str(path),
                       hint=KEY_HINT)
    return SecretKey(name, raw[:32], PublicKey(name, raw[32:], str(path)))


def load_public(path: Path) -> PublicKey:
    name, raw = _read_line(path, "the public key")
    if len(raw) != 32:
        raise BadInput(f"{path} is not a hermetic public key (NAME:BASE64 of 32 bytes)", where=str(path),
                       hint=KEY_HINT)
    return PublicKey(name, raw, str(path))


def trusted_keys(environ: Mapping[str, str] | None = None) -> list[PublicKey]:
    """The public keys this machine trusts: the files ``HERMETIC_TRUSTED_KEYS`` names (``:``-separated)."""
    env = os.environ if environ is None else environ
    return load_trusted(env.get(ENV_TRUSTED), ENV_TRUSTED)


def load_trusted(paths: str | None, where: str) -> list[PublicKey]:
    """The public keys of ``paths`` (``:``-separated files), as a setting (hermetic.config's ``trusted_keys``,
    from ``where``: the environment or a hermetic.toml) names them."""
    keys = []
    for part in (paths or "").split(":"):
        if part.strip():
            try:
                keys.append(load_public(Path(part.strip())))
            except BadInput as e:
                raise BadInput(e.what, where=where, hint=e.hint) from None
    return keys


def signing_key(environ: Mapping[str, str] | None = None) -> SecretKey | None:
    """The secret key a writer signs its remote cache entries with (``HERMETIC_SIGNING_KEY``), if any."""
    env = os.environ if environ is None else environ
    path = (env.get(ENV_SIGNING) or "").strip()
    if not path:
        return None
    try:
        return load_secret(Path(path))
    except BadInput as e:
        raise BadInput(e.what, where=ENV_SIGNING, hint=e.hint) from None


# archives --------------------------------------------------------------------------------------------------------
def manifest_message(manifest: Mapping[str, Any]) -> bytes:
    """What an archive's signature covers: its manifest without the signatures, which names every member by
    sha256 (records, roots) or by content (blobs, with their sizes)."""
    return ARCHIVE_DOMAIN + fs.canonical_json({k: v for k, v in manifest.items() if k != "signatures"})


def signatures_of(manifest: Mapping[str, Any]) -> list[dict[str, str]]:
    sigs = manifest.get("signatures", [])
    if not (isinstance(sigs, list) and all(isinstance(s, dict) and isinstance(s.get("key"), str)
                                           and isinstance(s.get("sig"), str) for s in sigs)):
        raise ValueError("its signatures are not a list of {key, sig}")
    if len(sigs) > MAX_SIGNATURES:  # each one a trusted key's name costs a verification
        raise ValueError(f"it carries {len(sigs)} signatures, more than {MAX_SIGNATURES}")
    return sigs


def trusted_signer(message: bytes, signatures: Iterable[Mapping[str, str]],
                   keys: Iterable[PublicKey]) -> tuple[str | None, list[str]]:
    """(the name of a trusted key whose signature verifies, or None; the names of trusted keys whose signature
    does not verify: the signed bytes were changed)."""
    by_name: dict[str, list[PublicKey]] = {}
    for k in keys:
        by_name.setdefault(k.name, []).append(k)
    broken = []
    for sig in signatures:
        candidates = by_name.get(sig["key"], [])
        if any(k.verifies(message, sig["sig"]) for k in candidates):
            return sig["key"], []
        if candidates:
            broken.append(sig["key"])
    return None, broken


def action_entry_message(key: str, data: bytes) -> bytes:
    """What a remote cache entry's signature covers: the action key and the sha256 of the entry's bytes."""
    return REMOTE_DOMAIN + fs.canonical_json({"ac": key, "sha256": fs.sha256_bytes(data)})
