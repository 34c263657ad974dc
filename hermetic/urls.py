"""URL helpers shared by everything that prints or records a URL.

Index and cache URLs often carry credentials (``https://user:token@host/...``); PRODUCT.md forbids them in
logs and receipts, so every message and record passes its URLs through ``redact`` (or a whole text through
``redact_text``, for exception messages that quote a URL we did not format ourselves).
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit, urlunsplit

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
