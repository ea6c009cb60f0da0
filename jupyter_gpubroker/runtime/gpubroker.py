"""``GPUBroker``: the running broker's lifecycle and the surface its hosts call.

It opens the inventory (:mod:`.inventory`) and the state file, builds the core from
its settings (:mod:`.settings`, :mod:`.monitoring`, :mod:`.reclaim`), feeds the core's
events to the bus, and runs the housekeeping tick, the sampling pass and, under an
engine, the engine's poll (:mod:`.engine`). Tokens (:mod:`.tokens`) and the devices of
confined kernels (:mod:`.kernel_devices`) are kept by their own objects.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tornado.ioloop import PeriodicCallback
from traitlets.config import LoggingConfigurable

from ..broker.alerts import AlertChange
from ..broker.core import Broker, BrokerConfig, Event
from ..broker.models import DeviceReading, Lease, LeaseState
from ..broker.reclaim import Decision, KernelState
from ..broker.store import Store
from ..engines import ClusterView, InventorySource, NoReadings
from ..events import EventBus
from ..monitor.metrics import BrokerCollector
from ..monitor.outside import outside_text
from ..monitor.sampler import KernelActions, Sampler
from ..nvml import MigPartitioner, NvmlBackend
from ..statelock import GpuLocks, StateLock, secure_state_file
from ..suspend.host import KernelSuspender, carried_out, checkpoint_driver, simulate_kernel_use
from ..suspend.suspender import SUSPENDED, Suspender
from ..wire.errors import ConfigError, InvalidRequest
from ..wire.text import ENDED_RESTARTED, clock, duration
from ..wire.traits import Whole
from .engine import EngineWatch, read_now
from .inventory import NvmlInventory
from .kernel_devices import KernelDevices
from .limits import LimitSettings
from .monitoring import MonitorSettings
from .quotas import apply_quotas_file
from .settings import BrokerSettings
from .tokens import KernelTokens


class GPUBroker(BrokerSettings, MonitorSettings, LimitSettings, LoggingConfigurable):
    """The broker with its hardware and state, configured as ``c.GPUBroker.*``."""

    # A trait of its own, not only its settings mixins': traitlets' Application leaves a
    # class that owns no config trait out of its command line's classes, and then parses
    # `--GPUBroker.reclaim_exempt_users={'vip'}` as one string instead of a set.
    event_buffer = Whole(
        1000,
        1,
        1_000_000,
        help="Recent events kept for event streams that reconnect (SSE Last-Event-ID); a "
        "client further behind gets a snapshot of the whole picture instead.",
    ).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._core: Broker | None = None
        self.backend: NvmlBackend | None = None
        self._events: EventBus | None = None
        self._tokens: KernelTokens | None = None
        self._kernel_devices: KernelDevices | None = None
        self._ticker: PeriodicCallback | None = None
        self._sampling: PeriodicCallback | None = None
        self.sampler: Sampler | None = None
        self.metrics: BrokerCollector | None = None
        self.kernels: KernelActions | None = None
        """The host's kernels, when it runs them (the server extension's ``ServerKernels``)."""
        self.suspender: KernelSuspender | None = None
        """Carries out the reclaim action ``suspend`` (where NVML is read here)."""
        self.api_url = ""
        """Where kernels reach this broker's API (set by the host that serves it)."""
        self._lock: StateLock | None = None
        self._gpu_locks: GpuLocks | None = None
        self._engine: EngineWatch | None = None

    # ----------------------------------------------------------- lifecycle

    def start(self) -> Broker:
        """Open the hardware and the state file and build the core (no event loop needed).

        Raises ``StateFileError`` when the state file is unusable or another broker holds
        it, ``ConfigError`` when its configuration cannot be used (what the core refuses
        while it is built from it included), and leaves nothing open when any step fails."""
        try:
            return self._start()
        except InvalidRequest as e:  # a setting the broker cannot be built from
            self.stop()
            raise ConfigError(e.message) from None
        except BaseException:
            self.stop()
            raise

    def _start(self) -> Broker:
        policy = self.make_policy()
        state = Path(self.state_file).expanduser()
        if self.state_file != ":memory:":
            self._lock = StateLock(state)
            self._lock.acquire(self.api_url)
            secure_state_file(state, self.log)
        source = self.inventory_class(parent=self)
        engine: tuple[InventorySource, ClusterView] | None = None
        if isinstance(source, NvmlInventory):
            self.backend, self._gpu_locks = source.open(self, self.api_url)
            inventory = self.backend.inventory()
        else:
            assert isinstance(source, InventorySource)  # the only other kind the trait takes
            if self.dynamic_mig:
                raise InvalidRequest(
                    "c.GPUBroker.dynamic_mig needs the GPUs' NVML: with an engine, MIG slices "
                    "are the engine's (Slurm's gres types); turn dynamic_mig off"
                )
            engine = source, read_now(source)
            inventory = engine[1].inventory
        store = Store(state)
        try:
            self._core = core = Broker(
                store,
                inventory,
                policy=policy,
                config=BrokerConfig(
                    lease_ttl_s=self.lease_ttl,
                    request_ttl_s=self.request_ttl,
                    dynamic_mig=self.dynamic_mig,
                    vacate_timeout_s=self.vacate_timeout,
                    **self.limit_fields(),
                ),
                partitioner=(
                    MigPartitioner(self.backend) if self.dynamic_mig and self.backend else None
                ),
                processes=self.backend,
            )
        except BaseException:
            store.close()
            raise
        if self.quotas_file:
            apply_quotas_file(core, Path(self.quotas_file).expanduser())
        self._tokens = KernelTokens(core)
        self._events = EventBus(core, self.event_buffer)
        core.subscribe(self._events.publish)
        self._kernel_devices = KernelDevices.where_possible(core, self.backend, self)
        if engine is not None:  # leases whose jobs ended while the broker was down end now
            self._engine = EngineWatch(engine[0], core, lambda: self.engine_grace, self.log)
            self._engine.apply(engine[1])
        self.sampler = sampler = self.make_sampler(
            core, self.backend or NoReadings(), self._events.publish, self.log
        )
        sampler.on_alert = self._publish_alert
        if self.backend is not None:
            self.suspender = KernelSuspender(
                core,
                Suspender(
                    checkpoint_driver(self.backend.simulator),
                    lock_timeout_s=self.suspend_lock_timeout,
                ),
                lambda: sampler.latest,
                self.holder_pid,
                lambda kernel_id: self.kernels is not None and self.kernels.runs(kernel_id),
                self.open_devices,
                self.keep,
                self.events.publish,
                self.suspend_fallback,
                self.log,
            )
            sampler.reclaimer.suspends = lambda _: self.reclaim_action == "suspend"
        self.metrics = BrokerCollector(
            core,
            lambda: sampler.latest,
            alerts=sampler.alerts.active if sampler.alerts else list,
            hardware_errors=lambda: sampler.hardware_errors,
        )
        if self.engine is not None:
            where = f"{self.engine.name}, {len({g.node for g in inventory.gpus})} nodes"
        else:
            where = f"simulated {self.simulate}" if self.simulate else "NVIDIA driver"
        self.log.info(
            "GPU broker: %d devices on %d GPUs (%s), policy %s, state %s",
            len(core.inventory.devices),
            len(core.inventory.gpus),
            where,
            self.policy,
            self.state_file,
        )
        return core

    def _publish_alert(self, change: AlertChange) -> None:
        """An alert that started, escalated or ended, on the event stream (admins only)."""
        detail = {"state": change.state, "alert": change.alert.to_json()}
        self.events.publish(Event("alert", self.core.clock.now(), "", detail=detail))

    def start_ticking(self) -> None:
        """Run ``tick`` every ``tick_interval`` seconds and a sampling pass every
        ``sample_interval`` seconds on the current IOLoop (and, under an engine, its
        poll every tick)."""
        self._ticker = PeriodicCallback(self._tick, self.tick_interval * 1000)
        self._ticker.start()
        self._sampling = PeriodicCallback(self.sample, self.sample_interval * 1000)
        self._sampling.start()
        if self._engine is not None:
            self._engine.start(self.tick_interval)

    def _tick(self) -> None:
        """The core's housekeeping, then the positions of a queue that aging re-ranked."""
        try:
            self.core.tick()
            self.events.after_tick()
        except Exception:
            self.log.exception("GPU broker tick failed")

    async def sample(self) -> list[Decision]:
        """One sampling pass (NVML read on a worker thread), then carry out its decisions."""
        sampler = self.sampler
        assert sampler is not None
        self._check_suspended()
        try:
            found = await asyncio.to_thread(sampler.read)
            if self._sampling is not None and not self._sampling.is_running():
                return []  # stopped meanwhile: the store may be closed
            decisions = sampler.apply(*found)
        except Exception:
            self.log.exception("GPU broker sampling failed")
            return []
        now = self.core.clock.now()
        for d in decisions:
            self.log.warning(
                "GPU broker: %s lease %s of kernel %s%s: %s",
                d.action,
                d.lease_id,
                d.holder or "-",
                f" (reclaim at {clock(d.deadline)}, in {duration(d.deadline - now)})"
                if d.deadline
                else "",
                d.reason,
            )
            if d.action == "suspend" and self.suspender is not None:
                fallback = await self.suspender.suspend(d)
                if fallback is not None and self.kernels is not None:
                    await self.kernels.act(d.holder, fallback)
            if d.action == "reclaim" and self.kernels is not None:
                action = self.on_reclaim(self.core.lease(d.lease_id))
                try:
                    await self.kernels.act(d.holder, action)
                except Exception:
                    self.log.exception("GPU broker: cannot %s kernel %s", action, d.holder)
        return decisions

    def _check_suspended(self) -> None:
        """End the suspensions of kernels whose process ended (``KernelSuspender.check``).
        On the sampling pass, not the tick: the pass is this machine's look at its GPU
        processes, as the suspender's is (``/proc`` and the checkpoint driver, for a few
        pids); a dead kernel stays shown suspended for one sampling interval at most."""
        if self.suspender is None:
            return
        kernels = self.kernels
        try:
            self.suspender.check(kernels.handles if kernels is not None else lambda _: False)
        except Exception:
            self.log.exception("GPU broker: checking the suspended kernels failed")

    def stop(self) -> None:
        if self.suspender is not None:
            self.suspender.close()
            self.suspender = None  # stopping twice is harmless
        if self._events is not None:
            self._events.close()
        for callback in (self._ticker, self._sampling, self._engine):
            if callback is not None:
                callback.stop()
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None  # stopping twice is harmless
        if self._core is not None:
            self._core.store.close()
        if self.backend is not None:
            self.backend.close()
        for lock in (self._gpu_locks, self._lock):
            if lock is not None:
                lock.release()
        self._lock = self._gpu_locks = None

    @property
    def core(self) -> Broker:
        if self._core is None:
            raise RuntimeError("the GPU broker has not been started")
        return self._core

    @property
    def events(self) -> EventBus:
        """The bus the live event streams follow (``events.EventBus``)."""
        if self._events is None:
            raise RuntimeError("the GPU broker has not been started")
        return self._events

    # ---------------------------------------------------------------- engine

    @property
    def engine(self) -> InventorySource | None:
        """The engine the inventory comes from (None: this machine's NVML)."""
        return self._engine.source if self._engine is not None else None

    async def poll_engine(self) -> None:
        """One read of the engine, applied (``EngineWatch.poll``); every tick runs one."""
        assert self._engine is not None
        await self._engine.poll()

    def engine_state(self) -> dict[str, Any] | None:
        """The engine the inventory comes from, and whether it answers (None: NVML)."""
        return self._engine.state() if self._engine is not None else None

    # ------------------------------------------------------- kernels, tokens

    def attach_kernels(self, kernels: KernelActions) -> None:
        """Let idle reclaim see and act on the host's kernels."""
        self.kernels = kernels
        if self.sampler is not None:
            self.sampler.kernels = kernels

    def idle_s(self, lease_id: str) -> float | None:
        """How long a lease has been idle, as idle reclaim last judged (None: not known)."""
        return self.sampler.reclaimer.idle_s(lease_id) if self.sampler is not None else None

    def keep(self, lease_id: str) -> None:
        """The holder's "keep it": activity for idle reclaim (nothing to do without it)."""
        if self.sampler is not None:
            self.sampler.reclaimer.keep(lease_id)

    def report_kernel(self, lease_id: str, kernel: KernelState) -> None:
        """What a renewal said of the lease's kernel, for idle reclaim to judge: the
        kernels of servers that use this broker from elsewhere (remote mode)."""
        if self.sampler is not None:
            self.sampler.reported[lease_id] = kernel

    def report_pid(self, lease_id: str, pid: int) -> None:
        """The holder process a renewal named (a kernel's or a server's): what it starts
        on the lease's devices is the lease's (``monitor.outside``); and a kernel in a
        server confined to its devices may open its lease's too (``.kernel_devices``)."""
        if self.sampler is not None and self.sampler.outside is not None:
            self.sampler.outside.holder_pids[lease_id] = pid
        if self.simulate_kernel_memory and self.backend and self.backend.simulator:
            simulate_kernel_use(
                self.backend.simulator, self.core.lease(lease_id), pid, self.simulate_kernel_memory
            )
        self.open_devices(lease_id, pid)

    def open_devices(self, lease_id: str, pid: int) -> None:
        """Where kernels are confined to their devices (a root broker), let the lease's
        holder process ``pid`` open the lease's (``.kernel_devices``): on each renewal,
        and before a suspended kernel is restored onto its new grant."""
        if self._kernel_devices is not None:
            self._kernel_devices.report(lease_id, pid)

    def suspended(self, lease_id: str) -> dict[str, Any] | None:
        """A lease whose kernel was suspended, while it stays so (None: any other)."""
        return None if self.suspender is None else self.suspender.shown(lease_id)

    def suspended_leases(self) -> list[str]:
        """The ended leases of the kernels suspended now."""
        return [] if self.suspender is None else self.suspender.lease_ids()

    def on_reclaim(self, lease: Lease) -> str:
        """What the holder's server does to the lease's kernel once it is reclaimed (a
        server in remote mode carries it out): ``reclaim_action``; where that is
        ``suspend``, a reclaimed lease says what was done: ``suspend`` where its kernel
        was suspended (it runs on), else the fallback carried out instead."""
        if self.reclaim_action != "suspend" or lease.state is not LeaseState.RECLAIMED:
            return self.reclaim_action
        if self.core.store.reclaim_cause(lease.id) == SUSPENDED:
            return "suspend"
        return carried_out(self.suspend_fallback)

    def suspension_ended(self, lease_id: str) -> str | None:
        """Why a suspended kernel's lease is suspended no more (None: it is, or never was);
        the state file keeps it."""
        return self.core.store.suspension_end(lease_id)

    def holder_pid(self, lease_id: str) -> int | None:
        """The holder process a lease's last renewal named (None: none, or no NVML here)."""
        watch = self.sampler.outside if self.sampler is not None else None
        return None if watch is None else watch.holder_pids.get(lease_id)

    @property
    def tokens(self) -> KernelTokens:
        if self._tokens is None:
            raise RuntimeError("the GPU broker has not been started")
        return self._tokens

    def issue_token(self, user: str, kernel_id: str) -> str:
        """A kernel token acting as ``user`` on ``kernel_id``'s requests (``.tokens``)."""
        return self.tokens.issue(user, kernel_id)

    def revoke_tokens(self, kernel_id: str, user: str | None = None) -> None:
        """Revoke a kernel's tokens (only ``user``'s, when given): at its shutdown, when
        its suspension, if any, ends too."""
        self.tokens.revoke(kernel_id, user)
        if self.suspender is not None:
            self.suspender.forget(kernel_id, user)

    def kernel_restarted(self, kernel_id: str, user: str | None = None) -> None:
        """A kernel restarted (``user``'s, when given): its new process asks for a GPU as a
        new kernel does; a suspension of the old one, whose memory went with it, is over."""
        if self.suspender is not None:
            self.suspender.forget(kernel_id, user, ENDED_RESTARTED)

    def token_holder(self, token: str) -> tuple[str, str] | None:
        """The (user, kernel id) a kernel token acts for; ``None``: unknown or revoked."""
        return self.tokens.holder(token)

    # ------------------------------------------------------------- readings

    def readings(self) -> dict[str, DeviceReading]:
        """The sampler's latest readings of every GPU and device (what ``/metrics``
        shows too); never a read of NVML on the caller's thread."""
        return self.sampler.latest if self.sampler is not None else {}

    def outside_now(self) -> dict[str, list[dict[str, Any]]]:
        """Device UUID -> the processes using it outside the broker now, as the last
        sampling pass saw them: ``user``, ``pid``, ``since`` and their ``text``."""
        watch = self.sampler.outside if self.sampler is not None else None
        if watch is None:
            return {}
        now = self.core.clock.now()
        return {
            uuid: [
                {"user": s.user, "pid": s.pid, "since": since, "text": outside_text(s, now - since)}
                for s, since in seen
            ]
            for uuid, seen in watch.now_seen().items()
        }
