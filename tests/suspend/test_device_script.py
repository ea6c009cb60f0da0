"""The device script (``benchmarks/device_suspend.py``) works before a GPU is lent: on
the simulated NVML it runs every step a GPU session will (the canary, a suspend and a
restore onto another GPU of the chip, a restore refused without room), and where there
is no GPU it says why in its one JSON line."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMMAND = "python benchmarks/device_suspend.py --json"
"""As docs/suspend.md shows it."""


def run(*args: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    _, *shown = shlex.split(COMMAND)
    done = subprocess.run(
        [sys.executable, *shown, *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout)


def test_on_two_simulated_h100s_every_step_passes_and_a_restore_without_room_waits() -> None:
    code, report = run("--simulate", "dgx-h100:2", "--gb", "1", "4")
    assert code == 0, report
    assert report["canary"]["action"] == "suspend"
    assert report["canary"]["reason"].startswith("the canary passed: suspended on ")
    assert [r["gb"] for r in report["runs"]] == [1.0, 4.0]
    for r in report["runs"]:
        assert r["restored_onto"] == "another GPU" and r["on_gpu_after"], r
        assert r["gpu_free_while_suspended"] and r["pattern_intact"], r
    room = report["no_room"]
    assert room["refused_before_it_started"] and room["refusal"].startswith("its restore waits: ")
    assert room["restored_once_free"] and room["pattern_intact"]


def test_without_a_gpu_the_command_the_docs_show_says_why_and_exits_2(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    assert f"\n    {COMMAND}\n" in (ROOT / "docs" / "suspend.md").read_text()
    monkeypatch.delenv("GPUBROKER_SIMULATE", raising=False)
    code, report = run()
    assert code == 2 and report["ran"] is False
    assert "No NVIDIA driver was found" in report["why"]
