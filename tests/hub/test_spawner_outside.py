"""On one machine the GPU spawner names its server's process with every renewal of the
server's lease: what the server starts on its GPU is then the lease's, whoever runs it,
never use outside the broker. A real hub and proxy, the broker service and
``SimpleGPUBrokerSpawner`` (LocalProcessSpawner) on the simulated machine."""

from __future__ import annotations

from typing import Any

import pytest
import requests
from live_hub import Hub, wait_for

from hub_spawner.environment import LEASE_ENV

pytestmark = pytest.mark.hub


@pytest.fixture(scope="module")
def hub_options() -> dict[str, Any]:
    return {"spawner": "hub_spawner.spawner.SimpleGPUBrokerSpawner"}


def test_the_spawner_names_the_servers_process_with_the_leases_renewals(hub: Hub) -> None:
    token = hub.user("olga")
    try:
        r = requests.post(
            f"{hub.url}/hub/api/users/olga/server",
            json={"profile": "1g.10gb"},
            headers={"Authorization": f"token {token}"},
            timeout=60,
        )
        assert r.status_code in (201, 202), r.text
        env = hub.ready_server_env("olga")
        pid = hub.hub_api("GET", "users/olga")["servers"][""]["state"]["pid"]

        def named() -> bool:
            status, lease = hub.api(token, "GET", f"leases/{env[LEASE_ENV]}")
            return status == 200 and lease["holder_pid"] == pid

        assert wait_for("the server's pid on its lease", named, log=hub.log)
    finally:
        hub.stop_server("olga")
