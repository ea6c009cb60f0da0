"""``gpubroker-provisioner``: a kernel provisioner that starts kernels on a granted GPU.

A kernelspec names what it needs in ``metadata.kernel_provisioner.config``
(``{"gpu": "1g.10gb"}``, ``{"gpus": 2}``, ``{"min_memory_gb": 20}`` or, for 8 GB of a
GPU shared with others, ``{"share_gb": 8}``, optionally ``"compute_percent": 50``).
``pre_launch`` submits the request for this kernel, waits for the grant,
and starts the kernel with the device pinned (``CUDA_VISIBLE_DEVICES`` set to
the GPU or MIG UUIDs; a share's MPS pipe directory and limits where MPS holds it) and a
kernel-scoped token for the ``%gpu`` magic. A
heartbeat renews the lease while the kernel process lives; a restart keeps
the grant; shutdown releases it; a kernel that dies without shutdown stops
renewing, and the broker takes the device back when the lease expires.
``{"on_demand": true}`` starts the kernel at once with no GPU visible and the
token only: the notebook asks with ``%gpu request``.

Shutdown gives back every request the kernel owns, ``%gpu`` ones included; a
restart gives back all but the provisioner's own (the new process has not
pinned their devices), and ends a suspension of the kernel (``suspend/``): its GPU memory
on the host went with the old process, and the new one asks for a GPU as a new kernel does.

In a server that holds a GPU of its own (``$GPUBROKER_SERVER_LEASE``, set by the hub's
GPU spawner) a kernel shares the server's devices: it asks for nothing.

It reaches the broker over the HTTP API: the one embedded in this server (with
the kernel's own token, issued in-process), or ``broker_url`` when the broker
runs elsewhere (a JupyterHub service, with ``jupyter_token``): by default the
central broker of a server in remote mode (``c.GPUBrokerExtension.broker_url``)
with its user's credential. The central broker does not run this server's kernels,
so there each renewal reports the kernel's execution state, for idle reclaim to
judge (the server carries the central broker's reclaims out: ``reclaimer``).

Whose kernel it is: jupyter-server does not pass the starting user to a
provisioner, but its request handler is in the call context (``CallContext``) of
the kernel start; on the embedded broker the kernel is charged to that handler's
user (as ``c.GPUBroker.identity`` maps it: the owner in "owner" mode), or to the
server's owner when no request started it. Through ``broker_url`` it is charged
to ``jupyter_token``'s user. The provisioner's own calls use the kernel's token,
which acts for that user on this kernel's requests only; the log says whose.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

from jupyter_client.provisioning.local_provisioner import LocalProvisioner
from jupyter_server.base.call_context import CallContext
from traitlets import Bool, Enum, Unicode, default, observe

from ..api.rules import BrokerAPI
from ..client import (
    SERVER_LEASE_ENV,
    BrokerAPIError,
    BrokerClient,
    GrantTimeout,
    Lost,
    keep_alive,
    kernel_report,
)
from ..runtime import GPUBroker
from ..wire.sizes import MAX_DURATION_S, MAX_GPUS, MAX_MEMORY_GB, RESOLUTION
from ..wire.text import LIVE
from ..wire.traits import Number, Seconds, Whole
from . import registry
from .reclaimer import ServerKernels

FIRST_RENEWAL_S = 10.0
GIVE_BACK_RETRY_S = 10.0
"""How long a kernel's shutdown keeps trying a broker that does not answer before it leaves
its GPU to come back when the lease expires: long enough for the hub to restart a killed
service (about a second), short enough that a server stopping is not held for minutes."""
"""How long a kernel start waits for the renewal that names its process; past it the
heartbeat names it, as soon as the broker answers."""


class GPUProvisioner(LocalProvisioner):
    gpu = Unicode("", help="MIG profile to request, e.g. '1g.10gb'.").tag(config=True)
    gpus = Whole(0, 0, MAX_GPUS, help="Number of whole GPUs to request.").tag(config=True)
    min_memory_gb = Number(
        0.0, 0.0, MAX_MEMORY_GB, help="Any GPU or MIG slice with at least this memory."
    ).tag(config=True)
    share_gb = Number(
        0.0,
        0.0,
        MAX_MEMORY_GB,
        help="This much memory of a GPU shared with other kernels (not a device of that size).",
    ).tag(config=True)
    compute_percent = Whole(
        0, 0, 100, help="With share_gb: the most of the GPU's compute the share may use (percent)."
    ).tag(config=True)
    on_demand = Bool(
        False, help="Start without a GPU (none visible); the notebook asks with %gpu request."
    ).tag(config=True)
    job_class = Enum(
        ["interactive", "batch"], default_value="interactive", help="Job class of the request."
    ).tag(config=True)
    wait_timeout = Seconds(
        600.0,
        RESOLUTION,
        MAX_DURATION_S,
        help="Seconds a kernel start may wait in the queue before it fails.",
    ).tag(config=True)
    broker_url = Unicode(
        help="API URL of a broker outside this server (default: the central broker of a "
        "server in remote mode, c.GPUBrokerExtension.broker_url); empty: the embedded broker."
    ).tag(config=True)

    @default("broker_url")
    def _default_broker_url(self) -> str:
        remote = registry.remote()
        return remote.url if remote is not None else ""

    jupyter_token = Unicode(
        help="Jupyter (or JupyterHub) token for broker_url: the user the broker charges "
        "this server's kernels to (default: that of a server in remote mode, "
        "c.GPUBrokerExtension.jupyter_token).",
    ).tag(config=True)

    @default("jupyter_token")
    def _default_jupyter_token(self) -> str:
        remote = registry.remote()
        return remote.jupyter_token if remote is not None else ""

    broker_token = Unicode("", help="Deprecated: use jupyter_token (same meaning).").tag(
        config=True
    )

    @observe("broker_token")
    def _deprecated_broker_token(self, change: dict[str, Any]) -> None:
        self.log.warning(
            "GPUProvisioner.broker_token is deprecated: set GPUProvisioner.jupyter_token"
        )
        self.jupyter_token = change["new"]

    request_id: str | None = None
    lease: dict[str, Any] | None = None
    _kernel_token: str | None = None
    charged_to = ""
    """The user this kernel's requests are charged to (its token acts for)."""
    token_max_age = 0.0
    """How long the broker keeps the kernel's token without a renewal (0: not known)."""
    _heartbeat: asyncio.Task[None] | None = None
    _token_heartbeat: asyncio.Task[None] | None = None

    # -- jupyter_client hooks

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        shared = (kwargs.get("env") or os.environ).get(SERVER_LEASE_ENV)
        if shared:  # the server's reservation is this kernel's: no second request
            self.log.info("Kernel %s shares its server's GPU (lease %s)", self.kernel_id, shared)
            return await super().pre_launch(**kwargs)
        if self._kernel_token is None:  # a restart keeps the kernel's token and its user
            await self._issue_token()
        client = self._client()
        if not self.on_demand:
            self.lease = (await self._acquire(client))["lease"]
        env = dict(kwargs.get("env") or os.environ)
        env.update(self.gpu_env(client.url))
        kwargs["env"] = env
        return await super().pre_launch(**kwargs)

    async def post_launch(self, **kwargs: Any) -> None:
        await super().post_launch(**kwargs)
        self._stop_heartbeat()
        self._stop_token_heartbeat()
        if self.broker_url and self._kernel_token and self.token_max_age > 0:
            self._token_heartbeat = asyncio.ensure_future(self._keep_token())
        if self.lease is not None:
            client = self._client()
            # the first renewal before the kernel is handed over: it names the kernel's
            # process, so the broker knows it (and, in a server confined to its devices,
            # lets it open its GPU) before the kernel's first cell runs
            try:
                await asyncio.wait_for(self._renew(client, self.lease["id"]), FIRST_RENEWAL_S)
                first = True
            except Exception as e:  # keep_alive's loop retries, and says what it found
                self.log.debug("Kernel %s: first renewal failed (%s)", self.kernel_id, e)
                first = False
            self._heartbeat = asyncio.ensure_future(self._renew_while_alive(client, not first))

    async def cleanup(self, restart: bool = False) -> None:
        await super().cleanup(restart=restart)
        if not restart:
            self._stop_heartbeat()
            self._stop_token_heartbeat()
            kernels = self._server_kernels()
            if kernels is not None:
                kernels.forget(self.kernel_id)
        runtime = None if self.broker_url else registry.current()
        if restart and runtime is not None and self.charged_to:  # before its new process asks
            runtime.kernel_restarted(self.kernel_id, self.charged_to)
        if not self.broker_url and runtime is None and self._kernel_token:
            self.log.info(  # a server stopping stops its broker before its kernels
                "Kernel %s: its GPU comes back when its lease expires (the GPU broker of this "
                "server stopped first)",
                self.kernel_id,
            )
            return
        try:
            await self._give_back(self._client(GIVE_BACK_RETRY_S), keep_own=restart)
        except Exception as e:  # the server is going down with its broker
            self.log.info("Kernel %s: GPU left to expire with its lease (%s)", self.kernel_id, e)

    async def get_provisioner_info(self) -> dict[str, Any]:
        info: dict[str, Any] = await super().get_provisioner_info()
        info.update(
            gpubroker_request_id=self.request_id,
            gpubroker_lease=self.lease,
            # a restored kernel keeps acting, and giving back, as its user (the kernel
            # token is as secret as the connection file's key, persisted beside it)
            gpubroker_token=self._kernel_token,
            gpubroker_charged_to=self.charged_to,
            gpubroker_token_max_age=self.token_max_age,
        )
        return info

    async def load_provisioner_info(self, provisioner_info: dict[str, Any]) -> None:
        await super().load_provisioner_info(provisioner_info)
        self.request_id = provisioner_info.get("gpubroker_request_id")
        self.lease = provisioner_info.get("gpubroker_lease")
        self._kernel_token = provisioner_info.get("gpubroker_token")
        self.charged_to = provisioner_info.get("gpubroker_charged_to", "")
        self.token_max_age = float(provisioner_info.get("gpubroker_token_max_age") or 0)

    # -- the broker

    def _embedded(self) -> GPUBroker:
        runtime = registry.current()
        if runtime is None:
            raise RuntimeError(
                registry.why_not()
                or "gpubroker-provisioner: no GPU broker in this process; start the kernel from "
                "a Jupyter server with the jupyter_gpubroker extension, or set "
                "c.GPUProvisioner.broker_url"
            )
        return runtime

    def _server_kernels(self) -> ServerKernels | None:
        """This server's kernels when the broker is the central one of remote mode (which
        neither sees them nor acts on them)."""
        remote = registry.remote()
        return remote.kernels if remote is not None and remote.url == self.broker_url else None

    def _client(self, retry_for: float | None = None) -> BrokerClient:
        """The embedded broker through this kernel's own token (it acts only on this
        kernel's requests), or ``broker_url`` as the user of ``jupyter_token``; calls
        retried for ``retry_for`` seconds (``BrokerClient``'s default: a lease's TTL)."""
        if self.broker_url:
            return BrokerClient(self.broker_url, token=self.jupyter_token, retry_for=retry_for)
        url, token = self._embedded().api_url, self._kernel_token or ""
        return BrokerClient(url, kernel_token=token, retry_for=retry_for)

    async def _issue_token(self) -> None:
        """This kernel's token, for the user it is charged to: on the embedded broker the
        user whose request started it (``CallContext``: the Jupyter handler of that request;
        the server's owner when no request did), through ``broker_url`` the token's user."""
        if self.broker_url:
            issued = await self._remote_token()
        else:  # the API's rules, as for a token asked for over HTTP
            api = BrokerAPI(self._embedded())
            handler = CallContext.get(CallContext.JUPYTER_HANDLER)
            login = getattr(getattr(handler, "current_user", None), "username", None)
            issued = api.issue_token(api.user_identity(login), {"kernel_id": self.kernel_id})
        self._kernel_token, self.charged_to = issued["token"], str(issued["user"])
        self.token_max_age = float(issued.get("max_age_s") or 0)  # an older broker: none
        self.log.info("Kernel %s: its GPUs are charged to %s", self.kernel_id, self.charged_to)

    async def _remote_token(self) -> dict[str, Any]:
        """A kernel token from ``broker_url``: the first call a kernel start makes there,
        so a broker that does not answer, or refuses the credential, fails the start with
        what to check."""
        client = self._client()
        where = f"the GPU broker at {client.url.rstrip('/')}"
        config = "c.GPUBrokerExtension" if registry.remote() is not None else "c.GPUProvisioner"
        try:
            return await client.issue_kernel_token(self.kernel_id)
        except OSError as e:
            why = e.strerror or str(e)
            raise RuntimeError(registry.unreachable_text(client.url, why, config)) from None
        except BrokerAPIError as e:
            if e.status not in (401, 403):
                raise RuntimeError(f"{where}: {e.message}") from None
            raise RuntimeError(
                f"{where} refused this server's credential ({e.message}): check "
                f"{config}.jupyter_token (default $GPUBROKER_JUPYTER_TOKEN, else "
                "$JUPYTERHUB_API_TOKEN)"
            ) from None

    async def _revoke_token(self, client: BrokerClient) -> None:
        if self.broker_url:
            with contextlib.suppress(BrokerAPIError):
                await client.revoke_kernel_token(self.kernel_id)
        elif self.charged_to:  # else a kernel restored from before its user was kept
            api = BrokerAPI(self._embedded())
            api.revoke_tokens(api.identify(self.charged_to), self.kernel_id)

    def size(self) -> dict[str, Any]:
        """The request's size in the API's terms, from the kernelspec's config."""
        given = {
            api: value
            for api, key, value in (
                ("profile", "gpu", self.gpu),
                ("gpus", "gpus", self.gpus),
                ("min_memory_gb", "min_memory_gb", self.min_memory_gb),
                ("share_gb", "share_gb", self.share_gb),
            )
            if value
        }
        if self.compute_percent:  # refused beside anything but a share, as the API does
            given["compute_percent"] = self.compute_percent
        if len([k for k in given if k != "compute_percent"]) != 1:
            raise ValueError(
                "a GPU kernelspec's provisioner config names exactly one of 'gpu' (a MIG "
                f"profile), 'gpus', 'min_memory_gb' or 'share_gb'; kernel {self.kernel_id} has "
                f"{', '.join(given) or 'none'}"
            )
        return given

    async def _acquire(self, client: BrokerClient) -> dict[str, Any]:
        """This kernel's live request (kept across restarts), granted."""
        r = await client.request(self.request_id) if self.request_id else None
        if r is None or r["state"] not in LIVE:
            r = await client.submit(**self.size(), job_class=self.job_class, holder=self.kernel_id)
            self.request_id = r["id"]
        if r["state"] == "granted":
            return r
        self.log.info(
            "Kernel %s waits for a GPU: position %s in the queue", self.kernel_id, r["position"]
        )
        try:
            return await client.wait_for_grant(r["id"], self.wait_timeout)
        except GrantTimeout as e:
            await self._give_back(client)
            raise RuntimeError(f"{e}; try again later") from None
        except BaseException:  # start cancelled or failed: leave no request behind
            with contextlib.suppress(Exception):
                await self._give_back(client)
            raise

    async def _give_back(self, client: BrokerClient, keep_own: bool = False) -> None:
        """Release or withdraw every live request this kernel owns (its ``%gpu`` ones too)
        and revoke the kernel's token; ``keep_own``: all but the provisioner's own request,
        and keep the token (a restart)."""
        if self._kernel_token is None:  # never started: nothing asked, nothing to revoke
            return
        mine = [r for r in await client.requests() if r["holder"] == self.kernel_id]
        for r in sorted(mine, key=lambda r: r["state"] != "queued"):  # withdraw, then release
            if not (keep_own and r["id"] == self.request_id):
                with contextlib.suppress(BrokerAPIError):  # ended meanwhile: nothing to do
                    await client.cancel(r["id"])
        if keep_own:
            return
        await self._revoke_token(client)
        self.request_id = self.lease = self._kernel_token = None

    def gpu_env(self, api_url: str) -> dict[str, str]:
        """What the kernel process needs: its devices pinned (none on demand) and its way
        to the broker."""
        assert self._kernel_token is not None
        env = {
            "CUDA_VISIBLE_DEVICES": "",
            "GPUBROKER_URL": api_url,
            "GPUBROKER_TOKEN": self._kernel_token,
            "GPUBROKER_KERNEL_ID": self.kernel_id,
        }
        if self.lease is not None:
            devices = ",".join(self.lease["devices"])
            env.update(
                CUDA_VISIBLE_DEVICES=devices,
                NVIDIA_VISIBLE_DEVICES=devices,
                GPUBROKER_REQUEST_ID=self.lease["request_id"],
                GPUBROKER_LEASE_ID=self.lease["id"],
            )
            share = self.lease.get("share") or {}
            env.update(share.get("env") or {})  # its MPS daemon and limits, where MPS holds it
        return env

    async def _renew(self, client: BrokerClient, lease_id: str) -> dict[str, Any]:
        """One renewal, naming the kernel's process and, where the broker cannot see the
        kernel, its state."""
        kernels = self._server_kernels()
        state = kernels.state(self.kernel_id) if kernels is not None else None
        report = (
            None if state is None else kernel_report(state.execution_state, state.last_activity)
        )
        return await client.renew(lease_id, report, holder_pid=self.pid, log=self.log)

    async def _renew_while_alive(self, client: BrokerClient, now: bool) -> None:
        """Renew the lease (``keep_alive``; the first time at once when ``now``) for as
        long as the kernel process runs; a process that is gone stops renewing, and the
        lease expires."""
        assert self.lease is not None
        lease_id = self.lease["id"]

        async def alive() -> bool:
            return await self.poll() is None

        lost = await keep_alive(
            lambda lease: self._renew(client, lease), self.lease, alive=alive, now=now
        )
        if lost is not None:
            await self._log_lease_end(client, lease_id, lost)

    async def _log_lease_end(self, client: BrokerClient, lease_id: str, lost: Lost) -> None:
        """Why the lease could not be renewed: given back through the API (``%gpu release``)
        is the user's choice, an info line; expired, reclaimed or refused is a loss, a
        warning."""
        try:
            lease = await client.lease(lease_id)
        except Exception:
            lease = None
        if lease is not None and lease["state"] == "released":
            self.log.info(
                "Kernel %s gave its GPU lease %s back (%s)",
                self.kernel_id,
                lease_id,
                lease["reason"],
            )
        else:
            self.log.warning(
                "Kernel %s lost its GPU lease %s: %s", self.kernel_id, lease_id, lost.message
            )

    async def _keep_token(self) -> None:
        """Renew the kernel's token, with this server's credential, every third of its
        maximum age while the kernel process runs: a live kernel's token never ends,
        however idle, and a dead one's ends that long after (``runtime.tokens``). Only
        through ``broker_url``: the embedded broker renews the kernels its server runs."""
        client = self._client()
        while True:
            await asyncio.sleep(self.token_max_age / 3)
            if await self.poll() is not None:
                return
            try:
                await client.renew_kernel_token(self.kernel_id)
            except (BrokerAPIError, OSError) as e:  # the next beat tries again
                self.log.warning("Kernel %s: its GPU token was not renewed: %s", self.kernel_id, e)

    def _stop_heartbeat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            self._heartbeat = None

    def _stop_token_heartbeat(self) -> None:
        if self._token_heartbeat is not None:
            self._token_heartbeat.cancel()
            self._token_heartbeat = None
