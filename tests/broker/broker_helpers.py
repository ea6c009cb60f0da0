"""Helpers of the broker core's tests: inventories built from the model types and a
MIG partitioner over them. (A module of its own, not conftest.py: ``tests/nvml``
has a conftest too, and ``from conftest import ...`` could find that one.)"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from datetime import datetime, timezone

from jupyter_gpubroker.broker.models import Device, Gpu, Inventory
from jupyter_gpubroker.broker.store import Store
from jupyter_gpubroker.wire.profiles import CATALOG, free_starts
from jupyter_gpubroker.wire.sizes import Size

WEDNESDAY_10AM = datetime(2024, 5, 15, 10, 0, tzinfo=timezone.utc).timestamp()
"""A working-hours instant (Wednesday 10:00 UTC): interactive outranks batch."""

Slice = str | tuple[str, int]
"""A MIG slice of a layout: a profile name (lowest free start) or (profile, start)."""


def allocations(store: Store) -> dict[str, str]:
    """The held devices as the state file has them: device UUID -> lease id."""
    return dict(store.conn.execute("SELECT device, lease_id FROM allocations").fetchall())


def gpu_uuid(index: int) -> str:
    return f"GPU-{index:08x}-0000-4000-8000-000000000000"


def mig_uuid(gpu_index: int, profile: str, start: int) -> str:
    return f"MIG-{gpu_index:08x}-{profile}-{start}"


def mig_device(gpu: Gpu, profile_name: str, start: int, gi: int | None = None) -> Device:
    """A MIG slice of ``profile_name`` at memory slice ``start`` of ``gpu``."""
    model = CATALOG[gpu.model or ""]
    p = model.profile(profile_name)
    assert p is not None, f"{model.key} has no profile {profile_name}"
    assert start in p.starts, f"{profile_name} cannot start at {start}"
    return Device(
        uuid=mig_uuid(gpu.index, profile_name, start),
        kind="mig",
        gpu_index=gpu.index,
        gpu_uuid=gpu.uuid,
        memory_mib=p.memory_mib,
        compute_slices=p.compute_slices,
        profile=profile_name,
        start=start,
        gpu_instance_id=gi if gi is not None else start + 1,
        compute_instance_id=0,
    )


def make_inventory(gpus: Sequence[Iterable[Slice] | None], model: str = "H100-80GB") -> Inventory:
    """One GPU per entry: ``None`` for a whole GPU (MIG off), else its MIG layout.

    A layout entry given by name goes at the lowest start still free, like
    ``nvidia-smi mig -cgi`` without a placement."""
    m = CATALOG[model]
    gpu_list: list[Gpu] = []
    devices: list[Device] = []
    for index, layout in enumerate(gpus):
        gpu = Gpu(
            index=index,
            uuid=gpu_uuid(index),
            name=m.nvml_names[0],
            memory_mib=m.memory_mib,
            mig_enabled=layout is not None,
            model=m.key,
            pci_bus_id=f"00000000:{index + 0x10:02X}:00.0",
        )
        gpu_list.append(gpu)
        if layout is None:
            devices.append(
                Device(
                    uuid=gpu.uuid,
                    kind="gpu",
                    gpu_index=index,
                    gpu_uuid=gpu.uuid,
                    memory_mib=m.memory_mib,
                )
            )
            continue
        occupied: set[int] = set()
        for entry in layout:
            name, start = (entry, None) if isinstance(entry, str) else entry
            p = m.profile(name)
            assert p is not None, f"{m.key} has no profile {name}"
            if start is None:
                starts = free_starts(p, occupied)
                assert starts, f"no room for {name} on GPU {index}"
                start = starts[0]
            assert occupied.isdisjoint(p.slots(start)), f"{name}@{start} overlaps"
            occupied |= set(p.slots(start))
            devices.append(mig_device(gpu, name, start))
    return Inventory(tuple(gpu_list), tuple(devices))


def on_nodes(layouts: dict[str, Sequence[Iterable[Slice] | None]]) -> Inventory:
    """A cluster: each node's GPUs as ``make_inventory`` lays them out, with
    ``Gpu.node``/``Device.node`` set and UUIDs prefixed by the node."""
    gpus: list[Gpu] = []
    devices: list[Device] = []
    for node, layout in layouts.items():
        inv = make_inventory(layout)
        gpus += [replace(g, uuid=f"{node}-{g.uuid}", node=node) for g in inv.gpus]
        devices += [
            replace(d, uuid=f"{node}-{d.uuid}", gpu_uuid=f"{node}-{d.gpu_uuid}", node=node)
            for d in inv.devices
        ]
    return Inventory(tuple(gpus), tuple(devices))


def mig_inventory(
    gpus: int = 2, layout: Iterable[Slice] = ("1g.10gb",) * 7, model: str = "H100-80GB"
) -> Inventory:
    """``gpus`` GPUs in MIG mode, each cut as ``layout``."""
    layout = tuple(layout)
    return make_inventory([layout] * gpus, model)


def whole_inventory(gpus: int = 4, model: str = "H100-80GB") -> Inventory:
    """``gpus`` GPUs with MIG disabled."""
    return make_inventory([None] * gpus, model)


def without(inventory: Inventory, *uuids: str) -> Inventory:
    """The same inventory less some devices (a GPU fell off the bus)."""
    return Inventory(inventory.gpus, tuple(d for d in inventory.devices if d.uuid not in uuids))


class FakePartitioner:
    """Cuts MIG slices in an in-test copy of the inventory (the ``Partitioner`` protocol).

    ``create`` puts a Device at the planned placement after checking that the
    memory slices are free; ``destroy`` refuses a slice the broker holds."""

    def __init__(self, inventory: Inventory) -> None:
        self.gpus = {g.uuid: g for g in inventory.gpus}
        self.devices = {d.uuid: d for d in inventory.devices}
        self.created: list[Device] = []
        self.destroyed: list[str] = []
        self.busy: Callable[[str], bool] = lambda uuid: False

    def occupied(self, gpu_uuid: str) -> set[int]:
        out: set[int] = set()
        for d in self.devices.values():
            if d.gpu_uuid == gpu_uuid and d.kind == "mig":
                gpu = self.gpus[gpu_uuid]
                p = CATALOG[gpu.model or ""].profile(d.profile or "")
                assert p is not None
                out |= set(p.slots(d.start or 0))
        return out

    def create(self, gpu_uuid: str, profile: str, start: int) -> Device:
        gpu = self.gpus[gpu_uuid]
        p = CATALOG[gpu.model or ""].profile(profile)
        assert p is not None and start in p.starts, f"{profile}@{start} is not a placement"
        assert self.occupied(gpu_uuid).isdisjoint(p.slots(start)), f"{profile}@{start} overlaps"
        d = mig_device(gpu, profile, start, gi=100 + len(self.created))
        self.devices[d.uuid] = d
        self.created.append(d)
        return d

    def destroy(self, device_uuid: str) -> None:
        assert not self.busy(device_uuid), f"destroying {device_uuid}, which is in use"
        del self.devices[device_uuid]
        self.destroyed.append(device_uuid)


SIZES = (
    Size(gpus=1),
    Size(gpus=2),
    Size(profile="1g.10gb"),
    Size(profile="2g.20gb"),
    Size(profile="3g.40gb"),
    Size(min_memory_gb=15),
)
"""One of each kind of size, for random workloads (property and crash tests)."""
