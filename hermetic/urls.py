"""URL helpers shared by everything that prints or records a URL.

Index and cache URLs often carry credentials (``https://user:token@host/...``); PRODUCT.md forbids them in
logs and receipts, so every message and record passes its URLs through ``redact`` (or a whole text through
``redact_text``, for exception messages that quote a URL we did not format ourselves).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

from hermetic.errors import BadInput

# scheme://userinfo@ : userinfo may hold a bare token as the "user", so all of it goes.
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/\s@?#]+)@")


def remote_in_environment() -> bool:
    """Whether any HERMETIC_REMOTE_CACHE* variable is set: only then is the remote module worth importing."""
    return any(k.startswith("HERMETIC_REMOTE_CACHE") for k in os.environ)


def redact(url: str) -> str:
    """``url`` with any ``user:password@`` replaced by ``***@``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact_text(url)
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"***@{host}"))


def redact_text(text: str) -> str:
    """``text`` with the credentials of every URL in it replaced by ``***``."""
    return _USERINFO.sub(lambda m: f"{m.group('scheme')}***@", text)


def same_origin(a: str, b: str) -> bool:
    """Whether two URLs address the same scheme, host and port (credentials aside)."""
    pa, pb = urlsplit(a), urlsplit(b)
    return (pa.scheme, pa.hostname, pa.port) == (pb.scheme, pb.hostname, pb.port)


def file_url_path(url: str, where: str) -> Path:
    """The local path a ``file:`` URL names, percent-decoded as pip decodes it (``%20`` is a space):
    ``file:///p`` and ``file://localhost/p``. One naming another host is bad input (its path is not ours)."""
    parts = urlsplit(url)
    if parts.netloc.lower() not in ("", "localhost"):
        raise BadInput(f"unsupported URL {redact(url)!r}: a file: URL of another host ({parts.hostname})",
                       where=where, hint="give a file:/// URL of this machine, an http(s) URL or a local path")
    return Path(unquote(parts.path))  # urllib.request.url2pathname on POSIX, without importing urllib.request


def split_credentials(url: str, where: str) -> tuple[str, tuple[str, str] | None]:
    """(the URL without userinfo and without a trailing slash, (user, password) or None)."""
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise BadInput(f"the remote cache URL {redact_text(url)!r} cannot be parsed", where=where,
                       hint="for example https://cache.example/hermetic") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadInput(f"the remote cache URL {redact(url)!r} is not an http(s) URL", where=where,
                       hint="for example https://cache.example/hermetic (the folder holding ac/ and cas/)")
    if parts.query or parts.fragment:
        shown = redact(urlunsplit(parts._replace(query="", fragment="")))   # a ?token= is never printed
        raise BadInput(f"the remote cache URL {shown!r} has a query or fragment (not shown)", where=where,
                       hint="give the base folder only: hermetic appends /ac/<key> and /cas/<sha256>")
    auth = None
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, netloc = netloc.rsplit("@", 1)
        user, _, password = userinfo.partition(":")
        auth = (unquote(user), unquote(password))
    return urlunsplit(parts._replace(netloc=netloc, path=parts.path.rstrip("/"))), auth
