"""The text forms of the widgets (what terminal IPython and nbconvert show)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

from jupyter_gpubroker.kernel.session import Activity
from jupyter_gpubroker.kernel.tables import queue_text, usage_html, usage_text
from jupyter_gpubroker.kernel.widgets import Held, request_facts, request_html, request_text


def iso(minutes: float) -> str:
    """An API time ``minutes`` from now."""
    return (datetime.now(timezone.utc) + timedelta(minutes=minutes)).isoformat()


def local_clock(minutes: float) -> str:
    return (datetime.now().astimezone() + timedelta(minutes=minutes)).strftime("%H:%M")


REQUEST = {"profile": "1g.10gb", "job_class": "interactive", "reason": ""}


def waiting(**eta: object) -> SimpleNamespace:
    return SimpleNamespace(
        state="queued",
        request={**REQUEST, "position": 3, **eta},
        lease=None,
        ahead={"interactive": 1, "batch": 1},
        queue_length=5,
    )


def test_a_waiting_request_says_where_it_stands_with_its_eta_range():
    span = {"low": iso(10), "high": iso(70)}
    tracker = waiting(eta=iso(30), eta_range=span, eta_known=True)
    title, lines = request_facts(tracker, Activity())  # type: ignore[arg-type]
    assert title == "Waiting for 1g.10gb (interactive): position 3 of 5"
    ahead = "ahead: 1 batch, 1 interactive"
    assert lines == [f"ETA {local_clock(30)} ({local_clock(10)}-{local_clock(70)}) · {ahead}"]


def test_an_eta_the_broker_cannot_know_says_so_with_the_position():
    tracker = waiting(eta=None, eta_range=None, eta_known=False)
    (line,) = request_facts(tracker, Activity())[1]  # type: ignore[arg-type]
    assert line == "ETA unknown · ahead: 1 batch, 1 interactive"  # the position is the title's


def test_any_moment_only_once_the_low_end_is_now():
    later = waiting(eta=iso(20), eta_range={"low": iso(-1), "high": iso(50)}, eta_known=True)
    (line,) = request_facts(later, Activity())[1]  # type: ignore[arg-type]
    assert line.startswith(f"ETA {local_clock(20)} (now-{local_clock(50)}) · ")
    due = waiting(eta=iso(-1), eta_range={"low": iso(-2), "high": iso(50)}, eta_known=True)
    (line,) = request_facts(due, Activity())[1]  # type: ignore[arg-type]
    assert line.startswith(f"ETA any moment (by {local_clock(50)}) · ")


def held_tracker(lease: dict, warning: dict | None = None) -> SimpleNamespace:
    return SimpleNamespace(
        state="granted", request={**REQUEST, "lease": lease}, lease=lease, warning=warning
    )


def test_a_time_limit_shows_its_end_and_its_warning_in_plain_words():
    lease = {"granted_at": iso(-61), "ends_at": iso(60), "reclaim_at": iso(120)}
    lease["devices"] = ["MIG-x"]
    reason = f"its time limit of 2 h 01 min ends at {local_clock(60)}"
    warning = {"cause": "time_limit", "reason": reason, "deadline": iso(120)}
    activity = Activity()
    activity.since -= 125
    title, (details, said) = request_facts(held_tracker(lease, warning), activity)  # type: ignore[arg-type]
    assert details == f"held 1 h 01 min · kernel idle for 2 min · until {local_clock(60)}"
    assert said == (
        f"⚠ Its time limit of 2 h 01 min ends at {local_clock(60)}; the GPU is taken back at "
        f"{local_clock(120)} unless it is extended."
    )


def test_a_time_limit_warning_given_before_the_widget_listened_is_read_from_the_lease():
    """No ``warning`` event reached this tracker; its lease still says why it is warned.
    Once extended past the old deadline, the lease's stale cause shows nothing."""
    lease = {"granted_at": iso(-61), "ends_at": iso(60), "reclaim_at": iso(61)}
    lease.update(devices=["MIG-x"], reclaim_cause="time_limit")
    activity = Activity()
    _, (_, said) = request_facts(held_tracker(lease), activity)  # type: ignore[arg-type]
    assert said == (
        f"⚠ Its time limit of 2 h 01 min ends at {local_clock(60)}; the GPU is taken back at "
        f"{local_clock(61)} unless it is extended."
    )
    extended = {**lease, "ends_at": iso(120)}
    _, lines = request_facts(held_tracker(extended), activity)  # type: ignore[arg-type]
    assert lines == [f"held 1 h 01 min · kernel idle for 0 s · until {local_clock(120)}"]


def test_a_lease_under_a_reclaim_warning_shows_the_deadline():
    lease = {"granted_at": iso(-61), "reclaim_at": iso(5), "devices": ["MIG-x"]}
    tracker = held_tracker(lease)
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
         "profile": "1g.10gb", "submitted_at": iso(-3), "eta": None, "eta_known": False},
        {"position": 2, "user": "bob", "mine": False, "job_class": "batch", "gpus": 2,
         "submitted_at": iso(-0.5), "eta": iso(90), "eta_known": True,
         "eta_range": {"low": iso(60), "high": None}},
    ]  # fmt: skip
    later = f"{local_clock(60)} or later"
    assert queue_text(queue).splitlines() == [
        "GPU queue: 2 waiting",
        "#  user       class        size     waiting  ETA",
        "1  ada (you)  interactive  1g.10gb  3 min    unknown",
        f"2  bob        batch        2 GPUs   30 s     {local_clock(90)} ({later})",
    ]
    days = [{"date": "2026-11-27", "gpu_hours": 2.0}, {"date": "2026-11-28", "gpu_hours": 0.5}]
    assert usage_text(days).splitlines() == [
        "My GPU-hours, last 2 days: 2.5 h",
        "Fri 27 Nov  ████████████████████  2.0 h",
        "Sat 28 Nov  █████                 0.5 h",
    ]


def test_a_held_slice_names_its_profile_once_beside_the_title():
    lease = {"granted_at": iso(-1), "devices": ["MIG-x"]}
    tracker = held_tracker(lease)
    held = Held("MIG-x", "GPU 0 / 1g.10gb@3", 10048, 512, None, True, 40.0)
    assert request_text(tracker, Activity(), [held]).splitlines()[:2] == [  # type: ignore[arg-type]
        "Holding 1g.10gb (interactive)",
        "GPU 0 / 1g.10gb@3, 10.5 GB (MIG-x)",
    ]
    assert "<b>GPU 0 / 1g.10gb@3, 10.5 GB</b>" in request_html(tracker, Activity(), [held], [], "")  # type: ignore[arg-type]
    whole = Held("GPU-y", "GPU 1", 81559, 0, 0.0, False, 40.0)
    assert whole.headline() == "GPU 1 (whole GPU), 85.5 GB"


def bar_widths(html: str) -> list[float]:
    """The filled share (%) of each usage bar."""
    return [float(w) for w in re.findall(r"width:([0-9.]+)%", html)]


def test_a_few_minutes_of_usage_draw_as_a_sliver_not_a_full_bar():
    days = [{"date": f"2026-11-{d}", "gpu_hours": 0.0} for d in range(23, 29)]
    days.append({"date": "2026-11-29", "gpu_hours": 0.003})  # 11 s on a whole GPU
    assert bar_widths(usage_html(days)) == [0.0] * 6 + [0.3]
    assert usage_text(days).splitlines()[-1] == f"Sun 29 Nov  {' ' * 20}  0.003 h"
    assert usage_text(days).splitlines()[1] == f"Mon 23 Nov  {' ' * 20}  none"
    busy = [{"date": "2026-11-28", "gpu_hours": 0.5}, {"date": "2026-11-29", "gpu_hours": 4.0}]
    assert bar_widths(usage_html(busy)) == [12.5, 100.0]  # the busiest day fills its bar


def test_a_kernel_granted_a_moment_ago_after_a_long_wait_is_not_idle_for_the_wait():
    """Its kernel started half an hour ago and waited in the queue: it said "kernel idle
    for 30 min" a moment after the grant, where idle reclaim and the Lab panel count from
    the grant."""
    activity = Activity()
    activity.since -= 1800  # the kernel's start, before its wait in the queue
    lease = {"granted_at": iso(-0.1), "devices": ["MIG-x"]}
    _, (details,) = request_facts(held_tracker(lease), activity)  # type: ignore[arg-type]
    assert details == "held 6 s · kernel idle for 6 s"


def test_a_request_a_quota_holds_back_says_whose_quota_and_when_it_starts():
    held = "group ML Team's quota allows one 1g.10gb slice at a time and its members hold one"
    tracker = waiting(eta=iso(-1), eta_range={"low": iso(-2), "high": iso(-1)}, eta_known=True)
    tracker.request["held_back"] = f"{held} 1g.10gb slice: it starts once they give one back"
    title, (line,) = request_facts(tracker, Activity())  # type: ignore[arg-type]
    assert title == "Waiting for 1g.10gb (interactive): position 3 of 5"
    assert line == (  # no "ETA any moment (by ...)" for a start the quota decides
        "Group ML Team's quota allows one 1g.10gb slice at a time and its members hold one "
        "1g.10gb slice: it starts once they give one back. Ahead: 1 batch, 1 interactive."
    )


def test_days_without_use_draw_no_bar_at_all():
    """Empty days were drawn as full grey bars (the bar's track)."""
    days = [{"date": "2026-11-28", "gpu_hours": 0.0}, {"date": "2026-11-29", "gpu_hours": 2.0}]
    chart = usage_html(days)
    assert "var(--jp-layout-color3" not in chart and bar_widths(chart) == [0.0, 100.0]
