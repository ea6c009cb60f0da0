"""RBAC for the cluster tests: the roles docs/kubernetes.md gives the broker, and service
accounts bound to exactly the rules a test gives them, with a kubeconfig of their token."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from kube_cluster import KUBECONFIG, NAMESPACE, kubectl

DOCS = Path(__file__).resolve().parents[2] / "docs" / "kubernetes.md"
RBAC = "rbac.authorization.k8s.io"


def documented(kind: str, name: str) -> dict[str, Any]:
    """The RBAC object ``kind`` named ``name`` as docs/kubernetes.md gives it."""
    blocks = re.findall(r"```yaml\n(.*?)```", DOCS.read_text(), re.S)
    for block in blocks:
        for doc in yaml.safe_load_all(block):
            if doc and doc.get("kind") == kind and doc["metadata"]["name"] == name:
                return dict(doc)
    raise AssertionError(f"docs/kubernetes.md shows no {kind} {name}")


def documented_rules(kind: str = "ClusterRole", name: str = "gpubroker") -> list[dict[str, Any]]:
    """The rules of the role ``kind`` named ``name`` as docs/kubernetes.md gives it."""
    return list(documented(kind, name)["rules"])


def service_account(
    tmp_path: Path,
    name: str,
    rules: list[dict[str, Any]],
    namespaced: list[dict[str, Any]] | None = None,
) -> Path:
    """A service account bound to a ClusterRole with exactly ``rules`` and, given
    ``namespaced``, to a Role with those in the test namespace; a kubeconfig with its token
    (the API server's TokenRequest, as a pod's projected token)."""
    kubectl("create", "serviceaccount", name, "-n", NAMESPACE)
    subjects = [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}]
    items = []
    for kind, kept in (("ClusterRole", rules), ("Role", namespaced)):
        if kept is None:
            continue
        where = {"namespace": NAMESPACE} if kind == "Role" else {}
        items += [
            {
                "apiVersion": f"{RBAC}/v1",
                "kind": kind,
                "metadata": {"name": name, **where},
                "rules": kept,
            },
            {
                "apiVersion": f"{RBAC}/v1",
                "kind": f"{kind}Binding",
                "metadata": {"name": name, **where},
                "roleRef": {"apiGroup": RBAC, "kind": kind, "name": name},
                "subjects": subjects,
            },
        ]
    kubectl("apply", "-f", "-", input={"apiVersion": "v1", "kind": "List", "items": items})
    token = kubectl("create", "token", name, "-n", NAMESPACE).strip()
    admin = yaml.safe_load(KUBECONFIG.read_text())
    path = tmp_path / f"{name}.kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": admin["clusters"],
                "users": [{"name": name, "user": {"token": token}}],
                "contexts": [
                    {
                        "name": name,
                        "context": {"cluster": admin["clusters"][0]["name"], "user": name},
                    }
                ],
                "current-context": name,
            }
        )
    )
    return path


def delete_account(name: str) -> None:
    """The account and its roles and bindings gone."""
    kubectl("delete", "clusterrolebinding,clusterrole", name, "--ignore-not-found")
    kubectl(
        "delete", "rolebinding,role,serviceaccount", name, "-n", NAMESPACE, "--ignore-not-found"
    )
