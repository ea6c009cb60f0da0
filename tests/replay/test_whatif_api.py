"""What-if through the API (``POST whatif``) on a running broker's own state file: an
admin gets the figures ``jupyter gpubroker whatif`` prints for the same change, every bad
field is refused in a sentence, others are refused, and one replay runs at a time."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import fields
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_whatif import JOBS, live_run  # a history a running broker wrote
from traitlets.config import Config

from jupyter_gpubroker.api.rules import BrokerAPI
from jupyter_gpubroker.broker.policy import POLICIES
from jupyter_gpubroker.cli.main import main
from jupyter_gpubroker.replay.whatif import Variation
from jupyter_gpubroker.runtime import GPUBroker, whatif
from jupyter_gpubroker.wire.errors import Conflict, Forbidden, InvalidRequest


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    state = tmp_path_factory.mktemp("whatif-api") / "state.sqlite"
    live_run(state)
    return state


@pytest.fixture
def api(recorded: Path) -> Iterator[BrokerAPI]:
    """The broker running again on the file it wrote, carol its admin."""
    c = Config()
    c.GPUBroker.simulate = "dgx-h100:4"
    c.GPUBroker.state_file = str(recorded)
    c.GPUBroker.identity = "username"
    c.GPUBroker.admin_users = {"carol"}
    runtime = GPUBroker(config=c)
    runtime.start()
    yield BrokerAPI(runtime)
    runtime.stop()


def printed(capsys: pytest.CaptureFixture[str], state: Path, *args: str) -> Any:
    assert main(["whatif", "--state", str(state), *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


PRICES = {"per_gpu_hour": {"gpu": 4}}


@pytest.mark.parametrize(
    ("body", "args"),
    [
        ({"gpus": 4}, ["--gpus", "4"]),
        (
            {"machine": "dgx-h100:6", "policy": "fcfs"},
            ["--machine", "dgx-h100:6", "--policy", "fcfs"],
        ),
        (
            {"quotas": [{"kind": "user", "name": "carol", "max_gpus": 1}], "dynamic_mig": False},
            ["--quota", "user:carol:max_gpus=1", "--static-mig"],
        ),
        ({}, []),
    ],
)
def test_an_admin_gets_the_figures_the_whatif_command_prints(
    api: BrokerAPI, recorded: Path, capsys: pytest.CaptureFixture[str], body, args
) -> None:
    carol = api.user_identity("carol")
    got = api.whatif(carol, {**body, "prices": PRICES}).result(timeout=120)
    prices = recorded.parent / "prices.json"
    prices.write_text(json.dumps(PRICES))
    cli = printed(capsys, recorded, *args, "--prices", str(prices))
    assert {k: got[k] for k in cli} == cli
    assert ("what_if" in got) == bool(body)
    assert got["requests"] == len(JOBS) and got["recorded"]["cost"] > 0
    assert got["by"] == "carol" and got["asked"] == {**body, "prices": PRICES}
    assert api.whatif_state(carol) == {"running": None, "last": got, "policies": [*POLICIES]}


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"gpu": 2}, "unknown field(s): gpu; this call takes dynamic_mig, gpus, grace, "),
        ({"idle_timeout": -60}, "the idle timeout must be seconds, 0 or at least"),
        ({"reclaim_action": "nap"}, "the reclaim action is shutdown or suspend, not 'nap'"),
        ({"gpus": "2"}, "'gpus' must be an integer, not '2'"),
        ({"gpus": 1.5}, "'gpus' must be an integer, not 1.5"),
        ({"gpus": 100000}, "'gpus' adds or takes away at most 4,096 GPUs, not 100,000"),
        ({"dynamic_mig": "no"}, "'dynamic_mig' must be true or false or null, not 'no'"),
        ({"policy": "fastest"}, "'policy' must be one of fcfs, slurm, broker, not 'fastest'"),
        ({"machine": "/etc/passwd"}, "'machine' must be a preset with :N GPUs ("),
        ({"machine": "dgx-h100:0"}, "'machine' 'dgx-h100:0': a topology needs at least one GPU"),
        ({"timezone": "Mars/Olympus"}, "'timezone' must be an IANA time zone name, not "),
        ({"windows": {"start": "08:00"}}, "'windows' must be a list of windows"),
        (
            {"windows": [{"name": "day", "start": "25:00", "end": "19:00"}]},
            "window 'day': hours run from 0 to 24, not 25",
        ),
        ({"quotas": ["user:carol:max_gpus=1"]}, "'quotas' must be a list of {kind: user or"),
        ({"quotas": [{"kind": "user", "name": "c", "max_gpus": -1}]}, "max_gpus"),
        ({"quotas": [{"kind": "group", "name": ""}]}, "group name must be non-empty text, not ''"),
        ({"quotas": [{"kind": "user", "name": "c", "gpus": 1}]}, "unknown field(s): gpus; "),
        ({"prices": 3}, "'prices' must be prices as a prices file holds them"),
        ({"prices_if": {"gpu": 3}}, "prices need 'per_gpu_hour'"),
        ({"gpus": -4}, "the machine has 4 GPUs: it cannot lose 4"),  # found in the replay
        ({"windows": [], "policy": "fcfs"}, "time-of-day windows are the broker policy's"),
    ],
)
def test_a_bad_field_is_refused_in_a_sentence(api: BrokerAPI, body, said) -> None:
    carol = api.user_identity("carol")
    with pytest.raises(InvalidRequest) as refused:
        api.whatif(carol, body).result(timeout=120)
    assert said in refused.value.message
    assert "\n" not in refused.value.message and "Error" not in refused.value.message


def test_only_admins_replay_and_one_replay_runs_at_a_time(
    api: BrokerAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    carol, alice = api.user_identity("carol"), api.user_identity("alice")
    for call in (lambda: api.whatif(alice, {"gpus": 1}), lambda: api.whatif_state(alice)):
        with pytest.raises(Forbidden, match="only admins run what-if replays"):
            call()
    gate, compare = threading.Event(), whatif.compare

    def held(*args: Any) -> Any:
        gate.wait(30)
        return compare(*args)

    monkeypatch.setattr(whatif, "compare", held)
    first = api.whatif(carol, {"gpus": 1})
    for _ in range(100):  # the worker has read the history: the count is known
        if api.whatif_state(carol)["running"]["requests"] is not None:
            break
        threading.Event().wait(0.05)
    running = api.whatif_state(carol)["running"]
    assert (running["by"], running["requests"]) == ("carol", len(JOBS))
    with pytest.raises(Conflict) as busy:
        api.whatif(carol, {"gpus": 2})
    assert busy.value.message == (
        "a what-if replay of 12 recorded requests asked by carol is running: one runs at a "
        "time, ask again once it is done"
    )
    gate.set()
    assert first.result(timeout=60)["what_if"]["requests"] == len(JOBS)
    assert api.whatif(carol, {"gpus": 2}).result(timeout=60)["asked"] == {"gpus": 2}


def test_the_api_document_takes_every_field_of_a_variation() -> None:
    """A field added to ``Variation`` is read from the body at once (by its type); the
    document must name it too, or this fails."""
    doc = yaml.safe_load(
        resources.files("jupyter_gpubroker.api").joinpath("openapi.yaml").read_text()
    )
    asked = doc["components"]["schemas"]["WhatIfAsked"]["properties"]
    assert set(asked) == {f.name for f in fields(Variation)} | set(whatif.PRICES)
    assert set(whatif.READERS) == {f.name for f in fields(Variation)}
    assert asked["policy"]["enum"] == [*POLICIES, None]
    assert asked["gpus"]["maximum"] == whatif.MOST_GPUS
