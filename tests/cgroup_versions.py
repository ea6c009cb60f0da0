"""Which cgroup versions confine on this host, for the confinement tests.

A host has the cgroup v1 ``devices`` controller only when it boots with cgroup v1 or in
the hybrid layout (this project's machines do: ``/sys/fs/cgroup/devices`` beside
``/sys/fs/cgroup/unified``); a host on cgroup v2 alone, the default of current
distributions, has none. So no CI host can be required to have both: a version the host
lacks is skipped, saying so, and in CI (``CI=true``) a host where neither confines fails,
since the confinement would then go untested."""

from __future__ import annotations

import os

import pytest

from jupyter_gpubroker.confine import DeviceConfinement

VERSIONS = ("v1", "v2")


def why_not(version: str) -> str:
    """Why ``version`` cannot confine here ("" when it can)."""
    return DeviceConfinement(cgroup=version).cgroups.why_not()


def require(version: str) -> None:
    """Skip a test of ``version`` where the host lacks it; fail in CI where it lacks both."""
    why = why_not(version)
    if not why:
        return
    if os.environ.get("CI") == "true" and all(why_not(v) for v in VERSIONS):
        pytest.fail(f"no cgroup version confines on this host: {why}")
    pytest.skip(
        f"{why}: this host has no cgroup {version} to confine with (hosts differ; CI needs "
        "one version at least)"
    )
