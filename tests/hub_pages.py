"""The hub's page templates rendered outside a hub, as its handlers would with no user
logged in and no XSRF token, for tests that read the HTML."""

from __future__ import annotations

from typing import Any

from hub_spawner.pages import _env


def render(template: str, view: dict[str, Any], **extra: Any) -> str:
    return _env.get_template(template).render(
        who=None,
        hub_prefix="/hub/",
        static=str,
        url=lambda *p: "/".join(p),
        xsrf_form_html=lambda: "",
        flash="",
        **extra,
        **view,
    )
