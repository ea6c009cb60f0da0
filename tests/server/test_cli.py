"""The broker commands of `jupyter gpubroker`, run as a user would, against a real server."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from typing import Any

import pytest

from jupyter_gpubroker.api import API_PREFIX


@pytest.fixture
def broker_config(broker_config: dict[str, Any]) -> dict[str, Any]:
    """Leases that outlive the CLI's starts: a command ends without renewing what it got,
    and each start of Python takes seconds on a loaded machine."""
    return {**broker_config, "lease_ttl": 30.0}


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


async def test_a_time_limit_in_words_reaches_the_lease(cli, api):  # type: ignore[no-untyped-def]
    code, r, _ = await cli("request", "1g.10gb", "--time", "1h30m")
    assert code == 0 and r["limit_s"] == 5400 and r["lease"]["limit_s"] == 5400
    code, text, _ = await cli("request", "1g.10gb", "--time", "2h", json_out=False)
    assert code == 0 and re.search(r"^# time limit ends at \d\d:\d\d$", text, re.M)
    code, _, err = await cli("request", "1g.10gb", "--time", "2 weeks")
    assert code == 2 and "argument --time: the time must be a number of seconds" in err
    script = "import sys; sys.exit(0)"
    code, _, err = await cli("run", "1g.10gb", "--time", "10min", "--", "true", json_out=False)
    assert code == 2 and "--time comes after the size: give options first" in err
    code, _, _ = await cli(
        "run", "--time", "10min", "1g.10gb", "--", sys.executable, "-c", script, json_out=False
    )
    assert code == 0
    _, leases = await api("GET", "leases")
    assert 7200 in [x["limit_s"] for x in leases["leases"]]


async def test_queued_request_shows_in_the_queue_and_is_granted_on_release(held, cli, api):  # type: ignore[no-untyped-def]
    async with held(api, 7) as full:
        code, r, _ = await cli("request", "1g.10gb", "--no-wait", "--class", "batch")
        assert code == 0 and r["state"] == "queued" and r["position"] == 1

        code, queue, _ = await cli("queue")
        assert [(e["position"], e["id"], e["job_class"]) for e in queue] == [(1, r["id"], "batch")]
        code, renewed, _ = await cli("renew", r["id"])  # a --no-wait request stays alive
        assert code == 0 and renewed["state"] == "queued"
        assert renewed["expires_at"] > r["expires_at"]
        code, table, _ = await cli("queue", json_out=False)
        assert "1g.10gb" in table and "1 waiting" in table
        # every slice held by a request that never ended one before: no ETA to give
        assert table.splitlines()[1].endswith(" unknown")

        await api("DELETE", f"leases/{full[0]['lease']['id']}")
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


async def test_ctrl_c_while_waiting_withdraws_the_request_in_one_line(held, start_cli, api):  # type: ignore[no-untyped-def]
    async with held(api, 7):
        proc = await start_cli("request", "1g.10gb", json_out=False)
        assert b"queued at position 1" in await proc.stderr.readline()
        proc.send_signal(signal.SIGINT)
        _, err = await proc.communicate()
    assert proc.returncode == 130
    assert re.fullmatch(r"interrupted: request r-\S+ withdrawn\n", err.decode())
    _, queue = await api("GET", "queue")
    assert queue["length"] == 0


async def test_a_wait_that_times_out_is_withdrawn(held, cli, api):  # type: ignore[no-untyped-def]
    async with held(api, 7):
        code, _, err = await cli("request", "1g.10gb", "--timeout", "0.5")
    assert code == 1
    assert err.endswith("still at position 1 in the queue; the request was withdrawn\n")
    _, queue = await api("GET", "queue")
    assert queue["length"] == 0


async def test_run_of_a_missing_command_says_so_and_gives_the_slice_back(cli, api):  # type: ignore[no-untyped-def]
    code, _, err = await cli("run", "1g.10gb", "--", "/nonexistent/cmd", json_out=False)
    assert code == 127
    assert err.strip() == "error: cannot run /nonexistent/cmd: No such file or directory"
    _, leases = await api("GET", "leases")
    assert leases["leases"] == []


async def test_run_stops_its_command_when_the_lease_is_lost(cli, api, tmp_path):  # type: ignore[no-untyped-def]
    pid_file = tmp_path / "pid"
    script = (
        f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    )
    running = asyncio.ensure_future(
        cli("run", "1g.10gb", "--", sys.executable, "-c", script, json_out=False)
    )
    while not pid_file.exists() or not pid_file.read_text():
        await asyncio.sleep(0.1)
    _, leases = await api("GET", "leases")
    (lease,) = leases["leases"]
    await api("DELETE", f"leases/{lease['id']}")  # ended by someone else (an admin, a reclaim)

    code, _, err = await running  # at once, not after the 600 s sleep
    assert code == 1
    assert f"error: lost lease {lease['id']} (" in err and "stopping the command" in err
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


async def test_a_wrong_token_or_url_says_what_to_check(cli, broker_url):  # type: ignore[no-untyped-def]
    code, _, err = await cli("queue", token="wrong")
    assert code == 1
    assert err.strip() == (
        f"error: the broker at {broker_url} refused the token: check --token or "
        "$GPUBROKER_JUPYTER_TOKEN, or the Jupyter server's token (jupyter server list)"
    )
    wrong = broker_url.replace("gpubroker/api/v1", "gpu/api")
    code, _, err = await cli("queue", url=wrong)
    assert code == 1
    assert err.strip() == f"error: no GPU broker at {wrong}: check --url (it ends in /{API_PREFIX})"


async def test_status_shows_the_running_servers_broker(held, cli, api, jp_serverapp, broker_url):  # type: ignore[no-untyped-def]
    jp_serverapp.write_server_info_file()  # what `jupyter server list` reads
    try:
        async with held(api) as (r,):
            for where in ({"url": broker_url}, {}):
                argv = [sys.executable, "-m", "jupyter_gpubroker.cli", "status", "--json"]
                if where:
                    argv += ["--url", broker_url, "--token", jp_serverapp.identity_provider.token]
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    env={**os.environ, "GPUBROKER_SIMULATE": ""},  # no local hardware to read
                )
                out, err = await proc.communicate()
                assert proc.returncode == 0, err
                report = json.loads(out)
                assert report["source"] == (
                    f"broker at {broker_url}"
                    if where
                    else f"broker of the Jupyter server at {broker_url}"
                )
                holders = {d["uuid"]: d["holder"] for g in report["gpus"] for d in g["devices"]}
                assert holders[r["lease"]["devices"][0]]["lease_id"] == r["lease"]["id"]
    finally:
        jp_serverapp.remove_server_info_file()


async def test_an_admin_drains_reclasses_and_reads_the_audit_log(cli, api):  # type: ignore[no-untyped-def]
    _, devices = await api("GET", "devices")
    gpu = devices["gpus"][0]["uuid"]
    code, drained, _ = await cli("drain", gpu, "--reason", "a fan")
    assert code == 0 and drained["drained"]["cause"] == "admin"
    _, waiting = await api("POST", "requests", {"profile": "1g.10gb", "job_class": "batch"})
    assert waiting["state"] == "queued"  # nothing is granted on a drained GPU
    code, text, _ = await cli("reclass", waiting["id"], "interactive", json_out=False)
    assert (code, text.strip()) == (0, f"request {waiting['id']} is interactive, at position 1")
    code, text, _ = await cli("undrain", gpu, "--reason", "fan replaced", json_out=False)
    assert (code, text.strip()) == (0, f"{gpu} takes grants again")
    code, _, err = await cli("undrain", gpu)
    assert (code, err.strip()) == (1, f"error: {gpu} is not drained")

    code, text, _ = await cli("audit", json_out=False)
    lines = text.splitlines()
    assert code == 0 and lines[-1] == "3 record(s)"
    assert [line.split()[2:4] for line in lines[1:-1]] == [
        ["drain", gpu],
        ["set_class", waiting["id"]],
        ["undrain", gpu],
    ]
    assert lines[1].endswith("a fan") and lines[3].endswith("fan replaced")
    code, found, _ = await cli("reclaims")
    assert (code, found) == (0, [])
    code, _, err = await cli("reclaims", "--since", "yesterday")
    assert code == 1 and "'since' must be an ISO 8601 time" in err


async def test_an_admin_reads_the_health_alerts(cli, api, jp_serverapp):  # type: ignore[no-untyped-def]
    code, text, _ = await cli("alerts", json_out=False)
    assert (code, text.splitlines()[-1]) == (0, "0 active alert(s)")
    runtime = jp_serverapp.web_app.settings["gpubroker"]
    _, devices = await api("GET", "devices")
    gpu = devices["gpus"][0]["uuid"]
    runtime.backend.simulator.inject_overheat(gpu, 95)
    await runtime.sample()
    code, text, _ = await cli("alerts", json_out=False)
    header, row, summary = text.splitlines()
    assert code == 0 and header.split() == [
        "SINCE",
        "ENDED",
        "SEVERITY",
        "DEVICE",
        "KIND",
        "MESSAGE",
    ]
    assert row.split()[1:6] == ["-", "critical", "GPU", "0", "temperature"]
    assert row.endswith(
        "GPU 0 is at 95 C, at or above its shutdown temperature of 92 C: it may "
        "switch itself off; check its cooling now."
    )
    assert summary == "1 active alert(s)"
    code, found, _ = await cli("alerts", "--history", "5")
    assert code == 0 and [a["kind"] for a in found["active"]] == ["temperature"]
    assert found["history"] == []
    code, _, err = await cli("alerts", "--history", "5000")
    assert (code, err.strip()) == (
        1,
        "error: 'limit' must be an integer from 1 to 1000, not '5000'",
    )


async def run_cli(*args: str) -> tuple[int, str, str]:
    """``python -c CODE ARGS...``: its exit status, stdout and stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


WATCHED = """import json, os, sys
from jupyter_gpubroker.cli import main
opened = []
def watch(event, args):  # the file's name: bytes on Python 3.10, str from 3.11
    if event == "sqlite3.connect":
        opened.append(os.fsdecode(args[0]))
sys.addaudithook(watch)
status = main(sys.argv[1:])
print(json.dumps({"status": status, "modules": sorted(sys.modules), "sqlite": opened}))
"""
"""Run ``jupyter gpubroker ARGS`` and print, last, what it loaded and the SQLite
files it opened (Python's audit hook sees every ``sqlite3.connect``)."""


async def test_queue_loads_neither_the_replay_nor_nvml(held, api, jp_serverapp, broker_url):  # type: ignore[no-untyped-def]
    """`jupyter gpubroker queue` is a client: no simulator, NVML backend, store or replay."""
    async with held(api, 7):
        await api("POST", "requests", {"profile": "1g.10gb"})  # the GPU is full: it waits
        argv = ["queue", "--url", broker_url, "--token", jp_serverapp.identity_provider.token]
        code, out, err = await run_cli(WATCHED, *argv)
    *table, last = out.splitlines()
    seen = json.loads(last)
    assert code == 0 and seen["status"] == 0, err
    assert table[-1] == "1 waiting"  # it did show the queue
    ours = [m for m in seen["modules"] if m.startswith("jupyter_gpubroker.")]
    for heavy in ("replay", "nvml", "broker.store", "broker.core", "runtime"):
        assert not [m for m in ours if m.startswith(f"jupyter_gpubroker.{heavy}")], heavy


async def test_usage_asks_the_running_broker_without_opening_its_state_file(
    held,  # type: ignore[no-untyped-def]
    api,
    jp_serverapp,
    broker_url,
    broker_config,
    monkeypatch,
):
    """With a broker running, `usage` reports through its API and opens no SQLite file,
    though $GPUBROKER_STATE names the broker's; given --state, it opens it read-only."""
    state = broker_config["state_file"]
    monkeypatch.setenv("GPUBROKER_STATE", state)
    token = jp_serverapp.identity_provider.token
    async with held(api) as (r,):
        code, out, err = await run_cli(WATCHED, "usage", "--url", broker_url, "--token", token)
        *table, last = out.splitlines()
        seen = json.loads(last)
        assert code == 0 and seen["status"] == 0, err
        assert table[0].split() == ["user", "gpu_hours"]
        assert table[1].split()[0] == r["user"]
        assert seen["sqlite"] == []
        code, out, err = await run_cli(WATCHED, "usage", "--state", state)
    *table, last = out.splitlines()
    assert code == 0 and table[1].split()[0] == r["user"], err
    assert json.loads(last)["sqlite"] == [f"file://{state}?mode=ro"]


async def test_an_admin_reads_the_forecast_from_the_running_broker(cli):  # type: ignore[no-untyped-def]
    code, text, _ = await cli("forecast", json_out=False)
    assert (code, text) == (
        0,
        "Not enough history yet: no history, and a forecast needs a day of it.\n",
    )
    code, found, _ = await cli("forecast", "--weeks", "2")
    assert code == 0 and not found["ready"] and found["hours"] == []
    code, _, err = await cli("forecast", "--weeks", "60")
    assert (code, err.strip()) == (1, "error: --weeks is 1 to 52 and --backtest-weeks 0 to 52")
