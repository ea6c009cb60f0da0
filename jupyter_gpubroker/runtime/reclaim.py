"""Idle reclaim's settings (``c.GPUBroker.*``) and the admin's decision hook.

``reclaim_hook`` is asked, as jupyterhub-idle-culler asks its ``cull_arbiter_hook``,
before a lease is warned or reclaimed (``broker.reclaim.Candidate``); its answer keeps
the lease or lets the broker go on. A hook that fails costs one log line and leaves
the broker's own decision standing: a bug in site code never keeps a GPU forever nor
takes one early.
"""

from __future__ import annotations

import logging
from typing import Any

from traitlets import (
    Bool,
    Callable,
    Dict,
    Enum,
    HasTraits,
    TraitError,
    Unicode,
    validate,
)
from traitlets import Set as SetTrait

from ..broker.reclaim import Arbiter, Candidate, ReclaimConfig
from ..suspend.host import FALLBACKS as SUSPEND_FALLBACKS
from ..wire.errors import InvalidRequest
from ..wire.sizes import MAX_DURATION_S, RESOLUTION
from ..wire.traits import Number, Seconds, Whole

MAX_KERNEL_MIB = 1 << 20
"""The most memory a simulated kernel may list (1 TiB): more than any GPU has."""
SUSPEND_IDLE_TIMEOUT_S = 300.0
"""The idle timeout of a suspendable lease. Kept: no timeout met the fit's goal on the
notebook trace's first day (benchmarks/README.md, ``--fit-auto``)."""
SUSPEND_GRACE_S = 60.0
"""Its grace: a minute to press *Keep it*, since a suspend costs only a resume."""
KEPT_BY_HOOK = "kept by the site's reclaim policy"
"""Why a lease the hook kept is not warned (its warning withdrawn), when it gives no reason."""


class ReclaimSettings(HasTraits):
    """When a lease counts as idle or stalled, and what reclaiming it does."""

    idle_timeout = Seconds(
        1200.0,
        0.0,
        MAX_DURATION_S,
        help="Seconds a lease may sit idle (its kernel ran nothing and its GPU stayed under "
        "idle_utilization_threshold) before its holder is warned; 0 disables idle reclaim. "
        "Leases of kernels that neither this server runs nor their own server reports with "
        "each renewal (remote mode) are never reclaimed.",
    ).tag(config=True)
    idle_timeout_by_class = Dict(
        key_trait=Unicode(),
        help="idle_timeout per job class, e.g. {'batch': 14400}.",
    ).tag(config=True)
    idle_timeout_by_profile = Dict(
        key_trait=Unicode(),
        help="idle_timeout per MIG profile ('gpu:N' for N whole GPUs, 'gpu' for any number), "
        "e.g. {'7g.80gb': 1800, 'gpu:8': 900}; wins over the class's.",
    ).tag(config=True)
    server_idle_timeout = Seconds(
        None,
        0.0,
        MAX_DURATION_S,
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
        help="server_idle_timeout per MIG profile ('gpu:N' for N whole GPUs, 'gpu' for any "
        "number), e.g. {'1g.10gb': 7200, 'gpu:8': 1800}.",
    ).tag(config=True)
    grace = Seconds(
        600.0,
        0.0,
        MAX_DURATION_S,
        help="Seconds between the idle (or stalled) warning and the reclaim.",
    ).tag(config=True)
    stalled_timeout = Seconds(
        7200.0,
        0.0,
        MAX_DURATION_S,
        help="Seconds a kernel may stay busy while its GPU stays under "
        "idle_utilization_threshold before it counts as stalled and is warned; only where the "
        "GPU reports utilization (whole GPUs, MIG slices with GPM). 0 disables.",
    ).tag(config=True)
    idle_utilization_threshold = Number(
        5.0, 0.0, 100.0, help="GPU utilization (percent) under which a GPU counts as unused."
    ).tag(config=True)
    over_share_grace = Seconds(
        60.0,
        0.0,
        MAX_DURATION_S,
        help="Seconds between the warning that a watched share's kernel uses more GPU memory "
        "than its share and the reclaim.",
    ).tag(config=True)

    reclaim_action = Enum(
        ["auto", "shutdown", "revoke", "suspend"],
        default_value="auto",
        help="What a reclaim does to the kernel: 'auto' suspends it on the GPUs where the "
        "suspend canary passed at the broker's start (a process of the broker's own, suspended "
        "and restored through NVIDIA's checkpoint API on a free GPU of each model) and does "
        "what suspend_fallback says elsewhere (MIG slices, a driver without the API, a canary "
        "that failed); 'shutdown' shuts it down; 'revoke' interrupts it and ends its lease, "
        "leaving it running without a grant (its process may keep the device open until it "
        "exits); 'suspend' suspends it everywhere, unproven, falling back to suspend_fallback "
        "where it cannot. A suspended kernel's GPU memory goes to the host and its next cell "
        "resumes it (docs/suspend.md). A central broker (the hub service) suspends only "
        "kernels that run on its own machine as their lease's user (an account there).",
    ).tag(config=True)
    suspend_idle_timeout = Seconds(
        SUSPEND_IDLE_TIMEOUT_S,
        0.0,
        MAX_DURATION_S,
        allow_none=True,
        help="Seconds a lease whose kernel will be suspended (reclaim_action 'suspend', or "
        "'auto' where the canary passed) may sit idle before it is warned, where shorter than "
        "idle_timeout: a suspend loses no kernel, so it may come sooner, never later than a "
        "shutdown would (chosen on the notebook trace, benchmarks/README.md). None: "
        "idle_timeout. Per-class and per-profile timeouts still win.",
    ).tag(config=True)
    suspend_grace = Seconds(
        SUSPEND_GRACE_S,
        0.0,
        MAX_DURATION_S,
        allow_none=True,
        help="Seconds between the idle warning and the suspend of such a lease, where shorter "
        "than grace. None: grace.",
    ).tag(config=True)
    suspend_fallback = Enum(
        list(SUSPEND_FALLBACKS),
        default_value="shutdown",
        help="What a reclaim does where a suspend is tried and the kernel cannot be suspended "
        "(reclaim_action 'suspend': a MIG slice, a driver without the checkpoint API; 'suspend' "
        "or 'auto': too little host memory, GPU work that does not pause): 'shutdown', "
        "'revoke', or 'keep' (the kernel keeps its GPU until its next idle timeout). The reason "
        "is said once. Under 'auto', the GPUs the canary did not pass shut their kernels down.",
    ).tag(config=True)
    suspend_lock_timeout = Seconds(
        10.0,
        RESOLUTION,
        3600.0,
        help="Seconds a kernel's submitted GPU work may take to finish before a suspend gives "
        "up and falls back (the kernel is left running).",
    ).tag(config=True)
    simulate_kernel_memory = Whole(
        0,
        0,
        MAX_KERNEL_MIB,
        help="On a simulated machine (simulate), list each kernel that names its process on "
        "its lease's devices with this many MiB, as NVML lists a kernel that used CUDA "
        "(the demo's --suspend sets it, so that there is GPU memory to suspend), and with "
        "the SM load its environment's GPUBROKER_SIMULATE_UTILIZATION states. 0: off.",
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
    reclaim_hook = Callable(
        None,
        allow_none=True,
        help="A function called before a lease is warned or reclaimed (idle, stalled or "
        "preempted) with its facts (jupyter_gpubroker.broker.reclaim.Candidate: action, "
        "cause, reason, user, group, kernel, profile, devices, idle_s, evidence, ...). It "
        "returns False to keep the lease, or a sentence saying why (its holder reads it); "
        "True or None to let the broker go on. It runs on the broker's event loop: keep it "
        "quick. One that raises is logged and the broker's own decision stands.",
    ).tag(config=True)

    @validate(
        "idle_timeout_by_class",
        "idle_timeout_by_profile",
        "server_idle_timeout",
        "server_idle_timeout_by_profile",
        "suspend_idle_timeout",
        "suspend_grace",
    )
    def _reclaim_timeouts(self, proposal: dict[str, Any]) -> Any:
        name, value = proposal["trait"].name, proposal["value"]
        if isinstance(value, dict):
            value = dict(value)
        try:
            mapping = name.endswith(("_by_class", "_by_profile"))
            ReclaimConfig(**{name if mapping else f"{name}_s": value})
        except InvalidRequest as e:
            raise TraitError(f"GPUBroker.{name}: {e.message}") from None
        return value

    def reclaim_config(self) -> ReclaimConfig:
        return ReclaimConfig(
            idle_timeout_s=self.idle_timeout,
            idle_timeout_by_class=dict(self.idle_timeout_by_class),
            idle_timeout_by_profile=dict(self.idle_timeout_by_profile),
            server_idle_timeout_s=self.server_idle_timeout,
            server_idle_timeout_by_profile=dict(self.server_idle_timeout_by_profile),
            grace_s=self.grace,
            suspend_idle_timeout_s=self.suspend_idle_timeout,
            suspend_grace_s=self.suspend_grace,
            stalled_timeout_s=self.stalled_timeout,
            utilization_threshold=self.idle_utilization_threshold,
            exempt_users=frozenset(self.reclaim_exempt_users),
            exempt_groups=frozenset(self.reclaim_exempt_groups),
            preemption=self.preemption,
            over_share_grace_s=self.over_share_grace,
        )

    def recorded_reclaim(self) -> dict[str, Any]:
        """What a what-if replay of the state file needs of these settings to vary the idle
        timeout and the reclaim action (``replay.whatif``), under the traits' own names."""
        return {
            "idle_timeout": self.idle_timeout,
            "idle_timeout_by_class": dict(self.idle_timeout_by_class),
            "idle_timeout_by_profile": dict(self.idle_timeout_by_profile),
            "grace": self.grace,
            "reclaim_action": self.reclaim_action,
            "suspend_idle_timeout": self.suspend_idle_timeout,
            "suspend_grace": self.suspend_grace,
        }

    def arbiter(self, log: logging.Logger) -> Arbiter | None:
        """``reclaim_hook`` as the reclaimer asks it: why to keep a lease, or None."""
        hook = self.reclaim_hook
        if hook is None:
            return None

        def ask(candidate: Candidate) -> str | None:
            try:
                answer = hook(candidate)
            except Exception as e:
                log.warning(
                    "GPU broker: c.GPUBroker.reclaim_hook failed on lease %s of %s (%s); "
                    "the broker's own decision stands",
                    candidate.lease_id,
                    candidate.user,
                    e,
                )
                return None
            if answer is False:
                return KEPT_BY_HOOK
            if isinstance(answer, str) and answer.strip():
                return answer.strip()
            if answer is not True and answer is not None:
                log.warning(
                    "GPU broker: c.GPUBroker.reclaim_hook returned %.80r for lease %s, not "
                    "True, False, None or a reason; the broker's own decision stands",
                    answer,
                    candidate.lease_id,
                )
            return None

        return ask
