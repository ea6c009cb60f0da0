"""Which devices are interchangeable: a device's class (its MIG profile, or a whole GPU)
and its shape (class and memory), the keys of placement's free lists and indexes, of
the ETA's list-schedule and of the metrics' labels."""

from __future__ import annotations

from .models import Device

WHOLE_GPU = "gpu"


def device_class(d: Device) -> str:
    """The free-list a device belongs to: its MIG profile, or ``gpu``."""
    return d.profile if d.profile is not None else WHOLE_GPU


Shape = tuple[str, int]
"""(device class, memory MiB): devices that are interchangeable for every size."""


def shape(d: Device) -> Shape:
    return (device_class(d), d.memory_mib)
