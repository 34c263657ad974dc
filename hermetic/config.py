"""The settings a team shares, and the one order they are taken in (docs/config.md).

Each setting is taken from the first place that gives it, in ``PRECEDENCE``: the command line, the environment,
the recipe or runner file, the project's ``hermetic.toml`` (the nearest one in the recipe's folder or above it,
inside its repository), the user's (``$XDG_CONFIG_HOME/hermetic/hermetic.toml``, else
``~/.config/hermetic/hermetic.toml``), the system's (``/etc/hermetic/hermetic.toml``; ``HERMETIC_SYSTEM_CONFIG``
names another, and an empty value none), then the default: the project's settings over the user's, as uv's. The
order is written here once: ``Config.resolve`` is the only code that walks it, and every setting's reader (the
remote cache, the lock folder, the sandbox, jobs, trusted keys) asks it. A configuration file is read as strictly
as a recipe (an unknown key or a wrong type names the file and line; exit 2).

A no-op realize reads no configuration file: none of these settings can change what a realize makes, so this
module (and TOML) is imported only by a command that does work.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from hermetic.errors import BadInput

PRECEDENCE = ("command line", "environment", "recipe or runner file", "project", "user", "system", "default")
# The levels a repository writes (its recipe or runner, its hermetic.toml): a setting from one of them is the
# repository's choice, never the user's. Credentials from the environment go only to a server the user chose,
# and a repository cannot make the user's cache writable (docs/config.md, "What a repository's file may not do").
REPOSITORY_LEVELS = ("recipe or runner file", "project")
FILE_NAME = "hermetic.toml"
ENV_SYSTEM = "HERMETIC_SYSTEM_CONFIG"
SYSTEM_PATH = Path("/etc/hermetic") / FILE_NAME
SANDBOX_MODES = ("auto", "required", "off")
REMOTE_MODES = ("off", "ro", "rw")
MAX_JOBS = 1024


def _shown(value: object) -> str:
    """A value as an error quotes it: at most 60 characters, any URL's credentials replaced by ***."""
    from hermetic.urls import redact_text
    shown = redact_text(repr(value))
    return shown if len(shown) <= 60 else shown[:57] + "..."


def _label(name: str, where: str) -> str:
    """What a message calls the value: the variable or option that gave it, else the file's key."""
    return where if where.isupper() or where.startswith("-") else name


def _jobs(value: object, where: str) -> int:
    if isinstance(value, str) and re.fullmatch(r"[0-9]+", value.strip(" ")):   # ASCII digits: not 3_0, not ٣
        value = int(value.strip(" "))
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_JOBS:
        raise BadInput(f"{_label('jobs', where)} must be a whole number from 1 to {MAX_JOBS}, found {_shown(value)}",
                       where=where, hint="the number of compilers running at once, e.g. 8")
    return value


def _choice(name: str, choices: tuple[str, ...], hint: str) -> Callable[[object, str], str]:
    def check(value: object, where: str) -> str:
        if not isinstance(value, str) or value.strip().lower() not in choices:
            raise BadInput(f"{_label(name, where)} must be one of {', '.join(choices)}, found {_shown(value)}",
                           where=where, hint=hint)
        return value.strip().lower()
    return check


def _text(name: str) -> Callable[[object, str], str]:
    def check(value: object, where: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise BadInput(f"{_label(name, where)} must be a non-empty string, found {_shown(value)}", where=where,
                           hint=f"write {name} = \"...\"")
        if any(ord(c) < 32 or 127 <= ord(c) < 160 for c in value):
            raise BadInput(f"{_label(name, where)} holds a control character: {_shown(value)}", where=where,
                           hint="a path or URL has no NUL, newline or escape in it")
        return value.strip()
    return check


def _paths(value: object, where: str) -> str:
    """Trusted keys: a ``:``-separated string (the environment's form) or, in a file, an array of paths."""
    if isinstance(value, list) and all(isinstance(v, str) and v for v in value):
        value = ":".join(value)
    elif not isinstance(value, str) or not where.isupper():   # a string only from the environment
        raise BadInput(f"trusted_keys must be an array of public key files, found {_shown(value)}", where=where,
                       hint='write trusted_keys = ["/etc/hermetic/team.pub"]')
    if any(ord(c) < 32 or 127 <= ord(c) < 160 for c in value):
        raise BadInput(f"{_label('trusted_keys', where)} holds a control character: {_shown(value)}", where=where,
                       hint="a path has no NUL, newline or escape in it")
    return value


class Spec(NamedTuple):
    """One setting: its key in a configuration file (``remote.url``: ``url`` in ``[remote]``), the command
    line option and environment variables that set it (first wins), the key of a recipe or runner that does,
    what checks a value, and its default (``default_text`` says it)."""
    key: str
    option: str
    env: tuple[str, ...]
    file_key: str
    check: Callable[[object, str], Any]
    default: Callable[[], Any]
    default_text: str


SETTINGS: dict[str, Spec] = {s.key: s for s in (
    Spec("jobs", "-j/--jobs", ("HERMETIC_JOBS", "MAX_JOBS"), "recipe [limits] jobs", _jobs,
         lambda: os.cpu_count() or 1, "the CPU count"),
    Spec("sandbox", "--sandbox", ("HERMETIC_SANDBOX",), "recipe [limits] sandbox, runner [cpu]/[gpu] sandbox",
         _choice("sandbox", SANDBOX_MODES, "auto: the sandbox where bubblewrap works; required: exit 3 where it does "
                                           "not; off: never"), lambda: "auto", "auto"),
    Spec("lock_dir", "", ("HERMETIC_LOCK_DIR",), "runner [gpu] lock_dir", _text("lock_dir"), lambda: None,
         "the first of /run/lock/hermetic, /var/lock/hermetic, /tmp/hermetic-locks this user may create"),
    Spec("remote.url", "--remote-cache", ("HERMETIC_REMOTE_CACHE",), "recipe [remote] url", _text("remote.url"),
         lambda: None, "none"),
    Spec("remote.mode", "--remote-cache-mode", ("HERMETIC_REMOTE_CACHE_MODE",), "recipe [remote] mode",
         _choice("remote.mode", REMOTE_MODES, "ro reads the remote cache, rw also writes it (trusted builders "
                                              "only), off ignores it"), lambda: "ro", "ro"),
    Spec("trusted_keys", "", ("HERMETIC_TRUSTED_KEYS",), "", _paths, lambda: None, "none"),
    Spec("dist", "--dist", ("HERMETIC_DIST",), "recipe [remote] dist", _text("dist"), lambda: None,
         "none (compiles stay on this machine)"),
)}

# What a project's hermetic.toml (a file a repository carries, read for any recipe inside it) may not set: the keys
# that vouch for what enters the store of every recipe of the root. Recipes cannot name them either
# (docs/guarantees.md, "Who may write what"); the user's and the system's files, and the environment, can.
NOT_FROM_A_PROJECT = {
    "trusted_keys": "a trusted key vouches for archives and cache entries that enter the store every recipe of "
                    "the root reuses, so a repository may not choose one",
    "lock_dir": "the lock folder is the machine's, shared by every user: a repository choosing another would "
                "let its runs skip the locks everyone else takes",
}


class Setting(NamedTuple):
    key: str
    value: Any
    level: str          # one of PRECEDENCE
    origin: str         # exactly where: the option, the variable, the file and line

    def record(self) -> dict[str, Any]:
        return {"key": self.key, "value": self.value, "level": self.level, "origin": self.origin}


class Layer(NamedTuple):
    """One configuration file: its level (project, user, system), its path, whether it exists, its values
    with the line each came from."""
    level: str
    path: Path
    found: bool
    values: dict[str, tuple[Any, str]]


class Config:
    """The configuration files that apply to one recipe (or to the current folder), read and checked."""

    def __init__(self, layers: list[Layer]) -> None:
        self.layers = layers

    def resolve(self, key: str, cli: object = None, file: object = None, file_where: str = "",
                environ: Mapping[str, str] | None = None) -> Setting:
        """``key``'s value and where it came from, in ``PRECEDENCE``: ``cli`` (None: not given), the
        environment, ``file`` (a recipe's or runner's value, already checked; ``file_where`` names it), the
        configuration files, the default."""
        spec = SETTINGS[key]
        env = os.environ if environ is None else environ
        if cli is not None:
            return Setting(key, spec.check(cli, spec.option), PRECEDENCE[0], spec.option)
        for var in spec.env:
            raw = env.get(var)
            if raw:
                return Setting(key, spec.check(raw, var), PRECEDENCE[1], var)
        if file is not None:
            return Setting(key, file, PRECEDENCE[2], file_where or "the recipe")
        for layer in self.layers:
            if key in layer.values:
                value, where = layer.values[key]
                return Setting(key, value, layer.level, where)
        return Setting(key, spec.default(), PRECEDENCE[-1], "the default")

    def users_values(self, key: str) -> list[Any]:
        """``key``'s values in the user's and the system's files: what the user chose, whatever a repository's
        file or recipe says over them (a server named there too is the user's, credentials and all)."""
        return [layer.values[key][0] for layer in self.layers
                if layer.level not in REPOSITORY_LEVELS and key in layer.values]

    def check_machines_lock_dir(self, chosen: Setting) -> None:
        """A runner's ``gpu.lock_dir`` that is not the machine's lock folder (the one a user's or system's file
        names, else the default) is bad input: a runner (a repository's) cannot take a device past the locks
        every other run takes."""
        if chosen.level not in REPOSITORY_LEVELS:
            return
        from hermetic.root import lock_dir
        machines = self.users_values("lock_dir") or [str(lock_dir(None))]
        if chosen.value not in machines:
            raise BadInput(f"the runner's lock folder {chosen.value} is not the machine's ({machines[0]}): a runner "
                           "cannot take a device past the locks every other run takes", where=chosen.origin,
                           hint="remove gpu.lock_dir from the runner, or set HERMETIC_LOCK_DIR if you mean it")

    def table(self, cli: Mapping[str, object] | None = None,
              files: Mapping[str, tuple[object, str]] | None = None) -> list[Setting]:
        """Every setting resolved (``hermetic config``)."""
        cli, files = cli or {}, files or {}
        return [self.resolve(key, cli.get(key), *files.get(key, (None, ""))) for key in SETTINGS]


def _check_owner(level: str, path: Path, st: os.stat_result, what: str, *, folder: bool = False,
                 link: bool = False) -> None:
    """A configuration file someone else could have written is not read (as git refuses a repository another
    user owns): the file, a link at its name, and the folders holding them must belong to this user or to root,
    and no other user may write to them (a world-writable folder only with the sticky bit, as /tmp: there no
    one else can replace this user's file)."""
    uid = os.geteuid()
    head = f"the {level} configuration {path}" + (f": {what}" if what else " ")
    if st.st_uid not in (uid, 0):
        raise BadInput(f"{head}belongs to uid {st.st_uid}, not to you (uid {uid}) or root: a file another user "
                       "can change does not choose hermetic's settings",
                       where=str(path), hint="if you trust it, copy its settings into your user file; else remove it")
    if st.st_mode & 0o002 and not link and not (folder and st.st_mode & 0o1000):   # a link's mode is always 777
        raise BadInput(f"{head}is writable by every user (mode {st.st_mode & 0o7777:o}): a file another user can "
                       "change does not choose hermetic's settings", where=str(path), hint=f"chmod o-w {path}")


def _user_hint() -> str:
    return "$XDG_CONFIG_HOME/hermetic/hermetic.toml or ~/.config/hermetic/hermetic.toml"


def system_path(environ: Mapping[str, str]) -> Path | None:
    if ENV_SYSTEM in environ:
        return Path(environ[ENV_SYSTEM]) if environ[ENV_SYSTEM] else None
    return SYSTEM_PATH


def user_path(environ: Mapping[str, str]) -> Path | None:
    base = environ.get("XDG_CONFIG_HOME")
    if base and os.path.isabs(base):
        return Path(base) / "hermetic" / FILE_NAME
    home = environ.get("HOME")
    return Path(home) / ".config" / "hermetic" / FILE_NAME if home else None


def project_path(start: Path) -> Path | None:
    """The nearest ``hermetic.toml`` in ``start`` or a folder above it, up to the top of its repository (the
    folder holding ``.git``); outside any repository, ``start`` alone."""
    here = Path(os.path.abspath(start))
    chain = [here, *here.parents]
    top = next((i for i, d in enumerate(chain) if os.path.lexists(d / ".git")), None)
    folders = chain[:top + 1] if top is not None and _a_repository_top(chain[top]) else [here]
    for d in folders:   # anything by the name is the project's file (a FIFO or a folder there: bad input)
        if os.path.lexists(d / FILE_NAME):
            return d / FILE_NAME
    return None


def _a_repository_top(folder: Path) -> bool:
    """Whether ``folder``'s ``.git`` is this user's or root's: one another user made (an empty ``.git`` in a
    shared folder) makes no repository, as git refuses it (its "dubious ownership"): the recipe's folder alone is
    looked at then."""
    try:
        st = os.lstat(folder / ".git")
    except OSError:
        return False
    return st.st_uid in (os.geteuid(), 0)


_LOADED: dict[tuple[str, str | None, str | None], Config] = {}


def load(start: Path | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """The configuration for a recipe in the folder ``start`` (None: the current folder), read once per
    process."""
    env = os.environ if environ is None else environ
    here = Path(os.path.abspath(start if start is not None else Path.cwd()))
    project, user, system = project_path(here), user_path(env), system_path(env)
    cache_key = (str(here), str(user), str(system))
    if cache_key not in _LOADED:
        layers = [_read("project", project, here / FILE_NAME), _read("user", user, None),
                  _read("system", system, None)]
        _LOADED[cache_key] = Config([layer for layer in layers if layer is not None])
    return _LOADED[cache_key]


def _read(level: str, path: Path | None, missing: Path | None) -> Layer | None:
    """A configuration file's layer (not found: an empty one, so ``hermetic config`` can say where it looked).
    The file is opened once; its owner and mode are checked on that descriptor and its bytes read from it (a
    file swapped in after the check is never the one read), and so are a link at its name and the folders
    holding the name and the file."""
    if path is None:
        return Layer(level, missing, False, {}) if missing is not None else None
    if not os.path.lexists(path):
        return Layer(level, path, False, {})
    from hermetic import fs
    from hermetic.tomlutil import INPUT_LIMIT, parse_toml, read_input
    try:
        fd = fs.open_regular(path, follow=True)
    except OSError:
        read_input(path, "configuration file")   # says why (missing, a FIFO, a folder, no permission), exit 2
        raise
    try:
        _check_owner(level, path, os.fstat(fd), "")
        link = os.lstat(path)
        if link.st_mode & 0o170000 == 0o120000:
            _check_owner(level, path, link, "the link ", link=True)
        for folder in dict.fromkeys((path.parent, Path(os.path.realpath(path)).parent)):
            _check_owner(level, path, os.stat(folder), f"its folder {folder} ", folder=True)
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read(INPUT_LIMIT + 1)
    finally:
        os.close(fd)
    if len(raw) > INPUT_LIMIT:
        raise BadInput(f"configuration file {path} holds more than {INPUT_LIMIT >> 20} MiB", where=str(path),
                       hint="name the file itself")
    from hermetic.tomlutil import check_keys, expect_type
    doc = parse_toml(path, raw)
    top = {k for k in SETTINGS if "." not in k} | {"remote"}
    check_keys(doc, doc.data, top, ())
    values: dict[str, tuple[Any, str]] = {}
    for key, raw in doc.data.items():
        if key == "remote":
            table = expect_type(doc, raw, dict, ("remote",))
            check_keys(doc, table, {"url", "mode"}, ("remote",))
            for sub, value in table.items():
                values[f"remote.{sub}"] = (SETTINGS[f"remote.{sub}"].check(value, doc.where("remote", sub)),
                                           doc.where("remote", sub))
            continue
        where = doc.where(key)
        if level == "project" and key in NOT_FROM_A_PROJECT:
            raise BadInput(f"{key} cannot be set in a project's {FILE_NAME}: {NOT_FROM_A_PROJECT[key]}",
                           where=where, hint=f"put it in your user file ({_user_hint()}), the system's, or "
                                             f"{SETTINGS[key].env[0]}")
        value = SETTINGS[key].check(raw, where)
        if key == "trusted_keys":   # relative paths are the file's folder's
            value = ":".join(str(path.parent / p) if p and not os.path.isabs(p) else p for p in value.split(":"))
        if key == "lock_dir" and not os.path.isabs(value):
            value = str(path.parent / value)
        values[key] = (value, where)
    return Layer(level, path, True, values)
