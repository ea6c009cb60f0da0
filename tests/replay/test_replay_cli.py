"""``jupyter gpubroker replay``: the table, the JSON object, and clear errors."""

from __future__ import annotations

import json

from replay_helpers import OPENB_HEADER

from jupyter_gpubroker.broker.store import Store
from jupyter_gpubroker.cli import main

GENERIC = ("submit_s,duration_s,gpus,user,class", "0,100,1,ann,interactive", "10,50,1,bob,batch")
KEYS = {
    "policy",
    "jobs",
    "mean_wait_s",
    "median_wait_s",
    "p95_wait_s",
    "max_wait_s",
    "mean_jct_s",
    "utilization_busy",
    "utilization_queued",
    "fragmentation",
    "jain",
    "starved",
    "cpu_ms_per_decision",
    "by_class",
    "inventory",
    "compress",
}


def test_json_has_every_figure(write_trace, capsys):
    path = write_trace(GENERIC[0], GENERIC[1:])
    code = main(["replay", "--trace", str(path), "--policy", "fcfs", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert set(out) >= KEYS
    assert (out["policy"], out["jobs"], out["inventory"], out["compress"]) == (
        "fcfs",
        2,
        "dgx-h100-mig:64",
        1.0,
    )
    assert out["by_class"]["batch"]["max_wait_s"] == 0
    assert out["utilization_queued"] is None  # nothing ever waited: null, not NaN


def test_the_table_says_what_was_replayed_and_that_users_are_synthetic(write_trace, capsys):
    rows = ("p1,1,1,1,470,,LS,Running,0,500,0", "p2,1,1,1,1000,,BE,Running,10,20,10")
    path = write_trace(OPENB_HEADER, rows)
    args = ["replay", "--trace", str(path), "--format", "openb", "--users", "4"]
    assert main([*args, "--inventory", "dgx-h100-mig:1", "--compress", "2"]) == 0
    out = capsys.readouterr().out
    assert "inventory: dgx-h100-mig:1 (1 GPUs, dynamic MIG on); time compression x2" in out
    assert "users are synthetic: 2 users (of 4 allowed by --users)" in out
    assert "note:      columns ignored: name, cpu_milli, memory_mib, gpu_spec, pod_phase" in out
    assert "interactive p95 wait" in out and "broker" in out.splitlines()[6]


def test_a_bad_row_exits_2_naming_the_line(write_trace, capsys):
    path = write_trace(GENERIC[0], (*GENERIC[1:], "20,x,1,cy,batch"))
    assert main(["replay", "--trace", str(path)]) == 2
    assert capsys.readouterr().err == f"error: {path}:4: duration_s must be a number, not 'x'\n"
    assert main(["replay", "--trace", str(path), "--limit", "0"]) == 2


def test_status_still_works_beside_replay(tmp_path, capsys):
    Store(tmp_path / "s.sqlite").close()  # status reads an existing state file
    args = ["status", "--simulate", "dgx-h100-mig:1", "--state", str(tmp_path / "s.sqlite")]
    assert main([*args, "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["gpus"]) == 1
