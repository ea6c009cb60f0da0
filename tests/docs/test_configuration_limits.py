"""docs/configuration.md's time-limit example holds: its settings, run as a config file,
start a broker, and each line of its table is what that broker gives the request."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from traitlets import TraitError
from traitlets.config import Config

from jupyter_gpubroker.broker.models import JobClass
from jupyter_gpubroker.runtime import GPUBroker
from jupyter_gpubroker.wire.errors import InvalidRequest
from jupyter_gpubroker.wire.sizes import Size, parse_duration

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def section() -> str:
    text = PAGE.read_text()
    return text[text.index("\n## Time limits\n") : text.index("\n## ETAs on day one\n")]


def example() -> str:
    return re.search(r"```python\n(.*?)```", section(), re.S).group(1)  # type: ignore[union-attr]


def table() -> list[list[str]]:
    rows = [line for line in section().splitlines() if line.startswith("| ")]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    return cells[2:]  # under the header and its "| --- |" line


def test_the_time_limit_example_gives_what_its_table_says(tmp_path: Path) -> None:
    c = Config()
    exec(example(), {"c": c})  # as jupyter runs a config file
    c.GPUBroker.simulate = "dgx-h100"
    c.GPUBroker.state_file = str(tmp_path / "state.sqlite")
    rt = GPUBroker(config=c)
    rt.start()
    try:
        rows = table()
        assert len(rows) == 6
        for request, groups, states, gets in rows:
            job_class, size = request.replace("`", "").split(", ")
            stated = None if states == "nothing" else parse_duration(states.replace(" ", ""))
            check = (JobClass(job_class), Size.parse(size), [groups.strip("`")], stated)
            if gets.startswith("refused: "):
                with pytest.raises(InvalidRequest) as bad:
                    rt.core.limits.check(*check)
                assert bad.value.message.endswith(gets.removeprefix("refused: ")), request
            else:
                got = rt.core.limits.check(*check)
                want = (
                    None
                    if gets == "no limit"
                    else parse_duration(gets.split(" (")[0].replace(" ", ""))
                )
                assert got == want, (request, groups, got)
    finally:
        rt.stop()


def test_the_promise_stretch_line_sets_it_and_a_bad_one_is_refused_in_a_sentence() -> None:
    blocks = re.findall(r"```python\n(.*?)```", section(), re.S)
    (line,) = [b for b in blocks if "promise_stretch" in b]
    c = Config()
    exec(line, {"c": c})
    assert GPUBroker(config=c).limit_fields()["promise_stretch"] == 2.0
    with pytest.raises(
        TraitError, match="GPUBroker.promise_stretch must be a number from 1 to 100, not 0.5"
    ):
        GPUBroker(promise_stretch=0.5)
