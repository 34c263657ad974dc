"""One torch JIT build for bench/reuse: torch.utils.cpp_extension.load of the fixture's sources, with the
recipe's flags, in this fresh process; prints one JSON line (load's own wall time, the module's file).

    python3 torch_load.py '{"name": ..., "src": DIR, "sources": [...], "include_dirs": [...],
                            "cflags": [...], "cuda_cflags": [...]}'

The environment chooses the rest, as for any user of torch's JIT: CUDA_HOME (hermetic's toolchain),
CUDA_INC_PATH, TORCH_CUDA_ARCH_LIST, MAX_JOBS, TORCH_EXTENSIONS_DIR, and the compiler wrapper torch finds on
PATH (ccache, else sccache, else none).
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    spec = json.loads(sys.argv[1])
    from torch.utils.cpp_extension import load
    t0 = time.perf_counter()
    module = load(name=spec["name"], sources=[os.path.join(spec["src"], s) for s in spec["sources"]],
                  extra_include_paths=[spec["src"] if d in ("", ".") else os.path.join(spec["src"], d)
                                       for d in spec["include_dirs"]],
                  extra_cflags=spec["cflags"], extra_cuda_cflags=spec["cuda_cflags"], verbose=False)
    print(json.dumps({"load_s": round(time.perf_counter() - t0, 3), "module": module.__file__}))


if __name__ == "__main__":
    main()
