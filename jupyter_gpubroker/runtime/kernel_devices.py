"""The devices of a GPU kernel in a confined server: a root broker adds its lease's
device nodes to what the kernel's process may open, and takes them back when the
lease ends (``confine``; the server's own lease is the spawner's to confine)."""

from __future__ import annotations

import logging
import os
from typing import Any

from ..broker.core import Broker, Event
from ..broker.models import LeaseState
from ..confine import ConfinementError, DeviceConfinement
from ..confine.nodes import nvml_address
from ..nvml import NvmlBackend
from ..wire.text import SERVER_HOLDER

LEASE_ENDS = frozenset(s.value for s in LeaseState if s is not LeaseState.ACTIVE)
"""The events that end a lease (``Broker._end_lease`` names them by the lease's state)."""


class KernelDevices:
    """Lease id -> the kernel process given its devices, kept in step with the leases."""

    def __init__(self, core: Broker, confinement: DeviceConfinement, log: logging.Logger) -> None:
        self.core, self.confinement, self.log = core, confinement, log
        self._confined: dict[str, int] = {}
        core.subscribe(self._lease_ended)

    @classmethod
    def where_possible(
        cls, core: Broker, backend: NvmlBackend | None, parent: Any
    ) -> KernelDevices | None:
        """For a broker run as root on this machine's NVML, where the machine can confine
        (the spawner says why not, once, for the servers); else None."""
        if os.geteuid() != 0 or backend is None:
            return None
        confinement = DeviceConfinement(
            parent=parent, resolve=lambda uuid: nvml_address(backend.handle(uuid))
        )
        return None if confinement.why_not() else cls(core, confinement, parent.log)

    def report(self, lease_id: str, pid: int, devices: list[str] | None = None) -> None:
        """A renewal named the lease's holder process: a kernel's (not a server's) gets
        its lease's devices; a restarted kernel's old process gives them back first.
        ``devices``: the kernel's process and those it started get these instead (a kernel
        moving to them: its restore runs there)."""
        if self._confined.get(lease_id) == pid and devices is None:
            return
        lease = self.core.lease(lease_id)
        if self.core.request(lease.request_id).holder.startswith(SERVER_HOLDER):
            return
        old = self._confined.pop(lease_id, None)
        if old is not None and old != pid:
            self.confinement.withdraw(old)
        only = devices is not None and old == pid
        try:
            granted = lease.devices if devices is None else devices
            if self.confinement.allow(pid, granted, lease.user, only=only) is not None:
                self._confined[lease_id] = pid
        except ConfinementError as e:
            self.log.warning(
                "GPU broker: the kernel (pid %d) of %s cannot open its GPU: %s", pid, lease.user, e
            )

    def _lease_ended(self, event: Event) -> None:
        """A confined kernel whose lease ended opens only its server's devices again."""
        if event.lease_id in self._confined and event.kind in LEASE_ENDS:
            self.confinement.withdraw(self._confined.pop(event.lease_id))
