"""The API of a server whose broker could not start: every route says why, as a 503.

Without it the routes would be missing (HTML 404s) and the reason would be one
log line among many; with it every front (the Lab panel, the CLI, ``%gpu``)
shows the sentence that names the state file, the cause and what to do.
"""

from __future__ import annotations

import json

from jupyter_server.base.handlers import APIHandler

from ..api import API_PREFIX

NO_GPUS = "this server has no GPUs: its host has no NVIDIA driver"
"""What a host without GPUs says: the API (and so the Lab panel) and ``%gpu`` alike."""


class BrokerUnavailableHandler(APIHandler):
    """Answers every method under the API prefix with 503 ``broker_unavailable``."""

    auth_resource = "gpubroker"

    def initialize(self, message: str) -> None:
        self.message = message

    async def prepare(self) -> None:  # type: ignore[override]
        await super().prepare()
        self.set_header("Content-Type", "application/json")
        if self.current_user is None:  # the reason names local files: only for users
            self.set_status(403)
            self.finish(json.dumps({"error": "http_403", "message": "Forbidden"}))
            return
        self.set_status(503)
        self.finish(json.dumps({"error": "broker_unavailable", "message": self.message}))


def unavailable_handlers(message: str) -> list[tuple[str, type[APIHandler], dict[str, str]]]:
    return [(f"/{API_PREFIX}(?:/.*)?", BrokerUnavailableHandler, {"message": message})]
