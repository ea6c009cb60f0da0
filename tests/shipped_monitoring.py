"""The Prometheus rules and the Grafana dashboard the package ships, and the metric names
they use (tests/monitor checks them with promtool, tests/server against a live /metrics)."""

from __future__ import annotations

import json
import re
from importlib import resources

import yaml

RULES = resources.files("jupyter_gpubroker.monitor") / "prometheus" / "alerts.yml"
DASHBOARD = resources.files("jupyter_gpubroker.monitor") / "grafana" / "gpubroker.json"
METRIC = re.compile(r"\bgpubroker_[a-z0-9_]+")


def rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def metric_names() -> set[str]:
    """Every metric name the rules and the dashboard's queries use."""
    exprs = [r["expr"] for r in rules()]
    exprs += [t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p["targets"]]
    return {name for e in exprs for name in METRIC.findall(e)}
