"""Forecast-only mode: each hour the log says what the forecast expected of the hour that
ended and what it came to; nothing else changes."""

from __future__ import annotations

import logging
from datetime import datetime, timezone

from traitlets.config import Config

from jupyter_gpubroker.api.rules import BrokerAPI
from jupyter_gpubroker.broker.clock import VirtualClock
from jupyter_gpubroker.runtime import GPUBroker

MONDAY = datetime(2026, 1, 5, tzinfo=timezone.utc).timestamp()
HOUR = 3600.0


def test_each_hour_the_log_sets_the_forecast_beside_what_came(tmp_path, caplog) -> None:
    c = Config()
    c.GPUBroker.simulate = "dgx-h100:2"
    c.GPUBroker.state_file = str(tmp_path / "state.sqlite")
    c.GPUBroker.forecast_log = True
    runtime = GPUBroker(config=c)
    runtime.start()
    try:
        clock = VirtualClock(MONDAY + 9 * HOUR)
        runtime.core.clock.now = clock.now  # the clock the core shares with its book
        runtime.log = logging.getLogger("forecast-test")
        api = BrokerAPI(runtime)
        alice = api.user_identity(None)
        lines = []
        for day in range(3):  # both GPUs 09:00-10:00 each day; on day 3, one only
            clock.set(MONDAY + day * 86400 + 9 * HOUR)
            held = api.submit(alice, {"gpus": 1 if day == 2 else 2, "holder": f"nb-{day}"})
            clock.advance(HOUR)
            api.release(alice, held["lease"]["id"])
            clock.advance(60)
            with caplog.at_level(logging.INFO, logger="forecast-test"):
                runtime._tick()
                runtime._tick()  # once an hour, however often it ticks
            lines += [r.getMessage() for r in caplog.records if "forecast" in r.getMessage()]
            caplog.clear()
    finally:
        runtime.stop()
    prefix = "GPU broker forecast (forecast only, nothing acts on it): "
    assert (
        lines
        == [
            "GPU broker forecast: not enough history yet (it needs a day of it)",
            prefix + "Tue 09:00-10:00 UTC expected 2.00 GPU-equivalents (p90 2.00), and 2.00 "
            "were held or waited for",  # a day of history before it: Monday's
            prefix + "Wed 09:00-10:00 UTC expected 2.00 GPU-equivalents (p90 2.00), and 1.00 "
            "were held or waited for",
        ]
    )
