"""One broker per GPU of the machine, whatever its user or state file: the per-GPU locks
(``c.GPUBroker.gpu_lock_dir`` for a broker running as root, ``user_gpu_lock_dir`` for
others), held by another real process, and attacked by another local user as a root
broker meets one: a second, unprivileged uid in a child process."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from runtime_helpers import make

from jupyter_gpubroker.nvml import seed_for
from jupyter_gpubroker.paths import LOCK_DIR_ENV
from jupyter_gpubroker.statelock import GpuLocks
from jupyter_gpubroker.wire.errors import GpuInUse, StateFileError

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as two users")

NOBODY, STRANGER = 65534, 54321  # another user on the host; one without a passwd entry

HOLD = """
import sys
from pathlib import Path
from jupyter_gpubroker.statelock import GpuLocks
held = GpuLocks(Path(sys.argv[1]), Path(sys.argv[2]))
held.acquire([sys.argv[3]], "http://other:8888/gpubroker/api/v1")
print("held", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def machine() -> Iterator[Path]:
    """A stand-in for ``/run``: every user may look in, and the users' lock directory
    (``/run/lock/gpubroker``'s kind: sticky, world-writable) is there already."""
    top = Path(tempfile.mkdtemp(prefix="gpubroker-machine-"))
    top.chmod(0o755)
    (top / "users").mkdir()
    (top / "users").chmod(0o1777)
    try:
        yield top
    finally:
        shutil.rmtree(top)


def as_user(uid: int, act: Callable[[], Any]) -> Any:
    """``act``'s result in a child that dropped to ``uid`` (no groups, as a login user
    has), or ``{"raised": text}`` of what it raised."""
    with holding_as(uid, act) as result:
        return result


@contextlib.contextmanager
def holding_as(uid: int, act: Callable[[], Any]) -> Iterator[Any]:
    """``as_user``, with the child kept alive (and what it opened, open) until the end of
    the ``with``."""
    results, done = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        os.close(results[0])
        os.close(done[1])
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            try:
                out: Any = act()
            except Exception as e:  # noqa: BLE001 - reported to the parent as text
                out = {"raised": str(e)}
            os.write(results[1], json.dumps(out, default=str).encode() + b"\n")
            os.read(done[0], 1)
        except BaseException:
            code = 1
        os._exit(code)
    os.close(results[1])
    os.close(done[0])
    with os.fdopen(results[0]) as reader:
        try:
            yield json.loads(reader.readline() or "null")
        finally:
            os.close(done[1])
            os.waitpid(pid, 0)


def plant_link(path: Path, target: Path) -> Callable[[], None]:
    return lambda: os.symlink(target, path)


def hold_lock(path: Path, says: dict[str, Any]) -> Callable[[], str]:
    """What a squatter does: create the lock file first, lock it, and lie in it."""

    def act() -> str:
        import fcntl

        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, json.dumps(says).encode())
        return "held"

    return act


def victim(machine: Path) -> Path:
    """A file only root may write, which a clobbering broker would empty or chmod."""
    secret = machine / "shadow"
    secret.write_text("root:secret\n")
    secret.chmod(0o600)
    return secret


@as_root
def test_a_broker_refuses_a_gpu_another_process_manages_until_that_process_dies(
    tmp_path: Path, machine: Path
) -> None:
    locks = machine / "gpubroker"
    rt = make(tmp_path, gpu_lock_dir=str(locks), user_gpu_lock_dir=str(machine / "users"))
    first, second = (g.uuid for g in _inventory(tmp_path))
    other = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(locks), str(machine / "users"), second],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert other.stdout is not None and other.stdout.readline() == b"held\n"
        with pytest.raises(GpuInUse) as refused:
            rt.start()
        assert refused.value.message.startswith(
            f"GPU {second} is already managed by another GPU broker (pid {other.pid} of user "
            f"root on {socket.gethostname()}, serving http://other:8888/gpubroker/api/v1): "
            "brokers that share a machine grant the same GPUs twice; run one broker for "
            "everyone as the JupyterHub service"
        )
        mine = GpuLocks(locks, machine / "users")
        mine.acquire([first])  # the refused broker kept none of the GPUs it had locked
        mine.release()
    finally:
        other.send_signal(signal.SIGKILL)  # no clean-up runs: the lock dies with it
        other.wait()
    try:
        assert rt.start().inventory.gpus
    finally:
        rt.stop()
    # root's locks are root's alone: nobody else may create, link, open or lock them
    assert stat.S_IMODE(locks.stat().st_mode) == 0o755
    assert stat.S_IMODE((locks / f"{first}.lock").stat().st_mode) == 0o600


@as_root
def test_a_root_broker_never_follows_a_link_planted_where_it_locks(
    tmp_path: Path, machine: Path
) -> None:
    """The old layout: root's broker in the world-writable directory every user shares.
    Another user plants ``<uuid>.lock -> a root file``; the broker must not empty or
    chmod the file, and says what it found."""
    shared, secret = machine / "users", victim(machine)
    uuid = _inventory(tmp_path)[0].uuid
    as_user(NOBODY, plant_link(shared / f"{uuid}.lock", secret))
    rt = make(tmp_path, gpu_lock_dir=str(shared), user_gpu_lock_dir=str(shared))
    with pytest.raises(GpuInUse) as refused:
        rt.start()
    assert refused.value.message == (
        f"{shared} cannot hold the GPU locks of a broker running as root: other users may "
        "write in it; remove it (the broker makes it again, writable by root only), or set "
        "c.GPUBroker.gpu_lock_dir (or $GPUBROKER_LOCK_DIR) to a directory only root can write"
    )
    # and in its own directory a link found there (an admin's, an old attack's) is refused
    own = machine / "gpubroker"
    own.mkdir(mode=0o755)
    (own / f"{uuid}.lock").symlink_to(secret)
    rt = make(tmp_path, gpu_lock_dir=str(own), user_gpu_lock_dir=str(shared))
    with pytest.raises(GpuInUse) as refused:
        rt.start()
    assert refused.value.message.startswith(
        f"{own / (uuid + '.lock')} is not a lock file this broker trusts: found a symbolic "
        f"link at {own / (uuid + '.lock')}, not a file; the broker leaves it alone"
    )
    assert secret.read_text() == "root:secret\n"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600


@as_root
def test_no_user_can_keep_a_root_broker_from_starting_nor_lie_about_who_holds_a_gpu(
    tmp_path: Path, machine: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shared, secret = machine / "users", victim(machine)
    gpus = [g.uuid for g in _inventory(tmp_path)]
    lie = {"pid": 1, "host": "login-node", "url": "http://evil.example/"}
    as_user(NOBODY, plant_link(shared / f"{gpus[1]}.lock", secret))
    with holding_as(NOBODY, hold_lock(shared / f"{gpus[0]}.lock", lie)) as squatting:
        assert squatting == "held"
        # an ordinary user's broker is told the truth: who holds it, by the kernel's word
        refused = as_user(STRANGER, lambda: GpuLocks(machine / "gpubroker", shared).acquire(gpus))
        assert refused["raised"].startswith(
            f"GPU {gpus[0]} is already managed by another GPU broker (pid "
        )
        assert "of user nobody)" in refused["raised"] and "evil" not in refused["raised"]
        # root's broker starts all the same, in its own directory, and names the squatter
        rt = make(tmp_path, gpu_lock_dir=str(machine / "gpubroker"), user_gpu_lock_dir=str(shared))
        with caplog.at_level(logging.WARNING):
            rt.start()
        try:
            assert f"GPU {gpus[0]} is also managed by a broker of user nobody" in caplog.text
            # and now no ordinary user's broker may take its GPUs
            refused = as_user(
                STRANGER, lambda: GpuLocks(machine / "gpubroker", shared).acquire(gpus[1:])
            )
            assert refused["raised"] == (
                f"GPU {gpus[1]} is managed by the GPU broker root runs on this machine (pid "
                f"{os.getpid()}): use that broker (the JupyterHub service) rather than one of "
                "your own"
            )
        finally:
            rt.stop()
    assert secret.read_text() == "root:secret\n"


@as_root
def test_a_root_broker_refuses_a_lock_directory_another_user_made(
    tmp_path: Path, machine: Path
) -> None:
    theirs = machine / "users" / "gpubroker"
    as_user(NOBODY, lambda: theirs.mkdir(mode=0o755))
    rt = make(tmp_path, gpu_lock_dir=str(theirs), user_gpu_lock_dir=str(machine / "users"))
    with pytest.raises(GpuInUse, match="it belongs to user nobody; remove it"):
        rt.start()


@as_root
def test_the_state_file_and_its_journal_are_readable_by_their_owner_only(
    tmp_path: Path, machine: Path, caplog: pytest.LogCaptureFixture
) -> None:
    home = machine / "service"
    home.mkdir(mode=0o755)
    locks = {
        "gpu_lock_dir": str(machine / "gpubroker"),
        "user_gpu_lock_dir": str(machine / "users"),
    }
    rt = make(home, **locks)
    rt.start()
    try:
        for name in ("state.sqlite", "state.sqlite-wal", "state.sqlite.lock"):
            assert stat.S_IMODE((home / name).stat().st_mode) == 0o600, name
        # so another user cannot read the audit log, nor lock the state file
        seen = as_user(NOBODY, (home / "state.sqlite").read_bytes)
        assert "Permission denied" in seen["raised"]
    finally:
        rt.stop()
    (home / "state.sqlite").chmod(0o644)  # as an earlier version left it
    (home / "state.sqlite.lock").chmod(0o644)
    with caplog.at_level(logging.INFO):
        rt = make(home, **locks)
        rt.start()
        rt.stop()
    assert stat.S_IMODE((home / "state.sqlite").stat().st_mode) == 0o600
    assert stat.S_IMODE((home / "state.sqlite.lock").stat().st_mode) == 0o600
    assert (
        f"{home / 'state.sqlite'} was readable by other users; it is now readable only by its owner"
        in caplog.text
    )


@as_root
def test_a_state_file_that_is_a_link_is_refused(tmp_path: Path, machine: Path) -> None:
    secret = victim(machine)
    (tmp_path / "state.sqlite.lock").symlink_to(secret)
    rt = make(tmp_path, gpu_lock_dir=str(machine / "gpubroker"))
    with pytest.raises(StateFileError, match="its lock file is not usable .found a symbolic link"):
        rt.start()
    assert secret.read_text() == "root:secret\n"


def test_simulated_machines_are_their_own_and_keep_their_gpus(tmp_path: Path) -> None:
    """Two simulated brokers on one host (two demos, a demo and a test run) simulate two
    machines: neither holds the other's GPUs. A restart on the same state file finds the
    same GPUs; an explicit seed shares one simulated machine (and its locks)."""
    locks = str(Path(os.environ[LOCK_DIR_ENV]) / "shared")
    one = make(tmp_path / "one", gpu_lock_dir=locks, user_gpu_lock_dir=locks)
    two = make(tmp_path / "two", gpu_lock_dir=locks, user_gpu_lock_dir=locks)
    try:
        mine = {g.uuid for g in one.start().inventory.gpus}
        theirs = {g.uuid for g in two.start().inventory.gpus}
        assert len(mine) == len(theirs) == 2 and not mine & theirs
    finally:
        two.stop()
        one.stop()
    again = make(tmp_path / "one", gpu_lock_dir=locks, user_gpu_lock_dir=locks)
    try:
        assert {g.uuid for g in again.start().inventory.gpus} == mine
        same_machine = make(tmp_path / "three", gpu_lock_dir=locks, user_gpu_lock_dir=locks)
        same_machine.simulate_seed = again.simulate_seed
        with pytest.raises(GpuInUse):
            same_machine.start()
    finally:
        again.stop()


def _inventory(tmp_path: Path):  # type: ignore[no-untyped-def]
    """The GPUs a broker with state under ``tmp_path`` simulates."""
    probe = make(
        tmp_path / "probe",
        gpu_lock_dir=str(tmp_path / "probe-locks"),
        user_gpu_lock_dir=str(tmp_path / "probe-user-locks"),
        simulate_seed=seed_for(str(tmp_path / "state.sqlite")),
    )
    try:
        return probe.start().inventory.gpus
    finally:
        probe.stop()
