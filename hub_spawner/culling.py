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
its lease has ended. A lease warned for its time limit is said so, with an Extend that
opens the service's "My GPUs" at that lease (the hub's page cannot post to the service: its
forms carry the service's own XSRF token), where "Extend by 1 hour" asks for more time.
The user's kernels hear the warning through the broker's events (``%gpu`` and the
JupyterLab panel follow the server's lease like a kernel's).
"""

from __future__ import annotations

import time
from datetime import datetime
from html import escape
from typing import Any
from urllib.parse import quote

from jupyter_gpubroker.wire.text import clock, duration


def warning_text(lease: dict[str, Any]) -> str:
    """A pending reclaim warning of a server's lease, for its user."""
    deadline = _at(lease["reclaim_at"])
    idle = f" has been idle for {duration(lease['idle_s'])}" if lease.get("idle_s") else " is idle"
    return (
        f"Your GPU server ({', '.join(lease['devices'])}){idle}: it will be stopped at "
        f"{clock(deadline)} and its GPU given to the next in the queue, unless one of its "
        "kernels runs a cell or uses the GPU before then."
    )


EXTEND_S = 3600.0
"""What one press of Extend adds to a time limit: an hour."""


def time_limit_warned(lease: dict[str, Any]) -> bool:
    """Is the lease warned for its time limit (kept by Extend, not by use)? Not once an
    extension has moved its end past the warning's deadline: the broker withdraws that
    warning at its next look."""
    ends, reclaim = lease.get("ends_at"), lease.get("reclaim_at")
    return (
        lease.get("reclaim_cause") == "time_limit"
        and bool(ends and reclaim)
        and _at(str(reclaim)) >= _at(str(ends))
    )


def time_limit_text(lease: dict[str, Any], server: bool = True) -> str:
    """A lease warned for its time limit, for its user: a server's (the hub's pages) or
    any of theirs ("My GPUs")."""
    ends, reclaim = clock(_at(lease["ends_at"])), clock(_at(lease["reclaim_at"]))
    devices = ", ".join(lease["devices"])
    if server:
        return (
            f"Your GPU server's time on {devices} ends at {ends}: it will be stopped at "
            f"{reclaim} unless you extend it."
        )
    return (
        f"Your time on {devices} ends at {ends}: it is taken back at {reclaim} unless you "
        "extend it."
    )


def lease_notice(lease: dict[str, Any]) -> tuple[str, str]:
    """What the hub's pages say of an active server's lease, and the lease Extend is for:
    a time limit's warning (with its lease), an idle warning, or nothing."""
    if time_limit_warned(lease):
        return time_limit_text(lease), lease["id"]
    return (warning_text(lease) if lease.get("reclaim_at") else ""), ""


def time_extended_text(lease: dict[str, Any]) -> str:
    """What an extension did."""
    return (
        f"Extended: your time on {', '.join(lease['devices'])} now ends at "
        f"{clock(_at(lease['ends_at']))}."
    )


def _at(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


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
    notices = []
    for s in spawners:
        notice = escape(getattr(s, "gpu_notice", ""))
        lease_id, pages = getattr(s, "gpu_extend", ""), getattr(s, "gpu_pages_url", "")
        if notice and lease_id and pages:  # the service's page posts it, with its XSRF token
            notice += (
                f' <a class="btn btn-sm btn-primary gpubroker-extend" '
                f'href="{escape(pages)}?extend={quote(lease_id)}#lease-{quote(lease_id)}">'
                "Extend</a>"
            )
        if notice:
            notices.append(notice)
    return "<br>".join(notices)
