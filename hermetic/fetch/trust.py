"""Which certificate authorities an HTTPS index must chain to: pip's rule (pip 24.2 and later), so that an index
behind a company CA that pip reaches is one hermetic reaches.

pip verifies through ``truststore``: the system's certificate store (on Linux OpenSSL's default verify paths,
so ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` or the distribution's bundle; the platform verifier on macOS and
Windows), with certifi's roots loaded into the same context. requests then loads its ``verify`` bundle into
that context for each connection: certifi again, or pip's ``cert`` (``PIP_CERT``), or ``REQUESTS_CA_BUNDLE``,
which are therefore trusted beside the system store, not instead of it. pip's ``use-deprecated =
legacy-certs`` leaves truststore out: requests' own verification with that bundle alone. This module does the
same with the same pieces (pip's network/session.py ``_SSLContextAdapterMixin`` and cli/index_command.py
``_create_truststore_ssl_context``). It imports requests: import it only where a session is made.
"""

from __future__ import annotations

import os
import ssl
from types import ModuleType
from typing import Any

import requests
from requests.adapters import DEFAULT_POOLBLOCK

from hermetic.fetch.pipconfig import PipConfig
from hermetic.fetch.watched import WatchedAdapter


def truststore_context() -> ssl.SSLContext | None:
    """The system store with certifi's roots beside it; None where truststore cannot be imported (pip then
    warns and verifies with certifi alone, and so does hermetic)."""
    truststore = _truststore()
    if truststore is None:
        return None
    import certifi
    ctx = truststore.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(certifi.where())
    return ctx


def _truststore() -> ModuleType | None:
    try:
        import truststore
    except ImportError:
        return None
    return truststore


class TrustAdapter(WatchedAdapter):
    """requests' adapter, verifying through ``ssl_context`` for direct and proxied connections alike (on
    watched connections: ``fetch.watched``)."""

    def __init__(self, ssl_context: ssl.SSLContext, **kwargs: Any) -> None:
        self._ssl_context = ssl_context
        super().__init__(**kwargs)

    def init_poolmanager(self, connections: int, maxsize: int, block: bool = DEFAULT_POOLBLOCK,
                         **pool_kwargs: Any) -> None:
        pool_kwargs.setdefault("ssl_context", self._ssl_context)
        super().init_poolmanager(connections, maxsize, block=block, **pool_kwargs)

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        # A proxy manager replaces the pool manager, and an HTTPS proxy has a TLS handshake of its own
        # (pip issues 13288 and 13465).
        proxy_kwargs.setdefault("ssl_context", self._ssl_context)
        proxy_kwargs.setdefault("proxy_ssl_context", self._ssl_context)
        return super().proxy_manager_for(proxy, **proxy_kwargs)


def mount(session: requests.Session, config: PipConfig) -> None:
    """Give ``session`` pip's trust: truststore for HTTPS unless ``legacy-certs`` is set.

    pip's trusted-host hosts get a plain adapter of their own: urllib3 sets the verify mode of the context it
    is handed on every connection, so a shared context cannot serve both verified and unverified hosts.
    """
    ctx = None if config.legacy_certs else truststore_context()
    if ctx is None:
        return
    session.mount("https://", TrustAdapter(ctx))
    unverified = WatchedAdapter()
    for host in config.trusted_hosts:
        netloc = f"[{host}]" if host.count(":") > 1 and not host.startswith("[") else host
        session.mount(f"https://{netloc}/", unverified)
        if not netloc.rsplit("]", 1)[-1].count(":"):  # no port given: every port of that host, as in pip
            session.mount(f"https://{netloc}:", unverified)


def description(config: PipConfig) -> str:
    """What a failed verification was checked against, for the error message."""
    # requests takes these over `cert` when set, as in pip (whose requests is the same)
    bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or config.cert
    if config.legacy_certs:
        return f"{bundle or 'certifi'} alone (pip's use-deprecated = legacy-certs is set)"
    if _truststore() is None:
        return f"{bundle or 'certifi'} alone (truststore, for the system store, cannot be imported)"
    return "the system's certificate store and certifi" + (f" and {bundle}" if bundle else "")
