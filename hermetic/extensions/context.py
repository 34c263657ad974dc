"""What every step of a recipe's build reads and no step changes (``BuildContext``): where (the root, the
store), what (the recipe), for which host, with which toolchain, who is told, the remote cache if any, and the
one input hasher of the realize. Made once a realize has its toolchain (step 4); the steps of the build take it
instead of eight separate arguments. The host's facts may still be a guess being probed: the confirmation is
passed apart, where something is about to be recorded (``Qualifying.confirm``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from hermetic.extensions.host import HostFacts
from hermetic.extensions.objects import InputHasher
from hermetic.extensions.plan import CudaTarget, ModuleSite, prefix_map
from hermetic.extensions.toolchain import PreparedToolchain, ToolchainInfo
from hermetic.keys import KEY_ENV
from hermetic.recipe import Extension, Recipe, Variant
from hermetic.reporter import Reporter
from hermetic.root import Root
from hermetic.store import Store

if TYPE_CHECKING:
    from hermetic.extensions.dist import DistSettings
    from hermetic.extensions.share import ObjectShare

# Passed through to compilers (and part of every object key); everything else of the caller's environment
# that could steer a compiler is dropped: no system CUDA, no CC/CXX, no LD_LIBRARY_PATH.
PASSED_ENV = tuple(k for k in KEY_ENV if k != "PATH")


def build_env(root: Root, tc: ToolchainInfo | None) -> dict[str, str]:
    """The compilers' environment: the root's children's, the variables that steer a compiler passed through,
    the toolchain's nvcc first on PATH, no GPU visible."""
    env = root.child_env({k: os.environ[k] for k in PASSED_ENV if k in os.environ})
    env["PATH"] = (f"{tc.cuda_home / 'bin'}:" if tc else "") + "/usr/bin:/bin"
    env["CUDA_VISIBLE_DEVICES"] = ""  # no GPU is visible to a build
    if tc is not None:
        env["CUDA_HOME"] = env["CUDA_PATH"] = str(tc.cuda_home)
    return env


@dataclass(frozen=True, eq=False)
class BuildContext:
    root: Root
    store: Store
    recipe: Recipe
    host: HostFacts
    toolchain: PreparedToolchain
    reporter: Reporter
    share: ObjectShare | None       # extensions.share's Protocol: the build never imports the remote
    hasher: InputHasher             # one per realize: every module's object cache shares its table
    dist: DistSettings | None = None  # a build cluster for compiles that miss every cache (extensions.dist)

    @cached_property
    def env(self) -> dict[str, str]:
        return build_env(self.root, self.toolchain.info)

    @property
    def cuda(self) -> CudaTarget:
        info = self.toolchain.info
        return CudaTarget(info.cuda_home, self.recipe.toolchain.archs if self.recipe.toolchain else (),
                          info.objdir_temps)

    def build_dir(self, variant: Variant, ext: Extension) -> Path:
        """Where one module of one variant is built (its objects, dependency files, costs, the module)."""
        return self.root.path / "build" / self.recipe.name / variant.name / ext.name

    def site(self, ext: Extension, variant: Variant, src_root: Path, files: list[str]) -> ModuleSite:
        """Where one module of one variant is built, and the prefix map that names its folders."""
        build_dir = self.build_dir(variant, ext)
        return ModuleSite(src_root, files, build_dir,
                          prefix_map(self.root.path, ext.source, src_root, build_dir, self.toolchain.info.cuda_home,
                                     self.host))
