"""A broker on a virtual clock over a simulated NVML machine, sampled as the server does,
with kernels the test drives by hand. Shared by the health, reclaim and monitor tests."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from jupyter_gpubroker.broker.alerts import AlertChange, AlertConfig, AlertJudge
from jupyter_gpubroker.broker.clock import VirtualClock
from jupyter_gpubroker.broker.core import Broker, BrokerConfig, Event
from jupyter_gpubroker.broker.health import HealthConfig, HealthJudge
from jupyter_gpubroker.broker.models import Lease
from jupyter_gpubroker.broker.reclaim import Decision, KernelState, ReclaimConfig, Reclaimer
from jupyter_gpubroker.broker.store import Store
from jupyter_gpubroker.monitor.sampler import Sampler
from jupyter_gpubroker.monitor.samples import SampleStore
from jupyter_gpubroker.nvml import NvmlBackend, SimulatedNvml, load_topology
from jupyter_gpubroker.wire.sizes import Size

INTERVAL = 5.0
WEDNESDAY_10AM = 1_715_767_200.0
"""2024-05-15 10:00 UTC, as in the core's tests: interactive outranks batch."""


class Kernels:
    """The ``KernelSource`` of the tests: kernel id -> state, set by the test."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.states: dict[str, KernelState] = {}

    def observe(self, holders: Iterable[str]) -> dict[str, KernelState]:
        return {o: self.states[o] for o in holders if o in self.states}

    def run(self, kernel_id: str) -> None:
        """The kernel starts running a cell."""
        self.states[kernel_id] = KernelState("busy", self.clock.now())

    def finish(self, kernel_id: str) -> None:
        """The kernel finishes its cell and goes idle."""
        self.states[kernel_id] = KernelState("idle", self.clock.now())


class Machine:
    """``topology`` simulated under pynvml (open until ``close``), a broker on ``store``."""

    def __init__(
        self,
        topology: str = "dgx-h100:2",
        *,
        reclaim: ReclaimConfig | None = None,
        health: HealthConfig | None = None,
        gpm: bool = False,
        store: Store | None = None,
        clock: VirtualClock | None = None,
        alerts: AlertConfig | None = None,
        config: BrokerConfig | None = None,
    ) -> None:
        """``alerts``: judge health alerts too, with this configuration (``changes``);
        ``config``: the broker's (its sharing rules, ...)."""
        self.clock = clock or VirtualClock(WEDNESDAY_10AM)
        self.sim = SimulatedNvml(load_topology(topology), gpm=gpm)
        self.backend = NvmlBackend(self.sim).open()
        self.store = store or Store()
        self.broker = Broker(self.store, self.backend.inventory(), clock=self.clock, config=config)
        self.kernels = Kernels(self.clock)
        self.sampler = Sampler(
            self.broker,
            self.backend,
            SampleStore(self.store, INTERVAL),
            HealthJudge(health),
            Reclaimer(self.broker, reclaim or ReclaimConfig()),
            alerts=None if alerts is None else AlertJudge(self.store, self.clock.now(), alerts),
        )
        self.sampler.kernels = self.kernels
        self.changes: list[AlertChange] = []
        self.sampler.on_alert = self.changes.append
        self.events: list[Event] = []
        self.broker.subscribe(self.events.append)
        self.decisions: list[Decision] = []

    def close(self) -> None:
        self.backend.close()

    def submit(self, size: str, holder: str, user: str = "ann", **kw: Any) -> Lease | None:
        """Submit for kernel ``holder``; its lease if granted at once."""
        r = self.broker.submit(user, Size.parse(size), holder=holder, **kw)
        return self.broker.lease(r.lease_id) if r.lease_id else None

    def run(self, seconds: float) -> list[Decision]:
        """Sample every ``INTERVAL`` seconds for ``seconds`` of virtual time, renewing every
        lease and queued request as its holder would; the decisions made meanwhile."""
        made: list[Decision] = []
        for _ in range(round(seconds / INTERVAL)):
            self.clock.advance(INTERVAL)
            for lease in self.broker.leases():
                self.broker.renew(lease.id)
            for r in self.broker.live_requests():
                self.broker.renew_request(r.id)
            self.broker.tick()
            made += self.sampler.sample()
        self.decisions += made
        return made

    def kinds(self, lease_id: str | None = None) -> list[str]:
        """Kinds of the events so far (of one lease's, when given)."""
        return [e.kind for e in self.events if lease_id in (None, e.lease_id)]
