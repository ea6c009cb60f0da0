"""Time-limit rules through the API: admins see and set each class's, profile's and
group's default and maximum at run time (audited, kept in the state file), requests
checked afterwards get them; everyone else gets 403 and changes nothing."""

from __future__ import annotations

from typing import Any

import pytest

from jupyter_gpubroker.events import Published
from jupyter_gpubroker.wire.errors import Forbidden, InvalidRequest, NotFound
from jupyter_gpubroker.wire.times import iso

SLICE = {"profile": "1g.10gb"}
HOUR = 3600.0
TRAITS: dict[str, Any] = {
    "identity": "username",
    "admin_users": {"carol"},
    "user_groups": {"alice": ["lab"]},
    "max_time_limit": {"interactive": "8h"},
    "default_time_limit_by_profile": {"1g.10gb": "2h"},
}


def test_an_admin_sets_a_groups_limits_and_the_next_request_gets_them(start) -> None:
    api = start(**TRAITS)
    alice, carol = api.user_identity("alice"), api.user_identity("carol")
    assert api.limits(carol) == {
        "required": False,
        "rules": [
            {"kind": "class", "name": "interactive", "default_s": None, "max_s": 8 * HOUR}
            | {"required": False, "source": "config"},
            {"kind": "profile", "name": "1g.10gb", "default_s": 2 * HOUR, "max_s": None}
            | {"required": False, "source": "config"},
        ],
    }
    assert api.submit(alice, SLICE)["limit_s"] == 2 * HOUR

    rule = api.set_limits(carol, "group", "lab", {"default_s": HOUR, "max_s": 3 * HOUR})
    assert rule == {"kind": "group", "name": "lab", "default_s": HOUR, "max_s": 3 * HOUR} | {
        "required": False,
        "source": "admin",
    }
    assert api.submit(alice, SLICE)["limit_s"] == HOUR  # the group's default now
    with pytest.raises(InvalidRequest, match="longer than the 3 h 00 min allowed for group 'lab'"):
        api.submit(alice, {**SLICE, "limit_s": 4 * HOUR})
    (record,) = api.audit(carol)["audit"]
    assert (record["actor"], record["action"], record["target"]) == (
        "carol",
        "set_time_limits",
        "group:lab",
    )
    assert record["detail"] == {"default_s": HOUR, "max_s": 3 * HOUR, "required": False}

    api.delete_limits(carol, "group", "lab")
    assert api.submit(alice, SLICE)["limit_s"] == 2 * HOUR  # back to the profile's
    with pytest.raises(NotFound, match="no time limits were set here for group 'lab'"):
        api.delete_limits(carol, "group", "lab")
    assert [a["action"] for a in api.audit(carol)["audit"]] == [
        "set_time_limits",
        "delete_time_limits",
    ]


def test_rules_set_at_run_time_outlive_a_restart(start) -> None:
    api = start(**TRAITS)
    carol = api.user_identity("carol")
    api.set_limits(carol, "profile", "gpus=1", {"max_s": HOUR})
    api.set_limits(carol, "class", "interactive", {"max_s": 4 * HOUR, "required": True})
    api.runtime.stop()

    again = start(**TRAITS)
    carol, alice = again.user_identity("carol"), again.user_identity("alice")
    rules = {(r["kind"], r["name"]): r for r in again.limits(carol)["rules"]}
    assert rules[("class", "interactive")] == {
        "kind": "class",
        "name": "interactive",
        "default_s": None,
        "max_s": 4 * HOUR,
        "required": True,
        "source": "admin",
    }
    assert rules[("profile", "gpus=1")]["max_s"] == HOUR
    with pytest.raises(InvalidRequest, match="longer than the 4 h 00 min allowed for interactive"):
        again.submit(alice, {**SLICE, "limit_s": 5 * HOUR})
    assert again.submit(alice, SLICE)["limit_s"] == 2 * HOUR  # the profile's default
    with pytest.raises(InvalidRequest, match="a time limit is required here"):
        again.submit(alice, {"min_memory_gb": 5})  # no default for it: required


def test_a_change_of_limits_is_an_event_admins_see_in_full_users_barely_kernels_not(
    start,
) -> None:
    """Seen as a group's quota change is: an admin's streams get the rule now in force,
    a user's only that limits changed (machine-wide: no user), a kernel token's nothing
    (its streams get its own requests and its user's notices)."""
    api = start(**TRAITS)
    alice, carol = api.user_identity("alice"), api.user_identity("carol")
    kernel = api.token_identity(api.issue_token(alice, {"kernel_id": "k1"})["token"])
    assert kernel is not None
    published: list[Any] = []
    to_kernel: list[Any] = []
    api.runtime.events.subscribe(published.append)
    api.runtime.events.subscribe(to_kernel.append, audience=("alice", "k1"))
    api.set_limits(carol, "profile", "1g.10gb", {"max_s": HOUR})
    api.delete_limits(carol, "profile", "1g.10gb")
    events = [p for p in published if isinstance(p, Published)]
    full = [api.event(carol, p)["data"] for p in events]  # type: ignore[index]
    assert [(d["kind"], d["name"], d["max_s"], d["default_s"], d["source"]) for d in full] == [
        ("profile", "1g.10gb", HOUR, None, "admin"),
        ("profile", "1g.10gb", None, 2 * HOUR, "config"),  # back to the configured one
    ]
    assert [api.event(alice, p) for p in events] == [
        {"v": 1, "id": p.id, "type": "limits", "at": iso(p.event.at), "data": {"user": ""}}
        for p in events
    ]
    assert [api.event(kernel, p) for p in events] == [None, None]
    assert [p for p in to_kernel if isinstance(p, Published)] == []


def test_non_admins_and_kernel_tokens_neither_see_nor_change_limits(start) -> None:
    api = start(**TRAITS)
    alice, carol = api.user_identity("alice"), api.user_identity("carol")
    token = api.issue_token(carol, {"kernel_id": "k1"})["token"]
    kernel = api.token_identity(token)
    assert kernel is not None
    api.set_limits(carol, "group", "lab", {"max_s": 3 * HOUR})
    for who in (alice, kernel):
        with pytest.raises(Forbidden, match="only admins see and change time limits"):
            api.limits(who)
        with pytest.raises(Forbidden, match="only admins see and change time limits"):
            api.set_limits(who, "group", "lab", {"max_s": 10 * HOUR})
        with pytest.raises(Forbidden, match="only admins see and change time limits"):
            api.delete_limits(who, "group", "lab")
    (rule,) = [r for r in api.limits(carol)["rules"] if r["kind"] == "group"]
    assert rule["max_s"] == 3 * HOUR
    assert len(api.audit(carol)["audit"]) == 1


@pytest.mark.parametrize(
    ("kind", "name", "body", "message"),
    [
        ("group", "lab", {}, "time limits set at least one of default_s, max_s or required"),
        ("group", "lab", {"max_s": 0}, "the maximum time limit must be seconds, at least 1 and"),
        ("group", "lab", {"max_s": "2h"}, "the maximum time limit must be seconds, at least 1"),
        ("group", "lab", {"default_s": 7200, "max_s": 3600}, "the default time limit of 2 h"),
        ("group", "lab", {"max": 3600}, "unknown field"),
        ("class", "urgent", {"max_s": 3600}, "'urgent' is not a job class"),
        ("profile", "9g.99gb", {"max_s": 3600}, "'9g.99gb' is not a profile"),
        ("user", "alice", {"max_s": 3600}, "time limits are set per 'class', 'profile' or"),
    ],
)
def test_bad_limits_are_refused_in_a_sentence_and_change_nothing(
    start, kind: str, name: str, body: dict[str, Any], message: str
) -> None:
    api = start(**TRAITS)
    carol = api.user_identity("carol")
    before = api.limits(carol)
    with pytest.raises(InvalidRequest) as bad:
        api.set_limits(carol, kind, name, body)
    assert bad.value.message.startswith(message), bad.value.message
    assert api.limits(carol) == before
    assert api.audit(carol)["audit"] == []


def test_naming_fewer_groups_escapes_no_groups_limits(start) -> None:
    api = start(**{**TRAITS, "user_groups": {"erin": ["lab", "students"]}})
    carol, erin = api.user_identity("carol"), api.user_identity("erin")
    api.set_limits(carol, "group", "students", {"default_s": 1800, "max_s": HOUR})
    charged_to_lab = {**SLICE, "groups": ["lab"]}
    with pytest.raises(InvalidRequest, match="allowed for group 'students'"):
        api.submit(erin, {**charged_to_lab, "limit_s": 2 * HOUR})
    r = api.submit(erin, charged_to_lab)
    assert (r["groups"], r["limit_s"]) == (["lab"], 1800)  # charged to lab, bound as a student
