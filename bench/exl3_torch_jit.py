#!/usr/bin/env python3
"""The baseline: torch's own JIT build (torch.utils.cpp_extension.load) of exllamav3's stock extension, with
the flags and sources exllamav3's loader uses. Prints one JSON line with the wall time.

    python3 bench/exl3_torch_jit.py WHEEL BUILD_DIR [JOBS]

WHEEL is exllamav3-1.6.5-py3-none-any.whl; the sources are unpacked next to BUILD_DIR. Uses whatever CUDA
torch finds (on the GPU machine, its image's nvcc 13.0), as a user of torch's JIT would.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
import zipfile
from pathlib import Path


def main() -> None:
    wheel, build = Path(sys.argv[1]), Path(sys.argv[2])
    jobs = sys.argv[3] if len(sys.argv) > 3 else str(os.cpu_count())
    src_root = build.parent / "exl3-src"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(src_root, [n for n in zf.namelist() if n.startswith("exllamav3/exllamav3_ext/")
                                 or n == "exllamav3/util/cuda_flags.py"])
    spec = importlib.util.spec_from_file_location("cuda_flags", src_root / "exllamav3/util/cuda_flags.py")
    assert spec and spec.loader
    cuda_flags = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cuda_flags)
    os.environ.update(TORCH_CUDA_ARCH_LIST="9.0", MAX_JOBS=jobs)
    import torch
    from torch.utils.cpp_extension import CUDA_HOME, load
    sources_dir = str(src_root / "exllamav3/exllamav3_ext")
    sources = cuda_flags.extension_sources(sources_dir)
    build.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    load(name="exllamav3_ext", sources=sources, extra_include_paths=[sources_dir],
         extra_cflags=["-Ofast"], extra_cuda_cflags=cuda_flags.cuda_cflags(cuda_home=CUDA_HOME),
         build_directory=str(build), verbose=False)
    seconds = time.perf_counter() - t0
    print(json.dumps({"tool": "torch.utils.cpp_extension.load", "torch": torch.__version__, "cuda_home": CUDA_HOME,
                      "jobs": int(jobs), "translation_units": len(sources), "seconds": round(seconds, 1)}))


if __name__ == "__main__":
    main()
