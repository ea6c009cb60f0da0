"""The broker service's supervisor: a killed service serves again within seconds, not at
the hub's next poll.

    python -m hub_spawner.supervisor python -m hub_spawner.service [its options]

JupyterHub notices that a managed service died only when it next polls it, every 30 s,
and offers no setting for that. So ``configure`` makes this the service's command: a
small process that runs the service as its one child and starts it again at once when
it dies. It holds the service's listening socket (the port of $JUPYTERHUB_SERVICE_URL)
and hands it to each child as systemd's socket activation does ($LISTEN_FDS,
$LISTEN_PID, fd 3). A call made while a new child starts waits in the socket's queue,
so the hub's proxy answers it a little late instead of with a 503.

- A child killed by a signal (SIGKILL, the OOM killer, a crash) starts again at once.
  One that exits by itself within ``QUICK_S`` of its start cannot start (a wrong
  option): it starts again after a pause that doubles from 1 s to 30 s, the hub's pace.
- SIGTERM or SIGINT (how the hub stops a service) goes to the child; the supervisor
  exits with the child's status once it stopped.
- On Linux the child dies with the supervisor (the parent-death signal), so a killed
  supervisor leaves no broker holding the state file and the port: the hub starts both
  again at its next poll.

It imports nothing beyond the standard library: it should never be what crashes.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from types import FrameType
from urllib.parse import urlsplit

LISTEN_FD = 3
"""The first socket systemd passes (``SD_LISTEN_FDS_START``)."""
QUICK_S = 10.0
"""A child that exits by itself sooner than this after its start cannot start: it is
started again after a pause. One killed by a signal is started again at once."""
PAUSE_S, LONGEST_PAUSE_S = 1.0, 30.0
PR_SET_PDEATHSIG = 1  # linux/prctl.h

log = logging.getLogger("gpubroker.supervisor")


def passed_socket() -> socket.socket | None:
    """The listening socket handed to this process by socket activation (a systemd
    ``.socket`` unit, or the supervisor), else ``None``. Its variables are removed, so
    the service's own children never take the socket for theirs."""
    fds, pid = os.environ.pop("LISTEN_FDS", None), os.environ.pop("LISTEN_PID", None)
    os.environ.pop("LISTEN_FDNAMES", None)
    if fds is None or pid != str(os.getpid()):
        return None
    if fds != "1":
        raise ValueError(
            f"{fds} sockets were passed to the service ($LISTEN_FDS), which listens on one: "
            "give its socket unit one ListenStream="
        )
    listener = socket.socket(fileno=LISTEN_FD)
    listener.setblocking(False)
    return listener


def listen(url: str) -> socket.socket:
    """A listening socket at ``url``'s host and port, as fd ``LISTEN_FD``."""
    where = urlsplit(url)
    host, port = where.hostname or "127.0.0.1", where.port or 80
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    listener = socket.create_server((host, port), family=family, backlog=socket.SOMAXCONN)
    if listener.fileno() != LISTEN_FD:  # the first file this process opens: seldom not 3
        os.dup2(listener.fileno(), LISTEN_FD, inheritable=False)
        listener.close()
        listener = socket.socket(fileno=LISTEN_FD)
    return listener


class Supervisor:
    """Run ``command`` with ``listener`` (fd ``LISTEN_FD``), again whenever it dies,
    until told to stop."""

    def __init__(self, command: list[str], listener: socket.socket) -> None:
        self.command, self.listener = command, listener
        self.child: subprocess.Popen[bytes] | None = None
        self.stopping: int | None = None
        """The signal that told this process to stop."""
        self._prctl = ctypes.CDLL(None).prctl if sys.platform == "linux" else None

    def run(self) -> int:
        """The child's exit status once a signal stopped it (128 + a signal's number)."""
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        os.environ["LISTEN_FDS"] = "1"
        pause = PAUSE_S
        while self.stopping is None:
            started = time.monotonic()
            self.child = subprocess.Popen(
                self.command, pass_fds=(LISTEN_FD,), preexec_fn=self._in_child(os.getpid())
            )
            if self.stopping is not None:  # the signal came while it was starting
                self.child.send_signal(self.stopping)
            status = self.child.wait()
            if self.stopping is not None:
                return status if status >= 0 else 128 - status
            if status < 0 or time.monotonic() - started >= QUICK_S:
                pause = PAUSE_S
                log.error("The GPU broker service %s; starting it again now", _how(status))
                continue
            log.error(
                "The GPU broker service %s %.0f s after its start; starting it again in %g s",
                _how(status),
                time.monotonic() - started,
                pause,
            )
            self._sleep(pause)
            pause = min(2 * pause, LONGEST_PAUSE_S)
        return 0

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = signum
        if self.child is not None and self.child.returncode is None:
            os.kill(self.child.pid, signum)

    def _sleep(self, seconds: float) -> None:
        """Sleep, but wake at once to a signal to stop."""
        until = time.monotonic() + seconds
        while self.stopping is None and time.monotonic() < until:
            time.sleep(0.1)

    def _in_child(self, parent: int) -> Callable[[], None]:
        """What the child does before it becomes the service: take the socket as its
        own ($LISTEN_PID), and die with the supervisor."""
        prctl = self._prctl

        def in_child() -> None:
            os.environ["LISTEN_PID"] = str(os.getpid())  # the exec'd service reads it
            if prctl is not None:
                prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != parent:  # the supervisor died before that took effect
                os._exit(1)

        return in_child


def _how(status: int) -> str:
    """How a child ended, from its ``Popen.returncode``."""
    if status >= 0:
        return f"exited with status {status}"
    try:
        return f"was killed by {signal.Signals(-status).name}"
    except ValueError:
        return f"was killed by signal {-status}"


def main(argv: list[str] | None = None) -> int:
    command = sys.argv[1:] if argv is None else argv
    logging.basicConfig(
        level=logging.INFO, format="[%(levelname)1.1s %(asctime)s gpubroker-supervisor] %(message)s"
    )
    if not command:
        log.critical("Usage: python -m hub_spawner.supervisor COMMAND [ARGS]: the service to run")
        return 2
    url = os.environ.get("JUPYTERHUB_SERVICE_URL")
    if not url:
        log.critical(
            "$JUPYTERHUB_SERVICE_URL is not set: the supervisor is started by JupyterHub, as "
            "the command of a service in c.JupyterHub.services with a url (see docs/hub.md)"
        )
        return 1
    try:
        listener = listen(url)
    except OSError as e:
        log.critical("Cannot listen at %s: %s", url, e.strerror or e)
        return 1
    return Supervisor(command, listener).run()


if __name__ == "__main__":
    sys.exit(main())
