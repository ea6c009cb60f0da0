"""benchmarks/replay.py's train/test mode and README generation (the full run needs the
public traces; these check its choices on hand-made inputs)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from replay_helpers import trace_of

from jupyter_gpubroker.replay.driver import Timeline
from jupyter_gpubroker.replay.traces import Job

SPEC = importlib.util.spec_from_file_location(
    "bench_replay", Path(__file__).parents[2] / "benchmarks" / "replay.py"
)
assert SPEC is not None and SPEC.loader is not None
bench = importlib.util.module_from_spec(SPEC)
sys.modules[SPEC.name] = bench  # its dataclasses look their module up
SPEC.loader.exec_module(bench)


def test_the_time_split_never_puts_one_instant_in_both_halves():
    trace = trace_of(*(Job(t, 10.0, 1, "ann") for t in (0, 1, 2, 2, 2, 3)))
    k = bench.split(trace)
    assert k == 2  # the median job is one of three at t=2: all of them go to the second half
    assert trace.jobs[k - 1].submit_s < trace.jobs[k].submit_s


def run_of(mean_wait_s, starved):
    return bench.Run({"mean_wait_s": mean_wait_s, "starved": starved}, Timeline(), 1)


def test_a_fit_takes_the_lowest_mean_wait_that_starves_no_more_than_fcfs():
    runs = [run_of(500.0, 0), run_of(100.0, 3), run_of(300.0, 1)]
    chosen = bench.best(runs, fcfs=run_of(900.0, 1))
    assert chosen == bench.CANDIDATES[2]  # 100 s starves 3 where FCFS starves 1


def test_the_readme_sections_are_replaced_and_the_prose_kept(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("prose\n<!-- generated: eta -->\nold\n<!-- end: eta -->\nmore prose\n")
    assert bench.missing_sections(readme) == ["results", "train-test"]
    bench.write_readme(readme, {"eta": "| new |"})
    assert readme.read_text() == (
        "prose\n<!-- generated: eta -->\n| new |\n<!-- end: eta -->\nmore prose\n"
    )
    bench.write_readme(readme, {"eta": "| newer |"})  # again: one section, not two
    assert readme.read_text().count("| newer |") == 1 and "| new |\n" not in readme.read_text()


@pytest.mark.parametrize("name", ["results", "eta", "train-test"])
def test_the_committed_readme_has_every_generated_section(name):
    assert name not in bench.missing_sections(Path(bench.HERE) / "README.md")
