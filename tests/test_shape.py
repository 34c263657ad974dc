"""The shape rules of issue 42, beside tests/test_architecture.py's (which stay as they are): the pipelines pass
values, and what they pass is spelled once. Each rule has a self-check on a snippet, so that it can fail."""

from __future__ import annotations

import ast

from hermetic.realize.noop import LEGACY, LINKED_KEY, OBJECT_KEYS, TOTAL_KEY, WHEEL_KEYS
from tests.support.cli import REPO

PACKAGE = REPO / "hermetic"
COUNTS_MODULE = "hermetic/realize/noop.py"


def _sources() -> dict[str, ast.Module]:
    return {p.relative_to(REPO).as_posix(): ast.parse(p.read_text(), str(p)) for p in sorted(PACKAGE.rglob("*.py"))}


# --- each count key is spelled in one module -------------------------------------------------------------------

# the keys of ``Counts`` that no other record uses for something else: with a "_" or a "-" ("wheels", "reused" or
# "files" also name events and fields of other records)
COUNT_KEYS = sorted({key for _a, key in (*WHEEL_KEYS, *OBJECT_KEYS) if "_" in key or "-" in key}
                    | {LINKED_KEY, *LEGACY})


def count_key_spellings(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of every string that spells a count key, and of every f-string that builds one (attribute
    names in ``__slots__`` are no keys)."""
    slots = {id(n) for a in ast.walk(tree) if isinstance(a, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in a.targets) for n in ast.walk(a.value)}
    found = []
    for node in ast.walk(tree):
        if id(node) in slots:
            continue
        if isinstance(node, ast.Constant) and node.value in COUNT_KEYS:
            found.append((node.lineno, repr(node.value)))
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant) \
                and str(node.values[0].value).startswith(("objects_", "modules_")):
            found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def test_the_count_key_check_sees_each_spelling() -> None:
    code = ('c["objects_compiled"]\nc.get("objects_reused-variant", 0)\nf"objects_{k}"\n{"modules_linked": 1}\n'
            '"objects_objects" in c\n"objects"\n"wheels"\nf"{n} objects"\n__slots__ = ("fetched_bytes",)\n')
    assert [line for line, _ in count_key_spellings(ast.parse(code))] == [1, 2, 3, 4, 5]


def test_each_count_key_is_spelled_in_one_module() -> None:
    assert TOTAL_KEY == "objects" and "objects_compiled" in COUNT_KEYS
    offenders = [f"{rel}:{line}: {what}" for rel, tree in _sources().items() if rel != COUNTS_MODULE
                 for line, what in count_key_spellings(tree)]
    assert not offenders, f"count keys are spelled in {COUNTS_MODULE} only (realize.noop.Counts):\n" + \
        "\n".join(offenders)


# --- host facts are read by key in extensions/host.py only -----------------------------------------------------------

HOST_MODULE = "hermetic/extensions/host.py"
HOST_NAMES = ("facts", "host")


def _named(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id in HOST_NAMES or \
        isinstance(node, ast.Attribute) and node.attr in HOST_NAMES


def host_key_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of every ``facts["k"]``, ``facts.get("k")``, ``host["k"]`` and ``host.get("k")``, on a name or
    an attribute so named: the host facts read by string key (extensions.host.HostFacts has attributes)."""
    def string(node: ast.AST) -> bool:
        return isinstance(node, ast.Constant) and isinstance(node.value, str)

    found = []
    for node in ast.walk(tree):
        subscript = isinstance(node, ast.Subscript) and _named(node.value) and string(node.slice)
        get = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
            and _named(node.func.value) and bool(node.args) and string(node.args[0])
        if subscript or get:
            found.append((getattr(node, "lineno", 0), ast.unparse(node)))
    return sorted(found)


def test_the_host_facts_check_sees_each_read() -> None:
    code = ('facts["torch"]\nfacts.get("executable")\nself.facts["ext_suffix"]\nhost.get("torch")\nr.host["python"]\n'
            'facts[k]\nfacts.get(path)\nother["torch"]\nhost.torch\nfacts.items()\n')
    assert [line for line, _ in host_key_reads(ast.parse(code))] == [1, 2, 3, 4, 5]


def test_no_module_but_build_host_reads_host_facts_by_key() -> None:
    offenders = [f"{rel}:{line}: {what}" for rel, tree in _sources().items() if rel != HOST_MODULE
                 for line, what in host_key_reads(tree)]
    assert not offenders, f"host facts are read through extensions.host.HostFacts, by key only in {HOST_MODULE}:\n" + \
        "\n".join(offenders)


# --- the pipelines pass values: no step takes more than eight parameters ----------------------------------------

PIPELINE_ROOMS = ("hermetic/extensions/", "hermetic/realize/", "hermetic/run/")
MAX_PARAMETERS = 8


def wide_functions(tree: ast.AST, limit: int = MAX_PARAMETERS) -> list[tuple[int, str, int]]:
    """(line, name, parameters) of every function taking more than ``limit``: positional, keyword-only,
    ``*args`` and ``**kwargs`` each count one; ``self`` and ``cls`` do not."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
            if names and names[0] in ("self", "cls"):
                names = names[1:]
            n = len(names) + (a.vararg is not None) + (a.kwarg is not None)
            if n > limit:
                found.append((node.lineno, node.name, n))
    return sorted(found)


def test_the_parameter_count_sees_each_kind() -> None:
    code = ("def a(p1, p2, p3, p4, p5, p6, p7, p8): ...\ndef b(p1, p2, p3, p4, p5, p6, p7, *, p8, p9): ...\n"
            "class C:\n    def m(self, p1, p2, p3, p4, p5, p6, p7, p8): ...\n"
            "def d(p1, p2, p3, p4, p5, p6, p7, *args, **kwargs): ...\n"
            "async def e(p1, p2, p3, p4, p5, p6, p7, p8, p9): ...\n")
    assert wide_functions(ast.parse(code)) == [(2, "b", 9), (5, "d", 9), (6, "e", 9)]


def test_no_step_of_the_pipelines_takes_more_than_eight_parameters() -> None:
    offenders = [f"{rel}:{line}: {name} takes {n}" for rel, tree in _sources().items()
                 if rel.startswith(PIPELINE_ROOMS) for line, name, n in wide_functions(tree)]
    assert not offenders, "pass a value (an options tuple, a step's result, the build's context) instead:\n" + \
        "\n".join(offenders)


# --- the dry run prints the plan the planners made --------------------------------------------------------------

DRY_RUN = "hermetic/realize/dryrun.py"
BUILD_ROOM = ("hermetic.extensions", "hermetic.build")   # its name, and its name before issue 42


def private_or_build_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of every import of a private name (``_x``) and of anything from the extension-build room."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            for alias in node.names:
                if alias.name.startswith("_") or module.startswith(BUILD_ROOM):
                    found.append((node.lineno, f"from {module} import {alias.name}"))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names
                      if a.name.startswith(BUILD_ROOM)]
    return sorted(found)


def test_the_import_check_sees_private_names_and_the_build_room() -> None:
    code = ("from hermetic.wheels.unpacked import _Accepts, offline_error\n"
            "from hermetic.extensions.host import qualify\n"
            "import hermetic.extensions.plan\nfrom hermetic.realize.plan import plan_realize\n")
    assert private_or_build_imports(ast.parse(code)) == [
        (1, "from hermetic.wheels.unpacked import _Accepts"), (2, "from hermetic.extensions.host import qualify"),
        (3, "import hermetic.extensions.plan")]


def test_the_dry_run_only_prints_a_plan() -> None:
    tree = _sources()[DRY_RUN]
    assert not private_or_build_imports(tree), private_or_build_imports(tree)
    assert any(isinstance(n, ast.ImportFrom) and n.module == "hermetic.realize.plan" for n in ast.walk(tree))


# --- no state object: Realization and Measurement are gone, the mutable values left are small -------------------

PIPELINES = ("hermetic/realize/pipeline.py", "hermetic/run/pipeline.py")
GONE = ("Realization", "Measurement")
MAX_STATE = 3   # Pending (the probe, the import check), Held (the device locks), Clock (the step timings)


def _decorated(node: ast.ClassDef, frozen: bool) -> bool:
    for d in node.decorator_list:
        name = ast.unparse(d.func if isinstance(d, ast.Call) else d)
        if name.endswith("dataclass") and (not frozen or isinstance(d, ast.Call) and any(
                k.arg == "frozen" and isinstance(k.value, ast.Constant) and k.value.value is True
                for k in d.keywords)):
            return True
    return False


def state_objects(tree: ast.AST, limit: int = MAX_STATE) -> list[tuple[int, str, int]]:
    """(line, class, attributes) of every class a pipeline changes as it goes that holds more than ``limit``
    attributes (``self.x = ...`` anywhere in it, and ``__slots__``), and of every class named as the state objects
    this issue removed. Typed step results (NamedTuple, frozen dataclasses) are values, not state; a plain
    dataclass counts unless it is the command's ``...Outcome``, the value handed back to the CLI."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        if node.name in GONE:
            found.append((node.lineno, node.name, -1))
            continue
        if any(ast.unparse(b) == "NamedTuple" for b in node.bases) or _decorated(node, frozen=True) \
                or node.name.endswith("Outcome") and _decorated(node, frozen=False):
            continue
        attrs = {t.attr for n in ast.walk(node) if isinstance(n, ast.Assign | ast.AnnAssign)
                 for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                 if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
        attrs |= {n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
        for n in node.body:
            if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in n.targets):
                attrs |= {e.value for e in ast.walk(n.value)
                          if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        if len(attrs) > limit:
            found.append((node.lineno, node.name, len(attrs)))
    return sorted(found)


def test_the_state_check_sees_each_state_object() -> None:
    code = ("class Realization:\n    pass\n"
            "class Big:\n    def __init__(self):\n        self.a = self.b = 1\n        self.c: int = 2\n"
            "    def later(self):\n        self.d = 3\n"
            "@dataclass\nclass Loose:\n    a: int\n    b: int\n    c: int\n    d: int\n"
            "class Slotted:\n    __slots__ = ('a', 'b', 'c', 'd')\n"
            "class Small:\n    __slots__ = ('a',)\n    def __init__(self):\n        self.a = 1\n"
            "class Step(NamedTuple):\n    a: int\n    b: int\n    c: int\n    d: int\n"
            "@dataclass(frozen=True)\nclass Value:\n    a: int\n    b: int\n    c: int\n    d: int\n"
            "@dataclass\nclass RunOutcome:\n    a: int\n    b: int\n    c: int\n    d: int\n")
    assert state_objects(ast.parse(code)) == [(1, "Realization", -1), (3, "Big", 4), (10, "Loose", 4),
                                              (15, "Slotted", 4)]


def test_realization_and_measurement_are_gone_and_what_the_finally_needs_is_small() -> None:
    sources = _sources()
    offenders = [f"{rel}:{line}: {name}" + (" (removed by issue 42)" if n < 0 else f" holds {n} attributes")
                 for rel, tree in sources.items() for line, name, n in state_objects(tree)
                 if rel in PIPELINES or n < 0]
    assert not offenders, "thread typed step results through local variables instead:\n" + "\n".join(offenders)
