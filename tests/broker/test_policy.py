"""Who goes next: fair share, shares, time-of-day windows, Slurm's age factor, FCFS."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

import pytest
from broker_helpers import WEDNESDAY_10AM, whole_inventory

from jupyter_gpubroker.broker.budgets import Quota
from jupyter_gpubroker.broker.models import JobClass, Request, RequestState
from jupyter_gpubroker.broker.policy import (
    BrokerPolicy,
    FcfsPolicy,
    SlurmPolicy,
    Window,
    make_policy,
)
from jupyter_gpubroker.wire.errors import InvalidRequest
from jupyter_gpubroker.wire.sizes import Size

HOUR = 3600.0


def utc(*args: int) -> float:
    return datetime(*args, tzinfo=timezone.utc).timestamp()


def order(broker) -> list[str]:
    """Users of the waiting requests, best first."""
    return [e.request.user for e in broker.queue()]


@dataclass
class FlatContext:
    """A policy context where everybody is alike."""

    share: float = 1.0
    hours: float = 1.0
    fraction: float = 0.25
    oldest: float | None = None

    def fairshare(self, user: str, group: str) -> float:
        return self.share

    def expected_gpu_hours(self, request: Request) -> float:
        return self.hours

    def size_fraction(self, request: Request) -> float:
        return self.fraction

    def oldest_submitted_at(self) -> float | None:
        return self.oldest


def req(submitted_at: float, job_class: JobClass = JobClass.INTERACTIVE, user="u") -> Request:
    return Request("r-x", user, (), Size(gpus=1), job_class, submitted_at)


# ---------------------------------------------------------------- fair share


def test_heavy_past_usage_ranks_below_a_fresh_user(make_broker, clock):
    broker = make_broker(whole_inventory(1))
    first = broker.submit("alice", Size(gpus=1))
    clock.advance(10 * HOUR)
    again = broker.submit("alice", Size(gpus=1))  # older than carol's
    clock.advance(60)
    fresh = broker.submit("carol", Size(gpus=1))
    assert order(broker) == ["carol", "alice"]
    assert broker.fairshare("carol", "") == 1.0 > broker.fairshare("alice", "")

    broker.release(first.lease_id, "alice")
    assert fresh.state is RequestState.GRANTED
    assert again.state is RequestState.QUEUED


def test_fcfs_ignores_usage(make_broker, clock):
    broker = make_broker(whole_inventory(1), policy=FcfsPolicy())
    first = broker.submit("alice", Size(gpus=1))
    clock.advance(10 * HOUR)
    again = broker.submit("alice", Size(gpus=1))
    clock.advance(60)
    broker.submit("carol", Size(gpus=1))
    broker.release(first.lease_id, "alice")
    assert again.state is RequestState.GRANTED


def test_shares_change_the_order(make_broker, clock):
    broker = make_broker(whole_inventory(2))
    for user in ("alice", "bob"):
        broker.submit(user, Size(gpus=1))
    clock.advance(5 * HOUR)  # both used 5 GPU-hours
    broker.submit("alice", Size(gpus=1))
    clock.advance(1)
    broker.submit("bob", Size(gpus=1))
    assert order(broker) == ["alice", "bob"]  # equal usage: the older request first

    broker.set_quota("user", "bob", Quota(share=10))
    assert order(broker) == ["bob", "alice"]
    assert broker.fairshare("bob", "") > broker.fairshare("alice", "")

    broker.set_quota("user", "alice", Quota(share=100))
    assert order(broker) == ["alice", "bob"]


def test_group_share_counts_for_its_members(make_broker, clock):
    broker = make_broker(whole_inventory(2))
    broker.submit("alice", Size(gpus=1), groups=["physics"])
    broker.submit("bob", Size(gpus=1), groups=["chem"])
    clock.advance(5 * HOUR)
    broker.submit("alice", Size(gpus=1), groups=["physics"])
    clock.advance(1)
    broker.submit("bob", Size(gpus=1), groups=["chem"])
    assert order(broker) == ["alice", "bob"]
    broker.set_quota("group", "chem", Quota(share=20))
    assert order(broker) == ["bob", "alice"]


# ---------------------------------------------------------------- time-of-day windows


def test_interactive_goes_first_during_working_hours(make_broker, clock):
    broker = make_broker(whole_inventory(1))
    holder = broker.submit("x", Size(gpus=1))
    batch = broker.submit("bob", Size(gpus=1), job_class="batch")
    clock.advance(60)
    interactive = broker.submit("alice", Size(gpus=1), job_class="interactive")
    assert order(broker) == ["alice", "bob"]
    broker.release(holder.lease_id)
    assert interactive.state is RequestState.GRANTED and batch.state is RequestState.QUEUED


NIGHT_AND_DAY = (
    {"name": "day", "start": "08:00", "end": "19:00", "days": "mon-fri",
     "weights": {"interactive": 2000, "batch": 0}},
    {"name": "night", "start": "22:00", "end": "06:00",
     "weights": {"interactive": 0, "batch": 2000}},
)  # fmt: skip


@pytest.mark.parametrize(
    ("when", "first"),
    [
        (utc(2024, 5, 15, 10), "alice"),  # Wednesday morning: interactive
        (utc(2024, 5, 15, 23), "bob"),  # Wednesday night: batch
        (utc(2024, 5, 16, 3), "bob"),  # past midnight, still the night window
    ],
)
def test_configured_windows_put_batch_first_at_night(make_broker, clock, when, first):
    clock.set(when)
    windows = tuple(Window.from_dict(d) for d in NIGHT_AND_DAY)
    broker = make_broker(whole_inventory(1), policy=BrokerPolicy(windows=windows))
    holder = broker.submit("x", Size(gpus=1))
    batch = broker.submit("bob", Size(gpus=1), job_class="batch")
    interactive = broker.submit("alice", Size(gpus=1), job_class="interactive")
    assert order(broker)[0] == first
    broker.release(holder.lease_id)
    winner = interactive if first == "alice" else batch
    assert winner.state is RequestState.GRANTED


def test_no_window_in_force_means_no_class_weight():
    windows = tuple(Window.from_dict(d) for d in NIGHT_AND_DAY)
    policy = BrokerPolicy(windows=windows)
    assert policy.class_weights(utc(2024, 5, 18, 10)) == {}  # Saturday morning
    assert policy.class_weights(utc(2024, 5, 18, 23))["batch"] == 2000.0


def test_windows_follow_the_configured_time_zone():
    # 14:00 UTC is 10:00 in New York (EDT): working hours there; 03:00 UTC is 23:00.
    policy = BrokerPolicy(timezone="America/New_York")
    assert policy.class_weights(utc(2024, 5, 15, 14)) == {"interactive": 500.0, "batch": 0.0}
    assert policy.class_weights(utc(2024, 5, 16, 3)) == {"interactive": 500.0, "batch": 500.0}
    utc_policy = BrokerPolicy()
    assert utc_policy.class_weights(utc(2024, 5, 16, 3)) == {"interactive": 500.0, "batch": 500.0}
    assert utc_policy.class_weights(utc(2024, 5, 15, 12)) == {"interactive": 500.0, "batch": 0.0}


def test_default_windows_treat_weekends_as_off_hours():
    policy = BrokerPolicy()
    saturday_noon = utc(2024, 5, 18, 12)
    assert policy.class_weights(saturday_noon) == {"interactive": 500.0, "batch": 500.0}


def test_window_wrapping_past_midnight_belongs_to_the_day_it_started():
    fri_night = Window.from_dict({"name": "n", "start": "22:00", "end": "06:00", "days": "fri"})
    assert fri_night.contains(datetime(2024, 5, 17, 23, 0))  # Friday 23:00
    assert fri_night.contains(datetime(2024, 5, 18, 5, 59))  # Saturday 05:59
    assert not fri_night.contains(datetime(2024, 5, 18, 6, 0))  # Saturday 06:00
    assert not fri_night.contains(datetime(2024, 5, 17, 3, 0))  # Friday 03:00 is Thursday's
    assert not fri_night.contains(datetime(2024, 5, 18, 23, 0))  # Saturday night


def test_window_day_ranges_wrap_around_the_week():
    w = Window.from_dict({"name": "w", "start": "0", "end": "24", "days": "fri-mon"})
    assert w.days == frozenset({4, 5, 6, 0})
    w = Window.from_dict({"name": "w", "start": "9", "end": "17", "days": "Mon, Wed"})
    assert w.days == frozenset({0, 2})
    assert w.start_hour == 9 and w.end_hour == 17
    half = Window.from_dict({"name": "h", "start": "08:30", "end": "17:45"})
    assert (half.start_hour, half.end_hour) == (8.5, 17.75)


@pytest.mark.parametrize(
    "d",
    [
        {"start": "08:00", "end": "18:00"},  # no name
        {"name": "x", "end": "18:00"},  # no start
        {"name": "x", "start": "8am", "end": "18:00"},
        {"name": "x", "start": "25:00", "end": "18:00"},
        {"name": "x", "start": "-1:00", "end": "18:00"},
        {"name": "x", "start": "08:00", "end": "24:30"},
        {"name": "x", "start": "09:75", "end": "18:00"},  # no such minute
        {"name": "x", "start": "-0:30", "end": "18:00"},
        {"name": "x", "start": "08:-30", "end": "18:00"},
        {"name": "x", "start": "8.5", "end": "18:00"},
        {"name": "x", "start": "08:00", "end": "18:00", "weights": {"gpu": 1}},
        {"name": "x", "start": "08:00", "end": "18:00", "weights": {"batch": "lots"}},
        {"name": "x", "start": "08:00", "end": "18:00", "weights": {"batch": "nan"}},
        {"name": "x", "start": "08:00", "end": "18:00", "weights": [1, 2]},
        "day",
        None,
    ],
)
def test_bad_window_dicts_are_invalid_requests(d):
    with pytest.raises(InvalidRequest):
        Window.from_dict(d)


@pytest.mark.parametrize("days", ["mon-xyz", "weekdays", "monday", "mon--fri", "1-5", ""])
def test_bad_day_ranges_are_invalid_requests(days):
    with pytest.raises(InvalidRequest, match="day range"):
        Window.from_dict({"name": "x", "start": "8", "end": "18", "days": days})


@pytest.mark.parametrize("tz", ["Mars/Olympus_Mons", "", "../etc/passwd", "UTC+25"])
def test_unknown_time_zones_are_invalid_requests(tz):
    with pytest.raises(InvalidRequest, match="time zone"):
        BrokerPolicy(timezone=tz)


# ---------------------------------------------------------------- Slurm


def test_slurm_age_factor_saturates_at_max_age():
    policy = SlurmPolicy(weight_fairshare=0, weight_size=0, max_age_s=7 * 86400)
    ctx = FlatContext()
    now = 100 * 86400.0
    at = [policy.priority(req(now - age), ctx, now) for age in (0, 3.5 * 86400, 7 * 86400)]
    assert at == pytest.approx([0, 500, 1000])
    assert policy.priority(req(now - 30 * 86400), ctx, now) == pytest.approx(1000)
    assert policy.priority(req(now + 60), ctx, now) == 0  # clock skew never goes negative


def test_slurm_prefers_large_jobs_unless_told_to_favor_small():
    ctx_big, ctx_small = FlatContext(fraction=1.0), FlatContext(fraction=0.125)
    p = SlurmPolicy()
    assert p.priority(req(0), ctx_big, 0) > p.priority(req(0), ctx_small, 0)
    p = SlurmPolicy(favor_small=True)
    assert p.priority(req(0), ctx_big, 0) < p.priority(req(0), ctx_small, 0)


def test_slurm_fair_share_weight():
    p = SlurmPolicy(weight_age=0, weight_size=0)
    assert p.priority(req(0), FlatContext(share=0.25), 0) == pytest.approx(250)


def test_broker_policy_max_wait_tier_outranks_everything():
    p = BrokerPolicy(max_wait_s=2 * HOUR, tier_fraction=0.5)
    ctx = FlatContext()
    now = WEDNESDAY_10AM
    young = p.priority(req(now - HOUR + 1, JobClass.INTERACTIVE), ctx, now)
    old_batch = p.priority(req(now - HOUR, JobClass.BATCH), FlatContext(share=0.0), now)
    older = p.priority(req(now - HOUR - 1, JobClass.BATCH), FlatContext(share=0.0), now)
    assert old_batch > young + 1e8
    assert older > old_batch  # oldest first within the tier


def test_past_the_bound_the_oldest_request_still_outranks_fresh_ones():
    # The oldest request waited 40 h, past the 24 h bound: the tier is off for the
    # backlog, but the oldest itself, past 1.5 times the bound, still ranks first (it
    # gets the backfill reservation), however spent its user's share; the next oldest
    # does not.
    p = BrokerPolicy()
    now = WEDNESDAY_10AM
    ctx = FlatContext(share=0.0, oldest=now - 40 * HOUR)
    fresh = p.priority(req(now), FlatContext(share=1.0, oldest=now - 40 * HOUR), now)
    assert p.priority(req(now - 40 * HOUR, JobClass.BATCH), ctx, now) > fresh + 1e8
    assert p.priority(req(now - 39 * HOUR, JobClass.BATCH), ctx, now) < fresh
    # before 36 h the oldest is not promoted while the bound is broken
    early = FlatContext(share=0.0, oldest=now - 35 * HOUR)
    assert p.priority(req(now - 35 * HOUR, JobClass.BATCH), early, now) < fresh


# ---------------------------------------------------------------- make_policy


def test_make_policy_builds_each_policy_with_overrides():
    assert isinstance(make_policy("fcfs"), FcfsPolicy)
    slurm = make_policy("slurm", half_life_s=3600.0)
    assert isinstance(slurm, SlurmPolicy) and slurm.half_life_s == 3600.0
    broker = make_policy("broker", timezone="Europe/Berlin", max_wait_s=None)
    assert isinstance(broker, BrokerPolicy) and broker.max_wait_s is None


def test_make_policy_names_the_choices_for_an_unknown_policy():
    with pytest.raises(InvalidRequest, match="unknown policy 'lottery'.*fcfs, slurm, broker"):
        make_policy("lottery")


@pytest.mark.parametrize(
    ("name", "params", "match"),
    [
        ("fcfs", {"weight_age": 1.0}, "policy 'fcfs' has no parameter weight_age"),
        ("slurm", {"windows": ()}, "policy 'slurm' has no parameter windows"),
        ("broker", {"half_life_s": "7d"}, "the broker policy's half_life_s must be 0 or a"),
        ("broker", {"weight_service": 10**400}, "weight_service must be .*, not 1e\\+400"),
        ("slurm", {"favor_small": 1}, "the slurm policy's favor_small is true or false"),
        ("slurm", {"backfill_depth": 2.5}, "backfill_depth must be a whole number"),
        ("broker", {"reference_gpu_hours": 0}, "reference_gpu_hours must be positive"),
        ("broker", {"placement": "worst_fit"}, "placement"),
        ("broker", {"half_life_s": 0}, "half_life_s"),
        ("slurm", {"recalc_interval_s": -1}, "recalc_interval_s"),
        ("broker", {"entry_penalty_s": -1}, "entry_penalty_s"),
        ("broker", {"max_wait_s": 0}, "max_wait_s"),
        ("broker", {"tier_fraction": 0}, "tier_fraction"),
        ("broker", {"head_fraction": 0}, "head_fraction"),
        ("fcfs", {"backfill_depth": -1}, "backfill_depth"),
        ("broker", {"timezone": "Nowhere/Land"}, "time zone"),
    ],
)
def test_make_policy_refuses_bad_parameters(name, params, match):
    with pytest.raises(InvalidRequest, match=match):
        make_policy(name, **params)


# ---------------------------------------------------------------- FCFS


def test_fcfs_strict_stops_at_a_blocked_head(make_broker, clock):
    broker = make_broker(whole_inventory(2), policy=FcfsPolicy())
    holder = broker.submit("alice", Size(gpus=1), expected_duration_s=10 * HOUR)
    clock.advance(1)
    big = broker.submit("bob", Size(gpus=2))
    clock.advance(1)
    # short enough to backfill under any other policy
    small = broker.submit("carol", Size(gpus=1), expected_duration_s=60)
    assert big.state is RequestState.QUEUED
    assert small.state is RequestState.QUEUED, "strict FCFS must not let carol pass bob"
    assert len(broker.holders()) == 1  # one GPU stays idle
    assert [e.request.user for e in broker.queue()] == ["bob", "carol"]

    broker.release(holder.lease_id)
    assert big.state is RequestState.GRANTED
    assert small.state is RequestState.QUEUED


def test_the_same_queue_backfills_under_the_slurm_policy(make_broker, clock):
    broker = make_broker(whole_inventory(2), policy=SlurmPolicy())
    broker.submit("alice", Size(gpus=1), expected_duration_s=10 * HOUR)
    clock.advance(1)
    broker.submit("bob", Size(gpus=2))
    clock.advance(1)
    small = broker.submit("carol", Size(gpus=1), expected_duration_s=60)
    assert small.state is RequestState.GRANTED


def test_fcfs_takes_devices_in_inventory_order(make_broker, clock):
    broker = make_broker(whole_inventory(3), policy=FcfsPolicy())
    leases = [broker.lease(broker.submit(u, Size(gpus=1)).lease_id) for u in ("a", "b", "c")]
    assert [lease.devices for lease in leases] == [(d.uuid,) for d in whole_inventory(3).devices]
