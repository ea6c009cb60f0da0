"""The text forms of the widgets (what terminal IPython and nbconvert show)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

from jupyter_gpubroker.kernel.session import Activity
from jupyter_gpubroker.kernel.widgets import queue_text, request_facts, usage_text


def iso(minutes: float) -> str:
    """An API time ``minutes`` from now."""
    return (datetime.now(timezone.utc) + timedelta(minutes=minutes)).isoformat()


def local_clock(minutes: float) -> str:
    return (datetime.now().astimezone() + timedelta(minutes=minutes)).strftime("%H:%M")


REQUEST = {"profile": "1g.10gb", "job_class": "interactive", "reason": ""}


def test_a_waiting_request_says_where_it_stands():
    tracker = SimpleNamespace(
        state="queued",
        request={**REQUEST, "position": 3, "eta": iso(12.5)},
        lease=None,
        ahead={"interactive": 1, "batch": 1},
        queue_length=5,
    )
    title, lines = request_facts(tracker, Activity())  # type: ignore[arg-type]
    assert title == "Waiting for 1g.10gb (interactive): position 3 of 5"
    assert lines == [f"ETA {local_clock(12.5)} (in 12 min) · ahead: 1 batch, 1 interactive"]


def test_a_lease_under_a_reclaim_warning_shows_the_deadline():
    lease = {"granted_at": iso(-61), "reclaim_at": iso(5), "devices": ["MIG-x"]}
    tracker = SimpleNamespace(state="granted", request={**REQUEST, "lease": lease}, lease=lease)
    activity = Activity()
    activity.since -= 125
    title, (details,) = request_facts(tracker, activity)  # type: ignore[arg-type]
    assert title == "Holding 1g.10gb (interactive)"
    assert details == (
        f"held 1 h 01 min · kernel idle for 2 min · reclaimed at {local_clock(5)} unless used"
    )


def test_an_ended_request_gives_its_reason():
    request = {**REQUEST, "state": "reclaimed", "reason": "idle for 30 min"}
    tracker = SimpleNamespace(state="reclaimed", request=request, lease=None)
    assert request_facts(tracker, Activity()) == (  # type: ignore[arg-type]
        "1g.10gb (interactive): reclaimed",
        ["idle for 30 min"],
    )


def test_queue_and_usage_tables():
    queue = [
        {"position": 1, "user": "ada", "mine": True, "job_class": "interactive",
         "profile": "1g.10gb", "submitted_at": iso(-3), "eta": None},
        {"position": 2, "user": "bob", "mine": False, "job_class": "batch", "gpus": 2,
         "submitted_at": iso(-0.5), "eta": None},
    ]  # fmt: skip
    assert queue_text(queue).splitlines() == [
        "GPU queue: 2 waiting",
        "#  user       class        size      waiting  ETA",
        "1  ada (you)  interactive  1g.10gb   3 min    unknown",
        "2  bob        batch        2 GPU(s)  30 s     unknown",
    ]
    days = [{"date": "2026-11-27", "gpu_hours": 2.0}, {"date": "2026-11-28", "gpu_hours": 0.5}]
    assert usage_text(days).splitlines() == [
        "My GPU-hours, last 2 days: 2.50",
        "Fri 27 Nov  ████████████████████  2.00",
        "Sat 28 Nov  █████                 0.50",
    ]
