"""The forecast-only mode (``c.GPUBroker.forecast_log``): each hour, the log says what the
forecast expected of the hour that just ended and what it came to, so an admin can judge
the forecast before anything acts on it (as AWS predictive scaling's forecast-only mode)."""

from __future__ import annotations

import logging

from traitlets import Bool
from traitlets.config import LoggingConfigurable

from ..broker.core import Broker
from ..broker.forecast import HOUR_S, WEEK_S, hour_check, spans
from ..broker.recorded import demand

WEEKS = 8


class ForecastSettings(LoggingConfigurable):
    forecast_log = Bool(
        False,
        help="Forecast-only mode: each hour, log the demand the forecast expected of the "
        "hour that just ended (its p50 and p90, GPU-equivalents held and waiting) beside "
        "what it came to. Nothing acts on the forecast.",
    ).tag(config=True)

    _forecast_hour: float | None = None

    def log_forecast(self, core: Broker, log: logging.Logger) -> None:
        """Once an hour has ended (checked at each tick), log its forecast against it."""
        if not self.forecast_log:
            return
        hour = core.clock.now() // HOUR_S * HOUR_S - HOUR_S  # the last hour that ended
        if self._forecast_hour == hour:
            return
        self._forecast_hour = hour
        rows = demand(core.store, hour - WEEKS * WEEK_S, hour + HOUR_S)
        found = hour_check(spans(rows), hour, weeks=WEEKS)
        if found is None:
            log.info("GPU broker forecast: not enough history yet (it needs a day of it)")
            return
        expected, actual = found
        log.info(
            "GPU broker forecast (forecast only, nothing acts on it): %s UTC expected %.2f "
            "GPU-equivalents (p90 %.2f), and %.2f were held or waited for",
            expected.label,
            expected.demand["p50"],
            expected.demand["p90"],
            actual,
        )
