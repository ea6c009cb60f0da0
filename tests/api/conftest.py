"""A started GPUBroker and its API layer, called directly: no HTTP server, no event loop."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from traitlets.config import Config

from jupyter_gpubroker.api.rules import BrokerAPI
from jupyter_gpubroker.runtime import GPUBroker

Start = Callable[..., BrokerAPI]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    """``start(**traits)``: a broker on one H100 cut in seven 1g.10gb slices, state under
    ``tmp_path``, configured with ``c.GPUBroker`` ``traits``; stopped after the test."""
    started: list[GPUBroker] = []

    def make(**traits: Any) -> BrokerAPI:
        c = Config()
        c.GPUBroker.simulate = "dgx-h100-mig:1"
        c.GPUBroker.state_file = str(tmp_path / "state.sqlite")
        for k, v in traits.items():
            setattr(c.GPUBroker, k, v)
        runtime = GPUBroker(config=c)
        runtime.start()
        started.append(runtime)
        return BrokerAPI(runtime)

    yield make
    for runtime in started:
        runtime.stop()


@pytest.fixture
def team(start: Start) -> BrokerAPI:
    """A multi-user broker: carol is the admin; the server's owner is someone else."""
    return start(
        identity="username",
        owner="root-owner",
        admin_users={"carol"},
        user_groups={"alice": ["lab"], "bob": ["physics"]},
    )
