"""`jupyter gpubroker status`: the inventory as a table and as JSON, with holders."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_gpubroker.broker.core import Broker
from jupyter_gpubroker.broker.store import Store
from jupyter_gpubroker.cli import main
from jupyter_gpubroker.cli.status import render_status
from jupyter_gpubroker.nvml import open_backend, seed_for
from jupyter_gpubroker.wire.sizes import Size


@pytest.fixture(autouse=True)
def _alone(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """No Jupyter server runs (none is found in this runtime dir), no broker URL is set."""
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.delenv("GPUBROKER_URL", raising=False)
    monkeypatch.setenv("GPUBROKER_STATE", str(tmp_path / "default-state.sqlite"))


def empty_state(tmp_path) -> str:
    """A state file as a broker leaves it before its first request."""
    Store(tmp_path / "empty.sqlite").close()
    return str(tmp_path / "empty.sqlite")


def status_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["status", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_lists_every_gpu_and_slice(capsys, tmp_path) -> None:
    report = status_json(capsys, "--simulate", "dgx-h100-mig", "--state", empty_state(tmp_path))
    assert report["source"] == "simulated: dgx-h100-mig"
    assert len(report["gpus"]) == 8
    slices = [d for g in report["gpus"] for d in g["devices"]]
    assert len(slices) == 56
    assert len({d["uuid"] for d in slices}) == 56
    assert all(d["uuid"].startswith("MIG-") and d["profile"] == "1g.10gb" for d in slices)
    assert all(d["memory_mib"] > 9000 and d["holder"] is None for d in slices)
    # MIG slices have no utilization through NVML: reported as unknown, not as 0
    assert all(d["utilization_gpu"] is None for d in slices)


def test_holders_come_from_the_state_file(capsys, tmp_path) -> None:
    state = tmp_path / "state.sqlite"
    with open_backend("h200-mig-balanced", seed=seed_for(str(state))) as backend:
        inventory = backend.inventory()
    broker = Broker(Store(state), inventory)
    lease_id = broker.submit("ada", Size(profile="3g.71gb")).lease_id
    held = broker.lease(lease_id).devices[0]
    broker.store.close()

    report = status_json(capsys, "--simulate", "h200-mig-balanced", "--state", str(state))
    devices = {d["uuid"]: d for g in report["gpus"] for d in g["devices"]}
    assert devices[held]["holder"] == {
        "user": "ada",
        "lease_id": lease_id,
        "request_id": broker.lease(lease_id).request_id,
    }
    assert sum(1 for d in devices.values() if d["holder"]) == 1

    assert main(["status", "--simulate", "h200-mig-balanced", "--state", str(state)]) == 0
    table = capsys.readouterr().out
    assert f"ada ({lease_id})" in table
    assert "2 GPUs, 8 grantable devices, 0 drained; held: one 3g.71gb slice" in table


def test_whole_gpus_show_their_utilization(capsys, tmp_path) -> None:
    report = status_json(capsys, "--simulate", "dgx-h100", "--state", empty_state(tmp_path))
    assert [d["kind"] for g in report["gpus"] for d in g["devices"]] == ["gpu"] * 8
    assert all(g["utilization_gpu"] == 0 for g in report["gpus"])


@pytest.mark.usefixtures("no_driver")
def test_no_driver_says_how_to_simulate(capsys, monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("GPUBROKER_SIMULATE", raising=False)
    assert main(["status"]) == 1  # no server either: say that first, as `queue` does
    assert capsys.readouterr().err == (
        "error: no running Jupyter server found, and this machine has no NVIDIA driver: "
        "start a server, pass --url (or set GPUBROKER_URL), or look at a simulated machine "
        "with --simulate dgx-h100-mig\n"
    )
    assert main(["status", "--state", empty_state(tmp_path)]) == 1  # this machine's view
    err = capsys.readouterr().err
    assert "No NVIDIA driver" in err and "GPUBROKER_SIMULATE=dgx-h100-mig" in err


def test_unknown_topology_is_a_clear_error(capsys) -> None:
    assert main(["status", "--simulate", "dgx-h900"]) == 1
    assert "unknown simulated topology 'dgx-h900'" in capsys.readouterr().err


def test_command_line_entry_point() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "jupyter_gpubroker.cli", "status", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--simulate" in out and "--json" in out
    bare = subprocess.run([sys.executable, "-m", "jupyter_gpubroker.cli"], capture_output=True)
    assert bare.returncode == 2


def test_drained_gpus_show_with_their_reason(capsys, tmp_path) -> None:
    state = tmp_path / "state.sqlite"
    with open_backend("h200-mig-balanced", seed=seed_for(str(state))) as backend:
        inventory = backend.inventory()
    broker = Broker(Store(state), inventory)
    gpu = inventory.gpus[1].uuid
    broker.drain(gpu, "temperature 93 C over 85 C")
    broker.store.close()

    report = status_json(capsys, "--simulate", "h200-mig-balanced", "--state", str(state))
    drained = {g["uuid"]: g["drained"] for g in report["gpus"]}
    assert drained[gpu]["reason"] == "temperature 93 C over 85 C"
    assert drained[gpu]["cause"] == "admin"  # the state file says who drained it
    assert drained[inventory.gpus[0].uuid] is None
    on_gpu = [d for g in report["gpus"] if g["uuid"] == gpu for d in g["devices"]]
    assert len(on_gpu) == 4 and all(d["drained"] for d in on_gpu)

    assert main(["status", "--simulate", "h200-mig-balanced", "--state", str(state)]) == 0
    table = capsys.readouterr().out
    assert "DRAINED: temperature 93 C over 85 C" in table
    assert "8 grantable devices, 4 drained; held: nothing (" in table


def test_a_missing_state_file_is_an_error(capsys, tmp_path) -> None:
    missing = tmp_path / "no" / "such.sqlite"
    assert main(["status", "--simulate", "dgx-h100-mig", "--state", str(missing)]) == 1
    assert capsys.readouterr().err == (
        f"error: {missing}: no such state file; check --state (a broker creates it when it "
        "first starts)\n"
    )
    assert not missing.exists()


def test_a_corrupt_state_file_is_one_line(capsys, tmp_path) -> None:
    garbage = tmp_path / "state.sqlite"
    garbage.write_bytes(b"not a database" * 100)
    assert main(["status", "--simulate", "dgx-h100-mig", "--state", str(garbage)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {garbage}: not a SQLite database; restore it from a backup")
    assert err.count("\n") == 1


@pytest.mark.parametrize("command", ["status", "usage"])
def test_a_state_file_cut_short_is_one_line_saying_to_restore_it(capsys, tmp_path, command) -> None:
    """Read offline, a truncated file is a damaged one (a backup mends it), not one this
    user may not read: the advice is not about its permissions."""
    state = tmp_path / "empty.sqlite"
    state.write_bytes(Path(empty_state(tmp_path)).read_bytes()[:5000])
    args = ["--simulate", "dgx-h100-mig"] if command == "status" else []
    assert main([command, *args, "--state", str(state)]) == 1
    err = capsys.readouterr().err
    assert err == (
        f"error: {state}: the database in it is damaged (cut short or overwritten); restore it "
        "from a backup, or move it aside (the broker then starts with an empty state), or set "
        "c.GPUBroker.state_file (or $GPUBROKER_STATE) to another file\n"
    )


def test_the_table_says_what_it_read(capsys, tmp_path) -> None:
    state = empty_state(tmp_path)
    assert main(["status", "--simulate", "dgx-h100-mig:1", "--state", state]) == 0
    assert f"(simulated: dgx-h100-mig:1; no broker running; holders from {state})" in (
        capsys.readouterr().out
    )


def test_a_reader_that_leaves_early_gets_no_traceback(tmp_path) -> None:
    """`status --json | head -1`: the pipe closes under a long report."""
    done = subprocess.run(
        f"{sys.executable} -m jupyter_gpubroker.cli status --simulate dgx-h100-mig:64 "
        f"--state {empty_state(tmp_path)} --json | head -1",
        shell=True,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout == "{\n"
    assert done.stderr == ""


def test_another_users_lease_seen_through_an_api_shows_its_user_only() -> None:
    report = {
        "source": "broker at http://h/gpubroker/api/v1",
        "gpus": [
            {
                "index": 0,
                "uuid": "GPU-1",
                "name": "NVIDIA H100",
                "mig_enabled": False,
                "memory_mib": 81920,
                "devices": [
                    {
                        "kind": "gpu",
                        "uuid": "GPU-1",
                        "holder": {"user": "bob", "lease_id": None, "request_id": None},
                    }
                ],
            }
        ],
    }
    table = render_status(report)
    assert "  bob  " in table and "None" not in table
    assert "(broker at http://h/gpubroker/api/v1)" in table
