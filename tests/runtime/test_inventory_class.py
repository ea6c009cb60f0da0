"""``c.GPUBroker.inventory_class``: the inventory's class, swapped by name in a config
file as jupyter-scheduler swaps its own; ``inventory_source`` its shorthand."""

from __future__ import annotations

from pathlib import Path

import pytest
from runtime_helpers import make
from traitlets import TraitError

from jupyter_gpubroker.engines.kubernetes import KubernetesInventory
from jupyter_gpubroker.engines.slurm import SlurmInventory
from jupyter_gpubroker.runtime import NvmlInventory

REFUSED = (
    "c.GPUBroker.inventory_class is jupyter_gpubroker.runtime.NvmlInventory or a subclass "
    "of jupyter_gpubroker.engines.InventorySource, not "
)


def test_the_default_is_this_machines_nvml(tmp_path: Path) -> None:
    rt = make(tmp_path)
    assert rt.inventory_class is NvmlInventory and rt.on_this_machine


@pytest.mark.parametrize(
    ("traits", "expected"),
    [
        ({"inventory_class": "jupyter_gpubroker.engines.slurm.SlurmInventory"}, SlurmInventory),
        ({"inventory_source": "slurm"}, SlurmInventory),
        ({"inventory_source": "kubernetes"}, KubernetesInventory),
        # the class wins over the name
        (
            {"inventory_source": "slurm", "inventory_class": KubernetesInventory},
            KubernetesInventory,
        ),
        ({"inventory_class": "jupyter_gpubroker.runtime.NvmlInventory"}, NvmlInventory),
    ],
)
def test_a_class_or_its_name_chooses_the_inventory(
    tmp_path: Path, traits: dict, expected: type
) -> None:
    rt = make(tmp_path, **traits)
    assert rt.inventory_class is expected
    assert rt.on_this_machine is (expected is NvmlInventory)


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("collections.OrderedDict", "'collections.OrderedDict'"),
        ("traitlets.config.LoggingConfigurable", "'traitlets.config.LoggingConfigurable'"),
        ("no_such_module.Engine", "'no_such_module.Engine'"),
    ],
)
def test_anything_else_is_refused_in_one_sentence(tmp_path: Path, value: str, named: str) -> None:
    with pytest.raises(TraitError) as refused:
        make(tmp_path, inventory_class=value)
    assert str(refused.value) == REFUSED + named


def test_an_unknown_engine_name_is_refused_with_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(TraitError) as refused:
        make(tmp_path, inventory_source="pbs")
    assert str(refused.value) == (
        "c.GPUBroker.inventory_source is one of nvml, kubernetes, slurm, not 'pbs'"
    )
