"""The forecast-only mode (``c.GPUBroker.forecast_log``): each hour, the log says what the
forecast expected of the hour that just ended and what it came to, so an admin can judge
the forecast before anything acts on it (as AWS predictive scaling's forecast-only mode)."""

from __future__ import annotations

import logging
from typing import Any

from traitlets import Bool
from traitlets.config import LoggingConfigurable

from ..broker.core import Broker
from ..broker.forecast import HOUR_S, WEEK_S, Forecast, ahead, forecast, hour_check, spans
from ..broker.recorded import demand
from ..broker.store import AuditRecord
from ..wire.text import gpus

WEEKS = 8
REPLAN_S = 300.0
"""How often the parts that act ahead read the forecast again."""
ACTOR = "forecast"
"""Who the audit log names for what they change."""


class ActsAhead(LoggingConfigurable):
    """What the parts that act ahead of the forecast share (power saving, MIG cut ahead):
    one reading of it, from the last ``WEEKS`` weeks of the state file, read again at
    most every ``REPLAN_S``."""

    _forecast: tuple[float, Forecast] | None = None

    def read_forecast(self, core: Broker, now: float) -> Forecast:
        if self._forecast is None or now - self._forecast[0] >= REPLAN_S:
            rows = demand(core.store, now - WEEKS * WEEK_S, now)
            self._forecast = (now, forecast(spans(rows), now, weeks=WEEKS, backtest_weeks=0))
        return self._forecast[1]

    def audit_ahead(self, core: Broker, action: str, target: str, detail: dict[str, Any]) -> None:
        """One change made ahead of the forecast, in the audit log with its reason."""
        with core.store.audited(AuditRecord(core.clock.now(), ACTOR, action, target, detail)):
            pass


def acting_line(
    kind: str, head: str, on: bool, why_not: str | None = None, doing: str = "on"
) -> dict[str, Any]:
    """One line of what acts on the forecast, each kind in the same words: "off", "on,
    but none is: <why_not>", or ``doing`` (what it does now)."""
    said = "off" if not on else doing if why_not is None else f"on, but none is: {why_not}"
    return {"kind": kind, "on": on, "acting": on and why_not is None, "text": f"{head}: {said}"}


def p90_ahead(found: Forecast, now: float) -> tuple[float, str] | None:
    """The larger p90 of this hour and the next (GPU-equivalents held and waiting), and
    that as an audit's reason says it (None: no forecast yet)."""
    if not found.ready:
        return None
    p90, this, after = ahead(found, now, "p90")
    asked = f"at most {gpus(p90)}" if p90 > 0 else "no GPU"
    return p90, f"forecast: {asked} asked {this.label} and {after.label} (p90)"


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
