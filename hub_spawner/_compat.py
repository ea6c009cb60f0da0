"""What the spawners need from JupyterHub that its oldest supported release (5.1) lacks."""

from __future__ import annotations

try:
    from jupyterhub.spawner import SpawnException
except ImportError:  # JupyterHub < 6.0
    from tornado import web

    class SpawnException(web.HTTPError):  # type: ignore[no-redef]
        """JupyterHub 6's ``SpawnException``: a spawn refused by policy, shown to the user
        as its message (5.x reads ``jupyterhub_message``), with its HTTP status."""

        def __init__(
            self,
            message: str,
            *,
            reason: str,
            log_message: str = "",
            message_html: str = "",
            status_code: int = 400,
        ) -> None:
            self.message = message
            self.reason = reason
            self.message_html = message_html
            if message_html:
                self.jupyterhub_html_message = message_html
            self.status_code = status_code
            # tornado's log_message is a read-only property (6.5): it gives what is set here
            super().__init__(status_code, log_message or message, reason=reason)

        @property
        def jupyterhub_message(self) -> str:
            return self.message


__all__ = ["SpawnException"]
