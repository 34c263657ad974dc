"""Which remote cache to use, and how: the command line, else the environment, else a recipe's ``[remote]``.

Credentials come from the URL's userinfo (basic auth) or ``HERMETIC_REMOTE_CACHE_TOKEN`` (a bearer token);
they are taken off the URL here and never printed: messages and records carry the bare URL only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from hermetic.config import REPOSITORY_LEVELS, Config
from hermetic.errors import BadInput
from hermetic.urls import same_origin, split_credentials

ENV_URL, ENV_MODE = "HERMETIC_REMOTE_CACHE", "HERMETIC_REMOTE_CACHE_MODE"
ENV_TOKEN, ENV_TIMEOUT = "HERMETIC_REMOTE_CACHE_TOKEN", "HERMETIC_REMOTE_CACHE_TIMEOUT"


MODES = ("off", "ro", "rw")


DEFAULT_TIMEOUT = 30.0      # seconds to connect, and between two reads of one answer


@dataclass(frozen=True)
class RemoteOptions:
    """What the command line said (``--remote-cache``, ``--remote-cache-mode``); None: not given."""
    url: str | None = None
    mode: str | None = None


@dataclass(frozen=True)
class RemoteSettings:
    url: str                                   # base URL without credentials: safe to print and record
    mode: str                                  # "ro" or "rw"
    source: str                                # where the URL came from, for messages
    auth: tuple[str, str] | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    timeout: float = DEFAULT_TIMEOUT
    notes: tuple[str, ...] = ()                # what of the user's settings was not applied, and why (warnings)

    @property
    def writable(self) -> bool:
        return self.mode == "rw"

    def record(self) -> dict[str, str]:
        """For receipts and certificates: no credentials."""
        return {"url": self.url, "mode": self.mode}


def resolve_settings(options: RemoteOptions | None, environ: Mapping[str, str],
                     recipe_url: str | None = None, recipe_mode: str | None = None,
                     recipe_where: str = "the recipe's [remote]", config: Config | None = None
                     ) -> RemoteSettings | None:
    """The remote to use, or None. URL and mode each come from the command line, else the environment,
    else the recipe's ``[remote]`` table, else ``config``'s hermetic.toml files (hermetic.config's one order);
    the mode defaults to read-only; ``off`` disables the remote."""
    options = options or RemoteOptions()
    config = config or Config([])
    url_setting = config.resolve("remote.url", options.url, recipe_url or None, recipe_where, environ)
    url, source = url_setting.value, url_setting.origin
    mode = config.resolve("remote.mode", options.mode, recipe_mode or None, recipe_where, environ)
    if mode.value not in MODES:
        raise BadInput(f"remote cache mode {mode.value!r} is not one of {', '.join(MODES)}", where=mode.origin,
                       hint="ro reads the remote cache, rw also writes it (trusted builders only), off ignores it")
    notes: list[str] = []
    if not url or mode.value == "off":
        return None
    base, auth = split_credentials(url, source)
    chosen_by_repository = url_setting.level in REPOSITORY_LEVELS and not any(
        same_origin(base, split_credentials(u, "")[0]) for u in config.users_values("remote.url"))
    if mode.value == "rw" and mode.level in REPOSITORY_LEVELS:   # writers are trusted builders: the user says so
        notes.append(f"{mode.origin} asks to write to the remote cache {base}: a repository cannot make a cache "
                     f"writable, so it is read-only (set {ENV_MODE}=rw, or mode in your user file, to write)")
        mode = mode._replace(value="ro")
    if auth and url_setting.level == "project":
        raise BadInput(f"the remote cache URL of {source} carries credentials; a project's hermetic.toml is "
                       "shared, credentials are not", where=source,
                       hint=f"keep the URL bare there and put the credentials in {ENV_TOKEN} or your user file")
    token = environ.get(ENV_TOKEN) or None
    if token and chosen_by_repository:
        notes.append(f"{ENV_TOKEN} is not sent to {base}: {source} chose that server, and the token goes only to "
                     f"a remote cache you named (--remote-cache, {ENV_URL}, your user or system hermetic.toml)")
        token = None
    if token and auth:
        raise BadInput(f"the remote cache {base} has credentials in its URL and {ENV_TOKEN} is set",
                       where=source, hint="use one: user:password@ in the URL (basic) or the token (bearer)")
    raw_timeout = environ.get(ENV_TIMEOUT)
    try:
        timeout = float(raw_timeout) if raw_timeout else DEFAULT_TIMEOUT
    except ValueError:
        timeout = -1.0
    if not 0 < timeout <= 3600:
        raise BadInput(f"{ENV_TIMEOUT}={raw_timeout!r} is not a number of seconds (0-3600)", where=ENV_TIMEOUT,
                       hint=f"for example {ENV_TIMEOUT}=30")
    return RemoteSettings(base, mode.value, source, auth, token, timeout, tuple(notes))
