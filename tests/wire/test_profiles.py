"""The MIG profile catalog agrees with itself and with NVIDIA's documented facts."""

from __future__ import annotations

import pytest

from jupyter_gpubroker.wire.profiles import (
    ALL_PROFILE_NAMES,
    CATALOG,
    COMPUTE_SLICES,
    MEMORY_SLICES,
    free_starts,
    model_for_name,
    profile_memory_gb,
)
from jupyter_gpubroker.wire.sizes import Size, gb_to_mib, mib_to_gb, parse_memory
from jupyter_gpubroker.wire.text import memory

PROFILES = [(m, p) for m in CATALOG.values() for p in m.profiles]
IDS = [f"{m.key}:{p.name}" for m, p in PROFILES]


def most_disjoint(starts: tuple[int, ...], size: int) -> int:
    """How many non-overlapping instances the placements allow (brute force)."""
    best = 0

    def grow(chosen: list[int], rest: list[int]) -> None:
        nonlocal best
        best = max(best, len(chosen))
        for i, s in enumerate(rest):
            if all(abs(s - c) >= size for c in chosen):
                grow([*chosen, s], rest[i + 1 :])

    grow([], list(starts))
    return best


@pytest.mark.parametrize(("model", "profile"), PROFILES, ids=IDS)
def test_placements_lie_inside_the_memory_slices(model, profile):
    assert profile.starts, "a profile with no placement can never be created"
    for s in profile.starts:
        assert s >= 0 and s + profile.size <= MEMORY_SLICES
        assert list(profile.slots(s)) == list(range(s, s + profile.size))


@pytest.mark.parametrize(("model", "profile"), PROFILES, ids=IDS)
def test_max_count_is_what_the_placements_allow(model, profile):
    room = most_disjoint(profile.starts, profile.size)
    if profile.name.endswith("+me"):
        assert profile.max_count == 1  # the media engines exist once per GPU
        assert room == 7
    else:
        assert profile.max_count == room
    assert profile.max_count * profile.compute_slices <= COMPUTE_SLICES


@pytest.mark.parametrize(("model", "profile"), PROFILES, ids=IDS)
def test_gpu_equivalents_are_compute_slices_over_seven(model, profile):
    assert profile.gpu_equivalents == pytest.approx(profile.compute_slices / 7)
    assert profile.name.startswith(f"{profile.compute_slices}g.")


@pytest.mark.parametrize(("model", "profile"), PROFILES, ids=IDS)
def test_profile_memory_matches_its_name_and_fits_the_gpu(model, profile):
    nominal = profile_memory_gb(profile.name)
    assert abs(profile.memory_mib / 1024 - nominal) / nominal < 0.1
    assert profile.memory_mib <= model.memory_mib
    assert profile.sm_count <= model.sm_count


MIG_MODELS = {k: m for k, m in CATALOG.items() if m.profiles}


def test_the_gpus_without_mig_have_no_profiles():
    assert set(CATALOG) - set(MIG_MODELS) == {"L40S-48GB", "RTXA6000-48GB", "RTX4090-24GB"}


@pytest.mark.parametrize(("model", "profile"), PROFILES, ids=IDS)
def test_a_request_for_the_gb_nvidia_names_a_device_by_takes_it(model, profile):
    """The units rule (docs/decisions.md): GB are 10^9 bytes, in which every device has at
    least what NVIDIA calls it; GiB would leave a 3g.20gb slice (19.5 GiB) out of a
    request for 20 GB, and a 1g.10gb one (9.75 GiB on an H100) out of one for 10."""
    nominal = profile_memory_gb(profile.name)
    assert profile.memory_mib >= gb_to_mib(nominal)
    assert float(memory(profile.memory_mib).removesuffix(" GB")) >= nominal  # shown so too


@pytest.mark.parametrize("model", CATALOG.values(), ids=list(CATALOG))
def test_every_card_has_at_least_the_gb_nvidia_names_it_by(model):
    card = float(model.key.split("-")[1].removesuffix("GB"))  # "H100-80GB": NVIDIA's 80 GB
    assert mib_to_gb(model.memory_mib) >= card


def test_sizes_are_typed_in_gb_or_in_gib_said_so():
    assert Size.parse("20GB") == Size(min_memory_gb=20) == Size.parse("20 gb")
    assert parse_memory("20") == 20 and parse_memory("18.6GiB") == pytest.approx(19.97, abs=0.01)
    with pytest.raises(Exception, match="a size in GB such as 20GB"):
        parse_memory("twenty")


@pytest.mark.parametrize("model", MIG_MODELS.values(), ids=list(MIG_MODELS))
def test_every_mig_model_has_the_seven_shapes_with_nvml_ids(model):
    shapes = {p.name.split(".")[0] + ("+me" if "+me" in p.name else ""): p for p in model.profiles}
    assert len(model.profiles) == 7 and len({p.name for p in model.profiles}) == 7
    # NVML_GPU_INSTANCE_PROFILE_* constants and the ids NVML returns (REFERENCE.md)
    by_const = {p.nvml_profile: p.profile_id for p in model.profiles}
    assert by_const == {0: 19, 1: 14, 2: 9, 3: 5, 4: 0, 7: 20, 9: 15}
    assert shapes["7g"].size == MEMORY_SLICES and shapes["7g"].starts == (0,)
    assert shapes["3g"].starts == (0, 4) and shapes["4g"].starts == (0,)
    assert shapes["2g"].starts == (0, 2, 4)
    mems = sorted(model.profiles, key=lambda p: (p.size, p.compute_slices))
    assert [p.memory_mib for p in mems] == sorted(p.memory_mib for p in mems)


def test_reference_table_max_counts():
    expected = {
        "A100-40GB": {"1g.5gb": 7, "1g.5gb+me": 1, "1g.10gb": 4, "2g.10gb": 3, "3g.20gb": 2},
        "H100-80GB": {"1g.10gb": 7, "1g.10gb+me": 1, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2},
        "H200-141GB": {"1g.18gb": 7, "1g.18gb+me": 1, "1g.35gb": 4, "4g.71gb": 1, "7g.141gb": 1},
    }
    for key, counts in expected.items():
        for name, count in counts.items():
            p = CATALOG[key].profile(name)
            assert p is not None and p.max_count == count, (key, name)


def test_h200_facts():
    h200 = CATALOG["H200-141GB"]
    assert h200.memory_mib == 143771
    assert h200.power_limit_mw == 700_000
    assert h200.pci_device_id == 0x233510DE
    assert "NVIDIA H200" in h200.nvml_names
    assert [p.sm_count for p in h200.profiles] == [16, 16, 26, 32, 60, 64, 132]
    assert model_for_name("NVIDIA H200") is h200


def test_model_lookup_by_nvml_name():
    assert model_for_name("NVIDIA H100 80GB HBM3") is CATALOG["H100-80GB"]
    assert model_for_name("NVIDIA A100-SXM4-40GB") is CATALOG["A100-40GB"]
    assert model_for_name("NVIDIA GeForce RTX 4090") is CATALOG["RTX4090-24GB"]
    assert model_for_name("Tesla T4") is None


def test_all_profile_names_and_memory_parsing():
    assert {"1g.10gb", "7g.80gb", "1g.18gb+me", "1g.5gb"} <= ALL_PROFILE_NAMES
    assert profile_memory_gb("3g.40gb") == 40.0
    assert profile_memory_gb("1g.18gb+me") == 18.0


def test_free_starts_skips_occupied_slices():
    p3 = CATALOG["H100-80GB"].profile("3g.40gb")
    p1 = CATALOG["H100-80GB"].profile("1g.10gb")
    assert p3 is not None and p1 is not None
    assert free_starts(p3, set()) == [0, 4]
    assert free_starts(p3, {5}) == [0]
    assert free_starts(p3, {0, 7}) == []
    assert free_starts(p1, {0, 1, 2, 3, 4, 5}) == [6]
