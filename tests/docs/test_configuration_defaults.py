"""docs/configuration.md's table of defaults is the code's: each row's default is its
trait's, read from the class with traitlets, so the table cannot drift from a release."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from traitlets import HasTraits

from hub_spawner.service import GPUBrokerService
from hub_spawner.spawner import GPUBrokerSpawner
from jupyter_gpubroker.runtime import GPUBroker
from jupyter_gpubroker.server.app import GPUBrokerExtension
from jupyter_gpubroker.server.provisioner import GPUProvisioner
from jupyter_gpubroker.wire.sizes import parse_duration

ROOT = Path(__file__).resolve().parents[2]
CLASSES: dict[str, type[HasTraits]] = {
    c.__name__: c
    for c in (GPUBroker, GPUProvisioner, GPUBrokerSpawner, GPUBrokerService, GPUBrokerExtension)
}
SPOKEN = re.compile(r"\((\d+) (s|min|h)\)")
"""A default as a person says it, beside the number: "(20 min)"."""


def rows() -> list[list[str]]:
    text = (ROOT / "docs" / "configuration.md").read_text()
    section = text.split("\n## Defaults\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]


def test_each_default_in_the_table_is_its_traits_default() -> None:
    found = rows()
    assert len(found) >= 20
    wrong = []
    for setting, default, why in found:
        cls, name = setting.strip("`").split(".")
        code = CLASSES[cls].class_traits(config=True)[name].default()
        shown = ast.literal_eval(default.split("`")[1])
        if (shown, type(shown) is bool) != (code, type(code) is bool):
            wrong.append(f"{setting}: the table says {shown!r}, the code {code!r}")
        spoken = SPOKEN.search(default)
        if spoken and parse_duration("".join(spoken.groups())) != code:
            wrong.append(f"{setting}: {spoken.group(0)} is not {code!r} s")
        assert why, setting
    assert wrong == []


def test_the_settings_a_hub_admin_must_decide_are_in_the_table() -> None:
    """docs/hub.md's list of what to decide names settings whose defaults the table gives."""
    hub = (ROOT / "docs" / "hub.md").read_text()
    decide = hub.split("\n## What you must decide\n", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`c\.(\w+\.\w+)`", decide))
    tabled = {setting.strip("`") for setting, _, _ in rows()}
    assert {"GPUBroker.server_idle_timeout", "GPUBroker.default_time_limit"} <= named
    assert named - tabled == set()
