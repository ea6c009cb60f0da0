"""Exclusive OS locks (``flock``): one broker per state file, one broker per GPU.

Two brokers writing one SQLite file would each keep their own view of it and
collide on its keys: ``StateLock`` holds ``<state>.lock``. Two brokers on one
machine with different state files (two users' servers under JupyterHub, each
embedding its own) would each believe they own every GPU and grant the same
slice twice: ``GpuLocks`` holds one lock file per GPU UUID in a machine-wide
directory that every user can create files in (sticky, like ``/tmp``).

A lock lives as long as the process holds the file open, so a killed broker never
leaves a stale lock behind; ``flock`` works on a file opened read-only, so a lock
file another user created serves everyone. A lock file says who holds it (pid,
host, API URL) so the second broker can name the first.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from .broker.errors import GpuInUse, StateFileError
from .paths import LOCK_DIR_ENV, STATE_FILE_ENV


class _Held:
    """One lock file, held open (and locked) until ``release``."""

    def __init__(self, f: IO[str]) -> None:
        self._file: IO[str] | None = f

    def release(self) -> None:
        """Give the lock back (the file stays: removing it would let a third process lock a
        new file while a second one waits on the old)."""
        if self._file is not None:
            with contextlib.suppress(OSError):  # read-only: another user's lock file
                self._file.truncate(0)
            self._file.close()
            self._file = None


def _lock(f: IO[str], url: str) -> _Held | str:
    """Lock ``f`` without waiting and say who holds it now; the holder's text when
    another process has it."""
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = _holder_text(f.read())
        f.close()
        return holder
    with contextlib.suppress(OSError):  # opened read-only: it cannot say who holds it
        f.truncate(0)
        f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "url": url}))
        f.flush()
    return _Held(f)


class StateLock:
    """The lock of one state file, taken by ``acquire`` and given back by ``release``."""

    def __init__(self, state_file: Path) -> None:
        self.state_file = state_file
        self.path = state_file.with_name(state_file.name + ".lock")
        self._held: _Held | None = None

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
        held = _lock(f, url)
        if isinstance(held, str):
            raise StateFileError(
                f"{self.state_file}: in use by another GPU broker ({held}); use that "
                "server, stop it, or give this one its own state file with "
                f"c.GPUBroker.state_file or ${STATE_FILE_ENV}"
            )
        self._held = held

    def release(self) -> None:
        if self._held is not None:
            self._held.release()
            self._held = None


class GpuLocks:
    """One lock per GPU of the machine in ``directory``, whatever the state file."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._held: list[_Held] = []

    def acquire(self, gpu_uuids: Iterable[str], url: str = "") -> None:
        """Lock every GPU or none: ``GpuInUse`` names the first one another broker (of
        any user) manages, and its holder."""
        try:
            for uuid in gpu_uuids:
                held = _lock(self._open(self.directory / f"{uuid}.lock"), url)
                if isinstance(held, str):
                    raise GpuInUse(
                        f"GPU {uuid} is already managed by another GPU broker ({held}): "
                        "brokers that share a machine grant the same GPUs twice; run one "
                        "broker for everyone as the JupyterHub service (README, "
                        "'JupyterHub'), or stop the other one"
                    )
                self._held.append(held)
        except BaseException:
            self.release()
            raise

    def _open(self, path: Path) -> IO[str]:
        """The lock file, created readable and writable by every user (anyone may lock a
        file it can read, so writing only lets a holder say who it is); another user's
        file that is not writable is opened read-only."""
        try:
            self._make_directory()
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except PermissionError:
            try:
                return open(path)  # noqa: SIM115 - held open for the process lifetime
            except OSError as e:
                raise self._cannot(path, e) from None
        except OSError as e:
            raise self._cannot(path, e) from None
        with contextlib.suppress(OSError):  # not its owner: its mode is the creator's
            os.fchmod(fd, 0o666)  # past the umask
        return os.fdopen(fd, "r+")

    def _make_directory(self) -> None:
        """The directory, shared by every user: world-writable and sticky (each user
        may remove only their own files), as ``/tmp`` is."""
        if self.directory.is_dir():
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # created meanwhile by another user
            os.chmod(self.directory, 0o777 | stat.S_ISVTX)

    def _cannot(self, path: Path, e: OSError) -> GpuInUse:
        return GpuInUse(
            f"{path}: cannot open this GPU's machine-wide lock file ({e.strerror}); make "
            f"{self.directory} writable by every user and sticky (chmod 1777), or set "
            f"c.GPUBroker.gpu_lock_dir (or ${LOCK_DIR_ENV}) to such a directory"
        )

    def release(self) -> None:
        for held in self._held:
            held.release()
        self._held.clear()


def _holder_text(content: str) -> str:
    """``pid 123 on host h, serving http://...`` from a lock file's content."""
    try:
        holder = json.loads(content)
        text = f"pid {holder['pid']} on {holder['host']}"
    except (ValueError, TypeError, KeyError):
        return "a process that has not said who it is"
    return text + (f", serving {holder['url']}" if holder.get("url") else "")
