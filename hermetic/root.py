"""The scratch root: where everything hermetic and its children write.

``--root``, else ``HERMETIC_ROOT``, else ``.hermetic/`` in the current folder. The layout is documented in
docs/layout.md; this module is its single source of truth.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from hermetic.errors import BadInput

ROOT_MARKER = "HERMETIC_ROOT"


@dataclass(frozen=True)
class Root:
    path: Path

    @staticmethod
    def locate(cli_root: str | None, environ: dict[str, str] | None = None) -> Root:
        env = os.environ if environ is None else environ
        raw = cli_root or env.get("HERMETIC_ROOT") or ".hermetic"
        path = Path(raw).expanduser().absolute()
        if path.exists() and not path.is_dir():
            raise BadInput(f"the scratch root {path} exists and is not a folder",
                           where="--root", hint="choose another --root or HERMETIC_ROOT")
        return Root(path)

    # layout -------------------------------------------------------------
    @property
    def store(self) -> Path:
        return self.path / "store"

    @property
    def profiles(self) -> Path:
        return self.path / "profiles"

    @property
    def roots(self) -> Path:
        return self.path / "roots"

    @property
    def receipts(self) -> Path:
        return self.path / "receipts"

    @property
    def state(self) -> Path:
        """Caches of derived facts (stat fingerprints, interpreter facts); safe to delete."""
        return self.path / "state"

    @property
    def tmp(self) -> Path:
        return self.path / "tmp"

    @property
    def home(self) -> Path:
        return self.path / "home"

    def ensure(self) -> None:
        for d in (self.path, self.profiles, self.roots, self.receipts, self.state, self.tmp):
            d.mkdir(parents=True, exist_ok=True)
        marker = self.path / ROOT_MARKER
        if not marker.exists():
            marker.write_text("This folder is a hermetic scratch root. `hermetic gc --all` removes it.\n")

    def child_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for child processes: every home, temp and cache they may write points inside."""
        env = dict(os.environ if base is None else base)
        home = self.home
        cache = home / ".cache"
        env.update({
            "HOME": str(home),
            "TMPDIR": str(self.tmp),
            "TMP": str(self.tmp),
            "TEMP": str(self.tmp),
            "XDG_CACHE_HOME": str(cache),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_DATA_HOME": str(home / ".local" / "share"),
            "XDG_STATE_HOME": str(home / ".local" / "state"),
            "PIP_CACHE_DIR": str(cache / "pip"),
            "UV_CACHE_DIR": str(cache / "uv"),
            "CUDA_CACHE_PATH": str(cache / "nv"),
            "TRITON_CACHE_DIR": str(cache / "triton"),
            "TORCHINDUCTOR_CACHE_DIR": str(cache / "torchinductor"),
            "TORCH_EXTENSIONS_DIR": str(cache / "torch_extensions"),
            "PYTHONPYCACHEPREFIX": str(cache / "pycache"),
            "MPLCONFIGDIR": str(cache / "matplotlib"),
            "CCACHE_DIR": str(cache / "ccache"),
            "SCCACHE_DIR": str(cache / "sccache"),
        })
        for d in (home, cache, self.tmp):
            d.mkdir(parents=True, exist_ok=True)
        return env
