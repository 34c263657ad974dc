"""``hermetic recipe new SDIST_OR_FOLDER``: a recipe derived from a package's setup.py.

The sdist is unpacked (its one top folder stripped, as a source of a recipe is) into a scratch folder under the
root; its setup.py runs there, in the recipe's interpreter, inside the sandbox, with hermetic's CUDA toolchain as
CUDA_HOME and an environment of only what ``--env`` sets (extensions/capture.py records what it did); this
module turns the record into a recipe TOML: every extension's sources, include folders, defines, per-compiler
flags, link arguments and kind, settings shared by every extension hoisted into ``[shared.common]``, the
package's Python packages, the sdist's sha256, and comments naming the setup.py lines each value came from.
"""

from __future__ import annotations

import ast
import collections
import json
import os
import re
from pathlib import Path
from typing import Any, NamedTuple

ARCH_FLAG = re.compile(r"^(-gencode|--generate-code|-arch|--gpu-architecture|-code|--gpu-code)(=.*)?$")


def split_arch_flags(flags: list[str]) -> tuple[list[str], list[str]]:
    """nvcc's architecture flags (dropped in favour of [toolchain] archs) and the rest."""
    kept, dropped = [], []
    i = 0
    while i < len(flags):
        f = flags[i]
        m = ARCH_FLAG.match(f)
        if m:
            if m.group(2) is None and i + 1 < len(flags):  # -gencode arch=...,code=...
                dropped += [f, flags[i + 1]]
                i += 2
                continue
            dropped.append(f)
        else:
            kept.append(f)
        i += 1
    return kept, dropped


def notable_nvcc(flags: list[str]) -> list[str]:
    notes = []
    for i, f in enumerate(flags):
        if f in ("--threads", "-t") and i + 1 < len(flags):
            notes.append(f"nvcc '{f} {flags[i + 1]}': {flags[i + 1]} threads per compile, counted against "
                         "[limits] jobs (jobs // N compilers at once)")
        elif f.startswith(("--threads=", "-t=")):
            notes.append(f"nvcc '{f}': threads per compile, counted against [limits] jobs")
        elif f in ("-lineinfo", "--generate-line-info"):
            notes.append(f"nvcc '{f}': line info keeps the root's path in the object (no prefix map reaches it): "
                         "its objects are shared only within one root; --explain says so")
        elif f in ("-G", "--device-debug"):
            notes.append(f"nvcc '{f}': device debug info keeps this machine's paths")
        elif f.startswith("--ptxas-options=-v") or f == "-Xptxas=-v":
            notes.append(f"nvcc '{f}': ptxas prints register use for every kernel (noise in the build log only)")
    return notes


# scanning a unit for what kind of module it is (lines inside #ifdef _WIN32 / #if defined(_WIN32) skipped)
PY_MODULE = re.compile(r"\bPYBIND11_MODULE\s*\(|\bPyInit_\w+|\bPyModule_Create\b|\bNB_MODULE\s*\(")
OPS = re.compile(r"\bTORCH_LIBRARY(_FRAGMENT|_IMPL)?\s*\(|\bRegisterOperators\s*\(\s*\)|\bSTABLE_TORCH_LIBRARY")


def scan_unit(text: str) -> dict[str, Any]:
    stack: list[bool] = []  # True: inside a Windows-only branch
    found: dict[str, list[int]] = {"python_module": [], "operators": []}
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if re.match(r"#\s*if(def)?\b", s):
            stack.append(bool(re.search(r"_WIN32|_MSC_VER|defined\s*\(\s*_WIN32", s)) and "!" not in s)
            continue
        if re.match(r"#\s*else\b|#\s*elif\b", s) and stack:
            stack[-1] = False if stack[-1] else stack[-1]
            continue
        if re.match(r"#\s*endif\b", s) and stack:
            stack.pop()
            continue
        if any(stack):
            continue
        if PY_MODULE.search(line):
            found["python_module"].append(n)
        if OPS.search(line):
            found["operators"].append(n)
    return found


def scan_loaders(tree: Path, files: list[str], mod: str) -> list[str]:
    """How the package's Python code finds a module: imports of it, load_library, find_spec by name."""
    leaf = mod.rsplit(".", 1)[-1]
    base = re.sub(r"_(cpu|cuda)$", "", leaf)
    hits = []
    for rel in files:
        try:
            text = (tree / rel).read_text(errors="replace")
        except OSError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if ("load_library" in line or "find_spec" in line or re.search(rf"\bimport\s+{leaf}\b", line)
                    or re.search(rf"from\s+\S+\s+import\s+.*\b{leaf}\b", line)
                    or (f"'{base}'" in line or f'"{base}"' in line)):
                hits.append(f"{rel}:{n}: {line.strip()}")
    return hits


class Provenance:
    """Which lines of setup.py made each argument of a constructor call: the call's argument expressions,
    the names they use, every statement of the enclosing scope that assigns or mutates those names
    (followed through the names those statements use), kept if it ran."""

    def __init__(self, setup_py: Path, executed: list[int]) -> None:
        self.text = setup_py.read_text()
        self.lines = self.text.splitlines()
        self.tree = ast.parse(self.text)
        self.executed = set(executed)
        for node in ast.walk(self.tree):
            for ch in ast.iter_child_nodes(node):
                ch._parent = node  # type: ignore[attr-defined]

    def line(self, n: int) -> str:
        return self.lines[n - 1].strip() if 0 < n <= len(self.lines) else ""

    def call_at(self, line: int) -> ast.Call | None:
        best = None
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Call) and node.lineno <= line <= (node.end_lineno or node.lineno) and (
                    best is None or (node.end_lineno or 0) - node.lineno < (best.end_lineno or 0) - best.lineno or \
                        (node.lineno == line and best.lineno != line)):
                best = node
        return best

    def scope(self, node: ast.AST) -> ast.AST:
        while hasattr(node, "_parent"):
            node = node._parent
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return node
        return self.tree

    @staticmethod
    def names(expr: ast.AST) -> set[str]:
        return {n.id for n in ast.walk(expr) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}

    @staticmethod
    def statements(scope: ast.AST) -> Any:
        """The statements of one scope: nested functions and classes are other scopes."""
        todo = list(ast.iter_child_nodes(scope))
        while todo:
            node = todo.pop(0)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            if isinstance(node, ast.stmt):
                yield node
            todo.extend(ast.iter_child_nodes(node))

    def writers(self, scope: ast.AST, name: str) -> list[ast.stmt]:
        out = []
        for st in self.statements(scope):
            targets: list[ast.AST] = []
            if isinstance(st, ast.Assign):
                targets = list(st.targets)
            elif isinstance(st, (ast.AugAssign, ast.AnnAssign, ast.For)):
                targets = [st.target]
            elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and \
                    isinstance(st.value.func, ast.Attribute):
                targets = [st.value.func.value]  # name.append(...), name['x'].extend(...)
            for t in targets:
                base = t
                while isinstance(base, (ast.Subscript, ast.Attribute)):
                    base = base.value
                if isinstance(base, ast.Name) and base.id == name or isinstance(base, ast.Tuple) and \
                        any(isinstance(e, ast.Name) and e.id == name for e in base.elts):
                    out.append(st)
                    break
        return out

    def called_functions(self, expr: ast.AST) -> set[int]:
        """Executed lines of setup.py's own functions that expr calls (append_nvcc_threads(...))."""
        defs = {st.name: st for st in self.tree.body if isinstance(st, ast.FunctionDef)}
        out: set[int] = set()
        for n in ast.walk(expr):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in defs:
                fd = defs[n.func.id]
                out.update(n for n in range(fd.body[0].lineno, (fd.end_lineno or fd.lineno) + 1)
                           if n in self.executed)
        return out

    def of_arg(self, call: ast.Call, expr: ast.AST) -> list[int]:
        scope = self.scope(call)
        first = getattr(expr, "lineno", 0)
        lines = set(range(first, (getattr(expr, "end_lineno", 0) or first) + 1)) | self.called_functions(expr)
        todo, seen = list(self.names(expr)), set()
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            for sc in ([scope, self.tree] if scope is not self.tree else [scope]):
                for st in self.writers(sc, name):
                    if st.lineno in self.executed:
                        if isinstance(st, ast.For):
                            lines.add(st.lineno)
                            todo += self.names(st.iter)
                        else:
                            lines.update(n for n in range(st.lineno, (st.end_lineno or st.lineno) + 1)
                                         if n in self.executed or n == st.lineno)
                            lines.update(self.called_functions(st))
                            todo += self.names(st)
        return sorted(lines)

    def of_key(self, call: ast.Call, expr: ast.AST, key: str) -> list[int]:
        """The lines that made expr[key] (extra_compile_args['cxx'] / ['nvcc']): the dict literal's value for
        the key, statements writing NAME[key], and whatever else assigns NAME as a whole."""
        if isinstance(expr, ast.Dict):
            for k, v in zip(expr.keys, expr.values, strict=True):
                if isinstance(k, ast.Constant) and k.value == key:
                    return self.of_arg(call, v)
            return []
        if not isinstance(expr, ast.Name):
            return self.of_arg(call, expr)
        scope = self.scope(call)
        lines: set[int] = {expr.lineno}
        for sc in ([scope, self.tree] if scope is not self.tree else [scope]):
            for st in self.writers(sc, expr.id):
                if st.lineno not in self.executed:
                    continue
                value = getattr(st, "value", None)
                targets = getattr(st, "targets", None) or [getattr(st, "target", None)]
                if isinstance(st, ast.Assign) and isinstance(value, ast.Dict):
                    lines.add(st.lineno)
                    for k, v in zip(value.keys, value.values, strict=True):
                        if isinstance(k, ast.Constant) and k.value == key:
                            lines.update(self.of_arg(call, v))
                    continue
                sub = next((t for t in targets if isinstance(t, ast.Subscript)), None)
                if sub is None and isinstance(st, ast.Expr):  # NAME['k'].append(...)
                    f = st.value.func.value  # type: ignore[attr-defined]
                    sub = f if isinstance(f, ast.Subscript) else None
                if sub is not None:
                    if isinstance(sub.slice, ast.Constant) and sub.slice.value != key:
                        continue
                    lines.update(range(st.lineno, (st.end_lineno or st.lineno) + 1))
                    rhs = value if value is not None else st
                    if isinstance(st, ast.Expr):  # NAME['k'].append(x): follow x
                        rhs = ast.Tuple(elts=list(getattr(st.value, "args", [])), ctx=ast.Load(), lineno=st.lineno,
                                        end_lineno=st.end_lineno)
                    if getattr(rhs, "elts", True):
                        lines.update(self.of_arg(call, rhs))
                else:
                    lines.update(self.of_arg(call, st))
        return sorted(lines)

    def args(self, line: int) -> dict[str, list[int]]:
        call = self.call_at(line)
        if call is None:
            return {}
        out = {}
        for i, a in enumerate(call.args):
            out[["name", "sources"][i] if i < 2 else f"arg{i}"] = self.of_arg(call, a)
        for kw in call.keywords:
            if kw.arg:
                out[kw.arg] = self.of_arg(call, kw.value)
                if kw.arg == "extra_compile_args":
                    for key in ("cxx", "nvcc"):
                        out[f"extra_compile_args[{key!r}]"] = self.of_key(call, kw.value, key)
        return out


def rel_to_tree(p: str, tree: Path, torch_dir: str, cuda_home: str | None) -> str:
    path = p if os.path.isabs(p) else os.path.normpath(os.path.join(tree, p))
    real = os.path.realpath(path)
    for base in (str(tree), os.path.realpath(tree)):
        if real == base or real.startswith(base + os.sep):
            return os.path.relpath(real, base)
    if real.startswith(os.path.realpath(torch_dir)):
        return "<torch>/" + os.path.relpath(real, os.path.realpath(torch_dir))
    if cuda_home and real.startswith(os.path.realpath(cuda_home)):
        return "<cuda>/" + os.path.relpath(real, os.path.realpath(cuda_home))
    return "<outside>" + real


def postprocess(raw: dict, tree: Path, origin: dict, cuda_home: str | None, env: dict[str, str]) -> dict:
    torch_dir = (raw.get("torch") or {}).get("dir", "")
    prov = Provenance(tree / "setup.py", raw["executed_lines"])
    call = raw["setup_calls"][-1] if raw["setup_calls"] else {}
    pk = call.get("packages") or {}
    py_files = [m for m in pk.get("module_files", [])]
    options: dict[str, Any] = {}
    for c in (call.get("cmdclass") or {}).values():
        if c.get("is_torch_build_ext"):
            options = c.get("options") or {}

    def where(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"line": f["line"], "function": f["function"], "text": prov.line(f["line"])} for f in frames]

    exts = []
    for e in raw["extensions"]:
        def rel(v: str) -> str:
            return rel_to_tree(v, tree, torch_dir, cuda_home)
        eca = e["extra_compile_args"]
        if isinstance(eca, dict):
            cxx, nvcc, others = eca.get("cxx", []), eca.get("nvcc", []), \
                {k: v for k, v in eca.items() if k not in ("cxx", "nvcc")}
        else:  # one list: BuildExtension gives it to both compilers
            cxx, nvcc, others = list(eca), list(eca), {}
        nvcc_kept, nvcc_arch = split_arch_flags(nvcc)
        added = e["torch_added"]
        user_inc = [rel(x) for x in e["include_dirs"] if str(x) not in added.get("include_dirs", [])]
        user_libdirs = [rel(x) for x in e["library_dirs"] if str(x) not in added.get("library_dirs", [])]
        user_libs = list(e["libraries"])
        for lib in added.get("libraries", []):
            if lib in user_libs:
                user_libs.remove(lib)
        units = {}
        for s in e["sources"]:
            try:
                units[rel(s)] = scan_unit((tree / rel(s)).read_text(errors="replace"))
            except OSError:
                units[rel(s)] = {"error": "unreadable"}
        pym = sorted({f"{u}:{n}" for u, f in units.items() for n in f.get("python_module", [])})
        ops = sorted({f"{u}:{n}" for u, f in units.items() for n in f.get("operators", [])})
        parts = e["name"].split(".")
        suffix = ".so" if options.get("no_python_abi_suffix") else (raw.get("torch") or {}).get("ext_suffix", "")
        site_line = e["frames"][-1]["line"] if e["frames"] else None
        exts.append({
            "name": e["name"], "module": parts[-1], "package": ".".join(parts[:-1]) or None,
            "install_as": "/".join(parts) + suffix, "kind": e["kind"],
            "sources": [rel(s) for s in e["sources"]],
            "cuda_sources": [rel(s) for s in e["sources"] if s.endswith((".cu", ".cuh"))],
            "cpp_only": not any(s.endswith(".cu") for s in e["sources"]),
            "include_dirs": user_inc, "define_macros": e["define_macros"], "undef_macros": e["undef_macros"],
            "extra_compile_args": {"cxx": cxx, "nvcc": nvcc_kept, **others},
            "nvcc_arch_flags_dropped": nvcc_arch, "nvcc_notes": notable_nvcc(nvcc),
            "libraries": user_libs, "library_dirs": user_libdirs,
            "runtime_library_dirs": e["runtime_library_dirs"], "extra_link_args": e["extra_link_args"],
            "extra_objects": e["extra_objects"], "py_limited_api": e["py_limited_api"],
            "torch_added": {k: [rel(x) if k != "libraries" else x for x in v] for k, v in added.items()},
            "python_module": bool(pym) if (pym or ops) else None,
            "python_module_evidence": pym, "operator_registrations": ops,
            "loaded_by": scan_loaders(tree, py_files, e["name"]),
            "changed_after_constructor": e["changed_after_constructor"],
            "made_at": where(e["frames"]),
            "argument_lines": prov.args(site_line) if site_line else {},
        })

    reads: dict[str, dict] = {}
    for r in raw["env_reads"]:
        d = reads.setdefault(r["key"], {"key": r["key"], "value": r["value"], "set_by_capture": r["key"] in env,
                                        "defaults": [], "read_at": [], "direct": False})
        if r["default"] is not None and r["default"] not in d["defaults"]:
            d["defaults"].append(r["default"])
        d["direct"] = d["direct"] or r["direct"]
        line = r["frames"][-1]["line"]
        if line not in [x["line"] for x in d["read_at"]]:
            d["read_at"].append({"line": line, "text": prov.line(line)})
    probes: list[dict[str, Any]] = []
    for p in raw["probes"]:
        line = p["frames"][-1]["line"] if p["frames"] else None
        key = (p["call"], line)
        if key not in [(q["call"], q["line"]) for q in probes]:
            probes.append({"call": p["call"], "answer": p["answer"], "line": line, "text": prov.line(line or 0),
                           "direct": p["direct"]})
    return {
        "origin": origin,
        "capture": {"cuda_home": cuda_home, "env_set": env, "argv": raw.get("argv"), "shims": raw["shims"],
                    "torch": raw.get("torch"), "errors": raw["errors"]},
        "env_reads": list(reads.values()),
        "cuda_probes": probes,
        "subprocesses": [{"argv": s["argv"], "line": s["frames"][-1]["line"],
                          "text": prov.line(s["frames"][-1]["line"])} for s in raw["subprocesses"]],
        "network": raw["network"],
        "setup": {"line": (call.get("frames") or [{}])[-1].get("line"), "cmdclass": call.get("cmdclass"),
                  "build_ext_options": options, "n_ext_modules": call.get("n_ext_modules"),
                  "cxx11_abi_changed": (raw.get("torch") or {}).get("cxx11_abi_at_import")
                  != call.get("cxx11_abi_at_setup"),
                  "attrs": {k: v for k, v in (call.get("attrs") or {}).items()
                            if k in ("name", "version", "packages", "package_dir", "package_data", "py_modules",
                                     "include_package_data", "install_requires", "python_requires",
                                     "setup_requires", "zip_safe", "data_files", "entry_points")}},
        "setuptools_compiler": raw.get("setuptools_compiler"),
        "package": pk, "package_error": call.get("packages_error"),
        "extensions": exts,
    }


# ------------------------------------------------------------------------------------ the proposed recipe

# Everything the capture reports is the package's to choose (a hostile setup.py forges it): no text of it reaches
# the recipe but through these three encoders, and the written text is parsed back and compared with what was
# meant (check_written), so no name, URL or comment can add a table or a key.
BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+\Z")
_SHORT = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def toml_str(s: str) -> str:
    """A TOML basic string, ASCII only: quotes, backslashes, control characters and every non-ASCII character
    escaped; a lone surrogate (a file name's undecodable byte), which TOML cannot say, refused."""
    from hermetic.errors import BadInput
    out = []
    for ch in s:
        o = ord(ch)
        if ch in _SHORT:
            out.append(_SHORT[ch])
        elif 0xD800 <= o <= 0xDFFF:
            raise BadInput(f"{comment_text(s)} holds a character TOML cannot say (a lone surrogate)",
                           where="hermetic recipe new", hint="write this recipe by hand")
        elif 0x20 <= o < 0x7F:
            out.append(ch)
        else:
            out.append(f"\\u{o:04x}" if o <= 0xFFFF else f"\\U{o:08x}")
    return '"' + "".join(out) + '"'


def toml_key(k: str) -> str:
    """A TOML key: bare where TOML allows it, else a quoted string."""
    return k if BARE_KEY.match(k) else toml_str(k)


def comment_text(s: str) -> str:
    """Text for a ``#`` comment: one line whatever it holds: control, format and line-separator characters
    (and backslashes, so that the escapes read back) written as Python escapes."""
    import unicodedata
    out = []
    for ch in str(s):
        if ch in "\\\n\r\t":
            out.append(_SHORT[ch])
        elif unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
            o = ord(ch)
            out.append(f"\\x{o:02x}" if o <= 0xFF else f"\\u{o:04x}" if o <= 0xFFFF else f"\\U{o:08x}")
        else:
            out.append(ch)
    return "".join(out)


def comment(text: str) -> str:
    """A whole-line comment."""
    return "# " + comment_text(text)


def toml_val(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return toml_str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_val(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{toml_key(k)} = {toml_val(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"no TOML value for {type(v).__name__}")


def _plain(v: object) -> object:
    """A value as TOML reads it back (tuples are arrays)."""
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


class RecipeText:
    """The recipe's lines, and beside them the data they are meant to parse to."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.data: dict[str, Any] = {}
        self._table: dict[str, Any] = self.data

    def comment(self, text: str) -> None:
        self.lines.append(comment(text))

    def blank(self) -> None:
        self.lines.append("")

    def table(self, path: tuple[str, ...], note: str = "") -> None:
        t = self.data
        for part in path:
            t = t.setdefault(part, {})
        self._table = t
        self.lines.append("[" + ".".join(toml_key(p) for p in path) + "]" + (f"   # {comment_text(note)}" if note
                                                                              else ""))

    def array_table(self, name: str, note: str = "") -> None:
        self._table = {}
        self.data.setdefault(name, []).append(self._table)
        self.lines.append(f"[[{toml_key(name)}]]" + (f"   # {comment_text(note)}" if note else ""))

    def key(self, k: str, v: object, note: str = "") -> None:
        if k in self._table:
            raise ValueError(f"key {k!r} written twice")
        self._table[k] = _plain(v)
        self.lines.append(f"{toml_key(k)} = {toml_val(v)}" + (f"   # {comment_text(note)}" if note else ""))

    def text(self) -> str:
        return "\n".join(self.lines)


def _difference(meant: object, read: object, at: str) -> str | None:
    """The first key path where the text's data is not the data meant, said as a sentence."""
    if isinstance(meant, dict) and isinstance(read, dict):
        for k in sorted(set(meant) | set(read)):
            where = f"{at}.{k}" if at else k
            if k not in meant:
                return f"key {where!r} is in the text, never written"
            if k not in read:
                return f"key {where!r} was written but is not in the text"
            d = _difference(meant[k], read[k], where)
            if d:
                return d
        return None
    if isinstance(meant, list) and isinstance(read, list) and len(meant) == len(read):
        for i, (a, b) in enumerate(zip(meant, read, strict=True)):
            d = _difference(a, b, f"{at}[{i}]")
            if d:
                return d
        return None
    return None if meant == read else f"key {at!r} reads back as {read!r}, not {meant!r}"


def check_written(text: str, meant: dict[str, Any], where: str) -> None:
    """Belt and braces: the recipe text parses, and to exactly the tables and keys the writer meant."""
    import tomllib

    from hermetic.errors import BadInput
    try:
        read = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise BadInput(f"the recipe written from setup.py's record is not TOML ({e})", where=where,
                       hint="a name or value from setup.py broke the text; write this recipe by hand") from None
    diff = _difference(meant, read, "")
    if diff is not None:
        raise BadInput(f"the recipe written from setup.py's record does not read back as written: {diff}",
                       where=where, hint="a name or value from setup.py broke the text; write this recipe by hand")


def lines_note(ls: list[int]) -> str:
    if not ls:
        return ""
    out, start, prev = [], ls[0], ls[0]
    for n in ls[1:] + [None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return "setup.py:" + ",".join(out)


def recipe_keys(x: dict[str, Any], setuptools_cflags: list[str]) -> dict[str, tuple[object, str]]:
    """An extension's recipe keys, each with the comment naming the setup.py lines it came from."""
    al = x["argument_lines"]
    k: dict[str, tuple[object, str]] = {}
    kind = x["kind"] if x["kind"] in ("cuda", "cpp") else "cpp"
    maker = {"cuda": "CUDAExtension", "cpp": "CppExtension"}.get(x["kind"], "setuptools.Extension")
    k["kind"] = (kind, f"{maker} at {lines_note([x['made_at'][-1]['line']] if x['made_at'] else [])}")
    inc = [d for d in x["include_dirs"] if not d.startswith("<")]
    foreign = [d for d in x["include_dirs"] if d.startswith("<")]
    if inc or foreign:
        k["include_dirs"] = (inc, lines_note(al.get("include_dirs", [])) + (
            f"; left out {foreign}: folders outside the tree" if foreign else ""))
    from hermetic.errors import BadInput
    from hermetic.recipe import DEFINE_RE
    defines = {n: (True if v is None else str(v)) for n, v in x["define_macros"]}
    for n in defines:
        if not isinstance(n, str) or not DEFINE_RE.match(n):
            raise BadInput(f"setup.py's define_macros name '{comment_text(n)}' is not a C identifier",
                           where=f"setup.py:{','.join(map(str, al.get('define_macros', []))) or '?'}",
                           hint="a define's name is a C identifier; write this recipe by hand")
    if defines:
        k["defines"] = (defines, lines_note(al.get("define_macros", [])) + " (true: -DNAME)")
    cflags = [*setuptools_cflags, *x["extra_compile_args"].get("cxx", []), *(f"-U{u}" for u in x["undef_macros"])]
    if cflags:
        note = lines_note(al.get("extra_compile_args['cxx']", al.get("extra_compile_args", []))) + \
            " extra_compile_args['cxx']"
        if setuptools_cflags:
            note += (f"; first {len(setuptools_cflags)}: the interpreter's sysconfig flags, which setuptools gives "
                     "every C++ unit (-DNDEBUG turns assert() off, as in a pip build)")
        k["cflags"] = (cflags, note)
    cuda = list(x["extra_compile_args"].get("nvcc", []))
    if kind == "cuda" and cuda:
        note = lines_note(al.get("extra_compile_args['nvcc']", al.get("extra_compile_args", []))) + \
            " extra_compile_args['nvcc']"
        if x["nvcc_arch_flags_dropped"]:
            note += f"; dropped for [toolchain] archs: {' '.join(x['nvcc_arch_flags_dropped'])}"
        k["cuda_cflags"] = (cuda, note)
    ld = [*(f"-l{lib}" for lib in x["libraries"]), *(f"-L{d}" for d in x["library_dirs"] if d.startswith("/")),
          *(f"-Wl,-rpath,{d}" for d in x["runtime_library_dirs"]), *x["extra_link_args"]]
    if ld:
        k["ldflags"] = (ld, lines_note(sorted({*al.get("extra_link_args", []), *al.get("libraries", []),
                                                *al.get("library_dirs", [])})))
    if x["python_module"] is False:
        k["python_module"] = (False, "an operator library: no PyInit_ outside #ifdef _WIN32, operators "
                              "registered in its sources; checked with torch.ops.load_library")
    return k


class Origin(NamedTuple):
    """Where the sdist comes from, as the recipe's [sources] says it."""
    name: str                      # the source's name in the recipe
    url: str | None                # [sources] url (--url, else the file's own file: URL)
    path: str | None               # a folder: path, relative to the recipe
    sha256: str | None
    file: str


def write_recipe(rep: dict[str, Any], name: str, origin: Origin, cuda: str, lock: str) -> str:
    """The recipe TOML: every value with a comment naming the setup.py lines it came from; every key, value and
    comment through the encoders above, and the text checked to read back as meant."""
    exts = rep["extensions"]
    sc = (rep.get("setuptools_compiler") or {}).get("compiler_so_cxx") or []
    setuptools_cflags = [f for f in sc[1:] if f != "-fPIC"]
    per = [recipe_keys(x, setuptools_cflags) for x in exts]
    shared: dict[str, tuple[object, str]] = {}
    if len(exts) > 1:
        for key, (val, _note) in per[0].items():
            if all(key in p and p[key][0] == val for p in per[1:]):
                notes = sorted({p[key][1] for p in per})
                shared[key] = (val, notes[0] if len(notes) == 1 else "; ".join(notes))
    torch = rep["capture"].get("torch") or {}
    w = RecipeText()
    w.comment(f"Generated by `hermetic recipe new` from {origin.file}: its setup.py run with torch "
              f"{torch.get('version')}, CUDA_HOME = hermetic's CUDA {cuda} toolchain, "
              f"sys.argv = {rep['capture']['argv']}.")
    w.comment("The lists below are as setup.py's process reported them: a hostile setup.py can forge them; "
              "the sandbox it ran in is the guarantee.")
    for p in rep["cuda_probes"]:
        w.comment(f"setup.py:{p['line']} asked {p['call']}() -> {p['answer']!r}"
                  f"{' (a GPU pretended)' if p['answer'] is True else ''}: {p['text']}")
    env_set = rep["capture"]["env_set"]
    w.comment("Environment options setup.py read, as setup.py's process reported them (set with `recipe new "
              "--env K=V`; set here: " + (", ".join(f"{k}={v}" for k, v in env_set.items()) or "none") + "):")
    for r in rep["env_reads"]:
        at = ", ".join(f"setup.py:{a['line']}" for a in r["read_at"])
        default = f" (default {r['defaults'][0]!r})" if r["defaults"] else ""
        w.comment(f"  {r['key']} = {r['value']!r}{default}  {at}{'' if r['direct'] else ' (inside torch)'}")
    for s in rep["subprocesses"]:
        w.comment(f"setup.py:{s['line']} ran {s['argv']}")
    for n in rep["network"]:
        line = (n.get("frames") or [{}])[-1].get("line") if isinstance(n, dict) else None
        what = f"{n.get('call')}({n.get('url')})" if isinstance(n, dict) else str(n)
        w.comment(f"setup.py:{line} tried the network, refused: {what}")
    for c, d in (rep["setup"]["cmdclass"] or {}).items():
        if not d["is_torch_build_ext"] or d["own_methods"]:
            w.comment(f"cmdclass {c}: {d['module']}.{d['class']} (own methods {d['own_methods']}): never run by "
                      "hermetic; check that it changes no flag")
    options = rep["setup"]["build_ext_options"] or {}
    if options.get("no_python_abi_suffix"):
        w.comment("BuildExtension.with_options(no_python_abi_suffix=True): pip names the files NAME.so; hermetic "
                  "installs NAME + the interpreter's suffix, which importlib's finders find just as well")
    w.blank()
    w.table(("recipe",))
    w.key("name", name)
    w.blank()
    w.table(("toolchain",))
    w.key("cuda", cuda)
    w.key("lock", lock)
    w.key("archs", ["9.0"], "architecture flags of setup.py are dropped for these")
    w.blank()
    w.table(("sources", origin.name))
    if origin.url is not None:
        w.key("url", origin.url)
    else:
        w.key("path", origin.path or ".")
    if origin.sha256:
        w.key("sha256", origin.sha256)
    w.blank()
    pk = rep["package"]
    if pk and pk.get("packages"):
        pdir = pk.get("package_dir") or {}
        base = pdir.get("", "")
        w.table(("package",), "the sdist's Python code, installed beside the built modules")
        w.key("source", origin.name)
        w.key("packages", list(pk["packages"]), f"setup.py:{rep['setup']['line']} setup(packages=...)")
        if base and (base.startswith("/") or ".." in base.split("/")):
            w.comment(f"package_dir {base!r} leaves the source tree: not written (realize refuses it); check where "
                      "these packages' files are")
        elif base:
            w.key("package_dir", base)
        others = {k: v for k, v in pdir.items() if k}
        if others:
            w.comment(f"package_dir maps {others}: not expressible; check where these packages' files go")
        data = sorted({_data_pattern(d, base) for d in pk.get("package_data_files", [])} - {""})
        if data:
            w.key("data", data, f"package data (include_package_data = {pk.get('include_package_data')}, "
                                f"package_data = {pk.get('package_data') or {}})")
        w.blank()
    if shared:
        w.table(("shared", "common"), "the same in every extension below")
        w.key("source", origin.name)
        for key, (val, note) in shared.items():
            w.key(key, val, note)
        w.blank()
    for x, p in zip(exts, per, strict=True):
        w.array_table("extensions", " <- ".join(f"setup.py:{f['line']} {f['function']}"
                                                for f in reversed(x["made_at"])))
        w.key("name", x["name"])
        if shared:
            w.key("shared", "common")
        else:
            w.key("source", origin.name)
        lines = x["argument_lines"].get("sources", [])
        w.key("sources", list(x["sources"]), lines_note(lines))
        for key, (val, note) in p.items():
            if key not in shared:
                w.key(key, val, note)
        if p["kind"][0] == "cuda" and x["cpp_only"]:
            w.comment("no .cu file: kind = \"cuda\" still gives every unit CUDA's include folder and links "
                      "cudart, as CUDAExtension does")
        for n in x["nvcc_notes"]:
            w.comment(str(n))
        w.blank()
    text = w.text()
    check_written(text, w.data, f"the recipe from {comment_text(origin.file)}")
    return text


def _data_pattern(d: dict[str, str], base: str) -> str:
    """A package data file as a ``data`` pattern relative to its package's folder ("" for a .py file)."""
    rel = d["file"][len(base) + 1:] if base and d["file"].startswith(base + "/") else d["file"]
    folder = d["package"].replace(".", "/") + "/"
    if not rel.startswith(folder) or rel.endswith(".py"):
        return ""
    return rel[len(folder):]


# ------------------------------------------------------------------------------------------ the command
RESULT = "hermetic-capture-result: "   # the capture's one line of output (extensions/capture.py)
CAPTURE_TIMEOUT_S = 600.0
ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


class NewRecipe(NamedTuple):
    """What ``hermetic recipe new`` was asked."""
    source: Path                    # an sdist (.tar.gz, .zip) or a folder holding setup.py
    env: dict[str, str]             # --env K=V: setup.py's options
    name: str | None = None         # the recipe's name (default: the distribution's)
    url: str | None = None          # where the sdist is fetched from (default: its file: URL)
    cuda: str = "13.0"              # the toolchain profile (profiles/cuda-VERSION) that is CUDA_HOME
    python: str | None = None       # the interpreter setup.py runs in (default: the running one)
    gpu: str = "pretend"            # torch.cuda.is_available() answers True (pretend) or the truth (none)
    lock: str | None = None         # the recipe's [toolchain] lock
    timeout: float = 600.0          # seconds setup.py may run (--timeout)


def toolchain_home(root_profiles: Path, cuda: str) -> Path:
    """The CUDA folder of the root's toolchain profile (``realize recipes/toolchain.toml`` makes it)."""
    from hermetic.errors import BadInput
    major = cuda.split(".")[0]
    home = root_profiles / f"cuda-{cuda}" / "nvidia" / f"cu{major}"
    if not (home / "bin" / "nvcc").is_file() or not (home / "include" / "cuda.h").is_file():
        raise BadInput(f"the root has no CUDA {cuda} toolchain profile ({home} holds no bin/nvcc)",
                       where=str(root_profiles), hint="realize the toolchain recipe first: hermetic realize "
                                                      "recipes/toolchain.toml (its name is cuda-" + cuda + ")")
    return home


BASICS = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TERM")


def capture_env(root_env: dict[str, str], cuda_home: Path, archs: str, options: dict[str, str]) -> dict[str, str]:
    """setup.py's environment: the root's homes, temp and cache folders, a few basics, no CUDA but the
    toolchain's, and of the caller's own variables none: only what ``--env`` sets, so that the options setup.py
    read are exactly the ones the recipe records."""
    env = {k: v for k, v in root_env.items() if k in BASICS or os.environ.get(k) != v}
    env = {k: v for k, v in env.items() if not k.startswith(("CUDA_PATH", "CUDA_INC", "CUDNN", "TORCH_CUDA"))}
    env["CUDA_HOME"] = str(cuda_home)   # torch's first guess; without it an nvcc on PATH would win
    env["PATH"] = os.pathsep.join([str(cuda_home / "bin"), *(p for p in env.get("PATH", "").split(os.pathsep)
                                                              if p and "cuda" not in p.lower())])
    env["TORCH_CUDA_ARCH_LIST"] = archs
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return {**env, **options}


def parse_env(pairs: list[str]) -> dict[str, str]:
    from hermetic.errors import BadInput
    out = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not ENV_RE.match(key):
            raise BadInput(f"--env {pair!r} is not KEY=VALUE", where="hermetic recipe new",
                           hint="for example --env FORCE_ONLY_CUDA=1")
        out[key] = value
    return out


def run_capture(python: str, tree: Path, env: dict[str, str], gpu: str, archs: str,
                timeout: float = CAPTURE_TIMEOUT_S) -> tuple[dict[str, Any], str]:
    """The capture in ``python``, in ``tree`` (inside the confinement in effect): its record and output. Past
    ``timeout`` seconds setup.py's whole session is stopped (procs.run_limited) and the capture fails (exit 1)."""
    from hermetic.errors import BadInput, WorkFailed
    from hermetic.procs import Limits, TimedOut, run_limited, tail_line
    script = Path(__file__).with_name("capture.py")
    # setup.py's output: its end is enough, each line cut as the tail's are (800 lines of 1 MB grew hermetic
    # by 800 MB: the re-attack on issue 41, R4); of the records, two say there was more than one
    lines: collections.deque[str] = collections.deque(maxlen=400)
    found: list[str] = []
    records = [0]

    def on_line(line: str) -> None:
        if line.startswith(RESULT):
            records[0] += 1
            if len(found) < 2:
                found.append(line)
        else:
            lines.append(tail_line(line))

    try:
        rc, _tail = run_limited([python, str(script), str(tree), "--gpu", gpu, "--archs", archs],
                                cwd=str(tree), env=env, limits=Limits(), on_line=on_line,
                                timeout=timeout)
    except TimedOut:
        raise WorkFailed(f"setup.py ran past its deadline of {timeout:g} s and was stopped, with every process it "
                         f"started", where=str(tree / "setup.py"),
                         hint="a setup.py that waits (for the network, which the sandbox does not have, for "
                              "input) cannot be captured; one that is only slow: recipe new --timeout S") from None
    output = "\n".join(lines)
    if records[0] != 1:   # none: the capture never finished; more: setup.py printed one too
        raise BadInput(f"the capture of setup.py gave {records[0]} records (exit {rc}):\n{output[-3000:]}",
                       where=str(tree / "setup.py"), hint="an option it needs: --env KEY=VALUE (its output above "
                                                         "says which); a setup.py printing hermetic's marker "
                                                         "cannot be captured")
    try:
        record = json.loads(found[0][len(RESULT):])
    except ValueError:
        record = None
    if not isinstance(record, dict):
        raise BadInput("the capture's record is not JSON", where=str(tree / "setup.py"),
                       hint="setup.py wrote into the capture's output; this package cannot be captured")
    return record, output


def derive(root: Any, request: NewRecipe, reporter: Any) -> str:
    """The recipe TOML for ``request.source``: unpacked into a scratch folder under the root's tmp/ (removed
    after), its setup.py captured there."""
    import sys

    from hermetic import fs
    from hermetic.errors import BadInput
    src = request.source
    if not src.exists():
        raise BadInput(f"{src} does not exist", where="hermetic recipe new", hint="an sdist (.tar.gz) or a folder")
    cuda_home = toolchain_home(root.profiles, request.cuda)
    sha = None if src.is_dir() else fs.sha256_file(src)[0]
    with fs.scratch_dir(root.tmp, "recipe-new-") as work:
        tree = work / "tree"
        _unpack(src, sha, tree)
        env = capture_env(root.child_env(), cuda_home, "9.0", request.env)
        reporter.event("phase", f"running {src.name}'s setup.py (nothing compiles)", phase="capturing")
        raw, output = run_capture(request.python or sys.executable, tree, env, request.gpu, "9.0",
                                  request.timeout)
        if raw.get("errors"):
            first = raw["errors"][0]
            detail = first.get("traceback", first) if isinstance(first, dict) else first
            raise BadInput(f"setup.py failed:\n{str(detail)[-2000:]}\n{output[-1500:]}", where=str(src),
                           hint="an option it needs: --env KEY=VALUE")
        if not raw.get("extensions"):
            raise BadInput(f"{src.name}'s setup.py made no extension", where=str(src),
                           hint="its options may choose none (the environment it read is listed with -v): "
                                "--env KEY=VALUE")
        try:
            rep = postprocess(raw, tree, {"path": str(src)}, str(cuda_home), request.env)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            raise BadInput(f"the capture's record of setup.py is not as the capture writes it ({type(e).__name__}: "
                           f"{e})", where=str(src), hint="setup.py changed the capture's output or objects; "
                                                         "write this recipe by hand") from None
    dist = (rep.get("package") or {}).get("name") or src.name
    name = request.name or re.sub(r"[^A-Za-z0-9._-]", "-", str(dist))[:64]
    from hermetic.recipe import NAME_RE
    if not NAME_RE.match(name):   # the words realize would say of the written recipe
        raise BadInput(f"recipe name '{comment_text(name)}' is not a plain name",
                       where="hermetic recipe new" if request.name else f"{src.name}'s setup.py setup(name=...)",
                       hint="use letters, digits, '.', '_' and '-' (at most 64)" + (
                           "" if request.name else ", or choose one: recipe new --name NAME"))
    url = request.url or (None if sha is None else src.resolve().as_uri())
    origin = Origin(re.sub(r"[^A-Za-z0-9_]", "_", str(dist)), url, None if sha is not None else str(src), sha,
                    src.name)
    lock = request.lock or f"../manifests/cuda-{request.cuda}-toolchain.txt"
    try:
        return write_recipe(rep, name, origin, request.cuda, lock)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise BadInput(f"the capture's record of setup.py is not as the capture writes it ({type(e).__name__}: "
                       f"{e})", where=str(src), hint="setup.py changed the capture's output or objects; "
                                                     "write this recipe by hand") from None


def _unpack(src: Path, sha: str | None, tree: Path) -> None:
    """The tree setup.py runs in: the sdist's files, its one top folder stripped (as a recipe's source is),
    every member checked (extensions.sources); or a copy of the folder."""
    from hermetic.errors import BadInput
    from hermetic.extensions.sources import copy_folder, extract
    from hermetic.recipe import Source
    tree.mkdir()
    if sha is None:
        copy_folder(src, tree)
    else:
        extract(src, Source(src.name, url=src.resolve().as_uri(), sha256=sha, where=str(src)), tree)
    if not (tree / "setup.py").is_file():
        raise BadInput(f"{src} has no setup.py at its top (an sdist's one top folder is stripped)", where=str(src),
                       hint="recipe new reads a setup.py; a package without one needs a hand-written recipe")
