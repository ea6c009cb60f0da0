"""The broker commands of `jupyter gpubroker`, run as a user would, against a real server."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from jupyter_gpubroker.api import API_PREFIX


@pytest.fixture
def cli(jp_serverapp, jp_http_port, jp_base_url):  # type: ignore[no-untyped-def]
    """Run `jupyter gpubroker ...` in a subprocess against the test server."""
    url = f"http://localhost:{jp_http_port}{jp_base_url}{API_PREFIX}"
    token = jp_serverapp.identity_provider.token

    async def run(*args: str, json_out: bool = True) -> tuple[int, object, str]:
        argv = [sys.executable, "-m", "jupyter_gpubroker.cli", *args[:1], "--url", url]
        argv += ["--token", token, *(["--json"] if json_out else []), *args[1:]]
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await proc.communicate()
        text = out.decode()
        data = json.loads(text) if json_out and proc.returncode == 0 else text
        return proc.returncode or 0, data, err.decode()

    return run


async def test_request_then_release(cli, api):  # type: ignore[no-untyped-def]
    code, r, _ = await cli("request", "1g.10gb")
    assert code == 0 and r["state"] == "granted"
    (device,) = r["lease"]["devices"]
    code, text, _ = await cli("request", "1g.10gb", json_out=False)
    assert code == 0 and text.startswith("CUDA_VISIBLE_DEVICES=MIG-") and device not in text

    code, released, _ = await cli("release", r["lease"]["id"])
    assert code == 0 and released["state"] == "released"
    _, leases = await api("GET", "leases")
    assert device not in [d for x in leases["leases"] for d in x["devices"]]


async def test_queued_request_shows_in_the_queue_and_is_granted_on_release(cli, api):  # type: ignore[no-untyped-def]
    leases = []
    for _ in range(7):
        _, r = await api("POST", "requests", {"profile": "1g.10gb"})
        leases.append(r["lease"]["id"])
    code, r, _ = await cli("request", "1g.10gb", "--no-wait", "--class", "batch")
    assert code == 0 and r["state"] == "queued" and r["position"] == 1

    code, queue, _ = await cli("queue")
    assert [(e["position"], e["id"], e["job_class"]) for e in queue] == [(1, r["id"], "batch")]
    code, table, _ = await cli("queue", json_out=False)
    assert "1g.10gb" in table and "1 waiting" in table

    await api("DELETE", f"leases/{leases[0]}")
    _, after = await api("GET", f"requests/{r['id']}")
    assert after["state"] == "granted"


async def test_run_holds_a_slice_for_the_command_and_releases_it(cli, api):  # type: ignore[no-untyped-def]
    script = "import os, sys; print(os.environ['CUDA_VISIBLE_DEVICES']); sys.exit(3)"
    code, out, _ = await cli("run", "1g.10gb", "--", sys.executable, "-c", script, json_out=False)
    assert code == 3  # the command's own exit status
    assert out.strip().startswith("MIG-")
    _, leases = await api("GET", "leases")
    assert leases["leases"] == []


async def test_bad_input_is_one_clear_line(cli):  # type: ignore[no-untyped-def]
    code, _, err = await cli("request", "9g.99gb")
    assert code == 1 and err.startswith("error: unknown MIG profile '9g.99gb'")
    code, _, err = await cli("request", "2")
    assert code == 1 and "whole GPU" in err
    code, _, err = await cli("release", "l-nope")
    assert code == 1 and "no lease 'l-nope'" in err
