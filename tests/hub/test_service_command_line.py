"""The hub service's command line sets every kind of ``c.GPUBroker`` setting: a set given
as ``--GPUBroker.reclaim_exempt_users={'vip'}`` is a set of one user, not one string
(traitlets leaves a class that owns no config trait itself out of the command line)."""

from __future__ import annotations

from hub_spawner.service import GPUBrokerService
from jupyter_gpubroker.runtime import GPUBroker


def test_a_set_and_a_dict_on_the_command_line_reach_the_broker() -> None:
    app = GPUBrokerService()
    app.parse_command_line(
        [
            "--GPUBroker.reclaim_exempt_users={'vip'}",
            "--GPUBroker.server_idle_timeout_by_profile={'1g.10gb': 4.0}",
        ]
    )
    broker = GPUBroker(config=app.config)
    assert broker.reclaim_exempt_users == {"vip"}
    assert broker.server_idle_timeout_by_profile == {"1g.10gb": 4.0}
