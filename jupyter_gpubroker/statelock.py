"""One broker per state file: an exclusive OS lock on ``<state>.lock``.

Two brokers writing one SQLite file would each keep their own view of it and
collide on its keys. The lock (``flock``) lives as long as the process holds the
file open, so a killed broker never leaves a stale lock behind. The lock file
says who holds it (pid, host, API URL) so the second broker can name the first.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from pathlib import Path
from typing import IO

from .broker.errors import StateFileError
from .paths import STATE_FILE_ENV


class StateLock:
    """The lock of one state file, taken by ``acquire`` and given back by ``release``."""

    def __init__(self, state_file: Path) -> None:
        self.state_file = state_file
        self.path = state_file.with_name(state_file.name + ".lock")
        self._file: IO[str] | None = None

    def acquire(self, url: str = "") -> None:
        """Take the lock without waiting; ``StateFileError`` names the holder if another
        process has it."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            f = open(self.path, "a+")  # noqa: SIM115 - held open for the process lifetime
        except OSError as e:
            raise StateFileError(
                f"{self.state_file}: cannot create its lock file {self.path} ({e.strerror}); "
                "give this user write access to the directory, or set c.GPUBroker.state_file "
                f"(or ${STATE_FILE_ENV}) to another file"
            ) from None
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = _holder_text(f.read())
            f.close()
            raise StateFileError(
                f"{self.state_file}: in use by another GPU broker ({holder}); use that "
                "server, stop it, or give this one its own state file with "
                f"c.GPUBroker.state_file or ${STATE_FILE_ENV}"
            ) from None
        f.truncate(0)
        f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "url": url}))
        f.flush()
        self._file = f

    def release(self) -> None:
        """Give the lock back (the file stays: removing it would let a third process lock a
        new file while a second one waits on the old)."""
        if self._file is not None:
            self._file.truncate(0)
            self._file.close()
            self._file = None


def _holder_text(content: str) -> str:
    """``pid 123 on host h, serving http://...`` from a lock file's content."""
    try:
        holder = json.loads(content)
        text = f"pid {holder['pid']} on {holder['host']}"
    except (ValueError, TypeError, KeyError):
        return "a process that has not said who it is yet"
    return text + (f", serving {holder['url']}" if holder.get("url") else "")
