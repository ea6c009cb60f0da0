"""Where the inventory comes from: ``c.GPUBroker.inventory_class``, a class as
jupyter-scheduler swaps its own, or ``inventory_source``, its name.

Every class it takes is a :class:`~jupyter_gpubroker.inventory.BaseInventory` (the one
contract: ``open`` returns an ``OpenInventory``). :class:`NvmlInventory` is this
machine's NVML (the default); an engine's reader is an
:class:`~jupyter_gpubroker.engines.InventorySource`, found by name in the
``jupyter_gpubroker.engines`` entry point group (so a plugin's engine is named as
Slurm and Kubernetes are).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from traitlets import TraitError, Type

from ..engines import InventorySource, engine_class, engine_classes
from ..inventory import BaseInventory, OpenInventory
from ..nvml import MigPartitioner, open_backend
from ..statelock import GpuLocks

if TYPE_CHECKING:
    from .settings import BrokerSettings

NVML = "nvml"

__all__ = [
    "NVML",
    "InventoryClass",
    "InventorySource",
    "NvmlInventory",
    "source_class",
    "source_names",
]


class NvmlInventory(BaseInventory):
    """This machine's GPUs through NVML, real or simulated (``c.GPUBroker.simulate``),
    placed down to the GPU or MIG UUID. The broker holds each GPU's machine-wide lock
    while it runs, so no other broker on the machine hands it out."""

    name = NVML
    local = True

    def open(self, settings: BrokerSettings, api_url: str) -> OpenInventory:
        """The opened driver (or simulator), its GPUs' locks taken; the driver is closed
        again when a lock is refused."""
        backend = open_backend(settings.simulate, log=self.log, seed=settings.simulate_seed)
        try:
            devices = backend.inventory()
            locks = GpuLocks(
                Path(settings.gpu_lock_dir).expanduser(),
                Path(settings.user_gpu_lock_dir).expanduser(),
                self.log,
            )
            locks.acquire((g.uuid for g in devices.gpus), api_url)
        except BaseException:
            backend.close()
            raise

        def close() -> None:
            backend.close()
            locks.release()

        return OpenInventory(
            devices,
            f"simulated {settings.simulate}" if settings.simulate else "NVIDIA driver",
            readings=backend,
            nvml=backend,
            partitioner=MigPartitioner(backend) if settings.dynamic_mig else None,
            close=close,
        )


def source_names() -> list[str]:
    """The names ``inventory_source`` takes: ``nvml`` and every registered engine."""
    return [NVML, *sorted(engine_classes())]


def source_class(name: str) -> type[BaseInventory]:
    """The class ``inventory_source = name`` stands for."""
    return NvmlInventory if name == NVML else engine_class(name)


class InventoryClass(Type):  # type: ignore[type-arg]
    """A ``Type`` trait that takes a :class:`~jupyter_gpubroker.inventory.BaseInventory`
    (:class:`NvmlInventory`, an engine's :class:`InventorySource`, a subclass of either;
    a dotted name in config files), and refuses anything else with one sentence."""

    def __init__(self, help: str) -> None:
        super().__init__("jupyter_gpubroker.runtime.NvmlInventory", BaseInventory, help=help)

    def validate(self, obj: object, value: object) -> type:
        try:
            cls: type = super().validate(obj, value)
        except TraitError:
            named = value if isinstance(value, str) else getattr(value, "__qualname__", value)
            raise TraitError(
                f"c.GPUBroker.inventory_class is jupyter_gpubroker.runtime.NvmlInventory or a "
                f"subclass of jupyter_gpubroker.engines.InventorySource, not {named!r}"
            ) from None
        return cls
