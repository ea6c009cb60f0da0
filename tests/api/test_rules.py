"""The API's rules called without HTTP: who is an admin, who sees and does what."""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from jupyter_gpubroker.api.identity import Identity
from jupyter_gpubroker.api.rules import BrokerAPI
from jupyter_gpubroker.broker.reclaim import Decision
from jupyter_gpubroker.wire.errors import Conflict, Forbidden, InvalidRequest, Unsatisfiable

SLICE = {"profile": "1g.10gb"}


def test_on_a_multi_user_server_only_the_named_admins_are_admins(team: BrokerAPI) -> None:
    assert team.user_identity("carol").admin
    assert not team.user_identity("alice").admin
    owner = team.user_identity("root-owner")  # the OS user running the server: nobody special
    assert not owner.admin
    with pytest.raises(Forbidden, match="only admins change quotas"):
        team.set_quota(owner, "user", "alice", {"max_gpus": 1})


def test_on_a_single_user_server_every_caller_is_the_owner_and_its_admin(start) -> None:
    api = start(owner="dana")
    who = api.user_identity("anyone-the-token-names")
    assert (who.user, who.admin) == ("dana", True)
    assert api.set_quota(who, "user", "dana", {"max_gpus": 1})["max_gpus"] == 1


def test_a_request_names_its_holder_and_owner_is_its_old_name(team: BrokerAPI) -> None:
    """``holder`` names who holds a request; ``owner``, its old name, is still accepted and
    answered (the same value) for one release; two different ones are refused."""
    alice = team.user_identity("alice")
    held = team.submit(alice, {**SLICE, "holder": "nb-1"})
    assert (held["holder"], held["owner"]) == ("nb-1", "nb-1")
    old = team.submit(alice, {**SLICE, "owner": "nb-2"})
    assert (old["holder"], old["owner"]) == ("nb-2", "nb-2")
    same = team.submit(alice, {**SLICE, "holder": "nb-3", "owner": "nb-3"})
    assert same["holder"] == "nb-3"
    listed = {r["id"]: (r["holder"], r["owner"]) for r in team.requests(alice)["requests"]}
    assert listed == {
        held["id"]: ("nb-1", "nb-1"),
        old["id"]: ("nb-2", "nb-2"),
        same["id"]: ("nb-3", "nb-3"),
    }
    for i in range(4):  # the machine's other four slices
        team.submit(alice, {**SLICE, "holder": f"fill-{i}"})
    waiting = team.submit(alice, {**SLICE, "owner": "nb-wait"})
    assert waiting["state"] == "queued"
    (entry,) = team.queue(alice)["queue"]
    assert (entry["id"], entry["holder"], entry["owner"]) == (waiting["id"], "nb-wait", "nb-wait")
    with pytest.raises(InvalidRequest) as refused:
        team.submit(alice, {**SLICE, "holder": "nb-4", "owner": "nb-5"})
    assert refused.value.message == (
        "'holder' and 'owner' name two different holders: give 'holder' alone "
        "('owner' is its old name)"
    )
    assert len(team.requests(alice)["requests"]) == 8  # nothing written


def test_a_kernel_token_is_never_an_admin_and_acts_only_on_its_kernel(team: BrokerAPI) -> None:
    carol = team.user_identity("carol")
    token = team.issue_token(carol, {"kernel_id": "k1"})
    assert (token["user"], token["kernel_id"]) == ("carol", "k1")
    k1 = team.token_identity(token["token"])
    assert k1 == Identity("carol", (), admin=False, kernel_id="k1")
    mine = team.submit(k1, {**SLICE, "holder": "someone-else"})
    assert mine["holder"] == "k1"  # a kernel's requests are its own
    other = team.submit(carol, {**SLICE, "holder": "notebook-2"})
    with pytest.raises(Forbidden, match="own kernel's requests"):
        team.cancel(k1, other["id"])
    assert [r["id"] for r in team.requests(k1)["requests"]] == [mine["id"]]
    with pytest.raises(Forbidden, match="cannot issue, renew or revoke tokens"):
        team.issue_token(k1, {"kernel_id": "k2"})


def test_a_kernel_never_gets_two_mig_slices(start) -> None:
    """CUDA shows a process one MIG device. No single request yields two slices (whole
    GPUs come only as whole GPUs, a profile or a memory size as one device); a kernel's
    second request is refused while its first lives, unless both ask for whole GPUs."""
    api = start(simulate="workstation-a100")  # GPU 0: 3g.20gb, 2g.10gb, 2x 1g.5gb; GPU 1 whole
    alice = api.user_identity("alice")
    shapes = [{"gpus": 1}, *({"profile": p} for p in ("1g.5gb", "2g.10gb", "3g.20gb"))]
    shapes += [{"min_memory_gb": gb} for gb in (1, 5, 10, 20, 40)]
    for shape in shapes:
        r = api.submit(alice, {**shape, "holder": "nb"})
        assert r["state"] == "granted" and len(r["lease"]["devices"]) == 1, shape
        api.cancel(alice, r["id"])
    kernel = api.token_identity(api.issue_token(alice, {"kernel_id": "k1"})["token"])
    first = api.submit(kernel, {"profile": "1g.5gb"})
    for second in ({"profile": "1g.5gb"}, {"min_memory_gb": 1}, {"gpus": 1}):
        with pytest.raises(Conflict) as refused:
            api.submit(kernel, second)
        assert refused.value.message == (
            f"this kernel already has request {first['id']} for profile=1g.5gb: a kernel with "
            "a MIG slice or a share holds nothing beside it (CUDA shows a process one MIG "
            "device, and MPS one GPU's daemon); release that request first"
        )
    api.cancel(kernel, first["id"])
    whole = api.submit(kernel, {"gpus": 1})
    assert api.submit(kernel, {"gpus": 1})["state"] == "queued"  # whole GPUs may add up
    assert api.submit(alice, {"profile": "1g.5gb", "holder": "k1"})["state"] == "granted"
    assert whole["state"] == "granted"


def test_a_user_sees_others_requests_only_without_ids(team: BrokerAPI) -> None:
    alice, bob = team.user_identity("alice"), team.user_identity("bob")
    held = team.submit(alice, {**SLICE, "holder": "alice-nb"})
    with pytest.raises(Forbidden, match="belongs to another user"):
        team.request(bob, held["id"])
    with pytest.raises(Forbidden, match="belongs to another user"):
        team.release(bob, held["lease"]["id"])
    (device,) = [
        d for g in team.devices(bob)["gpus"] for d in g["devices"] if d["holder"] is not None
    ]
    assert device["holder"] == {"user": "alice", "lease_id": None, "request_id": None}
    assert team.leases(bob) == {"leases": []}
    assert len(team.leases(team.user_identity("carol"))["leases"]) == 1


def test_groups_come_from_config_and_from_the_host(team: BrokerAPI) -> None:
    alice = team.user_identity("alice", groups=["hub-team"])  # as a hub host would add them
    assert alice.groups == ("lab", "hub-team")
    assert team.submit(alice, {**SLICE, "groups": ["hub-team"]})["groups"] == ["hub-team"]
    with pytest.raises(Forbidden, match="not a member of group"):
        team.submit(alice, {**SLICE, "groups": ["physics"]})


def test_devices_show_the_samplers_readings_without_reading_nvml(team: BrokerAPI) -> None:
    runtime = team.runtime
    assert runtime.backend is not None and runtime.sampler is not None

    def no_nvml(*args: object) -> None:
        raise AssertionError("GET devices read NVML")

    runtime.backend.read_all = no_nvml  # type: ignore[method-assign]
    (gpu,) = team.devices(team.user_identity("alice"))["gpus"]
    latest = runtime.sampler.latest[gpu["uuid"]]
    assert gpu["memory_used_mib"] == latest.memory_used_mib and gpu["health"] == "ok"


def test_a_kernel_token_survives_a_broker_restart_until_revoked(start) -> None:
    api = start(identity="username", owner="root-owner")
    alice = api.user_identity("alice")
    kept = api.issue_token(alice, {"kernel_id": "k1"})["token"]
    revoked = api.issue_token(alice, {"kernel_id": "k2"})["token"]
    api.revoke_tokens(alice, "k2")
    api.runtime.stop()
    again = start(identity="username", owner="root-owner")
    assert again.token_identity(kept) == Identity("alice", kernel_id="k1")
    assert again.token_identity(revoked) is None


def test_a_kernel_token_sees_only_its_kernels_events(team: BrokerAPI) -> None:
    alice = team.user_identity("alice")
    k1 = team.token_identity(team.issue_token(alice, {"kernel_id": "k1"})["token"])
    assert k1 is not None
    seen: list[object] = []
    team.runtime.events.subscribe(seen.append)
    team.submit(alice, {**SLICE, "holder": "notebook"})
    own = team.submit(k1, SLICE)
    views = [v for v in (team.event(k1, e) for e in seen) if v is not None]
    assert [v["type"] for v in views] == ["queued", "granted"]
    assert {v["data"]["request_id"] for v in views} == {own["id"]}
    assert len([v for v in (team.event(alice, e) for e in seen) if v is not None]) == 4


def test_a_waiting_request_shows_its_eta_range_or_that_it_is_unknown(team: BrokerAPI) -> None:
    alice, bob = team.user_identity("alice"), team.user_identity("bob")
    for i in range(7):
        team.submit(alice, {**SLICE, "holder": f"nb-{i}"})
    unknown = team.submit(bob, SLICE)  # no hold has ever ended: nobody can know
    assert (unknown["position"], unknown["eta"], unknown["eta_range"]) == (1, None, None)
    assert unknown["eta_known"] is False
    team.cancel(bob, unknown["id"])
    for held in (600.0, 1200.0, 1800.0):
        team.core.predictor.learn("alice", "lab", "interactive", "1g.10gb", held)
    known = team.submit(bob, SLICE)
    span = known["eta_range"]
    assert known["eta_known"] is True and span["low"] < known["eta"] < span["high"]
    (entry,) = team.queue(bob)["queue"]
    assert (entry["eta"], entry["eta_range"], entry["eta_known"]) == (known["eta"], span, True)


def test_on_day_one_an_eta_rests_on_the_stated_typical_hold_and_says_so(start) -> None:
    api = start(identity="username", typical_hold={"interactive": "1h"})
    alice, bob = api.user_identity("alice"), api.user_identity("bob")
    for i in range(7):
        api.submit(alice, {**SLICE, "owner": f"nb-{i}"})
    waiting = api.submit(bob, SLICE)  # no hold has ever ended
    assert waiting["eta_known"] is True and waiting["eta_basis"] == "typical hold"
    assert waiting["eta_bound"] is None  # no time limits: no start is promised
    (entry,) = api.queue(bob)["queue"]
    assert (entry["eta"], entry["eta_basis"]) == (waiting["eta"], "typical hold")


def test_time_limits_give_an_eta_and_the_latest_start_they_promise(start) -> None:
    api = start(identity="username", default_time_limit={"interactive": "1h"})
    alice, bob = api.user_identity("alice"), api.user_identity("bob")
    for i in range(7):
        api.submit(alice, {**SLICE, "owner": f"nb-{i}"})
    waiting = api.submit(bob, SLICE)
    bound = datetime.fromisoformat(waiting["eta_bound"])
    assert waiting["eta_basis"] == "time limits"
    # the leases ahead end by their hour's limit and its minute's grace; the promise is
    # twice as far off (c.GPUBroker.promise_stretch), room for the fair-share order
    assert timedelta(minutes=118) < bound - datetime.now(timezone.utc) <= timedelta(minutes=122)
    assert datetime.fromisoformat(waiting["eta_range"]["high"]) <= bound


def test_a_renewal_reports_its_kernels_state_for_idle_reclaim_to_judge(start) -> None:
    """The kernels of a server in remote mode run where the broker cannot watch them: their
    leases' renewals say whether they are busy, and since when."""
    api = start(identity="username", idle_timeout=0.05, grace=60.0, reclaim_action="revoke")
    alice = api.user_identity("alice")
    hour_ago = datetime.now(timezone.utc) - timedelta(hours=1)
    leases = [api.submit(alice, {**SLICE, "holder": f"k{i}"})["lease"] for i in range(3)]
    idle, busy, silent = (x["id"] for x in leases)
    for lease_id, state in ((idle, "idle"), (busy, "busy")):
        report = {"execution_state": state, "last_activity": hour_ago.isoformat()}
        renewed = api.renew(alice, lease_id, {"kernel": report})
        assert renewed["on_reclaim"] == "revoke"  # what its server does once reclaimed
    api.renew(alice, silent)

    time.sleep(0.1)  # the leases' GPUs, just granted, stay quiet for longer than idle_timeout
    decisions = api.runtime.sampler.sample()
    assert [(d.action, d.lease_id) for d in decisions] == [("warn", idle)]
    with pytest.raises(InvalidRequest, match="'execution_state' must be one of idle, busy"):
        api.renew(alice, busy, {"kernel": {"execution_state": "asleep", "last_activity": "x"}})
    with pytest.raises(InvalidRequest, match="'last_activity' must be an ISO 8601 time"):
        api.renew(alice, busy, {"kernel": {"execution_state": "idle", "last_activity": "soon"}})


def test_a_request_may_name_the_model_of_its_whole_gpus(start: Any) -> None:
    api = start(simulate="dgx-h100:2")
    me = api.user_identity(None)
    (model,) = {g["model"] for g in api.devices(me)["gpus"]}
    r = api.submit(me, {"gpus": 2, "model": model})
    assert (r["state"], r["gpus"], r["model"]) == ("granted", 2, model)
    with pytest.raises(Unsatisfiable, match="asks for 1 whole A100-80GB GPU"):
        api.submit(me, {"gpus": 1, "model": "A100-80GB"})
    with pytest.raises(InvalidRequest, match="'model' goes with 'gpus' only"):
        api.submit(me, {"min_memory_gb": 20, "model": model})


async def test_the_overview_shows_a_suspended_kernel_to_its_user_her_kernel_and_admins(
    start: Any,
) -> None:
    """Through the product's suspend (the simulated checkpoint driver), with this test's
    own process as the kernel's: listed on its GPU, then moved to the host."""
    api = start(simulate="dgx-h100:2", identity="username", admin_users={"carol"})
    runtime = api.runtime
    alice, bob, carol = (api.user_identity(u) for u in ("alice", "bob", "carol"))
    k1, k2 = (
        api.token_identity(api.issue_token(alice, {"kernel_id": k})["token"]) for k in ("k1", "k2")
    )
    lease = api.submit(k1, {"gpus": 1})["lease"]
    runtime.report_pid(lease["id"], os.getpid())
    runtime.backend.simulator.add_process(lease["devices"][0], os.getpid(), 4096)
    await runtime.sample()
    decision = Decision("suspend", lease["id"], "k1", "idle", "idle for 25 min", {})
    assert await runtime.suspender.suspend(decision) is None  # suspended: nothing else to do
    for who, sees in ((alice, True), (k1, True), (carol, True), (bob, False), (k2, False)):
        listed = api.overview(who)["suspended"]
        assert [x["id"] for x in listed] == ([lease["id"]] if sees else []), who
    (shown,) = api.overview(alice)["suspended"]
    assert shown["suspended"]["kernel_id"] == "k1" and shown["state"] == "reclaimed"
    api.revoke_tokens(bob, "k1")  # another user's kernel: not hers to end
    assert api.overview(alice)["suspended"] != []
    api.revoke_tokens(alice, "k1")  # her kernel shut down
    assert api.overview(alice)["suspended"] == []
    assert api.lease(alice, lease["id"])["reason"].endswith(
        "; the kernel was shut down: its GPU memory on the host went with it"
    )
