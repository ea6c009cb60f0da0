"""The admin page's time-limit section, rendered from a real broker as the page renders it
(``admin_view``), and its form actions as the page calls them (``ACTIONS``): limits typed
in words, a bad value refused next to its field with nothing changed, and what the spawn
form then tells a user. The whole page in a real hub and browser: tests/ui/test_hub_pages.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bs4 import BeautifulSoup
from hub_pages import render as render_page
from traitlets.config import Config

from hub_spawner.options import Choices
from hub_spawner.pages import ACTIONS, _span, admin_view
from jupyter_gpubroker.api.rules import BrokerAPI
from jupyter_gpubroker.runtime import GPUBroker
from jupyter_gpubroker.wire.errors import InvalidRequest
from jupyter_gpubroker.wire.sizes import parse_duration


@pytest.fixture
def api(tmp_path: Path) -> Iterator[BrokerAPI]:
    c = Config()
    c.GPUBroker.simulate = "dgx-h100-mig:1"
    c.GPUBroker.state_file = str(tmp_path / "state.sqlite")
    c.GPUBroker.max_time_limit = {"batch": "2d"}
    rt = GPUBroker(config=c)
    rt.start()
    try:
        yield BrokerAPI(rt)
    finally:
        rt.stop()


def render(api: BrokerAPI, failed: dict[str, Any] | None = None) -> BeautifulSoup:
    view = admin_view(api, api.identify(api.runtime.owner), 30, "1970-01-01T00:00:00Z", None)
    html = render_page("admin.html", view, failed=failed)
    return BeautifulSoup(html, "html.parser").find(id="limits")


def fields(row: Any) -> dict[str, str]:
    return {i["name"]: i.get("value", "") for i in row.select("input.gpubroker-num")}


def test_limits_typed_in_words_are_set_and_shown_so(api: BrokerAPI) -> None:
    admin = api.identify(api.runtime.owner)
    form = {"form_id": "limits-new", "kind": "group", "name": "lab", "default_s": "90min"}
    done = ACTIONS["admin"]["limits"](api, admin, {**form, "max_s": "4h", "required": "1"})
    assert done == "The time limits of group lab are set."
    section = render(api)
    batch = section.select_one('tr[data-limit="class:batch"]')
    assert fields(batch) == {"default_s": "", "max_s": "2d"}
    assert "configuration" in batch.get_text() and "Reset" not in batch.get_text()
    lab = section.select_one('tr[data-limit="group:lab"]')
    assert fields(lab) == {"default_s": "1h30m", "max_s": "4h"}
    assert lab.find("input", attrs={"name": "required"}).has_attr("checked")
    assert "this page" in lab.get_text() and "Reset" in lab.get_text()
    assert ACTIONS["admin"]["limits-delete"](api, admin, {"kind": "group", "name": "lab"}) == (
        "group lab is back on the configured time limits."
    )
    assert render(api).select_one('tr[data-limit="group:lab"]') is None


def test_a_bad_limit_is_refused_next_to_its_field_and_nothing_changes(api: BrokerAPI) -> None:
    admin = api.identify(api.runtime.owner)
    before = api.limits(admin)
    form = {"form_id": "limits-class-batch", "kind": "class", "name": "batch"}
    for typed, field, words in (
        ({"default_s": "a while"}, "default_s", "the default time limit must be a number of"),
        ({"max_s": "-2h"}, "max_s", "the maximum time limit must be a number of seconds"),
        ({"default_s": "3d", "max_s": "2d"}, "default_s", "the default time limit of 72 h 00"),
    ):
        with pytest.raises(InvalidRequest) as bad:
            ACTIONS["admin"]["limits"](api, admin, {**form, **typed})
        assert bad.value.message.startswith(words), bad.value.message
        assert set(bad.value.fields) == {field}
        failed = {"action": "limits", "form": {**form, **typed}, "fields": bad.value.fields}
        row = render(api, failed).select_one('tr[data-limit="class:batch"]')
        shown = row.find("input", attrs={"name": field})
        assert "is-invalid" in shown["class"] and shown["value"] == typed[field]  # kept to fix
        assert row.select_one(".invalid-feedback").get_text().startswith(words)
    assert api.limits(admin) == before


@pytest.mark.parametrize("seconds", [1.0, 59.0, 60.0, 5400.0, 86400.0, 90061.0, 0.5, 7200.0])
def test_a_limit_shown_in_its_field_reads_back_as_itself(seconds: float) -> None:
    assert parse_duration(_span(seconds)) == seconds


def test_the_spawn_form_says_a_profiles_own_limit_where_it_is_tighter(api: BrokerAPI) -> None:
    """An admin's profile rule reaches the user's spawn form before they pick the profile,
    as the form renders from the broker's overview: once where it binds every class, per
    class where it binds only some, not at all once reset."""
    admin, user = api.identify(api.runtime.owner), api.user_identity("dana")

    def note() -> str:
        choices = Choices(api.overview(user), api.quotas(user)["quotas"])
        form = BeautifulSoup(choices.form(), "html.parser")
        return form.find(id="gpu-hours").find_next("span").get_text()

    assert "1g.10gb" not in note() and note().endswith("batch: at most 48 h 00 min")
    profile = {"form_id": "limits-new", "kind": "profile", "name": "1g.10gb"}
    ACTIONS["admin"]["limits"](api, admin, {**profile, "max_s": "4h"})
    assert note().endswith("batch: at most 48 h 00 min; a 1g.10gb slice: at most 4 h 00 min")
    ACTIONS["admin"]["limits"](api, admin, {**profile, "max_s": "3d"})  # above batch's 2 days
    assert note().endswith("; a 1g.10gb slice (interactive): at most 72 h 00 min")
    ACTIONS["admin"]["limits"](api, admin, {**profile, "default_s": "1h"})
    assert note().endswith("48 h 00 min; a 1g.10gb slice: 1 h 00 min if left empty")
    ACTIONS["admin"]["limits-delete"](api, admin, {"kind": "profile", "name": "1g.10gb"})
    assert "1g.10gb" not in note()
