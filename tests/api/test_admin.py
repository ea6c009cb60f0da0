"""Admin operations through the API layer: each audited, each for admins only."""

from __future__ import annotations

import time
from typing import Any

import pytest

from jupyter_gpubroker.api.rules import BrokerAPI
from jupyter_gpubroker.broker.clock import VirtualClock
from jupyter_gpubroker.events import Positions, Published
from jupyter_gpubroker.wire.errors import Conflict, Forbidden, InvalidRequest, StorageFull

SLICE = {"profile": "1g.10gb"}


def seen_by(api: BrokerAPI, user: str, published: list[Any]) -> list[dict[str, Any]]:
    """The events ``user`` got, as its event stream would send them."""
    who = api.user_identity(user)
    views = (api.event(who, p) for p in published if isinstance(p, Published))
    return [v for v in views if v is not None]


def test_an_admin_cancels_another_users_requests_and_the_holder_hears_who_and_why(
    team: BrokerAPI,
) -> None:
    alice, carol = team.user_identity("alice"), team.user_identity("carol")
    held = [team.submit(alice, {**SLICE, "holder": f"nb-{i}"}) for i in range(7)]
    waiting = team.submit(alice, {**SLICE, "holder": "nb-waiting"})
    published: list[Any] = []
    team.runtime.events.subscribe(published.append)

    cancelled = team.cancel(carol, waiting["id"], "the queue is closed for maintenance")
    assert cancelled["state"] == "cancelled"
    taken = team.cancel(carol, held[0]["id"])
    assert taken["state"] == "reclaimed" and taken["lease"]["state"] == "reclaimed"

    events = {e["type"]: e["data"] for e in seen_by(team, "alice", published)}
    assert events["cancelled"]["by"] == "carol"
    assert events["cancelled"]["reason"] == (
        "cancelled by carol: the queue is closed for maintenance"
    )
    assert (events["reclaimed"]["by"], events["reclaimed"]["cause"]) == ("carol", "admin")
    (record,) = team.reclaims(carol)["reclaims"]
    assert (record["lease_id"], record["user"], record["cause"]) == (
        held[0]["lease"]["id"],
        "alice",
        "admin",
    )
    assert record["evidence"] == {"by": "carol"}

    log = team.audit(carol)["audit"]
    assert [(a["actor"], a["action"], a["target"]) for a in log] == [
        ("carol", "cancel", waiting["id"]),
        ("carol", "cancel", held[0]["id"]),
    ]
    assert log[0]["detail"] == {
        "user": "alice",
        "state": "queued",
        "reason": "the queue is closed for maintenance",
    }
    team.cancel(alice, held[1]["id"])  # her own: no admin action
    assert len(team.audit(carol)["audit"]) == 2


def test_the_audit_log_is_in_the_state_file_paged_and_filtered(start) -> None:
    traits: dict[str, Any] = {"identity": "username", "admin_users": {"carol", "dana"}}
    api = start(**traits)
    carol, dana = api.user_identity("carol"), api.user_identity("dana")
    for i in range(3):
        api.set_quota(carol, "user", f"u{i}", {"max_gpus": 1})
    api.delete_quota(dana, "user", "u0")
    api.runtime.stop()

    again = start(**traits)
    carol = again.user_identity("carol")
    first = again.audit(carol, limit="2")
    assert [a["target"] for a in first["audit"]] == ["user:u0", "user:u1"]
    rest = again.audit(carol, after=str(first["next_after"]), limit="2")
    assert [(a["actor"], a["action"], a["target"]) for a in rest["audit"]] == [
        ("carol", "set_quota", "user:u2"),
        ("dana", "delete_quota", "user:u0"),
    ]
    assert rest["next_after"] is None
    assert [a["actor"] for a in again.audit(carol, actor="dana")["audit"]] == ["dana"]
    assert again.audit(carol, since="2999-01-01T00:00:00Z")["audit"] == []


def test_a_refused_admin_action_writes_no_audit_record(team: BrokerAPI) -> None:
    alice, carol = team.user_identity("alice"), team.user_identity("carol")
    granted = team.submit(alice, SLICE)
    with pytest.raises(Conflict, match="only a waiting one changes class"):
        team.change_request(carol, granted["id"], {"job_class": "batch"})
    with pytest.raises(Forbidden, match="only admins"):
        team.change_request(alice, granted["id"], {"job_class": "batch"})
    assert team.audit(carol)["audit"] == []


def test_non_admins_and_kernel_tokens_are_refused_every_admin_operation(team: BrokerAPI) -> None:
    bob, carol = team.user_identity("bob"), team.user_identity("carol")
    kernel = team.token_identity(team.issue_token(carol, {"kernel_id": "k1"})["token"])
    assert kernel is not None
    gpu = team.devices(carol)["gpus"][0]["uuid"]
    mine = team.submit(bob, SLICE)
    for who in (bob, kernel):
        for operation, args in (
            (team.change_request, (mine["id"], {"job_class": "batch"})),
            (team.drain, (gpu, {"reason": "x"})),
            (team.undrain, (gpu,)),
            (team.reclaims, ()),
            (team.audit, ()),
        ):
            with pytest.raises(Forbidden, match="only admins"):
                operation(who, *args)


def test_a_class_change_reorders_the_queue_at_once(start) -> None:
    api = start(identity="username", admin_users={"carol"}, lease_ttl=3600, request_ttl=3600)
    alice, bob, carol = (api.user_identity(u) for u in ("alice", "bob", "carol"))
    for i in range(7):
        api.submit(alice, {**SLICE, "holder": f"nb-{i}"})
    batch = api.submit(bob, {**SLICE, "job_class": "batch"})
    urgent = api.submit(bob, {**SLICE, "job_class": "interactive"})
    published: list[Any] = []
    api.runtime.events.subscribe(published.append)

    changed = api.change_request(carol, batch["id"], {"job_class": "interactive"})
    api.change_request(carol, urgent["id"], {"job_class": "batch", "reason": "it can wait"})
    assert changed["job_class"] == "interactive"
    assert [e["id"] for e in api.queue(carol)["queue"]] == [batch["id"], urgent["id"]]
    (first, second) = [e for e in seen_by(api, "bob", published) if e["type"] == "reclassed"]
    assert (first["data"]["job_class"], first["data"]["was"], first["data"]["by"]) == (
        "interactive",
        "batch",
        "carol",
    )
    assert second["data"]["request_id"] == urgent["id"]
    assert api.request(bob, urgent["id"])["job_class"] == "batch"
    assert [a["detail"]["reason"] for a in api.audit(carol)["audit"]] == ["", "it can wait"]


def test_an_admin_drains_a_gpu_and_its_holders_are_told(team: BrokerAPI) -> None:
    alice, carol = team.user_identity("alice"), team.user_identity("carol")
    held = team.submit(alice, SLICE)
    gpu = team.devices(carol)["gpus"][0]["uuid"]
    published: list[Any] = []
    team.runtime.events.subscribe(published.append)

    state = team.drain(carol, gpu, {"reason": "replacing a fan"})
    assert state["drained"]["cause"] == "admin"
    assert state["drained"]["reason"] == "drained by carol: replacing a fan"
    assert "until an admin undrains it" in state["message"]
    (told,) = [e for e in seen_by(team, "alice", published) if e["data"].get("lease_id")]
    assert (told["type"], told["data"]["lease_id"]) == ("drained", held["lease"]["id"])
    assert team.submit(alice, SLICE)["state"] == "queued"  # nothing new is granted on it
    (shown,) = team.devices(alice)["gpus"]
    assert (
        shown["drained"]["cause"] == "admin" and shown["devices"][0]["drained"]["cause"] == "admin"
    )

    state = team.undrain(carol, gpu, "the fan is in")
    assert state == {"uuid": gpu, "drained": None, "message": f"{gpu} takes grants again"}
    assert [a["action"] for a in team.audit(carol)["audit"]] == ["drain", "undrain"]
    assert team.requests(alice)["requests"][-1]["state"] == "granted"  # it was, at once


def test_an_admin_undrain_never_lifts_a_health_drain(start) -> None:
    api = start(identity="username", admin_users={"carol"}, healthy_for=0.0)
    carol = api.user_identity("carol")
    runtime = api.runtime
    assert runtime.backend is not None and runtime.sampler is not None
    gpu = api.devices(carol)["gpus"][0]["uuid"]
    runtime.backend.simulator.inject_overheat(gpu, 95)
    runtime.sampler.sample()
    assert api.devices(carol)["gpus"][0]["drained"]["cause"] == "health"
    with pytest.raises(Conflict, match="drained by its health check .*temperature 95 C"):
        api.undrain(carol, gpu)

    # An admin's drain over it holds even once the GPU is healthy ...
    taken = api.drain(carol, gpu, {"reason": "checking the cooling"})
    assert taken["drained"]["cause"] == "admin" and "even once healthy" in taken["message"]
    # ... and, lifted while the GPU is still hot, goes back to the health check,
    handed = api.undrain(carol, gpu)
    assert handed["drained"]["cause"] == "health"
    assert "stays drained" in handed["message"] and "temperature" in handed["message"]
    # which lifts it once the GPU recovers.
    runtime.backend.simulator.clear_faults(gpu)
    runtime.sampler.sample()
    assert api.devices(carol)["gpus"][0]["drained"] is None


def test_positions_follow_the_queue_when_aging_reorders_it(start) -> None:
    """No event happens, yet the oldest request enters the oldest-first tier and moves
    ahead: its holder's stream gets its new position at the next tick."""
    always = {"name": "always", "start": "00:00", "end": "24:00"}
    api = start(
        identity="username",
        lease_ttl=3600,
        request_ttl=3600,
        policy_params={"max_wait_s": 400, "recalc_interval_s": 10},
        windows=[{**always, "weights": {"interactive": 2000, "batch": 0}}],
    )
    runtime = api.runtime
    clock = runtime.core.clock = VirtualClock(time.time())
    alice, bob, dana = (api.user_identity(u) for u in ("alice", "bob", "dana"))
    for i in range(7):
        api.submit(alice, {**SLICE, "holder": f"nb-{i}"})
    old = api.submit(bob, {**SLICE, "job_class": "batch"})
    clock.advance(100)
    api.submit(dana, SLICE)
    assert api.request(bob, old["id"])["position"] == 2
    runtime.events.positions()  # what the streams last sent
    moved: list[Positions] = []
    runtime.events.subscribe(lambda p: moved.append(p) if isinstance(p, Positions) else None)

    clock.advance(210)  # bob's request has waited 310 s, past 3/4 of max_wait_s
    runtime._tick()
    (positions,) = moved
    assert "bob" in positions.moved_users
    assert api.moved(bob, positions)["data"]["requests"][0]["position"] == 1


def test_deleting_a_quota_tells_its_user_the_defaults_are_back(team: BrokerAPI) -> None:
    carol = team.user_identity("carol")
    team.set_quota(carol, "user", "alice", {"max_gpus": 1})
    published: list[Any] = []
    team.runtime.events.subscribe(published.append)
    team.delete_quota(carol, "user", "alice")
    (event,) = seen_by(team, "alice", published)
    assert event["type"] == "quota"
    assert {k: event["data"][k] for k in ("kind", "name", "max_gpus", "share")} == {
        "kind": "user",
        "name": "alice",
        "max_gpus": None,
        "share": None,
    }


def test_quotas_show_their_budgets_spend_so_far_and_a_user_only_their_own_and_groups(
    team: BrokerAPI,
) -> None:
    """A member sees her group's quota (it holds her requests back too), with what its
    members hold now; never another user's or another group's."""
    carol, alice = team.user_identity("carol"), team.user_identity("alice")
    team.set_quota(carol, "user", "alice", {"gpu_hours": 10, "period_s": 86400})
    team.set_quota(carol, "group", "lab", {"share": 2})
    team.set_quota(carol, "group", "elsewhere", {"share": 3})
    team.set_quota(carol, "user", "carol", {"share": 3})
    team.submit(alice, SLICE)
    assert alice.groups == ("lab",)
    mine, group = sorted(team.quotas(alice)["quotas"], key=lambda q: q["kind"] != "user")
    assert (mine["name"], mine["gpu_hours"]) == ("alice", 10)
    assert 0 <= mine["spent_gpu_hours"] < 0.01  # a slice held for a moment
    assert (group["kind"], group["name"], group["share"]) == ("group", "lab", 2)
    assert group["held_gpus"] == pytest.approx(1 / 7)  # alice's slice, charged to lab
    spent = {q["name"]: q["spent_gpu_hours"] for q in team.quotas(carol)["quotas"]}
    assert spent["lab"] is None  # no budget, nothing to spend


def test_an_admin_change_and_its_audit_record_commit_together_or_not_at_all(
    team: BrokerAPI,
) -> None:
    carol = team.user_identity("carol")
    gpu = team.devices(carol)["gpus"][0]["uuid"]
    conn = team.core.store.conn
    pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
    conn.execute(f"PRAGMA max_page_count={pages}")  # the file cannot grow: as on a full disk
    done: list[str] = []
    with pytest.raises(StorageFull):
        for i in range(200):
            reason = f"full {i} " + "x" * 400
            team.drain(carol, gpu, {"reason": reason})
            done.append(reason)
    conn.execute(f"PRAGMA max_page_count={pages * 1000}")
    assert [a["detail"]["reason"] for a in team.audit(carol)["audit"]] == done
    shown = team.devices(carol)["gpus"][0]["drained"]
    assert (shown["reason"] if shown else None) == (
        f"drained by carol: {done[-1]}" if done else None
    )


def test_an_admins_drain_takes_over_a_lingering_processs(team: BrokerAPI) -> None:
    carol = team.user_identity("carol")
    (device, *_) = team.devices(carol)["gpus"][0]["devices"]
    team.core.drain(device["uuid"], "process 4242 still ran on it", cause="vacate")
    state = team.drain(carol, device["uuid"], {"reason": "checking it"})
    assert state["drained"]["cause"] == "admin"
    assert team.undrain(carol, device["uuid"])["drained"] is None


def test_a_request_a_quota_holds_back_says_whose_quota_naming_the_group(team: BrokerAPI) -> None:
    """A server held back by its group's quota was told "every 1g.10gb is in use" while
    six of the seven slices were free: the broker now says which quota, and whose."""
    carol, alice = team.user_identity("carol"), team.user_identity("alice")
    team.set_quota(carol, "group", "lab", {"max_gpus": 1 / 7})
    team.submit(alice, {**SLICE, "holder": "first"})
    waiting = team.submit(alice, {**SLICE, "holder": "second"})
    assert waiting["state"] == "queued"
    held = (
        "group lab's quota allows one 1g.10gb slice at a time and its members hold one "
        "1g.10gb slice: it starts once they give one back"
    )
    assert waiting["held_back"] == held
    (shown,) = [r for r in team.requests(alice)["requests"] if r["state"] == "queued"]
    assert shown["held_back"] == held

    team.set_quota(carol, "user", "alice", {"gpu_hours": 0.0, "period_s": 86400})  # spent
    (now_held,) = [r for r in team.requests(alice)["requests"] if r["state"] == "queued"]
    assert now_held["held_back"].startswith(
        "your budget of 0 GPU-hours per day is spent: it starts when it renews at "
    )
    admins = next(r for r in team.requests(carol)["requests"] if r["id"] == now_held["id"])
    assert admins["held_back"].startswith("alice's budget of 0 GPU-hours per day is spent")


def test_only_admins_see_the_forecast_learnt_from_the_brokers_own_history(
    team: BrokerAPI,
) -> None:
    alice, carol = team.user_identity("alice"), team.user_identity("carol")
    with pytest.raises(Forbidden, match="only admins"):
        team.forecast(alice)
    young = team.forecast(carol)
    assert not young["ready"] and young["message"].startswith("not enough history yet")
    clock = VirtualClock(time.time())
    team.runtime.core.clock.now = clock.now  # the clock the core shares with its book
    start = clock.now()
    for day in range(3):  # an hour on a slice, each day at the same time
        held = team.submit(alice, {**SLICE, "holder": f"nb-{day}"})
        clock.advance(3600)
        team.release(alice, held["lease"]["id"])
        clock.advance(23 * 3600)
    found = team.forecast(carol, weeks="2", backtest_weeks="0")
    assert found["ready"] and found["basis"] == "hour of day" and found["backtest"] == []
    assert [(a["kind"], a["on"], a["acting"]) for a in found["acting"]] == [
        ("power_saving", False, False),
        ("mig_ahead", False, False),
    ]
    team.runtime.mig_ahead = True  # without dynamic_mig: on, but it cannot cut
    said = team.forecast(carol)["acting"][1]["text"]
    assert said == "MIG slices cut ahead of the forecast: on, but none is: it needs dynamic_mig"
    team.runtime.kube_ahead = True  # listed where it is on, though not on Kubernetes
    kube = team.forecast(carol)["acting"][2]
    assert (kube["kind"], kube["on"], kube["acting"]) == ("kube_ahead", True, False)
    assert kube["text"] == (
        "GPUs kept warm on Kubernetes ahead of the forecast: on, but none is: only a broker "
        "on Kubernetes can keep GPUs warm"
    )
    team.runtime.slurm_ahead = True  # on one machine: no node to wake
    said = team.forecast(carol)["acting"][3]["text"]
    assert said == (
        "Slurm nodes woken and put to sleep ahead of the forecast: on, but none is: the "
        "inventory is not Slurm's"
    )
    busy = time.gmtime(start).tm_hour  # the hour the slice was held in (it spans two)
    demand = [h["demand"]["p50"] for h in found["hours"][:24]]
    assert sum(demand) == pytest.approx(1 / 7, abs=1e-3)  # rounded to 4 digits
    assert demand[busy] + demand[(busy + 1) % 24] == pytest.approx(1 / 7, abs=1e-3)
    with pytest.raises(InvalidRequest, match="weeks"):
        team.forecast(carol, weeks="0")


def test_a_share_a_quota_holds_back_is_said_as_the_share_held(start) -> None:
    """A share held was said as "one share slice" by the quota that holds the next back."""
    api = start(identity="username", admin_users={"carol"}, simulate="l40s-4:1", sharing="shared")
    carol, alice = api.user_identity("carol"), api.user_identity("alice")
    api.set_quota(carol, "user", "alice", {"max_gpus": 0.2})  # one 8 GB share of 48 GB
    assert api.submit(alice, {"share_gb": 8, "holder": "first"})["state"] == "granted"
    waiting = api.submit(alice, {"share_gb": 8, "holder": "second"})
    assert "your quota allows up to 9 GB of a shared GPU at a time" in waiting["held_back"]
    assert waiting["held_back"].endswith(
        "and you hold 8 GB of a shared GPU: it starts once you give one back"
    )
