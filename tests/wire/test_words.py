"""The words every front shares (``wire/text.py``): holders, amounts, memory, places."""

from datetime import datetime, timezone

from jupyter_gpubroker.wire.text import (
    audit_detail,
    clock,
    devices_held,
    eta_text,
    gpu_hours,
    holder,
    memory,
    period,
    promise_broken,
    queue_place,
    quota_allows,
    size_text,
    start_estimate,
)


def test_holders_are_named_as_people_say_them() -> None:
    assert holder("server:bob") == "bob's server"
    assert holder("server:bob:gpu1") == "bob's server gpu1"
    assert holder("cli-run") == "a `jupyter gpubroker run` command"
    assert holder("0f3e9a7c-1111-2222") == "kernel 0f3e9a7c"
    assert holder("0f3e9a7c-1111", "Untitled.ipynb") == "kernel Untitled.ipynb"


def test_a_quota_and_holdings_are_things_not_fractions_of_a_gpu() -> None:
    slices = {"1g.10gb": 0.1429, "2g.20gb": 0.2857}
    assert quota_allows(0.15, slices) == "one 1g.10gb slice at a time"
    assert quota_allows(2, {}) == "two whole GPUs at a time"
    assert quota_allows(0.3, slices) == "up to two 1g.10gb slices or one 2g.20gb slice at a time"
    assert quota_allows(0.1, slices) == "0.1 GPUs' worth at a time, less than any device here"
    l40s = 46068  # MiB: 48.3 GB, lent in shares
    assert quota_allows(0.2, {}, l40s) == "up to 9 GB of a shared GPU at a time"
    assert quota_allows(0.3, slices, l40s) == (
        "up to two 1g.10gb slices, one 2g.20gb slice or up to 14 GB of a shared GPU at a time"
    )
    assert quota_allows(1, {}, l40s) == "one whole GPU at a time"
    held = [{"kind": "mig", "profile": "1g.10gb"}, {"kind": "gpu"}, {"kind": "gpu"}]
    assert devices_held(held) == "two whole GPUs and one 1g.10gb slice"
    assert devices_held([]) == "nothing"


def test_a_share_held_is_said_as_its_request_says_it_not_as_nothing() -> None:
    share = {"kind": "share", "memory_mib": 7630}  # an 8 GB share (8e9 bytes)
    assert devices_held([share]) == "8 GB of a shared GPU"
    assert devices_held([{"kind": "gpu"}, share]) == "one whole GPU and 8 GB of a shared GPU"
    two = [share, {"kind": "share", "memory_mib": 3815}]
    assert devices_held(two) == "two shares of shared GPUs, 12 GB in all"


def test_memory_is_in_gb_as_nvidia_names_devices_rounded_down_so_a_size_shown_fits() -> None:
    assert memory(9984) == "10.4 GB"  # a 1g.10gb slice of an H100 (9.75 GiB)
    assert memory(19968) == "20.9 GB"  # a 3g.20gb slice of an A100 40GB (19.5 GiB)
    assert memory(81559) == "85.5 GB"  # nvidia-smi's 81559MiB of an H100 80GB


def test_a_place_in_the_queue_is_said_once_and_counts_whoever_is_ahead() -> None:
    assert queue_place(1, 1) == "position 1 of 1, nothing ahead"
    assert queue_place(2, 2, {}) == "position 2 of 2, one request ahead"
    assert queue_place(3, 5, {"interactive": 1, "batch": 1}) == (
        "position 3 of 5, two requests ahead (1 batch, 1 interactive)"
    )
    assert start_estimate(None, 3, 0.0) == "unknown"  # no second position


def test_usage_chart_labels_are_gpu_hours_as_their_title_and_tell_amounts_apart() -> None:
    """The charts are titled GPU-hours: their labels were seconds and minutes ("ana 24 s",
    "under a second"); now each is in hours, two figures below one, so that 45 s and 4 s
    of a GPU still read apart."""
    assert [gpu_hours(h) for h in (250, 12.4, 2.54, 0.6, 0.0125, 0.0011, 1e-5, 0)] == [
        "250 h",
        "12 h",
        "2.5 h",
        "0.6 h",
        "0.013 h",
        "0.0011 h",
        "under 0.001 h",
        "none",
    ]


def test_audit_details_read_as_words_not_json() -> None:
    quota = {"share": 2.0, "max_gpus": 0.5, "gpu_hours": 100.0, "period_s": 604800.0}
    assert audit_detail(quota, "set_quota") == (
        "share 2, most GPU-equivalents at once 0.5, GPU-hours 100, per week"
    )
    moved = {"user": "bob", "job_class": "batch", "was": "interactive", "reason": "overnight"}
    assert audit_detail(moved, "set_class") == (
        "bob's request; was interactive; now batch; reason: overnight"
    )
    assert audit_detail({"user": "bob", "state": "granted", "reason": None}, "cancel") == (
        "bob's request; was granted"
    )


def test_budget_periods_are_said_as_periods() -> None:
    assert [period(s) for s in (3600, 86400, 604800, 2592000, 5400)] == [
        "hour",
        "day",
        "week",
        "30 days",
        "1 h 30 min",
    ]


def test_a_request_says_what_it_asks_for_and_when_it_may_start() -> None:
    assert size_text({"profile": "1g.10gb"}) == "1g.10gb"
    assert size_text({"gpus": 1}) == "1 GPU"
    assert size_text({"gpus": 2}) == "2 GPUs"
    assert size_text({"gpus": 2, "model": "H100-80GB"}) == "2 H100-80GB GPUs"
    assert size_text({"min_memory_gb": 20}) == "at least 20 GB"
    now = 1_700_000_000.0
    iso = lambda t: datetime.fromtimestamp(now + t, timezone.utc).isoformat()  # noqa: E731
    waiting = {
        "position": 2,
        "eta_known": True,
        "eta": iso(1200),
        "eta_range": {"low": iso(600), "high": iso(3600)},
    }
    assert eta_text(waiting, now) == f"{clock(now + 1200)} ({clock(now + 600)}-{clock(now + 3600)})"
    assert eta_text({**waiting, "eta_range": {"low": iso(-5)}}, now).endswith("(now or later)")
    assert eta_text({**waiting, "eta_known": False}, now) == "unknown"
    # on day one, what an estimate rests on is said; past holds, the usual basis, are not
    assert eta_text({**waiting, "eta_basis": "history"}, now) == eta_text(waiting, now)
    by_limits = eta_text({**waiting, "eta_basis": "time limits"}, now)
    assert by_limits == f"{eta_text(waiting, now)}, by time limits"
    usual = eta_text({**waiting, "eta_basis": "typical hold"}, now)
    assert usual.endswith(", from the usual session length")
    # a start promised from time limits comes first, the likely start after it
    promised = {**waiting, "eta_basis": "time limits", "eta_bound": iso(3600)}
    latest = f"by {clock(now + 3600)} at the latest"
    assert eta_text(promised, now) == f"{latest} (likely {clock(now + 1200)})"
    assert eta_text({**promised, "eta": iso(0)}, now) == f"any moment ({latest})"


def test_a_broken_promise_says_why_and_what_is_promised_now() -> None:
    now = 1_700_000_000.0
    why = "a GPU was taken out of service (drained by ada: maintenance)"
    said = promise_broken(now, why, now + 1800)
    assert said == (
        f"The start promised by {clock(now)} cannot be kept: {why}. "
        f"It now starts by {clock(now + 1800)} at the latest."
    )
    assert promise_broken(now, why, None).endswith("No start can be promised for now.")
