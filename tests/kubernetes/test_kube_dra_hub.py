"""DRA servers through a real JupyterHub and proxy (``gpubroker-kubernetes``, the broker
service reading the test cluster, whose DRA nodes ``dra_publisher.py`` publishes): a claim
the scheduler cannot satisfy fails the user's start with the scheduler's reason in one
sentence and the lease is released, and the broker service killed mid-spawn comes back to
the same lease, whose claim the scheduler then allocates to its device, with no second
claim or grant. The claims ask for a 2g.20gb MIG device, which only ``dra-a100-mig`` has;
removing the DeviceClass ``mig.nvidia.com`` (restored after) keeps a pod unschedulable for
as long as a test needs. KWOK runs no container, so the hub gives up on a running pod after
``http_timeout``, and nothing of the server is left after."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from dra_publisher import device_classes
from kube_cluster import NAMESPACE, get, kubectl, until
from kube_hubs import pod, progress, running_hub
from live_hub import Hub

from jupyter_gpubroker.engines.dra import parse_dra_uuid
from jupyter_gpubroker.engines.kubernetes import LEASE_LABEL

pytestmark = [pytest.mark.cluster, pytest.mark.hub, pytest.mark.slow]
PATIENCE_S = 20
SLICE = {"profile": "2g.20gb"}


@pytest.fixture
def hub(tmp_path: Path, dra: None, proxy: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[Hub]:
    spawner_config = (
        "c.GPUBrokerKubeSpawner.http_timeout = 15\n"
        f"c.GPUBrokerKubeSpawner.claim_unschedulable_timeout = {PATIENCE_S}"
    )
    with running_hub(tmp_path, monkeypatch, spawner_config) as hub:
        yield hub


@pytest.fixture
def no_mig_class() -> Iterator[None]:
    """The DeviceClass ``mig.nvidia.com`` missing, as where the driver's chart is not
    installed: the scheduler refuses every MIG claim until it is back."""
    kubectl("delete", "deviceclass", "mig.nvidia.com")
    try:
        yield
    finally:
        restore_classes()


def restore_classes() -> None:
    for manifest in device_classes():
        kubectl("apply", "-f", "-", input=manifest)


def names(kind: str) -> list[str]:
    return sorted(x["metadata"]["name"] for x in get(kind, "-n", NAMESPACE)["items"])


def pending_pod() -> dict[str, Any]:
    """ann's pod, once the API server has it."""
    found: dict[str, Any] = until("ann's pod", lambda: pod("ann"))
    return found


def spawn(hub: Hub, token: str) -> None:
    answer = requests.post(
        f"{hub.url}/hub/api/users/ann/server",
        json=SLICE,
        headers={"Authorization": f"token {token}"},
        timeout=60,
    )
    assert answer.status_code in (201, 202), answer.text


def last_event(hub: Hub, token: str) -> dict[str, Any]:
    """The spawn's progress, read to its end: its last event."""
    events = [event for _, event in progress(hub, token, "ann")]
    return events[-1] if events else {}


def nothing_left() -> None:
    """No pod, template or claim of the server's is left."""
    for kind in ("pods", "resourceclaimtemplates", "resourceclaims"):
        until(f"no {kind} left", lambda kind=kind: not names(kind), timeout_s=60)


@pytest.mark.usefixtures("no_mig_class")
def test_a_claim_the_scheduler_cannot_satisfy_fails_the_start_with_its_reason(hub: Hub) -> None:
    token = hub.user("ann")
    spawn(hub, token)
    lease_id = pending_pod()["metadata"]["labels"][LEASE_LABEL]
    failed = last_event(hub, token)
    nodes = len(get("nodes")["items"])
    assert failed["failed"] is True
    assert failed["message"] == (
        f"Spawn failed: The cluster cannot place this server's GPU: 0/{nodes} nodes are "
        "available: request gpu: device class mig.nvidia.com does not exist."
    )
    status, lease = hub.api(token, "GET", f"leases/{lease_id}")
    assert status == 200 and lease["state"] == "released", lease
    assert hub.hub_api("GET", "users/ann")["servers"] == {}
    nothing_left()


def test_the_broker_killed_mid_spawn_keeps_the_lease_and_its_one_claim(hub: Hub) -> None:
    token = hub.user("ann")
    kubectl("delete", "deviceclass", "mig.nvidia.com")
    try:
        spawn(hub, token)
        lease_id = pending_pod()["metadata"]["labels"][LEASE_LABEL]
        hub.kill_service()  # the supervisor starts it again, from its state file
    finally:
        restore_classes()
    pod = until(
        "ann's pod to run",
        lambda: (p := pending_pod())["status"].get("phase") == "Running" and p,
        timeout_s=PATIENCE_S,
    )
    status, mine = hub.api(token, "GET", "leases")
    assert status == 200 and [x["id"] for x in mine["leases"]] == [lease_id]
    (device,) = (parse_dra_uuid(d) for d in mine["leases"][0]["devices"])
    assert pod["metadata"]["labels"][LEASE_LABEL] == lease_id
    assert pod["spec"]["nodeName"] == device.node == "dra-a100-mig"
    (claim,) = get("resourceclaims", "-n", NAMESPACE)["items"]  # one claim, no second
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    published = next(
        s for s in get("resourceslices")["items"] if s["spec"]["pool"]["name"] == result["pool"]
    )
    (allocated,) = [d for d in published["spec"]["devices"] if d["name"] == result["device"]]
    assert allocated["attributes"]["uuid"]["string"] == device.uuid
    assert claim["metadata"]["labels"][LEASE_LABEL] == lease_id
    assert names("resourceclaimtemplates") == ["jupyter-ann-gpu"]
    # the restarted broker counts the claim as the lease's own, not as work outside it
    status, devices = hub.api(token, "GET", "devices")
    assert status == 200
    (granted,) = [d for g in devices["gpus"] for d in g["devices"] if d["uuid"] == str(device)]
    assert granted["drained"] is None, granted
    # nothing answers in a KWOK pod: the hub gives up, and the lease and claim go with it
    until("the hub to give up", lambda: hub.hub_api("GET", "users/ann")["servers"] == {}, 90)
    status, ended = hub.api(token, "GET", f"leases/{lease_id}")
    assert status == 200 and ended["state"] == "released", ended
    nothing_left()
