"""No input makes the API answer 500: every bad body, field, path, Host header or a full
state file is a JSON 4xx (507 for storage) that says what is wrong, with nothing written."""

from __future__ import annotations

import json
import math
from typing import Any
from urllib.parse import parse_qsl

import pytest
from bad_values import LONG_NUMBER
from openapi_check import check_response, fill_state_file, free_state_file, until_full

from jupyter_gpubroker.api import TOKEN_HEADER
from jupyter_gpubroker.wire.sizes import DURATIONS

Api = Any
BODY_ROUTES = [
    ("POST", "requests"),
    ("POST", "tokens"),
    ("PUT", "quotas/user/ann"),
    ("PUT", "limits/group/lab"),
]
NOT_JSON_OBJECTS = {
    "not UTF-8": b'{"profile": "1g.10gb\xff"}',
    "nested 10000 deep": '{"profile": ' * 10_000 + "1" + "}" * 10_000,
    "a list nested 100000 deep": "[" * 100_000 + "]" * 100_000,
    "an integer of 5000 digits": "1" * 5000,
    "empty": "",
}


async def nothing_written(api: Api) -> None:
    """No request, lease, quota or time limit exists, and the broker still takes a good
    request."""
    assert (await api("GET", "requests"))[1] == {"requests": []}
    assert (await api("GET", "quotas"))[1] == {"quotas": []}
    assert (await api("GET", "limits"))[1]["rules"] == []
    status, reply = await api("POST", "requests", {"profile": "1g.10gb"})
    assert (status, reply["state"]) == (201, "granted")


async def refused(api: Api, method: str, path: str, status: int = 400, **kwargs: Any) -> str:
    got, reply = await api(method, path, **kwargs)
    assert (got, reply["error"]) == (status, "invalid_request" if status == 400 else got), reply
    check_response(method, path, got, reply, kwargs.get("body"))
    return str(reply["message"])


@pytest.mark.parametrize(("method", "path"), BODY_ROUTES)
@pytest.mark.parametrize("raw", NOT_JSON_OBJECTS.values(), ids=list(NOT_JSON_OBJECTS))
async def test_a_body_that_is_not_a_json_object_is_a_400(
    api: Api, method: str, path: str, raw: str | bytes
) -> None:
    message = await refused(api, method, path, raw=raw)
    assert "body" in message
    await nothing_written(api)


@pytest.mark.parametrize(
    "body",
    [
        {"profile": []},
        {"profile": {}},
        {"profile": 7},
        {"gpus": "2"},
        {"gpus": 1.5},
        {"gpus": True},
        {"min_memory_gb": "20"},
        {"min_memory_gb": 10**400},
        {"min_memory_gb": [20]},
        {"profile": "1g.10gb", "job_class": []},
        {"profile": "1g.10gb", "holder": {}},
        {"profile": "1g.10gb", "expected_duration_s": "60"},
        {"profile": "1g.10gb", "expected_duration_s": 10**400},
        {"profile": "1g.10gb", "groups": [[]]},
        {"profile": "1g.10gb", "groups": {}},
        {"min_memory_gb": 5e-324},  # a subnormal: 0 in all but name
        {"min_memory_gb": 1e-4},  # finer than the broker's resolution (0.001)
        {"min_memory_gb": 0},
        {"profile": "1g.10gb", "expected_duration_s": 5e-324},
        {"profile": "1g.10gb", "size": "big"},  # a field no request has
    ],
    ids=lambda body: json.dumps(body)[:40],
)
async def test_a_request_field_of_the_wrong_type_is_a_400(api: Api, body: dict[str, Any]) -> None:
    await refused(api, "POST", "requests", body=body)
    await nothing_written(api)


async def test_a_holder_and_a_different_owner_are_a_400_and_one_alone_is_answered_as_both(
    api: Api,
) -> None:
    """``owner`` is ``holder``'s old name: one or the other is taken (and answered under
    both names, as the API document says), two different holders are refused."""
    body = {"profile": "1g.10gb", "holder": "nb-1", "owner": "nb-2"}
    message = await refused(api, "POST", "requests", body=body)
    assert message == (
        "'holder' and 'owner' name two different holders: give 'holder' alone "
        "('owner' is its old name)"
    )
    await nothing_written(api)
    for body in ({"profile": "1g.10gb", "owner": "nb-3"}, {"profile": "1g.10gb", "holder": "nb-4"}):
        status, reply = await api("POST", "requests", body)
        check_response("POST", "requests", status, reply, body)
        holder = body.get("holder", body.get("owner"))
        assert (status, reply["holder"], reply["owner"]) == (201, holder, holder)


@pytest.mark.parametrize(
    "body",
    [
        {"gpu_hours": 1, "period_s": 1e-300},  # budget periods would overflow
        {"gpu_hours": 1, "period_s": 59},
        {"gpu_hours": 1, "period_s": 1e300},
        {"share": 1e-300},  # fair-share factors would divide by zero
        {"share": 1e300},
        {"max_gpus": 10**400},
        {"max_gpus": 1e-320},  # a limit that refuses everything, in disguise
        {"max_gpus": -0.0001},
        {"gpu_hours": 5e-324, "period_s": 3600},
        {"gpu_hours": [], "period_s": 3600},
        {"share": {}},
        {},  # nothing to set: DELETE resets a quota
        {"share": None, "max_gpus": None},
    ],
    ids=lambda body: json.dumps(body)[:40],
)
async def test_a_quota_no_later_step_could_use_is_refused_before_anything_is_written(
    api: Api, body: dict[str, Any]
) -> None:
    user = (await api("GET", "me"))[1]["user"]
    await refused(api, "PUT", f"quotas/user/{user}", body=body)
    await nothing_written(api)


async def test_an_amount_finer_than_the_resolution_is_refused_saying_what_is_taken(
    api: Api,
) -> None:
    user = (await api("GET", "me"))[1]["user"]
    message = await refused(api, "PUT", f"quotas/user/{user}", body={"max_gpus": 1e-320})
    assert message == "quota max_gpus must be 0 or a number from 0.001 to 1000000, not 1e-320"
    message = await refused(api, "POST", "requests", body={"min_memory_gb": 5e-324})
    assert message == "'min_memory_gb' must be a number from 0.001 to 4096, not 5e-324"
    for body in ({"max_gpus": 0}, {"max_gpus": 0.001}):  # none at all; the finest limit
        assert (await api("PUT", f"quotas/user/{user}", body))[0] == 200
    status, reply = await api("POST", "requests", {"min_memory_gb": 0.001})
    assert (status, reply["message"]) == (  # taken, then over the limit
        403,
        f"asks for 0.142857 GPU-equivalents but user {user!r} may hold at most 0.001",
    )


BAD_BODIES = {
    "a token with a field tokens lack": ("POST", "tokens", '{"kernel_id": "k1", "admin": true}'),
    "an undrain with random bytes": ("DELETE", "devices/{gpu}/drain", b"\x8f\x13\xfeGPU\xc3("),
    "an undrain with a reason and random bytes": (
        "DELETE",
        "devices/{gpu}/drain?reason=fixed",
        b"\x8f\x13\xfeGPU\xc3(",
    ),
    "an undrain with a field": ("DELETE", "devices/{gpu}/drain", '{"reason": "ok", "force": 1}'),
    "an undrain with a list": ("DELETE", "devices/{gpu}/drain", "[]"),
    "a cancel with a field": ("DELETE", "requests/{request}", '{"reason": "x", "notify": false}'),
    "a renewal with a field": ("POST", "leases/{lease}/renew", '{"ttl": 3600}'),
}


@pytest.mark.parametrize(("method", "path", "raw"), BAD_BODIES.values(), ids=list(BAD_BODIES))
async def test_a_body_not_of_its_calls_shape_is_a_400_not_ignored(
    api: Api, method: str, path: str, raw: str | bytes
) -> None:
    """Every body has a fixed shape (``additionalProperties: false`` in the document): a
    field it does not take, or bytes that are no JSON object, are refused, nothing done."""
    held = (await api("POST", "requests", {"profile": "1g.10gb"}))[1]
    (gpu,) = (await api("GET", "devices"))[1]["gpus"]
    assert (await api("POST", f"devices/{gpu['uuid']}/drain", {"reason": "repair"}))[0] == 200
    ids = {"gpu": gpu["uuid"], "request": held["id"], "lease": held["lease"]["id"]}
    path, _, query = path.format(**ids).partition("?")
    message = await refused(api, method, path, raw=raw, **dict(parse_qsl(query)))
    assert "body" in message or "unknown field(s)" in message, message
    assert (await api("GET", f"requests/{held['id']}"))[1]["state"] == "granted"
    (gpu,) = (await api("GET", "devices"))[1]["gpus"]
    assert gpu["drained"]["reason"].endswith("repair")


async def test_a_reason_in_both_the_query_and_the_body_is_a_400(api: Api) -> None:
    r = (await api("POST", "requests", {"profile": "1g.10gb"}))[1]
    message = await refused(api, "DELETE", f"requests/{r['id']}", body={"reason": "a"}, reason="b")
    assert message == "give the reason in the query or in the body, not both"
    assert (await api("GET", f"requests/{r['id']}"))[1]["state"] == "granted"


async def test_a_quota_put_with_an_empty_body_does_not_reset_the_quota(api: Api) -> None:
    user = (await api("GET", "me"))[1]["user"]
    assert (await api("PUT", f"quotas/user/{user}", {"max_gpus": 2}))[0] == 200
    message = await refused(api, "PUT", f"quotas/user/{user}", raw="")
    assert "empty" in message
    (quota,) = (await api("GET", "quotas"))[1]["quotas"]
    assert quota["max_gpus"] == 2


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "DELETE", "PATCH"])
async def test_an_unknown_api_path_is_the_apis_json_404(api: Api, method: str) -> None:
    raw = "{}" if method in ("POST", "PUT", "PATCH") else None
    for path in ("nope", "requests/r-1/nope", "quotas/user/x/y", "leases/l-1/renew/x", "v2/me"):
        status, reply = await api(method, path, raw=raw)
        assert status == 404, (method, path, reply)
        assert reply["error"] == "not_found" and path in reply["message"]
        # Without a credential it tells nothing, as every API path does.
        status, reply = await api(method, path, raw=raw, headers={"Authorization": ""})
        assert (status, reply["error"]) == (403, "http_403"), (method, path, reply)


async def test_a_kernel_token_is_refused_under_a_foreign_host_like_a_jupyter_token(
    api: Api,
) -> None:
    token = (await api("POST", "tokens", {"kernel_id": "k1"}))[1]["token"]
    foreign = {"Host": "gpus.attacker.example"}
    for credential in ({}, {TOKEN_HEADER: token}):
        status, reply = await api("GET", "me", headers={**credential, **foreign})
        assert (status, reply["error"]) == (403, "http_403"), credential
        status, reply = await api(
            "POST", "requests", {"profile": "1g.10gb"}, {**credential, **foreign}
        )
        assert status == 403, credential
        assert (await api("GET", "me", headers=credential))[0] == 200
    assert (await api("GET", "requests"))[1] == {"requests": []}


async def test_a_full_state_file_is_a_507_that_names_it_and_writes_nothing(
    api: Api, jp_serverapp: Any, broker_config: dict[str, Any]
) -> None:
    """The file is made full for real: SQLite's page limit raises SQLITE_FULL, the same
    error a full disk does."""
    store = jp_serverapp.web_app.settings["gpubroker"].core.store
    pages = fill_state_file(store)
    body = {"profile": "1g.10gb", "holder": "x" * 256}
    status, reply, accepted = await until_full(api, "POST", lambda i: ("requests", body))
    assert (status, reply["error"]) == (507, "storage_full")
    assert broker_config["state_file"] in reply["message"] and "disk" in reply["message"]
    names = [f"user{i:03}" + "x" * 50 for i in range(2000)]
    status, reply, quotas = await until_full(
        api, "PUT", lambda i: (f"quotas/user/{names[i]}", {"share": 2})
    )
    assert (status, reply["error"]) == (507, "storage_full")
    listed = (await api("GET", "requests"))[1]["requests"]
    assert [r["id"] for r in listed] == [r["id"] for r in accepted]
    assert len((await api("GET", "quotas"))[1]["quotas"]) == len(quotas)

    free_state_file(store, pages)  # space freed: it works again
    assert (await api("POST", "requests", body))[0] == 201
    assert (await api("PUT", f"quotas/user/{names[len(quotas)]}", {"share": 2}))[0] == 200


# ----------------------------------------------------- every number the API takes

JUNK = {
    "a 400-digit integer": 10**400,
    "2**64": 2**64,
    "1e308": 1e308,
    "-1e308": -1e308,
    "NaN": math.nan,
    "Infinity": math.inf,
    "a subnormal": 5e-324,
    "text": "60",
    "a list": [60],
    "an object nested in a list": [{"seconds": [60]}],
    "true": True,
}
"""Values no number field takes: too large for a float, at a float's edges, not numbers."""
SLICE = {"profile": "1g.10gb"}
NUMBERS = {
    # field: (method, path, body with the value, the words its refusal starts with)
    "gpus": ("POST", "requests", lambda v: {"gpus": v}, "'gpus' must be"),
    "min_memory_gb": ("POST", "requests", lambda v: {"min_memory_gb": v}, "'min_memory_gb'"),
    "expected_duration_s": (
        "POST",
        "requests",
        lambda v: {**SLICE, "holder": "x", "expected_duration_s": v},
        "expected_duration_s must be",
    ),
    "limit_s": (
        "POST",
        "requests",
        lambda v: {**SLICE, "holder": "x", "limit_s": v},
        "the time limit must be",
    ),
    "seconds": ("POST", "leases/{lease}/extend", lambda v: {"seconds": v}, "an extension must"),
    "holder_pid": ("POST", "leases/{lease}/renew", lambda v: {"holder_pid": v}, "'holder_pid'"),
    "share": ("PUT", "quotas/user/{user}", lambda v: {"share": v}, "quota share must be"),
    "max_gpus": ("PUT", "quotas/user/{user}", lambda v: {"max_gpus": v}, "quota max_gpus must"),
    "gpu_hours": (
        "PUT",
        "quotas/user/{user}",
        lambda v: {"gpu_hours": v, "period_s": 3600},
        "quota gpu_hours must be",
    ),
    "period_s": (
        "PUT",
        "quotas/user/{user}",
        lambda v: {"gpu_hours": 1, "period_s": v},
        "quota period_s must be",
    ),
    "default_s": ("PUT", "limits/group/lab", lambda v: {"default_s": v}, "the default time"),
    "max_s": ("PUT", "limits/group/lab", lambda v: {"max_s": v}, "the maximum time limit"),
    "required": ("PUT", "limits/group/lab", lambda v: {"required": v}, "'required' is true"),
}


@pytest.mark.parametrize("field", NUMBERS)
async def test_every_number_field_refuses_what_is_no_number_it_takes_in_a_sentence(
    api: Api, field: str
) -> None:
    """A huge integer was a 500 in ``seconds`` (an OverflowError) and 1e308 a refusal
    counting 300-digit hours: every field is held to one check, and says so in a sentence
    that quotes the value as a person would write it. Nothing is written."""
    method, path, body, words = NUMBERS[field]
    held = (await api("POST", "requests", {**SLICE, "holder": "held", "limit_s": 3600}))[1]
    user = (await api("GET", "me"))[1]["user"]
    where = path.format(lease=held["lease"]["id"], user=user)
    for name, value in JUNK.items():
        if field == "required" and value is True:
            continue  # the one value it takes
        message = await refused(api, method, where, body=body(value))
        assert message.startswith(words), (name, message)
        if field != "holder_pid":  # its check is another change's
            assert not LONG_NUMBER.search(message), (name, message)
    lease = (await api("GET", f"leases/{held['lease']['id']}"))[1]
    assert (lease["ends_at"], lease["extensions"]) == (held["lease"]["ends_at"], 0)
    assert [r["id"] for r in (await api("GET", "requests"))[1]["requests"]] == [held["id"]]
    assert (await api("GET", "quotas"))[1] == {"quotas": []}
    assert (await api("GET", "limits"))[1]["rules"] == []


async def test_an_extension_beyond_a_year_is_refused_saying_a_year(api: Api) -> None:
    """Extending by 1e308 was refused with a 300-digit count of hours, and by 5e-324
    seconds granted (using up an extension): both are refused with what is taken."""
    lease = (await api("POST", "requests", {**SLICE, "limit_s": 3600}))[1]["lease"]
    extend = f"leases/{lease['id']}/extend"
    for seconds, shown in ((1e308, "1e+308"), (2**63, "9.22e+18"), (5e-324, "5e-324")):
        message = await refused(api, "POST", extend, body={"seconds": seconds})
        assert message == f"an extension must be {DURATIONS}, not {shown}"
    assert DURATIONS == "seconds, at least 0.001 and at most a year"
    status, longer = await api("POST", extend, {"seconds": 600})
    assert (status, longer["extensions"], longer["extended_s"]) == (200, 1, 600)


async def test_a_query_number_out_of_range_is_said_shortly(api: Api) -> None:
    message = await refused(api, "GET", "audit", after="9" * 4000)
    assert (
        message
        == "'after' must be an integer from 0 to 4.61e+18, not '999999999999...9999999999999'"
    )
    message = await refused(api, "GET", "alerts", limit="1e400")
    assert message == "'limit' must be an integer from 1 to 1000, not '1e400'"


BIDI = ["\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069"]
"""The controls that make text read in another direction (embeddings, overrides, isolates)."""


@pytest.mark.parametrize("control", BIDI, ids=lambda c: f"U+{ord(c):04X}")
async def test_a_name_holding_a_control_that_reverses_text_is_refused_and_never_audited(
    api: Api, control: str
) -> None:
    """A name like "ann\\u202egro" reads as "annorg": a quota or a time limit for it would
    show another name on the admin page and in the audit log. Refused where a name is
    given, the name quoted with its escape; nothing set, nothing recorded."""
    name = f"ann{control}gro"
    shown = f"'ann\\u{ord(control):04x}gro' holds '\\u{ord(control):04x}'"
    for kind in ("user", "group"):  # the name as it is: jp_fetch percent-encodes a path
        message = await refused(api, "PUT", f"quotas/{kind}/{name}", body={"share": 2})
        assert message.startswith(f"{kind} name {shown}: a name may hold any character but")
    message = await refused(api, "PUT", f"limits/group/{name}", body={"max_s": 3600})
    assert message.startswith(f"group name {shown}")
    assert (await api("GET", "audit"))[1]["audit"] == []
    await nothing_written(api)
