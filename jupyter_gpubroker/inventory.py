"""The one contract of ``c.GPUBroker.inventory_class``: where the broker's devices come from.

jupyter-scheduler swaps each role through one base class (``scheduler_class``); here
the role is the inventory. Every source, this machine's NVML
(``runtime.NvmlInventory``) and each engine (``engines.InventorySource``: Slurm,
Kubernetes, a plugin's), is a :class:`BaseInventory` whose ``open`` returns the same
:class:`OpenInventory`. The running broker is built from that alone, so it asks which
source it has nowhere.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from traitlets.config import LoggingConfigurable

from .broker.models import DeviceEvent, DeviceReading, Inventory

if TYPE_CHECKING:
    from .broker.core import Broker
    from .broker.devices import Partitioner
    from .engines import InventorySource
    from .monitor.sampler import Reader
    from .nvml import NvmlBackend
    from .runtime.settings import BrokerSettings


class NoReadings:
    """The sampler's reader where the broker has no NVML of the GPUs (an engine's nodes
    have it): no device readings and no hardware events."""

    def read_all(self, inventory: Inventory | None = None) -> dict[str, DeviceReading]:
        return {}

    def poll_events(self) -> list[DeviceEvent]:
        return []


class InventoryWatch:
    """Keeps the core in step with its source while the broker runs. This one follows
    nothing: NVML's changes reach the core through the sampling pass. An engine's
    (``engines.watch.EngineWatch``) reads the engine every tick."""

    source: InventorySource | None = None
    """The engine followed (None: this machine's NVML)."""
    after_poll: Callable[[], Awaitable[None]] | None = None
    """What the broker does after each read of the engine applied (it acts on the engine
    ahead of the forecast: ``runtime.slurm_ahead``)."""

    def start(self, interval_s: float) -> None:
        """Follow every ``interval_s`` seconds on the current IOLoop."""

    def stop(self) -> None:
        """Follow no more."""

    async def poll(self) -> None:
        """One read of the source, applied."""

    def state(self) -> dict[str, Any] | None:
        """The engine's name and whether it answers (None: no engine)."""
        return None


@dataclass(frozen=True)
class Warm:
    """Capacity an engine keeps warm ahead of the forecast (Kubernetes: a placeholder pod)."""

    name: str
    """The engine's name for it (``namespace/pod``)."""
    gpus: int
    since: float
    """When the broker made it, on the broker's clock."""
    node: str | None
    """The node it keeps; None while it waits for one (the autoscaler's cue to add one)."""


class CapacityRefused(RuntimeError):
    """The engine refuses to keep capacity warm, or does not answer: why, in a sentence."""


class WarmCapacity:
    """How an engine is asked for capacity ahead of the forecast, and gives it back
    (``OpenInventory.warm``); the running broker decides how much (``runtime.kube_ahead``).
    Each call raises :class:`CapacityRefused` when the engine refuses or does not answer."""

    what: ClassVar[str]
    """What keeps the capacity, as the admin page says it: ``placeholder pods``."""

    async def check(self) -> None:
        """Whether the engine lets the broker keep capacity warm and give it back, asked
        before it is needed."""
        raise NotImplementedError

    async def kept(self) -> list[Warm]:
        """What is kept warm now."""
        raise NotImplementedError

    async def add(self, now: float) -> Warm:
        """Keep one GPU more warm; what keeps it."""
        raise NotImplementedError

    async def remove(self, name: str) -> None:
        """Give it back (one already gone is no error)."""
        raise NotImplementedError


def _follow_nothing(core: Broker, grace_s: Callable[[], float]) -> InventoryWatch:
    return InventoryWatch()


def _close_nothing() -> None:
    """An opened source that holds nothing open."""


@dataclass
class OpenInventory:
    """An opened source, the same shape from every one: what the broker is built from,
    what it reads while it runs, and how to give back what ``open`` took."""

    devices: Inventory
    """The GPUs and grantable devices at the start."""
    where: str
    """The source as the start's log line names it: ``NVIDIA driver``, ``slurm, 2 nodes``."""
    readings: Reader = field(default_factory=NoReadings)
    """What each sampling pass reads."""
    nvml: NvmlBackend | None = None
    """This machine's driver, where the GPUs are this machine's: the core's process probe,
    outside use, suspend and device cgroups read it. None: an engine's nodes own them."""
    partitioner: Partitioner | None = None
    """What re-cuts MIG GPUs (``c.GPUBroker.dynamic_mig``)."""
    follow: Callable[[Broker, Callable[[], float]], InventoryWatch] = _follow_nothing
    """The watch that keeps the core in step, once it is built; ``grace_s`` says the
    current ``engine_grace`` (a setting that may change while the broker runs)."""
    close: Callable[[], None] = _close_nothing
    """Gives back what ``open`` took (the driver, the GPUs' locks)."""
    warm: WarmCapacity | None = None
    """How the engine is asked for capacity ahead of the forecast (Kubernetes: placeholder
    pods); None: the source has no such means."""


class BaseInventory(LoggingConfigurable):
    """A source of the broker's devices, configured as ``c.<its class>.*`` with the
    broker as its parent."""

    name: ClassVar[str]
    """The source's name, as ``c.GPUBroker.inventory_source`` and logs name it."""
    local: ClassVar[bool] = False
    """Whether the GPUs are this machine's (the server says so when it has no driver)."""

    def open(self, settings: BrokerSettings, api_url: str) -> OpenInventory:
        """Open the source for a broker with ``settings`` that kernels reach at
        ``api_url``. Raises ``InvalidRequest`` for settings the source cannot serve, and
        leaves nothing open when it raises."""
        raise NotImplementedError
