"""The jupyter-server host of the broker API: who calls, and whether they may use it.

``handlers(JupyterHost)`` (``server.handlers``) binds the API's handlers to it; the hub
service binds them to its own host (``hub_spawner.service.HubHost``).
"""

from __future__ import annotations

from typing import Any

from jupyter_server.auth.decorator import authorized as jupyter_authorized
from jupyter_server.auth.identity import User
from jupyter_server.base.handlers import APIHandler
from tornado import web

from .handlers import broker_errors


class JupyterHost(APIHandler):
    """The jupyter-server host: the caller is the server's identity provider's user (a
    Jupyter token, or the login cookie with its XSRF check) or a kernel token's; it may
    use the broker when the server's authorizer allows it on resource ``gpubroker``."""

    auth_resource = "gpubroker"

    @broker_errors
    async def prepare(self) -> None:
        if not self.check_host():  # jupyter-server's DNS-rebinding guard, for kernel tokens too
            raise web.HTTPError(403, "the Host header does not name this server")
        who = self.kernel_caller()  # type: ignore[attr-defined]
        if who is None:
            await super().prepare()
            user = self.current_user
            if user is not None:
                self.who = self.api.user_identity(user.username)  # type: ignore[attr-defined]
            return
        self.who = who
        self.current_user = self._jupyter_current_user = User(username=who.user)

    async def authorize(self) -> None:
        await jupyter_authorized(_nothing)(self)


async def _nothing(handler: Any) -> None:
    """What ``authorize`` lets jupyter-server's own ``@authorized`` guard."""
