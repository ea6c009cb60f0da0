"""What a GPU server is started with, from its reservation: pure functions of plain
values, so they are tested without a hub (as KubeSpawner's ``objects.py`` builds its
pods). The spawner (``spawner.py``) calls them with its own state."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from jupyter_gpubroker.client import SERVER_LEASE_ENV
from jupyter_gpubroker.wire.text import SERVER_HOLDER

from .hubauth import USE_SCOPE
from .options import gpu_request

LEASE_ENV = SERVER_LEASE_ENV


def server_holder(user: str, server_name: str = "") -> str:
    """The holder a server's request and lease carry at the broker, ``server:<user>`` or
    ``server:<user>:<server name>``: a restarted hub finds its request again by it."""
    return f"{SERVER_HOLDER}{user}" + (f":{server_name}" if server_name else "")


def broker_scopes(service: str) -> list[str]:
    """The scopes of the token the spawner makes for the server's user: reach the
    broker's service and use it, nothing else."""
    return [f"access:services!service={service}", USE_SCOPE]


def wants_gpu(options: Mapping[str, Any] | None) -> bool:
    """Whether ``options`` ask for a GPU (malformed ones do not: ``start`` refuses them)."""
    try:
        return gpu_request(dict(options or {})) is not None
    except ValueError:
        return False


def start_timeout(server_s: float, queue_s: float, gpu: bool) -> int:
    """The hub's start timeout: the server's own, plus the queue's wait for a GPU server."""
    return int(server_s + (queue_s if gpu else 0))


def device_env(devices: list[str] | None) -> dict[str, str]:
    """The environment that confines a server to its granted ``devices`` (``None``: a
    CPU-only server, which sees no GPU a kernel could use without asking the broker)."""
    if devices is None:
        return {"CUDA_VISIBLE_DEVICES": ""}
    ids = ",".join(devices)
    return {"CUDA_VISIBLE_DEVICES": ids, "NVIDIA_VISIBLE_DEVICES": ids}


def gpu_env(
    held: Mapping[str, Any] | None,
    devices_env: Callable[[list[str] | None], dict[str, str]] = device_env,
) -> dict[str, str]:
    """A server's GPU environment from its reservation (``held``: ``lease_id`` and
    ``devices`` once granted): its devices as ``devices_env`` names them (an engine that
    places them itself names them otherwise), and its lease, which its kernels share."""
    if not held or not held.get("devices"):
        return devices_env(None)
    share = dict(held.get("share_env") or {})  # a share's MPS daemon and limits
    return {**devices_env(list(held["devices"])), **share, LEASE_ENV: str(held["lease_id"])}


def start_path(escaped_user: str, escaped_server: str = "") -> str:
    """The hub's REST path that starts a user's server; both names already escaped as
    path segments (names hold ' ', '?', '#'...); no server name: the default server."""
    return f"users/{escaped_user}/server" + (f"s/{escaped_server}" if escaped_server else "")
