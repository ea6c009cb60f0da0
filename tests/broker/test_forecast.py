"""The demand forecast from recorded requests: the weekly pattern it finds, the quantiles,
its error measured on past weeks, and its refusal before a day of history."""

from __future__ import annotations

from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import pytest

from jupyter_gpubroker.broker.forecast import DAY_S, HOUR_S, WEEK_S, Span, forecast, spans

MONDAY = datetime(2026, 1, 5, tzinfo=timezone.utc).timestamp()


def office_weeks(weeks: int, monday_extra: float = 4.0) -> list[Span]:
    """Weekdays 09:00-17:00 a whole GPU held each hour; Mondays at 09:00 also a request
    of ``monday_extra`` GPUs that waits half an hour, then holds half an hour."""
    out = []
    for day in range(weeks * 7):
        if day % 7 >= 5:
            continue
        t0 = MONDAY + day * DAY_S
        for h in range(9, 17):
            s = t0 + h * HOUR_S
            out.append(Span(s, "gpus=1", "interactive", 1.0, s, s + HOUR_S))
        if day % 7 == 0 and monday_extra:
            s = t0 + 9 * HOUR_S
            extra = "gpus=4"
            out.append(Span(s, extra, "batch", monday_extra, s + 1800, s + HOUR_S))
    return out


def test_each_hour_of_the_week_gets_its_own_demand_held_and_waiting() -> None:
    f = forecast(office_weeks(3), MONDAY + 3 * WEEK_S)
    assert f.ready and f.basis == "hour of week"
    monday9, tuesday9, saturday9, monday3 = (f.hours[h] for h in (9, 33, 129, 3))
    assert monday9.label == "Mon 09:00-10:00" and monday9.samples == 3
    assert monday9.demand["p50"] == pytest.approx(5.0)  # 1 held + 4 for the whole hour
    assert (monday9.held["p50"], monday9.waiting["p50"]) == pytest.approx((3.0, 2.0))
    assert monday9.asked == {"batch gpus=4": 4.0, "interactive gpus=1": 1.0}
    assert tuesday9.demand["p50"] == pytest.approx(1.0)
    assert saturday9.demand["p90"] == monday3.demand["p90"] == 0.0


def test_the_p90_spans_what_the_weeks_asked_and_the_p50_their_middle() -> None:
    weeks = [office_weeks(1, extra) for extra in (1.0, 2.0, 3.0, 4.0, 10.0)]
    history = [
        Span(
            s.submitted_at + i * WEEK_S,
            s.size,
            s.job_class,
            s.gpu_equivalents,
            None if s.granted_at is None else s.granted_at + i * WEEK_S,
            s.ended_at + i * WEEK_S,
        )
        for i, week in enumerate(weeks)
        for s in week
    ]
    monday9 = forecast(history, MONDAY + 5 * WEEK_S, level=False).hours[9]  # weeks as they were
    assert monday9.samples == 5
    assert monday9.demand["p50"] == pytest.approx(1.0 + 3.0)
    assert 1.0 + 4.0 < monday9.demand["p90"] < 1.0 + 10.0


def test_its_error_is_measured_on_past_weeks_each_forecast_from_before_it() -> None:
    # two weeks of history before each week tested (the first from Monday 09:00 on)
    steady = forecast(office_weeks(5), MONDAY + 5 * WEEK_S, backtest_weeks=2)
    assert len(steady.backtest) == 2
    for week in steady.backtest:
        assert week.mean_abs_error == pytest.approx(0.0, abs=1e-9)
        assert week.p90_covered == 1.0 and week.mean_actual > 0
    # a last week with twice the office: the forecast misses by what was added
    doubled = office_weeks(4) + [
        Span(s.submitted_at, s.size, s.job_class, 1.0, s.granted_at, s.ended_at)
        for s in office_weeks(4, 0.0)
        if s.submitted_at >= MONDAY + 3 * WEEK_S
    ]
    (last,) = forecast(doubled, MONDAY + 4 * WEEK_S, backtest_weeks=1).backtest
    assert last.mean_abs_error == pytest.approx(40 / 168)  # 40 office hours, 1 GPU each
    assert last.relative_error == pytest.approx(0.5, abs=0.05)
    assert last.p90_covered < 1.0


def test_before_a_day_of_history_it_says_so_and_then_uses_the_hour_of_the_day() -> None:
    young = forecast(office_weeks(1)[:4], MONDAY + 13 * HOUR_S)  # from 09:00 on
    assert not young.ready and young.hours == ()
    assert young.message == (
        "not enough history yet: 4 hours of history, and a forecast needs a day of it"
    )
    assert forecast([], MONDAY).message.startswith("not enough history yet: no history")
    days = forecast(office_weeks(1), MONDAY + 3 * DAY_S)
    assert days.ready and days.basis == "hour of day" and days.backtest == ()
    # Monday's 09:00 and the two days after it stand for every 09:00 of the week
    assert days.hours[9].samples == days.hours[129].samples == 3
    assert days.hours[129].demand["p50"] == pytest.approx(1.0)


def test_hours_of_the_week_are_those_of_the_time_zone_asked() -> None:
    f = forecast(office_weeks(3), MONDAY + 3 * WEEK_S, tz=ZoneInfo("Europe/Berlin"))
    assert f.hours[10].demand["p50"] == pytest.approx(5.0)  # 09:00 UTC is 10:00 in Berlin


def test_a_request_never_granted_asks_what_its_size_says() -> None:
    def row(size: str, eq: float | None) -> dict[str, object]:
        granted = None if eq is None else 0.0
        return {
            "submitted_at": 0.0,
            "size": size,
            "job_class": "batch",
            "gpu_equivalents": eq,
            "granted_at": granted,
            "ended_at": 600.0,
        }

    got = spans(
        [
            row("profile=3g.40gb", None),
            row("gpus=2", None),
            row("share_gb=8", 0.1),
            row("share_gb=8", None),
            row("min_memory_gb=20", None),
        ]
    )
    assert [s.gpu_equivalents for s in got] == pytest.approx([3 / 7, 2.0, 0.1, 0.1, 1.0])
    assert [s.granted_at for s in got] == [None, None, 0.0, None, None]


def test_demand_that_grows_each_week_is_forecast_at_the_level_it_grew_to() -> None:
    """Long tasks pile up: one GPU more held all week, every week. A median of past weeks
    stays weeks behind; moved by how far the level rose since each week, it keeps up."""

    def held_all_week(week: int, gpus: float) -> Span:
        t = MONDAY + week * WEEK_S
        return Span(t, "gpus=1", "batch", gpus, t, t + WEEK_S)

    growing = [held_all_week(w, w + 1.0) for w in range(5)]  # 1, 2, 3, 4 and 5 GPUs
    now = MONDAY + 5 * WEEK_S
    plain = forecast(growing, now, level=False).hours[9]
    assert plain.demand["p50"] == pytest.approx(3.0)  # the middle of the five weeks
    moved = forecast(growing, now).hours[9]
    # each week moved up to the level of the last, plus a week's growth; the first has no
    # week before it, so its own level stands in and it is moved a week's growth less
    assert moved.samples == 5
    assert (moved.demand["p50"], moved.demand["p90"]) == pytest.approx((6.0, 6.0))
    (last,) = forecast(growing + [held_all_week(5, 6.0)], now + WEEK_S, backtest_weeks=1).backtest
    assert last.mean_abs_error == pytest.approx(0.0, abs=1e-9) and last.p90_covered == 1.0
    steady = forecast(office_weeks(5), MONDAY + 5 * WEEK_S, backtest_weeks=2)
    assert all(w.mean_abs_error == pytest.approx(0.0, abs=1e-9) for w in steady.backtest)
