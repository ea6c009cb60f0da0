"""The CUDA-initialised check: framework flags first, then the driver in the memory map.

The mapped-driver path is exercised for real in a kernel by test_magic; here, each
framework's flag, read only from modules already imported.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from jupyter_gpubroker.kernel.cuda import FRAMEWORKS, cuda_initialised, driver_mapped

NOT_INITIALISED = {
    "torch.cuda": SimpleNamespace(is_initialized=lambda: False),
    "numba.cuda.cudadrv.driver": SimpleNamespace(driver=SimpleNamespace(is_initialized=False)),
    "jax._src.xla_bridge": SimpleNamespace(_backends={"cpu": object()}),
}
INITIALISED = {
    "torch.cuda": SimpleNamespace(is_initialized=lambda: True),
    "numba.cuda.cudadrv.driver": SimpleNamespace(driver=SimpleNamespace(is_initialized=True)),
    "jax._src.xla_bridge": SimpleNamespace(_backends={"cpu": object(), "cuda": object()}),
}


@pytest.mark.parametrize("module", sorted(FRAMEWORKS))
def test_an_imported_framework_says_whether_it_initialised_cuda(monkeypatch, module):
    assert not driver_mapped()  # the test process never loads the CUDA driver
    monkeypatch.setitem(sys.modules, module, NOT_INITIALISED[module])
    assert cuda_initialised() is None
    monkeypatch.setitem(sys.modules, module, INITIALISED[module])
    assert cuda_initialised() == FRAMEWORKS[module][0]


def test_a_framework_without_the_flag_is_not_taken_for_initialised(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.cuda", SimpleNamespace())
    assert cuda_initialised() is None


def test_the_driver_is_found_in_the_memory_map(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f0000000000-7f0000001000 r--p 00000000 00:00 0\n"
        "7f0000001000-7f0000002000 r-xp 00000000 08:01 42   /usr/lib/x86_64-linux-gnu/"
        "libcudart.so.12\n"
    )
    assert not driver_mapped(maps)
    maps.write_text(maps.read_text() + "7f1-7f2 r-xp 00000000 08:01 43   /usr/lib/libcuda.so.1\n")
    assert driver_mapped(maps)
    assert not driver_mapped(tmp_path / "no-proc")  # not Linux: only the framework flags
