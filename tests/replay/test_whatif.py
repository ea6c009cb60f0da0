"""What-if on a state file a running broker wrote: replayed with nothing varied, it gives
what the live run gave; varied, it moves the way the change must."""

from __future__ import annotations

import heapq
import json
import shlex
import shutil
import time
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from traitlets.config import Config

from jupyter_gpubroker.api.rules import BrokerAPI
from jupyter_gpubroker.broker.budgets import Quota
from jupyter_gpubroker.broker.clock import VirtualClock
from jupyter_gpubroker.broker.recorded import record_machine
from jupyter_gpubroker.broker.store import Store
from jupyter_gpubroker.cli.main import main
from jupyter_gpubroker.replay.whatif import Variation, by_day, compare, history, parse_quota
from jupyter_gpubroker.runtime import GPUBroker
from jupyter_gpubroker.wire.errors import InvalidRequest

# (submitted after the start, s; held for, s; whole GPUs; user): a morning on four GPUs
# where the queue forms twice.
JOBS = [
    (0, 1800, 1, "alice"),
    (60, 3600, 2, "bob"),
    (120, 900, 1, "carol"),
    (300, 2400, 2, "alice"),
    (320, 600, 1, "dave"),
    (900, 1200, 1, "bob"),
    (1000, 300, 4, "carol"),
    (2000, 1500, 1, "dave"),
    (2100, 1800, 2, "alice"),
    (2200, 600, 1, "bob"),
    (5000, 1200, 3, "carol"),
    (5100, 900, 2, "dave"),
]


def live_run(
    state: Path, policy: str = "broker", bob_gpus: float | None = None
) -> dict[str, float]:
    """Play JOBS through a running broker's API on a virtual clock, bob held to
    ``bob_gpus`` at once where given; what it gave."""
    c = Config()
    c.GPUBroker.policy = policy
    c.GPUBroker.simulate = "dgx-h100:4"
    c.GPUBroker.state_file = str(state)
    c.GPUBroker.identity = "username"
    runtime = GPUBroker(config=c)
    runtime.start()
    api = BrokerAPI(runtime)
    if bob_gpus is not None:
        runtime.core.set_quota("user", "bob", Quota(max_gpus=bob_gpus))
    start = time.time() - 86400
    clock = VirtualClock(start)
    runtime.core.clock.now = clock.now  # the clock the core shares with its book and rules
    ends: list[tuple[float, int, str, str]] = []
    waiting: dict[str, tuple[str, float, float]] = {}
    waits: list[float] = []
    held = 0.0
    arrivals = sorted((start + t, d, n, u) for t, d, n, u in JOBS)
    i = 0
    try:
        while i < len(arrivals) or ends:
            next_arrival = arrivals[i][0] if i < len(arrivals) else float("inf")
            now = min(next_arrival, ends[0][0] if ends else float("inf"))
            clock.set(now)
            while ends and ends[0][0] <= now:
                _, _, user, lease_id = heapq.heappop(ends)
                api.release(api.user_identity(user), lease_id)
            while i < len(arrivals) and arrivals[i][0] <= now:
                _, duration, gpus, user = arrivals[i]
                r = api.submit(api.user_identity(user), {"gpus": gpus, "holder": f"k{i}"})
                waiting[r["id"]] = (user, duration, float(gpus))
                i += 1
            for rid, (user, duration, gpus) in list(waiting.items()):
                r = api.request(api.user_identity(user), rid)
                if r["state"] == "granted":
                    del waiting[rid]
                    lease = runtime.core.lease(r["lease"]["id"])
                    waits.append(lease.granted_at - runtime.core.request(rid).submitted_at)
                    held += gpus * duration / 3600
                    heapq.heappush(ends, (now + duration, len(ends) + i, user, lease.id))
    finally:
        runtime.stop()
    return {"mean_wait_s": sum(waits) / len(waits), "gpu_hours_held": held, "n": len(waits)}


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, float]]:
    state = tmp_path_factory.mktemp("whatif") / "state.sqlite"
    return state, live_run(state)


def test_whatif_with_nothing_varied_gives_what_the_live_run_gave(written) -> None:
    state, live = written
    assert live["mean_wait_s"] > 300  # the queue formed: the check below can fail
    found = compare(history(state, time.time()), Variation())
    for run in ("recorded", "replayed"):
        assert found[run]["requests"] == live["n"] == len(JOBS)
        assert found[run]["gpu_hours_held"] == pytest.approx(live["gpu_hours_held"], rel=0.01)
        assert found[run]["mean_wait_s"] == pytest.approx(live["mean_wait_s"], rel=0.01)


def test_each_run_has_its_days_and_the_command_draws_them(
    written, tmp_path, monkeypatch, capsys
) -> None:
    state, _ = written
    found = compare(history(state, time.time()), Variation(gpus=4))
    for run in found.values():  # the days add up to the run's figures
        days = run["days"]
        assert sum(d["requests"] for d in days) == run["requests"]
        waited = sum(d["mean_wait_s"] * d["requests"] for d in days)
        assert waited == pytest.approx(run["mean_wait_s"] * run["requests"])
        assert sum(d["gpu_hours_held"] for d in days) == pytest.approx(run["gpu_hours_held"])
    pytest.importorskip("matplotlib")
    shown = "jupyter gpubroker whatif --state state.sqlite --gpus 4 --plot whatif.png"
    assert f"`{shown}`" in (Path(__file__).parents[2] / "docs" / "cli.md").read_text()
    shutil.copy(state, tmp_path / "state.sqlite")
    monkeypatch.chdir(tmp_path)
    assert main(shlex.split(shown)[2:]) == 0
    assert "The plot of each day is in whatif.png." in capsys.readouterr().out
    assert (tmp_path / "whatif.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for target, said in (
        (tmp_path / "whatif.svg", "--plot writes a PNG file: name it .png, not whatif.svg"),
        (tmp_path / "none" / "w.png", f"--plot cannot write {tmp_path}/none/w.png: there is no"),
    ):
        assert main(["whatif", "--state", str(state), "--plot", str(target)]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"error: {said}") and err.count("\n") == 1


def test_a_hold_over_midnight_counts_on_both_days_and_a_day_without_requests_is_zero() -> None:
    zone = ZoneInfo("Europe/Berlin")
    midnight = datetime(2026, 12, 7, tzinfo=zone).timestamp()
    asked = [(midnight - 3600, 600.0), (midnight - 1800, 0.0), (midnight + 86400 + 600, 60.0)]
    hold = {"start": midnight - 1800, "end": midnight + 3 * 3600, "gpu_equivalents": 2.0}
    days = by_day(asked, [hold], zone)
    assert [d["day"] for d in days] == ["2026-12-06", "2026-12-07", "2026-12-08"]
    assert [(d["requests"], d["mean_wait_s"]) for d in days] == [(2, 300.0), (0, 0.0), (1, 60.0)]
    assert [d["gpu_hours_held"] for d in days] == pytest.approx([1.0, 6.0, 0.0])
    assert by_day([], [], zone) == []


def test_the_replay_orders_by_the_policy_the_broker_recorded(tmp_path) -> None:
    state = tmp_path / "fcfs.sqlite"
    live = live_run(state, "fcfs")
    h = history(state, time.time())
    assert h.settings["policy"] == "fcfs"
    found = compare(h, Variation(policy="broker"))
    assert found["replayed"]["mean_wait_s"] == pytest.approx(live["mean_wait_s"], rel=0.01)
    assert found["what_if"]["mean_wait_s"] != pytest.approx(live["mean_wait_s"], rel=0.01)


def test_the_replay_keeps_the_quotas_the_file_holds(tmp_path) -> None:
    state = tmp_path / "quota.sqlite"
    live = live_run(state, bob_gpus=2)
    free = compare(
        history(tmp_path / "quota.sqlite", time.time()),
        Variation(quotas=(parse_quota("user:bob:max_gpus=8"),)),
    )
    assert free["replayed"]["mean_wait_s"] == pytest.approx(live["mean_wait_s"], rel=0.01)
    assert free["what_if"]["mean_wait_s"] != pytest.approx(live["mean_wait_s"], rel=0.01)


def test_more_gpus_shorten_the_waits(written) -> None:
    state, _ = written
    h = history(state, time.time())
    assert len(h.machine.gpus) == 4  # the file recorded the machine it served
    more = compare(h, Variation(gpus=4))
    other = compare(h, Variation(machine="dgx-h100:5"))
    assert more["what_if"]["mean_wait_s"] < more["replayed"]["mean_wait_s"] / 2
    assert more["what_if"]["mean_wait_s"] < other["what_if"]["mean_wait_s"]
    assert other["what_if"]["mean_wait_s"] < other["replayed"]["mean_wait_s"]
    assert more["what_if"]["gpu_hours_held"] == pytest.approx(more["replayed"]["gpu_hours_held"])
    with pytest.raises(InvalidRequest, match="cannot lose 4"):
        compare(h, Variation(gpus=-4))


def test_a_quota_holds_its_user_back_in_the_replay(written) -> None:
    state, _ = written
    h = history(state, time.time())
    capped = compare(h, Variation(quotas=(parse_quota("user:carol:max_gpus=1"),)))
    # carol's 4- and 3-GPU jobs can never run under a 1-GPU cap: refused, not replayed
    assert capped["what_if"]["requests"] == capped["replayed"]["requests"] - 2
    assert (capped["what_if"]["refused"], capped["replayed"]["refused"]) == (2, 0)
    with pytest.raises(InvalidRequest, match="KIND:NAME"):
        parse_quota("carol=1")
    with pytest.raises(InvalidRequest, match="not 'gpus'"):
        parse_quota("user:carol:gpus=1")


def test_the_whatif_command_prints_the_runs_side_by_side(written, capsys) -> None:
    state, live = written
    assert main(["whatif", "--state", str(state), "--gpus", "4"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["what", "happened", "replayed", "what", "if"]
    assert "mean wait (s)" in out and "GPU-hours held" in out
    assert main(["whatif", "--state", str(state), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"recorded", "replayed", "left_out"}
    assert data["replayed"]["gpu_hours_held"] == pytest.approx(live["gpu_hours_held"], rel=0.01)
    assert main(["whatif", "--state", str(state.parent / "none.sqlite")]) == 1
    assert "no broker state file" in capsys.readouterr().err


def test_bad_settings_and_a_file_with_no_machine_are_said_plainly(
    written, tmp_path, capsys
) -> None:
    state, _ = written
    for args, said in (
        (["--quota", "carol"], "a quota is KIND:NAME:FIELD=VALUE"),
        (["--gpus", "-9"], "the machine has 4 GPUs: it cannot lose 9"),
        (["--machine", "dgx-z900"], "unknown simulated topology 'dgx-z900'"),
    ):
        assert main(["whatif", "--state", str(state), *args]) == 1
        assert said in capsys.readouterr().err
    bare = tmp_path / "bare.sqlite"
    Store(bare).close()  # a file no broker recorded a machine in
    assert main(["whatif", "--state", str(bare)]) == 1
    assert "records no machine" in capsys.readouterr().err
    assert main(["whatif", "--state", str(bare), "--machine", "dgx-h100:2"]) == 1
    assert "records no granted request: there is nothing to replay" in capsys.readouterr().err
    odd = tmp_path / "odd.sqlite"
    shutil.copy(state, odd)
    store = Store(odd)
    with store.transaction():  # a later machine of GPUs the simulator has no model of
        record_machine(store, time.time(), [{"model": "Z100-1TB", "mig": None}], {})
    store.close()
    assert main(["whatif", "--state", str(odd)]) == 1
    assert "records a machine the simulator cannot build" in capsys.readouterr().err
    assert main(["whatif", "--state", str(odd), "--machine", "dgx-h100:4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["replayed"]["requests"] == len(JOBS)


def test_other_prices_cost_the_what_if_and_windows_are_read_and_checked(
    written, tmp_path, capsys
) -> None:
    state, live = written
    prices, cheaper = tmp_path / "prices.yaml", tmp_path / "cheaper.yaml"
    prices.write_text('{currency: EUR, per_gpu_hour: {gpu: 2.0, "*": 2.0}}')
    cheaper.write_text('{currency: EUR, per_gpu_hour: {gpu: 0.5, "*": 0.5}}')
    argv = ["whatif", "--state", str(state), "--json", "--prices", str(prices)]
    assert main([*argv, "--prices-if", str(cheaper)]) == 0
    got = json.loads(capsys.readouterr().out)
    hours = live["gpu_hours_held"]
    assert got["recorded"]["cost"] == pytest.approx(2.0 * hours, rel=0.01)
    assert got["replayed"]["cost"] == pytest.approx(2.0 * hours, rel=0.01)
    assert got["what_if"]["cost"] == pytest.approx(0.5 * hours, rel=0.01)

    windows = tmp_path / "windows.yaml"
    windows.write_text(
        "[{name: day, start: '08:00', end: '19:00', days: mon-fri,"
        " weights: {interactive: 2000, batch: 0}}]"
    )
    assert main(["whatif", "--state", str(state), "--json", "--windows", str(windows)]) == 0
    assert json.loads(capsys.readouterr().out)["what_if"]["requests"] == len(JOBS)
    windows.write_text("{day: 1}")
    assert main(["whatif", "--state", str(state), "--windows", str(windows)]) == 1
    assert "must hold a list of windows" in capsys.readouterr().err
    windows.write_text("[{name: day, start: '25:00', end: '19:00'}]")
    assert main(["whatif", "--state", str(state), "--windows", str(windows)]) == 1
    err = capsys.readouterr().err
    assert err == "error: window 'day': hours run from 0 to 24, not 25\n"
    argv = ["whatif", "--state", str(state), "--policy", "fcfs", "--timezone", "Europe/Paris"]
    assert main(argv) == 1
    assert "windows are the broker policy's" in capsys.readouterr().err
