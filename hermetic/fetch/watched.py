"""Connections that report themselves to their transfer's watchdog (``fetch.watchdog.Watchdog``).

A per-read timeout never trips on a server that sends a byte every few seconds, and a deadline checked between
body pieces never runs while http.client is still reading the response headers a byte at a time. So every
request hermetic sends goes out on a connection of this module: when it sends a request inside a watchdog's
block, it tells the watchdog, which can then shut it down at the deadline wherever the read is. requests and
urllib3 stay as they are: only the connection class of the pools differs (a SOCKS proxy's pools, which are of
other classes, are left alone: their transfers keep the per-read timeout and the checks between body pieces).
"""

from __future__ import annotations

from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from hermetic.fetch.watchdog import current_watchdog


class _Reporting:
    def request(self, *args: Any, **kwargs: Any) -> None:
        watchdog = current_watchdog()
        if watchdog is not None:
            watchdog.watch(self)
        super().request(*args, **kwargs)  # type: ignore[misc]


class WatchedHTTPConnection(_Reporting, HTTPConnection):
    pass


class WatchedHTTPSConnection(_Reporting, HTTPSConnection):
    pass


class WatchedHTTPConnectionPool(HTTPConnectionPool):
    ConnectionCls = WatchedHTTPConnection


class WatchedHTTPSConnectionPool(HTTPSConnectionPool):
    ConnectionCls = WatchedHTTPSConnection


def watch_pools(manager: Any) -> Any:
    """Make a pool manager (or a proxy manager) open watched connections; one of other pool classes is left."""
    classes = getattr(manager, "pool_classes_by_scheme", None)
    if classes is not None and classes.get("http") is HTTPConnectionPool \
            and classes.get("https") is HTTPSConnectionPool:
        manager.pool_classes_by_scheme = {"http": WatchedHTTPConnectionPool, "https": WatchedHTTPSConnectionPool}
    return manager


class WatchedAdapter(HTTPAdapter):
    """requests' adapter, its pools (direct and proxied) opening watched connections."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        watch_pools(self.poolmanager)

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        return watch_pools(super().proxy_manager_for(proxy, **proxy_kwargs))


def mount(session: requests.Session) -> None:
    """Every http:// and https:// request of ``session`` on watched connections (``trust.mount`` may put its own
    watched adapters over the https:// one)."""
    session.mount("http://", WatchedAdapter())
    session.mount("https://", WatchedAdapter())
