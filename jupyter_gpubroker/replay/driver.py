"""Replay a trace through the real broker core on a virtual clock.

The driver builds the same :class:`~jupyter_gpubroker.broker.core.Broker` the
server runs (in-memory store, a :class:`VirtualClock`, the policy by name, the
simulated NVML inventory and, on MIG GPUs, its partitioner), then walks the
trace's instants in order: at each one it releases the leases whose job has
run its duration, submits the jobs that arrive, and runs one scheduling pass.
Nothing sleeps; the clock jumps from one instant to the next.

Each job tells the broker its declared limit (``Job.limit_s``, from a model in
:mod:`.limits`), or its true duration when the trace has none, as
``expected_duration_s``: the policies use it only to place backfill reservations
(``squeue --start`` plans with it too). The ``broker`` policy ranks by each user's
*history* of hold times, never by this claim. Under the broker policy a declared
limit is also the request's time limit (``limit_s``), as the product enforces it:
the broker promises starts from the limits and keeps them (``broker.limits``), and a
job that needs more than its limit asks, at the limit, to be extended by what it
lacks; it runs on when the broker allows it (``Replay.extended_at_limit``) and ends
at its limit otherwise. Under the baselines, which promise nothing and extend
nothing (Slurm's ``--time`` is final), such a job ends at its limit. Either way a
job ended at its limit is counted (``Replay.cut_at_limit``).

With ``capacity`` (:mod:`.capacity`), GPUs are brought up and down as the replay runs:
the ones it keeps down are drained, so the core grants nothing on them, and it sees each
grant, each release and what still waits after each pass.

With ``eta_every_s``, an :class:`~.accuracy.EtaProbe` also asks the start
estimators about every waiting job, at submission and every ``eta_every_s``
while it waits, and records what they said against its real start.

Dynamic MIG (re-cutting idle MIG GPUs to the profile a request needs) is on
for every policy by default: on the default all-1g.10gb layout nothing larger
could run without it. It gives the baselines a capability Slurm and Kubernetes
lack (they take a static layout), so it can only narrow the broker's lead.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from ..broker.clock import VirtualClock
from ..broker.core import Broker, BrokerConfig
from ..broker.models import JobClass, Lease
from ..broker.policy import Policy, make_policy
from ..broker.shapes import WHOLE_GPU
from ..broker.store import Store
from ..nvml import MigPartitioner, Topology, open_backend
from ..wire.errors import Conflict, QuotaExceeded, Unsatisfiable
from ..wire.sizes import Size
from .accuracy import Estimate, EtaProbe
from .capacity import Capacity
from .sizing import Sizer
from .traces import Job, Trace


@dataclass(frozen=True)
class Outcome:
    """What happened to one replayed job."""

    user: str
    group: str
    job_class: JobClass
    gpu_equivalents: float
    submit_s: float
    start_s: float
    end_s: float

    @property
    def wait_s(self) -> float:
        return self.start_s - self.submit_s


@dataclass
class Timeline:
    """The cluster after each scheduling pass; each value holds until the next instant."""

    at: list[float] = field(default_factory=list)
    queued: list[int] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    allocated: list[float] = field(default_factory=list)
    """GPU-equivalents held."""
    fragmented: list[float] = field(default_factory=list)
    """Free GPU-equivalents that cannot host the smallest waiting request as cut now."""


@dataclass
class Replay:
    """A finished replay: the setup, every job's outcome, the timeline, the cost."""

    trace: Trace
    policy: str
    inventory: str
    gpus: int
    compress: float
    dynamic_mig: bool
    outcomes: list[Outcome]
    timeline: Timeline
    skipped: dict[str, int]
    decisions: int
    decision_cpu_s: float
    wall_s: float
    """The replay's own time, less the ETA probe's (``eta_probe_s``)."""
    etas: list[Estimate] | None = None
    """The start estimates made while jobs waited, if the replay asked for them."""
    eta_probe_s: float = 0.0
    cut_at_limit: int = 0
    """Jobs that needed more than their declared limit and so ended at it."""
    extended_at_limit: int = 0
    """Jobs that needed more than their declared limit and were extended (broker)."""


def replay(
    trace: Trace,
    policy: str | Policy = "broker",
    *,
    inventory: str | Topology = "dgx-h100-mig:64",
    compress: float = 1.0,
    dynamic_mig: bool = True,
    eta_every_s: float | None = None,
    eta_at_submit: bool = True,
    probe: EtaProbe | None = None,
    setup: Callable[[Broker], None] | None = None,
    store: Store | None = None,
    capacity: Capacity | None = None,
) -> Replay:
    """Replay ``trace`` under ``policy`` (a name or a configured policy) on the
    simulated machine ``inventory``.

    ``compress`` divides the gaps between submissions (durations are kept), so
    a trace that never queues on its own cluster loads a smaller one.
    ``eta_every_s`` (seconds) measures the start estimates (see :mod:`.accuracy`),
    at each submission too unless ``eta_at_submit`` is false. ``probe`` is one built
    by the caller instead (``benchmarks/eta_oracle.py`` asks estimators of its own).
    ``inventory`` may be a topology itself (a state file's machine, ``whatif``);
    ``setup`` configures the broker before the first job (quotas and shares); ``store``
    is the one it records into (default: in memory; a file one leaves a state file).
    ``capacity`` keeps GPUs up and down during the replay (default: all up).
    """
    if not compress > 0:
        raise ValueError(f"the time compression factor must be positive, not {compress}")
    if eta_every_s is not None and not eta_every_s > 0:
        raise ValueError(f"the ETA sampling interval must be positive, not {eta_every_s}")
    wall0 = time.perf_counter()
    chosen = make_policy(policy) if isinstance(policy, str) else policy
    with open_backend(inventory, privilege="root") as backend:  # the machine's manager
        inv = backend.inventory()
        dynamic = dynamic_mig and any(g.mig_enabled for g in inv.gpus)
        origin = trace.jobs[0].submit_s
        clock = VirtualClock(origin)
        broker = Broker(
            store or Store(),
            inv,
            clock=clock,
            policy=chosen,
            config=BrokerConfig(dynamic_mig=dynamic),
            partitioner=MigPartitioner(backend) if dynamic else None,
        )
        if setup is not None:
            setup(broker)
        if probe is None and eta_every_s is not None:
            probe = EtaProbe(eta_every_s, eta_at_submit)
        run = _Run(broker, clock, Sizer(inv), len(inv.gpus), probe, chosen.name == "broker")
        run.scaling = capacity
        run.play([(origin + (j.submit_s - origin) / compress, j) for j in trace.jobs])
    return Replay(
        trace=trace,
        policy=chosen.name,
        inventory=inventory if isinstance(inventory, str) else inventory.name,
        gpus=len(inv.gpus),
        compress=compress,
        dynamic_mig=dynamic,
        outcomes=run.outcomes,
        timeline=run.timeline,
        skipped=dict(run.skipped),
        decisions=run.decisions,
        decision_cpu_s=run.cpu_s,
        wall_s=time.perf_counter() - wall0 - run.probe_s,
        etas=probe.estimates if probe is not None else None,
        eta_probe_s=run.probe_s,
        cut_at_limit=run.cut_at_limit,
        extended_at_limit=run.extended_at_limit,
    )


class _Run:
    """The event loop of one replay and what it records."""

    def __init__(
        self,
        broker: Broker,
        clock: VirtualClock,
        sizer: Sizer,
        gpus: int,
        probe: EtaProbe | None = None,
        enforce_limits: bool = False,
    ) -> None:
        self.broker, self.clock, self.sizer, self.capacity = broker, clock, sizer, float(gpus)
        self.probe, self.enforce_limits = probe, enforce_limits
        self.scaling: Capacity | None = None
        self.outcomes: list[Outcome] = []
        self.timeline = Timeline()
        self.skipped: Counter[str] = Counter()
        self.decisions = 0
        self.cpu_s = 0.0
        self.probe_s = 0.0
        self.cut_at_limit = self.extended_at_limit = 0
        self._at_limit: set[str] = set()
        """Leases whose job reaches its limit before its end (it asks for more there)."""
        self._ends: list[tuple[float, int, str]] = []
        """(end, grant order, lease id): equal ends release in grant order, so runs repeat."""
        self._grants = itertools.count()
        self._jobs: dict[str, tuple[Job, float, Size]] = {}
        """Request id -> (job, submit instant, size), while waiting or running."""
        self._waiting: Counter[Size] = Counter()
        self._allocated = 0.0

    def play(self, arrivals: list[tuple[float, Job]]) -> None:
        i = 0
        if self.scaling is not None:
            self.scaling.attach(self.broker, arrivals[0][0])
        while i < len(arrivals) or self._jobs:
            now = min(
                arrivals[i][0] if i < len(arrivals) else float("inf"),
                self._ends[0][0] if self._ends else float("inf"),
                self.scaling.next_at() if self.scaling is not None else float("inf"),
            )
            if now == float("inf"):
                break  # what waits can never be granted
            self.clock.set(now)
            while self._ends and self._ends[0][0] <= now:
                self._finish(heapq.heappop(self._ends)[2], now)
            submitted: list[str] = []
            while i < len(arrivals) and arrivals[i][0] <= now:
                rid = self._submit(arrivals[i][1], now)
                if rid is not None:
                    submitted.append(rid)
                i += 1
            self._pass(now)
            if self.scaling is not None and self.scaling.after_pass(now, self._waiting_gpus()):
                self._pass(now)  # GPUs came up
            if self.probe is not None:
                t0 = time.perf_counter()
                self.probe.after_pass(self.broker, submitted, now)
                self.probe_s += time.perf_counter() - t0
            self._record(now)

    def _pass(self, now: float) -> None:
        """One scheduling pass, its grants started."""
        t0 = time.process_time()
        granted = self.broker.schedule()
        self.cpu_s += time.process_time() - t0
        self.decisions += 1
        for lease in granted:
            self._start(lease, now)

    def _waiting_gpus(self) -> float:
        return sum(self.sizer.gpu_equivalents(s) * n for s, n in self._waiting.items())

    def _submit(self, job: Job, now: float) -> str | None:
        """Submit ``job``; its request id, or None when it was skipped."""
        size = self.sizer.size(job.gpus)
        if size is None:
            self.skipped[f"jobs needing {job.gpus:g} whole GPUs (the inventory has fewer)"] += 1
            return None
        try:
            r = self.broker.submit(
                job.user,
                size,
                groups=[job.group] if job.group else [],
                job_class=job.job_class,
                expected_duration_s=job.limit_s
                or (job.duration_s if job.states_duration else None),
                limit_s=job.limit_s if self.enforce_limits else None,
                schedule=False,
            )
        except (Unsatisfiable, QuotaExceeded) as e:  # no machine or no quota allows it
            self.skipped[f"jobs refused: {e.message}"] += 1
            return None
        self._jobs[r.id] = (job, now, size)
        self._waiting[size] += 1
        return r.id

    def _start(self, lease: Lease, now: float) -> None:
        job, _, size = self._jobs[lease.request_id]
        self._waiting[size] -= 1
        if not self._waiting[size]:
            del self._waiting[size]
        self._allocated += lease.gpu_equivalents
        runs = job.duration_s
        if job.limit_s is not None and runs > job.limit_s:
            runs = job.limit_s
            if self.enforce_limits:
                self._at_limit.add(lease.id)
            else:
                self.cut_at_limit += 1
        heapq.heappush(self._ends, (now + runs, next(self._grants), lease.id))
        if self.scaling is not None:
            self.scaling.granted(lease)
        if self.probe is not None:
            self.probe.granted(lease.request_id, now)

    def _finish(self, lease_id: str, now: float) -> None:
        if lease_id in self._at_limit:
            self._at_limit.discard(lease_id)
            job = self._jobs[self.broker.lease(lease_id).request_id][0]
            try:
                self.broker.extend(lease_id, job.duration_s - (job.limit_s or 0.0))
            except Conflict:
                self.cut_at_limit += 1
            else:
                self.extended_at_limit += 1
                rest = job.duration_s - (job.limit_s or 0.0)
                heapq.heappush(self._ends, (now + rest, next(self._grants), lease_id))
                return
        lease = self.broker.release(lease_id, schedule=False)
        if self.scaling is not None:
            self.scaling.released(lease, now)
        job, submitted, _ = self._jobs.pop(lease.request_id)
        self._allocated -= lease.gpu_equivalents
        self.outcomes.append(
            Outcome(
                job.user,
                job.group,
                job.job_class,
                lease.gpu_equivalents,
                submitted,
                lease.granted_at,
                now,
            )
        )

    def _record(self, now: float) -> None:
        t = self.timeline
        queued = sum(self._waiting.values())
        t.at.append(now)
        t.queued.append(queued)
        t.running.append(len(self._jobs) - queued)
        t.allocated.append(self._allocated)
        t.fragmented.append(self._fragmented() if queued else 0.0)

    def _fragmented(self) -> float:
        """Free capacity that the smallest waiting request cannot use as devices are cut."""
        free = self.capacity - self._allocated
        smallest = min(self.sizer.gpu_equivalents(s) for s in self._waiting)
        usable = 0.0
        for size in self._waiting:
            if self.sizer.gpu_equivalents(size) != smallest:
                continue
            if size.profile:
                usable = max(usable, len(self.broker.placer.free[size.profile]) * smallest)
            else:
                n = len(self.broker.placer.free[WHOLE_GPU])
                usable = max(usable, float(n) if n >= (size.gpus or 0) else 0.0)
        return max(free - usable, 0.0)
