"""``%gpu`` in notebooks executed against the test server's broker (a simulated 7-slice H100).

The broker sees the kernel through the API only, as in production: on-demand GPU
kernels carry its URL and a kernel token; the tests take slices for "another
workload" through the same API and read back what the kernel holds.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from datetime import datetime

from kernel_cells import one_line_error

PIN = "import os; print(repr(os.environ['CUDA_VISIBLE_DEVICES']))"


async def queued_request(api, holder: str) -> dict:  # type: ignore[no-untyped-def]
    """The kernel's request once it waits at the head of the queue."""
    _, q = await api("GET", "queue")
    head = q["queue"][0] if q["length"] == 1 else None
    return head if head and head["position"] == 1 and head["holder"] == holder else None


async def test_request_waits_in_the_queue_then_pins_the_granted_slice(
    kernel, notebook, api, fill, wait_until
):
    kid = await kernel()
    others = await fill(7)
    run = asyncio.ensure_future(
        notebook(
            kid,
            "%gpu request 1g.10gb",
            PIN,
            "%gpu request 1g.10gb",
            "%gpu release",
            PIN,
        )
    )
    waiting = await wait_until(lambda: queued_request(api, kid))
    await api("DELETE", f"leases/{others[0]}")
    nb = await run

    # the widget's model said "position 1", then the grant, in one widget shown once
    states = nb.states(0)
    assert (states[1]["state"], states[1]["position"]) == ("queued", 1)
    assert states[-1]["state"] == "granted" and states[-1]["position"] is None
    (shown,) = [o for o in nb.outputs(0) if o["output_type"] in ("display_data", "execute_result")]
    assert "application/vnd.jupyter.widget-view+json" in shown["data"]
    assert shown["data"]["text/plain"].startswith("Waiting for 1g.10gb (interactive): position 1")

    _, request = await api("GET", f"requests/{waiting['id']}")
    device = request["lease"]["devices"][0]
    assert states[-1]["devices"] == [device] and device.startswith("MIG-")
    assert nb.stdout(1) == repr(device)  # the kernel's CUDA_VISIBLE_DEVICES is the lease's

    assert "this kernel already holds" in one_line_error(nb, 2)
    assert nb.text(3).startswith(f"Released {device} (1g.10gb) after")
    assert request["holder"] == kid and request["state"] == "released"
    _, devices = await api("GET", "devices")
    (slot,) = [d for g in devices["gpus"] for d in g["devices"] if d["uuid"] == device]
    assert slot["holder"] is None  # free again
    assert nb.stdout(4) == "''"  # and no longer visible to the kernel


async def test_no_wait_returns_at_once_and_the_grant_arrives_in_the_background(
    kernel, notebook, api, fill
):
    kid = await kernel()
    others = await fill(7)
    nb = await notebook(
        kid, 'r = %gpu request 1g.10gb --no-wait\nprint(r["state"], r["position"], r.widget.state)'
    )
    assert nb.stdout(0) == "queued 1 queued"

    await api("DELETE", f"leases/{others[0]}")  # granted while no cell runs
    nb = await notebook(
        kid,
        "import os, time\n"
        "deadline = time.time() + 10\n"
        "# the environment is pinned first, then the widget drawn: wait for both\n"
        "while not (os.environ['CUDA_VISIBLE_DEVICES'] and r.widget.devices)"
        " and time.time() < deadline:\n"
        "    time.sleep(0.05)\n"
        "print(os.environ['CUDA_VISIBLE_DEVICES'], r.widget.state, r.widget.devices)",
    )
    _, leases = await api("GET", "leases")
    (mine,) = [x for x in leases["leases"] if x["id"] not in others]
    device = mine["devices"][0]
    assert nb.stdout(0) == f"{device} granted ['{device}']"

    await asyncio.sleep(6)  # longer than the 4 s lease TTL: the kernel's heartbeat renews it
    _, lease = await api("GET", f"leases/{mine['id']}")
    assert lease["state"] == "active"


async def test_cancel_button_withdraws_a_waiting_request(kernel, notebook, api, fill):
    kid = await kernel()
    await fill(7)
    nb = await notebook(
        kid,
        "r = %gpu request 1g.10gb --no-wait\nb = r.widget.button\n"
        "print(b.layout.display, r.widget.state)",
        "b.click(); print(b.layout.display, r.widget.state)",
    )
    assert nb.stdout(0) == "None queued"  # the button shows while queued
    assert nb.stdout(1) == "none cancelled"
    _, q = await api("GET", "queue")
    assert q["length"] == 0
    _, requests = await api("GET", "requests")
    assert [r for r in requests["requests"] if r["holder"] == kid] == []


async def test_status_widget_updates_live_until_closed(kernel, notebook, api, jp_serverapp):
    runtime = jp_serverapp.web_app.settings["gpubroker"]
    simulator = runtime.backend.simulator
    kid = await kernel()
    nb = await notebook(
        kid,
        "%config GPUMagics.refresh_interval = 1",
        "request = %gpu request 1g.10gb",  # granted at once; assigned, so not shown
        "r = %gpu status\nw, seen = r.widget, []\n"
        "w.observe(lambda c: seen.extend(r['memory_used_mib'] for r in c['new']), 'readings')\n"
        "session = get_ipython().magics_manager.registry['GPUMagics'].session\n"
        "print(session.clock.active, session.feed.active)",
    )
    assert nb.stdout(2) == "True True"  # redrawing, following the lease and its readings
    _, leases = await api("GET", "leases")
    (device,) = leases["leases"][0]["devices"]

    def read_until_seen(mib: int, close: bool = False) -> str:
        return (
            "import time\ndeadline = time.time() + 3\n"
            f"while {mib} not in seen and time.time() < deadline:\n    time.sleep(0.05)\n"
            + ("w.close()\n" if close else "")
            + f"print({mib} in seen, session.clock.active, session.feed.active)"
        )

    simulator.set_load(device, memory_used_mib=2048)  # a workload starts on the slice
    await runtime.sample()  # the broker's next sampling pass reads it
    runtime.events.fanout.send_readings()  # and its next readings tick sends it
    nb = await notebook(kid, read_until_seen(2048, close=True))
    assert nb.stdout(0) == "True False False"  # updated, then closed: no redraw, no stream
    simulator.set_load(device, memory_used_mib=4096)
    await runtime.sample()
    runtime.events.fanout.send_readings()
    nb = await notebook(kid, read_until_seen(4096))
    assert nb.stdout(0) == "False False False"  # a closed widget hears nothing more


async def test_a_request_for_a_time_limit_holds_its_lease_that_long(kernel, notebook, api):
    kid = await kernel()
    nb = await notebook(kid, 'r = %gpu request 1g.10gb --for 2h\nprint(r["limit_s"])')
    assert nb.stdout(0) == "7200.0"
    _, leases = await api("GET", "leases")
    assert [x["limit_s"] for x in leases["leases"]] == [7200]


async def test_request_is_refused_once_cuda_is_initialised(kernel, notebook, api):
    kid = await kernel()
    nb = await notebook(
        kid,
        # what a framework's CUDA init leaves behind: the driver library mapped in
        "import mmap, pathlib, tempfile\n"
        "lib = pathlib.Path(tempfile.mkdtemp()) / 'libcuda.so.1'\n"
        "lib.write_bytes(bytes(4096))\n"
        "file = lib.open('rb')\n"
        "driver = mmap.mmap(file.fileno(), 4096, prot=mmap.PROT_READ)",
        "%gpu request 1g.10gb",
    )
    line = one_line_error(nb, 1)
    assert line.startswith("%gpu request: CUDA is already initialised in this kernel (by the CUDA")
    assert "restart the kernel" in line
    _, requests = await api("GET", "requests")
    assert requests["requests"] == []  # nothing was asked for


async def test_errors_are_one_readable_line(kernel, notebook, api):
    kid = await kernel()
    _, me = await api("GET", "me")
    await api("PUT", f"quotas/user/{me['user']}", {"max_gpus": 0.1})
    nb = await notebook(
        kid,
        "%gpu request 9g.99gb",
        "%gpu request 3g.40gb",
        "%gpu request 1g.10gb",
        "%gpu request",
        "%gpu request 1g.10gb --wait-for-it",
        "%gpu frobnicate",
    )
    assert one_line_error(nb, 0).startswith("%gpu request: unknown MIG profile '9g.99gb'")
    assert one_line_error(nb, 1) == (
        "%gpu request: refused: no GPU here offers MIG profile '3g.40gb'; available "
        "profiles: 1g.10gb"
    )
    assert one_line_error(nb, 2).startswith(
        f"%gpu request: quota exceeded: asks for 0.142857 GPU-equivalents but user "
        f"'{me['user']}' may hold at most 0.1"
    )
    assert one_line_error(nb, 3) == (
        "%gpu request: name one size: a MIG profile (1g.10gb), --gpus N, --min-memory 20GB (a "
        "device of at least 20 GB) or --share 8GB (8 GB of a shared GPU)"
    )
    assert one_line_error(nb, 4) == (
        "%gpu: unrecognized arguments: --wait-for-it (see %gpu --help)"
    )
    assert one_line_error(nb, 5).startswith("%gpu: argument COMMAND: invalid choice: 'frobnicate'")
    _, requests = await api("GET", "requests")
    assert requests["requests"] == []


async def test_interrupt_or_timeout_withdraws_a_waiting_request(
    kernel, notebook, api, fill, wait_until, jp_serverapp
):
    kid = await kernel()
    await fill(7)
    run = asyncio.ensure_future(notebook(kid, "%gpu request 1g.10gb"))
    waiting = await wait_until(lambda: queued_request(api, kid))
    await jp_serverapp.kernel_manager.get_kernel(kid).interrupt_kernel()
    nb = await run
    assert one_line_error(nb, 0) == (
        "%gpu request: interrupted: the request for 1g.10gb was withdrawn"
    )
    _, request = await api("GET", f"requests/{waiting['id']}")
    assert request["state"] == "cancelled"

    nb = await notebook(kid, "%gpu request 1g.10gb --timeout 0.5")
    assert one_line_error(nb, 0) == (
        "%gpu request: not granted within 0.5 s (position 1 in the queue): the request was "
        "withdrawn"
    )
    _, q = await api("GET", "queue")
    assert q["length"] == 0


async def test_a_request_left_waiting_is_kept_alive_by_its_kernel(
    kernel, notebook, api, fill, wait_until, jp_serverapp
):
    config = jp_serverapp.web_app.settings["gpubroker"].core.config
    config.request_ttl_s = 1.0
    kid = await kernel()
    await fill(7)
    await notebook(kid, "%gpu request 1g.10gb --no-wait")
    waiting = await wait_until(lambda: queued_request(api, kid))
    _, before = await api("GET", f"requests/{waiting['id']}")
    await asyncio.sleep(3.0)  # three TTLs: the kernel's heartbeat renews it meanwhile
    _, after = await api("GET", f"requests/{waiting['id']}")
    assert after["state"] == "queued" and after["expires_at"] > before["expires_at"]


async def test_plain_kernel_asks_for_the_broker_then_uses_a_jupyter_token(
    kernel, notebook, broker_env
):
    kid = await kernel("python3")
    nb = await notebook(
        kid,
        "get_ipython().config.GPUMagics.refresh_interval = 0.5  # as in a profile's config\n"
        "%load_ext jupyter_gpubroker\n"
        "print(get_ipython().magics_manager.registry['GPUMagics'].refresh_interval)",
        "%gpu",
        f"import os\nos.environ.update({broker_env!r})",
        "%gpu queue",
    )
    assert nb.stdout(0) == "0.5"
    line = one_line_error(nb, 1)
    assert line.startswith("%gpu status: no GPU broker for this kernel: start it with a GPU")
    assert "GPUBROKER_URL" in line and "GPUBROKER_JUPYTER_TOKEN" in line
    assert nb.text(3) == "The GPU queue is empty."


async def ipython(code: str, env: dict[str, str]) -> str:
    """Run ``code`` in a terminal IPython (no kernel, so no widgets); its output."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "IPython",
        "--no-banner",
        "--colors=NoColor",
        "--InteractiveShell.ast_node_interactivity=all",
        "-c",
        "%load_ext jupyter_gpubroker\n" + code,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    return out.decode()


async def test_terminal_ipython_gets_the_text_forms(broker_env, api, fill):
    others = await fill(7)
    out = await ipython("%gpu request 1g.10gb --timeout 0.5", broker_env)
    assert "Waiting for 1g.10gb (interactive): position 1 of 1\nETA " in out
    assert "%gpu request: not granted within 0.5 s" in out and "Traceback" not in out

    _, freed = await api("DELETE", f"leases/{others[0]}")
    (device,) = freed["devices"]
    out = await ipython(
        "%gpu request 1g.10gb\n%gpu queue\n%gpu usage --days 2\n%gpu release", broker_env
    )
    assert "Holding 1g.10gb (interactive)\nGPU 0 / 1g.10gb@" in out
    # A simulated H100 has GPM: its slice's utilization is known once two samples exist.
    readings = (
        rf", 10.4 GB \({re.escape(device)}\)\n  utilization (0%|n/a on MIG) · memory 0.0 / 10.4 GB"
    )
    assert re.search(readings, out)
    assert "The GPU queue is empty." in out
    assert re.search(r"My GPU-hours, last 2 days: (0\.0\d+ h|under 0\.001 h)\n", out)
    assert re.search(rf"Released {re.escape(device)} \(1g\.10gb\) after \d+ s\.", out)


async def test_unreachable_broker_is_one_line():
    down = {"GPUBROKER_URL": "http://127.0.0.1:9/gpubroker/api/v1", "GPUBROKER_RETRY_S": "0"}
    out = await ipython("%gpu queue", down)
    lines = [x for x in out.splitlines() if x.strip()]
    assert len(lines) == 1, out
    assert lines[0].startswith(
        "%gpu queue: cannot reach the GPU broker at http://127.0.0.1:9/gpubroker/api/v1/ ("
    )


async def test_a_kernel_in_a_gpu_server_uses_the_servers_gpu_and_asks_for_no_second(
    broker_env, api
):
    """A server with a GPU of its own (the hub's GPU spawner names its lease in the
    server's environment): ``%gpu request`` says what the server holds and uses it."""
    _, server = await api("POST", "requests", {"profile": "1g.10gb", "holder": "server:me"})
    lease = server["lease"]

    async def renewing() -> None:  # as the server's spawner does, however slowly IPython starts
        while True:
            await api("POST", f"leases/{lease['id']}/renew", {})
            await asyncio.sleep(1)

    spawner = asyncio.ensure_future(renewing())
    try:
        env = {**broker_env, "GPUBROKER_SERVER_LEASE": lease["id"]}
        out = await ipython("%gpu request 2g.20gb\n%gpu\n%gpu release", env)
        (device,) = lease["devices"]
        assert f"This server already holds {device} (1g.10gb); this kernel uses it" in out
        assert out.count("Holding 1g.10gb (interactive)") == 2  # the request, then %gpu
        assert f"%gpu release: this kernel shares its server's {device}: stop the server" in out
        _, requests = await api("GET", "requests")
        assert [r["id"] for r in requests["requests"]] == [server["id"]]  # no second request
        _, still = await api("GET", f"leases/{lease['id']}")
        assert still["state"] == "active"
    finally:
        spawner.cancel()
        await api("DELETE", f"leases/{lease['id']}")


async def test_extend_gives_the_kernels_time_limit_more_time(kernel, notebook, api):  # type: ignore[no-untyped-def]
    kid = await kernel()
    nb = await notebook(
        kid,
        "%gpu extend 1h",
        "r = %gpu request 1g.10gb --for 1h",
        "%gpu extend 30min",
        "%gpu extend soon",
    )
    assert one_line_error(nb, 0) == "%gpu extend: this kernel holds no GPU to extend"
    (lease,) = (await api("GET", "leases"))[1]["leases"]
    assert (lease["limit_s"], lease["extended_s"], lease["extensions"]) == (3600, 1800, 1)
    ends = datetime.fromisoformat(lease["ends_at"]).astimezone()
    assert nb.text(2) == f"Time limit extended: it now ends at {ends:%H:%M}."
    assert one_line_error(nb, 3).startswith(
        "%gpu extend: argument TIME: the extension must be a number of seconds or a duration"
    )
