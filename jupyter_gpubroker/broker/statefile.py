"""Why a state file cannot be used, in words a person acts on: SQLite's error code tells a
file that is no database, or a damaged one (which only a backup mends), from one this user
may not open (its permissions mend it), and a full disk from the rest."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from ..wire.errors import StateFileError

DAMAGED = {
    "SQLITE_NOTADB": "not a SQLite database",
    "SQLITE_CORRUPT": "the database in it is damaged (cut short or overwritten)",
}
"""SQLite's error codes for a file it cannot read as a database, and the cause in words."""
RESTORE = "restore it from a backup, or move it aside (the broker then starts with an empty state)"
DENIED = ("SQLITE_PERM", "SQLITE_READONLY", "SQLITE_AUTH")
"""SQLite's error codes for a file this user may not open as the broker does."""


def unusable(path: str, read_only: bool, e: Exception) -> StateFileError:
    """The one-sentence error for a state file that cannot be opened: its name, the
    cause and what to do. SQLite's error code tells a file that is no database, or a
    damaged one (cut short, overwritten), which only a backup mends, from one this
    user may not open, which its permissions mend."""
    if isinstance(e, StateFileError):
        return e
    text = getattr(e, "strerror", None) or str(e)
    access = "read" if read_only else "read and write"
    code = error_name(e)
    if code in DAMAGED:
        cause, todo = DAMAGED[code], RESTORE
    elif code in DENIED or isinstance(e, PermissionError) or not permitted(path, read_only):
        cause = "permission denied"
        todo = f"give this user {access} access to it and to its directory"
    else:
        cause = f"cannot be opened ({text})"
        todo = f"check that it is a file (not a directory) this user can {access}"
    return StateFileError(
        f"{path}: {cause}; {todo}, or set c.GPUBroker.state_file (or $GPUBROKER_STATE) "
        "to another file"
    )


SAID = {
    "SQLITE_NOTADB": "file is not a database",
    "SQLITE_CORRUPT": "database disk image is malformed",
    "SQLITE_READONLY": "attempt to write a readonly database",
    "SQLITE_PERM": "access permission denied",
    "SQLITE_AUTH": "authorization denied",
}
"""SQLite's own words for those codes (``sqlite3_errstr``), for Python 3.10, whose errors
carry no code."""


def error_name(e: Exception) -> str:
    """SQLite's name for the error (``SQLITE_NOTADB``, ...; "" when it is none of SQLite's)."""
    name = getattr(e, "sqlite_errorname", None)  # Python >= 3.11
    if name is not None:
        return str(name)
    if isinstance(e, sqlite3.Error):
        text = str(e)
        return next((code for code, words in SAID.items() if text.startswith(words)), "")
    return ""


def permitted(path_name: str, read_only: bool) -> bool:
    """May this user open the file (and, to write it, its directory) as the broker
    does? SQLite says only "unable to open" when it may not."""
    path = Path(path_name)
    mode = os.R_OK if read_only else os.R_OK | os.W_OK
    folder = path.parent if path.parent.is_dir() else None
    return (not path.exists() or os.access(path, mode)) and (
        read_only or folder is None or os.access(folder, os.W_OK | os.X_OK)
    )


def out_of_storage(e: sqlite3.OperationalError) -> bool:
    """SQLITE_FULL (a full disk, or the file at its page limit) or SQLITE_IOERR."""
    code = getattr(e, "sqlite_errorcode", None)  # Python >= 3.11
    if code is not None:
        return code & 0xFF in (13, 10)
    return str(e).startswith(("database or disk is full", "disk I/O error"))
