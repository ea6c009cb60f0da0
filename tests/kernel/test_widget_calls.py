"""``%gpu``'s widgets render from the kernel's event stream: while queue events arrive they
make no call to the broker (counted in the kernel, on its real client), and a notice
about the kernel's user on no request (outside use with ``"warn"``) reaches the kernel's
widget although a kernel token's stream carries only its own requests otherwise."""

from __future__ import annotations

import asyncio
import json

from jupyter_gpubroker.broker.core import Event

COUNT = (
    "from collections import Counter\n"
    "session = get_ipython().magics_manager.registry['GPUMagics'].session\n"
    "calls, real = Counter(), session.client.call\n"
    "async def counted(method, path, *args, **kwargs):\n"
    "    calls[method] += 1\n"
    "    return await real(method, path, *args, **kwargs)\n"
    "session.client.call = counted\n"
)


async def test_the_widgets_make_no_call_while_20_queue_events_arrive(
    kernel, notebook, api, fill, jp_serverapp
):
    kid = await kernel()
    await fill(7)
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
        "import json; print(json.dumps(dict(calls)))",
        "print(r.widget.state, r.widget.position, q.widget.length)",
    )
    assert json.loads(nb.stdout(0)).get("GET", 0) == 0  # renewals (POST) are the heartbeat
    assert nb.stdout(1) == "queued 1 1"


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
