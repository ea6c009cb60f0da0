"""benchmarks/whatif.py's month, made small: its generator's day on 8 MIG GPUs, written
through the core into a state file and replayed from it as it went."""

from __future__ import annotations

import pytest
from replay_helpers import benchmark

from jupyter_gpubroker.replay.whatif import Variation, compare, history

bench = benchmark("whatif")


def test_a_day_on_mig_slices_replays_from_its_file_as_it_went(tmp_path) -> None:
    trace = bench.month(2, 8)
    assert {round(j.gpus * 7) for j in trace.jobs} == {1, 2, 3, 7}  # slices and whole GPUs
    live = bench.live(trace, "dgx-h100-mig:8", tmp_path / "state.sqlite")
    assert live["requests"] == len(trace.jobs) and live["mean_wait_s"] > 60
    found = compare(history(tmp_path / "state.sqlite", bench.START + 3 * 86400), Variation())
    assert found["replayed"]["requests"] == live["requests"]
    assert found["replayed"]["mean_wait_s"] == pytest.approx(live["mean_wait_s"], rel=0.01)
    assert found["replayed"]["gpu_hours_held"] == pytest.approx(live["gpu_hours"], rel=0.01)


def test_its_busy_spans_let_a_shorter_idle_timeout_hold_less(tmp_path) -> None:
    trace = bench.month(1, 8)
    bench.live(trace, "dgx-h100-mig:8", tmp_path / "state.sqlite")
    bench.busy_spans(tmp_path / "state.sqlite")
    h = history(tmp_path / "state.sqlite", bench.START + 2 * 86400)
    found = compare(h, Variation(idle_timeout=600))
    was, now = found["replayed"], found["what_if"]
    assert now["gpu_hours_held"] < was["gpu_hours_held"] and now["kernels_lost"] > 0
    assert now["held_over_used"] < was["held_over_used"]
