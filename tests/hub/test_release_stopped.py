"""The hub service's release of stopped servers when the hub never answers: each user it
could not ask about keeps their lease, and the log says so, naming them. A real broker
(the API's rules, the state file) and a hub API address where nothing listens."""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hub_spawner.service import release_stopped_servers, service_identity
from jupyter_gpubroker.api.rules import BrokerAPI
from jupyter_gpubroker.runtime import GPUBroker
from jupyter_gpubroker.wire.sizes import Size


def closed_port() -> int:
    """A port nothing listens on (bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_hub_that_never_answers_leaves_a_log_line_naming_each_user(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rt = GPUBroker(simulate="dgx-h100:2", state_file=str(tmp_path / "state.sqlite"))
    rt.start()
    try:
        api = BrokerAPI(rt)
        held = [
            rt.core.submit(user, Size(gpus=1), holder=f"server:{user}").lease_id
            for user in ("ida", "jo")
        ]
        hub: Any = SimpleNamespace(
            api_url=f"http://127.0.0.1:{closed_port()}/hub/api", api_token="unused"
        )
        log = logging.getLogger("test-release-stopped")
        with caplog.at_level(logging.WARNING, logger=log.name):
            released = await release_stopped_servers(api, service_identity(api), hub, log, tries=2)
        assert released == []
        assert [rt.core.lease(x).state.value for x in held] == ["active", "active"]
        said = [r.getMessage() for r in caplog.records]
        for user in ("ida", "jo"):
            assert (
                f"GPU broker service: the hub did not answer for {user}'s servers (2 tries): "
                "their GPUs are released only as their leases expire"
            ) in said
        assert rt.core.store.audit() == []  # nothing was done, so nothing recorded
    finally:
        rt.stop()
