"""The hub's RBAC for DRA claims as docs/kubernetes.md gives it, on the real control plane:
a service account with exactly the Zero to JupyterHub chart's hub rules and the documented
Role starts and stops a whole-GPU and a shared-GPU server through the spawner, and without
any one of the Role's verbs a start (or a shared claim's removal) is refused in a sentence
that names it."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("kubespawner.clients", reason="the kubernetes extra")

from kube_broker import grant  # noqa: E402
from kube_cluster import NAMESPACE, get, kubectl, service_account  # noqa: E402

from hub_spawner._compat import SpawnException  # noqa: E402
from hub_spawner.kube_claims import ClaimError  # noqa: E402
from hub_spawner.kubernetes import ClaimedKubeSpawner, GPUBrokerKubeSpawner  # noqa: E402
from jupyter_gpubroker.runtime import GPUBroker  # noqa: E402
from jupyter_gpubroker.wire.sizes import Size  # noqa: E402

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.usefixtures("dra"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]
DOCS = Path(__file__).resolve().parents[2] / "docs" / "kubernetes.md"
CHART_HUB_RULES = [
    {
        "apiGroups": [""],
        "resources": ["pods", "persistentvolumeclaims", "secrets", "services"],
        "verbs": ["get", "watch", "list", "create", "delete"],
    },
    {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "watch", "list"]},
]
"""The hub's Role in the Zero to JupyterHub chart (``jupyterhub/templates/hub/rbac.yaml``)."""
Spawners = Callable[..., GPUBrokerKubeSpawner]


def documented(kind: str) -> dict[str, Any]:
    """The hub's ``kind`` (Role, RoleBinding) for claims as the docs give it."""
    for block in re.findall(r"```yaml\n(.*?)```", DOCS.read_text(), re.S):
        for doc in yaml.safe_load_all(block):
            if doc and doc.get("kind") == kind and doc["metadata"]["name"] == "hub-gpubroker":
                return dict(doc)
    raise AssertionError(f"docs/kubernetes.md shows no {kind} hub-gpubroker")


def clean() -> None:
    """What a refused start left (the admin's kubeconfig)."""
    for kind in ("pods", "resourceclaimtemplates", "resourceclaims"):
        kubectl("delete", kind, "--all", "-n", NAMESPACE, "--wait=true", "--grace-period=0")


def without(rules: list[dict[str, Any]], resource: str, verb: str) -> list[dict[str, Any]]:
    """``rules`` with ``verb`` on ``resource`` taken out."""
    fewer = []
    for rule in rules:
        others = [r for r in rule["resources"] if r != resource]
        if others:
            fewer.append({**rule, "resources": others})
        if resource in rule["resources"]:
            verbs = [v for v in rule["verbs"] if v != verb]
            fewer.append({**rule, "resources": [resource], "verbs": verbs})
    return fewer


async def test_the_documented_role_is_all_the_hub_needs_for_claims_and_each_verb_is_needed(
    tmp_path: Path, accounts: list[str], spawner: Spawners, dra_broker: GPUBroker
) -> None:
    role, binding = documented("Role"), documented("RoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "hub-gpubroker",
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "hub", "namespace": "jhub"}]
    rules = list(role["rules"])
    whole, share = (
        grant(dra_broker, "ann", Size(gpus=1)),
        grant(dra_broker, "bob", Size(share_gb=8)),
    )
    accounts.append("hub-docs")
    documented_account = service_account(tmp_path, "hub-docs", CHART_HUB_RULES + rules, "Role")
    servers = [
        spawner(kubeconfig=documented_account),
        spawner(kubeconfig=documented_account, user="bob"),
    ]
    servers[0]._gpu, servers[1]._gpu = dict(whole), dict(share)
    for server in servers:
        await ClaimedKubeSpawner.start(server)
    for server in servers:
        await ClaimedKubeSpawner.stop(server, now=True)
    assert not get("resourceclaimtemplates", "-n", NAMESPACE)["items"]
    verbs = [(r, v) for rule in rules for r in rule["resources"] for v in rule["verbs"]]
    assert len(verbs) == 8
    for resource, verb in verbs:
        name = f"hub-no-{verb}-{resource}"
        accounts.append(name)
        account = service_account(
            tmp_path, name, CHART_HUB_RULES + without(rules, resource, verb), "Role"
        )
        kind = (
            "resource claim templates"
            if resource == "resourceclaimtemplates"
            else "resource claims"
        )
        said = f"the API server forbids the hub to {verb} {kind} in namespace {NAMESPACE}"
        server = spawner(kubeconfig=account)
        server._gpu = dict(share if kind == "resource claims" else whole)
        if (resource, verb) == ("resourceclaims", "delete"):
            # deleted only where no pod came to own it: one made for a start without its pod
            manifest = server._manifest(server._dra_grant())
            await server._claims.prepare(manifest)
            with pytest.raises(ClaimError) as refused:
                await server._claims.release(manifest)
            assert str(refused.value).startswith(said), (resource, verb)
        else:
            with pytest.raises(SpawnException) as failed:
                await ClaimedKubeSpawner.start(server)
            assert str(failed.value) == (
                f"Cannot start the server with its GPU claim: {said}: grant its service "
                "account the rules docs/kubernetes.md gives."
            ), (resource, verb)
        clean()
