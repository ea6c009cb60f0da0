"""A GPUBroker configured as an admin would, on a simulated workstation, for the runtime tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from traitlets.config import Config

from jupyter_gpubroker.runtime import GPUBroker


def make(tmp_path: Path, **traits: Any) -> GPUBroker:
    """``c.GPUBroker`` with ``traits`` on ``workstation-a100``, state under ``tmp_path``."""
    c = Config()
    c.GPUBroker.simulate = "workstation-a100"
    c.GPUBroker.state_file = str(tmp_path / "state.sqlite")
    for k, v in traits.items():
        setattr(c.GPUBroker, k, v)
    return GPUBroker(config=c)
