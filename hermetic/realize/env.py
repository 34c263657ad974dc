"""The environment of a realized recipe: what `hermetic env` prints and what children run inside."""

from __future__ import annotations

import os
from pathlib import Path

from hermetic.errors import BadRecord, PreconditionFailed
from hermetic.extensions.toolchain import cuda_home_rel
from hermetic.interpreter import find_python
from hermetic.recipe import Recipe, load_recipe
from hermetic.root import Root, refuse_folders
from hermetic.store import Store
from hermetic.store.trees import profile_entry


def toolchain_home(root: Root, recipe: Recipe) -> Path | None:
    """The CUDA_HOME of a realized recipe's toolchain (in the store: the profile's link resolved, so that it
    stays the same tree while a run holds it), or None for a recipe without one."""
    if not recipe.toolchain:
        return None
    # a recipe that builds keeps its toolchain in a profile of its own
    tc_profile = root.profiles / f"{recipe.name}.toolchain" if recipe.extensions else root.profiles / recipe.name
    return tc_profile.resolve() / cuda_home_rel(recipe.toolchain)


def pinned_tree(root: Root, store: Store, profile: Path, recipe_path: Path) -> Path:
    """The tree a profile names (its entry's ``out/``), pinned for the rest of this process: a temp root, which
    the command ``hermetic env`` execs inherits (``store.inherit_pins``), so gc spares the tree while it runs.
    A profile that is no link to an entry of this store is a bad record: exit 2 naming it."""
    entry, why = profile_entry(store, profile)
    if entry is None and why is None:
        raise PreconditionFailed(f"{profile.name} is not realized in {root.path}", where=str(recipe_path),
                                 hint=f"run `hermetic realize {recipe_path}` first")
    hint = f"run `hermetic verify --repair` (which removes it), then `hermetic realize {recipe_path}`"
    if why is not None:
        raise BadRecord(f"the profile {why} (docs/layout.md: a bad record)", where=str(profile), hint=hint)
    assert entry is not None
    if not store.use(entry):
        raise BadRecord(f"the profile points at a missing entry, {entry}", where=str(profile), hint=hint)
    return store.entry_path(entry) / "out"


def realized_env(root: Root, recipe_path: Path, *, pinned: bool = False) -> tuple[dict[str, str], dict[str, str]]:
    """(full child environment, the variables hermetic sets) for a recipe realized in ``root``.

    The profile's ``bin/`` comes first on PATH: its ``python``, ``python3`` and console scripts run the
    recipe's interpreter (they were written for it when the tree was laid out), its folder next, then the
    caller's PATH without them (a venv's bin is not there twice). No system CUDA: with a toolchain, CUDA_HOME,
    CUDA_PATH and PATH name the store's; without one, CUDA_HOME names none (``Root.child_env``).

    Every profile it names is checked (a link to an entry of this store) and its tree pinned. ``pinned`` (a
    command to run): PYTHONPATH, PATH and CUDA_HOME name the pinned trees themselves, never the profiles, which
    `gc --drop-root` or the next realize may move while the command runs; else (printed for a shell) the
    profiles, the stable paths."""
    recipe = load_recipe(recipe_path)
    root.refuse_unmarked("env")   # home/ and tmp/ are made below it: never in a folder of someone's files
    refuse_folders(root.folder_problems())   # home/ and tmp/ are made for the command: never through a link
    profile = root.profiles / recipe.name
    from hermetic.store.roots import describe_owner, owner_in_root, owner_unrecorded, root_owner
    owner = owner_in_root(root, recipe.name)
    if owner is not None and owner != root_owner(recipe.name, None):   # recipe vx's variant b, not recipe vx.b
        raise PreconditionFailed(f"{recipe.name} is not realized in {root.path}: its profile is "
                                 f"{describe_owner(owner)}'s", where=str(recipe_path),
                                 hint=f"rename this recipe, or forget the other with `hermetic gc --drop-root "
                                      f"{recipe.name}` and run `hermetic realize {recipe_path}`")
    if (then := owner_unrecorded(root, recipe.name)) is not None:
        raise PreconditionFailed(f"{recipe.name} is not realized in {root.path}: its root was written by an older "
                                 f"hermetic for the recipe file {then} and records no owner, and the name could be "
                                 f"another recipe's variant: whether its profile is this recipe's cannot be told",
                                 where=str(recipe_path),
                                 hint=f"run `hermetic realize {recipe_path}` once (it records the owner, or says "
                                      f"whose the root is), or forget the root with `hermetic gc --drop-root "
                                      f"{recipe.name}`")
    python = find_python(recipe.python, recipe.doc.where("recipe", "python") if recipe.python else "recipe.python")
    store = Store(root.store)
    tree = pinned_tree(root, store, profile, recipe_path)
    top = tree if pinned else profile
    exported: dict[str, str] = {"HERMETIC_ROOT": str(root.path), "HERMETIC_PROFILE": str(profile),
                                "HERMETIC_PYTHON": str(python)}
    path_dirs = [str(top / "bin"), str(python.parent)]
    env = root.child_env()
    if recipe.toolchain:
        tc_top = top
        if recipe.extensions:   # a recipe that builds keeps its toolchain in a profile of its own
            tc_profile = root.profiles / f"{recipe.name}.toolchain"
            tc_tree = pinned_tree(root, store, tc_profile, recipe_path)
            tc_top = tc_tree if pinned else tc_profile
        cuda_home = tc_top / cuda_home_rel(recipe.toolchain)
        exported.update(CUDA_HOME=str(cuda_home), CUDA_PATH=str(cuda_home),
                        PYTORCH_NVCC=str(cuda_home / "bin" / "nvcc"))
        path_dirs.insert(0, str(cuda_home / "bin"))
    exported["PYTHONPATH"] = str(top)
    env.update(exported)
    env["PATH"] = os.pathsep.join(dict.fromkeys(path_dirs + [d for d in env.get("PATH", "").split(os.pathsep) if d]))
    exported["PATH"] = env["PATH"]
    if not recipe.toolchain:
        exported.update(CUDA_HOME=env["CUDA_HOME"], CUDA_PATH=env["CUDA_PATH"])
    return env, exported
