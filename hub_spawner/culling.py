"""GPU-aware idle culling of GPU servers, as the hub shows it.

The central broker's reclaimer is the one judge, of kernels' leases and servers' alike:
the user's server reports all its kernels' activity with its lease
(``server.reclaimer.report_server_activity``), and a server whose kernels ran nothing and
whose GPU stayed quiet past ``c.GPUBroker.server_idle_timeout`` (per profile, exempt users
and groups: ``c.GPUBroker.*``) has its lease warned, then reclaimed after the grace
period; the slice goes to the next in the queue. An open browser tab is not activity.

The hub's part (``GPUBrokerSpawnerMixin.poll``): read the lease at each poll, show a
pending warning and then why the server was stopped on the hub's pages
(``gpu_announcement``, a ``c.JupyterHub.template_vars`` value), and stop the server once
its lease has ended. The user's kernels hear the warning through the broker's events
(``%gpu`` and the JupyterLab panel follow the server's lease like a kernel's).
"""

from __future__ import annotations

import time
from datetime import datetime
from html import escape
from typing import Any

from jupyter_gpubroker.wire.text import clock, duration


def warning_text(lease: dict[str, Any]) -> str:
    """A pending reclaim warning of a server's lease, for its user."""
    deadline = datetime.fromisoformat(lease["reclaim_at"]).timestamp()
    idle = f" has been idle for {duration(lease['idle_s'])}" if lease.get("idle_s") else " is idle"
    return (
        f"Your GPU server ({', '.join(lease['devices'])}){idle}: it will be stopped at "
        f"{clock(deadline)} and its GPU given to the next in the queue, unless one of its "
        "kernels runs a cell or uses the GPU before then."
    )


def stopped_text(lease: dict[str, Any] | None, why: str) -> str:
    """Why a server was stopped when its lease ended (reclaimed, expired, released by an
    admin); ``why``: the reason when the lease could not be read."""
    reason = f"its GPU lease was {lease['state']}: {lease['reason']}" if lease else why
    return (
        f"Your GPU server was stopped at {clock(time.time())}: {reason.rstrip('.')}. "
        "Start it again from the home page when you need it."
    )


def gpu_announcement(user: Any) -> str:
    """The GPU notices of ``user``'s servers (a warning, or why one was stopped), for the
    hub's pages: ``c.JupyterHub.template_vars = {"announcement": gpu_announcement}``."""
    if user is None:
        return ""
    spawners = [user.spawners[name] for name in list(user.orm_spawners)]
    notices = [getattr(s, "gpu_notice", "") for s in spawners]
    return "<br>".join(escape(n) for n in notices if n)
