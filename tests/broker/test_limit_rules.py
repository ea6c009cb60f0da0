"""Time-limit defaults and maxima per job class, profile and group: which one a request
gets, rules an admin sets at run time (kept across a restart), and bad rules refused in a
sentence."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from broker_helpers import make_inventory, mig_inventory, whole_inventory

from jupyter_gpubroker.broker.clock import VirtualClock
from jupyter_gpubroker.broker.core import Broker, BrokerConfig
from jupyter_gpubroker.broker.limitrules import LimitRule
from jupyter_gpubroker.broker.models import Event
from jupyter_gpubroker.broker.store import Store
from jupyter_gpubroker.wire.errors import Conflict, InvalidRequest, UnknownProfile
from jupyter_gpubroker.wire.sizes import Size

HOUR = 3600.0
ONE = Size(gpus=1)
SLICE = Size(profile="1g.10gb")
BrokerFactory = Callable[..., Broker]
MIXED = make_inventory([None, ("1g.10gb",) * 7])
"""A whole GPU and one cut in seven slices."""
RULES = BrokerConfig(
    default_limit_s={"interactive": 4 * HOUR},
    max_limit_s={"interactive": 8 * HOUR, "batch": 48 * HOUR},
    default_limit_by_profile_s={"1g.10gb": 2 * HOUR},
    max_limit_by_profile_s={"gpus=1": 6 * HOUR},
    default_limit_by_group_s={"students": 1 * HOUR, "night": 10 * HOUR},
    max_limit_by_group_s={"students": 3 * HOUR},
)


def test_the_tightest_maximum_applies_whoever_sets_it(make_broker: BrokerFactory) -> None:
    broker = make_broker(MIXED, config=RULES)
    with pytest.raises(
        InvalidRequest, match="7 h 00 min is longer than the 6 h 00 min allowed for gpus=1"
    ):
        broker.submit("ann", ONE, limit_s=7 * HOUR)  # the class allows 8 h, whole GPUs 6
    with pytest.raises(
        InvalidRequest, match="longer than the 3 h 00 min allowed for group 'students'"
    ):
        broker.submit("ann", SLICE, groups=["lab", "students"], limit_s=4 * HOUR)
    with pytest.raises(InvalidRequest, match="longer than the 8 h 00 min allowed for interactive"):
        broker.submit("ann", SLICE, limit_s=9 * HOUR)
    assert broker.submit("ann", SLICE, limit_s=8 * HOUR).limit_s == 8 * HOUR
    assert broker.submit("bob", SLICE, job_class="batch", limit_s=40 * HOUR).limit_s == 40 * HOUR


def test_without_rules_a_year_is_the_most(make_broker: BrokerFactory) -> None:
    broker = make_broker()
    with pytest.raises(InvalidRequest, match="at most a year, not 31622401"):
        broker.submit("ann", ONE, limit_s=366 * 24 * HOUR + 1)
    assert broker.submit("ann", ONE, limit_s=366 * 24 * HOUR).limit_s == 366 * 24 * HOUR


def test_the_most_specific_default_applies_never_above_the_maximum(
    make_broker: BrokerFactory,
) -> None:
    broker = make_broker(MIXED, config=RULES)
    assert broker.submit("ann", ONE).limit_s == 4 * HOUR  # the class's
    assert broker.submit("ann", SLICE).limit_s == 2 * HOUR  # the profile's over the class's
    assert broker.submit("ann", SLICE, groups=["students"]).limit_s == HOUR  # the group's
    both = broker.submit("ann", SLICE, groups=["night", "students"])
    assert both.limit_s == HOUR  # of several groups, the shortest default
    night = broker.submit("ann", ONE, groups=["night"])
    assert night.limit_s == 6 * HOUR  # the group's 10 h, cut to the whole GPU's maximum
    assert broker.submit("ann", ONE, job_class="batch").limit_s is None  # no default at all


def test_a_model_request_is_bound_by_its_plain_count_too(make_broker: BrokerFactory) -> None:
    broker = make_broker(whole_inventory(2), config=RULES)
    model = broker.inventory.gpus[0].model
    with pytest.raises(InvalidRequest, match="allowed for gpus=1"):
        broker.submit("ann", Size(gpus=1, model=model), limit_s=7 * HOUR)


def test_a_rule_set_at_run_time_replaces_the_configured_one_and_outlives_a_restart(
    state_file: Path, clock: VirtualClock
) -> None:
    broker = Broker(Store(state_file), MIXED, clock=clock, config=RULES)
    broker.limits.set("group", "students", LimitRule(default_s=HOUR / 2, max_s=HOUR))
    broker.limits.set("profile", "profile=1g.10gb", LimitRule(required=True))
    with pytest.raises(InvalidRequest, match="1 h 00 min allowed for group 'students'"):
        broker.submit("ann", SLICE, groups=["students"], limit_s=2 * HOUR)
    assert broker.submit("ann", ONE, groups=["students"]).limit_s == HOUR / 2
    # the profile's rule replaced its configured default: a slice needs a limit now
    with pytest.raises(InvalidRequest, match="a time limit is required here"):
        broker.submit("ann", SLICE, job_class="batch")
    broker.store.close()

    again = Broker(Store(state_file), MIXED, clock=clock, config=RULES)
    rules = again.limits.rules()
    assert rules[("group", "students")] == (LimitRule(HOUR / 2, HOUR), "admin")
    assert rules[("profile", "1g.10gb")] == (LimitRule(required=True), "admin")
    assert rules[("class", "batch")] == (LimitRule(max_s=48 * HOUR), "config")
    assert again.submit("ann", ONE, groups=["students"]).limit_s == HOUR / 2
    assert again.limits.delete("group", "students")
    assert not again.limits.delete("group", "students")
    assert again.submit("ann", ONE, groups=["students"]).limit_s == HOUR  # configured again
    again.store.close()


def test_each_change_sends_a_limits_event_with_the_rule_now_in_force(
    make_broker: BrokerFactory,
) -> None:
    """As a quota's change does: machine-wide (no user), with the rule in force after it
    (a delete: the configured one, or none at all)."""
    broker = make_broker(MIXED, config=RULES)
    events: list[Event] = []
    broker.subscribe(events.append)
    broker.limits.set("group", "students", LimitRule(default_s=HOUR / 2, max_s=HOUR))
    broker.limits.set("group", "lab", LimitRule(required=True))
    assert broker.limits.delete("group", "students")
    assert broker.limits.delete("group", "lab")
    assert not broker.limits.delete("group", "lab")  # nothing changed: no event
    assert [(e.kind, e.user, e.request_id, e.lease_id) for e in events] == [
        ("limits", "", None, None)
    ] * 4
    assert [e.detail for e in events] == [
        {"kind": "group", "name": "students", "default_s": HOUR / 2, "max_s": HOUR}
        | {"required": False, "source": "admin"},
        {"kind": "group", "name": "lab", "default_s": None, "max_s": None}
        | {"required": True, "source": "admin"},
        {"kind": "group", "name": "students", "default_s": HOUR, "max_s": 3 * HOUR}
        | {"required": False, "source": "config"},
        {"kind": "group", "name": "lab", "default_s": None, "max_s": None}
        | {"required": False, "source": None},
    ]


def test_an_extension_is_held_to_the_tightest_maximum(make_broker: BrokerFactory) -> None:
    broker = make_broker(mig_inventory(1), config=RULES)
    r = broker.submit("ann", SLICE, groups=["students"], limit_s=2 * HOUR)
    lease_id = broker.request(r.id).lease_id or ""
    broker.extend(lease_id, HOUR)
    with pytest.raises(Conflict, match="longer than the 3 h 00 min allowed for group 'students'"):
        broker.extend(lease_id, 60)
    broker.limits.set("group", "students", LimitRule(max_s=4 * HOUR))  # raised at run time
    assert broker.extend(lease_id, HOUR).ends_at == broker.lease(lease_id).granted_at + 4 * HOUR


LIMITS = "seconds, at least 1 and at most a year"


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"default_s": 0}, f"the default time limit must be {LIMITS}, not 0"),
        ({"max_s": "2h"}, f"the maximum time limit must be {LIMITS}, not '2h'"),
        ({"max_s": float("nan")}, f"the maximum time limit must be {LIMITS}, not nan"),
        ({"max_s": 10**400}, f"the maximum time limit must be {LIMITS}, not 1e+400"),
        ({"default_s": 2 * HOUR, "max_s": HOUR}, "the default time limit of 2 h 00 min is above"),
        ({"required": "yes"}, "'required' is true or false, not 'yes'"),
    ],
)
def test_a_bad_rule_is_refused_in_a_sentence(rule: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidRequest) as bad:
        LimitRule(**rule)  # type: ignore[arg-type]
    assert bad.value.message.startswith(message)


@pytest.mark.parametrize(
    ("kind", "name", "error", "message"),
    [
        ("user", "ann", InvalidRequest, "time limits are set per 'class', 'profile' or 'group'"),
        ("class", "gpu", InvalidRequest, "'gpu' is not a job class"),
        ("profile", "9g.99gb", UnknownProfile, "'9g.99gb' is not a profile: unknown MIG"),
        ("group", "a\nb", InvalidRequest, "group name 'a\\nb' holds"),
    ],
)
def test_a_rule_for_nothing_known_is_refused_and_nothing_is_kept(
    make_broker: BrokerFactory, kind: str, name: str, error: type, message: str
) -> None:
    broker = make_broker()
    with pytest.raises(error) as bad:
        broker.limits.set(kind, name, LimitRule(max_s=HOUR))
    assert bad.value.message.startswith(message)
    assert broker.limits.rules() == {} and broker.store.time_limits() == []


def test_configured_rules_are_checked_at_start() -> None:
    with pytest.raises(InvalidRequest, match="group 'students': the default time limit of 2 h"):
        BrokerConfig(
            default_limit_by_group_s={"students": 2 * HOUR}, max_limit_by_group_s={"students": HOUR}
        )
    with pytest.raises(InvalidRequest, match="the time limits of profile 'gpus=2' are set twice"):
        BrokerConfig(max_limit_by_profile_s={"2": HOUR, "gpus=2": HOUR})
    with pytest.raises(UnknownProfile, match="'1g.11gb' is not a profile"):
        BrokerConfig(default_limit_by_profile_s={"1g.11gb": HOUR})
