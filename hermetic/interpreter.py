"""The interpreter an environment is for: the recipe's ``python``, else the one running hermetic.

Its facts (version, implementation, the tags ``packaging.tags.sys_tags()`` gives there, the marker
environment, its install scheme) decide which wheels a lock means and what a console script runs. A named
interpreter is asked once, with hermetic's own copy of packaging put on its path (isolated: ``-E -s -S``,
so nothing needs to be installed in it and nothing of its site is read), and the answer is cached while the
interpreter's binary and that packaging keep their fingerprints (``root.CACHES["pythons"]``).
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermetic.errors import BadInput
from hermetic.root import Root

if TYPE_CHECKING:
    from packaging.tags import Tag

SUPPORTED = ((3, 11), (3, 14))   # CPython releases hermetic builds for, both ends included
WHERE = "recipe.python"

# Runs inside the named interpreter. Written so that any Python parses it (2.7 too), to say what it is before
# it is refused; only a supported CPython goes on to import packaging. A change to what it prints bumps
# root.CACHES["pythons"].
_PROBE = r"""
import json, platform
impl = getattr(sys, "implementation", None)
out = {"python": platform.python_version(), "executable": sys.executable,
       "implementation": impl.name if impl else platform.python_implementation().lower()}
if out["implementation"] == "cpython" and LOW <= tuple(sys.version_info[:2]) <= HIGH:
    sys.path.insert(0, sys.argv[1])
    import os, sysconfig
    from packaging.markers import default_environment
    from packaging.tags import sys_tags
    out["tags"] = [str(t) for t in sys_tags()]
    out["markers"] = dict(default_environment())
    # -S: site did not make a venv's folder the prefix; find it as site.venv() does, and take the scheme a
    # venv has (sysconfig's "venv" scheme for that prefix), never the base interpreter's site-packages
    exe_dir = os.path.dirname(os.path.abspath(sys.executable))
    prefix = os.path.dirname(exe_dir)
    if sys.prefix == sys.base_prefix and any(os.path.isfile(os.path.join(d, "pyvenv.cfg"))
                                             for d in (exe_dir, prefix)):
        paths = sysconfig.get_paths("venv", vars={"base": prefix, "platbase": prefix})
    else:
        prefix, paths = sys.prefix, sysconfig.get_paths()
    out["scheme"] = dict((k, paths[k]) for k in ("purelib", "platlib", "scripts", "data", "include"))
    out["prefix"] = prefix
print("hermetic-probe-result: " + json.dumps(out))
""".replace("LOW", repr(SUPPORTED[0])).replace("HIGH", repr(SUPPORTED[1]))


@dataclass(frozen=True)
class Interpreter:
    executable: str                  # absolute, not resolved: a venv's python is a symlink into its base
    python: str                      # platform.python_version() there
    implementation: str
    tags: tuple[str, ...]            # sys_tags() there, best first
    markers: dict[str, str]          # packaging.markers.default_environment() there
    scheme: dict[str, str]           # sysconfig.get_paths() there: purelib, platlib, scripts, data, include
    named: bool                      # named by the recipe (else the interpreter running hermetic)

    @property
    def label(self) -> str:
        return f"{self.executable} (CPython {self.python})"

    def tag_list(self) -> list[Tag]:
        from packaging.tags import Tag
        return [Tag(*t.split("-", 2)) for t in self.tags]

    def summary(self) -> dict[str, Any]:
        """What a receipt says of it."""
        return {"executable": self.executable, "python": self.python, "implementation": self.implementation,
                "named": self.named, "best_tag": self.tags[0] if self.tags else None,
                "purelib": self.scheme.get("purelib"), "platlib": self.scheme.get("platlib")}


def find_python(python: str | None, where: str = WHERE) -> Path:
    """The interpreter a recipe names (a path or a command on PATH), absolute and not resolved; the running
    one for None. One that does not exist or cannot be run is bad input, said with its name."""
    if python is None:
        return Path(os.path.abspath(sys.executable))
    hint = 'give a path or a command on PATH, e.g. python = "/usr/bin/python3.12"'
    if "/" in python:
        path = Path(python).expanduser()
        if not path.exists():
            raise BadInput(f"the host interpreter {python!r} does not exist", where=where, hint=hint)
        if path.is_dir() or not os.access(path, os.X_OK):
            raise BadInput(f"the host interpreter {python!r} is not an executable file", where=where,
                           hint=f"check its permissions (chmod +x {path}) or name another interpreter")
        return Path(os.path.abspath(path))
    found = shutil.which(python)
    if not found:
        raise BadInput(f"the host interpreter {python!r} is not found on PATH", where=where, hint=hint)
    return Path(os.path.abspath(found))


def interpreter(root: Root, python: str | None, where: str = WHERE) -> Interpreter:
    """The facts of the recipe's interpreter, from the cache while it and hermetic's packaging are unchanged."""
    exe = find_python(python, where)
    cache = root.cache("pythons")
    key = str(exe)
    found = cache.get(key)
    if not isinstance(found, dict) or "tags" not in found:
        found = _running() if python is None else _ask(root, exe, python, where)
        import packaging.tags
        cache.put(key, found, [exe, packaging.tags.__file__])
    return Interpreter(str(exe), found["python"], found["implementation"], tuple(found["tags"]),
                       dict(found["markers"]), dict(found["scheme"]), named=python is not None)


def _running() -> dict[str, Any]:
    import sysconfig

    from packaging.markers import default_environment
    from packaging.tags import sys_tags
    paths = sysconfig.get_paths()
    return {"python": ".".join(map(str, sys.version_info[:3])), "implementation": sys.implementation.name,
            "tags": [str(t) for t in sys_tags()], "markers": dict(default_environment()),
            "scheme": {k: paths[k] for k in ("purelib", "platlib", "scripts", "data", "include")}}


def _ask(root: Root, exe: Path, python: str, where: str) -> dict[str, Any]:
    import packaging

    from hermetic.procs import NO_CWD_IMPORTS, run_probe  # in a session of its own: it dies with hermetic
    site = str(Path(packaging.__file__).parent.parent)
    root.tmp.mkdir(parents=True, exist_ok=True)
    env = {**root.child_env(), "PYTHONNOUSERSITE": "1"}
    # -E -s -S, not -I: a Python too old to know -I still says what it is; -B: nothing written in site
    try:
        found, output = run_probe([str(exe), "-E", "-s", "-S", "-B", "-c", NO_CWD_IMPORTS + _PROBE, site], env=env,
                                  cwd=str(root.tmp))
    except OSError as e:
        raise BadInput(f"the host interpreter {python!r} ({exe}) cannot be run: {e.strerror or e}", where=where,
                       hint="name a CPython 3.11-3.14 interpreter") from None
    low, high = (".".join(map(str, v)) for v in SUPPORTED)
    if found is None:
        raise BadInput(f"the host interpreter {python!r} ({exe}) did not say what it is:\n{output[-1500:]}",
                       where=where, hint=f"name a CPython {low}-{high} interpreter that starts")
    if "tags" not in found:
        raise BadInput(f"the host interpreter {python!r} ({exe}) is {found.get('implementation')} "
                       f"{found.get('python')}, not CPython {low}-{high}", where=where,
                       hint=f"name a CPython {low}-{high} interpreter")
    return found
