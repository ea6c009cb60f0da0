"""Time limits: declared, warned, reclaimed, extended, and the start bounds they give."""

from __future__ import annotations

import contextlib
import json
import math
import sqlite3
from collections.abc import Callable
from pathlib import Path

import hypothesis.strategies as st
import pytest
from broker_helpers import whole_inventory
from hypothesis import HealthCheck, given, settings

from jupyter_gpubroker.broker.clock import VirtualClock
from jupyter_gpubroker.broker.core import Broker, BrokerConfig
from jupyter_gpubroker.broker.migrations import MIGRATIONS, SCHEMA_VERSION
from jupyter_gpubroker.broker.models import Event, LeaseState, RequestState
from jupyter_gpubroker.broker.reclaim import Reclaimer
from jupyter_gpubroker.broker.store import Store
from jupyter_gpubroker.wire.errors import Conflict, Forbidden, InvalidRequest
from jupyter_gpubroker.wire.sizes import DURATIONS, Size
from jupyter_gpubroker.wire.text import clock as clock_text

ONE = Size(gpus=1)
HOUR = 3600.0
BrokerFactory = Callable[..., "Broker"]
LIMITS = BrokerConfig(limit_warning_s=600, limit_grace_s=60)


def test_a_lease_is_warned_before_its_limit_and_reclaimed_after_the_grace(
    make_broker: BrokerFactory, clock: VirtualClock
) -> None:
    broker = make_broker(whole_inventory(1), config=LIMITS)
    events: list[Event] = []
    broker.subscribe(events.append)
    reclaimer = Reclaimer(broker)
    r = broker.submit("ann", ONE, limit_s=HOUR)
    lease = broker.lease(broker.request(r.id).lease_id or "")
    assert (lease.limit_s, lease.ends_at) == (HOUR, lease.granted_at + HOUR)
    waiting = broker.submit("bob", ONE, limit_s=HOUR)
    clock.advance(HOUR - 601)
    assert reclaimer.step({}) == []  # no kernel is seen: the limit holds all the same
    clock.advance(1)
    (warn,) = reclaimer.step({})
    assert (warn.action, warn.cause) == ("warn", "time_limit")
    assert warn.deadline == lease.granted_at + HOUR + 60
    assert warn.reason.startswith("its time limit of 1 h 00 min ends at ")
    (event,) = [e for e in events if e.kind == "warning"]
    assert event.detail["deadline"] == warn.deadline == broker.lease(lease.id).reclaim_at
    reclaimer.keep(lease.id)  # "keep it" does not withdraw a time limit's warning
    clock.advance(600 + 59)
    assert reclaimer.step({}) == []
    clock.advance(1)
    (reclaim,) = reclaimer.step({})
    assert (reclaim.action, reclaim.cause) == ("reclaim", "time_limit")
    assert reclaim.reason == "its time limit of 1 h 00 min is up"
    assert broker.lease(lease.id).state is LeaseState.RECLAIMED
    (record,) = broker.store.reclaims()
    assert record["kind"] == "time_limit" and record["evidence"]["limit_s"] == HOUR
    assert [e.detail.get("cause") for e in events if e.kind == "reclaimed"] == ["time_limit"]
    assert broker.request(waiting.id).state is RequestState.GRANTED


def test_extend_is_granted_when_nobody_waits_and_moves_the_warning(
    make_broker: BrokerFactory, clock: VirtualClock
) -> None:
    broker = make_broker(whole_inventory(1), config=LIMITS)
    events: list[Event] = []
    broker.subscribe(events.append)
    reclaimer = Reclaimer(broker)
    r = broker.submit("ann", ONE, limit_s=HOUR)
    lease_id = broker.request(r.id).lease_id or ""
    clock.advance(HOUR - 300)
    (warn,) = reclaimer.step({})
    extended = broker.extend(lease_id, 1800, "ann")
    assert (extended.extensions, extended.ends_at) == (1, extended.granted_at + 1.5 * HOUR)
    (event,) = [e for e in events if e.kind == "extended"]
    assert event.detail == {"ends_at": extended.ends_at, "extensions": 1}
    (clear,) = reclaimer.step({})
    assert (clear.action, clear.reason) == ("clear", "its time limit was extended")
    again = make_broker(whole_inventory(1), config=LIMITS)  # a restart keeps it
    assert again.lease(lease_id).ends_at == extended.ends_at
    with pytest.raises(Forbidden, match="another user"):
        broker.extend(lease_id, 60, "bob")


def test_extend_is_refused_when_a_waiting_request_was_promised_the_gpu(
    make_broker: BrokerFactory, clock: VirtualClock
) -> None:
    broker = make_broker(whole_inventory(1), config=LIMITS)
    first = broker.submit("ann", ONE, limit_s=HOUR)
    lease = broker.lease(broker.request(first.id).lease_id or "")
    clock.advance(60)
    waiting = broker.submit("bob", ONE, limit_s=HOUR)
    (entry,) = broker.queue()
    # promised twice as far off as its worst case (promise_stretch), the lease's end
    worst = lease.granted_at + HOUR + 60
    assert entry.eta is not None and entry.eta.bound == clock.now() + 2 * (worst - clock.now())
    assert entry.eta.median <= entry.eta.bound
    with pytest.raises(Conflict) as refused:  # an extension may not use that room
        broker.extend(lease.id, 600, "ann")
    assert refused.value.message.startswith("not extended: a waiting request needs this GPU")
    assert broker.lease(lease.id).extensions == 0
    broker.release(lease.id, "ann")
    assert broker.request(waiting.id).state is RequestState.GRANTED


def test_a_request_without_a_limit_does_not_take_a_promised_gpu(
    make_broker: BrokerFactory, clock: VirtualClock
) -> None:
    """Two GPUs: one held to its limit, one free. A two-GPU request is promised both at the
    limit's end; a request that only expects to be short (backfill would let it in) may
    not take the free one meanwhile, one whose limit ends in time may."""
    broker = make_broker(whole_inventory(2), config=LIMITS)
    broker.submit("ann", ONE, limit_s=HOUR)
    pair = broker.submit("bob", Size(gpus=2), limit_s=HOUR)
    assert broker.promises.bound(pair.id) == clock.now() + 2 * (HOUR + 60)
    unlimited = broker.submit("cid", ONE, expected_duration_s=600)
    assert unlimited.state is RequestState.QUEUED
    short = broker.submit("dee", ONE, limit_s=1800)  # ends before the promise: backfills
    assert short.state is RequestState.GRANTED


def test_a_short_declared_limit_goes_ahead_of_a_peer_whose_history_is_long(
    make_broker: BrokerFactory, clock: VirtualClock
) -> None:
    """Expected service is history capped by the limit (issue 27: shorter declared work
    first, within fair share). The limit is enforced, so declaring 30 minutes to go first
    ends the lease there; an estimate (``expected_duration_s``) moves nothing, and a
    limited request does not wait behind the same user's unlimited one."""
    broker = make_broker(whole_inventory(2), config=LIMITS)
    for _ in range(3):  # ann and bob alike: each held a GPU for 8 hours, three times
        past = [broker.submit(user, ONE) for user in ("ann", "bob")]
        clock.advance(8 * HOUR)
        for r in past:
            broker.release(broker.request(r.id).lease_id or "", r.user)
    for user in ("x", "y"):
        broker.submit(user, ONE)
    bob = broker.submit("bob", ONE)
    clock.advance(60)
    claim = broker.submit("ann", ONE, expected_duration_s=600)
    assert [e.request.user for e in broker.queue()] == ["bob", "ann"]
    assert broker.expected_gpu_hours(claim) == pytest.approx(8.0)
    ann = broker.submit("ann", ONE, limit_s=HOUR / 2)  # behind her own, in her own queue
    assert broker.expected_gpu_hours(ann) == pytest.approx(0.5)
    assert [e.request.id for e in broker.queue()] == [ann.id, bob.id, claim.id]
    (held, *_) = broker.leases("x")
    broker.release(held.id, "x")
    assert broker.request(ann.id).state is RequestState.GRANTED
    assert broker.request(bob.id).state is RequestState.QUEUED


def test_a_drained_gpu_breaks_a_promise_and_its_user_is_told_the_new_one(
    make_broker: BrokerFactory, clock: VirtualClock
) -> None:
    """The GPU a promised start counted on is taken out of service: the broker says the
    promise cannot be kept, why, and the start it promises now."""
    broker = make_broker(whole_inventory(2), config=LIMITS)
    events: list[Event] = []
    broker.subscribe(events.append)
    soon = broker.submit("ann", ONE, limit_s=HOUR)
    broker.submit("bob", ONE, limit_s=4 * HOUR)
    waiting = broker.submit("cid", ONE, limit_s=HOUR)
    promised = broker.promises.bound(waiting.id)
    assert promised == clock.now() + 2 * (HOUR + 60)  # ann's GPU, at her limit
    clock.advance(60)
    broker.drain(broker.lease(soon.lease_id or "").devices[0], "drained by ada: maintenance")
    broker.tick()
    (event,) = [e for e in events if e.kind == "promise_broken"]
    now = clock.now()
    new = now + 2 * (4 * HOUR - 60 + 60)  # bob's GPU, at his limit
    assert (event.user, event.request_id) == ("cid", waiting.id)
    assert event.detail["broken_bound"] == promised
    assert event.detail["eta_bound"] == broker.promises.bound(waiting.id) == new
    assert event.detail["message"] == (
        f"The start promised by {clock_text(promised)} cannot be kept: a GPU was taken out "
        f"of service (drained by ada: maintenance). It now starts by {clock_text(new)} at "
        "the latest."
    )
    (entry,) = broker.queue()
    assert entry.eta is not None and entry.eta.bound == new
    broker.tick()
    assert len([e for e in events if e.kind == "promise_broken"]) == 1  # said once


def test_a_promise_overdue_is_said_to_be_broken_once(
    make_broker: BrokerFactory, clock: VirtualClock
) -> None:
    """A lease kept past its limit (nothing reclaims it here, as when an admin's arbiter
    keeps it) holds the promised request past its promise: the broker says so once, and
    promises nothing it could not keep."""
    config = BrokerConfig(
        limit_warning_s=600, limit_grace_s=60, lease_ttl_s=3e7, request_ttl_s=3e7, promise_stretch=1
    )
    broker = make_broker(whole_inventory(1), config=config)
    events: list[Event] = []
    broker.subscribe(events.append)
    broker.submit("ann", ONE, limit_s=HOUR)
    waiting = broker.submit("bob", ONE, limit_s=HOUR)
    promised = broker.promises.bound(waiting.id)
    assert promised == clock.now() + HOUR + 60
    clock.set(promised)
    broker.tick()
    assert not [e for e in events if e.kind == "promise_broken"]  # not late yet
    clock.advance(1)
    broker.tick()
    (event,) = [e for e in events if e.kind == "promise_broken"]
    assert event.detail["eta_bound"] is None and broker.promises.bound(waiting.id) is None
    assert event.detail["message"].endswith(
        "cannot be kept: it is still waiting, held up by an admin's action, a quota or a "
        "process still on a GPU. No start can be promised for now."
    )
    clock.advance(600)
    broker.tick()
    assert len([e for e in events if e.kind == "promise_broken"]) == 1


def test_the_extensions_of_a_class_are_capped(make_broker: BrokerFactory) -> None:
    config = BrokerConfig(max_extensions={"interactive": 2}, max_limit_s={"interactive": 4 * HOUR})
    broker = make_broker(whole_inventory(1), config=config)
    r = broker.submit("ann", ONE, limit_s=HOUR)
    lease_id = broker.request(r.id).lease_id or ""
    broker.extend(lease_id, HOUR)
    broker.extend(lease_id, HOUR)
    with pytest.raises(Conflict, match="already extended two times, the most allowed"):
        broker.extend(lease_id, HOUR)
    other = broker.submit("bob", ONE, limit_s=HOUR)
    broker.release(lease_id)
    with pytest.raises(Conflict, match="5 h 00 min in all would be longer than the 4 h 00 min"):
        broker.extend(broker.request(other.id).lease_id or "", 4 * HOUR, "bob")


@pytest.mark.parametrize(
    ("limit", "message"),
    [
        (0, f"the time limit must be {DURATIONS}, not 0"),
        (-5.0, f"the time limit must be {DURATIONS}, not -5.0"),
        (math.nan, f"the time limit must be {DURATIONS}, not nan"),
        (math.inf, f"the time limit must be {DURATIONS}, not inf"),
        (10**400, f"the time limit must be {DURATIONS}, not 1e+400"),
        (5e-324, f"the time limit must be {DURATIONS}, not 5e-324"),
        ("2h", f"the time limit must be {DURATIONS}, not '2h'"),
        (True, f"the time limit must be {DURATIONS}, not True"),
        (9 * HOUR, "the time limit of 9 h 00 min is longer than the 8 h 00 min allowed for"),
    ],
)
def test_a_bad_limit_gets_one_sentence_and_queues_nothing(
    make_broker: BrokerFactory, limit: object, message: str
) -> None:
    broker = make_broker(config=BrokerConfig(max_limit_s={"interactive": 8 * HOUR}))
    with pytest.raises(InvalidRequest) as bad:
        broker.submit("ann", ONE, limit_s=limit)  # type: ignore[arg-type]
    assert bad.value.message.startswith(message)
    assert broker.live_requests() == []


def test_defaults_required_limits_and_bad_settings(make_broker: BrokerFactory) -> None:
    required = BrokerConfig(limit_required=True, default_limit_s={"batch": 2 * HOUR})
    broker = make_broker(config=required)
    with pytest.raises(InvalidRequest, match="a time limit is required here"):
        broker.submit("ann", ONE)
    assert broker.submit("ann", ONE, job_class="batch").limit_s == 2 * HOUR
    with pytest.raises(InvalidRequest, match="'gpu' is not a job class: job classes are"):
        BrokerConfig(max_limit_s={"gpu": HOUR})
    with pytest.raises(InvalidRequest, match="limit_warning_s must be between 0 s and a year"):
        BrokerConfig(limit_warning_s=-1)
    with pytest.raises(
        InvalidRequest,
        match="class 'batch': the default time limit of 2 h 00 min is above the maximum",
    ):
        BrokerConfig(default_limit_s={"batch": 2 * HOUR}, max_limit_s={"batch": HOUR})
    with pytest.raises(
        InvalidRequest, match="max_extensions of class 'batch' must be a whole number from 0"
    ):
        BrokerConfig(max_extensions={"batch": -1})
    lease_id = broker.live_requests()[0].lease_id or ""
    with pytest.raises(InvalidRequest, match="an extension must be seconds, at least 0.001"):
        broker.extend(lease_id, 0)


def test_a_version_10_file_gets_time_limits(state_file: Path, clock: VirtualClock) -> None:
    inventory = whole_inventory(2)
    held = inventory.devices[0].uuid
    conn = sqlite3.connect(state_file)
    for script in MIGRATIONS[:10]:
        conn.executescript(script)
    conn.execute("PRAGMA user_version=10")
    conn.execute(
        "INSERT INTO requests (id, seq, user, groups, size, job_class, submitted_at, state,"
        " lease_id, expires_at) VALUES ('r-held', 1, 'ann', '[]', 'gpus=1', 'batch', 10.0,"
        " 'granted', 'l-1', 1e12)"
    )
    conn.execute(
        "INSERT INTO leases (id, request_id, user, grp, devices, gpu_equivalents, profile,"
        " granted_at, expires_at, ttl_s, expected_end, state) VALUES ('l-1', 'r-held', 'ann',"
        " '', ?, 1.0, 'gpu', 10.0, 1e12, 120.0, 1e12, 'active')",
        (json.dumps([held]),),
    )
    conn.execute("INSERT INTO allocations VALUES (?, 'l-1')", (held,))
    conn.commit()
    conn.close()
    broker = Broker(Store(state_file), inventory, clock=clock, config=LIMITS)
    assert broker.store.schema_version == SCHEMA_VERSION > 10
    old = broker.lease("l-1")
    assert (old.limit_s, old.extended_s, old.extensions, old.ends_at) == (None, 0.0, 0, None)
    assert broker.request("r-held").limit_s is None
    with pytest.raises(Conflict, match="this lease has no time limit to extend"):
        broker.extend("l-1", 60)
    r = broker.submit("bob", ONE, limit_s=HOUR)
    broker.extend(broker.request(r.id).lease_id or "", 600)
    broker.store.close()
    again = Broker(Store(state_file), inventory, clock=clock, config=LIMITS)
    lease = again.lease(again.request(r.id).lease_id or "")
    assert (again.request(r.id).limit_s, lease.extensions) == (HOUR, 1)
    assert lease.ends_at == lease.granted_at + HOUR + 600
    again.store.close()


JOB = st.tuples(
    st.floats(0, 3000),  # gap since the previous arrival
    st.sampled_from(["ann", "bob", "cid", "dee"]),
    st.integers(1, 2),  # GPUs
    st.sampled_from([None, 600.0, 1800.0, 3600.0, 7200.0]),  # its time limit
    st.floats(0.1, 1.5),  # how long it holds, as a share of its limit (past 1: reclaimed)
    st.one_of(st.none(), st.tuples(st.floats(0, 1), st.sampled_from([600.0, 1800.0]))),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(JOB, min_size=1, max_size=14))
def test_no_request_starts_after_the_first_bound_it_was_given(jobs: list[tuple]) -> None:
    """Random arrivals, limits, early releases, overruns and extensions (no admin action,
    no GPU fault): each request starts by the first bound its queue entry showed."""
    clock = VirtualClock(1_000_000.0)
    config = BrokerConfig(limit_warning_s=600, limit_grace_s=60, lease_ttl_s=3e7, request_ttl_s=3e7)
    broker = Broker(Store(), whole_inventory(3), clock=clock, config=config)
    reclaimer = Reclaimer(broker)
    starts: dict[str, float] = {}
    broker.subscribe(lambda e: e.kind == "granted" and starts.setdefault(e.request_id or "", e.at))
    broken: list[Event] = []
    broker.subscribe(lambda e: e.kind == "promise_broken" and broken.append(e))
    arrivals, t = [], clock.now()
    for gap, *job in jobs:
        t += gap
        arrivals.append((t, *job))
    plans: dict[str, tuple[float, tuple[float, float] | None]] = {}
    """Request id -> (hold share, (extend at share, by)) of what its holder does."""
    bounds: dict[str, float] = {}
    tried: set[str] = set()
    while arrivals or broker.live_requests():
        now = clock.now()
        for lease in broker.leases():
            share, extension = plans[lease.request_id]
            limit = lease.limit_s or 2 * HOUR
            if lease.granted_at + share * limit <= now:
                broker.release(lease.id)
            elif (
                extension
                and lease.id not in tried
                and lease.granted_at + extension[0] * limit <= now
            ):
                tried.add(lease.id)
                with contextlib.suppress(Conflict):
                    broker.extend(lease.id, extension[1])
        reclaimer.step({})
        while arrivals and arrivals[0][0] <= now:
            _, user, gpus, limit, share, extension = arrivals.pop(0)
            short = 600.0 if limit is None else None  # a claim backfill believes, not a limit
            r = broker.submit(user, Size(gpus=gpus), limit_s=limit, expected_duration_s=short)
            plans[r.id] = (share, extension)
        broker.tick()
        for entry in broker.queue():
            if entry.eta is not None and entry.eta.bound is not None:
                bounds.setdefault(entry.request.id, entry.eta.bound)
        for rid, bound in bounds.items():
            if rid in starts:
                assert starts[rid] <= bound + 1e-6, (rid, starts[rid], bound)
        times = [a[0] for a in arrivals[:1]] + list(bounds.values())
        for lease in broker.leases():
            share, extension = plans[lease.request_id]
            limit = lease.limit_s or 2 * HOUR
            times += [lease.granted_at + share * limit, lease.granted_at + 1]  # a first look
            if extension and lease.id not in tried:
                times.append(lease.granted_at + extension[0] * limit)
            if lease.ends_at is not None:
                times += [lease.ends_at - 600, lease.ends_at + 60]
        later = [x for x in times if x > now]
        if not later:
            assert not arrivals and not broker.live_requests(), "stuck"
            break
        clock.set(min(later))
    assert set(starts) >= set(bounds)
    assert broken == []  # nor is a kept promise ever said to be broken


def test_promised_requests_are_served_in_policy_order_while_their_promises_hold(
    make_broker: BrokerFactory, clock: VirtualClock
) -> None:
    """Both waiting requests were promised a start; when the GPU frees early the policy's
    choice (the user who has had none) goes first, since the other's promise still holds,
    rather than the first promised."""
    broker = make_broker(whole_inventory(1), config=LIMITS)
    held = broker.submit("ann", ONE, limit_s=HOUR)
    clock.advance(60)
    again = broker.submit("ann", ONE, limit_s=HOUR)
    clock.advance(60)
    fresh = broker.submit("bob", ONE, limit_s=600)
    assert broker.promises.bound(again.id) is not None
    assert broker.promises.bound(fresh.id) is not None
    clock.advance(1800)
    broker.release(broker.request(held.id).lease_id or "", "ann")
    assert broker.request(fresh.id).state is RequestState.GRANTED
    assert broker.request(again.id).state is RequestState.QUEUED
    promised = broker.promises.bound(again.id) or 0.0
    clock.advance(600)
    broker.release(broker.request(fresh.id).lease_id or "", "bob")
    assert broker.request(again.id).state is RequestState.GRANTED
    assert broker.lease(broker.request(again.id).lease_id or "").granted_at <= promised
