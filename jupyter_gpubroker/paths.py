"""Where the broker keeps its state by default."""

from __future__ import annotations

from pathlib import Path

from jupyter_core.paths import jupyter_data_dir

STATE_FILE_ENV = "GPUBROKER_STATE"


def default_state_path() -> Path:
    """``<jupyter data dir>/gpubroker/state.sqlite``: survives restarts, one per user."""
    return Path(jupyter_data_dir()) / "gpubroker" / "state.sqlite"


LOCK_DIR_ENV = "GPUBROKER_LOCK_DIR"
USER_LOCK_DIR_ENV = "GPUBROKER_USER_LOCK_DIR"


def default_lock_dir() -> Path:
    """Where a broker running as root locks its GPUs: ``/run/gpubroker``, in a directory
    only root can create things in, so no other user can make it first."""
    return Path("/run/gpubroker")


def default_user_lock_dir() -> Path:
    """Where brokers of ordinary users lock GPUs among themselves: ``/run/lock/gpubroker``
    (``/run/lock`` is shared by every user, and not private to a systemd service as its
    ``/tmp`` may be), else ``/tmp/gpubroker-locks``."""
    run_lock = Path("/run/lock")
    return run_lock / "gpubroker" if run_lock.is_dir() else Path("/tmp/gpubroker-locks")
