"""``%gpu``'s widgets render from the kernel's event stream: while queue events and the
devices' readings arrive they make no call to the broker (counted in the kernel, on its
real client) but the one that names a grant's devices (again after a reconnect: readings
sent meanwhile are not replayed), and a notice about the kernel's
user on no request (outside use with ``"warn"``) reaches the kernel's widget although a
kernel token's stream carries only its own requests otherwise."""

from __future__ import annotations

import asyncio
import json

from jupyter_gpubroker.broker.core import Event

COUNT = (
    "import json\nfrom collections import Counter\n"
    "session = get_ipython().magics_manager.registry['GPUMagics'].session\n"
    "calls, real = Counter(), session.client.call\n"
    "async def counted(method, path, *args, **kwargs):\n"
    "    if not path.endswith('/renew'):  # renewals are the heartbeat\n"
    "        calls[f'{method} {path}'] += 1\n"
    "    return await real(method, path, *args, **kwargs)\n"
    "session.client.call = counted\n"
)
SHOWN = (
    "import time\ndeadline = time.time() + 5\n"
    "while {mib} not in [d['memory_used_mib'] for d in r.widget.readings] "
    "and time.time() < deadline:\n    time.sleep(0.05)\n"
    "print(r.widget.text().splitlines()[2])"
)
"""What the status widget shows of its device's readings once ``{mib}`` MiB are in use."""


async def test_the_widgets_make_no_call_while_queue_events_and_readings_arrive(
    kernel, notebook, api, fill, jp_serverapp, wait_until
):
    runtime = jp_serverapp.web_app.settings["gpubroker"]
    kid = await kernel()
    taken = await fill(7)
    await notebook(
        kid,
        COUNT,
        "r = %gpu request 1g.10gb --no-wait",
        "q = %gpu queue",
        "import time; time.sleep(1); calls.clear()",  # the streams' starts are done
    )
    behind = []
    for i in range(10):  # 20 queue events: each joins behind the kernel's, then leaves
        status, r = await api("POST", "requests", {"profile": "1g.10gb", "holder": f"o{i}"})
        assert status == 201 and r["state"] == "queued"
        behind.append(r["id"])
    await asyncio.sleep(1)
    for rid in behind:
        await api("DELETE", f"requests/{rid}")
    await asyncio.sleep(1)
    nb = await notebook(
        kid,
        "print(json.dumps(calls))",
        "print(r.widget.state, r.widget.position, q.widget.length)",
    )
    assert json.loads(nb.stdout(0)) == {}
    assert nb.stdout(1) == "queued 1 1"

    await api("DELETE", f"leases/{taken[0]}")  # a slice comes free: the kernel's turn

    async def granted():
        _, mine = await api("GET", "requests")
        return next((x for x in mine["requests"] if x["owner"] == kid and x["lease_id"]), None)

    _, lease = await api("GET", f"leases/{(await wait_until(granted))['lease_id']}")
    (device,) = lease["devices"]
    for mib in (1024, 2048, 3072, 4096, 5120):  # a workload grows, over a few readings
        runtime.backend.simulator.set_load(device, memory_used_mib=mib)
        await runtime.sample()
        runtime.events.fanout.send_readings()  # what the stream's timer does every 5 s
        await asyncio.sleep(1)
    nb = await notebook(kid, SHOWN.format(mib=5120), "print(json.dumps(calls))")
    assert " · memory 5.3 / 10.4 GB · " in nb.stdout(0)  # 5120 MiB of the slice's 9984 MiB
    # the grant's devices read once for their names; the readings came with the stream
    assert json.loads(nb.stdout(1)) == {"GET devices": 1}

    # The stream drops (the server closes it, as a restarting proxy would): a reading sent
    # while it was down shows once it is back, read again with the devices.
    (group,) = [g for key, g in runtime.events.fanout.groups.items() if kid in key]
    for stream in group.streams:
        stream.write.__self__.request.connection.close()
    await asyncio.sleep(0.2)
    runtime.backend.simulator.set_load(device, memory_used_mib=6144)
    await runtime.sample()
    runtime.events.fanout.send_readings()  # to no stream of the kernel's
    nb = await notebook(kid, SHOWN.format(mib=6144), "print(json.dumps(calls))")
    assert " · memory 6.4 / 10.4 GB · " in nb.stdout(0)
    assert json.loads(nb.stdout(1)) == {"GET devices": 2}


async def test_an_outside_use_notice_reaches_the_kernels_widget(
    kernel, notebook, api, jp_serverapp
):
    runtime = jp_serverapp.web_app.settings["gpubroker"]
    kid = await kernel()
    nb = await notebook(
        kid,
        "r = %gpu request 1g.10gb",
        "import time; time.sleep(1)\ns = r.widget.session\nprint(s.call(s.client.me())['user'])",
    )
    user = nb.stdout(1)
    text = "GPU 0 / 1g.10gb@1 is not granted to you, yet your process 4242 uses it."
    runtime.events.publish(
        Event("outside_use", runtime.core.clock.now(), user, detail={"message": text})
    )
    await asyncio.sleep(1)
    nb = await notebook(kid, "print(r.widget._html.value)")
    assert text in nb.stdout(0)


async def test_a_broken_promise_shows_in_the_waiting_requests_widget(
    kernel, notebook, fill, jp_serverapp
):
    """The core says a promise broke (tests/broker/test_limits.py); the waiting cell's
    widget says it, in the broker's words."""
    runtime = jp_serverapp.web_app.settings["gpubroker"]
    kid = await kernel()
    await fill(7)
    nb = await notebook(
        kid,
        "r = %gpu request 1g.10gb --no-wait",
        "import time; time.sleep(1)\nprint(r.widget.tracker.id, r.widget.state)",
    )
    request_id, state = nb.stdout(1).split()
    assert state == "queued"
    request = runtime.core.request(request_id)
    text = (
        "The start promised by 14:30 cannot be kept: a GPU was taken out of service "
        "(drained by ada: a fan). It now starts by 16:10 at the latest."
    )
    detail = {"reason": "…", "broken_bound": 0.0, "eta_bound": None, "message": text}
    now = runtime.core.clock.now()
    runtime.events.publish(Event("promise_broken", now, request.user, request_id, None, detail))
    await asyncio.sleep(1)
    nb = await notebook(kid, "print(r.widget._html.value)")
    assert text in nb.stdout(0)
