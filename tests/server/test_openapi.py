"""The API document (``jupyter_gpubroker/api/openapi.yaml``) against the running server.

Every documented operation is called on a real jupyter-server with the extension (a
simulated H100 cut in seven 1g.10gb slices), with each of its documented statuses,
and every reply is validated against the document; a test then fails when the
document lists an operation or status the server never produced, or the server
routes a method the document does not describe.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from importlib import resources
from typing import Any

import pytest
from openapi_check import (
    DOC,
    CheckedApi,
    EventStream,
    check_response,
    documented_responses,
    fill_state_file,
    find_operation,
    free_state_file,
    load_document,
    operations,
    until_full,
    validate,
)
from tornado import web

from jupyter_gpubroker.api import API_PREFIX, TOKEN_HEADER
from jupyter_gpubroker.runtime import whatif
from jupyter_gpubroker.server.handlers import handlers
from jupyter_gpubroker.server.host import JupyterHost

EVENT = "#/components/schemas/Event"
NO_CREDENTIAL = {"Authorization": ""}


@pytest.fixture
def broker_config(broker_config: dict[str, Any]) -> dict[str, Any]:
    # Long leases: nothing may expire while the test walks through the API.
    return {
        **broker_config,
        "lease_ttl": 120.0,
        "owner": "owner",
        "user_groups": {"owner": ["lab"]},
        "healthy_for": 0.0,  # a GPU is healthy again at the first sample without a fault
        "alert_clear_after": 0.0,  # and its alert ends then
    }


def parse(t: str) -> datetime:
    return datetime.fromisoformat(t)


def iso(dt: datetime) -> str:
    return dt.isoformat()


# ----------------------------------------------------------------- the document


def test_document_is_valid_openapi_3_1() -> None:
    try:
        from openapi_spec_validator import validate as validate_spec
    except ImportError:  # openapi-spec-validator 0.7.0 has only validate_spec
        from openapi_spec_validator import validate_spec

    doc = load_document()
    assert doc["openapi"].startswith("3.1.")
    validate_spec(doc)  # raises on any structural or schema error
    assert set(doc["components"]["securitySchemes"]) == {"jupyterToken", "kernelToken"}
    assert doc["components"]["securitySchemes"]["kernelToken"]["name"] == TOKEN_HEADER


def test_document_ships_inside_the_package() -> None:
    text = resources.files("jupyter_gpubroker.api").joinpath("openapi.yaml").read_text()
    assert "openapi: 3.1" in text
    assert DOC["servers"][0]["url"].endswith(API_PREFIX)


def test_document_describes_every_routed_method() -> None:
    """Each handler method the server routes is in the document, and nothing else."""

    def shape(path: str) -> str:
        return re.sub(r"\([^)]*\)", "{}", path)

    routed = set()
    for pattern, handler in handlers(JupyterHost):
        path = shape(pattern.removeprefix(f"/{API_PREFIX}"))
        for method in ("get", "put", "post", "delete", "patch"):
            if getattr(handler, method) is not getattr(web.RequestHandler, method):
                routed.add((path, method))
    documented = {(re.sub(r"\{[^}]+\}", "{}", t), m) for t, m in operations()}
    assert routed == documented


async def test_an_undocumented_method_is_refused_with_405(api: Any) -> None:
    """Not a 500 from a handler called with the wrong arguments: a JSON 405."""
    documented = set(operations())
    for template in DOC["paths"]:
        path = re.sub(r"\{([^}]+)\}", lambda m: "user" if m.group(1) == "kind" else "x1", template)
        for method in ("get", "put", "post", "delete", "patch"):
            if (template, method) in documented:
                continue
            body = "{}" if method in ("put", "post", "patch") else None
            status, reply = await api(method.upper(), path[1:], raw=body)
            assert (status, reply["error"]) == (405, "http_405"), (method, template, reply)


def _resolved(schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = DOC["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def open_objects(schema: dict[str, Any], where: str) -> Iterator[str]:
    """Where an object schema in ``schema`` takes properties it does not name."""
    schema = _resolved(schema)
    if "properties" in schema or schema.get("type") == "object":
        closed = schema.get("additionalProperties") is False
        if not closed and schema.get("unevaluatedProperties") is not False:
            yield where
    for name, sub in schema.get("properties", {}).items():
        if isinstance(sub, dict):
            yield from open_objects(sub, f"{where}.{name}")
    for part in schema.get("allOf", []):
        yield from (w for w in open_objects(part, where) if w != where)


def test_every_request_body_has_a_fixed_shape() -> None:
    """The server refuses a field a body does not take (``api.rules.only``): the document
    says so of every body, down to the objects inside it."""
    found = []
    for template, method in operations():
        body = DOC["paths"][template][method].get("requestBody")
        if body is not None:
            schema = body["content"]["application/json"]["schema"]
            found += open_objects(schema, f"{method.upper()} {template}")
    assert found == []
    assert list(open_objects({"type": "object", "properties": {"a": {}}}, "x")) == ["x"]


def test_error_codes_in_the_document_are_the_brokers() -> None:
    from jupyter_gpubroker.wire import errors

    codes = {
        cls.code
        for cls in vars(errors).values()
        if isinstance(cls, type) and issubclass(cls, errors.BrokerError)
    } - {"broker_error"}
    assert set(DOC["components"]["schemas"]["ErrorCode"]["anyOf"][0]["enum"]) == codes


def test_a_broken_promise_is_a_documented_event_for_its_user_alone() -> None:
    """Made by the core only after a drain or an overdue start (tests/broker/test_limits.py),
    which this server's run does not stage: its shape, as its user and another see it."""
    from jupyter_gpubroker.api.shapes import event_json
    from jupyter_gpubroker.broker.models import Event

    at = 1_800_000_000.0
    detail = {"reason": "a GPU was taken out of service (drained by ada: a fan)"}
    for now_by in (at + 3600, None):
        d = {**detail, "broken_bound": at - 60, "eta_bound": now_by, "message": "The start …"}
        own = event_json(7, Event("promise_broken", at, "ann", "r-1", None, d), "ann", False)
        validate(own, EVENT, "a broken promise")
        assert own["data"]["broken_bound"].startswith("2027-01-15T07:59")
        other = event_json(7, Event("promise_broken", at, "ann", "r-1", None, d), "bob", False)
        validate(other, EVENT, "another's broken promise")
        assert other["data"] == {"user": "ann"}


def test_validation_catches_a_wrong_body() -> None:
    """The checker itself: a reply missing a field, with a wrong type or an extra
    field fails."""
    good = {"user": "ann", "groups": [], "admin": False, "kernel_id": None}
    check_response("GET", "me", 200, good)
    for bad in (
        {"user": "ann", "admin": False},
        {"user": "ann", "groups": [], "admin": "no", "kernel_id": None},
        {**good, "token": "gpb_x"},
    ):
        with pytest.raises(AssertionError, match="does not match"):
            check_response("GET", "me", 200, bad)
    with pytest.raises(AssertionError, match="does not list"):
        check_response("GET", "me", 404, {"error": "not_found", "message": "x"})
    with pytest.raises(AssertionError, match="does not match"):
        check_response("GET", "leases/l-1", 404, {"error": "forbidden", "message": "x"})


# ------------------------------------------------------------- the live server


async def test_every_documented_response_is_what_the_server_sends(
    api: Any, jp_serverapp: Any, jp_http_port: int, jp_base_url: str, monkeypatch: Any
) -> None:
    check = CheckedApi(api)
    runtime = jp_serverapp.web_app.settings["gpubroker"]
    owner = runtime.owner

    me = await check("GET", "me", expect=200)
    assert me == {"user": owner, "groups": ["lab"], "admin": True, "kernel_id": None}
    (gpu,) = (await check("GET", "devices", expect=200))["gpus"]
    assert gpu["mig_enabled"] and len(gpu["devices"]) == 7
    assert all(d["holder"] is None and d["profile"] == "1g.10gb" for d in gpu["devices"])

    granted = await _requests_and_leases(check, owner)
    await _malformed_and_impossible(check, owner)
    await _usage(check, owner)
    await _limits(check)
    await _device_metrics(check, runtime, gpu)
    kernel = await _kernel_token(check, granted)
    await _admin(check, runtime, gpu, granted, kernel)
    await _whatif(check, kernel, monkeypatch)
    await _unauthenticated(check, granted)
    await _events(check, jp_http_port, jp_base_url, jp_serverapp.identity_provider.token)

    # Revoked: the kernel's token no longer works.
    await check("DELETE", "tokens/k1", expect=204)
    refused = await check("GET", "me", headers=kernel, expect=403)
    assert refused["error"] == "http_403"
    await _storage_full(check, runtime.core.store)

    missing = documented_responses() - check.seen
    assert not missing, f"documented but never produced: {sorted(missing)}"


async def _requests_and_leases(check: CheckedApi, owner: str) -> dict[str, Any]:
    first = await check(
        "POST",
        "requests",
        {
            "profile": "1g.10gb",
            "holder": "nb-1",
            "job_class": "interactive",
            "expected_duration_s": 600,
            "limit_s": 3600,
            "groups": ["lab"],
        },
        expect=201,
    )
    assert first["state"] == "granted" and first["position"] is None and first["eta"] is None
    lease = first["lease"]
    assert lease["state"] == "active" and lease["id"] == first["lease_id"]
    assert lease["user"] == owner and lease["group"] == "lab" and lease["profile"] == "1g.10gb"
    assert lease["devices"][0].startswith("MIG-")
    others = [await check("POST", "requests", {"min_memory_gb": 5}, expect=201) for _ in range(6)]
    assert all(r["state"] == "granted" for r in others)

    waiting = await check(
        "POST", "requests", {"profile": "1g.10gb", "job_class": "batch"}, expect=201
    )
    assert waiting["state"] == "queued" and waiting["position"] == 1 and waiting["lease"] is None
    # The machine is full and no hold has ever ended (a stated expected_duration_s is not
    # history): only the first lease's time limit says when a slice is free at the latest.
    assert waiting["eta_known"] and waiting["eta_basis"] == "time limits"
    assert waiting["eta"] == waiting["eta_range"]["high"] == lease["ends_at"]

    queue = await check("GET", "queue", expect=200)
    assert queue["length"] == 1
    assert queue["queue"][0]["id"] == waiting["id"] and queue["queue"][0]["mine"]
    live = await check("GET", "requests", expect=200)
    assert len(live["requests"]) == 8
    fetched = await check("GET", f"requests/{waiting['id']}", expect=200)
    assert fetched["state"] == "queued" and fetched["position"] == 1 and fetched["lease"] is None
    again = await check("GET", f"requests/{first['id']}", expect=200)
    assert again["lease"]["id"] == lease["id"] and again["holder"] == "nb-1"
    leases = await check("GET", "leases", expect=200)
    assert len(leases["leases"]) == 7
    assert (await check("GET", f"leases/{lease['id']}", expect=200))["state"] == "active"
    (gpu,) = (await check("GET", "devices", expect=200))["gpus"]
    holders = {d["uuid"]: d["holder"] for d in gpu["devices"]}
    assert holders[lease["devices"][0]] == {
        "user": owner,
        "lease_id": lease["id"],
        "request_id": first["id"],
    }

    await asyncio.sleep(0.01)
    renewed = await check("POST", f"leases/{lease['id']}/renew", expect=200)
    assert parse(renewed["expires_at"]) > parse(lease["expires_at"])
    assert renewed["on_reclaim"] == "shutdown"
    report = {"execution_state": "idle", "last_activity": renewed["granted_at"]}
    reported = await check("POST", f"leases/{lease['id']}/renew", {"kernel": report}, expect=200)
    assert reported["id"] == lease["id"]
    garbled = await check(
        "POST", f"leases/{lease['id']}/renew", {"kernel": {"execution_state": "idle"}}, expect=400
    )
    assert garbled["message"] == (
        "'kernel' must be an object with 'execution_state' and 'last_activity'"
    )
    held = await check("POST", f"leases/{lease['id']}/keep", expect=200)
    assert held["state"] == "active" and held["reclaim_at"] is None
    assert lease["limit_s"] == 3600 and lease["extensions"] == 0
    extend = f"leases/{lease['id']}/extend"
    longer = await check("POST", extend, {"seconds": 1800}, expect=200)
    assert longer["extensions"] == 1 and longer["extended_s"] == 1800
    assert parse(longer["ends_at"]) - parse(lease["ends_at"]) == timedelta(seconds=1800)
    bad = await check("POST", extend, {"seconds": 0}, expect=400)
    assert bad["message"] == (
        "an extension must be seconds, at least 0.001 and at most a year, not 0"
    )
    kept = await check("POST", f"requests/{waiting['id']}/renew", expect=200)
    assert kept["state"] == "queued" and kept["position"] == 1 and kept["ttl_s"] > 0
    assert parse(kept["expires_at"]) > parse(waiting["expires_at"])
    assert first["expires_at"] is None  # a granted request lives by its lease

    cancelled = await check("DELETE", f"requests/{waiting['id']}", expect=200)
    assert cancelled["state"] == "cancelled" and cancelled["position"] is None
    assert cancelled["ended_at"] is not None and cancelled["expires_at"] is None
    for method, path in (
        ("DELETE", f"requests/{waiting['id']}"),
        ("POST", f"requests/{waiting['id']}/renew"),
    ):
        assert (await check(method, path, expect=409))["error"] == "conflict"

    released = await check("DELETE", f"leases/{lease['id']}", expect=200)
    assert released["state"] == "released" and released["ended_at"] is not None
    for method, path in (
        ("DELETE", f"leases/{lease['id']}"),
        ("POST", f"leases/{lease['id']}/renew"),
        ("POST", f"leases/{lease['id']}/keep"),
    ):
        assert (await check(method, path, expect=409))["error"] == "conflict"
    ended_extend = await check("POST", extend, {"seconds": 60}, expect=409)
    assert ended_extend["error"] == "conflict"
    ended = await check("GET", f"requests/{first['id']}", expect=200)
    assert ended["state"] == "released" and ended["lease"]["state"] == "released"

    # Cancelling a granted request releases its lease.
    dropped = await check("DELETE", f"requests/{others[0]['id']}", expect=200)
    assert dropped["state"] == "released" and dropped["lease"]["state"] == "released"

    for method, path in (
        ("GET", "requests/r-000000000000"),
        ("DELETE", "requests/r-000000000000"),
        ("POST", "requests/r-000000000000/renew"),
        ("GET", "leases/l-000000000000"),
        ("DELETE", "leases/l-000000000000"),
        ("POST", "leases/l-000000000000/renew"),
        ("POST", "leases/l-000000000000/keep"),
    ):
        assert (await check(method, path, expect=404))["error"] == "not_found"
    missing = await check("POST", "leases/l-000000000000/extend", {"seconds": 60}, expect=404)
    assert missing["error"] == "not_found"
    return others[1]


async def _malformed_and_impossible(check: CheckedApi, owner: str) -> None:
    async def refused(body: Any, status: int, code: str, **kw: Any) -> str:
        reply = await check("POST", "requests", body, expect=status, **kw)
        assert reply["error"] == code, reply
        return str(reply["message"])

    assert "JSON" in await refused(None, 400, "invalid_request", raw="{not json")
    assert "object" in await refused(None, 400, "invalid_request", raw="[1, 2]")
    assert "colour" in await refused(
        {"profile": "1g.10gb", "colour": "red"}, 400, "invalid_request"
    )
    await refused({}, 400, "invalid_request")
    await refused({"profile": "1g.10gb", "gpus": 1}, 400, "invalid_request")
    await refused({"profile": "1g.10gb", "job_class": "urgent"}, 400, "invalid_request")
    await refused({"profile": "1g.10gb", "groups": "lab"}, 400, "invalid_request")
    await refused({"profile": "9g.99gb"}, 400, "unknown_profile")
    assert "whole GPU" in await refused({"gpus": 1}, 422, "unsatisfiable")
    await refused({"profile": "3g.40gb"}, 422, "unsatisfiable")

    # Quotas: set one that forbids a slice, see it refuse, list, delete.
    quota = await check("PUT", f"quotas/user/{owner}", {"max_gpus": 0.1}, expect=200)
    assert quota == {
        "kind": "user",
        "name": owner,
        "share": None,
        "max_gpus": 0.1,
        "gpu_hours": None,
        "period_s": None,
    }
    assert "0.1" in await refused({"profile": "1g.10gb"}, 403, "quota_exceeded")
    group = {"share": 2, "gpu_hours": 10, "period_s": 86400}
    await check("PUT", "quotas/group/lab", group, expect=200)
    listed = await check("GET", "quotas", expect=200)
    assert {(q["kind"], q["name"]) for q in listed["quotas"]} == {("user", owner), ("group", "lab")}
    await check("DELETE", f"quotas/user/{owner}", expect=204)
    assert (await check("DELETE", f"quotas/user/{owner}", expect=404))["error"] == "not_found"
    listed = await check("GET", "quotas", expect=200)
    assert [q["name"] for q in listed["quotas"]] == ["lab"]
    for body, path in (
        ({"gpu_hours": 1}, "quotas/user/x"),  # a budget needs a period
        ({"cap": 1}, "quotas/user/x"),
        ({"share": -1}, "quotas/group/x"),
        ({"share": 1}, "quotas/user/a\nname"),  # a line break: no name holds one
    ):
        assert (await check("PUT", path, body, expect=400))["error"] == "invalid_request"
    reply = await check("PUT", "quotas/user/x", None, raw="not json", expect=400)
    assert reply["error"] == "invalid_request"


async def _usage(check: CheckedApi, owner: str) -> None:
    now = datetime.now(timezone.utc)
    usage = await check("GET", "usage", expect=200)
    assert usage["by"] == "user" and set(usage["gpu_hours"]) == {owner}
    assert 0 < usage["gpu_hours"][owner] < 0.1
    window = {"since": iso(now - timedelta(hours=1)), "until": iso(now + timedelta(minutes=1))}
    by_group = await check("GET", "usage", expect=200, by="group", **window)
    assert set(by_group["gpu_hours"]) == {"lab"}  # the owner's requests default to their group
    by_profile = await check("GET", "usage", expect=200, by="profile", **window)
    assert set(by_profile["gpu_hours"]) == {"1g.10gb"}
    by_class = await check("GET", "usage", expect=200, by="job_class", since=window["since"])
    assert set(by_class["gpu_hours"]) == {"interactive"}
    later = {"since": iso(now + timedelta(hours=1)), "until": iso(now + timedelta(hours=2))}
    assert (await check("GET", "usage", expect=200, **later))["gpu_hours"] == {}
    naive = (now - timedelta(days=1)).replace(tzinfo=None).isoformat()  # read as UTC
    assert set((await check("GET", "usage", expect=200, since=naive))["gpu_hours"]) == {owner}
    for params in (
        {"since": "yesterday"},
        {"since": later["until"], "until": later["since"]},
        {"by": "colour"},
    ):
        assert (await check("GET", "usage", expect=400, **params))["error"] == "invalid_request"


async def _limits(check: CheckedApi) -> None:
    """Time-limit rules: an admin sets a group's, a request over it is refused, the rule
    is listed, deleted, and a rule for nothing known is a 400."""
    assert await check("GET", "limits", expect=200) == {"required": False, "rules": []}
    rule = await check("PUT", "limits/group/lab", {"max_s": 1800}, expect=200)
    assert rule == {
        "kind": "group",
        "name": "lab",
        "default_s": None,
        "max_s": 1800,
        "required": False,
        "source": "admin",
    }
    body = {"profile": "1g.10gb", "groups": ["lab"], "limit_s": 3600}
    refused = await check("POST", "requests", body, expect=400)
    assert "longer than the 30 min allowed for group 'lab'" in refused["message"]
    assert (await check("GET", "limits", expect=200))["rules"] == [rule]
    await check("DELETE", "limits/group/lab", expect=204)
    assert (await check("DELETE", "limits/group/lab", expect=404))["error"] == "not_found"
    for method, path, body in (
        ("PUT", "limits/class/urgent", {"max_s": 60}),
        ("PUT", "limits/group/lab", {"max_s": -1}),
        ("DELETE", "limits/user/x", None),
    ):
        assert (await check(method, path, body, expect=400))["error"] == "invalid_request"


async def _device_metrics(check: CheckedApi, runtime: Any, gpu: dict[str, Any]) -> None:
    """Samples of a GPU and of a MIG slice, after two sampling passes."""
    for _ in range(2):
        await runtime.sample()
    for uuid in (gpu["uuid"], gpu["devices"][0]["uuid"]):
        metrics = await check("GET", f"devices/{uuid}/metrics", expect=200)
        assert metrics["uuid"] == uuid and metrics["resolution_s"] == 5
        assert len(metrics["samples"]) == 2 and metrics["events"] == []
    two_days_ago = iso(datetime.now(timezone.utc) - timedelta(days=2))
    older = await check("GET", f"devices/{uuid}/metrics", expect=200, since=two_days_ago)
    assert older["resolution_s"] == 60  # two days back: minute averages
    bad = await check("GET", f"devices/{uuid}/metrics", expect=400, since="yesterday")
    assert bad["error"] == "invalid_request"
    missing = await check("GET", "devices/GPU-nope/metrics", expect=404)
    assert missing["error"] == "not_found"


async def _kernel_token(check: CheckedApi, granted: dict[str, Any]) -> dict[str, str]:
    """A kernel-scoped token: what it may do, and the 403s of what it may not."""
    issued = await check("POST", "tokens", {"kernel_id": "k1"}, expect=201)
    kernel = {TOKEN_HEADER: issued["token"]}
    for body in ({"kernel_id": "not a kernel!"}, {"kernel_id": "k1\n"}, {}, {"kernel_id": 7}):
        assert (await check("POST", "tokens", body, expect=400))["error"] == "invalid_request"

    me = await check("GET", "me", headers=kernel, expect=200)
    assert me["kernel_id"] == "k1" and me["admin"] is False
    await check("POST", "tokens/k1/renew", expect=204)  # its server: the kernel still runs
    gone = await check("POST", "tokens/k-none/renew", expect=404)
    assert gone["message"] == f"{issued['user']} has no live token for kernel k-none"
    await check("POST", "tokens/k1/renew", headers=kernel, expect=403)  # never itself
    mine = await check(
        "POST",
        "requests",
        {"profile": "1g.10gb", "holder": "elsewhere"},
        headers=kernel,
        expect=201,
    )
    assert mine["holder"] == "k1"
    second = await check("POST", "requests", {"min_memory_gb": 1}, headers=kernel, expect=409)
    assert "CUDA shows a process one MIG device" in second["message"]
    assert (await check("GET", f"requests/{mine['id']}", headers=kernel, expect=200))["id"]
    assert [
        r["id"] for r in (await check("GET", "requests", headers=kernel, expect=200))["requests"]
    ] == [mine["id"]]
    lease_id = granted["lease"]["id"]
    for method, path, body in (
        ("GET", f"requests/{granted['id']}", None),
        ("DELETE", f"requests/{granted['id']}", None),
        ("POST", f"requests/{granted['id']}/renew", None),
        ("GET", f"leases/{lease_id}", None),
        ("DELETE", f"leases/{lease_id}", None),
        ("POST", f"leases/{lease_id}/renew", None),
        ("POST", f"leases/{lease_id}/keep", None),
        ("POST", f"leases/{lease_id}/extend", {"seconds": 60}),
        ("PUT", "quotas/user/x", {"share": 2}),
        ("DELETE", "quotas/group/lab", None),
        ("GET", "limits", None),
        ("PUT", "limits/group/lab", {"max_s": 60}),
        ("DELETE", "limits/group/lab", None),
        ("POST", "tokens", {"kernel_id": "k2"}),
        ("DELETE", "tokens/k1", None),
    ):
        reply = await check(method, path, body, headers=kernel, expect=403)
        assert reply["error"] == "forbidden", (method, path, reply)
    reply = await check("GET", "usage", headers=kernel, expect=403, by="group")
    assert reply["error"] == "forbidden"
    # Still the admin's: nothing the kernel tried changed it.
    still = await check("GET", f"leases/{lease_id}", expect=200)
    assert still["state"] == "active"
    await check("DELETE", f"requests/{mine['id']}", headers=kernel, expect=200)
    return kernel


async def _admin(
    check: CheckedApi,
    runtime: Any,
    gpu: dict[str, Any],
    granted: dict[str, Any],
    kernel: dict[str, str],
) -> None:
    """Drain and undrain, a class change, reclaim records and the audit log, as the
    owner (this server's admin); a kernel token is refused each of them."""
    uuid, slice_uuid = gpu["uuid"], gpu["devices"][0]["uuid"]
    drained = await check("POST", f"devices/{uuid}/drain", {"reason": "a fan"}, expect=200)
    assert drained["drained"]["cause"] == "admin"
    assert drained["drained"]["reason"] == f"drained by {runtime.owner}: a fan"
    for body in ({}, {"reason": " "}, {"reason": "x", "until": "never"}):
        await check("POST", f"devices/{uuid}/drain", body, expect=400)
    await check("POST", "devices/GPU-nope/drain", {"reason": "x"}, expect=404)

    waiting = await check(
        "POST", "requests", {"profile": "1g.10gb", "job_class": "batch"}, expect=201
    )
    assert waiting["state"] == "queued"  # nothing is granted on a drained GPU
    moved = await check(
        "PATCH", f"requests/{waiting['id']}", {"job_class": "interactive"}, expect=200
    )
    assert moved["job_class"] == "interactive" and moved["position"] == 1
    await check("PATCH", f"requests/{waiting['id']}", {"job_class": "urgent"}, expect=400)
    await check("PATCH", "requests/r-000000000000", {"job_class": "batch"}, expect=404)
    busy = await check("PATCH", f"requests/{granted['id']}", {"job_class": "batch"}, expect=409)
    assert "only a waiting one" in busy["message"]

    not_itself = await check("DELETE", f"devices/{slice_uuid}/drain", expect=409)
    assert uuid in not_itself["message"]
    await check("DELETE", "devices/GPU-nope/drain", expect=404)
    await check("DELETE", f"devices/{uuid}/drain", expect=400, reason="x" * 501)
    lifted = await check("DELETE", f"devices/{uuid}/drain", expect=200, reason="fan replaced")
    assert lifted["drained"] is None
    assert (await check("GET", f"requests/{waiting['id']}", expect=200))["state"] == "granted"
    await check("DELETE", f"requests/{waiting['id']}", expect=400, reason="x" * 501)
    await check("DELETE", f"requests/{waiting['id']}", expect=200)

    runtime.backend.simulator.inject_overheat(uuid, 95)
    await runtime.sample()
    refused = await check("DELETE", f"devices/{uuid}/drain", expect=409)
    assert "health check" in refused["message"]
    hot = (await check("GET", "alerts", expect=200))["active"]
    assert [(a["uuid"], a["kind"], a["severity"], a["ended"]) for a in hot] == [
        (uuid, "temperature", "critical", None)
    ]
    runtime.backend.simulator.clear_faults(uuid)
    await runtime.sample()
    assert (await check("GET", "devices", expect=200))["gpus"][0]["drained"] is None
    alerts = await check("GET", "alerts", expect=200)
    assert alerts["active"] == [] and alerts["next_before"] is None
    (past,) = alerts["history"]
    assert (past["id"], past["since"]) == (hot[0]["id"], hot[0]["since"]) and past["ended"]
    page = await check("GET", "alerts", expect=200, limit="1", before=str(past["id"]))
    assert page["history"] == []
    await check("GET", "alerts", expect=400, limit="0")

    leases = (await check("GET", "leases", expect=200))["leases"]
    taken = next(x for x in leases if x["id"] != granted["lease"]["id"])
    now = datetime.now(timezone.utc).timestamp()
    evidence = {"kernel_state": "idle", "kernel_last_activity": now - 7200, "idle_s": 7200.0}
    runtime.core.reclaim(taken["id"], "idle for 2 h", cause="idle", evidence=evidence)
    (record,) = (await check("GET", "reclaims", expect=200))["reclaims"]
    assert (record["lease_id"], record["cause"], record["evidence"]["idle_s"]) == (
        taken["id"],
        "idle",
        7200.0,
    )
    assert parse(record["evidence"]["kernel_last_activity"]) < parse(record["at"])
    assert (await check("GET", "reclaims", expect=200, user=runtime.owner))["reclaims"]
    assert (await check("GET", "reclaims", expect=200, user="nobody"))["reclaims"] == []
    await check("GET", "reclaims", expect=400, since="yesterday")
    forecast = await check("GET", "forecast", expect=200)  # its answer checked against the doc
    assert not forecast["ready"] and forecast["message"].startswith("not enough history yet")
    await check("GET", "forecast", expect=400, weeks="0")

    log = (await check("GET", "audit", expect=200))["audit"]
    assert [a["action"] for a in log if not a["action"].endswith(("_quota", "_time_limits"))] == [
        "drain",
        "set_class",
        "undrain",
    ]
    assert {a["actor"] for a in log} == {runtime.owner}
    page = await check("GET", "audit", expect=200, actor=runtime.owner, limit="1")
    assert len(page["audit"]) == 1 and page["next_after"] == log[0]["id"]
    await check("GET", "audit", expect=400, limit="0")

    for method, path, body in (
        ("PATCH", f"requests/{granted['id']}", {"job_class": "batch"}),
        ("POST", f"devices/{uuid}/drain", {"reason": "x"}),
        ("DELETE", f"devices/{uuid}/drain", None),
        ("GET", "reclaims", None),
        ("GET", "audit", None),
        ("GET", "alerts", None),
        ("GET", "forecast", None),
        ("GET", "whatif", None),
        ("POST", "whatif", {"gpus": 1}),
    ):
        reply = await check(method, path, body, headers=kernel, expect=403)
        assert reply["error"] == "forbidden" and "only admins" in reply["message"]


async def _whatif(check: CheckedApi, kernel: dict[str, str], monkeypatch: Any) -> None:
    """A what-if replay of this server's own history, a bad field, and a second one asked
    while the first runs (held in its worker thread meanwhile): a 409."""
    before = await check("GET", "whatif", expect=200)
    assert (before["running"], before["last"]) == (None, None)
    done = await check("POST", "whatif", {"gpus": 1, "dynamic_mig": False}, expect=200)
    assert done["what_if"]["requests"] == done["replayed"]["requests"] > 0
    assert (await check("GET", "whatif", expect=200))["last"] == done
    refused = await check("POST", "whatif", {"gpus": -1}, expect=400)
    assert refused["message"] == "the machine has 1 GPU: it cannot lose 1"
    await check("POST", "whatif", {"policy": "fastest"}, expect=400)

    gate, compare = threading.Event(), whatif.compare
    monkeypatch.setattr(whatif, "compare", lambda *a: gate.wait(30) and compare(*a))
    first = asyncio.ensure_future(check("POST", "whatif", {"gpus": 2}, expect=200))
    while not (await check("GET", "whatif", expect=200))["running"]:
        await asyncio.sleep(0.05)
    busy = await check("POST", "whatif", {"gpus": 3}, expect=409)
    assert "one runs at a time" in busy["message"]
    gate.set()
    assert (await first)["asked"] == {"gpus": 2}


async def _unauthenticated(check: CheckedApi, granted: dict[str, Any]) -> None:
    """Every operation refuses a call without a credential, and one with a made-up token."""
    values = {
        "request_id": granted["id"],
        "lease_id": granted["lease"]["id"],
        "kind": "user",
        "name": "someone",
        "kernel_id": "k1",
        "uuid": granted["lease"]["devices"][0],
    }
    for template, method in operations():
        path = re.sub(r"\{([^}]+)\}", lambda m: values[m.group(1)], template)[1:]
        body = {} if method in ("post", "put", "patch") else None
        for headers in (NO_CREDENTIAL, {TOKEN_HEADER: "gpb_made-up"}):
            reply = await check(method.upper(), path, body, headers=headers, expect=403)
            assert reply["error"] == "http_403"
    assert (await check("GET", f"leases/{values['lease_id']}", expect=200))["state"] == "active"


async def _storage_full(check: CheckedApi, store: Any) -> None:
    """A state file that cannot grow (as on a full disk): submits, quotas and time limits
    are 507s."""
    pages = fill_state_file(store)
    for method, call in (
        ("POST", lambda i: ("requests", {"profile": "1g.10gb", "holder": "o" * 256})),
        ("PUT", lambda i: (f"quotas/group/g{i:04}{'x' * 58}", {"share": 2})),
        ("PUT", lambda i: (f"limits/group/g{i:04}{'x' * 58}", {"max_s": 60})),
    ):
        status, reply, _ = await until_full(check.api, method, call)
        assert (status, reply["error"]) == (507, "storage_full")
        check.record(find_operation(method, call(0)[0]), method, status)
    free_state_file(store, pages)


async def _events(check: CheckedApi, port: int, base_url: str, token: str) -> None:
    """The event stream: a hello, then each change and the caller's positions when its
    waiting request moves, all valid envelopes with increasing ids; the overview."""
    seen: list[dict[str, Any]] = []
    url = f"{base_url}{API_PREFIX}/events"
    stream = await EventStream.open(port, url, {"Authorization": f"token {token}"})

    async def until(kind: str) -> dict[str, Any]:
        while True:
            event = await stream.next()
            validate(event, EVENT, f"event {event.get('type')}")
            seen.append(event)
            if event["type"] == kind:
                return event

    async def fill() -> None:
        (gpu,) = (await check("GET", "devices", expect=200))["gpus"]
        for _ in [d for d in gpu["devices"] if d["holder"] is None]:
            await check("POST", "requests", {"profile": "1g.10gb"}, expect=201)

    try:
        assert stream.status == 200 and stream.content_type == "text/event-stream"
        hello = await until("hello")
        assert seen == [hello] and hello["data"]["requests"] == []
        check.record("/events", "get", 200)

        granted = await check("POST", "requests", {"profile": "1g.10gb"}, expect=201)
        # queued, then granted within one window: the request's latest state wins
        event = await until("granted")
        assert event["data"]["request_id"] == granted["id"]
        assert event["data"]["lease_id"] == granted["lease"]["id"]
        assert event["data"]["request"]["lease"]["id"] == granted["lease"]["id"]
        assert event["data"]["devices"] == granted["lease"]["devices"]

        await fill()
        waiting = await check("POST", "requests", {"profile": "1g.10gb"}, expect=201)
        assert waiting["state"] == "queued"
        positions = (await until("positions"))["data"]
        assert positions["queue_length"] == 1
        assert [(r["id"], r["position"]) for r in positions["requests"]] == [(waiting["id"], 1)]
        assert positions["requests"][0]["eta"] is not None
        assert positions["ahead"] == {waiting["id"]: {}}

        overview = await check("GET", "overview", expect=200)
        assert [e["id"] for e in overview["queue"]] == [waiting["id"]]
        assert {r["id"] for r in overview["requests"]} >= {granted["id"], waiting["id"]}
        assert {x["id"] for x in overview["leases"]} >= {granted["lease"]["id"]}

        await check("DELETE", f"leases/{granted['lease']['id']}", expect=200)
        assert (await until("released"))["data"]["lease_id"] == granted["lease"]["id"]
        assert (await until("granted"))["data"]["request_id"] == waiting["id"]

        await check("PUT", "quotas/group/lab", {"share": 3}, expect=200)
        quota = (await until("quota"))["data"]
        assert (quota["kind"], quota["name"], quota["user"], quota["share"]) == (
            "group",
            "lab",
            "",
            3,
        )
        await check("PUT", "limits/group/lab", {"max_s": 3600}, expect=200)
        limits = (await until("limits"))["data"]
        assert (limits["kind"], limits["name"], limits["max_s"], limits["source"]) == (
            "group",
            "lab",
            3600,
            "admin",
        )
        await check("DELETE", "limits/group/lab", expect=204)
        limits = (await until("limits"))["data"]  # none configured: none in force
        assert (limits["max_s"], limits["required"], limits["source"]) == (None, False, None)
        await check("DELETE", f"requests/{waiting['id']}", expect=200)
        assert (await until("released"))["data"]["request_id"] == waiting["id"]
    finally:
        stream.close()
    assert [e["type"] for e in seen].count("hello") == 1
    ids = [e["id"] for e in seen if e["type"] not in ("hello", "positions", "readings")]
    assert ids == sorted(set(ids))  # each event once, in order
    assert [e["id"] for e in seen] == sorted(e["id"] for e in seen)
    bad = await check("GET", "events", expect=400, last_event_id="yesterday")
    assert "Last-Event-ID" in bad["message"]
    bad = await check("GET", "events", expect=400, snapshot="maybe")
    assert "'snapshot' must be true or false" in bad["message"]
