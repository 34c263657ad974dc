"""The environment of a realized recipe: what `hermetic env` prints and what children run inside."""

from __future__ import annotations

import os
from pathlib import Path

from hermetic.build.toolchain import cuda_home_rel
from hermetic.errors import PreconditionFailed
from hermetic.interpreter import find_python
from hermetic.recipe import load_recipe
from hermetic.root import Root


def realized_env(root: Root, recipe_path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """(full child environment, the variables hermetic sets) for a recipe realized in ``root``.

    The profile's ``bin/`` comes first on PATH: its ``python``, ``python3`` and console scripts run the
    recipe's interpreter (they were written for it when the tree was laid out), its folder next."""
    recipe = load_recipe(recipe_path)
    profile = root.profiles / recipe.name
    python = find_python(recipe.python, recipe.doc.where("recipe", "python") if recipe.python else "recipe.python")
    if not profile.exists():
        raise PreconditionFailed(f"{recipe.name} is not realized in {root.path}", where=str(recipe_path),
                                 hint=f"run `hermetic realize {recipe_path}` first")
    facts: dict[str, str] = {"HERMETIC_ROOT": str(root.path), "HERMETIC_PROFILE": str(profile),
                             "HERMETIC_PYTHON": str(python)}
    path_dirs = [str(profile / "bin"), str(python.parent)]
    if recipe.toolchain:
        # a recipe that builds keeps its toolchain in a profile of its own
        tc_profile = root.profiles / f"{recipe.name}.toolchain" if recipe.extensions else profile
        cuda_home = tc_profile / cuda_home_rel(recipe.toolchain)
        # No system CUDA: CUDA_HOME, CUDA_PATH and PATH all name the store's toolchain first.
        facts.update(CUDA_HOME=str(cuda_home), CUDA_PATH=str(cuda_home),
                     PYTORCH_NVCC=str(cuda_home / "bin" / "nvcc"))
        path_dirs.insert(0, str(cuda_home / "bin"))
    facts["PYTHONPATH"] = str(profile)
    env = root.child_env()
    env.pop("CUDA_INC_PATH", None)
    env.update(facts)
    env["PATH"] = os.pathsep.join(path_dirs + [env.get("PATH", "")])
    facts["PATH"] = env["PATH"]
    return env, facts
