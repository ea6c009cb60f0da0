"""A grant of DRA devices as the pod and claim GPUBrokerKubeSpawner builds (no cluster):
the ResourceClaimTemplate pinning each granted device by its uuid, a share's one
ResourceClaim per GPU configured for MPS, the pod's ``resourceClaims`` and the notebook
container's ``resources.claims`` through KubeSpawner's own builder, no extended resource,
and the scheduler's reason in the words a failed start gives."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from traitlets.config import Config

pytest.importorskip("kubespawner.clients", reason="the kubernetes extra")

from kube_helpers import env, granted, limits, manifest, notebook, terms  # noqa: E402

from hub_spawner._compat import SpawnException  # noqa: E402
from hub_spawner.environment import LEASE_ENV  # noqa: E402
from hub_spawner.kube_claims import SHARED_LABEL, DraGrant, unschedulable  # noqa: E402
from jupyter_gpubroker.engines.kubernetes import BROKER_LABEL, LEASE_LABEL  # noqa: E402

GPU_A = "GPU-5b8f0c4e-31a2-4c55-9a43-0d4f6a7e1b21"
GPU_B = "GPU-9e2d7a10-66c1-4f0e-8b4d-2a3c5e7f9a01"
MIG = "MIG-1c2d3e4f-0a1b-5c6d-8e9f-a0b1c2d3e4f5"
POD = "jupyter-mock-name---6241db84"  # KubeSpawner's name of mock@name's pod
PIN = {"key": "metadata.name", "operator": "In", "values": ["node-a"]}


def selector(uuid: str) -> list[dict[str, Any]]:
    return [{"cel": {"expression": f'device.attributes["gpu.nvidia.com"].uuid == "{uuid}"'}}]


def request(name: str, device_class: str, uuid: str) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": device_class, "selectors": selector(uuid)}}


def claim(spawner: Any) -> dict[str, Any]:
    """The template or shared claim the spawner's start makes for its grant."""
    made: dict[str, Any] = spawner._manifest(spawner._dra_grant())
    return made


async def test_a_whole_gpu_is_a_claim_template_pinning_that_gpu_and_no_limit(
    make_spawner: Any,
) -> None:
    spawner = granted(make_spawner(), f"dra:node-a:gpu:{GPU_A}")
    pod = await manifest(spawner)
    assert pod["spec"]["resourceClaims"] == [
        {"name": "gpu", "resourceClaimTemplateName": f"{POD}-gpu"}
    ]
    assert notebook(pod)["resources"]["claims"] == [{"name": "gpu"}]
    assert limits(pod) == {}  # no nvidia.com/gpu: the claim is the grant
    assert terms(pod) == [{"matchFields": [PIN]}]
    labels = pod["metadata"]["labels"]
    assert (labels[BROKER_LABEL], labels[LEASE_LABEL]) == ("gpubroker", "l-0a1b2c")
    assert "CUDA_VISIBLE_DEVICES" not in env(pod) and env(pod)[LEASE_ENV] == "l-0a1b2c"
    ours = {BROKER_LABEL: "gpubroker", LEASE_LABEL: "l-0a1b2c"}
    assert claim(spawner) == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": f"{POD}-gpu", "namespace": spawner.namespace, "labels": ours},
        "spec": {  # the labels copied into the claim, for the broker to know it as its own
            "metadata": {"labels": ours},
            "spec": {"devices": {"requests": [request("gpu", "gpu.nvidia.com", GPU_A)]}},
        },
    }


async def test_each_granted_gpu_is_a_request_of_its_own(make_spawner: Any) -> None:
    spawner = granted(make_spawner(), f"dra:node-a:gpu:{GPU_A}", f"dra:node-a:gpu:{GPU_B}")
    assert claim(spawner)["spec"]["spec"]["devices"]["requests"] == [
        request("gpu-0", "gpu.nvidia.com", GPU_A),
        request("gpu-1", "gpu.nvidia.com", GPU_B),
    ]
    assert notebook(await manifest(spawner))["resources"]["claims"] == [{"name": "gpu"}]


async def test_a_mig_device_is_asked_for_in_the_mig_class(make_spawner: Any) -> None:
    spawner = granted(make_spawner(), f"dra:node-a:mig:{MIG}")
    assert claim(spawner)["spec"]["spec"]["devices"] == {
        "requests": [request("gpu", "mig.nvidia.com", MIG)]
    }
    assert limits(await manifest(spawner)) == {}


async def test_a_share_names_its_gpus_one_claim_configured_for_mps(make_spawner: Any) -> None:
    limits_env = {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8192M"}
    spawner = granted(
        make_spawner(),
        f"dra:node-a:gpu:{GPU_A}",
        share_env=limits_env,
        share_text="8.6 GB of GPU 0, enforced by MPS",
    )
    pod = await manifest(spawner)
    shared = "gpubroker-shared-gpu-5b8f0c4e-31a2-4c55-9a43-0d4f6a7e1b21"
    assert pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimName": shared}]
    assert notebook(pod)["resources"]["claims"] == [{"name": "gpu"}]
    assert env(pod)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M"  # the server's own limit
    # NVIDIA's GpuConfig (api/nvidia.com/resource/v1beta1: gpuconfig.go, sharing.go)
    mps = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS"},
    }
    assert claim(spawner) == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": shared,
            "namespace": spawner.namespace,
            # no lease: every share of the GPU names this claim
            "labels": {BROKER_LABEL: "gpubroker", SHARED_LABEL: "true"},
        },
        "spec": {
            "devices": {
                "requests": [request("gpu", "gpu.nvidia.com", GPU_A)],
                "config": [
                    {"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": mps}}
                ],
            }
        },
    }


async def test_the_deployments_own_claims_stay_and_a_cpu_only_start_has_none_of_the_grant(
    make_spawner: Any,
) -> None:
    scratch = {"name": "scratch", "resourceClaimName": "team-scratch"}
    spawner = make_spawner(
        extra_pod_config={"resourceClaims": [scratch], "priorityClassName": "notebooks"}
    )
    pod = await manifest(granted(spawner, f"dra:node-a:gpu:{GPU_A}"))
    assert pod["spec"]["resourceClaims"] == [
        scratch,
        {"name": "gpu", "resourceClaimTemplateName": f"{POD}-gpu"},
    ]
    assert pod["spec"]["priorityClassName"] == "notebooks"
    spawner._gpu = None
    pod = await manifest(spawner)
    assert pod["spec"]["resourceClaims"] == [scratch]
    assert notebook(pod)["resources"].get("claims") is None
    assert "affinity" not in pod["spec"] and env(pod)["NVIDIA_VISIBLE_DEVICES"] == "void"


@pytest.mark.parametrize(
    ("devices", "why"),
    [
        ([f"dra:node-a:gpu:{GPU_A}", f"dra:node-b:gpu:{GPU_B}"], "devices on 2 nodes"),
        ([f"dra:node-a:gpu:{GPU_A}", "k8s:node-a:gpu:0"], "is not a DRA device of the broker"),
    ],
)
async def test_a_grant_one_pod_cannot_take_is_refused_in_a_sentence(
    make_spawner: Any, devices: list[str], why: str
) -> None:
    with pytest.raises(SpawnException) as refused:
        await manifest(granted(make_spawner(), *devices))
    message = str(refused.value)
    assert message.startswith("The GPU broker granted devices one pod cannot take (")
    assert why in message and message.endswith("a pod takes the devices of one node.")


async def test_kueue_mode_refuses_a_dra_grant_before_making_anything(make_spawner: Any) -> None:
    """Kueue finds a claim with a selector inadmissible: the pod would wait for good."""
    from hub_spawner.kubernetes import ClaimedKubeSpawner

    spawner = granted(make_spawner(kueue_queue="gpu-notebooks"), f"dra:node-a:gpu:{GPU_A}")
    with pytest.raises(SpawnException) as refused:  # no API server listens: nothing is asked
        await ClaimedKubeSpawner.start(spawner)
    assert str(refused.value) == (
        "This hub sends GPU servers to Kueue, which cannot count a GPU claimed by its name, "
        "as this cluster's GPUs are: an admin has to turn Kueue mode off "
        "(c.GPUBrokerKubeSpawner.kueue_queue) for this cluster."
    )


def test_a_share_of_several_devices_or_of_a_mig_device_is_not_a_grant() -> None:
    share = {"share_text": "8.6 GB of GPU 0, enforced by MPS"}
    for devices in ([f"dra:n:gpu:{GPU_A}", f"dra:n:gpu:{GPU_B}"], [f"dra:n:mig:{MIG}"]):
        with pytest.raises(ValueError, match="a share names one GPU"):
            DraGrant.of({"devices": devices, **share})


def condition(message: str, reason: str = "Unschedulable") -> dict[str, Any]:
    return {
        "status": {
            "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": reason, "message": message}
            ]
        }
    }


def test_the_schedulers_reason_is_its_first_sentence() -> None:
    # as kube-scheduler 1.34.4 wrote them on the test cluster (tests/kubernetes)
    taken = (
        "0/8 nodes are available: 1 cannot allocate all claims, 7 node(s) didn't satisfy "
        "plugin(s) [NodeAffinity]. still not schedulable, preemption: 0/8 nodes are "
        "available: 8 Preemption is not helpful for scheduling."
    )
    assert unschedulable(condition(taken)) == (
        "0/8 nodes are available: 1 cannot allocate all claims, 7 node(s) didn't satisfy "
        "plugin(s) [NodeAffinity]"
    )
    no_class = (
        "0/8 nodes are available: request gpu-0: device class nope.nvidia.com does not "
        "exist. no new claims to deallocate, preemption: 0/8 nodes are available: 8 "
        "Preemption is not helpful for scheduling."
    )
    assert unschedulable(condition(no_class)) == (
        "0/8 nodes are available: request gpu-0: device class nope.nvidia.com does not exist"
    )
    assert unschedulable(condition("", reason="SchedulingGated")) == ""
    assert unschedulable({"status": {"phase": "Pending"}}) == unschedulable(None) == ""


async def test_the_zero_to_jupyterhub_values_in_the_docs_configure_the_dra_spawner(
    make_spawner: Any,
) -> None:
    """The docs' ``hub.extraConfig`` entry, run as the chart runs it (``exec`` with ``c``),
    makes the broker service and the GPU KubeSpawner, at the port the values open."""
    docs = Path(__file__).resolve().parents[2] / "docs" / "kubernetes.md"
    shown = re.findall(r"```yaml\n(.*?)```", docs.read_text(), re.S)
    docs_yaml = [d for b in shown for d in yaml.safe_load_all(b)]
    (values,) = [d for d in docs_yaml if isinstance(d, dict) and "extraConfig" in d.get("hub", {})]
    hub = values["hub"]
    c = Config()
    exec(hub["extraConfig"]["gpubroker"], {"c": c})  # noqa: S102 - the chart's own way
    assert c.JupyterHub.spawner_class == "gpubroker-kubernetes"
    (service,) = c.JupyterHub.services
    assert service["url"] == "http://hub:10101"
    assert "--GPUBroker.inventory_source=kubernetes" in service["command"]
    assert "--GPUBroker.state_file=/srv/jupyterhub/gpubroker.sqlite" in service["command"]
    assert c.Spawner.environment["GPUBROKER_URL"] == "http://hub:10101/services/gpubroker/api/v1"
    # the port the service listens on is the one the Service and the policies open
    assert (
        [p["port"] for p in hub["service"]["extraPorts"]]
        == hub["networkPolicy"]["allowedIngressPorts"]
        == [10101]
    )
    assert hub["extraPodSpec"]["hostAliases"] == [{"ip": "0.0.0.0", "hostnames": ["hub"]}]
    (egress,) = values["singleuser"]["networkPolicy"]["egress"]
    assert egress["ports"] == [{"port": 10101}]
    spawner = make_spawner(config=c)
    assert spawner.claim_unschedulable_timeout == 15
