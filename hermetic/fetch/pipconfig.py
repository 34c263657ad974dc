"""pip's own configuration, read the way pip reads it, so hermetic fetches from where pip would.

Users already told pip where their packages live (``PIP_INDEX_URL``, pip.conf, certificates, proxies); a
second configuration system would drift from the first. We therefore ask pip's configuration loader for the
raw keys and apply pip's rules on top: sections ``[global]`` < ``[install]`` < ``PIP_*`` variables, a later
value of an option replacing (not extending) an earlier one, multi-values split on whitespace, empty values
ignored. If pip's internals are missing or changed shape, the same files and variables are parsed here.
The default index is pip's default: this code names no index host.
"""

from __future__ import annotations

import configparser
import locale
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from hermetic.errors import BadInput

# The sections pip's install command reads, lowest precedence first; ":env:" holds the PIP_* variables.
_SECTIONS = ("global", "install", ":env:")

# pip's long option names (its config keys) -> (our field, how pip converts the value).
_OPTIONS: dict[str, tuple[str, str]] = {
    "index-url": ("index_url", "str"),
    "pypi-url": ("index_url", "str"),
    "extra-index-url": ("extra_index_urls", "list"),
    "find-links": ("find_links", "list"),
    "no-index": ("no_index", "bool"),
    "cert": ("cert", "path"),
    "client-cert": ("client_cert", "path"),
    "trusted-host": ("trusted_hosts", "list"),
    "proxy": ("proxy", "str"),
    "timeout": ("timeout", "float"),
    "default-timeout": ("timeout", "float"),
    "retries": ("retries", "int"),
    "use-deprecated": ("use_deprecated", "list"),  # legacy-certs: certifi alone, not the system store
}

_ENV_LOCK = threading.Lock()


@dataclass(frozen=True)
class PipConfig:
    # None only when no_index is set and pip (the source of the default) is not importable.
    index_url: str | None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    no_index: bool = False
    cert: str | None = None
    client_cert: str | None = None
    trusted_hosts: tuple[str, ...] = ()
    proxy: str | None = None
    timeout: float = 15.0
    retries: int = 5
    use_deprecated: tuple[str, ...] = ()  # pip's --use-deprecated features

    @property
    def legacy_certs(self) -> bool:
        """pip's ``--use-deprecated=legacy-certs``: trust certifi (or ``cert``) alone, not the system store."""
        return "legacy-certs" in self.use_deprecated

    @property
    def index_urls(self) -> tuple[str, ...]:
        """The indexes pip would search: none at all under --no-index (pip drops extra indexes too)."""
        if self.no_index:
            return ()
        return ((self.index_url,) if self.index_url else ()) + self.extra_index_urls


def load_pip_config(environ: Mapping[str, str] | None = None) -> PipConfig:
    """pip's effective index/network settings for ``pip install`` under ``environ`` (default: os.environ)."""
    env = dict(os.environ if environ is None else environ)
    items = _items_from_pip(env)
    if items is None:
        items = _items_by_hand(env)
    values = _apply(items, env)
    index_url = values.get("index_url")
    if index_url is None:
        index_url = _pip_default_index()
        if index_url is None and not values.get("no_index", False):
            raise BadInput(
                "no package index is configured, and pip (whose default index hermetic uses) cannot be "
                "imported",
                hint="set PIP_INDEX_URL (or index-url in pip.conf) to your package index, or install pip")
    return PipConfig(index_url=index_url, **{k: v for k, v in values.items() if k != "index_url"})


def _apply(items: list[tuple[str, str]], env: Mapping[str, str]) -> dict[str, Any]:
    """pip's ConfigOptionParser._update_defaults, restricted to the options hermetic uses."""
    by_section: dict[str, list[tuple[str, str]]] = {s: [] for s in _SECTIONS}
    for section_key, raw in items:
        if not raw or "." not in section_key:
            continue
        section, key = section_key.split(".", 1)
        if section in by_section:
            by_section[section].append((key, raw))
    values: dict[str, Any] = {}
    for section in _SECTIONS:
        for key, raw in by_section[section]:
            if key not in _OPTIONS:
                continue
            field, kind = _OPTIONS[key]
            values[field] = _convert(section, key, kind, raw, env)
    return values


def _convert(section: str, key: str, kind: str, raw: str, env: Mapping[str, str]) -> Any:
    source = f"PIP_{key.upper().replace('-', '_')}" if section == ":env:" else f"pip config {section}.{key}"
    try:
        if kind == "list":
            return tuple(raw.split())
        if kind == "bool":
            return _strtobool(raw)
        if kind == "float":
            return float(raw)
        if kind == "int":
            return int(raw)
    except ValueError:
        expected = {"bool": "yes/no, true/false or 1/0", "float": "a number", "int": "an integer"}[kind]
        raise BadInput(f"{source} = {raw!r} is not valid: expected {expected}", where=source) from None
    return _expanduser(raw, env) if kind == "path" else raw


def _expanduser(path: str, env: Mapping[str, str]) -> str:
    # pip expands "~" with its own HOME, which is the HOME of the environment we were given.
    home = env.get("HOME")
    if home and (path == "~" or path.startswith(("~/", "~" + os.sep))):
        return home + path[1:]
    return os.path.expanduser(path)


def _strtobool(val: str) -> bool:
    # The same words as pip's own strtobool (distutils' historic list).
    val = val.lower()
    if val in ("y", "yes", "t", "true", "on", "1"):
        return True
    if val in ("n", "no", "f", "false", "off", "0"):
        return False
    raise ValueError(val)


def _pip_default_index() -> str | None:
    try:
        from pip._internal.models.index import PyPI
        url = PyPI.simple_url
    except Exception:  # pip absent or reshaped: the caller asks the user to configure an index
        return None
    return url if isinstance(url, str) and url else None


@contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    """Run with os.environ equal to ``env``: pip's loader (and platformdirs under it) read only os.environ."""
    if env == dict(os.environ):
        yield
        return
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _items_from_pip(env: dict[str, str]) -> list[tuple[str, str]] | None:
    """The raw ``section.key`` items of pip's own loader, or None if pip is unusable here."""
    try:
        from pip._internal.configuration import Configuration
        from pip._internal.exceptions import ConfigurationError
    except Exception:
        return None
    with _ENV_LOCK, _environ(env):
        try:
            conf = Configuration(isolated=False, load_only=None)
            conf.load()
            items = list(conf.items())
        except ConfigurationError as e:
            raise BadInput(f"pip's configuration is invalid: {e}",
                           hint="fix the file named above, or see `pip config debug`") from None
        except (AttributeError, TypeError, ValueError, KeyError):
            return None  # pip's internals changed shape: parse the files ourselves
    if not all(isinstance(i, tuple) and len(i) == 2 and isinstance(i[0], str) for i in items):
        return None
    return [(k, str(v)) for k, v in items]


def _config_files(env: dict[str, str]) -> list[str]:
    """pip's configuration files in loading order (later files override earlier ones)."""
    env_file = env.get("PIP_CONFIG_FILE")
    if env_file == os.devnull:
        return []  # pip's documented switch for "no configuration files at all"
    home = _expanduser("~", env)
    if sys.platform == "darwin":
        global_dirs = ["/Library/Application Support/pip"]
        user_dir = os.path.join(home, "Library", "Application Support", "pip")
        if not os.path.isdir(user_dir):
            user_dir = os.path.join(home, ".config", "pip")
    elif sys.platform == "win32":
        program_data = env.get("ALLUSERSPROFILE", r"C:\ProgramData")
        global_dirs = [os.path.join(program_data, "pip")]
        user_dir = os.path.join(env.get("APPDATA", home), "pip")
    else:
        xdg_dirs = env.get("XDG_CONFIG_DIRS", "").strip() or "/etc/xdg"
        global_dirs = [os.path.join(_expanduser(d, env), "pip") for d in xdg_dirs.split(os.pathsep)]
        global_dirs.append("/etc")
        user_dir = os.path.join(env.get("XDG_CONFIG_HOME", "").strip() or os.path.join(home, ".config"),
                                "pip")
    basename = "pip.ini" if sys.platform == "win32" else "pip.conf"
    files = [os.path.join(d, basename) for d in global_dirs]
    if not (env_file and os.path.exists(env_file)):
        legacy = os.path.join(home, "pip" if sys.platform == "win32" else ".pip", basename)
        files += [legacy, os.path.join(user_dir, basename)]
    files.append(os.path.join(sys.prefix, basename))
    if env_file:
        files.append(env_file)  # pip ranks PIP_CONFIG_FILE above every other file
    return files


def _items_by_hand(env: dict[str, str]) -> list[tuple[str, str]]:
    merged: dict[str, str] = {}
    for fname in _config_files(env):
        if not os.path.exists(fname):
            continue
        parser = configparser.RawConfigParser()
        try:
            parser.read(fname, encoding=locale.getpreferredencoding(False))
        except (configparser.Error, UnicodeDecodeError) as e:
            raise BadInput(f"pip configuration file is invalid: {e}", where=fname) from None
        for section in parser.sections():
            for name, val in parser.items(section):
                merged[f"{section}.{_normalize(name)}"] = val
    for key, val in env.items():
        if key.startswith("PIP_") and key[4:].lower() not in ("version", "help"):
            merged[f":env:.{_normalize(key[4:])}"] = val
    return list(merged.items())


def _normalize(name: str) -> str:
    name = name.lower().replace("_", "-")
    return name[2:] if name.startswith("--") else name
