"""The broker service's supervisor: a killed service serves again within a second or
two, not at the hub's next poll.

    python -m hub_spawner.supervisor [the service's options]

JupyterHub notices that a managed service died only when it next polls it, every 30 s,
and offers no setting for that. So ``configure`` makes this the service's command: a
small process that runs the service (``hub_spawner.service``, with the same options) as
its one child, and starts a new child at once when it dies.

- It holds the service's listening socket (the port of $JUPYTERHUB_SERVICE_URL) and
  hands it to each child as systemd's socket activation does ($LISTEN_FDS,
  $LISTEN_PID, fd 3). A call made while a new child starts waits in the socket's
  queue, so the hub's proxy answers it a little late instead of with a 503.
- It loads the service's code once and forks each child from itself, as
  ``gunicorn --preload`` does: a restart skips the seconds that importing JupyterHub
  and the broker takes. It starts no thread and runs nothing of that code itself.
- A child killed by a signal (SIGKILL, the OOM killer, a crash) starts again at once.
  One that exits by itself within ``QUICK_S`` of its start cannot start (a wrong
  option): it starts again after a pause that doubles from 1 s to 30 s, the hub's pace.
- SIGTERM or SIGINT (how the hub stops a service) goes to the child; the supervisor
  exits with the child's status once it stopped.
- On Linux the child dies with the supervisor (the parent-death signal), so a killed
  supervisor leaves no broker holding the state file and the port: the hub starts both
  again at its next poll.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import sys
import time
import traceback
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
    """Run ``service()`` in a child forked with ``listener`` (fd ``LISTEN_FD``), again
    whenever it dies, until told to stop."""

    def __init__(self, service: Callable[[], int], listener: socket.socket) -> None:
        self.service, self.listener = service, listener
        self.child: int | None = None
        """The running child's pid."""
        self.stopping: int | None = None
        """The signal that told this process to stop."""
        self._prctl = ctypes.CDLL(None).prctl if sys.platform == "linux" else None

    def run(self) -> int:
        """The child's exit status once a signal stopped it (128 + a signal's number)."""
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        pause = PAUSE_S
        while self.stopping is None:
            started = time.monotonic()
            status = self._run_child()
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

    def _run_child(self) -> int:
        """Fork a child that runs the service; its ``Popen.returncode``-style status."""
        parent = os.getpid()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os._exit(self._in_child(parent))
        self.child = pid
        if self.stopping is not None:  # the signal came while it was starting
            os.kill(pid, self.stopping)
        _, status = os.waitpid(pid, 0)
        self.child = None
        return os.waitstatus_to_exitcode(status)

    def _in_child(self, parent: int) -> int:
        """The child: it dies with the supervisor, takes the socket as its own and runs
        the service; its exit status (it never returns into the supervisor's loop)."""
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the service sets its own
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if self._prctl is not None:
            self._prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the supervisor died before that took effect
            return 1
        os.environ.update(LISTEN_FDS="1", LISTEN_PID=str(os.getpid()))
        try:
            status = self.service()
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        except BaseException:  # noqa: BLE001 - said in the log, as Python would
            traceback.print_exc()
            status = 1
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        return status

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = signum
        if self.child is not None:
            os.kill(self.child, signum)

    def _sleep(self, seconds: float) -> None:
        """Sleep, but wake at once to a signal to stop."""
        until = time.monotonic() + seconds
        while self.stopping is None and time.monotonic() < until:
            time.sleep(0.1)


def _how(status: int) -> str:
    """How a child ended, from its ``Popen.returncode``-style status."""
    if status >= 0:
        return f"exited with status {status}"
    try:
        return f"was killed by {signal.Signals(-status).name}"
    except ValueError:
        return f"was killed by signal {-status}"


def main(argv: list[str] | None = None) -> int:
    """Supervise ``hub_spawner.service`` with ``argv``, its own options."""
    options = sys.argv[1:] if argv is None else argv
    said = logging.StreamHandler()  # this logger's alone: the children log their own way
    said.setFormatter(
        logging.Formatter("[%(levelname)1.1s %(asctime)s gpubroker-supervisor] %(message)s")
    )
    log.addHandler(said)
    log.setLevel(logging.INFO)
    log.propagate = False
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
    from hub_spawner import service  # loaded once, run only in the children

    return Supervisor(lambda: service.main(options), listener).run()


if __name__ == "__main__":
    sys.exit(main())
