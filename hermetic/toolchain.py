"""The CUDA toolchain assembled from the nvidia compiler wheels.

The wheels unpack to ``nvidia/cu<major>/`` with nvcc, the crt and cccl headers and a versioned
``libcudart.so.<major>``. nvcc's profile searches ``lib64`` and torch links ``-lcudart``, so the tree gets
``lib64 -> lib`` and ``lib/libcudart.so -> libcudart.so.<major>`` (toolchain-measurements.md, section 2).
"""

from __future__ import annotations

from .errors import BadInput
from .materialize import FileMap
from .recipe import Toolchain


def cuda_home_rel(toolchain: Toolchain) -> str:
    return f"nvidia/cu{toolchain.cuda.split('.')[0]}"


def toolchain_links(toolchain: Toolchain, files: FileMap) -> dict[str, str]:
    home = cuda_home_rel(toolchain)
    major = toolchain.cuda.split(".")[0]
    if f"{home}/bin/nvcc" not in files:
        raise BadInput(f"the toolchain's locks provide no {home}/bin/nvcc",
                       hint=f"lock nvidia-cuda-nvcc, nvidia-nvvm, nvidia-cuda-crt, nvidia-cuda-cccl and "
                            f"nvidia-cuda-runtime of CUDA {toolchain.cuda}")
    links = {f"{home}/lib64": "lib"}
    if f"{home}/lib/libcudart.so.{major}" in files:
        links[f"{home}/lib/libcudart.so"] = f"libcudart.so.{major}"
    return links
