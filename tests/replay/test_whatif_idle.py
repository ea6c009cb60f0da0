"""What-if of another idle timeout and reclaim action, on a state file a running broker
wrote while its sampling passes judged its leases' kernels, as reported with each renewal:
its idle reclaim recorded each lease's busy periods and why it ended, and the replay cuts
the leases at them."""

from __future__ import annotations

import json
import shlex
import shutil
import time
from pathlib import Path

import pytest
from traitlets.config import Config

from jupyter_gpubroker.api.rules import BrokerAPI
from jupyter_gpubroker.broker.accounting import Prices
from jupyter_gpubroker.broker.clock import VirtualClock
from jupyter_gpubroker.broker.core import Broker
from jupyter_gpubroker.broker.recorded import MAX_SPANS, Activity
from jupyter_gpubroker.broker.store import Store
from jupyter_gpubroker.cli.main import main
from jupyter_gpubroker.client import kernel_report
from jupyter_gpubroker.nvml import open_backend
from jupyter_gpubroker.replay import whatif
from jupyter_gpubroker.replay.whatif import Variation, compare, history, parse_quota
from jupyter_gpubroker.runtime import GPUBroker
from jupyter_gpubroker.wire.errors import InvalidRequest
from jupyter_gpubroker.wire.sizes import Size

LOOK_S = 30.0
"""The sampling pass's interval here (the broker's is 5 s)."""
# (submitted after the start, s; held for, s; whole GPUs; user; busy spans after the grant,
# None: no kernel reports, as a CLI lease). The broker runs with an idle timeout of 40 min
# and a grace of 10: alice's kernel sits idle after its last cell and is reclaimed at 100 min.
JOBS = [
    (0, 7200, 1, "alice", ((0, 600), (2400, 3000))),
    (0, 5400, 2, "bob", ((300, 900), (3300, 4300))),
    (0, 3600, 1, "carol", ((0, 3100),)),
    (600, 1800, 1, "dave", ((0, 1300),)),
    (100, 1200, 1, "erin", None),
]


def live_run(state: Path) -> dict[str, float]:
    """Play JOBS through a running broker on a virtual clock, a sampling pass every
    ``LOOK_S``, each kernel's state reported with its lease's renewal; what it gave."""
    c = Config()
    c.GPUBroker.simulate = "dgx-h100:4"
    c.GPUBroker.state_file = str(state)
    c.GPUBroker.identity = "username"
    c.GPUBroker.idle_timeout = 2400.0
    c.GPUBroker.grace = 600.0
    c.GPUBroker.reclaim_action = "shutdown"
    runtime = GPUBroker(config=c)
    runtime.start()
    api = BrokerAPI(runtime)
    start = time.time() - 86400
    clock = VirtualClock(start)
    runtime.core.clock.now = clock.now
    waiting = {}
    held: dict[str, tuple[float, int]] = {}  # lease id -> (granted at, job)
    waits, hours = [], 0.0
    i, now = 0, start
    try:
        while i < len(JOBS) or waiting or held:
            clock.set(now)
            for lease_id, (granted, j) in list(held.items()):
                _, duration, gpus, user, busy = JOBS[j]
                who = api.user_identity(user)
                lease = runtime.core.lease(lease_id)
                if lease.ended_at is not None:  # reclaimed
                    hours += gpus * (lease.ended_at - granted) / 3600
                    del held[lease_id]
                elif now >= granted + duration:
                    api.release(who, lease_id)
                    hours += gpus * duration / 3600
                    del held[lease_id]
                elif busy is not None:
                    state, last = kernel_at(busy, now - granted)
                    api.renew(who, lease_id, {"kernel": kernel_report(state, granted + last)})
            while i < len(JOBS) and start + JOBS[i][0] <= now:
                user, gpus = JOBS[i][3], JOBS[i][2]
                r = api.submit(api.user_identity(user), {"gpus": gpus, "holder": f"k{i}"})
                waiting[r["id"]] = i
                i += 1
            for rid, j in list(waiting.items()):
                r = runtime.core.request(rid)
                if r.lease_id is not None:
                    del waiting[rid]
                    lease = runtime.core.lease(r.lease_id)
                    held[lease.id] = (lease.granted_at, j)
                    waits.append(lease.granted_at - r.submitted_at)
            runtime.sampler.sample()
            now += LOOK_S
    finally:
        runtime.stop()
    return {"mean_wait_s": sum(waits) / len(waits), "gpu_hours_held": hours, "n": len(waits)}


def kernel_at(busy: tuple[tuple[int, int], ...], t: float) -> tuple[str, float]:
    """A kernel's state ``t`` after its grant, and its last activity (after the grant)."""
    last = 0.0
    for a, b in busy:
        if a <= t < b:
            return "busy", a
        if b <= t:
            last = b
    return "idle", last


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, float]]:
    state = tmp_path_factory.mktemp("whatif-idle") / "state.sqlite"
    return state, live_run(state)


def test_the_broker_records_busy_periods_and_why_each_lease_ended(written) -> None:
    state, live = written
    store = Store(state, read_only=True)
    rows = {
        r["user"]: r
        for r in store.db.query(
            "SELECT l.user, l.busy, l.granted_at, l.state, (SELECT kind FROM reclaims"
            " WHERE lease_id = l.id) AS cause FROM leases l"
        )
    }
    store.close()
    alice = rows["alice"]
    spans = [
        [a - alice["granted_at"], b - alice["granted_at"]] for a, b in json.loads(alice["busy"])
    ]
    assert spans == [
        pytest.approx([0, 600], abs=LOOK_S + 1),
        pytest.approx([2400, 3000], abs=LOOK_S + 1),
    ]
    assert (alice["state"], alice["cause"]) == ("reclaimed", "idle")  # 50 min after her last cell
    assert (rows["bob"]["state"], rows["bob"]["cause"]) == ("released", None)
    assert rows["erin"]["busy"] is None  # no kernel seen: nothing recorded
    assert live["n"] == len(JOBS) and live["mean_wait_s"] > 60  # dave and erin waited
    found = compare(history(state, time.time()), Variation())
    for run in ("recorded", "replayed"):
        assert found[run]["gpu_hours_held"] == pytest.approx(live["gpu_hours_held"], rel=0.01)
        assert found[run]["mean_wait_s"] == pytest.approx(live["mean_wait_s"], rel=0.01)
    assert found["recorded"]["kernels_lost"] == 1  # alice's, reclaimed
    assert found["recorded"]["held_over_used"] > 1.5


def test_a_shorter_idle_timeout_holds_less_and_loses_kernels(written) -> None:
    state, _ = written
    h = history(state, time.time())
    shorter = compare(h, Variation(idle_timeout=600, grace=0))
    was, now = shorter["replayed"], shorter["what_if"]
    # alice's and bob's kernels sat idle 30 and 40 min between cells: shut down, then back
    assert now["kernels_lost"] == 2
    assert now["gpu_hours_held"] < was["gpu_hours_held"] - 2
    assert now["held_over_used"] < was["held_over_used"]
    assert now["requests"] == was["requests"] + 2  # each came back and asked again
    longer = compare(h, Variation(idle_timeout=7200))
    assert longer["what_if"]["kernels_lost"] == 0
    assert longer["what_if"]["gpu_hours_held"] > was["gpu_hours_held"]  # alice's held on
    suspended = compare(h, Variation(idle_timeout=600, grace=0, reclaim_action="suspend"))
    assert suspended["what_if"]["kernels_lost"] == 0
    assert suspended["what_if"]["kernels_suspended"] == 4  # between cells and after the last
    assert suspended["what_if"]["gpu_hours_held"] == pytest.approx(now["gpu_hours_held"])


def test_the_what_if_replayed_in_a_process_of_its_own_gives_the_same_figures(
    written, monkeypatch
) -> None:
    """A long history's what-if replays in a second process, beside the unvaried one."""
    state, _ = written
    h = history(state, time.time())
    prices = Prices.from_dict({"per_gpu_hour": {"gpu": 2.0, "*": 1.0}})
    asked = Variation(idle_timeout=600, grace=0, quotas=(parse_quota("user:bob:max_gpus=1"),))
    here = compare(h, asked, prices)
    monkeypatch.setattr(whatif, "BESIDE_FROM", 0)
    monkeypatch.setattr(whatif.os, "sched_getaffinity", lambda _: {0, 1})
    pools, pool = [], whatif.ProcessPoolExecutor
    monkeypatch.setattr(
        whatif, "ProcessPoolExecutor", lambda *a, **k: pools.append(1) or pool(*a, **k)
    )
    beside = compare(h, asked, prices)
    assert pools and beside == here
    assert beside["what_if"]["kernels_lost"] == 2 and beside["what_if"]["cost"] > 0
    with pytest.raises(InvalidRequest, match="windows are the broker policy's"):
        compare(h, Variation(policy="fcfs", timezone="UTC"))  # refused before either replay


def test_the_command_varies_the_idle_timeout_and_says_what_it_cannot(
    written, tmp_path, capsys
) -> None:
    state, _ = written
    argv = ["whatif", "--state", str(state)]
    assert main([*argv, "--idle-timeout", "600", "--grace", "0"]) == 0
    out = capsys.readouterr().out
    lost = next(line for line in out.splitlines() if line.startswith("kernels lost"))
    assert lost.split()[2:] == ["1", "-", "2"]
    assert "held over used (kernels seen)" in out
    for args, said in (
        (["--idle-timeout", "-60"], "the idle timeout must be seconds, 0 or at least"),
        (["--grace", "-1"], "the grace must be seconds"),
        (["--reclaim-action", "nap"], "the reclaim action is shutdown or suspend, not 'nap'"),
    ):
        assert main([*argv, *args]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"error: {said}") and err.count("\n") == 1
    old = tmp_path / "old.sqlite"
    shutil.copy(state, old)
    store = Store(old)
    with store.transaction() as c:  # as a file written before busy periods were recorded
        c.execute("UPDATE leases SET busy = NULL")
    store.close()
    assert main(["whatif", "--state", str(old), "--idle-timeout", "600"]) == 1
    err = capsys.readouterr().err
    assert "old.sqlite records no busy periods of any kernel" in err and err.count("\n") == 1
    assert main(["whatif", "--state", str(old), "--gpus", "1"]) == 0
    assert "records no kernel's busy periods" in capsys.readouterr().out


def test_the_command_docs_cli_shows_runs_as_written(written, tmp_path, monkeypatch, capsys) -> None:
    state, _ = written
    shutil.copy(state, tmp_path / "state.sqlite")
    monkeypatch.chdir(tmp_path)
    shown = (
        "jupyter gpubroker whatif --state state.sqlite --idle-timeout 600 --reclaim-action suspend"
    )
    assert shown in (Path(__file__).parents[2] / "docs" / "cli.md").read_text()
    assert main(shlex.split(shown)[2:]) == 0
    suspended = next(x for x in capsys.readouterr().out.splitlines() if "suspended" in x)
    # 600 s and the recorded 600 s of grace: alice's kernel between its cells and after
    # them, bob's between its cells (idle 1200 s after its last, not longer)
    assert suspended.split()[2:] == ["0", "-", "3"]


def test_busy_spans_go_on_across_a_restart_and_stay_bounded(tmp_path) -> None:
    store = Store(tmp_path / "state.sqlite")
    with open_backend("dgx-h100:1") as backend:
        broker = Broker(store, backend.inventory(), clock=VirtualClock(0.0))
    lease = broker.lease(broker.request(broker.submit("alice", Size(gpus=1)).id).lease_id)
    g = lease.granted_at
    Activity(store).look(g + 10, {lease.id: (g, 0.0)})  # busy
    Activity(store).look(g + 20, {lease.id: (g, 5.0)})  # a restart between: idle since +15
    assert busy_of(store, lease.id) == [[g + 10, g + 15]]
    activity = Activity(store)
    for i in range(2 * MAX_SPANS):  # a cell every 10 minutes
        activity.look(g + 600 * (i + 1), {lease.id: (g, 0.0)})
        activity.look(g + 600 * (i + 1) + 300, {lease.id: (g, 1.0)})
    spans = busy_of(store, lease.id)
    assert len(spans) == MAX_SPANS and spans[-1][1] == g + 600 * 2 * MAX_SPANS + 299
    store.close()


def busy_of(store: Store, lease_id: str) -> list[list[float | None]]:
    return json.loads(
        store.conn.execute("SELECT busy FROM leases WHERE id=?", (lease_id,)).fetchone()[0]
    )
