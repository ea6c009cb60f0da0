"""Fixtures of the Kubernetes tests: a kubeconfig for a given API server address (KubeSpawner
loads one when it is made, and nothing here runs a cluster)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from kube_helpers import free_port

KubeconfigFactory = Callable[..., Path]


@pytest.fixture
def kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> KubeconfigFactory:
    """Write a kubeconfig for ``server`` (default: a port nothing listens on) and make it
    $KUBECONFIG; returns its path."""
    kube_config = pytest.importorskip("kubernetes_asyncio.config.kube_config")

    def make(server: str = "") -> Path:
        path = tmp_path / "kubeconfig"
        path.write_text(
            "apiVersion: v1\nkind: Config\n"
            f'clusters: [{{name: c, cluster: {{server: "{server or f"http://127.0.0.1:{free_port()}"}"}}}}]\n'
            "users: [{name: u, user: {token: t}}]\n"
            "contexts: [{name: x, context: {cluster: c, user: u}}]\n"
            "current-context: x\n"
        )
        monkeypatch.setenv("KUBECONFIG", str(path))
        # the client reads $KUBECONFIG once, when it is imported
        monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))
        return path

    return make
