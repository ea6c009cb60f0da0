"""What ``/proc/<pid>/stat`` says of a process: its state, parent and start time (and
``/proc/<pid>/environ``, its environment at its start).

One reader for every part that asks whether a process still runs (the outside-use check,
the MPS daemons, the simulated driver) or whether a pid is still the process it was (the
device confinement): each used to parse the line itself, and one missed a state.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ENDED = (b"Z", b"X")
"""A zombie (ended, its exit not yet read by its parent) and a dead process: neither runs
nor holds memory."""


@dataclass(frozen=True)
class ProcStat:
    state: bytes
    ppid: int
    start_ticks: int
    """When it started, in clock ticks since boot: a reused pid starts later."""

    @property
    def ended(self) -> bool:
        return self.state in ENDED


def read_small(path: str) -> bytes | None:
    """A small ``/proc`` file, unbuffered (half the cost of ``open``); None once gone."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)


def proc_stat(pid: int) -> ProcStat | None:
    """The process's line, None once it is gone. The command name, in parentheses, may hold
    anything: the fields are read after its last ``)``."""
    data = read_small(f"/proc/{pid}/stat")
    if not data:
        return None
    fields = data.rpartition(b")")[2].split()
    return ProcStat(fields[0], int(fields[1]), int(fields[19]))


def runs(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended."""
    stat = proc_stat(pid)
    return stat is not None and not stat.ended


def proc_environ(pid: int) -> dict[bytes, bytes] | None:
    """The environment the process started with (the first of a name twice), None where it
    cannot be read (gone, or another user's)."""
    try:
        data = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    found: dict[bytes, bytes] = {}
    for entry in data.split(b"\0"):
        name, _, value = entry.partition(b"=")
        found.setdefault(name, value)
    return found
