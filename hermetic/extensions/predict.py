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
from dataclasses import dataclass, field

from hermetic import fs
from hermetic.extensions.objects import RAW, STRIPPED, ObjectCache
from hermetic.extensions.plan import Compile
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


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _same_file(a: str, b: str) -> bool:
    """One file under two names (the store links a file both variants' trees hold unchanged): same content."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


class IncludeScanner:
    """Textual include closures and identifier mentions, cached per file by fingerprint (root's ``includes``)."""

    def __init__(self, root: Root) -> None:
        self.table = fs.FingerprintTable(root.cache_dir("includes") / "includes.json", read_only=root.read_only)
        self._facts: dict[str, list[object] | None] = {}
        self._found: dict[tuple[str, str], str | None] = {}
        self._graphs: dict[tuple[tuple[str, ...], tuple[str, ...]], IncludeGraph] = {}
        self._verdicts: dict[tuple[object, ...], Verdicts] = {}

    def _fact(self, path: str) -> list[object] | None:
        """[[quoted?, name] of every include directive, {identifiers: mentioned?}]; None if unreadable."""
        if path in self._facts:
            return self._facts[path]
        fp, fact = self.table.get(path)
        if fp is not None and fact is None:
            data = _read(path)
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
            data = _read(path)
            if data is None:
                return True
            # the regular expression (identifiers as whole words) only where one appears as bytes at all
            seen[key] = any(n.encode() in data for n in names) and identifier_re(names).search(data) is not None
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

    def graph(self, c: Compile) -> IncludeGraph:
        """The include graph of every compile searching the folders ``c`` searches."""
        quote, angle = search_dirs(c.argv)
        key = (tuple(quote), tuple(angle))
        g = self._graphs.get(key)
        if g is None:
            g = self._graphs[key] = IncludeGraph(self, quote, angle)
        return g

    def closure(self, c: Compile) -> list[str]:
        """The source and every file its include directives reach through the compile's search folders."""
        g = self.graph(c)
        return g.files(g.reach(g.add(c.source)))

    def verdicts(self, g: IncludeGraph, follower: ObjectCache, leader: ObjectCache, mode: str,
                 names: list[str]) -> Verdicts:
        key = (id(g), id(follower), id(leader), mode, tuple(names))
        v = self._verdicts.get(key)
        if v is None:
            v = self._verdicts[key] = Verdicts()
        return v

    def save(self) -> None:
        self.table.save()


class IncludeGraph:
    """Every file the compiles that search one set of folders reach through their include directives, each
    file's directives resolved once, and what each file reaches in all, as a bit set over the files (bit
    ``i``: ``paths[i]``).

    Sources are added as the compiles ask; adding one discovers only files no earlier source reached (had an
    earlier file included one, it would have been discovered then), so the sets of the files known before stay
    final and only the new files' sets are computed: a fixpoint over them (an include cycle, legal under include
    guards, needs a second pass), in depth-first postorder so that without cycles one pass settles them."""

    def __init__(self, scanner: IncludeScanner, quote: list[str], angle: list[str]) -> None:
        self.scanner, self.quote, self.angle = scanner, quote, angle
        self.index: dict[str, int] = {}
        self.paths: list[str] = []
        self.edges: list[list[int]] = []
        self._reach: list[int] = []   # final for the first len(self._reach) files

    def _node(self, path: str) -> int:
        i = self.index[path] = len(self.paths)
        self.paths.append(path)
        self.edges.append([])
        return i

    def add(self, source: str) -> int:
        """The index of ``source``, discovering the files its directives reach that none before did."""
        start = os.path.normpath(source)
        if start in self.index:
            return self.index[start]
        todo = [self._node(start)]
        while todo:
            i = todo.pop()
            path = self.paths[i]
            fact = self.scanner._fact(path)
            if fact is None:
                continue
            directives = fact[0]
            assert isinstance(directives, list)
            here = [os.path.dirname(path), *self.quote, *self.angle]
            out: list[int] = []
            for quoted, name in directives:
                found = self.scanner._resolve(name, here if quoted else self.angle)
                if found is None:
                    continue
                j = self.index.get(found)
                if j is None:
                    j = self._node(found)
                    todo.append(j)
                out.append(j)
            self.edges[i] = out
        return self.index[start]

    def reach(self, i: int) -> int:
        """The files ``paths[i]`` reaches, itself included, as a bit set."""
        if i >= len(self._reach):
            self._settle()
        return self._reach[i]

    def _settle(self) -> None:
        first, n = len(self._reach), len(self.paths)
        reach = self._reach + [1 << k for k in range(first, n)]
        order: list[int] = []
        seen = set(range(first))
        for root in range(first, n):
            if root in seen:
                continue
            seen.add(root)
            stack = [(root, iter(self.edges[root]))]
            while stack:
                node, it = stack[-1]
                for j in it:
                    if j not in seen:
                        seen.add(j)
                        stack.append((j, iter(self.edges[j])))
                        break
                else:
                    stack.pop()
                    order.append(node)
        changed = True
        while changed:
            changed = False
            for i in order:
                r = reach[i]
                for j in self.edges[i]:
                    r |= reach[j]
                if r != reach[i]:
                    reach[i] = r
                    changed = True
        self._reach = reach

    def files(self, bits: int) -> list[str]:
        out = []
        while bits:
            low = bits & -bits
            out.append(self.paths[low.bit_length() - 1])
            bits ^= low
        return out


@dataclass
class Verdicts:
    """For one include graph and one pair of variants (and defines, hash mode): which files were judged, and
    which of them defeat the waiver, with why (each file is judged once, whatever number of compiles reach it)."""
    judged: int = 0
    bad: int = 0
    reasons: dict[int, str] = field(default_factory=dict)
    extra: dict[str, str] = field(default_factory=dict)   # files outside the graph: path -> reason, "" if fine


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

    def judge(path: str) -> str:
        canonical = follower_cache.pmap.canonical_path(path)
        other = leader_cache.pmap.local_path(canonical)
        if other != path and not _same_file(path, other) \
                and follower_cache.hasher.hash(path, mode) != leader_cache.hasher.hash(other, mode):
            return f"{canonical} differs between the variants"
        if names and scanner.mentions(path, names):
            return f"defines differ ({', '.join(names)}) and {canonical} mentions one of them"
        return ""

    g = scanner.graph(follower)
    source = g.add(follower.source)
    reached = g.reach(source)
    v = scanner.verdicts(g, follower_cache, leader_cache, mode, names)
    todo = reached & ~v.judged
    while todo:
        low = todo & -todo
        todo ^= low
        k = low.bit_length() - 1
        if why := judge(g.paths[k]):
            v.bad |= low
            v.reasons[k] = why
    v.judged |= reached
    files = reached.bit_count()
    if bad := reached & v.bad:  # the source's own reason first, else the first file found
        k = source if bad >> source & 1 else (bad & -bad).bit_length() - 1
        return Prediction(False, v.reasons[k], files)
    for canonical in last_inputs:
        path = follower_cache.pmap.local_path(canonical)
        at = g.index.get(path)
        if (at is not None and reached >> at & 1) or not os.path.isfile(path):
            continue
        files += 1
        if path not in v.extra:
            v.extra[path] = judge(path)
        if v.extra[path]:
            return Prediction(False, v.extra[path], files)
    return Prediction(True, "", files)
