"""A simulated MPS control daemon and MPS client, for hosts without a GPU.

Run as a program it behaves as ``nvidia-cuda-mps-control`` does for the commands the
broker uses (NVIDIA's MPS documentation, "Tools and Interface Reference" and "Legacy
MPS v2 Interface"; each behaviour followed is listed in ``docs/sharing.md``):

- ``-d`` starts the daemon in the background, ``-f`` in the foreground; it keeps its
  pipes in ``$CUDA_MPS_PIPE_DIRECTORY`` (default ``/tmp/nvidia-mps``), writes its pid to
  ``nvidia-cuda-mps-control.pid`` there and logs to ``control.log`` in
  ``$CUDA_MPS_LOG_DIRECTORY`` (default ``/var/log/nvidia-mps``);
- without them it is the front end: it reads commands from its standard input, one a
  line, hands each to the daemon of the pipe directory and prints the answer
  (``echo quit | nvidia-cuda-mps-control`` stops the daemon);
- commands: ``set_default_device_pinned_mem_limit <dev> <value>``,
  ``get_default_device_pinned_mem_limit <dev>``,
  ``set_default_active_thread_percentage <percent>``,
  ``get_default_active_thread_percentage``, ``get_server_list``, ``quit``.

:func:`cuda_malloc` is a simulated MPS client's allocation, for a kernel's code: under a
running daemon, a client is held to the lower of its own
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` and the daemon's default; an allocation past it
fails as CUDA's does (``cudaErrorMemoryAllocation``, "out of memory") and the process
keeps running; with no daemon answering, the client runs without MPS, unlimited.
"""

from __future__ import annotations

import os
import re
import socket
import socketserver
import sys
import threading
import time
from pathlib import Path

from ..procstat import proc_environ

PID_FILE = "nvidia-cuda-mps-control.pid"
SOCKET = "control"
DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"
DEFAULT_LOG_DIR = "/var/log/nvidia-mps"
_VALUE = re.compile(r"(\d+(?:\.\d+)?)([KMG]?)B?", re.IGNORECASE)
_UNIT = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def pipe_dir() -> Path:
    return Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE_DIR)


def log_dir() -> Path:
    return Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY") or DEFAULT_LOG_DIR)


def parse_bytes(value: str) -> int | None:
    """A memory limit as MPS writes it ("2G", "512M", "8192MB"), in bytes."""
    m = _VALUE.fullmatch(value.strip())
    return None if m is None else int(float(m[1]) * _UNIT[m[2].upper()])


def client_limits(env: str) -> dict[int, int]:
    """``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` ("0=1G,1=512M") as device -> bytes."""
    limits: dict[int, int] = {}
    for part in filter(None, (p.strip() for p in env.split(","))):
        dev, _, value = part.partition("=")
        size = parse_bytes(value)
        if dev.strip().isdigit() and size is not None:
            limits[int(dev)] = size
    return limits


class _Daemon(socketserver.UnixStreamServer):
    def __init__(self, path: Path) -> None:
        super().__init__(str(path), _Command)
        self.limits: dict[int, int] = {}
        self.threads = 100
        self.log = (log_dir() / "control.log").open("a", buffering=1)

    def say(self, text: str) -> None:
        self.log.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {text}\n")


class _Command(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        daemon = self.server
        assert isinstance(daemon, _Daemon)
        line = self.rfile.readline().decode().strip()
        daemon.say(f"CMD: {line}")
        answer, stop = _answer(daemon, line.split())
        self.wfile.write(answer.encode())
        if stop:
            daemon.say("Control daemon exited")
            threading.Thread(target=daemon.shutdown).start()


def _answer(daemon: _Daemon, words: list[str]) -> tuple[str, bool]:
    """What the daemon answers a command, and whether it stops."""
    cmd, args = (words[0], words[1:]) if words else ("", [])
    if cmd == "quit":
        return "", True
    if cmd == "get_server_list":
        return "", False  # the simulated clients need no server process
    if cmd == "set_default_device_pinned_mem_limit" and len(args) == 2 and args[0].isdigit():
        size = parse_bytes(args[1])
        if size is not None:
            daemon.limits[int(args[0])] = size
            return "", False
    if cmd == "get_default_device_pinned_mem_limit" and len(args) == 1 and args[0].isdigit():
        size = daemon.limits.get(int(args[0]))
        return ("0" if size is None else f"{size >> 20}M") + "\n", False
    percent = args[0] if len(args) == 1 and args[0].isdigit() else ""
    if cmd == "set_default_active_thread_percentage" and percent and 1 <= int(percent) <= 100:
        daemon.threads = int(percent)
        return f"{daemon.threads}.0\n", False
    if cmd == "get_default_active_thread_percentage" and not args:
        return f"{daemon.threads}.0\n", False
    return f"Invalid command: {' '.join(words)}\n", False


def ask(command: str, pipes: Path | None = None, timeout: float = 5.0) -> str | None:
    """One command to the daemon of ``pipes`` (default: the environment's); None when no
    daemon answers there."""
    path = (pipes or pipe_dir()) / SOCKET
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(path))
            s.sendall(command.strip().encode() + b"\n")
            s.shutdown(socket.SHUT_WR)
            chunks = []
            while chunk := s.recv(4096):
                chunks.append(chunk)
            return b"".join(chunks).decode()
    except OSError:
        return None


def _serve(background: bool) -> int:
    pipes, logs = pipe_dir(), log_dir()
    pipes.mkdir(parents=True, exist_ok=True, mode=0o700)
    logs.mkdir(parents=True, exist_ok=True, mode=0o700)
    if ask("get_server_list", pipes, timeout=1.0) is not None:
        print("An instance of this daemon is already running", file=sys.stderr)
        return 1
    (pipes / SOCKET).unlink(missing_ok=True)
    if background and os.fork() > 0:
        return 0
    if background:
        os.setsid()
        if os.fork() > 0:
            os._exit(0)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
    daemon = _Daemon(pipes / SOCKET)
    (pipes / PID_FILE).write_text(f"{os.getpid()}\n")
    daemon.say("Control daemon started")
    try:
        daemon.serve_forever(poll_interval=0.1)
    finally:
        (pipes / SOCKET).unlink(missing_ok=True)
        (pipes / PID_FILE).unlink(missing_ok=True)
    if background:
        os._exit(0)
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] in (["-d"], ["-f"]):
        return _serve(background=argv[0] == "-d")
    for line in sys.stdin:
        if not line.strip():
            continue
        answer = ask(line)
        if answer is None:
            print("Cannot find MPS control daemon process", file=sys.stderr)
            return 1
        sys.stdout.write(answer)
    return 0


# ---------------------------------------------------------------- a simulated client


class OutOfMemory(RuntimeError):
    """What a CUDA allocation past the client's limit raises (``cudaErrorMemoryAllocation``)."""

    code = 2


_allocated = 0


def cuda_malloc(mib: int) -> int:
    """Allocate ``mib`` of device memory as a simulated MPS client of device 0; the
    process's total. Past its limit: ``OutOfMemory``, and nothing is allocated."""
    global _allocated
    limit = client_limits(os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "")).get(0)
    default = ask("get_default_device_pinned_mem_limit 0")
    if default is None:
        limit = None  # no daemon: CUDA runs without MPS, and nothing limits it
    elif (server := parse_bytes(default)) and (limit is None or server < limit):
        limit = server
    if limit is not None and (_allocated + mib) << 20 > limit:
        raise OutOfMemory("CUDA error: out of memory")
    _allocated += mib
    return _allocated


def mps_client(pid: int) -> bool:
    """Whether CUDA in process ``pid`` runs as an MPS client: a daemon answers at the pipe
    directory its environment names (a process that changed it runs without MPS)."""
    environ = proc_environ(pid)
    if environ is None:
        return False
    found = environ.get(b"CUDA_MPS_PIPE_DIRECTORY")
    pipes = Path(os.fsdecode(found)) if found else Path(DEFAULT_PIPE_DIR)
    return ask("get_server_list", pipes, timeout=1.0) is not None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
