"""``jupyter gpubroker``: the broker from a terminal.

``main`` builds only the command it runs, so each command imports what it needs and no
more (``queue`` loads neither the replay nor the NVML backends). Commands that talk to a
broker go through its API (``common.client``); a read without a broker (``status``,
``usage``) opens the state file read-only and never migrates it.
"""

from __future__ import annotations

from .main import main

__all__ = ["main"]
