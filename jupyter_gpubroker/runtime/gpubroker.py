"""``GPUBroker``: the running broker's lifecycle and the surface its hosts call.

It opens the inventory (``inventory_class``, :mod:`.inventory`) and the state file,
builds the core from its settings (:mod:`.settings`, :mod:`.monitoring`,
:mod:`.reclaim`) and from what the inventory opened (the one shape every source gives,
:class:`~jupyter_gpubroker.inventory.OpenInventory`), feeds the core's events to the
bus, and runs the housekeeping tick, the sampling pass and the inventory's watch (under
an engine, its poll: ``engines.watch``). Tokens (:mod:`.tokens`) and the devices of
confined kernels (:mod:`.kernel_devices`) are kept by their own objects.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tornado.ioloop import PeriodicCallback
from traitlets.config import LoggingConfigurable

from .. import pidns
from ..broker.alerts import AlertChange
from ..broker.core import Broker, BrokerConfig, Event
from ..broker.models import DeviceReading, Lease, ShareUse
from ..broker.reclaim import Decision, KernelState
from ..broker.recorded import machine, record_machine
from ..broker.store import Store
from ..enforce.mpsim import mps_client
from ..events import EventBus
from ..inventory import InventoryWatch, OpenInventory
from ..monitor.metrics import BrokerCollector
from ..monitor.outside import ProcessTable, outside_text
from ..monitor.sampler import KernelActions, Sampler, share_use
from ..statelock import StateLock, secure_state_file
from ..suspend.host import (
    KernelKey,
    local_uid,
    simulate_kernel_use,
)
from ..wire.errors import ConfigError, InvalidRequest
from ..wire.text import ENDED_RESTARTED, SHARE_HOLDS, clock, duration
from ..wire.traits import Whole
from .forecasting import ForecastSettings
from .kernel_devices import KernelDevices
from .kube_ahead import KubeAhead
from .limits import LimitSettings
from .mig_ahead import MigAhead
from .monitoring import MonitorSettings
from .pid_view import PidView
from .power_saving import PowerSaving
from .quotas import apply_quotas_file
from .settings import BrokerSettings
from .sharing import ShareEnforcement, SharingSettings
from .slurm_ahead import SlurmAhead
from .suspending import SuspendHost
from .tokens import KernelTokens
from .whatif import WhatIfRuns

if TYPE_CHECKING:
    from ..engines import InventorySource
    from ..nvml import NvmlBackend


class GPUBroker(
    SuspendHost,
    BrokerSettings,
    MonitorSettings,
    LimitSettings,
    SharingSettings,
    ForecastSettings,
    PowerSaving,
    MigAhead,
    KubeAhead,
    SlurmAhead,
    LoggingConfigurable,
):
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
        """This machine's NVML, where the inventory is its GPUs (``OpenInventory.nvml``)."""
        self._events: EventBus | None = None
        self._tokens: KernelTokens | None = None
        self._kernel_devices: KernelDevices | None = None
        self.pids: PidView | None = None
        """The broker's pid namespace and the leases named in another (``.pid_view``)."""
        self._ticker: PeriodicCallback | None = None
        self._sampling: PeriodicCallback | None = None
        self.sampler: Sampler | None = None
        self.metrics: BrokerCollector | None = None
        self.kernels: KernelActions | None = None
        """The host's kernels, when it runs them (the server extension's ``ServerKernels``)."""
        self.shares: ShareEnforcement | None = None
        """What holds each GPU's shares here (``.sharing``)."""
        self.api_url = ""
        """Where kernels reach this broker's API (set by the host that serves it)."""
        self._lock: StateLock | None = None
        self._inventory: OpenInventory | None = None
        """The opened inventory, until the broker stops (``inventory.OpenInventory``)."""
        self._watch = InventoryWatch()
        """What keeps the core in step with its inventory (an engine's poll)."""
        self.whatifs = WhatIfRuns()
        """What-if replays of the state file's history, one at a time (``.whatif``)."""

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
        self._inventory = hardware = self.inventory_class(parent=self).open(self, self.api_url)
        self.backend = hardware.nvml
        self.warm = hardware.warm
        as_users = os.geteuid() == 0 or self.holder_account == "broker"
        self.shares = shares = ShareEnforcement.open(
            self, hardware.devices, hardware.nvml is not None, self._share_uid, as_users, self.log
        )
        store = Store(state)
        try:
            self._core = core = Broker(
                store,
                hardware.devices,
                policy=policy,
                config=BrokerConfig(
                    lease_ttl_s=self.lease_ttl,
                    request_ttl_s=self.request_ttl,
                    dynamic_mig=self.dynamic_mig,
                    vacate_timeout_s=self.vacate_timeout,
                    sharing=self.make_sharing(shares.whole_only(), self.timezone),
                    **self.limit_fields(),
                ),
                partitioner=hardware.partitioner,
                processes=hardware.nvml,
            )
        except BaseException:
            store.close()
            raise
        with store.transaction():
            record_machine(
                store,
                core.clock.now(),
                machine(hardware.devices),
                {**self.recorded_settings(), **self.recorded_reclaim()},
            )
        if self.quotas_file:
            apply_quotas_file(core, Path(self.quotas_file).expanduser())
        self._tokens = KernelTokens(core, self.kernel_token_max_age)
        self._events = EventBus(core, self.event_buffer)
        core.subscribe(self._events.publish)
        self._kernel_devices = KernelDevices.where_possible(core, hardware.nvml, self)
        self._watch = hardware.follow(core, lambda: self.engine_grace)
        self._watch.after_poll = lambda: self.power_ahead(core, self.engine, self.log)
        self.pids = pids = PidView(core, hardware.nvml, self.log)
        self.sampler = sampler = self.make_sampler(
            core, hardware, self._events.publish, self.log, pids.unseen
        )
        sampler.on_alert = self._publish_alert
        shares.attach(core)
        sampler.reclaimer.watched = shares.watched
        sampler.reclaimer.under_mps = shares.under_mps
        self._start_suspending(core, sampler)
        self.metrics = BrokerCollector(
            core,
            lambda: sampler.latest,
            alerts=sampler.alerts.active if sampler.alerts else list,
            hardware_errors=lambda: sampler.hardware_errors,
            share_use=self.share_use,
        )
        self.log.info(
            "GPU broker: %d devices on %d GPUs (%s), policy %s, state %s",
            len(core.inventory.devices),
            len(core.inventory.gpus),
            hardware.where,
            self.policy,
            self.state_file,
        )
        return core

    def _publish_alert(self, change: AlertChange) -> None:
        """An alert that started, escalated or ended, on the event stream (admins only)."""
        detail = {"state": change.state, "alert": change.alert.to_json()}
        self.events.publish(Event("alert", self.core.clock.now(), "", detail=detail))
        self._alert_changed(change)

    def start_ticking(self) -> None:
        """Run ``tick`` every ``tick_interval`` seconds and a sampling pass every
        ``sample_interval`` seconds on the current IOLoop (and, under an engine, its
        poll every tick)."""
        self._ticker = PeriodicCallback(self._tick, self.tick_interval * 1000)
        self._ticker.start()
        self._sampling = PeriodicCallback(self.sample, self.sample_interval * 1000)
        self._sampling.start()
        self._watch.start(self.tick_interval)
        self.start_keeping_warm(self.core, self.log)

    def _tick(self) -> None:
        """The core's housekeeping, then the positions of a queue that aging re-ranked,
        and the kernel tokens no kernel renewed in time ended."""
        try:
            self.core.tick()
            if self.shares is not None:
                self.shares.check()
            self.events.after_tick()
            self.log_forecast(self.core, self.log)
            self.save_power(self.core, self.backend, self.log)
            self.cut_ahead(self.core, self.log)
            running = self.kernels.running() if self.kernels is not None else ()
            ended = self.tokens.sweep(running)
            if ended:
                self.log.info(
                    "GPU broker: %d kernel tokens ended, not renewed for %s (their kernels are "
                    "gone)",
                    ended,
                    duration(self.kernel_token_max_age),
                )
        except Exception:
            self.log.exception("GPU broker tick failed")

    async def sample(self) -> list[Decision]:
        """One sampling pass (NVML read on a worker thread), then carry out its decisions."""
        sampler = self.sampler
        assert sampler is not None
        if self.canaries is not None:
            self.canaries.kick()  # the models not proven yet, where a GPU of theirs is free
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
            if d.action == "suspend" and self.mover is not None and self.mover.moving(d.lease_id):
                continue  # moving: idle afresh once it has moved (``keep``)
            if d.action == "suspend" and self.suspender is not None:
                fallback = await self.suspender.suspend(d)
                if fallback is not None and self._hosts_kernel_of(d.lease_id):
                    await self.kernels.act(d.holder, fallback)  # type: ignore[union-attr]
            if d.action == "reclaim" and self._hosts_kernel_of(d.lease_id):
                action = self.on_reclaim(self.core.lease(d.lease_id))
                try:
                    await self.kernels.act(d.holder, action)  # type: ignore[union-attr]
                except Exception:
                    self.log.exception("GPU broker: cannot %s kernel %s", action, d.holder)
        return decisions

    def _hosts_kernel_of(self, lease_id: str) -> bool:
        """Whether the lease's holder is a kernel of the host's own, its user's: what a
        reclaim may act on. Any user may name any kernel id as a request's holder; the
        reclaim of their lease must not shut down another user's kernel."""
        kernels = self.kernels
        if kernels is None:
            return False
        lease = self.core.lease(lease_id)
        return kernels.user_of(self.core.request(lease.request_id).holder) == lease.user

    def _check_suspended(self) -> None:
        """End the suspensions of kernels whose process ended (``KernelSuspender.check``).
        On the sampling pass, not the tick: the pass is this machine's look at its GPU
        processes, as the suspender's is (``/proc`` and the checkpoint driver, for a few
        pids); a dead kernel stays shown suspended for one sampling interval at most."""
        if self.suspender is None:
            return
        kernels = self.kernels

        def handled(key: KernelKey) -> bool:
            own = kernels is not None and kernels.user_of(key.kernel_id) == key.user
            return own and kernels.handles(key.kernel_id)  # type: ignore[union-attr]

        try:
            self.suspender.check(handled)
        except Exception:
            self.log.exception("GPU broker: checking the suspended kernels failed")

    def stop(self) -> None:
        if self.shares is not None:
            self.shares.close()
            self.shares = None  # stopping twice is harmless
        if self.mover is not None:
            self.mover.close()
            self.mover = None
        if self.suspender is not None:
            self.suspender.close()
            self.suspender = None  # stopping twice is harmless
        if self._events is not None:
            self._events.close()
        for callback in (self._ticker, self._sampling):
            if callback is not None:
                callback.stop()
        self._watch.stop()
        self.whatifs.close()
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None  # stopping twice is harmless
        if self._core is not None:
            self.restore_all(self._core, self.backend)
            self.stop_keeping_warm(self._core, self.log)
            self._core.store.close()
        if self._inventory is not None:
            self._inventory.close()
            self._inventory = None  # stopping twice is harmless
        if self._lock is not None:
            self._lock.release()
        self._lock = None

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
        return self._watch.source

    async def poll_engine(self) -> None:
        """One read of the engine, applied (``EngineWatch.poll``); every tick runs one."""
        await self._watch.poll()

    def engine_state(self) -> dict[str, Any] | None:
        """The engine the inventory comes from, and whether it answers (None: NVML)."""
        return self._watch.state()

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

    def report_pid(self, lease_id: str, pid: int | None) -> None:
        """The holder process a renewal named (a kernel's or a server's): what it starts
        on the lease's devices is the lease's (``monitor.outside``); and a kernel in a
        server confined to its devices may open its lease's too (``.kernel_devices``).
        None: a pid of another pid namespace, which names nothing here (``.pid_view``)."""
        watch = self.sampler.outside if self.sampler is not None else None
        if self.pids is not None:
            self.pids.named(lease_id, self.core.lease(lease_id).user, pid is not None)
        if pid is None:
            if watch is not None:
                watch.holder_pids.pop(lease_id, None)
            return
        if watch is not None:
            watch.holder_pids[lease_id] = pid
        if self.simulate_kernel_memory and self.backend and self.backend.simulator:
            lease = self.core.lease(lease_id)
            mps = self.shares is not None and self.shares.under_mps(lease) and mps_client(pid)
            simulate_kernel_use(
                self.backend.simulator, lease, pid, self.simulate_kernel_memory, mps=mps
            )
            self.backend.simulator.load_from_environment(pid)
        self.open_devices(lease_id, pid)
        if self.shares is not None:
            self.shares.report_pid(self.core.lease(lease_id), pid)

    def acting_ahead(self) -> list[dict[str, Any]]:
        """What acts on the forecast here, each switched on by itself, and whether it can."""
        found = [self.power_saving_state(), self.mig_ahead_state(self.core)]
        engines = (self.kube_ahead_state(self.core), self.slurm_ahead_state(self.engine))
        return found + [state for state in engines if state is not None]

    def share_of(self, lease: Lease) -> dict[str, Any] | None:
        """A share as the API shows it: its memory, GPU, what holds it, its kernel's
        environment (None: the lease holds whole devices)."""
        shown = None if self.shares is None else self.shares.share_json(lease)
        if shown is not None:
            use = self._share_use(lease)
            shown["used_mib"], shown["utilization"] = use.used_mib, use.utilization
        return shown

    def share_use(self) -> dict[str, ShareUse]:
        """Each active share's memory in use and utilization (its processes', at the
        last sample)."""
        return {x.id: self._share_use(x) for x in self.core.leases() if x.shared}

    def _share_use(self, lease: Lease) -> ShareUse:
        sampler = self.sampler
        return share_use(
            None if sampler is None else sampler.share_processes(lease, sampler.latest)
        )

    def sharing_of(self, gpu_uuid: str) -> dict[str, Any] | None:
        """How a GPU is lent now and what holds its shares (None: it is never shared and
        nothing here says why not)."""
        enforcement = None if self.shares is None else self.shares.chosen.get(gpu_uuid)
        pool = self.core.placer.shares
        if gpu_uuid not in pool.capacity:
            if enforcement is None or enforcement.mechanism != "none":
                return None
            return {
                "mode": "whole",
                "shares_now": False,
                "room_mib": 0,
                "mechanism": "none",
                "enforced": False,
                "why": enforcement.why,
                "text": enforcement.why,
            }
        mechanism = enforcement.mechanism if enforcement is not None else "watched"
        return {
            "mode": pool.mode[gpu_uuid],
            "shares_now": pool.is_open(gpu_uuid),
            "room_mib": pool.room(gpu_uuid),
            "mechanism": mechanism,
            "enforced": enforcement is not None and enforcement.enforced,
            "why": enforcement.why if enforcement is not None else "",
            "text": f"shares {SHARE_HOLDS[mechanism]}",
        }

    def _share_uid(self, user: str) -> int | None:
        """The account a user's MPS daemon runs as: the broker's own where kernels run as
        the broker's account, else the user's."""
        return os.geteuid() if self.holder_account == "broker" else local_uid(user)

    def open_devices(self, lease_id: str, pid: int, devices: list[str] | None = None) -> None:
        """Where kernels are confined to their devices (a root broker), let the lease's
        holder process ``pid`` open the lease's (``.kernel_devices``), or ``devices``: on
        each renewal, before a suspended kernel is restored onto its new grant, and while
        a kernel moves (its new GPUs, then those alone)."""
        if self._kernel_devices is not None:
            self._kernel_devices.report(lease_id, pid, devices)

    @property
    def pid_namespace(self) -> str:
        """The pid namespace a renewal's ``holder_pid`` must count in to be read here."""
        return self.pids.namespace if self.pids is not None else pidns.own()

    def pid_elsewhere(self, lease_id: str) -> bool:
        """Whether the lease's renewals name its process in another pid namespace."""
        return self.pids is not None and self.pids.elsewhere(lease_id)

    def holder_pid(self, lease_id: str) -> int | None:
        """The holder process a lease's last renewal named (None: none, or no NVML here)."""
        watch = self.sampler.outside if self.sampler is not None else None
        return None if watch is None else watch.holder_pids.get(lease_id)

    def holder_uid(self, lease: Lease) -> int | None:
        """The uid whose processes may hold ``lease`` on this machine (None: none may, its
        user has no account here): this broker's own (``holder_account = 'broker'``), or
        the lease user's own account (``'user'``)."""
        return os.geteuid() if self.holder_account == "broker" else local_uid(lease.user)

    @staticmethod
    def process_uid(pid: int) -> int | None:
        """A process's owner, read as the outside-use check reads it (``ProcessTable``);
        None: no such process in this broker's pid namespace."""
        proc = ProcessTable().read([pid]).get(pid)
        return None if proc is None else proc.uid

    @property
    def tokens(self) -> KernelTokens:
        if self._tokens is None:
            raise RuntimeError("the GPU broker has not been started")
        return self._tokens

    def issue_token(self, user: str, kernel_id: str) -> str:
        """A kernel token acting as ``user`` on ``kernel_id``'s requests (``.tokens``)."""
        return self.tokens.issue(user, kernel_id)

    def revoke_tokens(self, kernel_id: str, user: str) -> None:
        """Revoke ``user``'s tokens of a kernel: at its shutdown, when its suspension, if
        any (``user``'s), ends too."""
        self.tokens.revoke(kernel_id, user)
        if self.suspender is not None:
            self.suspender.forget(KernelKey(user, kernel_id))

    def kernel_restarted(self, kernel_id: str, user: str) -> None:
        """``user``'s kernel restarted: its new process asks for a GPU as a new kernel
        does; a suspension of the old one, whose memory went with it, is over."""
        if self.suspender is not None:
            self.suspender.forget(KernelKey(user, kernel_id), ENDED_RESTARTED)

    def token_holder(self, token: str) -> tuple[str, str] | None:
        """The (user, kernel id) a kernel token acts for; ``None``: unknown, revoked or
        past its age."""
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
