"""Exclusive OS locks (``flock``): one broker per state file, one broker per GPU.

Two brokers writing one SQLite file would each keep their own view of it and
collide on its keys: ``StateLock`` holds ``<state>.lock``. Two brokers on one
machine with different state files (two users' servers under JupyterHub, each
embedding its own) would each believe they own every GPU and grant the same
slice twice: ``GpuLocks`` holds one lock file per GPU UUID in a machine-wide
directory.

A lock lives as long as the process holds the file open, so a killed broker never
leaves a stale lock behind.

What the broker trusts, since other local users may be hostile and the broker may
run as root (the JupyterHub service usually does):

- It never follows a link and never opens anything but a regular file with one
  name; it writes, truncates or chmods only files its own user owns.
- Who holds a lock is read from the kernel (``/proc/locks`` gives the pid, the pid's
  owner gives the user), never from a file another user could have written; a lock
  file's own words (host, URL) are shown only when its owner is the holder.
- A broker running as root locks its GPUs in a directory only root can write
  (``gpu_lock_dir``, ``/run/gpubroker``): nobody else can create, link or lock a file
  there, so no other user can keep it from starting. Brokers of ordinary users share
  a sticky, world-writable directory (``user_gpu_lock_dir``) among themselves, and
  each first looks whether root's broker holds the GPU.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import pwd
import socket
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .paths import LOCK_DIR_ENV, STATE_FILE_ENV, USER_LOCK_DIR_ENV
from .wire.errors import GpuInUse, StateFileError

PRIVATE = 0o600
"""The mode of the state file, its journals and its lock: usage, the audit log and token
hashes are nobody else's business, and a file another user can read is one they can
``flock`` (and so keep the broker from starting)."""


class Refused(OSError):
    """A path that is not a lock file this broker may use; the message says what is there."""


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def open_regular(path: Path, flags: int, mode: int = PRIVATE) -> int:
    """``path`` opened with ``flags`` without following a link, checked to be a regular
    file with this one name; ``Refused`` says what was found instead."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise Refused(e.errno, f"found a symbolic link at {path}, not a file") from None
        raise
    st = os.fstat(fd)
    found = None
    if not stat.S_ISREG(st.st_mode):
        found = f"found something that is not a plain file at {path}"
    elif st.st_nlink != 1:
        found = f"found a file with {st.st_nlink} names (hard links) at {path}"
    if found:
        os.close(fd)
        raise Refused(errno.EPERM, found)
    return fd


def _own(fd: int) -> bool:
    return os.fstat(fd).st_uid == os.geteuid()


def _holder_pid(st: os.stat_result) -> int | None:
    """The pid holding a ``flock`` on the file of ``st``, as the kernel lists it."""
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    with contextlib.suppress(OSError), open("/proc/locks") as locks:
        for line in locks:
            fields = line.split()
            if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == key:
                return int(fields[4]) or None  # 0: a pid of another pid namespace
    return None


@dataclass(frozen=True)
class Holder:
    """Who holds a lock, in facts the broker can trust."""

    pid: int | None
    uid: int | None
    says: dict[str, str]
    """The lock file's own words (host, URL), kept only when the holder wrote them and is
    this broker's own user or root: another user's words could point anywhere."""

    @classmethod
    def of(cls, fd: int) -> Holder:
        st = os.fstat(fd)
        pid = _holder_pid(st)
        uid = None
        if pid is not None:
            with contextlib.suppress(OSError):
                uid = os.stat(f"/proc/{pid}").st_uid
        says: dict[str, str] = {}
        if uid is not None and uid == st.st_uid and uid in (0, os.geteuid()):
            with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
                os.lseek(fd, 0, os.SEEK_SET)
                data = json.loads(os.read(fd, 4096) or b"{}")
                says = {k: str(data[k]) for k in ("host", "url") if data.get(k)}
        return cls(pid, uid, says)

    def text(self) -> str:
        """``pid 123 of user alice on host h, serving http://...``"""
        if self.pid is None:
            return "a process this broker cannot see"
        text = f"pid {self.pid}"
        if self.uid is not None:
            text += f" of user {user_name(self.uid)}"
        if "host" in self.says:
            text += f" on {self.says['host']}"
        return text + (f", serving {self.says['url']}" if "url" in self.says else "")


class _Held:
    """One lock file, held open (and locked) until ``release``."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def release(self) -> None:
        """Give the lock back (the file stays: removing it would let a third process lock a
        new file while a second one waits on the old)."""
        if self._fd is not None:
            if _own(self._fd):
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, 0)
            os.close(self._fd)
            self._fd = None


def _lock(fd: int, url: str) -> _Held | Holder:
    """Lock ``fd`` without waiting and, in a file of its own, say who holds it now; who
    holds it when another process has it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = Holder.of(fd)
        os.close(fd)
        return holder
    if _own(fd):
        me = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "url": url})
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, me.encode(), 0)
    return _Held(fd)


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
            fd = open_regular(self.path, os.O_RDWR | os.O_CREAT)
        except Refused as e:
            raise StateFileError(
                f"{self.state_file}: its lock file is not usable ({e.strerror}); remove "
                f"{self.path}, or set c.GPUBroker.state_file (or ${STATE_FILE_ENV}) to a file "
                "in a directory only this user can write"
            ) from None
        except OSError as e:
            raise StateFileError(
                f"{self.state_file}: cannot create its lock file {self.path} ({e.strerror}); "
                "give this user write access to the directory, or set c.GPUBroker.state_file "
                f"(or ${STATE_FILE_ENV}) to another file"
            ) from None
        if _own(fd):
            os.fchmod(fd, PRIVATE)  # an earlier version's was readable, so lockable, by all
        held = _lock(fd, url)
        if isinstance(held, Holder):
            raise StateFileError(
                f"{self.state_file}: in use by another GPU broker ({held.text()}); use that "
                "server, stop it, or give this one its own state file with "
                f"c.GPUBroker.state_file or ${STATE_FILE_ENV}"
            )
        self._held = held

    def release(self) -> None:
        if self._held is not None:
            self._held.release()
            self._held = None


def secure_state_file(state_file: Path, log: logging.Logger) -> None:
    """Create the state file readable by its owner only, and take group and world access
    away from one (or its journals) an earlier version left readable, saying so once."""
    with contextlib.suppress(FileExistsError):
        os.close(open_regular(state_file, os.O_RDWR | os.O_CREAT | os.O_EXCL))
    for path in (state_file, *(Path(f"{state_file}{end}") for end in ("-wal", "-shm"))):
        try:
            fd = open_regular(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        except OSError as e:
            raise StateFileError(
                f"{state_file}: not usable ({e.strerror}); remove {path}, or set "
                f"c.GPUBroker.state_file (or ${STATE_FILE_ENV}) to a file in a directory only "
                "this user can write"
            ) from None
        try:
            mode = stat.S_IMODE(os.fstat(fd).st_mode)
            if mode & 0o077 and _own(fd):
                os.fchmod(fd, mode & 0o700)
                log.info(
                    "%s was readable by other users; it is now readable only by its owner", path
                )
        finally:
            os.close(fd)


class GpuLocks:
    """One lock per GPU of the machine, whatever the state file: in ``directory`` for a
    broker running as root, else in ``user_directory``, after a look at root's."""

    def __init__(
        self, directory: Path, user_directory: Path, log: logging.Logger | None = None
    ) -> None:
        self.directory, self.user_directory = directory, user_directory
        self.log = log or logging.getLogger(__name__)
        self._held: list[_Held] = []

    def acquire(self, gpu_uuids: Iterable[str], url: str = "") -> None:
        """Lock every GPU or none: ``GpuInUse`` names the first one another broker
        manages, and its holder."""
        as_root = os.geteuid() == 0
        try:
            if as_root:
                self._root_directory()
            else:
                self._shared_directory()
            for uuid in gpu_uuids:
                name = f"{uuid}.lock"
                if as_root:
                    self._warn_of_user_broker(self.user_directory / name, uuid)
                    fd = self._open(self.directory / name, os.O_RDWR | os.O_CREAT)
                else:
                    self._refuse_if_root_holds(self.directory / name, uuid)
                    fd = self._open_shared(self.user_directory / name)
                held = _lock(fd, url)
                if isinstance(held, Holder):
                    raise GpuInUse(
                        f"GPU {uuid} is already managed by another GPU broker "
                        f"({held.text()}): brokers that share a machine grant the same GPUs "
                        "twice; run one broker for everyone as the JupyterHub service "
                        "(docs/hub.md), or stop the other one"
                    )
                self._held.append(held)
        except BaseException:
            self.release()
            raise

    def _root_directory(self) -> None:
        """Root's directory: created ``0755``, and refused unless root owns it and
        nobody else may write it (anyone who can create files there can steer root)."""
        with contextlib.suppress(FileExistsError):
            self.directory.mkdir(mode=0o755, parents=True)
        st = self.directory.lstat()
        if not stat.S_ISDIR(st.st_mode):
            why = "it is not a directory"
        elif st.st_uid != 0:
            why = f"it belongs to user {user_name(st.st_uid)}"
        elif st.st_mode & 0o022:
            why = "other users may write in it"
        else:
            return
        raise GpuInUse(
            f"{self.directory} cannot hold the GPU locks of a broker running as root: {why}; "
            "remove it (the broker makes it again, writable by root only), or set "
            f"c.GPUBroker.gpu_lock_dir (or ${LOCK_DIR_ENV}) to a directory only root can write"
        )

    def _shared_directory(self) -> None:
        """The users' directory: world-writable and sticky (each user may remove only
        their own files), as ``/tmp`` is."""
        if not self.user_directory.exists():
            with contextlib.suppress(FileExistsError):
                self.user_directory.mkdir(parents=True)
                os.chmod(self.user_directory, 0o777 | stat.S_ISVTX)
        if not stat.S_ISDIR(self.user_directory.lstat().st_mode):
            raise GpuInUse(
                f"{self.user_directory} is not a directory (a link, or a file); remove it, or "
                f"set c.GPUBroker.user_gpu_lock_dir (or ${USER_LOCK_DIR_ENV}) to a directory "
                "every user can write"
            )

    def _refuse_if_root_holds(self, path: Path, uuid: str) -> None:
        """``GpuInUse`` when root's broker holds this GPU (a file root owns, locked), read
        without opening it: root keeps its lock files to itself."""
        try:
            st, parent = path.lstat(), path.parent.lstat()
        except OSError:
            return
        trusted = parent.st_uid == 0 and not parent.st_mode & 0o022
        if trusted and stat.S_ISREG(st.st_mode) and st.st_uid == 0:
            pid = _holder_pid(st)
            if pid is not None:
                raise GpuInUse(
                    f"GPU {uuid} is managed by the GPU broker root runs on this machine (pid "
                    f"{pid}): use that broker (the JupyterHub service) rather than one of "
                    "your own"
                )

    def _warn_of_user_broker(self, path: Path, uuid: str) -> None:
        """Root's broker is never kept out by a user's lock, but says when one exists."""
        with contextlib.suppress(OSError):
            st = path.lstat()
            pid = _holder_pid(st) if stat.S_ISREG(st.st_mode) else None
            if pid is not None:
                self.log.warning(
                    "GPU %s is also managed by a broker of user %s (pid %s); it does not "
                    "see this broker's grants: ask them to stop it",
                    uuid,
                    user_name(os.stat(f"/proc/{pid}").st_uid),
                    pid,
                )

    def _open_shared(self, path: Path) -> int:
        """A lock file in the users' directory: one's own read-write (readable by all, who
        may lock it: that is how they share it); another user's read-only, untouched."""
        try:
            fd = self._open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except GpuInUse as e:
            if not isinstance(e.__cause__, PermissionError):
                raise
            return self._open(path, os.O_RDONLY)
        if _own(fd):
            os.fchmod(fd, 0o644)  # past the umask: others must be able to lock it
        return fd

    def _open(self, path: Path, flags: int, mode: int = PRIVATE) -> int:
        try:
            return open_regular(path, flags, mode)
        except Refused as e:
            raise GpuInUse(
                f"{path} is not a lock file this broker trusts: {e.strerror}; the broker "
                "leaves it alone: remove it (someone may have put it there on purpose)"
            ) from e
        except OSError as e:
            raise GpuInUse(
                f"{path}: cannot open this GPU's machine-wide lock file ({e.strerror}); set "
                f"c.GPUBroker.gpu_lock_dir (or ${LOCK_DIR_ENV}) for a broker running as root, "
                f"c.GPUBroker.user_gpu_lock_dir (or ${USER_LOCK_DIR_ENV}) for others"
            ) from e

    def release(self) -> None:
        for held in self._held:
            held.release()
        self._held.clear()
