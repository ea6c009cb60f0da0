"""Time limits through the API: stated with a request, shown on its lease, extended by
the holder (or an admin) where that breaks no promised start, refused in a sentence."""

from __future__ import annotations

import pytest

from jupyter_gpubroker.api.rules import BrokerAPI
from jupyter_gpubroker.wire.errors import Conflict, Forbidden, InvalidRequest
from jupyter_gpubroker.wire.times import iso

SLICE = {"profile": "1g.10gb"}


def test_a_stated_limit_is_shown_and_the_holder_extends_it(team: BrokerAPI) -> None:
    alice = team.user_identity("alice")
    r = team.submit(alice, {**SLICE, "limit_s": 3600})
    lease = r["lease"]
    assert r["limit_s"] == 3600 and lease["limit_s"] == 3600
    assert (lease["extended_s"], lease["extensions"]) == (0, 0)
    granted = team.core.lease(lease["id"]).granted_at
    assert lease["ends_at"] == iso(granted + 3600)

    longer = team.extend(alice, lease["id"], {"seconds": 1800})
    assert (longer["extended_s"], longer["extensions"]) == (1800, 1)
    assert longer["ends_at"] == iso(granted + 5400)
    carol = team.user_identity("carol")  # an admin
    assert team.extend(carol, lease["id"], {"seconds": 60})["extensions"] == 2


def test_another_users_lease_is_not_theirs_to_extend(team: BrokerAPI) -> None:
    lease = team.submit(team.user_identity("alice"), {**SLICE, "limit_s": 3600})["lease"]
    with pytest.raises(Forbidden, match="belongs to another user"):
        team.extend(team.user_identity("bob"), lease["id"], {"seconds": 60})
    assert team.core.lease(lease["id"]).extensions == 0


def test_bad_limits_and_extensions_are_refused_in_a_sentence(start) -> None:
    api = start(max_time_limit={"interactive": "2h"}, max_extensions={"interactive": 1})
    me = api.user_identity("dana")
    with pytest.raises(InvalidRequest, match="longer than the 2 h 00 min allowed for interactive"):
        api.submit(me, {**SLICE, "limit_s": 3 * 3600})
    with pytest.raises(
        InvalidRequest, match="the time limit must be seconds, at least 0.001 and at most a year"
    ):
        api.submit(me, {**SLICE, "limit_s": "2h"})
    assert api.requests(me)["requests"] == []  # nothing queued by a refused submit

    lease = api.submit(me, {**SLICE, "limit_s": 3600})["lease"]
    with pytest.raises(InvalidRequest, match="say how many seconds more"):
        api.extend(me, lease["id"], {})
    with pytest.raises(InvalidRequest, match="an extension must be seconds, at least 0.001"):
        api.extend(me, lease["id"], {"seconds": -5})
    with pytest.raises(InvalidRequest, match="unknown field.*minutes; this call takes seconds"):
        api.extend(me, lease["id"], {"minutes": 5})
    with pytest.raises(Conflict, match="longer than the 2 h 00 min allowed"):
        api.extend(me, lease["id"], {"seconds": 2 * 3600})
    api.extend(me, lease["id"], {"seconds": 600})
    with pytest.raises(Conflict, match="already extended one time"):
        api.extend(me, lease["id"], {"seconds": 600})
    unlimited = api.submit(me, {**SLICE, "holder": "k2"})["lease"]
    with pytest.raises(Conflict, match="no time limit to extend"):
        api.extend(me, unlimited["id"], {"seconds": 600})


def test_an_extension_that_would_delay_a_promised_start_is_refused(team: BrokerAPI) -> None:
    alice, bob = team.user_identity("alice"), team.user_identity("bob")
    short = team.submit(alice, {**SLICE, "limit_s": 1800})["lease"]
    for _ in range(6):
        team.submit(alice, {**SLICE, "limit_s": 7200})
    waiting = team.submit(bob, {**SLICE, "limit_s": 600})
    assert waiting["state"] == "queued"
    team.core.schedule()  # the broker promises the waiting request a start
    with pytest.raises(Conflict, match="a waiting request needs this GPU when its time limit ends"):
        team.extend(alice, short["id"], {"seconds": 3600})
    assert team.core.lease(short["id"]).extensions == 0


def test_the_overview_says_each_classs_default_and_most_and_whether_one_is_required(
    start,
) -> None:
    """What a front's form says before the core refuses (the hub's "For N hours")."""
    api = start(
        default_time_limit={"interactive": "2h"},
        max_time_limit={"interactive": "8h"},
        time_limit_required=True,
    )
    me = api.user_identity("dana")
    classes = {
        "interactive": {"default_s": 7200.0, "max_s": 8 * 3600.0, "required": True},
        "batch": {"default_s": None, "max_s": 366 * 86400.0, "required": True},
    }
    assert api.overview(me)["time_limits"] == {
        "required": True,
        "classes": classes,
        "profiles": {"1g.10gb": classes},  # no rule of its own: its class's
    }
    with pytest.raises(InvalidRequest, match="a time limit is required here"):
        api.submit(me, {**SLICE, "job_class": "batch"})
    # an admin's rule replaces the configured one, and a group's applies to its members
    admin = api.user_identity("carol")
    api.set_limits(admin, "class", "batch", {"default_s": 3600})
    api.set_limits(admin, "group", "students", {"max_s": 4 * 3600})
    student = api.user_identity("dana", groups=["students"])
    classes = api.overview(student)["time_limits"]["classes"]
    assert classes["batch"] == {"default_s": 3600.0, "max_s": 4 * 3600.0, "required": True}
    assert classes["interactive"]["max_s"] == 4 * 3600.0
    assert api.overview(me)["time_limits"]["classes"]["interactive"]["max_s"] == 8 * 3600.0


def test_the_overview_says_each_offered_profiles_limits_before_one_is_picked(start) -> None:
    """Per MIG profile this machine offers and class: the profile's rule with the class's
    and the viewer's groups' (the tightest maximum, the most specific default cut to it),
    what a request of that profile then gets; profiles the machine lacks are not listed."""
    hour = 3600.0
    api = start(
        default_time_limit={"interactive": "6h"},
        max_time_limit={"interactive": "8h"},
        max_time_limit_by_profile={"1g.10gb": "4h", "3g.40gb": "1h"},
        max_time_limit_by_group={"students": "2h"},
    )
    dana, student = api.user_identity("dana"), api.user_identity("ed", groups=["students"])
    assert api.overview(dana)["time_limits"]["profiles"] == {
        "1g.10gb": {
            "interactive": {"default_s": 4 * hour, "max_s": 4 * hour, "required": False},
            "batch": {"default_s": None, "max_s": 4 * hour, "required": False},
        }
    }
    assert api.submit(dana, SLICE)["limit_s"] == 4 * hour  # the class's 6 h, cut as said
    mine = api.overview(student)["time_limits"]["profiles"]["1g.10gb"]
    assert mine["interactive"] == {"default_s": 2 * hour, "max_s": 2 * hour, "required": False}
    # an admin's profile rule replaces the configured one, in the next overview
    admin = api.user_identity("carol")
    api.set_limits(admin, "profile", "1g.10gb", {"default_s": hour, "required": True})
    mine = api.overview(dana)["time_limits"]["profiles"]["1g.10gb"]
    assert mine == {
        "interactive": {"default_s": hour, "max_s": 8 * hour, "required": True},
        "batch": {"default_s": hour, "max_s": 366 * 86400.0, "required": True},
    }
