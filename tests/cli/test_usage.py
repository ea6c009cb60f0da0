"""`jupyter gpubroker usage` from a state file: GPU-hours and cost, as a table or CSV;
the file is read as it is, never migrated."""

from __future__ import annotations

import csv
import io
import sqlite3
from datetime import datetime, timezone

import pytest

from jupyter_gpubroker.broker.clock import VirtualClock
from jupyter_gpubroker.broker.core import Broker
from jupyter_gpubroker.broker.store import MIGRATIONS, SCHEMA_VERSION, Store
from jupyter_gpubroker.cli import main
from jupyter_gpubroker.nvml import open_backend
from jupyter_gpubroker.wire.sizes import Size

MONDAY_9AM = datetime(2024, 5, 13, 9, tzinfo=timezone.utc).timestamp()


@pytest.fixture
def state(tmp_path):  # type: ignore[no-untyped-def]
    """Two days of leases: ann holds a whole GPU 2 h each day, bob a 1g.5gb slice 7 h."""
    path = tmp_path / "state.sqlite"
    with open_backend("workstation-a100") as backend:
        inventory = backend.inventory()
    clock = VirtualClock(MONDAY_9AM)
    broker = Broker(Store(path), inventory, clock=clock)
    for _ in range(2):
        ann = broker.submit("ann", Size(gpus=1), groups=["lab"])
        bob = broker.submit("bob", Size(profile="1g.5gb"))
        clock.advance(2 * 3600)
        broker.release(ann.lease_id)  # type: ignore[arg-type]
        clock.advance(5 * 3600)
        broker.release(bob.lease_id)  # type: ignore[arg-type]
        clock.advance(17 * 3600)
    broker.store.close()
    return path


def rows(capsys: pytest.CaptureFixture[str], *args: str) -> list[list[str]]:
    assert main(["usage", *args, "--csv"]) == 0
    return list(csv.reader(io.StringIO(capsys.readouterr().out)))


def test_csv_by_user_group_and_day(capsys, state) -> None:
    assert rows(capsys, "--state", str(state)) == [
        ["user", "gpu_hours"],
        ["ann", "4.0000"],
        ["bob", "2.0000"],  # 14 h of a slice of 1 compute slice in 7
    ]
    assert rows(capsys, "--state", str(state), "--by", "group")[1:] == [
        ["lab", "4.0000"],
        ["", "2.0000"],
    ]
    by_day = rows(capsys, "--state", str(state), "--by", "day", "--since", "2024-05-14")
    assert by_day == [["day", "gpu_hours"], ["2024-05-14", "3.0000"]]


def test_prices_and_the_table(capsys, state, tmp_path) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text(
        "currency: EUR\nper_gpu_hour: {gpu: 4.0, '*': 3.5}\n"
        "bands:\n  - {name: peak, start: '08:00', end: '10:00', days: mon-fri, factor: 2}\n"
    )
    got = rows(capsys, "--state", str(state), "--prices", str(prices), "--by", "profile")
    # Each day: 1 peak GPU-hour + 1 off-peak for ann; bob's 7 slice-hours, 1 of them peak.
    assert got == [
        ["profile", "gpu_hours", "cost"],
        ["gpu", "4.0000", f"{2 * (4 * 2 + 4):.2f}"],
        ["1g.5gb", "2.0000", f"{2 * (3.5 * 2 / 7 + 3.5 * 6 / 7):.2f}"],
    ]
    assert main(["usage", "--state", str(state), "--prices", str(prices)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["user", "gpu_hours", "cost"]
    assert table[-1] == "total 6.0000 GPU-hours, 32.00 EUR"


def test_bad_input_is_one_line(capsys, state, tmp_path) -> None:
    for args in (
        ["--since", "yesterday"],
        ["--timezone", "Mars/Olympus"],
        ["--prices", str(tmp_path / "missing.yaml")],
    ):
        assert main(["usage", "--state", str(state), *args]) == 1
        assert capsys.readouterr().err.startswith("error: ")
    assert main(["usage", "--state", str(tmp_path / "none.sqlite")]) == 1
    assert "no broker state file" in capsys.readouterr().err


def old_state(path, version: int):  # type: ignore[no-untyped-def]
    """A state file as a broker of schema ``version`` left it, with one ended lease."""
    conn = sqlite3.connect(path)
    for migration in MIGRATIONS[:version]:
        conn.executescript(migration)
    conn.execute(
        "INSERT INTO ledger VALUES ('l-1', 'ann', '', 'gpu', 'batch', 1.0, 0.0, 7200.0, 2.0)"
    )
    conn.execute(f"PRAGMA user_version={version}")
    conn.commit()
    conn.close()
    return path


def test_an_older_state_file_is_left_as_it_is(capsys, tmp_path) -> None:
    """A broker of the version before may still run on it: a reader never migrates."""
    state = old_state(tmp_path / "state.sqlite", SCHEMA_VERSION - 1)
    before = state.read_bytes()
    assert main(["usage", "--state", str(state)]) == 1
    assert capsys.readouterr().err == (
        f"error: {state} was written by an older jupyter-gpubroker (schema version "
        f"{SCHEMA_VERSION - 1}, this one reads {SCHEMA_VERSION}); it is left as it is: the "
        "broker upgrades it when it next starts\n"
    )
    assert state.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.sqlite"]  # no WAL either


def test_a_newer_state_file_says_to_upgrade(capsys, tmp_path) -> None:
    state = old_state(tmp_path / "state.sqlite", SCHEMA_VERSION)
    conn = sqlite3.connect(state)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.close()
    assert main(["usage", "--state", str(state)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {state}: schema version {SCHEMA_VERSION + 1} is newer")
    assert "upgrade the package" in err and err.count("\n") == 1


def test_a_database_that_is_no_state_file_says_so(capsys, tmp_path) -> None:
    other = tmp_path / "notes.sqlite"
    other.write_bytes(b"")  # an empty file is an empty SQLite database
    assert main(["usage", "--state", str(other)]) == 1
    assert capsys.readouterr().err == (
        f"error: {other}: not a GPU broker state file (it holds no tables)\n"
    )
