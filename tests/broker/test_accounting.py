"""Accounting: GPU-hours split by day and priced by profile and time-of-day band."""

from __future__ import annotations

from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import pytest
from broker_helpers import make_inventory

from jupyter_gpubroker.broker.accounting import Prices, usage
from jupyter_gpubroker.broker.clock import VirtualClock
from jupyter_gpubroker.broker.core import Broker
from jupyter_gpubroker.broker.store import Store
from jupyter_gpubroker.wire.errors import InvalidRequest
from jupyter_gpubroker.wire.sizes import Size

UTC = timezone.utc
PARIS = ZoneInfo("Europe/Paris")


def at(text: str, tz=UTC) -> float:  # type: ignore[no-untyped-def]
    return datetime.fromisoformat(text).replace(tzinfo=tz).timestamp()


def row(
    user: str, start: str, end: str, eq: float = 1.0, profile: str = "gpu", grp: str = ""
) -> dict:
    return {
        "user": user,
        "grp": grp,
        "profile": profile,
        "job_class": "interactive",
        "gpu_equivalents": eq,
        "start": at(start),
        "end": at(end),
    }


ROWS = [
    row("ann", "2024-05-15 22:00", "2024-05-16 02:00", grp="lab"),  # 4 h across midnight
    row("bob", "2024-05-16 09:00", "2024-05-16 16:00", eq=1 / 7, profile="1g.10gb"),  # 1 h
]
ALL = {"since": float("-inf"), "until": float("inf"), "tz": UTC}


def test_gpu_hours_by_user_group_profile_and_day() -> None:
    by_user = usage(ROWS, by="user", **ALL)
    assert [(r.key, round(r.gpu_hours, 6), r.cost) for r in by_user] == [
        ("ann", 4.0, None),
        ("bob", 1.0, None),
    ]
    assert {r.key: r.gpu_hours for r in usage(ROWS, by="group", **ALL)} == {"lab": 4.0, "": 1.0}
    assert {r.key for r in usage(ROWS, by="profile", **ALL)} == {"gpu", "1g.10gb"}
    days = usage(ROWS, by="day", **ALL)
    assert [(r.key, round(r.gpu_hours, 6)) for r in days] == [
        ("2024-05-15", 2.0),
        ("2024-05-16", 3.0),
    ]
    # Days are local: in Paris (UTC+2) ann's whole lease falls on the 16th.
    paris = usage(ROWS, by="day", since=float("-inf"), until=float("inf"), tz=PARIS)
    assert [(r.key, round(r.gpu_hours, 6)) for r in paris] == [("2024-05-16", 5.0)]


def test_since_and_until_clip_the_leases() -> None:
    clipped = usage(
        ROWS, by="user", since=at("2024-05-16 00:00"), until=at("2024-05-16 10:00"), tz=UTC
    )
    assert {r.key: round(r.gpu_hours, 6) for r in clipped} == {"ann": 2.0, "bob": round(1 / 7, 6)}
    with pytest.raises(InvalidRequest):
        usage(ROWS, by="user", since=2.0, until=1.0, tz=UTC)
    with pytest.raises(InvalidRequest):
        usage(ROWS, by="colour", **ALL)


def test_prices_by_profile_and_peak_and_off_peak_bands() -> None:
    prices = Prices.from_dict(
        {
            "currency": "EUR",
            "per_gpu_hour": {"gpu": 4.0, "*": 7.0},
            "bands": [
                {
                    "name": "peak",
                    "start": "08:00",
                    "end": "20:00",
                    "days": "mon-fri",
                    "factor": 1.5,
                },
                {"name": "off-peak", "start": "20:00", "end": "08:00", "factor": 0.5},
            ],
        }
    )
    costs = {r.key: r.cost for r in usage(ROWS, by="user", prices=prices, **ALL)}
    # ann: 4 GPU-hours, all off-peak at 4.0 x 0.5; bob: 1 GPU-hour at peak, 7.0 x 1.5.
    assert costs["ann"] == pytest.approx(8.0) and costs["bob"] == pytest.approx(10.5)
    # A lease across a band edge is split there: 19:00-21:00 is 1 h peak, 1 h off-peak.
    edge = usage(
        [row("cy", "2024-05-16 19:00", "2024-05-16 21:00")], by="user", prices=prices, **ALL
    )
    assert edge[0].cost == pytest.approx(4.0 * 1.5 + 4.0 * 0.5)
    # Saturday morning: peak is for weekdays, off-peak for the night: the base price.
    weekend = usage(
        [row("cy", "2024-05-18 10:00", "2024-05-18 11:00")], by="user", prices=prices, **ALL
    )
    assert weekend[0].cost == pytest.approx(4.0)
    for bad in (
        {"per_gpu_hour": {"gpu": -1}},
        {"per_gpu_hour": "4"},
        {"per_gpu_hour": {"gpu": 1}, "bands": [{"name": "x", "start": "08:00", "end": "09:00"}]},
        {"per_gpu_hour": {"gpu": 1}, "colour": "red"},
    ):
        with pytest.raises(InvalidRequest):
            Prices.from_dict(bad)
    with pytest.raises(InvalidRequest, match="no price"):
        usage(ROWS, by="user", prices=Prices({"gpu": 1.0}), **ALL)


def test_holdings_include_live_leases_up_to_now() -> None:
    clock = VirtualClock(at("2024-05-16 09:00"))
    store = Store()
    broker = Broker(store, make_inventory([None, None]), clock=clock)
    first = broker.submit("ann", Size(gpus=1))
    broker.submit("bob", Size(gpus=1), groups=["lab"])
    clock.advance(3600)
    broker.release(first.lease_id)  # type: ignore[arg-type]
    clock.advance(1800)
    rows = store.holdings(0, clock.now(), clock.now())
    got = {r.key: r.gpu_hours for r in usage(rows, by="user", since=0, until=clock.now(), tz=UTC)}
    assert got == {"bob": 1.5, "ann": 1.0}
    assert [r["job_class"] for r in rows] == ["interactive", "interactive"]


def test_holdings_read_only_the_leases_held_inside_the_window() -> None:
    """A window's holdings leave out what ended before it or began after it, and the
    usage they give is the usage of every lease clipped to the window."""
    clock = VirtualClock(at("2024-05-16 09:00"))
    store = Store()
    broker = Broker(store, make_inventory([None, None]), clock=clock)
    for user in ("early", "across", "late"):
        lease_id = broker.submit(user, Size(gpus=1)).lease_id
        clock.advance(3600)
        broker.release(lease_id)  # type: ignore[arg-type]
    broker.submit("live", Size(gpus=1))
    clock.advance(3600)
    since, until, now = at("2024-05-16 10:30"), at("2024-05-16 11:00"), clock.now()
    window = store.holdings(since, until, now)
    assert sorted(r["user"] for r in window) == ["across"]
    everything = store.holdings(float("-inf"), now, now)
    assert {r["user"] for r in everything} == {"early", "across", "late", "live"}
    for a, b in ((since, until), (at("2024-05-16 11:30"), now)):
        assert usage(store.holdings(a, b, now), by="user", since=a, until=b, tz=UTC) == usage(
            everything, by="user", since=a, until=b, tz=UTC
        )


def test_usage_is_one_query_however_many_leases_are_live() -> None:
    """The admin page asks for usage once per grouping: each is one statement, not one
    per active lease on top of a scan of the whole ledger."""
    clock = VirtualClock(at("2024-05-16 09:00"))
    store = Store()
    broker = Broker(store, make_inventory([None] * 4), clock=clock)
    for user in ("ann", "bob", "cyd", "dee"):
        broker.submit(user, Size(gpus=1))
    clock.advance(3600)
    statements: list[str] = []
    store.conn.set_trace_callback(statements.append)
    assert broker.usage(by="user") == {"ann": 1.0, "bob": 1.0, "cyd": 1.0, "dee": 1.0}
    assert len([s for s in statements if s.startswith("SELECT")]) == 1
