"""Where the broker keeps its state by default."""

from __future__ import annotations

from pathlib import Path

from jupyter_core.paths import jupyter_data_dir

STATE_FILE_ENV = "GPUBROKER_STATE"


def default_state_path() -> Path:
    """``<jupyter data dir>/gpubroker/state.sqlite``: survives restarts, one per user."""
    return Path(jupyter_data_dir()) / "gpubroker" / "state.sqlite"
