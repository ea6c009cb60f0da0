"""Who an API call speaks for, as every host hands it to the API layer (``api.rules``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Identity:
    """A caller: a user, the groups it belongs to, whether it is an admin and, for a
    kernel-scoped token, the kernel it is bound to (it acts only on that kernel's
    requests and is never an admin).

    A host builds it from its own auth (the jupyter-server extension from the server's
    identity provider and ``c.GPUBroker.*``; the hub service fills ``groups`` and ``admin``
    from JupyterHub's user model and scopes) with ``BrokerAPI.identify``."""

    user: str
    groups: tuple[str, ...] = ()
    admin: bool = False
    kernel_id: str | None = None
