"""What the running broker can tell of process ids (``pidns``): its own pid namespace,
whether it can match the processes NVML lists to its kernels at all, and which leases'
renewals named their holder process in another namespace. A pid of another namespace
names no process here, or another one, so the broker never acts on it: such a lease's
kernel is not suspended, moved or given devices, and only the owner of a process on its
GPU tells it from outside use."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .. import pidns
from ..broker.core import Broker, Event
from ..wire.text import KERNEL_PID_NAMESPACE
from .kernel_devices import LEASE_ENDS

if TYPE_CHECKING:
    from ..nvml import NvmlBackend


class PidView:
    """The broker's pid namespace, said once at start, and the leases named elsewhere."""

    def __init__(self, core: Broker, nvml: NvmlBackend | None, log: logging.Logger) -> None:
        """``nvml``: this machine's, where the inventory is its GPUs (an engine's nodes are
        the engine's to watch: nothing to match here)."""
        self.namespace = pidns.own()
        """This broker's pid namespace: a renewal's ``holder_pid`` counts in it, or is not read."""
        simulated = nvml is not None and nvml.simulator is not None
        unseen = pidns.nvml_unseen(self.namespace, simulated)
        self.unseen = None if nvml is None else unseen
        """Why no process NVML lists can be matched to a kernel here (None: they can)."""
        self.log = log
        self._elsewhere: set[str] = set()
        """Leases whose last renewal named its process in another pid namespace."""
        if self.unseen is not None:
            log.warning(
                "GPU broker: %s: it reports no outside use, and suspends and moves no kernel",
                self.unseen,
            )
        elif nvml is not None and self.namespace != pidns.HOST:
            log.info(
                "GPU broker: it runs in a pid namespace of its own (%s), not the host's: it "
                "suspends and moves only the kernels whose renewals name their process in it",
                self.namespace,
            )
        core.subscribe(self._lease_ended)

    def named(self, lease_id: str, user: str, here: bool) -> None:
        """A renewal named the lease's holder process, in this broker's namespace or not
        (``here``); the first time not, the log says so."""
        if here:
            self._elsewhere.discard(lease_id)
        elif lease_id not in self._elsewhere:
            self._elsewhere.add(lease_id)
            self.log.warning(
                "GPU broker: lease %s of %s: %s, so it is not suspended or moved, and its "
                "processes on the GPUs are told from outside use by their owner alone",
                lease_id,
                user,
                KERNEL_PID_NAMESPACE,
            )

    def elsewhere(self, lease_id: str) -> bool:
        """Whether the lease's holder process was last named in another pid namespace."""
        return lease_id in self._elsewhere

    def _lease_ended(self, event: Event) -> None:
        if event.kind in LEASE_ENDS and event.lease_id is not None:
            self._elsewhere.discard(event.lease_id)
