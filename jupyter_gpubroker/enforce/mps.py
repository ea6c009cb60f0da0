"""The MPS control daemons the broker runs: one per shared GPU and user.

An MPS control daemon serves one user's MPS server at a time: a client of another uid
waits until the running server's clients are done (``nvidia-cuda-mps-control(1)``). So
two users sharing a GPU need a daemon each, with pipe and log directories of their own
(``CUDA_MPS_PIPE_DIRECTORY``, ``CUDA_MPS_LOG_DIRECTORY``: NVIDIA advises one per user),
started with ``CUDA_VISIBLE_DEVICES`` naming the GPU by UUID, and the GPU left in the
default compute mode (exclusive-process admits one process, so one server). Each daemon
runs as its user (a root broker starts it so), its default pinned-memory limit the
largest of the user's shares on that GPU and each kernel's own limit in its environment
(``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``, ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``).
:class:`MpsDaemons` starts them when a share is granted, restarts one that died while
shares hold it, and stops and removes each once its last share ends.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..procstat import runs

PID_FILE = "nvidia-cuda-mps-control.pid"
START_S = 10.0
"""How long a daemon has to write its pid file."""


@dataclass
class Daemon:
    """One user's control daemon for one GPU."""

    gpu: str
    user: str
    home: Path
    """Its directory: ``pipe`` and ``log`` inside."""
    uid: int | None
    """The account it runs as (None: the broker's own)."""
    pid: int | None = None
    limit_mib: int = 0
    threads: int | None = None

    @property
    def env(self) -> dict[str, str]:
        """What its clients (and its front end) need in their environment."""
        return {
            "CUDA_MPS_PIPE_DIRECTORY": str(self.home / "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": str(self.home / "log"),
        }

    @property
    def run_as(self) -> int | None:
        """The account its programs run as where that is not the broker's (a root
        broker's daemons run as their users)."""
        return None if self.uid is None or self.uid == os.geteuid() else self.uid

    def alive(self) -> bool:
        """Whether its process runs (one that exited and awaits its reaping does not)."""
        return self.pid is not None and runs(self.pid)


class MpsError(RuntimeError):
    """A daemon that would not start or answer, said in one sentence."""


class MpsDaemons:
    """The daemons of this broker, under ``root`` (a directory only the broker writes)."""

    def __init__(
        self,
        control: Sequence[str],
        root: Path,
        uid_of: Callable[[str], int | None],
        log: logging.Logger | None = None,
    ) -> None:
        """``control``: the control program (``nvidia-cuda-mps-control``, or the
        simulated one); ``uid_of``: the account a user's daemon runs as (None: the
        broker's own)."""
        self.control, self.root, self.uid_of = list(control), root, uid_of
        self.log = log or logging.getLogger(__name__)
        self.daemons: dict[tuple[str, str], Daemon] = {}

    def ensure(self, gpu: str, user: str, limit_mib: int, threads: int | None) -> Daemon:
        """The running daemon of ``user`` on ``gpu``, started if need be, its default
        limit raised to ``limit_mib`` if that is larger (never lowered under a live
        client) and its thread percentage set to ``threads`` (None: left as it is)."""
        d = self.daemons.get((gpu, user))
        if d is None or not d.alive():
            d = self._start(gpu, user)
        if limit_mib > d.limit_mib:
            self.command(d, f"set_default_device_pinned_mem_limit 0 {limit_mib}M")
            d.limit_mib = limit_mib
        if threads is not None and threads != d.threads:
            self.command(d, f"set_default_active_thread_percentage {threads}")
            d.threads = threads
        return d

    def stop(self, gpu: str, user: str) -> None:
        """Quit the daemon and remove its directories."""
        d = self.daemons.pop((gpu, user), None)
        if d is None:
            return
        try:
            self.command(d, "quit")
            deadline = time.monotonic() + START_S
        except MpsError:  # it does not answer (its pipes were removed): end it
            deadline = time.monotonic()
        while d.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if d.alive() and d.pid is not None:
            self.log.warning(
                "GPU broker: the MPS daemon %d of %s did not quit: ending it", d.pid, user
            )
            with contextlib.suppress(OSError):
                os.kill(d.pid, signal.SIGTERM)
        shutil.rmtree(d.home, ignore_errors=True)

    def check(self) -> list[Daemon]:
        """Start again each daemon that died; the ones restarted."""
        again = []
        for (gpu, user), d in list(self.daemons.items()):
            if not d.alive():
                self.log.warning(
                    "GPU broker: the MPS daemon of %s on %s stopped: restarting it", user, gpu
                )
                limit, threads = d.limit_mib, d.threads
                again.append(self.ensure(gpu, user, limit, threads))
        return again

    def close(self) -> None:
        for gpu, user in list(self.daemons):
            self.stop(gpu, user)

    def command(self, d: Daemon, text: str) -> str:
        """One command through the control program's front end; its answer."""
        try:
            done = subprocess.run(
                self.control,
                input=text + "\n",
                env=self._env(d),
                capture_output=True,
                text=True,
                timeout=START_S,
                **_as(d),
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise MpsError(f"the MPS control daemon of {d.user} did not answer ({e})") from None
        if done.returncode:
            raise MpsError(
                f"the MPS control daemon of {d.user} refused {text!r}: {done.stderr.strip()}"
            )
        return str(done.stdout)

    # -- internals

    def _start(self, gpu: str, user: str) -> Daemon:
        name = "g" + hashlib.sha256(f"{gpu}/{user}".encode()).hexdigest()[:12]
        uid = self.uid_of(user)
        d = Daemon(gpu, user, self.root / name, uid)
        self.root.parent.mkdir(parents=True, exist_ok=True)
        _private_dir(self.root, None)
        shutil.rmtree(d.home, ignore_errors=True)  # a daemon of an earlier run, gone
        for sub in (d.home, d.home / "pipe", d.home / "log"):
            _private_dir(sub, uid)
        try:
            subprocess.run(
                [*self.control, "-d"],
                env=self._env(d),
                capture_output=True,
                timeout=START_S,
                check=True,
                **_as(d),
            )
        except (OSError, subprocess.SubprocessError) as e:
            raise MpsError(
                f"the MPS control daemon of {user} on {gpu} did not start ({e})"
            ) from None
        pid_file = d.home / "pipe" / PID_FILE
        deadline = time.monotonic() + START_S
        while d.pid is None and time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                d.pid = int(pid_file.read_text())
            if d.pid is None:
                time.sleep(0.05)
        if d.pid is None:
            raise MpsError(f"the MPS control daemon of {user} on {gpu} wrote no pid file")
        self.log.info("GPU broker: MPS control daemon %d of %s on %s", d.pid, user, gpu)
        self.daemons[gpu, user] = d
        return d

    def _env(self, d: Daemon) -> dict[str, str]:
        keep = {k: os.environ[k] for k in ("PATH", "LANG", "PYTHONPATH") if k in os.environ}
        return {**keep, **d.env, "CUDA_VISIBLE_DEVICES": d.gpu}


def _as(d: Daemon) -> dict[str, Any]:
    """``subprocess.run``'s arguments that run a program as the daemon's account, with
    that account's group and none of the broker's other groups."""
    if d.run_as is None:
        return {}
    return {"user": d.run_as, "group": _gid(d.run_as), "extra_groups": []}


def _gid(uid: int) -> int:
    import pwd

    return pwd.getpwuid(uid).pw_gid


def _private_dir(path: Path, uid: int | None) -> None:
    """``path`` a directory of the broker's (``uid``'s where given) that nobody else may
    write: made so, or refused when something else is there (a link, another's)."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    st = path.lstat()
    owner = os.geteuid() if uid is None else uid
    if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (owner, os.geteuid()):
        raise MpsError(f"{path} is not a directory of the broker's: it will not be used")
    if st.st_mode & 0o022:
        raise MpsError(f"{path} may be written by others: it will not be used")
    if uid is not None and st.st_uid != uid and os.geteuid() == 0:
        os.chown(path, uid, _gid(uid), follow_symlinks=False)
