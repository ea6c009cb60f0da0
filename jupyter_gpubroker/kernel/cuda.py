"""Has CUDA been initialised in this process? Then ``CUDA_VISIBLE_DEVICES`` is too late.

The CUDA driver reads ``CUDA_VISIBLE_DEVICES`` once, when it initialises; a device
granted afterwards stays invisible to this process. The check must never initialise
CUDA itself, so it imports no framework: it looks at the frameworks already imported,
then at the process's memory map for the CUDA driver library, which every framework
loads to use a GPU.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

MAPS = Path("/proc/self/maps")


def _torch(torch_cuda: Any) -> bool:
    return bool(torch_cuda.is_initialized())


def _numba(driver_module: Any) -> bool:
    return bool(getattr(driver_module.driver, "is_initialized", False))


def _jax(xla_bridge: Any) -> bool:
    return any(name in ("cuda", "gpu") for name in getattr(xla_bridge, "_backends", {}))


FRAMEWORKS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "torch.cuda": ("PyTorch", _torch),
    "numba.cuda.cudadrv.driver": ("Numba", _numba),
    "jax._src.xla_bridge": ("JAX", _jax),
}
"""Module (checked only if already imported) -> (framework, its "CUDA is initialised")."""


def cuda_initialised() -> str | None:
    """Who initialised CUDA in this process ("PyTorch", "the CUDA driver"), or ``None``."""
    for module, (framework, initialised) in FRAMEWORKS.items():
        mod = sys.modules.get(module)
        try:
            if mod is not None and initialised(mod):
                return framework
        except Exception:  # a framework version without that attribute: fall through
            continue
    return "the CUDA driver" if driver_mapped() else None


def driver_mapped(maps: Path = MAPS) -> bool:
    """Is ``libcuda.so`` (the CUDA driver library) mapped into this process (Linux)?"""
    try:
        lines = maps.read_text().splitlines()
    except OSError:  # no /proc (not Linux): only the framework checks apply
        return False
    return any(Path(line.split(maxsplit=5)[-1]).name.startswith("libcuda.so") for line in lines)
