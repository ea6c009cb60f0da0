"""Whose process a renewal may name as its lease's holder (``holder_pid``).

The processes on a lease's devices that descend from its holder are the lease's, never
outside use. So a renewal may name only a process of the lease's user, its owner read
as the outside-use check reads it (``monitor.outside.ProcessTable``), or a user could
name another user's process, whose GPU work on the lease's devices would then raise no
alert, stop or charge. Which account runs a user's kernels is the running broker's to say
(``GPUBroker.holder_uid``): the embedded server's own kernels run as its account; a hub
service's users as their own accounts (``c.GPUBroker.holder_account``), and a user with
no account on the broker's machine can name no process there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import pidns
from ..broker.models import Lease
from ..monitor.outside import user_name
from ..wire.errors import InvalidRequest, NotYourProcess

if TYPE_CHECKING:
    from ..runtime import GPUBroker

MAX_PID = 4194304
"""Linux's largest pid (``/proc/sys/kernel/pid_max`` at most)."""


def holder_pid(body: dict[str, Any], *, lowest: int = 2) -> int | None:
    """A renewal's ``holder_pid``, checked: a process id above 1 (init would make every
    process on the lease's devices its own), at most Linux's largest; ``lowest`` 1 for a
    pid of another namespace, which the broker does not read (a container's kernel may
    be its init)."""
    pid = body.get("holder_pid")
    if pid is None:
        return None
    if isinstance(pid, bool) or not isinstance(pid, int) or not lowest <= pid <= MAX_PID:
        raise InvalidRequest(
            f"'holder_pid' must be a process id from {lowest} to {MAX_PID}, not {pid!r}"
        )
    return pid


def elsewhere(runtime: GPUBroker, body: dict[str, Any]) -> bool:
    """Whether a renewal's ``pid_namespace`` (the namespace its ``holder_pid`` counts in,
    as ``/proc/self/ns/pid`` names it) is another than the broker's: its pid then names no
    process the broker can see, or another one (``pidns``). A renewal that does not say
    counts in the broker's, as before renewals said."""
    namespace = body.get("pid_namespace")
    if namespace is None:
        return False
    if not isinstance(namespace, str) or not pidns.FORMAT.fullmatch(namespace):
        raise InvalidRequest(
            "'pid_namespace' must name a pid namespace as /proc/self/ns/pid does, "
            f"such as {pidns.HOST}, not {namespace!r}"
        )
    if "holder_pid" not in body:
        raise InvalidRequest("'pid_namespace' says where 'holder_pid' counts: name both")
    return namespace != runtime.pid_namespace


def check_holder(runtime: GPUBroker, lease: Lease, pid: int) -> None:
    """Refuse (``NotYourProcess``, a 400 that renews nothing) a holder process that is
    not the lease user's on this machine."""
    uid, owner = runtime.holder_uid(lease), runtime.process_uid(pid)
    if uid is None:
        raise NotYourProcess(
            f"{lease.user} has no account on the GPU broker's machine, so no process there "
            "can hold their lease"
        )
    if owner is None:
        raise NotYourProcess(f"process {pid} does not run on the GPU broker's machine")
    if owner != uid:
        account = user_name(uid)
        runs = "" if account == lease.user else f", whose account runs {lease.user}'s kernels"
        raise NotYourProcess(f"process {pid} belongs to {user_name(owner)}, not to {account}{runs}")
