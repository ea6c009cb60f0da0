"""Prometheus scrapes the hub service's /metrics with a hub token, as it scrapes the
hub's own, and finds every family the shipped rules and dashboard use."""

from __future__ import annotations

from typing import Any

import pytest
import requests
from live_hub import SERVICE, Hub
from shipped_monitoring import metric_names

pytestmark = pytest.mark.hub

PROMETHEUS_TOKEN = "prometheus-" + "0" * 16
CONFIG = f"""
c.JupyterHub.services.append({{"name": "prometheus", "api_token": {PROMETHEUS_TOKEN!r}}})
c.JupyterHub.load_roles.append(
    {{"name": "prometheus", "scopes": ["read:metrics"], "services": ["prometheus"]}}
)
"""


@pytest.fixture(scope="module")
def hub_options() -> dict[str, Any]:
    return {"extra_config": CONFIG}


def scrape(hub: Hub, token: str) -> requests.Response:
    return requests.get(
        f"{hub.url}/services/{SERVICE}/metrics",
        headers={"Authorization": f"token {token}"},
        timeout=30,
    )


def test_prometheus_scrapes_the_services_metrics_with_a_read_metrics_token(hub: Hub) -> None:
    refused = scrape(hub, hub.user("nina"))  # a user's own token: no read:metrics
    assert refused.status_code == 403 and "read:metrics" in refused.text
    page = scrape(hub, PROMETHEUS_TOKEN)
    assert page.status_code == 200, page.text
    families = {line.split()[2] for line in page.text.splitlines() if line.startswith("# TYPE ")}
    exported = families | {
        f"{f}_{s}" for f in families for s in ("total", "bucket", "count", "sum")
    }
    used = metric_names()
    assert len(used) > 15 and not used - exported, f"not exported: {sorted(used - exported)}"
