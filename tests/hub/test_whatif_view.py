"""The admin page's What if in words: the replay running, and the last one's outcome as a
table and sentences, from ``GET whatif``'s answer."""

from __future__ import annotations

from typing import Any

from hub_spawner.whatif_view import changes_text, whatif_view

POLICIES = ["fcfs", "slurm", "broker"]


def figures(
    mean: float, p95: float, lost: int | None = None, cost: float | None = None, **more: Any
) -> Any:
    return {
        "held_over_used": None,
        "kernels_suspended": None,
        "days": [],
        **more,
        "requests": 1234,
        "mean_wait_s": mean,
        "p95_wait_s": p95,
        "max_wait_s": p95,
        "gpu_hours_held": 250.0,
        "kernels_lost": lost,
        "cost": cost,
        "refused": 0,
    }


def test_a_running_replay_says_what_it_replays() -> None:
    running = {"by": "carol", "since": "2026-12-07T10:00:00+00:00", "requests": None}
    state = {"running": running, "last": None, "policies": POLICIES}
    assert whatif_view(state, 0)["progress"] == "Reading the recorded requests…"
    running["requests"] = 1234
    view = whatif_view(state, 1796600000.5)
    assert view["progress"] == "Replaying 1,234 recorded requests…"
    assert (view["looked"], view["policies"], "table" in view) == (1796600000, POLICIES, False)


def test_the_last_replay_is_a_table_beside_what_happened_and_sentences() -> None:
    done = {
        "by": "carol",
        "at": "2026-12-07T10:00:05+00:00",
        "asked": {"gpus": -2, "dynamic_mig": False, "policy": None},
        "requests": 1234,
        "left_out": 3,
        "recorded": figures(600, 3000, lost=4),
        "replayed": figures(630, 3100),
        "what_if": figures(1800, 7200, held_over_used=1.5),
    }
    view = whatif_view({"running": None, "last": done, "policies": POLICIES}, 0)
    assert view["progress"] == "" and view["asked"] == done["asked"]
    assert view["table"]["columns"] == [
        "What really happened",
        "Replayed as it was",
        "Replayed with the change",
    ]
    rows = {r["label"]: r["cells"] for r in view["table"]["rows"]}
    assert rows["Mean wait"] == ["10 min", "10 min", "30 min"]
    assert rows["Kernels lost (reclaimed)"] == ["4", "not replayed", "not replayed"]
    held = rows["Held for each GPU-hour kernels were busy"]
    assert held == ["not recorded", "not recorded", "1.50 times"]
    assert "Cost" not in rows  # no prices: no cost row
    assert view["lines"] == [
        "With 2 GPUs fewer and MIG re-cutting off, the mean wait would have been 30 min "
        "instead of 10 min, and 95 in 100 requests would have waited under 2 h 00 min "
        "instead of 51 min.",
        "Replayed as it was, the 1,234 recorded requests waited 10 min on average, against "
        "10 min in fact: that is how closely the replay follows this broker.",
        "3 request(s) never granted are left out: they held nothing.",
    ]
    failed = {"by": "carol", "at": done["at"], "asked": {"gpus": -9}, "error": "it cannot lose 9"}
    view = whatif_view({"running": None, "last": failed, "policies": POLICIES}, 0)
    assert view["error"] == "The last what-if could not run: it cannot lose 9."


def day(iso: str, mean: float, held: float) -> dict[str, Any]:
    return {"day": iso, "requests": 3, "mean_wait_s": mean, "gpu_hours_held": held}


def test_the_days_are_bars_of_the_change_with_a_mark_at_what_happened() -> None:
    done = {
        "by": "carol",
        "at": "2026-12-07T10:00:05+00:00",
        "asked": {"gpus": 2},
        "requests": 6,
        "left_out": 0,
        "recorded": figures(600, 900, days=[day("2026-12-05", 1200, 10.0)]),
        "replayed": figures(630, 900, days=[day("2026-12-05", 1260, 10.0)]),
        "what_if": figures(0, 0, days=[day("2026-12-05", 0, 10.0), day("2026-12-06", 300, 5.0)]),
    }
    plot = whatif_view({"running": None, "last": done, "policies": POLICIES}, 0)["plot"]
    assert (plot["bar"], plot["days"], plot["shown"]) == ("with the change", 2, 2)
    sat, sun = plot["mean_wait_s"]
    assert (sat["key"], sat["pct"], sat["mark_pct"]) == ("Sat 5 Dec", 0.0, 100.0)
    assert sat["title"] == "0 s with the change, 20 min in fact"
    assert (sun["key"], sun["pct"], sun["mark_pct"]) == ("Sun 6 Dec", 25.0, 0.0)
    assert sun["text"] == "5 min"
    held = plot["gpu_hours_held"]
    assert [(r["pct"], r["mark_pct"]) for r in held] == [(100.0, 100.0), (50.0, 0.0)]
    del done["what_if"]  # nothing changed: the bars are the replay as it was
    month = [day(f"2026-11-{d:02}", 60, 1.0) for d in range(1, 31)] + [day("2026-12-01", 60, 1.0)]
    done["replayed"]["days"] = [day("2026-10-31", 60, 1.0), *month]
    plot = whatif_view({"running": None, "last": done, "policies": POLICIES}, 0)["plot"]
    assert (plot["bar"], plot["days"], plot["shown"]) == ("replayed as it was", 32, 31)
    assert plot["mean_wait_s"][0]["key"] == "Sun 1 Nov"  # the last month shown


def test_each_change_is_said_in_words_and_one_without_words_by_its_name() -> None:
    three = {"gpus": 3, "policy": "fcfs", "reclaim_action": "suspend"}
    assert changes_text(three) == "3 more GPUs, the fcfs policy and idle kernels suspended"
    idle = {"idle_timeout": 600, "grace": 60}
    assert changes_text(idle) == "an idle timeout of 10 min and a grace of 1 min"
    assert changes_text({"gpus": 0, "idle_timeout": 0}) == "no idle reclaim"
    assert changes_text({"gpus": 1, "warm_up_s": 600}) == "1 more GPU and warm up 10 min"
    assert changes_text({"gpus": 0, "quotas": [], "prices": {"per_gpu_hour": {}}}) == ""
