"""The example hub as a newcomer meets it: started exactly as the quick start says, from
the checkout, then two users and the admin in Chromium. Ann gets the last free slice;
Bob's start waits in the queue, and his spawn page says so once, in plain words, with an
ETA it can justify or a plain "unknown"; the admin sees him waiting; when Ann stops her
server, Bob's starts."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from live_hub import EXAMPLE_COMMAND, ROOT, SERVICE, example_ports, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.hub,
]

URL = "http://127.0.0.1:8000"
API = f"{URL}/services/{SERVICE}/api/v1"
WAIT_MS = 180_000
SLICE = {"profile": "1g.10gb"}
EXCEPTION_NAME = re.compile(r"\b[A-Z]\w*(Error|Exception)\b")


class Example:
    """The example hub's process and an admin's hub API token made through its login."""

    def __init__(self, run: Path, log: Path) -> None:
        env = {**os.environ, "HOME": str(run.parent), "GPUBROKER_EXAMPLE_DIR": str(run)}
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                EXAMPLE_COMMAND.split(), cwd=ROOT, env=env, stdout=out, stderr=out
            )
        wait_for("the broker service", lambda: _status(f"{API}/me") == 403, 120, log)
        admin = requests.Session()
        admin.get(f"{URL}/hub/login", timeout=30)
        xsrf = admin.cookies.get("_xsrf", path="/hub/")
        login = {"username": "admin", "password": "any", "_xsrf": xsrf}
        assert admin.post(f"{URL}/hub/login", data=login, timeout=30).ok
        made = admin.post(
            f"{URL}/hub/api/users/admin/tokens",
            json={"note": "test"},
            headers={"X-XSRFToken": admin.cookies.get("_xsrf", path="/hub/") or ""},
            timeout=30,
        )
        assert made.status_code == 201, made.text
        self.admin_token = made.json()["token"]

    def hub(self, method: str, path: str, body: Any = None) -> requests.Response:
        return requests.request(
            method,
            f"{URL}/hub/api/{path}",
            json=body,
            headers={"Authorization": f"token {self.admin_token}"},
            timeout=30,
        )

    def token(self, name: str) -> str:
        """A new hub API token of ``name``, made a hub user first."""
        if self.hub("GET", f"users/{name}").status_code == 404:
            assert self.hub("POST", f"users/{name}").status_code == 201
        made = self.hub("POST", f"users/{name}/tokens", {"note": "test"})
        assert made.status_code == 201, made.text
        return str(made.json()["token"])

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def broker(token: str, method: str, path: str, body: Any = None) -> Any:
    """The JSON of a broker call that must succeed."""
    answer = requests.request(
        method, f"{API}/{path}", json=body, headers={"Authorization": f"token {token}"}, timeout=30
    )
    assert answer.status_code in (200, 201, 204), f"{method} {path}: {answer.text}"
    return answer.json() if answer.content else None


def _status(url: str) -> int | None:
    try:
        return requests.get(url, timeout=10).status_code
    except requests.ConnectionError:
        return None


@pytest.fixture
def example(tmp_path: Path, proxy: None) -> Iterator[Example]:
    with example_ports():
        running = Example(tmp_path / "run", tmp_path / "hub.log")
        try:
            yield running
        finally:
            running.stop()


def log_in(browser: Any, name: str) -> Any:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{URL}/hub/login")
    page.fill("#username_input", name)
    page.fill("#password_input", "any")
    page.click("#login_submit")
    page.wait_for_load_state()
    return page


def start_a_slice(page: Any) -> None:
    page.goto(f"{URL}/hub/spawn")
    page.locator("fieldset.gpubroker-options").wait_for(timeout=WAIT_MS)
    page.check("#gpu-profile")
    page.get_by_role("button", name="Start").click()


def test_two_users_and_the_admin_on_the_example_hub_read_plain_queue_words(
    example: Example, browser: Any
) -> None:
    admin = example.admin_token
    # Leave one free 1g.10gb slice: seven GPUs drained, six slices of the eighth held.
    gpus = broker(admin, "GET", "devices")["gpus"]
    for gpu in gpus[1:]:
        broker(admin, "POST", f"devices/{gpu['uuid']}/drain", {"reason": "test"})
    filler = example.token("filler")
    leases = [broker(filler, "POST", "requests", SLICE)["lease"]["id"] for _ in range(6)]
    stop = threading.Event()

    def renew() -> None:  # the filler's leases live as long as the test
        while not stop.wait(20):
            for lease in leases:
                broker(filler, "POST", f"leases/{lease}/renew")

    renewer = threading.Thread(target=renew, daemon=True)
    renewer.start()
    try:
        ann = log_in(browser, "ann")
        ann.goto(f"{URL}/hub/home")
        ann.get_by_role("button", name="Services").or_(ann.get_by_text("Services")).first.click()
        menu = ann.locator(".dropdown-menu a.dropdown-item")
        assert menu.all_inner_texts() == ["GPUs"]  # the service's title, not its URL name
        start_a_slice(ann)
        ann.wait_for_url("**/user/ann/**", timeout=WAIT_MS)  # granted, and her Lab opened

        bob = log_in(browser, "bob")
        start_a_slice(bob)
        message = bob.locator("#progress-message")
        message.get_by_text("position 1 of 1").wait_for(timeout=WAIT_MS)
        said = message.inner_text()
        assert said.startswith("Waiting for 1g.10gb (interactive)"), said
        assert said.count("position") == 1, said
        assert not EXCEPTION_NAME.search(said), said
        # a new hub has seen no session end: the ETA rests on the example's typical hold
        # (gpubroker_config.py), and says so
        assert re.search(r"ETA \d{1,2}:\d\d \(.*\), from the usual session length", said), said

        boss = log_in(browser, "admin")
        boss.goto(f"{URL}/services/{SERVICE}/admin")
        queued = boss.locator("tr.gpubroker-queued")
        queued.first.wait_for(timeout=WAIT_MS)
        assert "bob" in queued.first.inner_text()

        assert example.hub("DELETE", "users/ann/server").status_code in (202, 204)
        bob.wait_for_url("**/user/bob/**", timeout=WAIT_MS)  # Ann's slice went to Bob
    finally:
        stop.set()
        renewer.join(timeout=30)
        for name in ("ann", "bob"):
            example.hub("DELETE", f"users/{name}/server")
