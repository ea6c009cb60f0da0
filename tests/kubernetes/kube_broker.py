"""The broker the cluster tests run against the test cluster (``kube_cluster.py``): made
with the admin's kubeconfig, one engine pass at a time, and what it holds back."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dra_publisher import NODES, SHARED_MODEL
from kube_cluster import KUBECONFIG
from traitlets.config import Config

from hub_spawner import reservation
from jupyter_gpubroker.engines import ENGINE
from jupyter_gpubroker.runtime import GPUBroker
from jupyter_gpubroker.wire.sizes import Size


def make_broker(
    state: Path,
    kubeconfig: Path = KUBECONFIG,
    inventory: dict[str, Any] | None = None,
    **traits: Any,
) -> GPUBroker:
    """A broker of the test cluster; ``inventory``: more ``KubernetesInventory`` settings."""
    settings = {"kubeconfig": str(kubeconfig), "request_timeout": 3, **(inventory or {})}
    config = Config({"KubernetesInventory": settings})
    return GPUBroker(inventory_source="kubernetes", state_file=str(state), config=config, **traits)


def make_dra_broker(state: Path) -> GPUBroker:
    """The broker of the DRA nodes alone (``dra_publisher.NODES``), the L40S lent in shares."""
    nodes = f"kubernetes.io/hostname in ({','.join(NODES)})"
    shared = [{"mode": "shared", "gpus": [SHARED_MODEL]}]
    return make_broker(state, inventory={"node_selector": nodes}, sharing_rules=shared)


def grant(broker: GPUBroker, user: str, size: Size) -> dict[str, Any]:
    """``user``'s request granted at once, as the GPU spawner keeps it: ``reservation.held``
    of the API's request, its lease's share included."""
    core = broker.core
    request = core.submit(user, size)
    lease = core.lease(core.request(request.id).lease_id or "")
    shown = {"id": lease.id, "devices": list(lease.devices), "ttl_s": lease.ttl_s}
    return reservation.held({"id": request.id, "lease": {**shown, "share": broker.share_of(lease)}})


def poll(broker: GPUBroker) -> None:
    """One engine pass, as every tick makes it (each on an event loop of its own)."""
    asyncio.run(broker.poll_engine())


def drains(broker: GPUBroker) -> dict[str, list[str]]:
    """Node -> the reasons its devices are held back by the engine."""
    core = broker.core
    found: dict[str, list[str]] = {}
    for uuid in sorted(core.drained_by(ENGINE)):
        held = core.inventory.device(uuid) or core.inventory.gpu(uuid)
        assert held is not None, uuid
        found.setdefault(held.node, []).append(core.drained()[uuid][0])
    return found


def lease_of(broker: GPUBroker, request_id: str) -> Any:
    core = broker.core
    return core.lease(core.request(request_id).lease_id or "")


@contextlib.contextmanager
def started(broker: GPUBroker) -> Iterator[GPUBroker]:
    """``broker`` running, stopped at the end."""
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
