"""Engines: where the inventory comes from when one machine is not enough.

On one machine NVML is the inventory and the broker places down to the GPU or
MIG UUID. On a cluster an engine the deployment already trusts (Slurm,
Kubernetes) starts the servers and enforces placement; the broker still
decides who goes next, on which node and which device type. An
:class:`InventorySource` (an inventory of :mod:`jupyter_gpubroker.inventory`'s one
contract) reads the engine into a :class:`ClusterView` at the start and, through its
watch (:mod:`.watch`), on every tick, and :func:`apply_view` makes the broker respect
it: devices used by work the broker did not grant (jobs started outside the hub) and
nodes the engine has drained or lost are drained in the broker with the engine's
reason, and given back when the engine frees them. The broker's own grants
are not "outside": a source leaves them out of its counts (Slurm: by the job's
comment; Kubernetes: by the pod's label) and lists them by lease, so that the
work of a lease that has ended still holds its devices until the engine ends it.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import import_module
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, ClassVar

from ..broker.models import Device, Inventory
from ..broker.shapes import device_class
from ..inventory import BaseInventory, OpenInventory
from ..wire.errors import InvalidRequest

if TYPE_CHECKING:
    from ..broker.core import Broker
    from ..runtime.settings import BrokerSettings

ENGINE = "engine"
"""The drain cause of devices the engine holds back: lifted only by the engine."""


@dataclass(frozen=True)
class ClusterView:
    """What an engine says at one instant.

    ``inventory``: every node's GPUs and grantable devices, each ``Gpu.node`` and
    ``Device.node`` set (UUIDs are the source's own stable names when the engine
    has none). ``outside``: (node, device class) -> how many devices of that
    class on that node run work the broker did not grant; the class is a MIG
    profile or ``gpu`` (:func:`device_class`). ``down``: node -> the engine's
    reason it takes no work (drained, down, gone)."""

    inventory: Inventory
    outside: Mapping[tuple[str, str], int] = field(default_factory=dict)
    down: Mapping[str, str] = field(default_factory=dict)
    holders: Mapping[str, str] | None = None
    """Lease id -> the engine's work carrying it out (a Slurm job id, a pod): the
    broker's grants the engine still runs or queues. ``None``: the source does not track
    them."""
    grants: Mapping[str, Mapping[tuple[str, str], int]] = field(default_factory=dict)
    """Lease id -> (node, device class) -> how many devices the broker's granted work
    runs on now. Left out of ``outside``; once its lease has ended (released, reclaimed)
    and until the engine ends the work, :func:`apply_view` holds them back as in use."""
    withheld: Mapping[tuple[str, str], str] = field(default_factory=dict)
    """(node, device class) -> why the broker must grant none of them although the
    engine offers them: the engine hands out shares, not devices of their own (GPU
    time-slicing or MPS)."""
    outside_devices: Mapping[str, str] = field(default_factory=dict)
    """Where the engine names the very device (Kubernetes' DRA claims): device UUID ->
    the work outside the broker that holds it. Counted beside ``outside``."""
    lease_devices: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Where the engine names the very device: lease id -> the devices its work holds
    now; beside ``grants``, and held back the same way once the lease has ended."""
    source: str = ""
    """What the engine's inventory is read from, when it can be read from more than one
    thing (Kubernetes: DRA's ResourceSlices or the device plugin's resources)."""
    asleep: Mapping[str, str] = field(default_factory=dict)
    """Node -> the engine's words for why it takes no work now although it is not down:
    it sleeps, wakes up or goes to sleep under the engine's power saving (Slurm's
    ``POWERED_DOWN``). Held back as ``down`` is; the engine wakes it on demand."""


class InventorySource(BaseInventory):
    """An engine's reader (the base of an engine's ``c.GPUBroker.inventory_class``),
    awaited on the server's event loop every tick (so a slow ``scontrol`` or API server
    never blocks the API). ``read`` raises :class:`EngineUnavailable` when the engine
    cannot be reached; the broker then keeps its queue and its last view and says so.
    Configured as ``c.<its class>.*``, with the broker as its parent."""

    work: ClassVar[str]
    """What carries out a grant there, as a user reads it: ``job``, ``pod``."""

    async def read(self) -> ClusterView:
        raise NotImplementedError

    def open(self, settings: BrokerSettings, api_url: str) -> OpenInventory:
        """The engine's view, read now, and its watch (:mod:`.watch`), which applies that
        view first: leases whose work ended while the broker was down end then."""
        if settings.dynamic_mig:
            raise InvalidRequest(
                "c.GPUBroker.dynamic_mig needs the GPUs' NVML: with an engine, MIG slices "
                "are the engine's (Slurm's gres types); turn dynamic_mig off"
            )
        from .watch import EngineWatch, read_now

        view = read_now(self)

        def follow(core: Broker, grace_s: Callable[[], float]) -> EngineWatch:
            watch = EngineWatch(self, core, grace_s, self.log)
            watch.apply(view)
            return watch

        nodes = len({g.node for g in view.inventory.gpus})
        where = f"{self.name}, {nodes} nodes" + (f", from {view.source}" if view.source else "")
        return OpenInventory(view.inventory, where, follow=follow)


class EngineUnavailable(RuntimeError):
    """The engine did not answer (``slurmctld`` or the API server is unreachable)."""


ENTRY_POINTS = "jupyter_gpubroker.engines"
"""The entry point group of inventory sources (``slurm = ...:SlurmInventory``)."""
BUILT_IN = {
    "kubernetes": "jupyter_gpubroker.engines.kubernetes:KubernetesInventory",
    "slurm": "jupyter_gpubroker.engines.slurm:SlurmInventory",
}
"""The sources this package has (also found when it runs from a checkout)."""


def engine_classes() -> dict[str, str]:
    """Engine name -> its reader class's ``module:attr``: the entry point group's, this
    package's own among them (also when it runs from a checkout, unregistered)."""
    return {**BUILT_IN, **{ep.name: ep.value for ep in entry_points(group=ENTRY_POINTS)}}


def engine_class(name: str) -> type[InventorySource]:
    """The reader class registered as ``name`` (one of :func:`engine_classes`)."""
    module, _, attr = engine_classes()[name].partition(":")
    found: type[InventorySource] = getattr(import_module(module), attr)
    return found


def apply_view(broker: Broker, view: ClusterView) -> list[Device]:
    """Add to ``broker`` the devices ``view`` has that it lacks (a node or gres that
    joined); drain what the engine holds back, shares or no longer lists (a node that
    left, gres removed from a node that stays) and what work outside the broker or of an
    ended lease still uses; lift the engine's drains it no longer holds. Idempotent: a
    view applied twice changes nothing the second time. An admin's or health's own drain
    is left alone. The devices added."""
    added = broker.add_devices(view.inventory.gpus, view.inventory.devices)
    wanted, by_slot = _not_offered(broker, view)
    engine_drained = broker.drained_by(ENGINE)
    wanted.update(_in_use(broker, view, by_slot, engine_drained))
    wanted.update(_named_in_use(broker, view, wanted))
    drains = broker.drained()
    for uuid, reason in wanted.items():
        if broker.drain_cause(uuid) not in (None, ENGINE, "health"):
            continue  # an admin's or a vacate's drain keeps its own reason
        if drains.get(uuid, ("",))[0] != reason or broker.drain_cause(uuid) != ENGINE:
            broker.drain(uuid, reason, cause=ENGINE)
    for uuid in engine_drained - wanted.keys():
        broker.undrain(uuid, "the engine freed it")
    return added


Slot = tuple[str, str]
"""(node, device class)."""


def _not_offered(
    broker: Broker, view: ClusterView
) -> tuple[dict[str, str], dict[Slot, list[Device]]]:
    """The devices the engine does not offer, with why (their node takes no work or left,
    the engine no longer lists them, or shares them out), and the others by slot."""
    placer = broker.placer
    wanted: dict[str, str] = {}
    listed = {d.uuid for d in view.inventory.devices}
    known = {d.node for d in placer.devices.values()}
    seen = {d.node for d in view.inventory.devices}
    down = {**view.asleep, **view.down}
    for node in known - seen:
        down.setdefault(node, f"node {node} is no longer in the cluster")
    by_slot: dict[Slot, list[Device]] = defaultdict(list)
    for d in placer.devices.values():
        if d.node in down:
            wanted[d.gpu_uuid] = f"{d.node}: {down[d.node]}"
        elif d.uuid not in listed:
            wanted[d.uuid] = f"{d.node}: the engine no longer lists this {device_class(d)} device"
        elif (d.node, device_class(d)) in view.withheld:
            wanted[d.uuid] = f"{d.node}: {view.withheld[(d.node, device_class(d))]}"
        else:
            by_slot[(d.node, device_class(d))].append(d)
    return wanted, by_slot


def _in_use(
    broker: Broker,
    view: ClusterView,
    by_slot: Mapping[Slot, list[Device]],
    engine_drained: set[str],
) -> dict[str, str]:
    """The offered devices that work outside the broker, or of an ended lease, uses, with
    why: in each slot as many as the engine counts busy."""
    busy: Counter[Slot] = Counter(view.outside)
    lingering: dict[Slot, str] = {}
    active = {x.id for x in broker.leases()}
    for lease_id, slots in sorted(view.grants.items()):
        if lease_id not in active:  # ended in the broker, still running on the engine
            for slot, n in slots.items():
                busy[slot] += n
                lingering.setdefault(slot, lease_id)
    wanted: dict[str, str] = {}
    for slot, n in busy.items():
        if n <= 0:
            continue
        # Keep the devices already held back first, then the free ones from the top;
        # a device the broker granted is never taken back (the engine queues the job).
        cands = sorted(
            (d for d in by_slot.get(slot, []) if d.uuid not in broker.placer.held),
            key=lambda d: (d.uuid not in engine_drained, -d.gpu_index, -(d.start or 0)),
        )
        node, cls = slot
        total = len(by_slot.get(slot, []))
        why = f"{n} of {total} {cls} on {node} in use outside the broker"
        if slot in lingering:
            why += f" or by the work of ended lease {lingering[slot]}"
        for d in cands[:n]:
            wanted[d.uuid] = why
    return wanted


def _named_in_use(broker: Broker, view: ClusterView, wanted: Mapping[str, str]) -> dict[str, str]:
    """The offered devices the engine names as held by work outside the broker, or by
    the work of an ended lease, with why; never one the broker granted."""
    devices, held = broker.placer.devices, broker.placer.held
    active = {x.id for x in broker.leases()}
    why = {u: f"in use outside the broker by {w}" for u, w in view.outside_devices.items()}
    for lease_id, uuids in sorted(view.lease_devices.items()):
        if lease_id not in active:  # ended in the broker, still running on the engine
            why.update({u: f"in use by the work of ended lease {lease_id}" for u in uuids})
    return {
        u: f"{devices[u].node}: {w}"
        for u, w in why.items()
        if u in devices and u not in held and u not in wanted
    }


def release_ended(
    broker: Broker, view: ClusterView, grace_s: float, work: str = "engine job"
) -> list[str]:
    """Release the leases whose engine work ended: granted over ``grace_s`` seconds ago
    (the time a spawner has to submit its job) and not among the view's ``holders``,
    such as a job cancelled with ``scancel``, a pod deleted with ``kubectl``, or work that
    ended while the broker was down; ``work`` names it in the reason ("Slurm job").
    The lease ids it released; nothing when the view does not track holders."""
    if view.holders is None:
        return []
    now = broker.clock.now()
    ended = [
        x.id for x in broker.leases() if x.id not in view.holders and now - x.granted_at > grace_s
    ]
    for lease_id in ended:
        broker.release(lease_id, reason=f"its {work} ended")
    return ended
