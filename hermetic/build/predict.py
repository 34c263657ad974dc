"""Will a later variant's compile reuse the first variant's object? Predicted before anything compiles.

A *follower* is a compile of a later variant (or module) with the lookup key of a compile that runs now, its
*leader*. The waiver that lets the follower reuse the leader's object holds when the files the compile reads
have the same content in both variants and none of them, nor the rest of the command, mentions an identifier
whose define differs (``ObjectCache.choose``). Before the leader's compile has written its dependency list,
that list is predicted by a textual include closure of the follower's source: every ``#include "..."`` and
``#include <...>`` resolved the way the compiler does (the including file's folder for quotes, then
``-iquote``, ``-I``, ``-isystem`` in order), preprocessor conditionals ignored; together with the inputs the
last compile of the same unit read (its object record, in either variant), which the compiler wrote itself
and which holds what the textual closure misses.

The closure errs both ways, and neither costs an object: it holds more files than the compiler reads (an
``#ifdef`` branch not taken), which can only predict "compile now" for a follower that would have waited; and
it misses what a computed ``#include MACRO`` or the compiler's own built-in folders bring in, which can predict
"wait" for a follower whose waiver then fails. The waiver is always confirmed on the leader's real dependency
list (``ObjectCache.find`` once the leader is recorded); a follower that fails it is compiled, in the graph's
second phase. Directives and identifier mentions are cached per file in the root's ``includes`` cache, keyed by
the file's stat fingerprint.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hermetic import fs
from hermetic.build.objects import RAW, STRIPPED, ObjectCache
from hermetic.build.plan import Compile
from hermetic.keys import differing_defines, identifier_re, is_debug, split_defines
from hermetic.root import Root

_DIRECTIVE = re.compile(rb'^[ \t]*#[ \t]*include(?:_next)?[ \t]*([<"])([^>"\n]+)[>"]', re.M)


@dataclass(frozen=True)
class Prediction:
    wait: bool            # the waiver is expected to hold: wait for the leader's object
    reason: str           # why not, when it is not expected to hold
    files: int            # files in the predicted closure


_SEARCH_FLAGS = (("-iquote", "quote"), ("-isystem", "system"), ("-I", "angle"), ("--include-path", "angle"))


def search_dirs(argv: tuple[str, ...] | list[str]) -> tuple[list[str], list[str]]:
    """(folders searched for ``#include "..."`` after the includer's own, folders for ``<...>``), in order:
    -iquote, then -I (nvcc's --include-path too), then -isystem."""
    out: dict[str, list[str]] = {"quote": [], "angle": [], "system": []}
    i = 0
    while i < len(argv):
        a = argv[i]
        for flag, kind in _SEARCH_FLAGS:
            if a == flag and i + 1 < len(argv):
                out[kind].append(argv[i + 1])
                i += 1
                break
            if a.startswith(flag) and len(a) > len(flag):
                out[kind].append(a[len(flag):].removeprefix("="))
                break
        i += 1
    return out["quote"], out["angle"] + out["system"]


class IncludeScanner:
    """Textual include closures and identifier mentions, cached per file by fingerprint (root's ``includes``)."""

    def __init__(self, root: Root) -> None:
        self.table = fs.FingerprintTable(root.cache_dir("includes") / "includes.json")
        self._facts: dict[str, list[object] | None] = {}
        self._found: dict[tuple[str, str], str | None] = {}

    def _fact(self, path: str) -> list[object] | None:
        """[[quoted?, name] of every include directive, {identifiers: mentioned?}]; None if unreadable."""
        if path in self._facts:
            return self._facts[path]
        fp, fact = self.table.get(path)
        if fp is not None and fact is None:
            try:
                data = Path(path).read_bytes()
            except OSError:
                data = None
            if data is not None:
                fact = [[[q == b'"', os.fsdecode(n.strip())] for q, n in _DIRECTIVE.findall(data)], {}]
                self.table.put(path, fp, fact)
        self._facts[path] = fact
        return fact

    def mentions(self, path: str, names: list[str]) -> bool:
        fact = self._fact(path)
        if fact is None:
            return True  # unreadable: assume the worst
        seen = fact[1]
        assert isinstance(seen, dict)
        key = ",".join(names)
        if key not in seen:
            try:
                seen[key] = identifier_re(names).search(Path(path).read_bytes()) is not None
            except OSError:
                return True
            self.table.dirty = True
        return bool(seen[key])

    def _resolve(self, name: str, dirs: list[str]) -> str | None:
        for d in dirs:
            key = (d, name)
            if key not in self._found:
                p = os.path.normpath(os.path.join(d, name))
                self._found[key] = p if os.path.isfile(p) else None
            if self._found[key] is not None:
                return self._found[key]
        return None

    def closure(self, c: Compile) -> list[str]:
        """The source and every file its include directives reach through the compile's search folders."""
        quote, angle = search_dirs(c.argv)
        seen = {os.path.normpath(c.source): None}
        todo = [os.path.normpath(c.source)]
        while todo:
            path = todo.pop()
            fact = self._fact(path)
            if fact is None:
                continue
            directives = fact[0]
            assert isinstance(directives, list)
            for quoted, name in directives:
                dirs = [os.path.dirname(path), *quote, *angle] if quoted else angle
                found = self._resolve(name, dirs)
                if found is not None and found not in seen:
                    seen[found] = None
                    todo.append(found)
        return list(seen)

    def save(self) -> None:
        self.table.save()


def predict(scanner: IncludeScanner, follower: Compile, follower_cache: ObjectCache, leader: Compile,
            leader_cache: ObjectCache, last_inputs: Sequence[str] = ()) -> Prediction:
    """Whether ``follower`` will reuse ``leader``'s object once it exists (see the module's docstring);
    ``last_inputs``: the canonical paths the last compile of this unit read."""
    _rest, defines = split_defines(follower.argv)
    _rest, leader_defines = split_defines(leader.argv)
    names = differing_defines(defines, leader_defines)
    if names and (blocker := follower_cache.command_blocker(follower, names)):
        return Prediction(False, blocker, 0)
    mode = RAW if is_debug(follower.argv) else STRIPPED
    files = scanner.closure(follower)
    known = set(files)
    for canonical in last_inputs:
        path = follower_cache.pmap.local_path(canonical)
        if path not in known and os.path.isfile(path):
            known.add(path)
            files.append(path)
    for path in files:
        canonical = follower_cache.pmap.canonical_path(path)
        other = leader_cache.pmap.local_path(canonical)
        if other != path and follower_cache.hasher.hash(path, mode) != leader_cache.hasher.hash(other, mode):
            return Prediction(False, f"{canonical} differs between the variants", len(files))
        if names and scanner.mentions(path, names):
            return Prediction(False, f"defines differ ({', '.join(names)}) and {canonical} mentions one of them",
                              len(files))
    return Prediction(True, "", len(files))
