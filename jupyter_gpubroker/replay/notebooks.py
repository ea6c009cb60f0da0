"""Replay notebook sessions (kernels and their cells) through the real broker and reclaimer.

A batch trace says when jobs hold GPUs; a notebook trace says when a kernel *uses* them,
and what it holds in between is the policy's choice. Each session starts a kernel that
asks the broker for the session's GPUs, as the provisioner does (one request per kernel,
holder the kernel, class interactive); each cell makes the kernel busy for its duration,
and a GPU cell puts its recorded utilization on its GPUs in the simulated NVML. Idle
reclaim is the product's own: the ``Sampler`` turns the NVML readings of the leased
devices and the kernels' states into observations and the ``Reclaimer`` warns, withdraws
and reclaims through the broker, on the virtual clock.

What a session does, in every policy:

- cells run one after the other: a cell is ready at its recorded start, or when the one
  before it ends if that is later; a GPU cell also needs the session's lease, and waits
  for it in the queue (its *wait*); a CPU-only cell is kernel activity and needs no GPU;
- a kernel shut down by a reclaim asks again at its next GPU cell (not at its next CPU
  cell: a notebook that only reads and plots goes on without a GPU);
- a shutdown whose user comes back (a later cell becomes ready) is a kernel *lost*:
  the cost of a reclaim a user notices, which one after the last cell is not;
- the user leaves at the session's recorded stop: a running cell finishes, a waiting
  request is withdrawn, and cells not started by then never run.

Policies (``Policy.hold``): ``session`` holds the GPUs from the kernel's start to the
session's end (a plain JupyterHub); ``cell`` asks at each GPU cell and gives back at its
end (on demand); ``reclaim`` holds from the start and lets the reclaimer take idle leases
back (``ReclaimConfig``). ``gpu_blind`` judges kernel activity only (an HTTP idle
culler, which never reads the GPU); ``shares``: each kernel asks for the memory its
session's cells used (the trace's largest ``vram``, rounded up to a whole GB) as a share
of one GPU, on GPUs lent both whole and shared, instead of its whole GPUs (whole GPUs
where no GPU has that memory); held shares count as their fraction of the GPU. Under
``reclaim`` a share is judged as the product judges one: by its kernel's activity and
its own processes' footprint, never by its GPU's utilization (its shares' together);
the replay lists no process of a share, so its kernel's cells are its only activity.
A share is never suspended; ``suspend_gbps`` suspends instead of shutting down,
through the product's own path: the reclaimer hands the lease over at its deadline, the
``Suspender`` checks and checkpoints the kernel's process on the simulated checkpoint
driver (its memory leaves the simulated GPU), the lease ends with cause ``suspended``, and
the next grant restores the process onto the granted GPUs. A kernel with nothing on its GPU
yet is not suspended but shut down, as the product does. Only the copies' durations are a
model: a fixed cost plus that throughput each way, while the GPUs are held (no GPU has
measured them yet).

Sampling is event-driven: a pass at every instant where something happens, at each
warning's deadline and each lease's next idle deadline (the reclaimer's own ``idle_s``
against its timeout), and every ``HEARTBEAT_S`` besides, so the GPU's last busy sample
is never older than that (the stalled check reads it). The product samples every
``sample_interval`` (5 s): it acts up to that much later than the replay.
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from ..broker.clock import VirtualClock
from ..broker.config import BrokerConfig
from ..broker.core import Broker
from ..broker.health import HealthConfig, HealthJudge
from ..broker.models import DeviceReading, Inventory, Lease
from ..broker.policy import make_policy
from ..broker.reclaim import Decision, KernelState, ReclaimConfig, Reclaimer
from ..broker.sharing import Sharing
from ..broker.store import Store
from ..monitor.sampler import Sampler
from ..monitor.samples import SampleStore
from ..nvml import NvmlBackend, open_backend
from ..suspend import SUSPENDED, Suspender, Suspension
from ..suspend.simulated import SimulatedCheckpointDriver
from ..wire.sizes import MIB_PER_GB, Size, gb_to_mib  # the trace's ``vram``: GB, as every size

TICK_S = 60.0
"""The trace's tick: one minute."""
NODE_GPUS = 8
PID_BASE = 5_000_000
"""The kernels' simulated process ids: above any Linux pid (at most 4,194,304)."""
HEARTBEAT_S = 1800.0


@dataclass(frozen=True)
class Cell:
    start_s: float
    duration_s: float
    gpus: int
    """0: a CPU-only cell."""
    vram_gb: float
    utilization: float
    """Percent, the highest of its GPUs' averages."""


@dataclass(frozen=True)
class Session:
    id: str
    start_s: float
    stop_s: float
    cells: tuple[Cell, ...]

    @property
    def gpus(self) -> int:
        """The GPUs its kernel asks for (every GPU cell of a session asks the same)."""
        return max((c.gpus for c in self.cells), default=0)

    @property
    def peak_gb(self) -> float:
        """The most GPU memory its cells used (their ``vram``, all its GPUs together)."""
        return max((c.vram_gb for c in self.cells), default=0.0)


def load(path: str | Path) -> list[Session]:
    """Sessions of a NotebookOS workload template (ticks of one minute), by start."""
    data = json.loads(Path(path).read_text())
    sessions = []
    for s in data["sessions"]:
        cells = sorted(
            (
                Cell(
                    t["start_tick"] * TICK_S,
                    t["duration_in_ticks"] * TICK_S,
                    int(t["gpus"]),
                    float(t["vram"]),
                    max((u["utilization"] for u in t["gpu_utilizations"]), default=0.0),
                )
                for t in s["trainings"]
            ),
            key=lambda c: c.start_s,
        )
        sessions.append(
            Session(s["id"], s["start_tick"] * TICK_S, s["stop_tick"] * TICK_S, tuple(cells))
        )
    return sorted(sessions, key=lambda s: (s.start_s, s.id))


@dataclass(frozen=True)
class Policy:
    name: str
    hold: Literal["session", "cell", "reclaim"]
    reclaim: ReclaimConfig | None = None
    gpu_blind: bool = False
    suspend_gbps: float | None = None
    suspend_fixed_s: float = 0.0
    """A suspend's or a restore's cost beside its copy (the driver's own work)."""
    shares: bool = False

    def __post_init__(self) -> None:
        if self.shares and self.suspend_gbps is not None:
            raise ValueError("a share is never suspended: replay shares without suspend_gbps")

    @property
    def modelled(self) -> bool:
        return self.suspend_gbps is not None

    def copy_s(self, mib: float) -> float:
        """How long a suspend or a restore of ``mib`` takes: a fixed cost plus its copy."""
        assert self.suspend_gbps is not None
        return self.suspend_fixed_s + mib / MIB_PER_GB / self.suspend_gbps


@dataclass
class SessionResult:
    id: str
    gpus: int
    held_s: float = 0.0
    """GPU-seconds held (leases, plus modelled checkpoint copies)."""
    waits_s: list[float] = field(default_factory=list)
    """One per GPU cell that ran."""
    ran_gpu_s: float = 0.0
    """GPU-seconds of its GPU cells that ran (what the GPUs were used for)."""
    never_ran: int = 0
    """GPU cells not started by the session's end."""
    shutdowns: int = 0
    lost: int = 0
    """Shutdowns its user came back to: a later cell of the session became ready (a
    shutdown after the last cell costs nobody anything)."""
    suspends: int = 0
    granted: bool = False


@dataclass
class NotebookReplay:
    policy: Policy
    gpus: int
    sessions: list[SessionResult]
    cell_gpu_s: float
    """GPU-seconds of the trace's GPU cells (the same for every policy)."""
    peak_held: float
    """GPU-equivalents held at once, at most."""
    passes: int
    wall_s: float


def replay(
    sessions: Iterable[Session], policy: Policy, *, gpus: int = 144, model: str = "dgx-h100"
) -> NotebookReplay:
    """Replay ``sessions`` under ``policy`` on ``gpus`` simulated GPUs in 8-GPU nodes."""
    wall0 = time.perf_counter()
    sessions = [s for s in sessions if s.gpus]
    with open_backend(f"{model}:{gpus}", privilege="root") as backend:
        run = _Run(sessions, policy, backend)
        run.play()
    cell_s = sum(c.duration_s * c.gpus for s in sessions for c in s.cells)
    return NotebookReplay(
        policy, gpus, run.results, cell_s, run.peak, run.passes, time.perf_counter() - wall0
    )


def in_nodes(inv: Inventory) -> Inventory:
    """The inventory with its GPUs in nodes of ``NODE_GPUS``: no grant spans two."""
    node = {g.uuid: f"node{i // NODE_GPUS:03d}" for i, g in enumerate(inv.gpus)}
    return Inventory(
        tuple(replace(g, node=node[g.uuid]) for g in inv.gpus),
        tuple(replace(d, node=node[d.gpu_uuid]) for d in inv.devices),
    )


@dataclass
class _Kernel:
    """One session's kernel, as the replay plays it."""

    session: Session
    result: SessionResult
    holder: str
    next_cell: int = 0
    busy: bool = False
    last_activity: float = 0.0
    request_id: str | None = None
    lease: Lease | None = None
    waiting_since: float | None = None
    """A GPU cell's ready time while it waits for the lease."""
    running: Cell | None = None
    left: bool = False
    """The session's stop has passed."""
    memory_gb: float = 0.0
    """The most GPU memory its cells have used since its kernel started."""
    pid: int = 0
    """Its process as the simulated NVML lists it (where the policy suspends)."""
    suspension: Suspension | None = None
    """Its processes' GPU memory on the host, restored at the next grant."""
    shut: bool = False
    """Shut down, and its user not back yet."""


class _Run:
    def __init__(self, sessions: list[Session], policy: Policy, backend: NvmlBackend) -> None:
        self.policy, self.backend = policy, backend
        assert backend.simulator is not None
        self.sim = backend.simulator
        self.clock = VirtualClock(min((s.start_s for s in sessions), default=0.0))
        inventory = in_nodes(backend.inventory())
        self.broker = Broker(
            Store(),
            inventory,
            clock=self.clock,
            policy=make_policy("broker"),
            config=BrokerConfig(sharing=Sharing("both")) if policy.shares else None,
        )
        self.largest_mib = max(d.memory_mib for d in inventory.devices)
        self.reclaimer = Reclaimer(self.broker, policy.reclaim) if policy.reclaim else None
        self.sampler: Sampler | None = None
        if self.reclaimer is not None:
            store = SampleStore(self.broker.store, HEARTBEAT_S)
            self.sampler = Sampler(
                self.broker, backend, store, HealthJudge(HealthConfig()), self.reclaimer
            )
            self.sampler.kernels = self
        self.suspender: Suspender | None = None
        if self.reclaimer is not None and policy.suspend_gbps is not None:
            driver = SimulatedCheckpointDriver(self.sim)
            self.suspender = Suspender(driver, host_mib=lambda: math.inf)  # host not modelled
            self.reclaimer.suspends = lambda _: True
        self.kernels = {
            f"kernel-{i}": _Kernel(s, SessionResult(s.id, s.gpus), f"kernel-{i}", pid=PID_BASE + i)
            for i, s in enumerate(sessions)
        }
        self.results = [k.result for k in self.kernels.values()]
        self._events: list[tuple[float, int, str, str]] = []
        self._seq = itertools.count()
        self.held = 0.0
        self.peak = 0.0
        self.passes = 0
        self._readings: dict[str, DeviceReading] = {}
        self._wakes: set[float] = set()

    # -- the event loop

    def at(self, t: float, kind: str, holder: str = "") -> None:
        heapq.heappush(self._events, (t, next(self._seq), kind, holder))

    def play(self) -> None:
        for k in self.kernels.values():
            self.at(k.session.start_s, "start", k.holder)
            self.at(k.session.stop_s, "stop", k.holder)
        if self.reclaimer is not None and self._events:
            self.at(self._events[0][0] + HEARTBEAT_S, "heartbeat")
        while self._events:
            now = self._events[0][0]
            self.clock.set(now)
            while self._events and self._events[0][0] <= now:
                _, _, kind, holder = heapq.heappop(self._events)
                if kind == "heartbeat":
                    if any(not k.left for k in self.kernels.values()):
                        self.at(now + HEARTBEAT_S, "heartbeat")
                elif kind == "wake":
                    self._wakes.discard(now)
                else:
                    getattr(self, f"_{kind}")(self.kernels[holder], now)
            self.broker.schedule()
            self._collect_grants(now)
            if self.sampler is not None:
                self._sample(now)

    def _sample(self, now: float) -> None:
        """Sampling passes until nothing more is due now (a zero grace reclaims at once)."""
        assert self.sampler is not None and self.reclaimer is not None
        while True:
            self.passes += 1
            leased = {u for x in self.broker.leases() for u in x.devices}
            readings = {} if self.policy.gpu_blind else {u: self._read(u) for u in leased}
            decisions = self.reclaimer.step(self.sampler.observe(readings))
            for d in decisions:
                if d.action == "reclaim":
                    self._reclaimed(self.kernels[d.holder], now)
                elif d.action == "suspend":
                    self._suspend(self.kernels[d.holder], d, now)
            granted = self._collect_grants(now)
            due = any(
                x.reclaim_at is not None and x.reclaim_at <= now for x in self.broker.leases()
            )
            if not granted and not due and all(d.action in ("warn", "clear") for d in decisions):
                break
        for lease in self.broker.leases():
            self._wake(lease, now)

    def _load(self, uuid: str, **load: int) -> None:
        self.sim.set_load(uuid, **load)
        self._readings.pop(uuid, None)

    def _read(self, uuid: str) -> DeviceReading:
        """A device's NVML reading; read again only once its load has changed (the
        simulated NVML answers the same until then, and reading costs most of a pass)."""
        if uuid not in self._readings:
            self._readings[uuid] = self.backend.read(uuid)
        return self._readings[uuid]

    def _wake(self, lease: Lease, now: float) -> None:
        """A pass when this lease's warning falls due, or its idle time reaches its timeout."""
        assert self.reclaimer is not None
        if lease.reclaim_at is not None:
            self._wake_at(lease.reclaim_at, now)
            return
        idle = self.reclaimer.idle_s(lease.id)
        request = self.broker.request(lease.request_id)
        timeout = self.reclaimer.config.idle_timeout(
            lease.profile, request.job_class.value, len(lease.devices)
        )
        if idle is not None and timeout and not self.kernels[request.holder].busy:
            self._wake_at(now + timeout - idle, now)

    def _wake_at(self, t: float, now: float) -> None:
        """A pass at ``t``, once; no sooner than a millisecond from now (the reclaimer
        rounds idle times to milliseconds)."""
        t = max(t, now + 0.001)
        if t not in self._wakes:
            self._wakes.add(t)
            self.at(t, "wake")

    # -- what the host sees (the Sampler's KernelSource)

    def observe(self, holders: Iterable[str]) -> dict[str, KernelState]:
        return {
            o: KernelState("busy" if k.busy else "idle", k.last_activity)
            for o in holders
            if (k := self.kernels.get(o)) is not None
        }

    # -- session events

    def _start(self, k: _Kernel, now: float) -> None:
        k.last_activity = now
        if self.policy.hold != "cell":
            self._ask(k)
        self._ready(k, now)

    def _ready(self, k: _Kernel, now: float) -> None:
        """Start the next cell if its time has come and nothing runs; else plan for it."""
        if k.left or k.running is not None or k.waiting_since is not None:
            return
        if k.next_cell >= len(k.session.cells):
            return
        cell = k.session.cells[k.next_cell]
        if cell.start_s > now:
            self.at(cell.start_s, "ready", k.holder)
            return
        if k.shut:  # the user is back and finds the kernel gone
            k.result.lost += 1
            k.shut = False
        if not cell.gpus:
            self._run(k, cell, now)
            return
        k.waiting_since = now
        if k.lease is not None:
            self._begin(k, now)
        elif k.request_id is None:
            self._ask(k)

    def _begin(self, k: _Kernel, now: float) -> None:
        """The waiting GPU cell starts on the lease."""
        assert k.waiting_since is not None and k.lease is not None
        cell = k.session.cells[k.next_cell]
        k.result.waits_s.append(now - k.waiting_since)
        k.waiting_since = None
        k.memory_gb = max(k.memory_gb, cell.vram_gb)
        per_gpu = round(k.memory_gb * MIB_PER_GB / len(k.lease.devices))
        for u in k.lease.devices:
            self._load(u, utilization=round(cell.utilization), memory_used_mib=per_gpu)
            listed = self.sim.process_memory(k.pid)
            if self.suspender is not None and listed.get(u) != per_gpu:
                if u in listed:
                    self.sim.remove_process(u, k.pid)
                self.sim.add_process(u, k.pid, per_gpu)  # what CUDA in the kernel holds
        self._run(k, cell, now)

    def _run(self, k: _Kernel, cell: Cell, now: float) -> None:
        k.running, k.busy, k.last_activity = cell, True, now
        k.result.ran_gpu_s += cell.duration_s * cell.gpus
        k.next_cell += 1
        self.at(now + cell.duration_s, "end", k.holder)

    def _end(self, k: _Kernel, now: float) -> None:
        cell, k.running = k.running, None
        assert cell is not None
        k.busy, k.last_activity = False, now
        if cell.gpus and k.lease is not None:
            for u in k.lease.devices:
                self._load(u, utilization=0)
            if self.policy.hold == "cell":
                self._give_back(k, now)
        if k.left:
            self._leave(k, now)
        else:
            self._ready(k, now)

    def _restored(self, k: _Kernel, now: float) -> None:
        if k.lease is not None and k.waiting_since is not None:  # not left meanwhile
            self._begin(k, now)

    def _stop(self, k: _Kernel, now: float) -> None:
        k.left = True
        if k.running is None:
            self._leave(k, now)

    def _leave(self, k: _Kernel, now: float) -> None:
        """The user has gone: give everything back; GPU cells not started never run."""
        if k.request_id is not None:
            self.broker.cancel(k.request_id)
            k.request_id = None
        if k.lease is not None:
            self._give_back(k, now)
        waiting = k.session.cells[k.next_cell :]
        k.result.never_ran = sum(1 for c in waiting if c.gpus)
        k.next_cell = len(k.session.cells)
        k.waiting_since = None

    # -- the broker

    def _ask(self, k: _Kernel) -> None:
        r = self.broker.submit(
            f"user-{k.holder}", self._size(k.session), holder=k.holder, schedule=False
        )
        k.request_id = r.id

    def _size(self, s: Session) -> Size:
        """What the session's kernel asks for: its GPUs, or under ``shares`` its memory."""
        if self.policy.shares:
            share = Size(share_gb=max(math.ceil(s.peak_gb), 1))
            if gb_to_mib(share.share_gb or 0) <= self.largest_mib:
                return share
        return Size(gpus=s.gpus)

    def _collect_grants(self, now: float) -> bool:
        granted = False
        for k in self.kernels.values():
            if k.request_id is None:
                continue
            r = self.broker.request(k.request_id)
            if r.lease_id is None:
                continue
            granted = True
            k.request_id, k.lease = None, self.broker.lease(r.lease_id)
            k.result.granted = True
            self._hold(k.lease.gpu_equivalents)
            if k.suspension is not None:  # its memory comes back before its cell
                self._resume(k, now)
            elif k.waiting_since is not None:
                self._begin(k, now)
        return granted

    def _hold(self, gpus: float) -> None:
        self.held += gpus
        self.peak = max(self.peak, self.held)

    def _give_back(self, k: _Kernel, now: float) -> None:
        assert k.lease is not None
        self.broker.release(k.lease.id, schedule=False)
        self._ended(k, now)

    def _ended(self, k: _Kernel, now: float) -> None:
        lease, k.lease = k.lease, None
        assert lease is not None
        k.result.held_s += (now - lease.granted_at) * lease.gpu_equivalents
        self.held -= lease.gpu_equivalents
        for u in lease.devices:
            self._load(u, utilization=0, memory_used_mib=0)
        for u in self.sim.process_memory(k.pid):  # its process goes with the lease
            self.sim.remove_process(u, k.pid)

    def _reclaimed(self, k: _Kernel, now: float) -> None:
        """The reclaimer took the lease back: the kernel is shut down."""
        self._ended(k, now)
        k.result.shutdowns += 1
        k.memory_gb, k.shut = 0.0, True

    def _suspend(self, k: _Kernel, d: Decision, now: float) -> None:
        """The product's suspend (``suspend/host.py`` does the same beside real kernels):
        its processes checkpointed and the lease ended with cause ``suspended``, its GPUs
        held while the memory is copied out; else the fallback, a shutdown."""
        assert self.suspender is not None and self.policy.suspend_gbps is not None
        assert k.lease is not None
        lease = k.lease
        listed = self.sim.process_memory(k.pid)
        processes = {k.pid: float(sum(listed.values()))} if listed else {}
        outcome, suspension = self.suspender.suspend(lease.devices, processes)
        if suspension is None:
            reason = f"{d.reason}; not suspended: {outcome.reason}"
            self.broker.reclaim(lease.id, reason, cause=d.cause, evidence=d.evidence)
            self._reclaimed(k, now)
            return
        reason = f"{d.reason}; {outcome.reason}"
        self.broker.reclaim(lease.id, reason, cause=SUSPENDED, evidence=d.evidence)
        copy_s = self.policy.copy_s(suspension.host_mib)
        k.result.suspends += 1
        k.result.held_s += copy_s * len(lease.devices)
        k.suspension = suspension
        self._ended(k, now)

    def _resume(self, k: _Kernel, now: float) -> None:
        """A suspended kernel's grant: its processes restored onto the granted GPUs; its
        cell starts once the memory is back."""
        assert self.suspender is not None and self.policy.suspend_gbps is not None
        assert k.suspension is not None and k.lease is not None
        suspension, k.suspension = k.suspension, None
        for u in k.lease.devices:
            self._readings.pop(u, None)
        outcome = self.suspender.resume(suspension, k.lease.devices)
        if not outcome.done:  # lost: as a kernel shut down
            k.memory_gb, k.shut = 0.0, True
            return
        k.busy = True
        copy_s = self.policy.copy_s(suspension.host_mib)
        self.at(now + copy_s, "restored", k.holder)
