"""The GPU spawner's parts that need no hub: its entry points, how options and the form's
fields become a broker request, and the words of a waiting start."""

from __future__ import annotations

import importlib
from datetime import datetime, timedelta, timezone
from pathlib import Path

import hypothesis.strategies as st
import pytest
from bad_values import JSON, reads_as_a_sentence
from hypothesis import given, settings
from traitlets import TraitError

from hub_spawner.options import Choices, gpu_request, options_from_form, waiting_message
from hub_spawner.slurm import GPUBrokerSlurmSpawner, SimpleGPUBrokerSlurmSpawner
from hub_spawner.spawner import GPUBrokerSpawner, SimpleGPUBrokerSpawner
from jupyter_gpubroker.engines import BUILT_IN
from jupyter_gpubroker.wire.text import clock

ROOT = Path(__file__).resolve().parents[2]


def test_the_spawners_are_jupyterhub_entry_points() -> None:
    """So c.JupyterHub.spawner_class = "gpubroker" finds it once the wheel is installed."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 and newer
    points = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    found = {}
    for name, target in points["jupyterhub.spawners"].items():
        module, attr = target.split(":")
        found[name] = getattr(importlib.import_module(module), attr)
    from hub_spawner.kubernetes import GPUBrokerKubeSpawner

    assert found == {
        "gpubroker": GPUBrokerSpawner,
        "gpubroker-simple": SimpleGPUBrokerSpawner,
        "gpubroker-kubernetes": GPUBrokerKubeSpawner,
        "gpubroker-slurm": GPUBrokerSlurmSpawner,
        "gpubroker-slurm-simple": SimpleGPUBrokerSlurmSpawner,
    }
    # and c.GPUBroker.inventory_source = "slurm" or "kubernetes" finds its reader the same way
    assert points["jupyter_gpubroker.engines"] == BUILT_IN


@pytest.mark.parametrize(
    ("options", "request_body"),
    [
        ({}, None),
        ({"job_class": "batch"}, None),
        ({"profile": "1g.10gb"}, {"profile": "1g.10gb", "job_class": "interactive"}),
        ({"gpus": 2, "job_class": "batch"}, {"gpus": 2, "job_class": "batch"}),
        ({"min_memory_gb": 20.5}, {"min_memory_gb": 20.5, "job_class": "interactive"}),
        (
            {"profile": "1g.10gb", "expected_duration_s": 7200},
            {"profile": "1g.10gb", "job_class": "interactive", "expected_duration_s": 7200.0},
        ),
        (
            {"profile": "1g.10gb", "limit_s": 5400},
            {"profile": "1g.10gb", "job_class": "interactive", "limit_s": 5400.0},
        ),
    ],
)
def test_options_name_the_request_in_the_apis_own_fields(options, request_body) -> None:
    assert gpu_request(options) == request_body


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"gpus": 1, "profile": "1g.10gb"}, "exactly one of"),
        ({"gpus": 0}, "'gpus' must be a whole number from 1 to 1024, not 0"),
        ({"profile": "9g.99gb"}, "unknown MIG profile '9g.99gb'"),
        ({"gpus": 1, "job_class": "urgent"}, "job_class must be 'interactive' or 'batch'"),
        ({"gpus": 1, "owner": "bob"}, "unknown server option(s) owner"),
        ({"gpus": 1, "expected_duration_s": 0}, "expected_duration_s must be seconds"),
        ({"gpus": 1, "expected_duration_s": "2h"}, "expected_duration_s must be seconds"),
        ({"gpus": 1, "expected_duration_s": 1e9}, "at most a year"),
        ({"gpus": 1, "limit_s": 0}, "limit_s (the time limit) must be seconds, at least"),
        ({"gpus": 1, "limit_s": "2h"}, "limit_s (the time limit) must be seconds"),
        ({"gpus": 1, "limit_s": True}, "limit_s (the time limit) must be seconds"),
        ({"gpus": 1, "limit_s": 1e9}, "at most a year"),
    ],
)
def test_options_the_broker_would_refuse_are_refused_first(options, says) -> None:
    with pytest.raises(ValueError) as refused:
        gpu_request(options)
    assert says in str(refused.value)


def test_the_forms_fields_become_the_same_options_as_the_api_takes() -> None:
    form = {"gpu_kind": ["profile"], "profile": ["1g.10gb"], "gpus": ["1"]}
    assert options_from_form({**form, "job_class": ["batch"]}) == {
        "profile": "1g.10gb",
        "job_class": "batch",
    }
    assert options_from_form({"gpu_kind": ["gpus"], "gpus": ["2"]})["gpus"] == 2
    assert options_from_form({"gpu_kind": ["min_memory_gb"], "min_memory_gb": ["20"]}) == {
        "min_memory_gb": 20.0,
        "job_class": "interactive",
    }
    assert gpu_request(options_from_form({"gpu_kind": ["cpu"], "gpus": ["3"]})) is None
    # "For N hours (you can extend it)": the server's time limit, in the API's seconds
    options = options_from_form({**form, "hours": ["1.5"]})
    assert options["limit_s"] == 5400 and "expected_duration_s" not in options
    assert gpu_request(options)["limit_s"] == 5400
    assert "limit_s" not in options_from_form({"gpu_kind": ["cpu"], "hours": ["2"]})
    for bad in ("soon", "0", "-1", "nan", "inf", "9000"):
        with pytest.raises(ValueError) as refused:
            options_from_form({**form, "hours": [bad]})
        assert str(refused.value) == (
            "For how many hours: give a number of hours above 0 and up to a year, such as 2 "
            f"or 0.5, not {bad!r}"
        )
    with pytest.raises(ValueError, match="whole number"):
        gpu_request(options_from_form({"gpu_kind": ["gpus"], "gpus": ["two"]}))
    # a choice the form does not offer is refused, not taken for a CPU-only server
    with pytest.raises(ValueError) as refused:
        options_from_form({"gpu_kind": ["tpu"], "gpus": ["1"]})
    assert str(refused.value) == (
        "gpu_kind must be cpu, gpus, profile, min_memory_gb or share_gb, not 'tpu'"
    )


def test_a_waiting_start_says_its_position_the_requests_ahead_and_its_eta() -> None:
    now = datetime.now(timezone.utc)
    at = {k: now + timedelta(minutes=m) for k, m in (("low", 10), ("eta", 20), ("high", 40))}
    request = {
        "profile": "1g.10gb",
        "job_class": "interactive",
        "position": 2,
        "eta": at["eta"].isoformat(),
        "eta_range": {"low": at["low"].isoformat(), "high": at["high"].isoformat()},
        "eta_known": True,
    }
    eta = f"{clock(at['eta'].timestamp())} ({clock(at['low'].timestamp())}-"
    eta += f"{clock(at['high'].timestamp())})"
    assert waiting_message(request, {"interactive": 1, "batch": 0}, 5) == (
        f"Waiting for 1g.10gb (interactive): position 2 of 5, one request ahead (interactive); "
        f"ETA {eta}"
    )
    because = waiting_message(request, {}, 2, "every 1g.10gb is in use")
    assert because.startswith("Waiting for 1g.10gb (interactive): every 1g.10gb is in use; pos")
    unknown = {**request, "eta": None, "eta_range": None, "eta_known": False}
    # the position said once, and the request ahead counted even where its class is unknown
    assert waiting_message(unknown, {}, 2).endswith(
        "position 2 of 2, one request ahead; ETA unknown"
    )
    first = {**unknown, "position": 1}
    assert waiting_message(first, {}, 1).endswith(": position 1 of 1, nothing ahead; ETA unknown")


def overview(user: str, held: int) -> dict:
    """The broker's overview of one GPU in seven 1g.10gb slices, ``held`` of them by ``user``."""
    slices = [
        {
            "kind": "mig",
            "profile": "1g.10gb",
            "memory_mib": 9856,
            "gpu_equivalents": 0.1429,
            "holder": {"user": user} if i < held else None,
            "drained": None,
            "vacating": None,
        }
        for i in range(7)
    ]
    return {"me": {"user": user}, "gpus": [{"devices": slices}], "queue": [], "length": 0}


def test_a_wait_and_a_refusal_say_what_the_quota_allows() -> None:
    quota = [{"kind": "user", "name": "ann", "max_gpus": 0.3, "share": None}]
    choices = Choices(overview("ann", 2), quota)
    held = "your quota allows two 1g.10gb slices at a time and you hold two 1g.10gb slices"
    assert choices.blocked({"profile": "1g.10gb", "held_back": held}) == held  # the broker's
    assert choices.waits(profile="1g.10gb") == (
        "waits: you hold what your quota allows (two 1g.10gb slices at a time)"
    )
    assert Choices(overview("ann", 7), quota).blocked({"profile": "1g.10gb"}) == (
        "every 1g.10gb is in use"
    )
    assert choices.text() == (
        "you may ask for a CPU-only server (no options), a MIG profile (1g.10gb), "
        "min_memory_gb up to 10.3, with job_class interactive or batch; your quota allows two "
        "1g.10gb slices at a time"
    )
    # sizes shown are ones that fit: 9856 MiB is 10.33 GB (10^9 bytes), offered as 10.3
    assert 'max="10.3" value="10.3"' in choices.form()


def test_a_configured_expected_hold_goes_with_every_gpu_request_unless_the_user_gives_one() -> None:
    spawner = SimpleGPUBrokerSpawner(gpu_expected_duration=8 * 3600)
    assert spawner._gpu_request({"profile": "1g.10gb"})["expected_duration_s"] == 8 * 3600
    mine = spawner._gpu_request({"profile": "1g.10gb", "expected_duration_s": 600})
    assert mine["expected_duration_s"] == 600
    assert spawner._gpu_request({}) is None
    for bad in (0, -5.0, 400 * 86400.0):
        with pytest.raises(TraitError, match="gpu_expected_duration must be seconds"):
            SimpleGPUBrokerSpawner(gpu_expected_duration=bad)


def test_a_refused_start_reads_as_its_sentence_without_the_exceptions_name() -> None:
    """What the spawn page ("Error: ..."), its progress ("Spawn failed: ...") and the REST
    API show of a failed start: JupyterHub's own formatting of the spawner's exception
    (``format_exception`` since JupyterHub 6; 5.x reads ``jupyterhub_message`` in place)."""
    from jupyterhub import utils

    from hub_spawner.spawner import _bad_options

    exc = _bad_options(ValueError("gpus must be a whole number, not 'x'"))
    sentence = "Cannot start the server: gpus must be a whole number, not 'x'."
    if hasattr(utils, "format_exception"):
        assert utils.format_exception(exc) == (sentence, None)
    assert exc.jupyterhub_message == sentence
    assert getattr(exc, "jupyterhub_html_message", None) is None
    assert str(exc) == sentence and exc.reason == "user_options"  # the hub's metrics label


def test_the_forms_wait_says_how_many_wait_for_the_same_without_a_position() -> None:
    view = overview("ann", 7)
    view["queue"] = [{"profile": "1g.10gb", "position": 1, "eta_known": False}]
    assert Choices(view, []).waits(profile="1g.10gb") == (
        "one request waits for the same, with no estimate yet of when"
    )


def test_the_forms_hours_field_says_its_a_limit_you_can_extend_and_what_the_broker_needs() -> None:
    view = overview("ann", 0)
    view["time_limits"] = {
        "required": True,
        "classes": {
            "interactive": {"default_s": 7200.0, "max_s": 8 * 3600.0},
            "batch": {"default_s": None, "max_s": 366 * 86400.0},
        },
    }
    form = Choices(view, []).form()
    assert '<label for="gpu-hours">For</label>' in form and "hours (you can extend it)" in form
    assert (
        "the server is stopped after that unless you extend it; interactive: 2 h 00 min if "
        "left empty; interactive: at most 8 h 00 min; batch: required"
    ) in form
    view["time_limits"] = {"required": False, "classes": {}}  # nothing set: nothing said
    assert Choices(view, []).limit_note().endswith("unless you extend it")


def test_a_servers_time_limit_warning_reads_as_when_it_ends_with_extend_on_the_hubs_pages() -> None:
    from html import escape
    from types import SimpleNamespace

    from hub_spawner.culling import gpu_announcement, time_limit_text, time_limit_warned

    now = datetime.now(timezone.utc)
    ends, reclaim = now + timedelta(minutes=10), now + timedelta(minutes=11)
    lease = {
        "id": "L1",
        "devices": ["MIG-abc"],
        "ends_at": ends.isoformat(),
        "reclaim_at": reclaim.isoformat(),
        "reclaim_cause": "time_limit",
    }
    assert time_limit_warned(lease)
    # an idle warning is kept by use, not by Extend: it is not the time limit's
    assert not time_limit_warned({**lease, "reclaim_cause": "idle"})
    # extended: its end moved past the warning's deadline, which the broker withdraws next
    later = (now + timedelta(minutes=70)).isoformat()
    assert not time_limit_warned({**lease, "ends_at": later})
    assert not time_limit_warned({**lease, "reclaim_at": None, "reclaim_cause": None})
    text = time_limit_text(lease)
    assert text == (
        f"Your GPU server's time on MIG-abc ends at {clock(ends.timestamp())}: it will be "
        f"stopped at {clock(reclaim.timestamp())} unless you extend it."
    )
    spawner = SimpleNamespace(
        gpu_notice=text, gpu_extend="L1", gpu_pages_url="/services/gpubroker/"
    )
    user = SimpleNamespace(orm_spawners={"": None}, spawners={"": spawner})
    assert gpu_announcement(user) == (
        f'{escape(text)} <a class="btn btn-sm btn-primary gpubroker-extend" '
        'href="/services/gpubroker/?extend=L1#lease-L1">Extend</a>'
    )
    spawner.gpu_extend = ""  # an idle warning, or why it stopped: the text alone
    assert gpu_announcement(user) == escape(text)


@settings(max_examples=200, deadline=None, database=None)
@given(
    field=st.sampled_from(["gpus", "min_memory_gb", "limit_s", "expected_duration_s"]), value=JSON
)
def test_any_value_of_a_numeric_server_option_is_taken_or_refused_in_a_sentence(
    field: str, value: object
) -> None:
    """Users can POST any ``user_options`` to the hub's REST API: a numeric one is taken
    as the broker would take it, or refused in one sentence, never with an exception of
    its own (a huge integer, NaN, a list)."""
    options = {"gpus": 1, field: value}
    if field == "min_memory_gb":
        del options["gpus"]
    try:
        gpu_request(options)
    except ValueError as e:
        assert reads_as_a_sentence(str(e)), str(e)


def test_a_members_form_shows_the_groups_quota_and_that_it_holds_a_start_back() -> None:
    """The form said "starts at once" and "no quota of your own; the default share" to a
    member of a group whose quota was full."""
    view = overview("ann", 0)
    view["me"]["groups"] = ["ML Team"]
    group = {"kind": "group", "name": "ML Team", "share": 2.0, "max_gpus": 0.1429}
    group.update(gpu_hours=None, period_s=None, held_gpus=0.1429, spent_gpu_hours=None)
    choices = Choices(view, [group])
    assert choices.waits(profile="1g.10gb") == (
        "waits: group ML Team's members hold what its quota allows (one 1g.10gb slice at a time)"
    )
    assert choices.group_text() == (
        "your group ML Team: share 2; its quota allows one 1g.10gb slice at a time and its "
        "members hold one 1g.10gb slice now"
    )
    assert "1g.10gb: 7 of 7 free; waits: group ML Team" in choices.form()
    assert "your group ML Team: share 2;" in choices.form()


def test_the_spawn_pages_log_says_a_wait_once_however_often_the_queue_moves() -> None:
    """Every move of the queue added the same "Waiting for ..." line to the page's log."""
    spawner = SimpleGPUBrokerSpawner()
    request = {"profile": "1g.10gb", "job_class": "interactive", "position": 2, "eta_known": False}
    for _ in range(3):
        spawner._waiting(request, {"interactive": 1}, 2)
    spawner._waiting({**request, "position": 1}, {}, 1)
    assert [e["message"] for e in spawner._progress] == [
        "Waiting for 1g.10gb (interactive): position 2 of 2, one request ahead (interactive); "
        "ETA unknown",
        "Waiting for 1g.10gb (interactive): position 1 of 1, nothing ahead; ETA unknown",
    ]
