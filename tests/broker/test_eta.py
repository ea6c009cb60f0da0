"""Start estimates: a range from the predictor, "unknown" when nobody can know, squeue's point."""

from __future__ import annotations

from dataclasses import replace

import pytest
from broker_helpers import FakePartitioner, make_inventory, whole_inventory

from jupyter_gpubroker.broker.core import BrokerConfig
from jupyter_gpubroker.broker.eta import (
    Calibration,
    Eta,
    continued,
    limit_starts,
    median,
    predicted,
    predicted_starts,
)
from jupyter_gpubroker.broker.policy import BrokerPolicy
from jupyter_gpubroker.broker.predictor import Predictor
from jupyter_gpubroker.wire.sizes import Size


def queue_of(broker):
    return [e.request for e in broker.queue()]


def test_the_range_adds_the_remaining_time_of_the_lease_and_the_holds_ahead(make_broker, clock):
    predictor = Predictor(half_life=1e9)
    for held in range(100, 1000, 100):  # 100 s .. 900 s: p10 100, p50 500, p90 900
        predictor.learn("ann", "", "interactive", "gpu:1", float(held))
    broker = make_broker(whole_inventory(1))
    broker.submit("ann", Size(gpus=1))
    clock.advance(50)
    bob = broker.submit("bob", Size(gpus=1))
    cy = broker.submit("cy", Size(gpus=1))
    now = clock.now()
    etas = predicted_starts(broker, queue_of(broker), predictor, now)
    # ann's lease, 50 s in: 50, 450 or 850 s more; bob then holds 100, 500 or 900 s
    # (no history of his own: everyone's interactive holds)
    assert etas[bob.id] == Eta(now + 50, now + 450, now + 850)
    assert etas[cy.id] == Eta(now + 150, now + 950, now + 1750)


def test_behind_a_lease_held_longer_than_any_before_the_eta_is_unknown(make_broker, clock):
    predictor = Predictor()
    for _ in range(5):
        predictor.learn("ann", "", "interactive", "gpu:1", 100.0)
    broker = make_broker(whole_inventory(1))
    broker.submit("ann", Size(gpus=1))
    clock.advance(3600)  # far past every hold of its kind: not "any moment now"
    bob = broker.submit("bob", Size(gpus=1))
    assert predicted_starts(broker, queue_of(broker), predictor, clock.now()) == {bob.id: None}


def test_a_memory_sized_request_gets_the_range_of_a_device_large_enough(make_broker, clock):
    predictor = Predictor(half_life=1e9)
    for held in range(100, 1000, 100):
        predictor.learn("ann", "", "interactive", "gpu:1", float(held))
    broker = make_broker(whole_inventory(1))
    broker.submit("ann", Size(gpus=1))
    clock.advance(50)
    bob = broker.submit("bob", Size(min_memory_gb=40))  # an 80 GB GPU will do, once free
    now = clock.now()
    etas = predicted_starts(broker, queue_of(broker), predictor, now)
    assert etas[bob.id] == Eta(now + 50, now + 450, now + 850)


def test_without_any_history_there_is_no_estimate(make_broker, clock):
    broker = make_broker(whole_inventory(1))
    broker.submit("ann", Size(gpus=1))
    bob = broker.submit("bob", Size(gpus=1))
    assert predicted_starts(broker, queue_of(broker), Predictor(), clock.now()) == {bob.id: None}


def test_on_day_one_a_stated_typical_hold_gives_an_estimate_that_says_so(make_broker, clock):
    hour = 3600.0
    broker = make_broker(
        whole_inventory(1), config=BrokerConfig(typical_hold_s={"interactive": hour})
    )
    broker.submit("ann", Size(gpus=1))
    bob = broker.submit("bob", Size(gpus=1))
    now = clock.now()
    # no hold has ended yet: ann's runs a quarter, one or four typical holds
    (eta,) = predicted_starts(broker, queue_of(broker), Predictor(), now).values()
    assert eta == Eta(now + hour / 4, now + hour, now + 4 * hour, None, "typical hold")
    clock.advance(5 * hour)  # longer than sessions typically run, by far: nobody knows
    assert predicted_starts(broker, queue_of(broker), Predictor(), clock.now()) == {bob.id: None}


def test_a_lease_warned_as_idle_ends_at_its_reclaim_time(make_broker, clock):
    broker = make_broker(whole_inventory(1))
    broker.submit("ann", Size(gpus=1))
    bob = broker.submit("bob", Size(gpus=1))
    (lease,) = broker.leases()
    now = clock.now()
    assert predicted_starts(broker, queue_of(broker), Predictor(), now) == {bob.id: None}
    broker.warn(lease.id, "idle", now + 300, "idle")
    (eta,) = predicted_starts(broker, queue_of(broker), Predictor(), now).values()
    assert eta == Eta(now + 300, now + 300, now + 300, None, "idle reclaim")


def test_without_history_a_time_limit_ends_the_lease_ahead_at_the_latest(make_broker, clock):
    broker = make_broker(whole_inventory(1))
    broker.submit("ann", Size(gpus=1), limit_s=1800)
    broker.submit("bob", Size(gpus=1))
    now = clock.now()
    (eta,) = predicted_starts(broker, queue_of(broker), Predictor(), now).values()
    assert (eta.low, eta.median, eta.basis) == (now, now + 1800, "time limits")


def test_squeue_start_runs_every_job_to_its_limit(make_broker, clock):
    broker = make_broker(whole_inventory(2))
    t0 = clock.now()
    broker.submit("ann", Size(gpus=1), expected_duration_s=100)
    broker.submit("ann", Size(gpus=1), expected_duration_s=300)
    clock.advance(10)
    big = broker.submit("bob", Size(gpus=2), expected_duration_s=50)
    small = broker.submit("cy", Size(gpus=1), expected_duration_s=20)
    starts = limit_starts(
        broker, queue_of(broker), lambda r: r.expected_duration_s or 0, clock.now()
    )
    assert starts[big.id] == t0 + 300
    assert starts[small.id] in (t0 + 100, t0 + 350)  # before or after big, by priority


def mig_layout_busy(make_broker, clock, dynamic=False):
    """One GPU cut 3g + 3 x 1g, every slice held to a known limit; bob waits for a 3g.
    Returns how long squeue says bob waits."""
    inv = make_inventory([("3g.40gb", "1g.10gb", "1g.10gb", "1g.10gb")])
    if dynamic:
        broker = make_broker(
            inv, config=BrokerConfig(dynamic_mig=True), partitioner=FakePartitioner(inv)
        )
    else:
        broker = make_broker(inv)
    broker.submit("ann", Size(profile="3g.40gb"), expected_duration_s=1000)
    for i in range(3):
        broker.submit("ann", Size(profile="1g.10gb"), expected_duration_s=100 * (i + 1))
    wanted = broker.submit("bob", Size(profile="3g.40gb"), expected_duration_s=10)
    starts = limit_starts(
        broker, queue_of(broker), lambda r: r.expected_duration_s or 0, clock.now()
    )
    return starts[wanted.id] - clock.now()


def test_on_a_static_mig_layout_a_profile_waits_for_a_slice_of_its_own(make_broker, clock):
    assert mig_layout_busy(make_broker, clock) == 1000


def test_with_dynamic_mig_freed_slices_can_be_cut_into_the_profile(make_broker, clock):
    # the slice never cut is free now, two 1g slices by 200 s: three compute slices
    assert mig_layout_busy(make_broker, clock, dynamic=True) == 200


def scored(calibration, starts_after_s, n=50, raw=(100.0, 200.0, 400.0)):
    """Give ``n`` requests the range ``raw`` (seconds from now) and start each
    ``starts_after_s`` later; returns the range a new request is shown then."""
    now = 0.0
    for i in range(n):
        calibration.apply({f"r{i}": Eta(*(now + x for x in raw))}, now)
        calibration.left(f"r{i}", now + starts_after_s, started=True)
        now += 1.0
    return calibration.apply({"new": Eta(*(now + x for x in raw))}, now)["new"], now


def test_a_range_that_the_starts_kept_missing_is_moved_to_where_they_started():
    eta, now = scored(Calibration(), 1000.0)  # all started far past the high end
    assert eta.median == now + 200  # the median is the predictor's
    assert eta.high == pytest.approx(now + 1000)
    assert eta.low == eta.median  # nothing ever started earlier than predicted


def test_the_range_spans_how_much_later_than_predicted_past_requests_started():
    c, now = Calibration(), 0.0
    for i in range(100):  # predicted to start in 940 s; started from 0.5x to 3x that
        c.apply({f"r{i}": Eta(now + 440, now + 940, now + 1440)}, now)
        c.left(f"r{i}", now + 440 + 25 * (37 * i % 100), started=True)  # in no order
        now += 1.0
    eta = c.apply({"new": Eta(now + 440, now + 940, now + 1440)}, now)["new"]
    assert eta is not None and eta.median == now + 940
    # about the 10th and 90th percentile of those starts, not the predictor's own range
    # widened alike on both sides
    assert 650 <= eta.low - now <= 800 and 2600 <= eta.high - now <= 2800


def test_a_range_far_wider_than_the_starts_needed_is_narrowed():
    eta, now = scored(Calibration(), 200.0)  # every start at the median
    assert now + 100 < eta.low <= now + 200 <= eta.high < now + 400


def test_calibration_never_turns_unknown_into_an_estimate_and_forgets_cancelled():
    c = Calibration(min_scores=1)
    assert c.apply({"a": None}, 0.0) == {"a": None}
    c.apply({"b": Eta(10.0, 20.0, 30.0)}, 0.0)
    c.left("b", 5000.0, started=False)  # cancelled: nothing to learn from
    assert c.apply({"c": Eta(10.0, 20.0, 30.0)}, 0.0)["c"] == Eta(10.0, 20.0, 30.0)


def test_the_queue_shows_the_range_widened_by_past_starts(make_broker, clock):
    broker = make_broker(whole_inventory(1))
    for _ in range(5):  # everyone's holds were 100 s, so the range is a point
        broker.predictor.learn("ann", "", "interactive", "gpu:1", 100.0)
    broker.predictor.learn = lambda *hold: None  # and the predictor learns nothing new
    holder = broker.submit("ann", Size(gpus=1))
    for _ in range(30):  # yet each request behind it started 900 s after its estimate
        waiting = broker.submit("bob", Size(gpus=1))
        (entry,) = broker.queue()
        assert entry.eta is not None
        clock.advance(900)
        broker.release(broker.request(holder.id).lease_id or "")
        holder = waiting
    broker.submit("cy", Size(gpus=1))
    (entry,) = broker.queue()
    assert entry.eta.median - clock.now() == pytest.approx(100)  # the predictor's
    assert entry.eta.high - clock.now() == pytest.approx(900)  # what the past showed


def learnt(broker, *holds):
    """Five past holds of one GPU for each (user, class, seconds)."""
    for user, job_class, held in holds:
        for _ in range(5):
            broker.predictor.learn(user, "", job_class, "gpu:1", held)


def test_an_arrival_that_outranks_a_waiting_request_before_its_start_delays_it(make_broker, clock):
    broker = make_broker(whole_inventory(1))
    learnt(
        broker,
        ("ann", "interactive", 7200.0),
        ("cy", "interactive", 600.0),
        ("bob", "batch", 600.0),
    )
    broker.submit("ann", Size(gpus=1))
    clock.advance(3700)  # ann's lease: 3,500 s more
    cy = broker.submit("cy", Size(gpus=1))  # interactive, in working hours: ahead of batch
    bob = broker.submit("bob", Size(gpus=1), job_class="batch")
    now, queue = clock.now(), queue_of(broker)
    etas = predicted_starts(broker, queue, broker.predictor, now)
    first = {rid: eta.median for rid, eta in etas.items() if eta is not None}
    assert first == {cy.id: now + 3500, bob.id: now + 4100}
    ends, holds = predicted(broker, broker.predictor, now)
    like_cy = [
        replace(cy, id=f"next-{i}", submitted_at=now + at) for i, at in enumerate((60, 5000))
    ]
    starts = continued(
        broker, queue, first, like_cy, lambda x: median(ends(x)), lambda r: median(holds(r)), now
    )
    # the one that comes while bob waits goes before him; the one after his start does not
    assert starts == {cy.id: now + 3500, bob.id: now + 4700}


def test_a_request_that_will_reach_the_oldest_first_tier_is_expected_first(make_broker, clock):
    broker = make_broker(
        whole_inventory(1),
        policy=BrokerPolicy(max_wait_s=2400.0),  # the tier from 1,800 s of waiting
        config=BrokerConfig(request_ttl_s=3600.0),  # the requests wait past the default
    )
    learnt(
        broker,
        ("ann", "interactive", 2000.0),
        ("bob", "batch", 600.0),
        ("cy", "interactive", 300.0),
    )
    ann = broker.submit("ann", Size(gpus=1))
    t0 = clock.now()
    clock.advance(10)
    bob = broker.submit("bob", Size(gpus=1), job_class="batch")
    clock.advance(690)
    cy = broker.submit("cy", Size(gpus=1))  # interactive: ahead of bob now
    entries = broker.queue()
    assert [e.request.id for e in entries] == [cy.id, bob.id]
    etas = {e.request.id: e.eta for e in entries}
    # bob reaches the tier before ann's GPU frees at t0 + 2000 (cy only after)
    assert etas[bob.id] is not None and etas[bob.id].median == t0 + 2000
    assert etas[cy.id] is not None and etas[cy.id].median == t0 + 2000 + 600
    clock.set(t0 + 2000)
    broker.release(broker.request(ann.id).lease_id)
    assert broker.request(bob.id).lease_id is not None  # as the estimate said
    assert broker.request(cy.id).lease_id is None


def test_requests_still_waiting_past_their_range_widen_the_next_before_they_start():
    def calibrated():
        calibration, now = Calibration(), 0.0
        for i in range(200):  # started 50 to 540 s after a 200 s median
            calibration.apply({f"r{i}": Eta(now + 100, now + 200, now + 400)}, now)
            calibration.left(f"r{i}", now + 50 + 10 * (i % 50), started=True)
            now += 1.0
        return calibration, now

    waited, now = calibrated()
    plain, _ = calibrated()
    shown = waited.apply({f"late{i}": Eta(now + 100, now + 200, now + 400) for i in range(20)}, now)
    then = max(eta.high for eta in shown.values()) + 1  # none of the 20 has started by then
    new = {"new": Eta(then + 100, then + 200, then + 400)}
    wide, narrow = waited.apply(new, then)["new"], plain.apply(new, then)["new"]
    assert wide.high - wide.low > narrow.high - narrow.low  # 20 misses, known before any start
