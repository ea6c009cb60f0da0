"""The Prometheus alerting rules and the Grafana dashboard shipped in the package: the
rules load in ``promtool`` and each alert fires on synthetic series (``alerts_test.yml``);
the dashboard is a Grafana dashboard whose every panel queries Prometheus. That every
metric name they use is one a live server exports is tested in tests/server/test_monitoring.py.

``promtool`` comes with Debian's ``prometheus`` package (``.ci/run`` installs it); without
it these tests are skipped, except in CI (``CI=true``), where that is a failure."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from shipped_monitoring import DASHBOARD, RULES, metric_names, rules

UNIT_TESTS = Path(__file__).with_name("alerts_test.yml")


@pytest.fixture
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is not on PATH: apt-get install prometheus")
        pytest.skip("promtool is not on PATH: apt-get install prometheus")
    return found


def run(promtool: str, *args: str) -> str:
    done = subprocess.run(
        [promtool, *args], capture_output=True, text=True, timeout=120, cwd=UNIT_TESTS.parent
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_rules_load_in_promtool(promtool: str) -> None:
    out = run(promtool, "check", "rules", str(RULES))
    assert f"SUCCESS: {len(rules())} rules found" in out


def test_every_alert_fires_on_synthetic_series(promtool: str) -> None:
    tests = yaml.safe_load(UNIT_TESTS.read_text())
    shipped = RULES.read_text()
    assert (UNIT_TESTS.parent / tests["rule_files"][0]).read_text() == shipped  # the package's
    alerts = {r["alert"] for r in rules()}
    fired = {
        case["alertname"]
        for t in tests["tests"]
        for case in t["alert_rule_test"]
        if case["exp_alerts"]
    }
    assert fired == alerts
    assert "SUCCESS" in run(promtool, "test", "rules", UNIT_TESTS.name)


def test_every_alert_says_how_bad_and_what_to_do() -> None:
    for rule in rules():
        summary = rule["annotations"]["summary"]
        assert ": " in summary and summary.endswith("."), rule["alert"]
        mirrored = rule["alert"] == "GPUBrokerAlert"  # the series carries its own
        assert mirrored or rule["labels"]["severity"] in ("warning", "critical")


def test_the_dashboard_queries_prometheus_in_every_panel() -> None:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    (source,) = dashboard["templating"]["list"]
    assert (source["type"], source["query"]) == ("datasource", "prometheus")
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for p in panels:
        assert p["targets"], p["title"]
        for t in [p, *p["targets"]]:
            assert t["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    names = metric_names()
    assert {"gpubroker_alert_active", "gpubroker_gpu_temperature_celsius"} <= names
