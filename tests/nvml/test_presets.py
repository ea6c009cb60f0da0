"""Presets, scaling, MIG layouts and topology files."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pynvml
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jupyter_gpubroker.nvml import PRESET_NAMES, SimulatedNvml, TopologyError, load_topology
from jupyter_gpubroker.nvml.presets import GpuSpec, layout
from jupyter_gpubroker.wire.profiles import CATALOG, MEMORY_SLICES

H100 = CATALOG["H100-80GB"]


def test_presets_describe_their_machines():
    assert PRESET_NAMES == (
        "dgx-h100",
        "dgx-h100-mig",
        "h200-mig-balanced",
        "workstation-a100",
        "l40s-4",
        "rtx-a6000-8",
        "workstation-4090",
    )
    dgx = load_topology("dgx-h100")
    assert dgx.gpus == (GpuSpec("H100-80GB"),) * 8
    dgx_mig = load_topology("dgx-h100-mig")
    assert (
        dgx_mig.gpus == (GpuSpec("H100-80GB", True, tuple(("1g.10gb", s) for s in range(7))),) * 8
    )
    h200 = load_topology("h200-mig-balanced")
    assert (
        h200.gpus
        == (
            GpuSpec(
                "H200-141GB",
                True,
                (("3g.71gb", 4), ("2g.35gb", 0), ("1g.18gb", 2), ("1g.18gb", 3)),
            ),
        )
        * 2
    )
    workstation = load_topology("workstation-a100")
    assert [g.model for g in workstation.gpus] == ["A100-40GB", "A100-40GB"]
    assert workstation.gpus[0].instances == (
        ("3g.20gb", 4),
        ("2g.10gb", 0),
        ("1g.5gb", 2),
        ("1g.5gb", 3),
    )
    assert not workstation.gpus[1].mig_enabled


def test_scaling_repeats_the_gpus_and_keeps_the_seed():
    big = load_topology("dgx-h100-mig:64")
    assert (big.name, big.seed, len(big.gpus)) == ("dgx-h100-mig:64", "dgx-h100-mig", 64)
    assert set(big.gpus) == set(load_topology("dgx-h100-mig").gpus)
    mixed = load_topology("workstation-a100:3")
    assert [g.mig_enabled for g in mixed.gpus] == [True, False, True]
    with pytest.raises(TopologyError, match="at least one GPU"):
        load_topology("dgx-h100:0")


@pytest.mark.parametrize("spec", ["dgx-a100", "dgx-h100-mig:lots", "", "dgx-h100:"])
def test_unknown_spellings_name_the_presets(spec):
    with pytest.raises(TopologyError, match="unknown simulated topology") as err:
        load_topology(spec)
    assert all(name in str(err.value) for name in PRESET_NAMES)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(H100.profiles), max_size=4))
def test_layout_finds_a_placement_whenever_one_exists(profiles):
    wanted = {p.name: sum(q == p for q in profiles) for p in profiles}
    any_fits = any(
        len({s for p, start in zip(profiles, starts, strict=True) for s in p.slots(start)})
        == sum(p.size for p in profiles)
        for starts in itertools.product(*(p.starts for p in profiles))
    )
    counts_ok = all(n <= H100.profile(name).max_count for name, n in wanted.items())
    if not (any_fits and counts_ok):
        with pytest.raises(TopologyError):
            layout(H100, wanted)
        return
    placed = layout(H100, wanted)
    taken = [s for name, start in placed for s in H100.profile(name).slots(start)]
    assert len(taken) == len(set(taken)) <= MEMORY_SLICES
    assert all(start in H100.profile(name).starts for name, start in placed)
    assert sorted(name for name, _ in placed) == sorted(p.name for p in profiles)


@pytest.mark.parametrize(
    "mig_devices, message",
    [
        ({"1g.5gb": 1}, "does not exist on H100-80GB GPUs; they have 1g.10gb"),
        ({"1g.10gb": 8}, "H100-80GB GPUs hold at most 7x 1g.10gb, not 8"),
        ({"3g.40gb": 2, "2g.20gb": 1}, "need 10 of its 8 memory slices"),
        ({"4g.40gb": 1, "2g.20gb": 2}, "no placement of them avoids overlap"),
        ({"1g.10gb": -1}, "whole number >= 0"),
    ],
)
def test_layouts_that_cannot_be_made_say_why(mig_devices, message):
    with pytest.raises(TopologyError, match=message):
        layout(H100, mig_devices)


GOOD_YAML = """\
version: v1
simulate:
  gpu-model: NVIDIA H100 80GB HBM3
  gpu-count: 4
  mig-config: mixed
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  mixed:
    - device-filter: ["0x20B010DE"]
      devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 7}
    - devices: [0, 2]
      mig-enabled: true
      mig-devices: {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    - device-filter: "0x233010de"
      devices: [1]
      mig-enabled: true
      mig-devices: {}
"""


def test_a_yaml_file_applies_its_selected_mig_config(tmp_path: Path):
    path = tmp_path / "lab.yaml"
    path.write_text(GOOD_YAML)
    topology = load_topology(str(path))
    balanced = (("3g.40gb", 4), ("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3))
    assert topology.name == "lab/mixed"
    assert topology.gpus == (
        GpuSpec("H100-80GB", True, balanced),
        GpuSpec("H100-80GB", True, ()),
        GpuSpec("H100-80GB", True, balanced),
        GpuSpec("H100-80GB"),
    )
    assert len(load_topology(f"{path}:10").gpus) == 10


def test_a_json_file_with_one_mig_config_needs_no_selection(tmp_path: Path):
    path = tmp_path / "h200.json"
    doc = {
        "version": "v1",
        "simulate": {"gpu-model": "H200-141GB", "gpu-count": 2},
        "mig-configs": {
            "all-1g": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.18gb": 7}}]
        },
    }
    path.write_text(json.dumps(doc))
    topology = load_topology(str(path))
    assert topology.name == "h200/all-1g"
    assert [len(g.instances) for g in topology.gpus] == [7, 7]


SIMULATE = "simulate: {gpu-model: H100-80GB, gpu-count: 2}\n"
ONE_ENTRY = "mig-configs:\n  c:\n    - {devices: all, mig-enabled: true, mig-devices: %s}\n"


@pytest.mark.parametrize(
    "text, message",
    [
        ("version: v1\nmig-configs: [", "is not valid YAML"),
        ("- just a list", "must be a non-empty mapping"),
        ("version: v2\n" + SIMULATE + ONE_ENTRY % "{}", "'version' must be v1"),
        ("version: v1\n" + ONE_ENTRY % "{}", "no 'simulate' section"),
        (
            "version: v1\nsimulate: {gpu-model: V100, gpu-count: 2}\n" + ONE_ENTRY % "{}",
            "unknown GPU model 'V100'",
        ),
        (
            "version: v1\nsimulate: {gpu-model: H100-80GB, gpu-count: 0}\n" + ONE_ENTRY % "{}",
            "gpu-count must be a whole number >= 1",
        ),
        ("version: v1\n" + SIMULATE, "mig-configs must be a non-empty mapping"),
        ("version: v1\n" + SIMULATE + ONE_ENTRY % '{"1g.5gb": 1}', "1g.5gb' does not exist"),
        (
            "version: v1\n" + SIMULATE + ONE_ENTRY % '{"3g.40gb": 2, "1g.10gb": 1}',
            r"mig-configs.c\[0\]: .* do not fit",
        ),
        (
            "version: v1\n" + SIMULATE + "mig-configs:\n  a: []\n  b: []\n",
            "has 2 mig-configs \\(a, b\\): name the one",
        ),
        (
            "version: v1\nsimulate: {gpu-model: H100-80GB, gpu-count: 2, mig-config: z}\n"
            + ONE_ENTRY % "{}",
            "'z' is not one of its mig-configs",
        ),
        (
            "version: v1\n"
            + SIMULATE
            + "mig-configs:\n  c:\n    - {devices: [2], mig-enabled: false}\n",
            "GPU index 2 is out of range",
        ),
        (
            "version: v1\n"
            + SIMULATE
            + "mig-configs:\n  c:\n    - {devices: all, mig-enabled: false}\n"
            + "    - {devices: [1], mig-enabled: true}\n",
            "GPU 1 is already configured",
        ),
        (
            "version: v1\n"
            + SIMULATE
            + "mig-configs:\n  c:\n"
            + "    - {devices: all, mig-enabled: false, mig-devices: {1g.10gb: 1}}\n",
            "'mig-devices' given while 'mig-enabled' is false",
        ),
        (
            "version: v1\n"
            + SIMULATE
            + "mig-configs:\n  c:\n    - {devices: some, mig-enabled: true}\n",
            "'devices' must be 'all' or a list",
        ),
        (
            "version: v1\n"
            + SIMULATE
            + "mig-configs:\n  c:\n    - {devices: all, mig-enable: true}\n",
            "unknown key\\(s\\) mig-enable",
        ),
    ],
)
def test_bad_yaml_files_say_what_is_wrong(tmp_path: Path, text: str, message: str):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(TopologyError, match=message):
        load_topology(str(path))


def test_bad_json_and_missing_files(tmp_path: Path):
    broken = tmp_path / "broken.json"
    broken.write_text('{"version": "v1",')
    with pytest.raises(TopologyError, match="is not valid JSON"):
        load_topology(str(broken))
    with pytest.raises(TopologyError, match="cannot read topology file .*missing.yaml"):
        load_topology(str(tmp_path / "missing.yaml"))


@pytest.mark.parametrize(
    ("preset", "name", "count", "mib"),
    [
        ("l40s-4", "NVIDIA L40S", 4, 46068),
        ("rtx-a6000-8", "NVIDIA RTX A6000", 8, 49140),
        ("workstation-4090", "NVIDIA GeForce RTX 4090", 2, 24564),
    ],
)
def test_machines_without_mig_answer_as_their_gpus_do(preset, name, count, mib):
    """The lab GPUs without MIG: NVML names them and their memory as on the real cards,
    answers NotSupported for their MIG mode, and each is one whole device."""
    sim = SimulatedNvml(load_topology(preset)).install()
    try:
        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        assert pynvml.nvmlDeviceGetCount() == count
        for h in handles:
            assert pynvml.nvmlDeviceGetName(h) == name
            assert pynvml.nvmlDeviceGetMemoryInfo(h).total == mib << 20
            with pytest.raises(pynvml.NVMLError_NotSupported):
                pynvml.nvmlDeviceGetMigMode(h)
        pynvml.nvmlShutdown()
    finally:
        sim.uninstall()
