"""A hub's whole GPU broker setup in one call: ``configure(c, ...)`` in jupyterhub_config.py.

    from hub_spawner import configure

    c = get_config()
    configure(c, broker_config="/etc/gpubroker/gpubroker_config.py", admin_users=["alice"])

fills ``c`` with everything the docs' long form (docs/hub.md, *Permissions*)
spells out by hand: the broker service's entry in ``c.JupyterHub.services`` (run by its
supervisor, which starts it again at once if it dies), its custom
scopes, the roles that grant them, the scopes of single-user servers' tokens, the
servers' ``$GPUBROKER_URL``, the GPU spawner and the idle-server announcement. Each part
is an argument; anything set on ``c`` after the call wins, as usual in a config file.
What ``c`` already holds before the call is kept: roles, services and scopes are added
to (a role or service of the same name is replaced), the environment is merged.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

USE_SCOPE = "custom:gpubroker:use"  # as hub_spawner.hubauth, without importing JupyterHub
ADMIN_SCOPE = "custom:gpubroker:admin"

HUB_TEMPLATES = str(Path(__file__).with_name("hub_templates"))
"""Our extension of the hub's page.html (the Services menu's titles)."""

SUPERVISOR = "hub_spawner.supervisor"
"""The module a supervised service runs (``python -m``), with the service's options."""

ENGINE_ENV = ("SLURM_CONF", "KUBECONFIG")
"""The hub's environment the broker's engines read (Slurm's commands, the Kubernetes
client), passed to the service: JupyterHub gives a managed service only a few variables
of its own (PATH, PYTHONPATH, LANG, ...), so a cluster whose config is not at its default
place would be unreachable from the broker though the hub reaches it."""

SERVER_ROLE_DEFAULTS = ["users:activity!user", "access:servers!server"]
"""The scopes of JupyterHub's default 'server' role, which ``server_token_scopes`` replaces."""


def configure(
    c: Any,
    *,
    broker_config: str | None = None,
    state_file: str | None = None,
    run_dir: str | None = None,
    admin_users: Iterable[str] = (),
    name: str = "gpubroker",
    url: str = "http://127.0.0.1:10101",
    spawner: str | None = "hub_spawner.spawner.GPUBrokerSpawner",
    service_args: Iterable[str] = (),
    announcement: bool = True,
    display: bool = True,
    title: str | None = "GPUs",
    supervised: bool = True,
) -> dict[str, Any]:
    """Fill the hub config ``c`` for one GPU broker service shared by every user.

    ``broker_config``: the service's ``c.GPUBroker.*`` file (``--config``); ``state_file``:
    its state (default: the service's own, in the Jupyter data dir of the hub's user);
    ``run_dir``: a directory (made if missing) for what the hub and the broker write: its
    database, cookie secret, the proxy's pid file and the broker's state (default: the hub
    writes into the directory it starts in, as JupyterHub does). ``admin_users``: who
    administers the broker (``custom:gpubroker:admin``: everyone's requests, leases and
    quotas); every user may use it (``custom:gpubroker:use``).
    ``name`` and ``url``: the service's name and where it listens. ``spawner``: the hub's
    ``spawner_class`` (``None`` leaves it); ``service_args``: more command-line options of
    the service (``--GPUBroker.simulate=dgx-h100-mig``). ``announcement``: the hub's
    pages warn of an idle GPU server and say why one was stopped. ``title``: what the
    hub's Services menu calls the service (JupyterHub itself shows its URL name).
    ``supervised``: the service runs under ``hub_spawner.supervisor``, which starts it
    again at once if it dies (``False``: the hub does, at its next poll, up to 30 s
    later). Returns the service's entry (also in ``c.JupyterHub.services``), to change
    further.
    """
    access = f"access:services!service={name}"
    if run_dir:
        run = Path(run_dir)
        run.mkdir(parents=True, exist_ok=True)
        c.JupyterHub.db_url = f"sqlite:///{run / 'jupyterhub.sqlite'}"
        c.JupyterHub.cookie_secret_file = str(run / "jupyterhub_cookie_secret")
        c.ConfigurableHTTPProxy.pid_file = str(run / "jupyterhub-proxy.pid")
        state_file = state_file or str(run / "gpubroker.sqlite")
    command = [sys.executable, "-m", SUPERVISOR if supervised else "hub_spawner.service"]
    if broker_config:
        command.append(f"--config={broker_config}")
    command += list(service_args)
    if state_file:
        command.append(f"--GPUBroker.state_file={state_file}")
    service = {
        "name": name,
        "url": url,
        "command": command,
        "display": display,  # in the hub's Services menu: My GPUs, and the admin page
        "oauth_no_confirm": True,  # the admin deployed it: no consent page
        "oauth_client_allowed_scopes": [USE_SCOPE, ADMIN_SCOPE],  # what a user holds of them
    }
    if passed := {k: os.environ[k] for k in ENGINE_ENV if k in os.environ}:
        service["environment"] = passed
    hub = c.JupyterHub
    hub.services = _replace_by_name(_list(hub, "services"), [service])
    hub.custom_scopes = {
        **_dict(hub, "custom_scopes"),
        USE_SCOPE: {"description": "Request, hold and release GPUs through the GPU broker."},
        ADMIN_SCOPE: {
            "description": "Administer the GPU broker: everyone's requests and leases, quotas.",
            "subscopes": [USE_SCOPE],
        },
    }
    roles = [
        {"name": "user", "scopes": ["self", access, USE_SCOPE]},
        {"name": f"{name}-admin", "scopes": [ADMIN_SCOPE], "users": sorted(admin_users)},
        # the service reads the hub groups of users whose kernels call it with kernel
        # tokens, and which servers run (a restarted service frees the leases of the others)
        {
            "name": f"{name}-service",
            "scopes": ["read:users:groups", "read:servers"],
            "services": [name],
        },
    ]
    hub.load_roles = _replace_by_name(_list(hub, "load_roles"), roles)
    # single-user servers reach the service with their own token: it carries the scopes
    # their user holds (the admin scope only on the admins' servers)
    c.Spawner.server_token_scopes = [*SERVER_ROLE_DEFAULTS, access, USE_SCOPE, ADMIN_SCOPE]
    c.Spawner.environment = {
        **_dict(c.Spawner, "environment"),
        "GPUBROKER_URL": f"{url.rstrip('/')}/services/{name}/api/v1",
    }
    if spawner:
        hub.spawner_class = spawner
        c.GPUBrokerSpawnerMixin.gpubroker_service = name  # where the spawner asks for GPUs
    template_vars = _dict(hub, "template_vars")
    if announcement:
        from hub_spawner.culling import gpu_announcement

        template_vars["announcement"] = gpu_announcement
    if display and title:
        # the hub's page.html, extended to show service_titles in its Services menu; after
        # the admin's own template paths, so a page.html of theirs still wins
        template_vars["service_titles"] = {**template_vars.get("service_titles", {}), name: title}
        hub.template_paths = [*_list(hub, "template_paths"), HUB_TEMPLATES]
    if template_vars:
        hub.template_vars = template_vars
    return service


def _list(section: Any, key: str) -> list[Any]:
    value = section.get(key) if hasattr(section, "get") else None
    return list(value) if isinstance(value, list) else []


def _dict(section: Any, key: str) -> dict[str, Any]:
    value = section.get(key) if hasattr(section, "get") else None
    return dict(value) if isinstance(value, dict) else {}


def _replace_by_name(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[Any]:
    names = {entry["name"] for entry in new}
    return [entry for entry in old if entry.get("name") not in names] + new
