"""The environment of a realized recipe: what `hermetic env` prints and what children run inside."""

from __future__ import annotations

import os
from pathlib import Path

from hermetic.errors import PreconditionFailed
from hermetic.extensions.toolchain import cuda_home_rel
from hermetic.interpreter import find_python
from hermetic.recipe import Recipe, load_recipe
from hermetic.root import Root


def toolchain_home(root: Root, recipe: Recipe) -> Path | None:
    """The CUDA_HOME of a realized recipe's toolchain (in the store: the profile's link resolved, so that it
    stays the same tree while a run holds it), or None for a recipe without one."""
    if not recipe.toolchain:
        return None
    # a recipe that builds keeps its toolchain in a profile of its own
    tc_profile = root.profiles / f"{recipe.name}.toolchain" if recipe.extensions else root.profiles / recipe.name
    return tc_profile.resolve() / cuda_home_rel(recipe.toolchain)


def realized_env(root: Root, recipe_path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """(full child environment, the variables hermetic sets) for a recipe realized in ``root``.

    The profile's ``bin/`` comes first on PATH: its ``python``, ``python3`` and console scripts run the
    recipe's interpreter (they were written for it when the tree was laid out), its folder next, then the
    caller's PATH without them (a venv's bin is not there twice). No system CUDA: with a toolchain, CUDA_HOME,
    CUDA_PATH and PATH name the store's; without one, CUDA_HOME names none (``Root.child_env``)."""
    recipe = load_recipe(recipe_path)
    profile = root.profiles / recipe.name
    python = find_python(recipe.python, recipe.doc.where("recipe", "python") if recipe.python else "recipe.python")
    if not profile.exists():
        raise PreconditionFailed(f"{recipe.name} is not realized in {root.path}", where=str(recipe_path),
                                 hint=f"run `hermetic realize {recipe_path}` first")
    exported: dict[str, str] = {"HERMETIC_ROOT": str(root.path), "HERMETIC_PROFILE": str(profile),
                             "HERMETIC_PYTHON": str(python)}
    path_dirs = [str(profile / "bin"), str(python.parent)]
    env = root.child_env()
    if recipe.toolchain:
        tc_profile = root.profiles / f"{recipe.name}.toolchain" if recipe.extensions else profile
        cuda_home = tc_profile / cuda_home_rel(recipe.toolchain)
        exported.update(CUDA_HOME=str(cuda_home), CUDA_PATH=str(cuda_home),
                     PYTORCH_NVCC=str(cuda_home / "bin" / "nvcc"))
        path_dirs.insert(0, str(cuda_home / "bin"))
    exported["PYTHONPATH"] = str(profile)
    env.update(exported)
    env["PATH"] = os.pathsep.join(dict.fromkeys(path_dirs + [d for d in env.get("PATH", "").split(os.pathsep) if d]))
    exported["PATH"] = env["PATH"]
    if not recipe.toolchain:
        exported.update(CUDA_HOME=env["CUDA_HOME"], CUDA_PATH=env["CUDA_PATH"])
    return env, exported
