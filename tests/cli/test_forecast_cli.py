"""`jupyter gpubroker forecast --state`: demand per hour from a state file the core wrote,
as a table or JSON, and a plain sentence while there is too little history."""

from __future__ import annotations

import json
import time

from jupyter_gpubroker.broker.clock import VirtualClock
from jupyter_gpubroker.broker.core import Broker
from jupyter_gpubroker.broker.store import Store
from jupyter_gpubroker.cli import main
from jupyter_gpubroker.nvml import open_backend
from jupyter_gpubroker.wire.sizes import Size

DAY = 86400.0


def written(path, days: int, start: float) -> None:  # type: ignore[no-untyped-def]
    """``days`` of ann holding both GPUs 09:00-11:00 UTC, bob waiting for one meanwhile."""
    with open_backend("dgx-h100:2") as backend:
        inventory = backend.inventory()
    clock = VirtualClock(start)
    broker = Broker(Store(path), inventory, clock=clock)
    for _ in range(days):
        ann = broker.submit("ann", Size(gpus=2))
        bob = broker.submit("bob", Size(gpus=1))
        clock.advance(2 * 3600)
        broker.release(ann.lease_id)  # type: ignore[arg-type]
        broker.release(broker.request(bob.id).lease_id)  # type: ignore[arg-type]
        clock.advance(DAY - 2 * 3600)
    broker.store.close()


def nine_am(days_ago: int) -> float:
    today = time.time() // DAY * DAY
    return today - days_ago * DAY + 9 * 3600


def test_the_table_shows_the_busy_hours_held_and_waiting(tmp_path, capsys) -> None:
    state = tmp_path / "state.sqlite"
    written(state, 4, nine_am(5))
    assert main(["forecast", "--state", str(state)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("Demand in GPU-equivalents, from ")
    assert out[1].split() == ["hour", "of", "every", "day", "demand", "p50", "p90"] + [
        "held",
        "p50",
        "waiting",
        "p50",
    ]
    # ann's 2 GPUs held and bob's 1 waiting, 09:00-11:00 each day; bob's grant at 11:00
    assert out[2].split() == ["09:00-10:00", "3.00", "3.00", "2.00", "1.00"]
    assert out[3].split() == ["10:00-11:00", "3.00", "3.00", "2.00", "1.00"]
    assert len(out) == 4
    assert main(["forecast", "--state", str(state), "--json", "--backtest-weeks", "0"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ready"] and data["basis"] == "hour of day"
    assert data["hours"][9]["asked"] == {"interactive gpus=1": 1.0, "interactive gpus=2": 2.0}


def test_too_little_history_and_bad_options_are_said_plainly(tmp_path, capsys) -> None:
    state = tmp_path / "state.sqlite"
    written(state, 1, time.time() - 5 * 3600)
    assert main(["forecast", "--state", str(state)]) == 0
    out = capsys.readouterr().out
    assert out == (
        "Not enough history yet: 5 hours of history, and a forecast needs a day of it.\n"
    )
    assert main(["forecast", "--state", str(state), "--weeks", "0"]) == 1
    assert "--weeks is 1 to 52" in capsys.readouterr().err
    assert main(["forecast", "--state", str(state), "--timezone", "Mars/Base"]) == 1
    assert "unknown time zone 'Mars/Base'" in capsys.readouterr().err
    assert main(["forecast", "--state", str(tmp_path / "none.sqlite")]) == 1
    assert "no broker state file at" in capsys.readouterr().err


def test_hours_are_those_of_the_time_zone_asked(tmp_path, capsys) -> None:
    state = tmp_path / "state.sqlite"
    written(state, 2, nine_am(3))
    assert main(["forecast", "--state", str(state), "--timezone", "Asia/Tokyo"]) == 0
    assert capsys.readouterr().out.splitlines()[2].split()[0] == "18:00-19:00"  # UTC+9
