"""Quotas: concurrent GPU limits, GPU-hour budgets per period, validation."""

from __future__ import annotations

import pytest
from broker_helpers import mig_inventory, whole_inventory

from jupyter_gpubroker.broker.budgets import Quota
from jupyter_gpubroker.broker.clock import VirtualClock
from jupyter_gpubroker.broker.core import Broker
from jupyter_gpubroker.broker.models import RequestState
from jupyter_gpubroker.broker.store import Store
from jupyter_gpubroker.wire.errors import InvalidRequest, QuotaExceeded
from jupyter_gpubroker.wire.sizes import Size

HOUR = 3600.0
DAY = 86400.0
MIDNIGHT = 19858 * DAY  # 2024-05-16 00:00 UTC, a budget period boundary


def test_max_gpus_keeps_extra_requests_queued_while_others_are_granted(make_broker):
    broker = make_broker(whole_inventory(4))
    broker.set_quota("user", "alice", Quota(max_gpus=1))
    first = broker.submit("alice", Size(gpus=1))
    second = broker.submit("alice", Size(gpus=1))
    bob = broker.submit("bob", Size(gpus=1))
    assert first.state is RequestState.GRANTED
    assert second.state is RequestState.QUEUED  # two GPUs are free, but not for alice
    assert bob.state is RequestState.GRANTED
    assert len(broker.leases("alice")) == 1

    broker.release(first.lease_id, "alice")
    assert second.state is RequestState.GRANTED
    assert len(broker.leases("alice")) == 1


def test_max_gpus_counts_mig_slices_in_gpu_equivalents(make_broker):
    broker = make_broker(mig_inventory(gpus=1))
    broker.set_quota("user", "alice", Quota(max_gpus=3 / 7))
    got = [broker.submit("alice", Size(profile="1g.10gb")) for _ in range(4)]
    assert [r.state for r in got].count(RequestState.GRANTED) == 3


def test_group_max_gpus_limits_its_members_together(make_broker):
    broker = make_broker(whole_inventory(4))
    broker.set_quota("group", "physics", Quota(max_gpus=2))
    a = broker.submit("alice", Size(gpus=1), groups=["physics"])
    b = broker.submit("bob", Size(gpus=1), groups=["physics"])
    c = broker.submit("carol", Size(gpus=1), groups=["physics"])
    d = broker.submit("carol", Size(gpus=1), groups=["chem"])
    assert [r.state for r in (a, b, c, d)] == [
        RequestState.GRANTED,
        RequestState.GRANTED,
        RequestState.QUEUED,
        RequestState.GRANTED,
    ]


def test_a_request_larger_than_the_quota_is_refused_at_submit(make_broker):
    broker = make_broker(whole_inventory(4))
    broker.set_quota("user", "alice", Quota(max_gpus=1))
    with pytest.raises(QuotaExceeded, match="asks for 2 GPU-equivalents.*at most 1") as info:
        broker.submit("alice", Size(gpus=2))
    assert info.value.status == 403
    assert broker.store.live_requests() == []
    assert broker.submit("bob", Size(gpus=2)).state is RequestState.GRANTED


def test_raising_a_quota_lets_a_waiting_request_go(make_broker):
    broker = make_broker(whole_inventory(2))
    broker.set_quota("user", "alice", Quota(max_gpus=1))
    broker.submit("alice", Size(gpus=1))
    waiting = broker.submit("alice", Size(gpus=1))
    assert waiting.state is RequestState.QUEUED
    broker.set_quota("user", "alice", Quota(max_gpus=2))
    broker.tick()
    assert waiting.state is RequestState.GRANTED


def test_deleting_a_quota_lifts_it(make_broker):
    broker = make_broker(whole_inventory(2))
    broker.set_quota("user", "alice", Quota(max_gpus=1))
    assert broker.quotas() == {("user", "alice"): Quota(max_gpus=1)}
    broker.delete_quota("user", "alice")
    assert broker.quotas() == {}
    assert broker.submit("alice", Size(gpus=2)).state is RequestState.GRANTED


@pytest.fixture
def budget_broker(store):
    clock = VirtualClock(MIDNIGHT + 8 * HOUR)
    broker = Broker(store, whole_inventory(2), clock=clock)
    broker.set_quota("user", "alice", Quota(gpu_hours=2, period_s=DAY))
    return broker, clock


def test_exhausted_gpu_hour_budget_refuses_submits_until_next_period(budget_broker):
    broker, clock = budget_broker
    r = broker.submit("alice", Size(gpus=2))
    clock.advance(HOUR)  # 2 GPUs for one hour: the whole budget
    broker.release(r.lease_id)
    with pytest.raises(QuotaExceeded, match="2 GPU-hour budget"):
        broker.submit("alice", Size(gpus=1))
    assert broker.submit("bob", Size(gpus=1)).state is RequestState.GRANTED
    clock.set(MIDNIGHT + DAY)  # the next day: a fresh budget
    assert broker.submit("alice", Size(gpus=1)).state is RequestState.GRANTED


def test_a_live_lease_spends_the_budget_and_holds_back_queued_requests(budget_broker):
    broker, clock = budget_broker
    broker.submit("alice", Size(gpus=1))
    queued = broker.submit("alice", Size(gpus=2))
    assert queued.state is RequestState.QUEUED  # no room
    clock.advance(2 * HOUR)  # the live lease alone spent 2 GPU-hours
    with pytest.raises(QuotaExceeded):
        broker.submit("alice", Size(gpus=1))
    broker.release(broker.leases("alice")[0].id)
    assert queued.state is RequestState.QUEUED, "the budget is spent: nothing more is granted"


def test_the_spend_so_far_counts_ended_and_live_leases_of_this_period(budget_broker):
    broker, clock = budget_broker
    assert broker.budget_spent("user", "alice") == 0.0
    assert broker.budget_spent("user", "bob") is None  # no budget
    done = broker.submit("alice", Size(gpus=1))
    clock.advance(HOUR / 2)
    broker.release(done.lease_id)
    broker.submit("alice", Size(gpus=1))
    clock.advance(HOUR / 4)
    assert broker.budget_spent("user", "alice") == pytest.approx(0.75)
    clock.set(MIDNIGHT + DAY + HOUR)  # the next period: only the live lease's hour there
    assert broker.budget_spent("user", "alice") == pytest.approx(1.0)


def test_a_budget_set_mid_period_counts_what_was_already_spent(make_broker, clock):
    broker = make_broker(whole_inventory(2))
    r = broker.submit("alice", Size(gpus=1))
    clock.advance(3 * HOUR)
    broker.release(r.lease_id)
    broker.set_quota("user", "alice", Quota(gpu_hours=2, period_s=DAY))
    with pytest.raises(QuotaExceeded):
        broker.submit("alice", Size(gpus=1))


def test_a_restart_remembers_the_budget_spent_in_a_long_period(state_file):
    # A 30-day budget outlives the ten fair-share half-lives the restart replays.
    clock = VirtualClock(MIDNIGHT - (MIDNIGHT % (30 * DAY)))
    broker = Broker(Store(state_file), whole_inventory(1), clock=clock)
    broker.set_quota("user", "alice", Quota(gpu_hours=10, period_s=30 * DAY))
    r = broker.submit("alice", Size(gpus=1))
    clock.advance(10 * HOUR)
    broker.release(r.lease_id)
    clock.advance(20 * DAY)
    with pytest.raises(QuotaExceeded):
        broker.submit("alice", Size(gpus=1))
    again = Broker(Store(state_file), whole_inventory(1), clock=clock)
    with pytest.raises(QuotaExceeded):
        again.submit("alice", Size(gpus=1))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"share": 0},
        {"share": -1},
        {"max_gpus": -1},
        {"max_gpus": float("inf")},
        {"max_gpus": float("nan")},
        {"max_gpus": True},
        {"share": "1"},
        {"gpu_hours": 10},  # no period
        {"period_s": DAY},  # no budget
        {"gpu_hours": 10, "period_s": 0},
        {"gpu_hours": 10, "period_s": 1e-300},  # budget periods would overflow
        {"gpu_hours": 10, "period_s": 59},
        {"gpu_hours": 10, "period_s": 1e300},
        {"share": 1e-300},  # fair-share factors would divide by zero
        {"share": 1e300},
        {"max_gpus": 10**400},  # beyond any float
        {"gpu_hours": float("inf"), "period_s": DAY},
    ],
)
def test_bad_quotas_are_invalid_requests(kwargs):
    with pytest.raises(InvalidRequest):
        Quota(**kwargs)


def test_a_bad_quota_says_what_is_wrong_with_each_field():
    with pytest.raises(InvalidRequest) as bad:
        Quota(share=0, max_gpus=-1, gpu_hours=5, period_s=DAY)
    assert set(bad.value.fields) == {"share", "max_gpus"}
    assert "share must be a number from 0.001" in bad.value.fields["share"]
    assert bad.value.message == "; ".join(bad.value.fields.values())
    with pytest.raises(InvalidRequest) as half:
        Quota(gpu_hours=5)
    assert half.value.fields == {"period_s": "a GPU-hour budget needs both gpu_hours and period_s"}


def test_set_quota_validates_kind_and_name(make_broker):
    broker = make_broker()
    with pytest.raises(InvalidRequest, match="kind"):
        broker.set_quota("team", "alice", Quota(share=2))
    with pytest.raises(InvalidRequest, match="control characters and line breaks"):
        broker.set_quota("user", "not\ta name", Quota(share=2))
    assert broker.store.quotas() == []


def test_quotas_are_stored(make_broker):
    broker = make_broker()
    broker.set_quota("group", "physics", Quota(share=3, gpu_hours=100, period_s=DAY))
    (row,) = broker.store.quotas()
    assert (row["kind"], row["name"], row["share"], row["gpu_hours"]) == (
        "group",
        "physics",
        3,
        100,
    )


def test_a_refused_quota_writes_nothing_and_the_broker_goes_on(make_broker):
    broker = make_broker()
    with pytest.raises(InvalidRequest, match="period_s"):
        broker.set_quota("user", "alice", Quota(gpu_hours=1, period_s=1e-300))
    assert broker.store.quotas() == [] and broker.quotas() == {}
    assert broker.submit("alice", Size(gpus=1)).state is RequestState.GRANTED


def test_a_stored_quota_no_later_step_could_use_is_ignored_at_restart(state_file, clock, caplog):
    """Written by a version that let it through, it must not keep the broker from starting."""
    first = Broker(Store(state_file), whole_inventory(1), clock=clock)
    first.set_quota("user", "bob", Quota(max_gpus=2))
    with first.store.transaction():
        first.store.upsert_quota(
            "user", "alice", {"share": None, "max_gpus": None, "gpu_hours": 1, "period_s": 1e-300}
        )
    first.store.close()
    again = Broker(Store(state_file), whole_inventory(1), clock=clock)
    assert again.quotas() == {("user", "bob"): Quota(max_gpus=2)}
    assert "ignoring the stored quota of user 'alice'" in caplog.text
    assert again.submit("alice", Size(gpus=1)).state is RequestState.GRANTED


def test_a_changed_share_is_counted_in_every_users_normalized_share(make_broker, clock):
    """Fair share orders and preempts by each user's share over the sum of everyone's
    shares: raising one user's share lowers the others' part at the next ranking."""
    broker = make_broker()
    for user in ("alice", "bob"):
        broker.submit(user, Size(gpus=1))
    clock.advance(60)
    broker.tick()
    assert broker.ledger.norm_share(("user", "bob")) == pytest.approx(0.5)
    broker.set_quota("user", "bob", Quota(share=3))
    assert broker.ledger.norm_share(("user", "bob")) == pytest.approx(0.75)
    assert broker.ledger.norm_share(("user", "alice")) == pytest.approx(0.25)
