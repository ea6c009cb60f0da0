"""``hub_spawner.configure``: a hub's whole broker setup in one call, as the README's long
form writes it by hand, accepted by JupyterHub, and overridable."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from jupyterhub import scopes
from jupyterhub.app import JupyterHub
from traitlets.config import Config

from hub_spawner import configure
from hub_spawner.spawner import SimpleGPUBrokerSpawner

ROOT = Path(__file__).resolve().parents[2]


def long_form() -> Config:
    """The docs' hand-written hub config (docs/hub.md, *Permissions*)."""
    readme = (ROOT / "docs" / "hub.md").read_text()
    block = re.search(
        r"```python\n(import sys\n\nc\.JupyterHub\.custom_scopes.*?)```", readme, re.S
    )
    assert block, "the docs' long form"
    c = Config()
    exec(block.group(1), {"c": c, "sys": sys})
    return c


def test_configure_fills_in_what_the_long_form_writes_by_hand() -> None:
    c = Config()
    service = configure(
        c,
        broker_config="/etc/gpubroker/gpubroker_config.py",
        admin_users=["alice"],
        spawner=None,
        announcement=False,
        title=None,
    )
    hand = long_form()
    assert c.JupyterHub.services == [service]
    assert {k: service[k] for k in hand.JupyterHub.services[0]} == hand.JupyterHub.services[0]
    assert c.JupyterHub.load_roles == hand.JupyterHub.load_roles
    assert c.Spawner.server_token_scopes == hand.Spawner.server_token_scopes
    assert c.Spawner.environment == hand.Spawner.environment
    assert {k: v.get("subscopes") for k, v in c.JupyterHub.custom_scopes.items()} == {
        k: v.get("subscopes") for k, v in hand.JupyterHub.custom_scopes.items()
    }
    assert "spawner_class" not in c.JupyterHub and "template_vars" not in c.JupyterHub


def test_the_hub_accepts_what_configure_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    c = Config()
    configure(c, state_file="/var/lib/gpubroker.sqlite", admin_users={"admin"})
    hub = JupyterHub(config=c)  # the traits validate
    assert hub.spawner_class is not None and hub.template_vars["announcement"]
    # the Services menu reads the service's title, from our extension of the hub's page
    assert hub.template_vars["service_titles"] == {"gpubroker": "GPUs"}
    assert (Path(hub.template_paths[-1]) / "page.html").is_file()
    monkeypatch.setattr(scopes, "scope_definitions", dict(scopes.scope_definitions))
    scopes.define_custom_scopes(hub.custom_scopes)  # as the hub does at its start
    for role in hub.load_roles:
        scopes._check_scopes_exist(role["scopes"], f"role {role['name']}")
    (service,) = hub.services
    scopes._check_scopes_exist(service["oauth_client_allowed_scopes"])
    assert service["command"][-1] == "--GPUBroker.state_file=/var/lib/gpubroker.sqlite"
    spawner = SimpleGPUBrokerSpawner(config=c)
    scopes._check_scopes_exist(spawner.server_token_scopes)
    assert spawner.environment["GPUBROKER_URL"].endswith("/services/gpubroker/api/v1")
    assert spawner.gpubroker_service == "gpubroker"


def test_arguments_and_later_settings_win_and_earlier_ones_are_kept() -> None:
    c = Config()
    c.JupyterHub.load_roles = [{"name": "ops", "scopes": ["admin:users"], "users": ["olga"]}]
    c.Spawner.environment = {"TZ": "UTC"}
    configure(
        c, name="gpus", url="http://10.0.0.2:9000", service_args=["--GPUBroker.simulate=dgx-h100"]
    )
    c.Spawner.environment["GPUBROKER_URL"] = "http://elsewhere/api/v1"  # set after: it wins
    c.JupyterHub.services[0]["display"] = False
    assert [r["name"] for r in c.JupyterHub.load_roles] == [
        "ops",
        "user",
        "gpus-admin",
        "gpus-service",
    ]
    assert "access:services!service=gpus" in c.JupyterHub.load_roles[1]["scopes"]
    assert c.Spawner.environment == {"TZ": "UTC", "GPUBROKER_URL": "http://elsewhere/api/v1"}
    (service,) = c.JupyterHub.services
    assert service["name"] == "gpus" and service["url"] == "http://10.0.0.2:9000"
    assert "--GPUBroker.simulate=dgx-h100" in service["command"] and not service["display"]
    assert SimpleGPUBrokerSpawner(config=c).gpubroker_service == "gpus"


def test_the_service_runs_under_its_supervisor_unless_told_not_to() -> None:
    supervised, alone = Config(), Config()
    configure(supervised, broker_config="/etc/b.py")
    configure(alone, broker_config="/etc/b.py", supervised=False)
    commands = [c.JupyterHub.services[0]["command"] for c in (supervised, alone)]
    assert commands == [
        [sys.executable, "-m", "hub_spawner.supervisor", "--config=/etc/b.py"],
        [sys.executable, "-m", "hub_spawner.service", "--config=/etc/b.py"],
    ]


def test_the_hubs_cluster_config_reaches_the_service(monkeypatch: pytest.MonkeyPatch) -> None:
    """JupyterHub passes a managed service only a few of its variables: the broker on a
    Slurm cluster whose config is not /etc/slurm's could not reach it (found on a machine
    with none there)."""
    monkeypatch.setenv("SLURM_CONF", "/var/lib/lab-slurm/slurm.conf")
    monkeypatch.delenv("KUBECONFIG", raising=False)
    service = configure(Config(), broker_config="/etc/b.py")
    assert service["environment"] == {"SLURM_CONF": "/var/lib/lab-slurm/slurm.conf"}
    monkeypatch.delenv("SLURM_CONF")
    assert "environment" not in configure(Config(), broker_config="/etc/b.py")
