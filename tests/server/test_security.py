"""Who may see and do what, on a multi-user server (``c.GPUBroker.identity = "username"``).

Three users log in through the server's identity provider with Jupyter tokens
(``Authorization: token alice-token`` ...): alice and bob are plain users, carol is an
admin (``c.GPUBroker.admin_users``); the server's owner is someone else. A kernel-scoped
token acts for its user on its own kernel's requests only. Every reply is also checked
against the API document.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from jupyter_server.auth.identity import IdentityProvider, User
from openapi_check import EventStream, check_response, operations, validate

from jupyter_gpubroker.api import API_PREFIX, TOKEN_HEADER

EVENT = "#/components/schemas/Event"
USERS = {
    "alice-token": "alice",
    "bob-token": "bob",
    "carol-token": "carol",
    "fox-token": "🦊 fox",  # any name the hub allows
    "bell-token": "bell\x07",  # a control character: no name holds one
    "rlo-token": "ann\u202egro",  # reads "annorg": a control that reverses text
}
HUB_GROUPS = ["ML Team", "/staff", "org:team"]


class TokenUsers(IdentityProvider):
    """``Authorization: token <name>-token`` logs in as <name>; anything else is nobody."""

    def _name(self, handler: Any) -> str | None:
        scheme, _, token = handler.request.headers.get("Authorization", "").partition(" ")
        return USERS.get(token.strip()) if scheme.lower() == "token" else None

    def get_user(self, handler: Any) -> User | None:
        name = self._name(handler)
        return None if name is None else User(username=name)

    def is_token_authenticated(self, handler: Any) -> bool:
        return self._name(handler) is not None


@pytest.fixture
def jp_server_config(jp_server_config: dict[str, Any]) -> dict[str, Any]:
    return {
        **jp_server_config,
        "ServerApp": {**jp_server_config["ServerApp"], "identity_provider_class": TokenUsers},
        "GPUBroker": {
            **jp_server_config["GPUBroker"],
            "identity": "username",
            "owner": "root-owner",
            "admin_users": {"carol"},
            "user_groups": {"alice": ["lab"], "bob": ["physics", "lab-b"], "🦊 fox": HUB_GROUPS},
            "lease_ttl": 120.0,
        },
    }


@pytest.fixture
def jp_auth_header() -> dict[str, str]:
    return {}  # no credential unless a call names one


class Caller:
    """Calls the API as one user (or kernel token); checks every reply against the
    document and keeps the text of every successful GET for leak checks."""

    def __init__(self, api: Any, headers: dict[str, str], seen: list[str]) -> None:
        self.api, self.headers, self.seen = api, headers, seen

    async def __call__(
        self, method: str, path: str, body: Any = None, *, expect: int, **params: Any
    ) -> Any:
        status, data = await self.api(method, path, body, headers=self.headers, **params)
        assert status == expect, f"{self.headers} {method} {path}: {status} {data}"
        check_response(method, path, status, data, body)
        if method == "GET" and status == 200:
            self.seen.append(json.dumps(data))
        return data

    async def refused(self, method: str, path: str, body: Any = None, **params: Any) -> str:
        """403 ``forbidden``; returns the message."""
        reply = await self(method, path, body, expect=403, **params)
        assert reply["error"] == "forbidden", (method, path, reply)
        return str(reply["message"])


class World:
    def __init__(self, api: Any) -> None:
        self.api = api
        self.seen: dict[str, list[str]] = {}

    def user(self, name: str) -> Caller:
        token = next(t for t, user in USERS.items() if user == name)
        return Caller(self.api, {"Authorization": f"token {token}"}, self.seen.setdefault(name, []))

    def kernel(self, token: str, name: str = "kernel") -> Caller:
        return Caller(self.api, {TOKEN_HEADER: token}, self.seen.setdefault(name, []))


@pytest.fixture
def world(api: Any) -> World:
    return World(api)


async def fill(caller: Caller, n: int, **body: Any) -> list[dict[str, Any]]:
    out = []
    for _ in range(n):
        r = await caller("POST", "requests", {"profile": "1g.10gb", **body}, expect=201)
        out.append(r)
    return out


async def alice_and_bob(world: World) -> dict[str, Any]:
    """alice holds two slices (one for kernel k1) and waits for a third; bob holds one
    and waits for one; carol fills the rest. Returns alice's objects."""
    alice, bob, carol = world.user("alice"), world.user("bob"), world.user("carol")
    token = (await alice("POST", "tokens", {"kernel_id": "k1"}, expect=201))["token"]
    k1 = world.kernel(token, "k1")
    held = await alice(
        "POST", "requests", {"profile": "1g.10gb", "holder": "alice-nb-7f3a"}, expect=201
    )
    in_k1 = await k1("POST", "requests", {"profile": "1g.10gb"}, expect=201)
    (bob_held,) = await fill(bob, 1, holder="bob-nb")
    await fill(carol, 4, holder="carol-job")
    waiting = await alice(
        "POST", "requests", {"profile": "1g.10gb", "holder": "alice-queued-9c1e"}, expect=201
    )
    (bob_waiting,) = await fill(bob, 1, holder="bob-queued")
    assert [r["state"] for r in (held, in_k1, bob_held, waiting, bob_waiting)] == [
        "granted",
        "granted",
        "granted",
        "queued",
        "queued",
    ]
    return {
        "token": token,
        "held": held,
        "in_k1": in_k1,
        "waiting": waiting,
        "bob_held": bob_held,
        "bob_waiting": bob_waiting,
        "secrets": [
            token,
            held["id"],
            held["lease"]["id"],
            held["holder"],
            in_k1["id"],
            in_k1["lease"]["id"],
            waiting["id"],
            waiting["holder"],
        ],
    }


def leaks(texts: list[str], secrets: list[str]) -> list[str]:
    return [s for s in secrets if any(s in t for t in texts)]


# --------------------------------------------------------------------- no credential


async def test_every_operation_refuses_a_caller_without_a_valid_credential(world: World) -> None:
    state = await alice_and_bob(world)
    alice = world.user("alice")
    values = {
        "request_id": state["held"]["id"],
        "lease_id": state["held"]["lease"]["id"],
        "kind": "user",
        "name": "alice",
        "kernel_id": "k1",
        "uuid": state["held"]["lease"]["devices"][0],
    }
    strangers = [
        {},
        {"Authorization": "token mallory-token"},
        {"Authorization": "bearer alice-token"},
        {TOKEN_HEADER: "gpb_made-up"},
        {TOKEN_HEADER: ""},
    ]
    for template, method in operations():
        path = re.sub(r"\{([^}]+)\}", lambda m: values[m.group(1)], template)[1:]
        body = {"profile": "1g.10gb"} if (template, method) == ("/requests", "post") else None
        if method in ("post", "put", "patch") and body is None:
            body = {}
        for headers in strangers:
            status, reply = await world.api(method.upper(), path, body, headers=headers)
            assert status == 403, (method, path, headers, reply)
            assert reply == {"error": "http_403", "message": reply["message"]}
    # Nothing they tried changed anything.
    held = await alice("GET", f"requests/{values['request_id']}", expect=200)
    assert held["state"] == "granted"
    assert held["lease"] == state["held"]["lease"]  # neither released nor renewed
    me = await world.kernel(state["token"])("GET", "me", expect=200)
    assert me == {
        "user": "alice",
        "groups": ["lab"],
        "admin": False,
        "kernel_id": "k1",
    }  # not revoked
    assert len((await world.user("carol")("GET", "queue", expect=200))["queue"]) == 2


# ----------------------------------------------------------------- what bob may see


async def test_a_user_never_sees_another_users_ids_owners_or_tokens(
    world: World, jp_http_port: int, jp_base_url: str
) -> None:
    state = await alice_and_bob(world)
    bob, carol = world.user("bob"), world.user("carol")
    await carol("PUT", "quotas/user/alice", {"max_gpus": 3}, expect=200)
    await carol("PUT", "quotas/user/bob", {"share": 2}, expect=200)
    await carol("PUT", "quotas/group/lab", {"share": 5}, expect=200)

    me = await bob("GET", "me", expect=200)
    assert me == {"user": "bob", "groups": ["physics", "lab-b"], "admin": False, "kernel_id": None}

    queue = (await bob("GET", "queue", expect=200))["queue"]
    assert sorted((e["user"], e["mine"]) for e in queue) == [("alice", False), ("bob", True)]
    for e in queue:
        if e["user"] == "alice":
            assert e["id"] is None and e["holder"] is None
        else:
            assert e["id"] == state["bob_waiting"]["id"] and e["holder"] == "bob-queued"

    (gpu,) = (await bob("GET", "devices", expect=200))["gpus"]
    holders = [d["holder"] for d in gpu["devices"]]
    assert sorted(h["user"] for h in holders) == ["alice", "alice", "bob"] + ["carol"] * 4
    for h in holders:
        mine = h["user"] == "bob"
        assert (h["lease_id"] is not None) == mine and (h["request_id"] is not None) == mine

    leases = (await bob("GET", "leases", expect=200))["leases"]
    assert [x["id"] for x in leases] == [state["bob_held"]["lease"]["id"]]
    requests = (await bob("GET", "requests", expect=200))["requests"]
    assert {r["id"] for r in requests} == {state["bob_held"]["id"], state["bob_waiting"]["id"]}

    usage = await bob("GET", "usage", expect=200)
    assert set(usage["gpu_hours"]) == {"bob"}
    for by in ("group", "profile", "job_class"):
        await bob.refused("GET", "usage", by=by)
    bad = await bob("GET", "usage", by="bogus", expect=400)  # bad input is a 400 for anyone
    assert bad["error"] == "invalid_request"

    quotas = (await bob("GET", "quotas", expect=200))["quotas"]
    assert [(q["kind"], q["name"]) for q in quotas] == [("user", "bob")]

    # Events: alice's activity reaches bob as kind, time and user name only.
    url = f"{jp_base_url}{API_PREFIX}/events"
    stream = await EventStream.open(jp_http_port, url, {"Authorization": "token bob-token"})
    events: list[dict[str, Any]] = []
    try:
        hello = await stream.next()
        assert hello["type"] == "hello"
        assert {r["id"] for r in hello["data"]["requests"]} == {state["bob_waiting"]["id"]}
        await world.user("alice")("DELETE", f"leases/{state['held']['lease']['id']}", expect=200)
        while not events or events[-1]["type"] != "positions":
            events.append(await stream.next())
            validate(events[-1], EVENT, "an event bob got")
    finally:
        stream.close()
    alices = [e for e in events if e["data"].get("user") == "alice"]
    (device,) = state["held"]["lease"]["devices"]
    assert "released" in [e["type"] for e in alices]
    # her released lease's devices, as GET devices shows their holders, and nothing else
    assert all(
        e["data"] in ({"user": "alice"}, {"user": "alice", "devices": [device]}) for e in alices
    )
    assert not leaks(world.seen["bob"] + [json.dumps(events)], state["secrets"])

    # carol, an admin, sees everyone's.
    assert len((await carol("GET", "leases", expect=200))["leases"]) == 7
    assert len((await carol("GET", "requests", expect=200))["requests"]) == 8  # one released
    queue = (await carol("GET", "queue", expect=200))["queue"]
    assert all(e["id"] is not None and e["holder"] is not None for e in queue)
    (gpu,) = (await carol("GET", "devices", expect=200))["gpus"]
    assert all(d["holder"]["lease_id"] is not None for d in gpu["devices"])
    assert len((await carol("GET", "quotas", expect=200))["quotas"]) == 3
    by_user = (await carol("GET", "usage", expect=200))["gpu_hours"]
    assert set(by_user) == {"alice", "bob", "carol"}
    assert (await carol("GET", f"requests/{state['held']['id']}", expect=200))["holder"] == (
        "alice-nb-7f3a"
    )


# ------------------------------------------------------------------ what bob may do


async def test_a_user_cannot_act_on_another_users_objects(world: World) -> None:
    state = await alice_and_bob(world)
    alice, bob, carol = world.user("alice"), world.user("bob"), world.user("carol")
    held, waiting = state["held"], state["waiting"]
    lease_id = held["lease"]["id"]

    for method, path in (
        ("GET", f"requests/{held['id']}"),
        ("DELETE", f"requests/{held['id']}"),
        ("GET", f"requests/{waiting['id']}"),
        ("DELETE", f"requests/{waiting['id']}"),
        ("GET", f"leases/{lease_id}"),
        ("POST", f"leases/{lease_id}/renew"),
        ("DELETE", f"leases/{lease_id}"),
    ):
        assert "another user" in await bob.refused(method, path)
    for method, path, body in (
        ("PUT", "quotas/user/bob", {"max_gpus": 100}),
        ("PUT", "quotas/user/alice", {"max_gpus": 0}),
        ("DELETE", "quotas/user/bob", None),
    ):
        assert "admins" in await bob.refused(method, path, body)

    # bob's attempts changed nothing of alice's.
    after = await alice("GET", f"requests/{held['id']}", expect=200)
    assert after["state"] == "granted" and after["lease"]["state"] == "active"
    assert after["lease"]["expires_at"] == held["lease"]["expires_at"]
    assert (await alice("GET", f"requests/{waiting['id']}", expect=200))["state"] == "queued"
    assert (await carol("GET", "quotas", expect=200))["quotas"] == []

    # bob cannot revoke alice's kernel token: not by revoking, not by claiming the kernel id.
    await bob("DELETE", "tokens/k1", expect=204)
    bobs = (await bob("POST", "tokens", {"kernel_id": "k1"}, expect=201))["token"]
    assert (await world.kernel(state["token"])("GET", "me", expect=200))["user"] == "alice"
    # ... and his own token for that kernel id is his, not alice's.
    bob_k1 = world.kernel(bobs, "bob-k1")
    assert (await bob_k1("GET", "me", expect=200))["user"] == "bob"
    await bob_k1.refused("GET", f"requests/{state['in_k1']['id']}")

    # carol, an admin, may look at alice's lease and set quotas.
    assert (await carol("GET", f"leases/{lease_id}", expect=200))["user"] == "alice"
    await carol("PUT", "quotas/user/alice", {"max_gpus": 0.5}, expect=200)
    assert [q["name"] for q in (await alice("GET", "quotas", expect=200))["quotas"]] == ["alice"]
    await carol("DELETE", "quotas/user/alice", expect=204)


# ------------------------------------------------------------------ admin operations


async def test_only_admins_use_the_admin_operations_and_each_is_audited(
    world: World, jp_http_port: int, jp_base_url: str, jp_serverapp: Any
) -> None:
    state = await alice_and_bob(world)
    alice, bob, carol = world.user("alice"), world.user("bob"), world.user("carol")
    k1 = world.kernel(state["token"], "k1")
    waiting, held = state["waiting"], state["held"]
    (gpu,) = (await carol("GET", "devices", expect=200))["gpus"]
    admin_only = [
        ("PATCH", f"requests/{waiting['id']}", {"job_class": "batch"}),
        ("PATCH", f"requests/{state['bob_waiting']['id']}", {"job_class": "batch"}),
        ("PATCH", "requests/r-000000000000", {"job_class": "batch"}),  # no oracle: 403, not 404
        ("POST", f"devices/{gpu['uuid']}/drain", {"reason": "mine now"}),
        ("DELETE", f"devices/{gpu['uuid']}/drain", None),
        ("GET", "reclaims", None),
        ("GET", "audit", None),
        ("GET", "alerts", None),
        ("GET", "forecast", None),
        ("GET", "whatif", None),
        ("POST", "whatif", {"gpus": 1}),
    ]
    for caller in (alice, bob, k1):
        for method, path, body in admin_only:
            assert "only admins" in await caller.refused(method, path, body)
    assert "another user" in await bob.refused(
        "DELETE", f"requests/{waiting['id']}", reason="bob wants it"
    )

    url = f"{jp_base_url}{API_PREFIX}/events"
    streams = {
        name: await EventStream.open(jp_http_port, url, {"Authorization": f"token {name}-token"})
        for name in ("alice", "bob", "carol")
    }
    got: dict[str, list[dict[str, Any]]] = {"alice": [], "bob": [], "carol": []}
    try:
        for stream in streams.values():
            assert (await stream.next())["type"] == "hello"
        reclassed = {"job_class": "batch", "reason": "nightly run"}
        await carol("PATCH", f"requests/{state['bob_waiting']['id']}", reclassed, expect=200)
        await carol("DELETE", f"requests/{waiting['id']}", expect=200, reason="over quota")
        taken = await carol(
            "DELETE", f"requests/{held['id']}", {"reason": "maintenance"}, expect=200
        )
        assert taken["state"] == "reclaimed"
        drained = await carol("POST", f"devices/{gpu['uuid']}/drain", {"reason": "fan"}, expect=200)
        assert drained["drained"]["cause"] == "admin"
        drained_at = drained["drained"]["since"]
        runtime = jp_serverapp.web_app.settings["gpubroker"]
        runtime.backend.simulator.inject_overheat(gpu["uuid"], 95)
        await runtime.sample()  # an alert starts: carol's stream shows it, nobody else's
        await alice("POST", "requests", {"profile": "1g.10gb", "holder": "after"}, expect=201)
        for name, stream in streams.items():
            while not [e for e in got[name] if e["type"] == "queued" and e["at"] > drained_at]:
                got[name].append(await stream.next())
                validate(got[name][-1], EVENT, f"an event {name} got")
    finally:
        for stream in streams.values():
            stream.close()
    mine = {e["type"]: e["data"] for e in got["alice"] if e["data"].get("user") == "alice"}
    assert (mine["cancelled"]["by"], mine["cancelled"]["reason"]) == (
        "carol",
        "cancelled by carol: over quota",
    )
    assert (mine["reclaimed"]["by"], mine["reclaimed"]["cause"]) == ("carol", "admin")
    assert mine["reclaimed"]["reason"] == "reclaimed by carol: maintenance"
    (moved,) = [e["data"] for e in got["bob"] if e["type"] == "reclassed"]
    assert (moved["request_id"], moved["job_class"], moved["by"]) == (
        state["bob_waiting"]["id"],
        "batch",
        "carol",
    )
    assert [e["data"] for e in got["alice"] if e["type"] == "reclassed"] == [{"user": "bob"}]
    (alert,) = [e["data"] for e in got["carol"] if e["type"] == "alert"]
    assert (alert["state"], alert["alert"]["kind"]) == ("started", "temperature")
    assert not [e for e in got["alice"] + got["bob"] if e["type"] == "alert"]
    (active,) = (await carol("GET", "alerts", expect=200))["active"]
    assert active == alert["alert"]
    theirs = [e for e in got["bob"] if e["data"].get("user") == "alice"]
    # whose, and for a lease's end the devices it gave back (as GET devices shows them)
    assert theirs and all(set(e["data"]) <= {"user", "devices"} for e in theirs)
    assert all(e["data"]["user"] == "alice" for e in theirs)
    assert not leaks(world.seen["bob"] + [json.dumps(got["bob"])], state["secrets"])

    log = (await carol("GET", "audit", expect=200))["audit"]
    assert [(a["actor"], a["action"], a["target"]) for a in log] == [
        ("carol", "set_class", state["bob_waiting"]["id"]),
        ("carol", "cancel", waiting["id"]),
        ("carol", "cancel", held["id"]),
        ("carol", "drain", gpu["uuid"]),
    ]
    (reclaim,) = (await carol("GET", "reclaims", expect=200, user="alice"))["reclaims"]
    assert (reclaim["request_id"], reclaim["evidence"]) == (held["id"], {"by": "carol"})


# -------------------------------------------------------------- kernel-scoped tokens


async def test_a_kernel_token_acts_only_on_its_own_kernels_requests(
    world: World, jp_http_port: int, jp_base_url: str
) -> None:
    state = await alice_and_bob(world)
    alice = world.user("alice")
    k1 = world.kernel(state["token"], "k1")
    held, in_k1 = state["held"], state["in_k1"]

    assert await k1("GET", "me", expect=200) == {
        "user": "alice",
        "groups": ["lab"],
        "admin": False,
        "kernel_id": "k1",
    }
    assert in_k1["holder"] == "k1" and in_k1["user"] == "alice"
    # Whatever owner it names, its requests are its kernel's: k1 holds a MIG slice, so
    # a second one is refused as k1's.
    spoof = await k1(
        "POST", "requests", {"profile": "1g.10gb", "holder": "alice-nb-7f3a"}, expect=409
    )
    assert f"this kernel already has request {in_k1['id']}" in spoof["message"]
    renewed = await k1("POST", f"leases/{in_k1['lease']['id']}/renew", expect=200)
    assert renewed["request_id"] == in_k1["id"]

    # alice's other requests and leases are out of its reach ...
    for method, path in (
        ("GET", f"requests/{held['id']}"),
        ("DELETE", f"requests/{held['id']}"),
        ("GET", f"requests/{state['waiting']['id']}"),
        ("DELETE", f"requests/{state['waiting']['id']}"),
        ("GET", f"leases/{held['lease']['id']}"),
        ("POST", f"leases/{held['lease']['id']}/renew"),
        ("DELETE", f"leases/{held['lease']['id']}"),
    ):
        assert "kernel" in await k1.refused(method, path)
    # ... and so are tokens and quotas.
    await k1.refused("POST", "tokens", {"kernel_id": "k2"})
    await k1.refused("DELETE", "tokens/k1")
    await k1.refused("PUT", "quotas/user/alice", {"max_gpus": 7})

    # It sees its own kernel's objects only.
    assert [x["id"] for x in (await k1("GET", "leases", expect=200))["leases"]] == [
        in_k1["lease"]["id"]
    ]
    assert [r["id"] for r in (await k1("GET", "requests", expect=200))["requests"]] == [in_k1["id"]]
    queue = (await k1("GET", "queue", expect=200))["queue"]
    assert all(e["id"] is None and e["holder"] is None for e in queue)  # none is k1's
    (gpu,) = (await k1("GET", "devices", expect=200))["gpus"]
    visible = {d["holder"]["lease_id"] for d in gpu["devices"]} - {None}
    assert visible == {in_k1["lease"]["id"]}

    url = f"{jp_base_url}{API_PREFIX}/events"
    stream = await EventStream.open(jp_http_port, url, {TOKEN_HEADER: state["token"]})
    try:
        assert (await stream.next())["data"]["requests"] == []
        await alice("DELETE", f"requests/{state['waiting']['id']}", expect=200)  # not k1's
        await k1("DELETE", f"leases/{in_k1['lease']['id']}", expect=200)  # its one slice
        mine = await k1("POST", "requests", {"profile": "1g.10gb"}, expect=201)
        events = [await stream.next()]
        while [e["type"] for e in events[-2:]] != ["queued", "positions"]:
            events.append(await stream.next())
    finally:
        stream.close()
    kinds = [e["type"] for e in events]
    assert "cancelled" not in kinds
    assert [e["data"]["request_id"] for e in events if e["type"] == "queued"] == [mine["id"]]
    assert [r["id"] for r in events[-1]["data"]["requests"]] == [mine["id"]]
    others = [held["id"], held["lease"]["id"], held["holder"], state["waiting"]["id"]]
    others.append(state["waiting"]["holder"])  # alice's, but not this kernel's
    assert not leaks(world.seen["k1"] + [json.dumps(events)], others)

    # An admin's kernel token is no admin.
    carol = world.user("carol")
    kc = world.kernel((await carol("POST", "tokens", {"kernel_id": "kc"}, expect=201))["token"])
    assert (await kc("GET", "me", expect=200))["admin"] is False
    assert (await kc("GET", "leases", expect=200))["leases"] == []
    await kc.refused("PUT", "quotas/user/alice", {"max_gpus": 7})

    # Revoked, replaced or made up: refused.
    await alice("DELETE", "tokens/k1", expect=204)
    assert (await k1("GET", "me", expect=403))["error"] == "http_403"
    first = (await alice("POST", "tokens", {"kernel_id": "k1"}, expect=201))["token"]
    second = (await alice("POST", "tokens", {"kernel_id": "k1"}, expect=201))["token"]
    assert (await world.kernel(first)("GET", "me", expect=403))["error"] == "http_403"
    assert (await world.kernel(second)("GET", "me", expect=200))["kernel_id"] == "k1"
    assert (await world.kernel(second + "x")("GET", "me", expect=403))["error"] == "http_403"


async def test_tokens_never_appear_in_a_get_response(
    world: World, jp_http_port: int, jp_base_url: str
) -> None:
    state = await alice_and_bob(world)
    carol = world.user("carol")
    tokens = [state["token"]]
    tokens.append((await carol("POST", "tokens", {"kernel_id": "kc"}, expect=201))["token"])
    callers = [world.user(n) for n in ("alice", "bob", "carol")]
    callers += [world.kernel(t, f"kernel-{i}") for i, t in enumerate(tokens)]
    for caller in callers:
        for path in ("me", "devices", "queue", "requests", "leases", "usage", "quotas"):
            await caller("GET", path, expect=200)
        for r in (await caller("GET", "requests", expect=200))["requests"]:
            await caller("GET", f"requests/{r['id']}", expect=200)
        for x in (await caller("GET", "leases", expect=200))["leases"]:
            await caller("GET", f"leases/{x['id']}", expect=200)
        url = f"{jp_base_url}{API_PREFIX}/events"
        stream = await EventStream.open(jp_http_port, url, caller.headers)
        try:
            caller.seen.append(json.dumps(await stream.next()))
        finally:
            stream.close()
    texts = [t for seen in world.seen.values() for t in seen]
    assert len(texts) > 40
    assert not any("gpb_" in t for t in texts)
    assert not leaks(texts, tokens)


async def test_a_request_is_charged_only_to_its_users_own_groups(world: World) -> None:
    alice, bob = world.user("alice"), world.user("bob")
    refused = await bob.refused("POST", "requests", {"profile": "1g.10gb", "groups": ["lab"]})
    assert "bob is not a member of group(s) lab; their groups: physics, lab-b" in refused
    mine = await alice("POST", "requests", {"profile": "1g.10gb"}, expect=201)
    assert mine["groups"] == ["lab"] and mine["lease"]["group"] == "lab"  # her first group
    other = await bob("POST", "requests", {"profile": "1g.10gb", "groups": ["lab-b"]}, expect=201)
    assert other["lease"]["group"] == "lab-b"


async def test_a_name_is_held_to_one_rule_on_every_call_whatever_it_holds(
    world: World,
) -> None:
    """The name rule is the identity's: a kernel token is issued only to a user whose
    requests the broker then takes, and a caller whose name it refuses is refused on
    every call (403: no call of theirs can be served)."""
    fox = world.user("🦊 fox")
    token = (await fox("POST", "tokens", {"kernel_id": "k-fox"}, expect=201))["token"]
    mine = await world.kernel(token)("POST", "requests", {"profile": "1g.10gb"}, expect=201)
    assert (mine["user"], mine["groups"], mine["state"]) == ("🦊 fox", HUB_GROUPS, "granted")
    body = {"profile": "1g.10gb", "groups": ["/staff"]}
    assert (await fox("POST", "requests", body, expect=201))["lease"]["group"] == "/staff"

    bell = world.user("bell\x07")
    for method, path, body in (("GET", "me", None), ("POST", "tokens", {"kernel_id": "k"})):
        assert await bell.refused(method, path, body) == (
            "the GPU broker cannot serve this caller: user name 'bell\\x07' holds '\\x07': "
            "a name may hold any character but control characters and line breaks"
        )
    reversed_name = world.user("ann\u202egro")  # it would read as "annorg" in a list
    for method, path, body in (("GET", "me", None), ("POST", "requests", {"profile": "1g.10gb"})):
        assert await reversed_name.refused(method, path, body) == (
            "the GPU broker cannot serve this caller: user name 'ann\\u202egro' holds "
            "'\\u202e': a name may hold any character but control characters and line breaks"
        )


# --------------------------------------------------------------------- kernels


async def test_a_kernel_a_user_starts_is_charged_to_that_user(
    world: World, jp_fetch: Any, gpu_kernelspec: Any
) -> None:
    alice, carol = world.user("alice"), world.user("carol")
    started = await jp_fetch(
        "api",
        "kernels",
        method="POST",
        body=json.dumps({"name": gpu_kernelspec()}),
        headers=alice.headers,
    )
    kernel_id = json.loads(started.body)["id"]
    try:
        (mine,) = (await alice("GET", "requests", expect=200))["requests"]
        assert (mine["user"], mine["holder"], mine["state"]) == ("alice", kernel_id, "granted")
        (seen,) = (await carol("GET", "requests", expect=200))["requests"]
        assert seen["user"] == "alice"  # not the server's owner, root-owner
    finally:
        await jp_fetch("api", "kernels", kernel_id, method="DELETE", headers=alice.headers)
    assert (await alice("GET", "requests", expect=200))["requests"] == []


# ------------------------------------------------------------------- the overview


async def test_the_overview_shows_each_caller_what_it_may_see(world: World) -> None:
    """One call, the same picture as the separate reads: a user sees others' holders and
    queue entries without ids, an admin everyone's, a kernel token its kernel's only."""
    state = await alice_and_bob(world)
    bob, carol = world.user("bob"), world.user("carol")
    k1 = world.kernel(state["token"], "k1")
    for caller in (bob, carol, k1):
        overview = await caller("GET", "overview", expect=200)
        parts = {"me": await caller("GET", "me", expect=200)}
        for path in ("devices", "queue", "requests", "leases"):
            parts.update(await caller("GET", path, expect=200))
        parts["suspended"] = []  # no kernel is suspended here (tests/suspend has one)
        none = {"default_s": None, "max_s": 366 * 86400.0, "required": False}
        classes = {"interactive": none, "batch": none}
        offered = {d.get("profile") for g in parts["gpus"] for d in g["devices"]} - {None}
        parts["time_limits"] = {  # none configured: a year at most, none required
            "required": False,
            "classes": classes,
            "profiles": {p: classes for p in offered},  # each MIG profile it offers
        }
        assert overview == parts

    mine = await bob("GET", "overview", expect=200)
    assert {r["id"] for r in mine["requests"]} == {
        state["bob_held"]["id"],
        state["bob_waiting"]["id"],
    }
    assert [x["id"] for x in mine["leases"]] == [state["bob_held"]["lease"]["id"]]
    assert not leaks([json.dumps(mine)], state["secrets"])

    everyone = await carol("GET", "overview", expect=200)
    assert everyone["me"]["admin"] and all(e["id"] for e in everyone["queue"])
    assert len(everyone["leases"]) == 7
    assert all(d["holder"]["lease_id"] for d in everyone["gpus"][0]["devices"])

    kernel = await k1("GET", "overview", expect=200)
    assert [r["id"] for r in kernel["requests"]] == [state["in_k1"]["id"]]
    assert [x["id"] for x in kernel["leases"]] == [state["in_k1"]["lease"]["id"]]
    assert all(e["id"] is None for e in kernel["queue"])  # alice's waiting one is not k1's
    held = [d["holder"] for d in kernel["gpus"][0]["devices"] if d["holder"]["lease_id"]]
    assert held == [
        {
            "user": "alice",
            "lease_id": state["in_k1"]["lease"]["id"],
            "request_id": state["in_k1"]["id"],
        }
    ]


async def test_only_admins_see_and_set_time_limits(world: World) -> None:
    alice, bob, carol = world.user("alice"), world.user("bob"), world.user("carol")
    await carol("PUT", "limits/group/lab", {"default_s": 1800, "max_s": 3600}, expect=200)
    for method, path, body in (
        ("GET", "limits", None),
        ("PUT", "limits/group/lab", {"max_s": 86400}),
        ("PUT", "limits/class/interactive", {"max_s": 60}),
        ("DELETE", "limits/group/lab", None),
    ):
        assert "only admins see and change time limits" in await bob.refused(method, path, body)
    # bob changed nothing: alice's group still has carol's limits, and the next request
    # of alice's is held to them
    (rule,) = (await carol("GET", "limits", expect=200))["rules"]
    assert (rule["name"], rule["default_s"], rule["max_s"]) == ("lab", 1800, 3600)
    assert (await alice("POST", "requests", {"profile": "1g.10gb"}, expect=201))["limit_s"] == 1800
    over = await alice("POST", "requests", {"profile": "1g.10gb", "limit_s": 7200}, expect=400)
    assert over["message"].endswith("longer than the 1 h 00 min allowed for group 'lab'")
    bobs = await bob("POST", "requests", {"profile": "1g.10gb", "limit_s": 7200}, expect=201)
    assert bobs["limit_s"] == 7200  # not in lab
