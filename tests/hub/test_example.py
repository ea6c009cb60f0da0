"""The example hub, started exactly as its docs say, from the checkout, as whoever runs
the tests (root in CI and in containers): a user logs in and starts a server, and the
checkout is left as it was."""

from __future__ import annotations

import ast
import io
import os
import signal
import subprocess
import tokenize
from pathlib import Path

import requests
from live_hub import EXAMPLE, ROOT, SERVICE, example_ports, wait_for
from live_hub import EXAMPLE_COMMAND as COMMAND

URL = "http://127.0.0.1:8000"


def test_the_example_hub_starts_a_users_server_and_writes_nothing_into_the_checkout(
    tmp_path: Path, proxy: None
) -> None:
    for doc in ("README.md", "docs/quickstart.md"):
        assert f"```bash\n{COMMAND}\n```" in (ROOT / doc).read_text()
    assert EXAMPLE.relative_to(ROOT).as_posix() in COMMAND
    before = set(ROOT.iterdir())
    run = tmp_path / "run"
    env = {**os.environ, "HOME": str(tmp_path), "GPUBROKER_EXAMPLE_DIR": str(run)}
    log = tmp_path / "hub.log"
    with example_ports():
        _run_the_example(env, log)
    assert {p.name for p in set(ROOT.iterdir()) - before} == set()
    assert {"jupyterhub.sqlite", "jupyterhub_cookie_secret", "gpubroker.sqlite"} <= {
        p.name for p in run.iterdir()
    }


def _run_the_example(env: dict[str, str], log: Path) -> None:
    with log.open("ab") as out:
        hub = subprocess.Popen(COMMAND.split(), cwd=ROOT, env=env, stdout=out, stderr=out)
    try:
        wait_for(
            "the broker service",
            lambda: _answers(f"{URL}/services/{SERVICE}/api/v1/me") == 403,
            log=log,
        )
        s = requests.Session()
        s.get(f"{URL}/hub/login", timeout=30)
        xsrf = s.cookies.get("_xsrf", path="/hub/")
        assert s.post(
            f"{URL}/hub/login", data={"username": "ann", "password": "x", "_xsrf": xsrf}, timeout=30
        ).ok
        choice = {"gpu_kind": "cpu", "_xsrf": s.cookies.get("_xsrf", path="/hub/")}
        started = s.post(f"{URL}/hub/spawn", data=choice, timeout=120)
        assert started.ok, started.text
        wait_for("ann's server", lambda: _answers(f"{URL}/user/ann/api", s) == 200, 180, log)
    finally:
        hub.send_signal(signal.SIGTERM)
        try:
            hub.wait(timeout=60)
        except subprocess.TimeoutExpired:
            hub.kill()
            hub.wait()


def _answers(url: str, session: requests.Session | None = None) -> int | None:
    try:
        return (session or requests).get(url, timeout=10).status_code
    except requests.ConnectionError:
        return None


def code_lines(path: Path) -> int:
    """Lines that hold code: not blank, not only a comment, not the docstring."""
    tree = ast.parse(path.read_text())
    doc = tree.body[0]
    skip = set(range(doc.lineno, doc.end_lineno + 1)) if isinstance(doc, ast.Expr) else set()
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if token.type not in (
            tokenize.COMMENT,
            tokenize.NL,
            tokenize.NEWLINE,
            tokenize.INDENT,
            tokenize.DEDENT,
            tokenize.ENDMARKER,
        ):
            lines.add(token.start[0])
    return len(lines - skip)


def test_the_example_config_is_as_short_as_the_readmes_way_of_writing_one() -> None:
    """It took 27 lines of code where a config written the README's way takes 15: a
    newcomer copies the example."""
    assert code_lines(EXAMPLE) <= 20
