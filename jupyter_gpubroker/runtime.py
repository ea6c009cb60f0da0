"""A running broker: the core plus its hardware, state file, tokens and heartbeat.

``GPUBroker`` is the one traitlets-configured object (``c.GPUBroker.*``) that
every host of the broker starts: the jupyter-server extension (embedded, the
default) and, under JupyterHub, the broker service. It builds the core from
configuration, runs its periodic ``tick`` and sampling pass (whose latest
readings ``GET devices`` and ``/metrics`` both show), issues the kernel-scoped
tokens (kept hashed in the state file), and feeds the core's events to its bus
(``events``), which the live streams follow. It decides nothing itself: every
decision is the core's, every rule of the API is ``api.rules``'.
"""

from __future__ import annotations

import asyncio
import getpass
import hashlib
import os
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from tornado.ioloop import PeriodicCallback
from traitlets import Bool, Dict, Enum, Float, Int, List, TraitError, Unicode, default, validate
from traitlets import Set as SetTrait
from traitlets.config import LoggingConfigurable

from .broker.alerts import AlertChange, AlertConfig, AlertJudge
from .broker.budgets import Quota
from .broker.core import Broker, BrokerConfig, Event
from .broker.health import (
    CRITICAL_XIDS,
    DEFAULT_DRAIN_REASONS,
    SW_POWER_CAP,
    HealthConfig,
    HealthJudge,
)
from .broker.models import DeviceReading, LeaseState, check_name
from .broker.policy import POLICIES, Window, make_policy
from .broker.reclaim import Decision, KernelState, ReclaimConfig, Reclaimer
from .broker.store import Store
from .confine import ConfinementError, DeviceConfinement
from .confine.nodes import nvml_address
from .engines import (
    ClusterView,
    EngineUnavailable,
    InventorySource,
    NoReadings,
    apply_view,
    load_source,
    release_ended,
)
from .events import EventBus
from .monitor.metrics import BrokerCollector
from .monitor.outside import POLICIES as OUTSIDE_POLICIES
from .monitor.outside import OutsideWatch, outside_text
from .monitor.sampler import KernelActions, Sampler
from .monitor.samples import SampleStore
from .nvml import SIMULATE_ENV, MigPartitioner, NvmlBackend, open_backend, seed_for
from .paths import (
    LOCK_DIR_ENV,
    STATE_FILE_ENV,
    USER_LOCK_DIR_ENV,
    default_lock_dir,
    default_state_path,
    default_user_lock_dir,
)
from .statelock import GpuLocks, StateLock, secure_state_file
from .wire.errors import ConfigError, InvalidRequest
from .wire.text import SERVER_OWNER

LEASE_ENDS = frozenset(s.value for s in LeaseState if s is not LeaseState.ACTIVE)
"""The events that end a lease (``Broker._end_lease`` names them by the lease's state)."""


class GPUBroker(LoggingConfigurable):
    """The broker with its hardware and state, configured as ``c.GPUBroker.*``."""

    state_file = Unicode(
        help=f"SQLite file holding requests, leases, usage and quotas "
        f"(default ${STATE_FILE_ENV}, else <jupyter data dir>/gpubroker/state.sqlite).",
    ).tag(config=True)

    @default("state_file")
    def _default_state_file(self) -> str:
        return os.environ.get(STATE_FILE_ENV) or str(default_state_path())

    simulate = Unicode(
        help=f"Run on a simulated GPU machine: a preset (dgx-h100, dgx-h100-mig, "
        f"h200-mig-balanced, workstation-a100, optionally ':N' GPUs) or a topology file. "
        f"Empty: the real NVIDIA driver. Default ${SIMULATE_ENV}.",
    ).tag(config=True)

    @default("simulate")
    def _default_simulate(self) -> str:
        return os.environ.get(SIMULATE_ENV, "")

    simulate_seed = Unicode(
        help="Seeds the UUIDs of the simulated GPUs: brokers with different seeds simulate "
        "different machines, whose GPUs never meet in the machine-wide GPU locks. Default: "
        "the state file's path, so a broker keeps its simulated GPUs across restarts and "
        "never blocks another one's.",
    ).tag(config=True)

    @default("simulate_seed")
    def _default_simulate_seed(self) -> str:
        return seed_for(self.state_file)

    gpu_lock_dir = Unicode(
        help=f"Where a broker running as root keeps one lock file per GPU UUID, so that no "
        f"other broker on the machine (whatever its user or state file) manages its GPUs. "
        f"Only root may write it: created 0755, refused if another user owns it or may write "
        f"in it (default ${LOCK_DIR_ENV}, else {default_lock_dir()}).",
    ).tag(config=True)

    @default("gpu_lock_dir")
    def _default_gpu_lock_dir(self) -> str:
        return os.environ.get(LOCK_DIR_ENV) or str(default_lock_dir())

    user_gpu_lock_dir = Unicode(
        help=f"Where brokers of ordinary users (not root) keep their per-GPU lock files, "
        f"shared by every user: world-writable and sticky, created so when missing. Such a "
        f"broker also refuses GPUs root's broker holds in gpu_lock_dir (default "
        f"${USER_LOCK_DIR_ENV}, else {default_user_lock_dir()}).",
    ).tag(config=True)

    @default("user_gpu_lock_dir")
    def _default_user_gpu_lock_dir(self) -> str:
        return os.environ.get(USER_LOCK_DIR_ENV) or str(default_user_lock_dir())

    policy = Enum(
        sorted(POLICIES), default_value="broker", help="Ordering policy: broker, slurm or fcfs."
    ).tag(config=True)
    policy_params = Dict(
        help="Parameters of the policy, e.g. {'half_life_s': 86400, 'max_wait_s': 7200}; "
        "see jupyter_gpubroker.broker.policy for each policy's fields.",
    ).tag(config=True)
    windows = List(
        Dict(),
        help="Time-of-day windows of the broker policy, checked in order: "
        "[{'name': 'day', 'start': '08:00', 'end': '19:00', 'days': 'mon-fri', "
        "'weights': {'interactive': 2000, 'batch': 0}}, ...]. Empty: the built-in ones.",
    ).tag(config=True)
    timezone = Unicode("UTC", help="Time zone the windows are read in (IANA name).").tag(
        config=True
    )
    lease_ttl = Float(
        120.0, help="Seconds a lease lives without a heartbeat from its holder before it expires."
    ).tag(config=True)
    request_ttl = Float(
        None,
        allow_none=True,
        help="Seconds a request waiting in the queue lives without a heartbeat from its holder "
        "(the client waiting for it) before it expires; None: lease_ttl.",
    ).tag(config=True)
    vacate_timeout = Float(
        60.0,
        help="Seconds the devices of an ended lease wait for its processes to exit (as NVML "
        "lists them) before they are drained with the lingering pid as the reason; until "
        "then nobody is granted them.",
    ).tag(config=True)
    tick_interval = Float(
        2.0, help="Seconds between the broker's housekeeping passes (expiry, scheduling)."
    ).tag(config=True)
    inventory_source = Unicode(
        "nvml",
        help="Where the inventory comes from: 'nvml' (this machine's GPUs, real or "
        "simulated), or an engine of the jupyter_gpubroker.engines entry point group that "
        "is re-read every tick: 'slurm' (a Slurm cluster's GPU gres, c.SlurmInventory.*).",
    ).tag(config=True)
    engine_grace = Float(
        60.0,
        help="With an engine: seconds after a grant in which its job (Slurm) may still be "
        "missing from the engine's queue; a lease whose job is missing after that (ended, "
        "cancelled outside the hub, or gone while the broker was down) is released.",
    ).tag(config=True)
    dynamic_mig = Bool(
        False, help="Re-cut idle MIG GPUs to fit waiting profiles (needs root on real GPUs)."
    ).tag(config=True)
    quotas_file = Unicode(
        "",
        help="YAML or JSON file of shares and quotas applied at start: "
        "{users: {alice: {share: 2, max_gpus: 1}}, groups: {lab: {gpu_hours: 100, "
        "period_s: 604800}}}. Entities it names are reset to it on every start.",
    ).tag(config=True)
    identity = Enum(
        ["owner", "username"],
        default_value="owner",
        help="Whose requests an API call makes. 'owner': every authenticated caller is the "
        "server's owner (a single-user Jupyter server, where the token already grants "
        "everything), and the owner is the admin of this embedded broker. 'username': the "
        "identity provider's username (multi-user setups); only admin_users are admins.",
    ).tag(config=True)
    owner = Unicode(
        help="The server owner's user name (default $JUPYTERHUB_USER, else the OS user): "
        "with identity='owner' every caller and this broker's admin; the user a kernel is "
        "charged to when no request started it."
    ).tag(config=True)

    @default("owner")
    def _default_owner(self) -> str:
        return os.environ.get("JUPYTERHUB_USER") or getpass.getuser()

    admin_users = SetTrait(
        Unicode(),
        help="Users allowed to see every lease and change quotas. With identity='owner' the "
        "server's owner is one too (the single user of that server); with "
        "identity='username' only the users named here are.",
    ).tag(config=True)
    user_groups = Dict(
        key_trait=Unicode(),
        value_trait=List(Unicode()),
        help="Groups each user belongs to, e.g. {'alice': ['lab-a']}: a request is charged to "
        "the first group it names, which must be one of its user's (default: the first listed).",
    ).tag(config=True)

    event_buffer = Int(
        1000,
        help="Recent events kept for event streams that reconnect (SSE Last-Event-ID); a "
        "client further behind gets a snapshot of the whole picture instead.",
    ).tag(config=True)

    # -- monitoring, health and reclaim

    sample_interval = Float(
        5.0,
        help="Seconds between samples of every GPU and MIG slice (utilization, memory, "
        "temperature, power, clock-event reasons, Xid and ECC events), kept in the state file "
        "and driving health checks and idle reclaim.",
    ).tag(config=True)
    samples_kept = Float(
        365 * 86400.0,
        help="Seconds hourly samples are kept (raw samples are kept an hour, minute averages a "
        "week).",
    ).tag(config=True)
    idle_timeout = Float(
        1200.0,
        help="Seconds a lease may sit idle (its kernel ran nothing and its GPU stayed under "
        "idle_utilization_threshold) before its holder is warned; 0 disables idle reclaim. "
        "Leases of kernels that neither this server runs nor their own server reports with "
        "each renewal (remote mode) are never reclaimed.",
    ).tag(config=True)
    idle_timeout_by_class = Dict(
        key_trait=Unicode(),
        value_trait=Float(),
        help="idle_timeout per job class, e.g. {'batch': 14400}.",
    ).tag(config=True)
    idle_timeout_by_profile = Dict(
        key_trait=Unicode(),
        value_trait=Float(),
        help="idle_timeout per MIG profile ('gpu:N' for N whole GPUs, 'gpu' for any number), "
        "e.g. {'7g.80gb': 1800, 'gpu:8': 900}; wins over the class's.",
    ).tag(config=True)
    server_idle_timeout = Float(
        None,
        allow_none=True,
        help="Seconds a GPU server (the reservation of the hub's GPU spawner) may sit idle "
        "(none of its kernels ran anything and its GPU stayed under "
        "idle_utilization_threshold; a browser tab left open does not count) before its "
        "user is warned and, after grace, the server is stopped; 0 disables. None: as a "
        "kernel's lease (idle_timeout and its overrides). Only servers that report their "
        "kernels' activity (the jupyter_gpubroker extension, in remote mode) are judged.",
    ).tag(config=True)
    server_idle_timeout_by_profile = Dict(
        key_trait=Unicode(),
        value_trait=Float(),
        help="server_idle_timeout per MIG profile ('gpu:N' for N whole GPUs, 'gpu' for any "
        "number), e.g. {'1g.10gb': 7200, 'gpu:8': 1800}.",
    ).tag(config=True)
    grace = Float(600.0, help="Seconds between the idle (or stalled) warning and the reclaim.").tag(
        config=True
    )
    stalled_timeout = Float(
        7200.0,
        help="Seconds a kernel may stay busy while its GPU stays under "
        "idle_utilization_threshold before it counts as stalled and is warned; only where the "
        "GPU reports utilization (whole GPUs, MIG slices with GPM). 0 disables.",
    ).tag(config=True)
    idle_utilization_threshold = Float(
        5.0, help="GPU utilization (percent) under which a GPU counts as unused."
    ).tag(config=True)
    reclaim_action = Enum(
        ["shutdown", "revoke"],
        default_value="shutdown",
        help="What a reclaim does to the kernel: 'shutdown' shuts it down; 'revoke' interrupts "
        "it and ends its lease, leaving it running without a grant (its process may keep the "
        "device open until it exits).",
    ).tag(config=True)
    reclaim_exempt_users = SetTrait(
        Unicode(), help="Users whose leases are never reclaimed for idleness or preempted."
    ).tag(config=True)
    reclaim_exempt_groups = SetTrait(
        Unicode(), help="Groups whose requests' leases are never reclaimed or preempted."
    ).tag(config=True)
    preemption = Bool(
        False,
        help="Over-share preemption: when a user under their fair share waits, warn and then "
        "(after grace) reclaim the newest lease it could use of the user over theirs whom "
        "fair share (the queue's order) ranks lowest.",
    ).tag(config=True)
    healthy_for = Float(
        300.0, help="Seconds a drained GPU must show no fault before it takes grants again."
    ).tag(config=True)
    max_temperature = Float(
        85.0,
        help="GPU temperature (C) at which the GPU is drained; 0: only its own thermal slowdown.",
    ).tag(config=True)
    drain_on_power_cap = Bool(
        False,
        help="Also drain GPUs slowed by their software power cap (normal under full load).",
    ).tag(config=True)
    drain_xids = List(
        Int(),
        default_value=sorted(CRITICAL_XIDS),
        help="Xid errors that drain a GPU (hardware faults; program faults such as 13, 31 or 43 "
        "are the program's). Double-bit ECC errors always drain.",
    ).tag(config=True)

    alert_temperature = Float(
        85.0,
        help="GPU temperature (C) that raises a warning alert on a GPU for which NVML gives "
        "no slowdown temperature (where it does, that one is used).",
    ).tag(config=True)
    alert_temperature_critical = Float(
        90.0,
        help="GPU temperature (C) that raises a critical alert on a GPU for which NVML gives "
        "no shutdown temperature (where it does, that one is used).",
    ).tag(config=True)
    alert_memory_percent = Float(
        95.0,
        help="Share of a GPU's or MIG slice's memory in use (percent) that raises a "
        "'memory nearly full' alert.",
    ).tag(config=True)
    alert_clear_after = Float(
        60.0,
        help="Seconds an alert's condition must stay clear before the alert ends (so a "
        "reading at a threshold does not make it flap).",
    ).tag(config=True)
    alert_history_days = Float(90.0, help="Days ended alerts are kept in the state file.").tag(
        config=True
    )
    outside_use = Enum(
        list(OUTSIDE_POLICIES),
        default_value="report",
        help="What the broker does about a process that uses a local GPU or MIG slice its "
        "user was not granted (found by matching NVML's processes to the leases every "
        "sampling pass; the device then takes no grants, an alert is raised, the audit log "
        "records it and its time is charged to the user as unbrokered use). 'report': only "
        "that. 'warn': also a notice on every front of that user. 'stop': warn, then after "
        "outside_use_grace send the process SIGTERM, and SIGKILL 10 s later (only a broker "
        "running as root; a lease holder's processes on its own devices are never touched).",
    ).tag(config=True)
    outside_use_grace = Float(
        300.0,
        help="Seconds between the notice of outside use and the signal, with outside_use='stop'.",
    ).tag(config=True)

    @validate(
        "idle_timeout",
        "grace",
        "stalled_timeout",
        "healthy_for",
        "max_temperature",
        "vacate_timeout",
        "alert_clear_after",
        "outside_use_grace",
    )
    def _not_negative(self, proposal: dict[str, Any]) -> float:
        value = float(proposal["value"])
        if not value >= 0:
            raise TraitError(f"{proposal['trait'].name} must be zero or more, not {value}")
        return value

    @validate("idle_utilization_threshold", "alert_memory_percent")
    def _percent(self, proposal: dict[str, Any]) -> float:
        name, value = proposal["trait"].name, float(proposal["value"])
        if not 0 <= value <= 100 or (name == "alert_memory_percent" and value == 0):
            lowest = "above 0" if name == "alert_memory_percent" else "from 0"
            raise TraitError(f"{name} is a percent {lowest} to 100, not {value}")
        return value

    @validate(
        "idle_timeout_by_class",
        "idle_timeout_by_profile",
        "server_idle_timeout",
        "server_idle_timeout_by_profile",
    )
    def _check_timeouts(self, proposal: dict[str, Any]) -> Any:
        name, value = proposal["trait"].name, proposal["value"]
        if isinstance(value, dict):
            value = dict(value)
        try:
            ReclaimConfig(**{f"{name}_s" if name == "server_idle_timeout" else name: value})
        except InvalidRequest as e:
            raise TraitError(f"GPUBroker.{name}: {e.message}") from None
        return value

    @validate(
        "lease_ttl",
        "request_ttl",
        "tick_interval",
        "sample_interval",
        "samples_kept",
        "alert_temperature",
        "alert_temperature_critical",
        "alert_history_days",
    )
    def _positive(self, proposal: dict[str, Any]) -> float | None:
        if proposal["value"] is None:  # request_ttl: the lease's
            return None
        value = float(proposal["value"])
        if not value > 0:
            raise TraitError(f"{proposal['trait'].name} must be positive, not {value}")
        return value

    @validate("admin_users", "user_groups")
    def _check_names(self, proposal: dict[str, Any]) -> Any:
        """Configured names follow the API's one rule (``check_name``) from the start, not
        a refusal of every call of the user they name later."""
        name, value = proposal["trait"].name, proposal["value"]
        groups = value.values() if isinstance(value, dict) else []
        try:
            for user in value:
                check_name(user, "user")
            for group in (g for named in groups for g in named):
                check_name(group, "group")
        except InvalidRequest as e:
            raise TraitError(f"GPUBroker.{name}: {e.message}") from None
        return value

    @validate("windows")
    def _check_windows(self, proposal: dict[str, Any]) -> list[dict[str, Any]]:
        for w in proposal["value"]:
            try:
                Window.from_dict(w)
            except InvalidRequest as e:
                raise TraitError(f"GPUBroker.windows: {e.message}") from None
        return list(proposal["value"])

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._core: Broker | None = None
        self.backend: NvmlBackend | None = None
        self._events: EventBus | None = None
        self._confinement: DeviceConfinement | None = None
        self._confined: dict[str, int] = {}
        """Lease id -> the kernel process given its devices (``_confine_kernel``)."""
        self._ticker: PeriodicCallback | None = None
        self._sampling: PeriodicCallback | None = None
        self.sampler: Sampler | None = None
        self.metrics: BrokerCollector | None = None
        self.kernels: KernelActions | None = None
        """The host's kernels, when it runs them (the server extension's ``ServerKernels``)."""
        self.api_url = ""
        """Where kernels reach this broker's API (set by the host that serves it)."""
        self._lock: StateLock | None = None
        self._gpu_locks: GpuLocks | None = None
        self.engine: InventorySource | None = None
        self.engine_down: tuple[float, str] | None = None
        """(since, why) while the engine does not answer; its last view stands meanwhile."""
        self._engine_poll: PeriodicCallback | None = None

    # ----------------------------------------------------------- lifecycle

    def start(self) -> Broker:
        """Open the hardware and the state file and build the core (no event loop needed).

        Raises ``StateFileError`` when the state file is unusable or another broker holds
        it, ``ConfigError`` when its configuration cannot be used (what the core refuses
        while it is built from it included), and leaves nothing open when any step fails."""
        try:
            return self._start()
        except InvalidRequest as e:  # no caller's request: the configuration's
            self.stop()
            raise ConfigError(e.message) from None
        except BaseException:
            self.stop()
            raise

    def _start(self) -> Broker:
        params = dict(self.policy_params)
        if self.policy == "broker":
            params.setdefault("timezone", self.timezone)
            if self.windows:
                params["windows"] = tuple(Window.from_dict(w) for w in self.windows)
        policy = make_policy(self.policy, **params)
        state = Path(self.state_file).expanduser()
        if self.state_file != ":memory:":
            self._lock = StateLock(state)
            self._lock.acquire(self.api_url)
            secure_state_file(state, self.log)
        view: ClusterView | None = None
        if self.inventory_source == "nvml":
            self.backend = open_backend(self.simulate, log=self.log, seed=self.simulate_seed)
            inventory = self.backend.inventory()
            self._gpu_locks = GpuLocks(
                Path(self.gpu_lock_dir).expanduser(),
                Path(self.user_gpu_lock_dir).expanduser(),
                self.log,
            )
            self._gpu_locks.acquire((g.uuid for g in inventory.gpus), self.api_url)
        else:
            if self.dynamic_mig:
                raise InvalidRequest(
                    "c.GPUBroker.dynamic_mig needs the GPUs' NVML: with an engine, MIG slices "
                    "are the engine's (Slurm's gres types); turn dynamic_mig off"
                )
            self.engine = load_source(self.inventory_source, self)
            view = _read_now(self.engine)
            inventory = view.inventory
        store = Store(state)
        try:
            self._core = Broker(
                store,
                inventory,
                policy=policy,
                config=BrokerConfig(
                    lease_ttl_s=self.lease_ttl,
                    request_ttl_s=self.request_ttl,
                    dynamic_mig=self.dynamic_mig,
                    vacate_timeout_s=self.vacate_timeout,
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
            self._apply_quotas_file(Path(self.quotas_file).expanduser())
        self._events = EventBus(self._core, self.event_buffer)
        self._core.subscribe(self._events.publish)
        self._confinement = self._kernel_confinement()
        if self._confinement is not None:
            self._core.subscribe(self._lease_ended)
        if view is not None:  # leases whose jobs ended while the broker was down end now
            self._apply_view(view)
        self._start_monitoring(self._core, self.backend or NoReadings())
        if self.engine is not None:
            source = f"{self.engine.name}, {len({g.node for g in inventory.gpus})} nodes"
        else:
            source = f"simulated {self.simulate}" if self.simulate else "NVIDIA driver"
        self.log.info(
            "GPU broker: %d devices on %d GPUs (%s), policy %s, state %s",
            len(self._core.inventory.devices),
            len(self._core.inventory.gpus),
            source,
            self.policy,
            self.state_file,
        )
        return self._core

    def _start_monitoring(self, core: Broker, backend: NvmlBackend | NoReadings) -> None:
        reclaim = ReclaimConfig(
            idle_timeout_s=self.idle_timeout,
            idle_timeout_by_class=dict(self.idle_timeout_by_class),
            idle_timeout_by_profile=dict(self.idle_timeout_by_profile),
            server_idle_timeout_s=self.server_idle_timeout,
            server_idle_timeout_by_profile=dict(self.server_idle_timeout_by_profile),
            grace_s=self.grace,
            stalled_timeout_s=self.stalled_timeout,
            utilization_threshold=self.idle_utilization_threshold,
            exempt_users=frozenset(self.reclaim_exempt_users),
            exempt_groups=frozenset(self.reclaim_exempt_groups),
            preemption=self.preemption,
        )
        health = HealthConfig(
            max_temperature_c=self.max_temperature or None,
            drain_clock_reasons=DEFAULT_DRAIN_REASONS
            | (SW_POWER_CAP if self.drain_on_power_cap else 0),
            drain_xids=frozenset(self.drain_xids),
            healthy_for_s=self.healthy_for,
        )
        alerts = AlertConfig(
            temperature_warning_c=self.alert_temperature,
            temperature_critical_c=self.alert_temperature_critical,
            memory_full_percent=self.alert_memory_percent,
            xids=frozenset(self.drain_xids),
            clear_after_s=self.alert_clear_after,
            history_kept_s=self.alert_history_days * 86400,
        )
        samples = SampleStore(core.store, self.sample_interval, hours_kept_s=self.samples_kept)
        sampler = Sampler(
            core,
            backend,
            samples,
            HealthJudge(health),
            Reclaimer(core, reclaim),
            log=self.log,
            alerts=AlertJudge(core.store, core.clock.now(), alerts),
        )
        sampler.on_alert = self._publish_alert
        if isinstance(backend, NvmlBackend):  # an engine's nodes are the engine's to watch
            sampler.outside = OutsideWatch(
                core, self.events.publish, self.outside_use, self.outside_use_grace, self.log
            )
            if self.outside_use == "stop" and not sampler.outside.may_signal:
                self.log.warning(
                    "GPU broker: c.GPUBroker.outside_use is 'stop' but the broker does not run "
                    "as root: it warns the users, and stops no process"
                )
        sampler.latest = backend.read_all(core.inventory)  # GET devices has readings at once
        self.sampler = sampler
        self.metrics = BrokerCollector(
            core,
            lambda: sampler.latest,
            alerts=sampler.alerts.active if sampler.alerts else list,
            hardware_errors=lambda: sampler.hardware_errors,
        )

    def _publish_alert(self, change: AlertChange) -> None:
        """An alert that started, escalated or ended, on the event stream (admins only)."""
        detail = {"state": change.state, "alert": change.alert.to_json()}
        self.events.publish(Event("alert", self.core.clock.now(), "", detail=detail))

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

    def start_ticking(self) -> None:
        """Run ``tick`` every ``tick_interval`` seconds and a sampling pass every
        ``sample_interval`` seconds on the current IOLoop."""
        self._ticker = PeriodicCallback(self._tick, self.tick_interval * 1000)
        self._ticker.start()
        self._sampling = PeriodicCallback(self.sample, self.sample_interval * 1000)
        self._sampling.start()
        if self.engine is not None:
            self._engine_poll = PeriodicCallback(self.poll_engine, self.tick_interval * 1000)
            self._engine_poll.start()

    async def poll_engine(self) -> None:
        """Read the engine and make the broker respect it (``engines.apply_view``); an
        engine that does not answer leaves the queue and the last view as they are, and
        ``engine_down`` says since when and why (``GET devices``, ``status``)."""
        assert self.engine is not None
        try:
            view = await self.engine.read()
        except EngineUnavailable as e:
            if self.engine_down is None:
                self.log.warning("GPU broker: %s; the queue is kept", e)
                self.engine_down = (time.time(), str(e))
            return
        if self._engine_poll is not None and not self._engine_poll.is_running():
            return  # stopped meanwhile: the store may be closed
        if self.engine_down is not None:
            self.log.info("GPU broker: %s answers again", self.engine.name)
            self.engine_down = None
        try:
            self._apply_view(view)
        except Exception:
            self.log.exception("GPU broker: applying the %s view failed", self.engine.name)

    def _apply_view(self, view: ClusterView) -> None:
        assert self.engine is not None
        added = apply_view(self.core, view)
        for node in sorted({d.node for d in added}):
            count = sum(d.node == node for d in added)
            self.log.info("GPU broker: %d devices on %s joined the inventory", count, node)
        work = f"{self.engine.name.capitalize()} {self.engine.work}"
        for lease_id in release_ended(self.core, view, self.engine_grace, work):
            self.log.info("GPU broker: lease %s released: its %s ended", lease_id, work)

    def engine_state(self) -> dict[str, Any] | None:
        """The engine the inventory comes from, and whether it answers (None: NVML)."""
        if self.engine is None:
            return None
        since, why = self.engine_down or (None, None)
        return {"name": self.engine.name, "reachable": since is None, "since": since, "error": why}

    async def sample(self) -> list[Decision]:
        """One sampling pass (NVML read on a worker thread), then carry out its decisions."""
        sampler = self.sampler
        assert sampler is not None
        try:
            found = await asyncio.to_thread(sampler.read)
            if self._sampling is not None and not self._sampling.is_running():
                return []  # stopped meanwhile: the store may be closed
            decisions = sampler.apply(*found)
        except Exception:
            self.log.exception("GPU broker sampling failed")
            return []
        for d in decisions:
            self.log.warning(
                "GPU broker: %s lease %s of kernel %s%s: %s",
                d.action,
                d.lease_id,
                d.owner or "-",
                f" (reclaim at {time.ctime(d.deadline)})" if d.deadline else "",
                d.reason,
            )
            if d.action == "reclaim" and self.kernels is not None:
                try:
                    await self.kernels.act(d.owner, self.reclaim_action)
                except Exception:
                    self.log.exception(
                        "GPU broker: cannot %s kernel %s", self.reclaim_action, d.owner
                    )
        return decisions

    def _tick(self) -> None:
        """The core's housekeeping, then the positions of a queue that aging re-ranked."""
        try:
            self.core.tick()
            self.events.after_tick()
        except Exception:
            self.log.exception("GPU broker tick failed")

    def stop(self) -> None:
        if self._events is not None:
            self._events.close()
        for callback in (self._ticker, self._sampling, self._engine_poll):
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

    # -------------------------------------------------------------- tokens

    def issue_token(self, user: str, kernel_id: str) -> str:
        """A secret that acts as ``user`` on ``kernel_id``'s requests only. Its sha256
        is kept in the state file, so it outlives a restart of the broker, until the
        kernel's tokens are revoked. A kernel's new token replaces its old one (that
        user's only: another user naming the same kernel id must not revoke it)."""
        token = "gpb_" + secrets.token_urlsafe(24)
        store = self.core.store
        with store.transaction():
            store.revoke_kernel_tokens(kernel_id, user)
            store.insert_kernel_token(_hash(token), user, kernel_id, self.core.clock.now())
        return token

    def revoke_tokens(self, kernel_id: str, user: str | None = None) -> None:
        """Revoke a kernel's tokens (only ``user``'s, when given)."""
        store = self.core.store
        with store.transaction():
            store.revoke_kernel_tokens(kernel_id, user)

    def token_holder(self, token: str) -> tuple[str, str] | None:
        """The (user, kernel id) a kernel token acts for; ``None``: unknown or revoked."""
        return self.core.store.kernel_token(_hash(token))

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

    def holder_pid(self, lease_id: str) -> int | None:
        """The holder process a lease's last renewal named (None: none, or no NVML here)."""
        watch = self.sampler.outside if self.sampler is not None else None
        return None if watch is None else watch.holder_pids.get(lease_id)

    def report_pid(self, lease_id: str, pid: int) -> None:
        """The holder process a renewal named (a kernel's or a server's): what it starts
        on the lease's devices is the lease's (``monitor.outside``); and a kernel in a
        server confined to its devices may open its lease's too (``confine``)."""
        if self.sampler is not None and self.sampler.outside is not None:
            self.sampler.outside.holder_pids[lease_id] = pid
        if self._confinement is not None and self._confined.get(lease_id) != pid:
            self._confine_kernel(lease_id, pid)

    def _confine_kernel(self, lease_id: str, pid: int) -> None:
        """Add a kernel's granted devices to what its confined server lets it open (a
        server's own lease is the spawner's to confine); a restarted kernel's old process
        gives them back first."""
        assert self._confinement is not None
        lease = self.core.lease(lease_id)
        if self.core.request(lease.request_id).owner.startswith(SERVER_OWNER):
            return
        old = self._confined.pop(lease_id, None)
        if old is not None:
            self._confinement.withdraw(old)
        try:
            if self._confinement.allow(pid, lease.devices, lease.user) is not None:
                self._confined[lease_id] = pid
        except ConfinementError as e:
            self.log.warning(
                "GPU broker: the kernel (pid %d) of %s cannot open its GPU: %s", pid, lease.user, e
            )

    def _lease_ended(self, event: Event) -> None:
        """A confined kernel whose lease ended opens only its server's devices again."""
        if event.lease_id in self._confined and event.kind in LEASE_ENDS:
            assert self._confinement is not None
            self._confinement.withdraw(self._confined.pop(event.lease_id))

    def _kernel_confinement(self) -> DeviceConfinement | None:
        """Device cgroups for kernels granted a GPU in a confined server: a broker run as
        root on this machine's NVML, where the machine can confine (the spawner says why
        not, once, for the servers)."""
        backend = self.backend
        if os.geteuid() != 0 or not isinstance(backend, NvmlBackend):
            return None
        confinement = DeviceConfinement(
            parent=self, resolve=lambda uuid: nvml_address(backend.handle(uuid))
        )
        return None if confinement.why_not() else confinement

    def report_kernel(self, lease_id: str, kernel: KernelState) -> None:
        """What a renewal said of the lease's kernel, for idle reclaim to judge: the
        kernels of servers that use this broker from elsewhere (remote mode)."""
        if self.sampler is not None:
            self.sampler.reported[lease_id] = kernel

    # ------------------------------------------------------------- readings

    def readings(self) -> dict[str, DeviceReading]:
        """The sampler's latest readings of every GPU and device (what ``/metrics``
        shows too); never a read of NVML on the caller's thread."""
        return self.sampler.latest if self.sampler is not None else {}

    # --------------------------------------------------------------- quotas

    def _apply_quotas_file(self, path: Path) -> None:
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise InvalidRequest(f"cannot read quotas file {path}: {e}") from None
        if not isinstance(data, dict) or set(data) - {"users", "groups"}:
            raise InvalidRequest(f"quotas file {path}: top-level keys are 'users' and 'groups'")
        for section, kind in (("users", "user"), ("groups", "group")):
            entries = data.get(section) or {}
            if not isinstance(entries, dict):
                raise InvalidRequest(f"quotas file {path}: '{section}' needs a mapping of names")
            for name, values in entries.items():
                check_name(str(name), kind)
                if not isinstance(values, dict):
                    raise InvalidRequest(f"quotas file {path}: {kind} {name!r} needs a mapping")
                try:
                    quota = Quota(**values)
                except TypeError as e:
                    raise InvalidRequest(f"quotas file {path}: {kind} {name!r}: {e}") from None
                self.core.set_quota(kind, str(name), quota)


def _read_now(source: InventorySource) -> ClusterView:
    """The engine's first view, read before the broker exists (whether or not an event
    loop runs on this thread): on a thread of its own."""
    with ThreadPoolExecutor(1) as pool:
        try:
            return pool.submit(asyncio.run, source.read()).result()
        except EngineUnavailable as e:
            raise InvalidRequest(f"{e}: the broker starts once it answers") from None


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
