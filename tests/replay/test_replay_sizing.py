"""A job's GPUs become a request the replay's inventory can host (sizing.py's table)."""

from __future__ import annotations

import pytest

from jupyter_gpubroker.nvml import open_backend
from jupyter_gpubroker.replay.sizing import Sizer, ladder
from jupyter_gpubroker.wire.profiles import CATALOG
from jupyter_gpubroker.wire.sizes import Size


def sizer(topology: str) -> Sizer:
    with open_backend(topology) as backend:
        return Sizer(backend.inventory())


def test_the_ladder_is_one_profile_per_compute_size():
    names = [p.name for p in ladder(CATALOG["H100-80GB"])]
    assert names == ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
    assert [p.name for p in ladder(CATALOG["A100-40GB"])][2] == "3g.20gb"


@pytest.mark.parametrize(
    ("gpus", "profile"),
    [
        (0.05, "1g.10gb"),
        (1 / 7, "1g.10gb"),  # exactly one slice's share
        (0.15, "2g.20gb"),
        (0.23, "2g.20gb"),
        (0.29, "3g.40gb"),
        (0.43, "4g.40gb"),
        (0.47, "4g.40gb"),
        (0.58, "7g.80gb"),
        (0.81, "7g.80gb"),
        (1, "7g.80gb"),  # a whole GPU on a machine with MIG on everywhere
    ],
)
def test_shares_map_to_the_smallest_covering_profile(gpus, profile):
    s = sizer("dgx-h100-mig:2")
    assert s.size(gpus) == Size(profile=profile)
    assert s.gpu_equivalents(Size(profile=profile)) == int(profile[0]) / 7


def test_several_whole_gpus_need_gpus_with_mig_off():
    assert sizer("dgx-h100-mig:8").size(2) is None
    whole = sizer("dgx-h100:2")
    assert whole.size(0.3) == Size(gpus=1)
    assert whole.size(2) == Size(gpus=2)
    assert whole.size(3) is None
    assert whole.gpu_equivalents(Size(gpus=2)) == 2.0


def test_a_mixed_machine_uses_its_whole_gpus_for_whole_requests():
    mixed = sizer("workstation-a100")  # GPU 0 cut in MIG slices, GPU 1 whole
    assert mixed.size(0.3) == Size(profile="3g.20gb")
    assert mixed.size(1) == Size(gpus=1)
    assert mixed.size(2) is None
