"""What the service's API and pages and the spawner share about the hub: the broker's
scopes, the API's path, and the ``Identity`` of a hub user model."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jupyterhub.services.auth import HubOAuth, check_scopes
from tornado import web

from hub_spawner.hubconfig import ADMIN_SCOPE as ADMIN_SCOPE
from hub_spawner.hubconfig import USE_SCOPE as USE_SCOPE
from jupyter_gpubroker.api.identity import Identity

if TYPE_CHECKING:  # the spawner imports this module, in a hub that runs no broker
    from jupyter_gpubroker.api.rules import BrokerAPI

API_PATH = "api/v1"
"""The API's path under the service prefix."""


class HubAuthFromSettings:
    """The application's one ``HubOAuth`` (configured by the service), not a singleton."""

    settings: dict[str, Any]

    @property
    def hub_auth(self) -> HubOAuth:
        return self.settings["hub_auth"]


def has_scope(model: dict[str, Any], scope: str) -> bool:
    """Whether a hub user model's scopes grant ``scope``."""
    return bool(check_scopes(scope, set(model["scopes"])))


def check_user(model: dict[str, Any], hub_scopes: set[str] | None) -> None:
    """Refuse (403, saying what to grant) a hub credential without access to this service
    (``hub_scopes``) or that is not a user's."""
    kind, name = model.get("kind", "user"), model["name"]
    if hub_scopes and not check_scopes(hub_scopes, set(model["scopes"])):
        raise web.HTTPError(
            403,
            f"{kind} {name} has no access to this service: grant "
            f"{' or '.join(sorted(hub_scopes))} (c.JupyterHub.load_roles)",
        )
    if kind != "user":
        raise web.HTTPError(
            403,
            f"the GPU broker serves hub users, not {kind} {name}: call it with a user's token",
        )


def require_use(model: dict[str, Any]) -> None:
    """Refuse (403) a user without the broker's use scope."""
    if not has_scope(model, USE_SCOPE):
        raise web.HTTPError(
            403,
            f"{model['name']}'s hub credential lacks the {USE_SCOPE} scope: ask a hub "
            "admin to grant it (c.JupyterHub.load_roles), or use a token that has it",
        )


def hub_identity(api: BrokerAPI, model: dict[str, Any]) -> Identity:
    """The broker identity of a hub user: the hub's groups, admin by the admin scope."""
    return api.identify(
        model["name"], groups=model.get("groups") or (), admin=has_scope(model, ADMIN_SCOPE)
    )
