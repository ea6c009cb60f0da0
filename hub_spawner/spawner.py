"""GPU servers under JupyterHub: a spawner that reserves a GPU or MIG slice at the broker
service for the whole single-user server, and says why a server waits.

``GPUBrokerSpawnerMixin`` goes in front of any spawner (``GPUBrokerSpawner`` is the ready
one over LocalProcessSpawner, ``c.JupyterHub.spawner_class = "gpubroker"``). Its
``user_options`` name a size in the API's own fields (``gpus``, ``profile`` or
``min_memory_gb``, and ``job_class``; none: a CPU-only server, started at once), from the
options form or POSTed to the hub's REST API alike. ``start`` checks them, submits them to
the broker and waits for the grant, ``progress()`` showing the queue position, the requests
ahead, the ETA and the reason as the broker's events move them; then the server starts with
the devices in ``CUDA_VISIBLE_DEVICES`` / ``NVIDIA_VISIBLE_DEVICES``, and its kernels share
them (``GPUBROKER_SERVER_LEASE``). The hub renews the lease while the server lives; ``stop``
and a ``poll`` that finds the server dead give it back; the lease is in ``get_state``, so a
restarted hub keeps renewing it.

Whose request it is: the spawner runs in the hub, so it calls the broker with a hub API
token *of the server's user* that it makes itself (``User.new_api_token``), with only the
scopes to reach and use the broker (``access:services!service=...``,
``custom:gpubroker:use``), which the hub grants only if the user holds them. The service
names the caller from that token, so every request is charged to that user and can never
act for anyone else. The token never leaves the hub process (it is neither in the state nor
in the server's environment); a restarted hub makes a new one, and ``stop`` revokes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from datetime import timezone
from html import escape
from typing import Any

from jupyterhub import orm
from jupyterhub.spawner import LocalProcessSpawner, SimpleLocalProcessSpawner, SpawnException
from jupyterhub.utils import url_path_join
from traitlets import Float, Unicode, default
from traitlets.config import Configurable

from jupyter_gpubroker.broker.errors import BrokerError
from jupyter_gpubroker.broker.models import Size
from jupyter_gpubroker.broker.text import duration
from jupyter_gpubroker.client import (
    SERVER_LEASE_ENV,
    BrokerAPIError,
    BrokerClient,
    GrantTimeout,
    Lost,
    eta_text,
    keep_alive,
    kernel_report,
    size_text,
)

from .service import API_PATH, USE_SCOPE

SIZE_FIELDS = ("gpus", "profile", "min_memory_gb")
OPTION_FIELDS = (*SIZE_FIELDS, "job_class")
JOB_CLASSES = ("interactive", "batch")
LEASE_ENV = SERVER_LEASE_ENV


def gpu_request(options: dict[str, Any]) -> dict[str, Any] | None:
    """The broker request ``user_options`` ask for (``None``: a CPU-only server), checked
    the way the broker checks a request; ``ValueError`` says what is wrong."""
    unknown = set(options) - set(OPTION_FIELDS)
    if unknown:
        raise ValueError(
            f"unknown server option(s) {', '.join(sorted(unknown))}: give one of "
            f"{', '.join(SIZE_FIELDS)} (none for a CPU-only server) and optionally job_class"
        )
    size = {k: options[k] for k in SIZE_FIELDS if options.get(k) not in (None, "")}
    job_class = options.get("job_class") or "interactive"
    if job_class not in JOB_CLASSES:
        raise ValueError(f"job_class must be 'interactive' or 'batch', not {job_class!r}")
    if not size:
        return None
    try:
        Size(**size)
    except BrokerError as e:
        raise ValueError(e.message) from None
    return {**size, "job_class": job_class}


def options_from_form(form: dict[str, list[str]]) -> dict[str, Any]:
    """The form's choice as ``user_options`` (the REST API's shape); numbers as numbers
    when they read as such, anything else is left for ``gpu_request`` to refuse."""
    field = {k: v[0].strip() for k, v in form.items() if v}
    kind = field.get("gpu_kind", "cpu")
    options: dict[str, Any] = {"job_class": field.get("job_class") or "interactive"}
    value = field.get(kind, "")
    if kind == "gpus":
        options["gpus"] = int(value) if value.isdigit() else value
    elif kind == "profile":
        options["profile"] = value
    elif kind == "min_memory_gb":
        try:
            options["min_memory_gb"] = float(value)
        except ValueError:
            options["min_memory_gb"] = value
    return options


def waiting_message(
    request: dict[str, Any], ahead: dict[str, int], length: int, reason: str = ""
) -> str:
    """Where a waiting server's request is and why: "Waiting for 1g.10gb (interactive):
    every 1g.10gb is in use; position 2 of 5, requests ahead: 1 interactive; ETA 10:40
    (10:20-11:30)"."""
    position = request.get("position") or 0
    before = ", ".join(f"{n} {cls}" for cls, n in sorted(ahead.items()) if n) or "none"
    why = f"{reason}; " if reason else ""
    return (
        f"Waiting for {size_text(request)} ({request['job_class']}): {why}position "
        f"{position or '?'} of {max(length, position)}, requests ahead: {before}; "
        f"ETA {eta_text(request)}"
    )


class Choices:
    """What a user may ask for on this machine and within their quota, from the broker's
    ``overview`` and the user's ``quotas``: for refusals and the options form."""

    def __init__(self, overview: dict[str, Any], quotas: list[dict[str, Any]]) -> None:
        self.overview = overview
        devices = [d for g in overview["gpus"] for d in g["devices"]]
        self.whole = [d for d in devices if d["kind"] != "mig"]
        self.profiles: dict[str, list[dict[str, Any]]] = {}
        for d in devices:
            if d["kind"] == "mig":
                self.profiles.setdefault(d["profile"], []).append(d)
        user = overview["me"]["user"]
        mine = [q for q in quotas if (q["kind"], q["name"]) == ("user", user)]
        self.max_gpus: float | None = mine[0]["max_gpus"] if mine else None
        self.share: float | None = mine[0]["share"] if mine else None
        sizes = [d["memory_mib"] for d in devices if self.within_quota(d["gpu_equivalents"])]
        # GB as the broker compares them (MiB / 1024), rounded down: a size shown fits
        self.largest_gb = math.floor(max(sizes, default=0) / 102.4) / 10
        self.smallest_gb = math.floor(min(sizes, default=0) / 102.4) / 10
        self.held = sum(
            d["gpu_equivalents"] for d in devices if (d["holder"] or {}).get("user") == user
        )

    def within_quota(self, gpu_equivalents: float) -> bool:
        return self.max_gpus is None or gpu_equivalents <= self.max_gpus + 1e-9

    @staticmethod
    def free(devices: list[dict[str, Any]]) -> int:
        return sum(not d["holder"] and not d["drained"] and not d["vacating"] for d in devices)

    def waits(self, **size: Any) -> str:
        """The expected wait for one choice: at once when a device is free, else how many
        wait for the same and when the last of them is expected to start."""
        same = [e for e in self.overview["queue"] if all(e.get(k) == v for k, v in size.items())]
        if not same:
            return "starts at once" if self._free_for(**size) else "waits for a device to free"
        last = same[-1]
        return f"{len(same)} waiting for the same; the last expected {eta_text(last)}"

    def blocked(self, request: dict[str, Any]) -> str:
        """Why a request waits, in words: the user's own quota, or every fitting device
        being in use."""
        if request.get("profile"):
            fits = self.profiles.get(request["profile"], [])
        elif request.get("gpus"):
            fits = self.whole
        else:
            fits = [
                d
                for g in self.overview["gpus"]
                for d in g["devices"]
                if d["memory_mib"] >= 1024 * request["min_memory_gb"]
            ]
        eq = min((d["gpu_equivalents"] for d in fits), default=0.0)
        if request.get("gpus"):
            eq = float(request["gpus"])
        if self.max_gpus is not None and self.held + eq > self.max_gpus + 1e-9:
            return (
                f"you hold {self.held:g} of the {self.max_gpus:g} GPU-equivalents your quota "
                "allows at once: it starts once you give some back"
            )
        return f"every {size_text(request)} is in use"

    def _free_for(self, **size: Any) -> bool:
        if "profile" in size:
            return self.free(self.profiles.get(size["profile"], [])) > 0
        if "gpus" in size:
            return self.free(self.whole) >= size["gpus"]
        return True

    def form(self) -> str:
        """The options form's fields (the hub's page wraps them in its form, with its XSRF
        token): CPU only, N whole GPUs, a MIG profile or any device with at least X GB, and
        the class; what is free now, the user's quota and holdings, the expected wait."""
        row = (
            '<div class="form-check"><input class="form-check-input" type="radio" '
            'name="gpu_kind" id="gpu-{kind}" value="{kind}"{checked}>'
            '<label class="form-check-label" for="gpu-{kind}">{label}</label> {field}'
            '<div class="form-text">{note}</div></div>'
        )
        rows = [
            row.format(
                kind="cpu",
                checked=" checked",
                label="CPU only",
                field="",
                note="starts at once; GPU kernels ask the broker themselves",
            )
        ]
        if self.whole:
            free = self.free(self.whole)
            rows.append(
                row.format(
                    kind="gpus",
                    checked="",
                    label="Whole GPUs:",
                    field=f'<input type="number" name="gpus" min="1" max="{len(self.whole)}" '
                    'value="1" aria-label="number of GPUs">',
                    note=f"{free} of {len(self.whole)} free now; one " + escape(self.waits(gpus=1)),
                )
            )
        if self.profiles:
            options = "".join(
                f'<option value="{escape(p)}">{escape(p)}: {self.free(ds)} of {len(ds)} free; '
                f"{escape(self.waits(profile=p))}</option>"
                for p, ds in sorted(self.profiles.items())
            )
            rows.append(
                row.format(
                    kind="profile",
                    checked="",
                    label="A MIG slice:",
                    field=f'<select name="profile" aria-label="MIG profile">{options}</select>',
                    note="",
                )
            )
        if self.largest_gb:
            rows.append(
                row.format(
                    kind="min_memory_gb",
                    checked="",
                    label="Any device with at least",
                    field='<input type="number" name="min_memory_gb" min="1" step="any" '
                    f'max="{self.largest_gb:g}" value="{self.smallest_gb:g}" aria-label="GB"> GB',
                    note=f"the largest has {self.largest_gb:g} GB",
                )
            )
        classes = "".join(f'<option value="{c}">{c}</option>' for c in JOB_CLASSES)
        quota = (
            f"your quota: at most {self.max_gpus:g} GPU-equivalents at once "
            f"({max(0.0, self.max_gpus - self.held):g} left)"
            if self.max_gpus is not None
            else "no quota of your own"
        )
        share = f"your share: {self.share:g}" if self.share is not None else "the default share"
        return (
            '<fieldset class="gpubroker-options"><legend>GPU</legend>'
            + "".join(rows)
            + '<div class="mt-2"><label for="gpu-class">Class</label> '
            f'<select name="job_class" id="gpu-class">{classes}</select></div>'
            f'<p class="form-text">You hold {self.held:g} GPU-equivalents now; {quota}; '
            f"{share}; {self.overview['length']} request(s) in the queue.</p></fieldset>"
        )

    def text(self) -> str:
        """One sentence: "you may ask for a CPU-only server, up to 8 whole GPUs, ..."."""
        offers = ["a CPU-only server (no options)"]
        if self.whole:
            most = len(self.whole)
            if self.max_gpus is not None:
                most = min(most, int(self.max_gpus))
            if most >= 1:
                offers.append(f"gpus from 1 to {most}")
        eq = {p: ds[0]["gpu_equivalents"] for p, ds in self.profiles.items()}
        allowed = sorted(p for p, e in eq.items() if self.within_quota(e))
        if allowed:
            offers.append(f"a MIG profile ({', '.join(allowed)})")
        if self.largest_gb:
            offers.append(f"min_memory_gb up to {self.largest_gb:g}")
        quota = (
            f"; your quota: at most {self.max_gpus:g} GPU-equivalents at once"
            if self.max_gpus is not None
            else ""
        )
        return f"you may ask for {', '.join(offers)}, with job_class interactive or batch{quota}"


class GPUBrokerSpawnerMixin(Configurable):
    """Reserve a GPU or MIG slice for the whole server at the GPU broker service (see the
    module's docstring). Put it before the spawner class it extends."""

    gpubroker_service = Unicode(
        "gpubroker", help="The name of the GPU broker's service in c.JupyterHub.services."
    ).tag(config=True)
    gpubroker_url = Unicode(
        "",
        help="The broker API's URL as the hub reaches it; default: the service's own url "
        "and prefix (c.JupyterHub.services), plus api/v1.",
    ).tag(config=True)
    gpu_wait_timeout = Float(
        3600.0,
        help="Seconds a server waits in the broker's queue before its request is withdrawn "
        "(the user is told their position). It comes on top of start_timeout, which "
        "stays the time the server itself has to start once its GPU is granted.",
    ).tag(config=True)

    _gpu: dict[str, Any] | None = None
    """The server's reservation: ``request_id``, and once granted ``lease_id``, ``devices``
    and ``ttl_s``; in the hub's state while the server runs."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._server_start_timeout = self.start_timeout
        self._token = ""
        self._renewing: asyncio.Task[None] | None = None
        self._progress: list[dict[str, Any]] = []
        self._progressed = asyncio.Event()
        self._wants_gpu = False
        self._why_waiting = ""

    # -- the broker, as the server's user

    @property
    def _broker_url(self) -> str:
        if self.gpubroker_url:
            return self.gpubroker_url
        service = (self.user.settings.get("services") or {}).get(self.gpubroker_service)
        if service is None or not service.url:
            raise SpawnException(
                f"no GPU broker service {self.gpubroker_service!r} with a url in "
                "c.JupyterHub.services: add it, or set c.GPUBrokerSpawner.gpubroker_url",
                reason="gpubroker_config",
                status_code=503,
            )
        return url_path_join(service.url, service.prefix, API_PATH)

    def _client(self) -> BrokerClient:
        if not self._token:
            self._token = self._new_token()
        return BrokerClient(self._broker_url, token=self._token)

    @property
    def _token_note(self) -> str:
        return f"gpubroker spawner of {self._log_name}"

    def _new_token(self) -> str:
        """A hub API token of the server's user that reaches and uses the broker, and
        nothing else; one a hub that died left behind is revoked first."""
        self._revoke_token()
        scopes = [f"access:services!service={self.gpubroker_service}", USE_SCOPE]
        try:
            return str(self.user.new_api_token(note=self._token_note, scopes=scopes))
        except (ValueError, KeyError):
            raise SpawnException(
                f"{self.user.name} may not use the GPU broker: ask a hub admin to grant "
                f"{USE_SCOPE} and access:services!service={self.gpubroker_service} "
                "(c.JupyterHub.load_roles), or start a server without a GPU",
                reason="gpubroker_scope",
                status_code=403,
            ) from None

    def _revoke_token(self) -> None:
        db = self.user.db
        for token in db.query(orm.APIToken).filter_by(
            user_id=self.user.orm_user.id, note=self._token_note
        ):
            db.delete(token)
        db.commit()
        self._token = ""

    async def _choices(self, client: BrokerClient) -> Choices:
        overview, quotas = await asyncio.gather(client.overview(), client.quotas())
        return Choices(overview, quotas)

    async def _refusal(self, client: BrokerClient, why: str) -> SpawnException:
        """A refused request in one sentence: why, and what the user may ask for."""
        try:
            what = (await self._choices(client)).text()
        except (BrokerAPIError, OSError):
            what = ""
        message = f"Cannot start a GPU server: {why.rstrip('.')}" + (f"; {what}." if what else ".")
        return SpawnException(message, reason="gpu_request", status_code=400)

    # -- the spawner's lifecycle

    @default("options_form")
    def _gpu_options_form(self) -> Any:
        async def form(spawner: GPUBrokerSpawnerMixin) -> str:
            return await spawner._render_options_form()

        return form

    @default("options_from_form")
    def _gpu_options_from_form(self) -> Any:
        return options_from_form

    async def _render_options_form(self) -> str:
        """The form, live from the broker; CPU only, saying why, when it cannot be read."""
        try:
            return (await self._choices(self._client())).form()
        except (BrokerAPIError, OSError, SpawnException) as e:
            why = escape(getattr(e, "message", None) or getattr(e, "log_message", None) or str(e))
            return (
                '<input type="hidden" name="gpu_kind" value="cpu">'
                f"<p>A CPU-only server: the GPU broker cannot be asked now ({why}).</p>"
            )

    @default("apply_user_options")
    def _check_user_options(self) -> Any:
        """Refuse malformed options before anything starts (JupyterHub 5.3's hook);
        ``start`` checks them again for a deployment that sets its own hook."""

        def check(spawner: GPUBrokerSpawnerMixin, options: dict[str, Any]) -> None:
            spawner._gpu_request(options)

        return check

    def _gpu_request(self, options: dict[str, Any]) -> dict[str, Any] | None:
        try:
            return gpu_request(options)
        except ValueError as e:
            raise SpawnException(
                f"Cannot start the server: {e}.", reason="user_options", status_code=400
            ) from None

    def run_pre_spawn_hook(self) -> Any:
        """Give a GPU server's start the queue's wait too (the hub reads start_timeout once
        start is called), after the deployment's own hook."""
        ran = super().run_pre_spawn_hook()
        try:
            self._wants_gpu = gpu_request(self.user_options) is not None
        except ValueError:
            self._wants_gpu = False  # start refuses it at once
        self._progress.clear()
        extra = self.gpu_wait_timeout if self._wants_gpu else 0
        self.start_timeout = int(self._server_start_timeout + extra)
        return ran

    async def start(self) -> Any:
        body = self._gpu_request(self.user_options)
        if body is None:
            self._gpu = None
            return await super().start()
        client = self._client()
        try:
            request = await client.submit(**body, owner=f"server:{self._log_name}")
        except BrokerAPIError as e:
            if e.status >= 500:
                raise self._unreachable(e.message) from None
            raise await self._refusal(client, e.message) from None
        except OSError as e:
            raise self._unreachable(e.strerror or str(e)) from None
        self._gpu = {"request_id": request["id"]}
        if request["state"] == "queued":
            try:
                self._why_waiting = (await self._choices(client)).blocked(request)
            except (BrokerAPIError, OSError):
                self._why_waiting = ""
            self._waiting(request, {}, request.get("position") or 0)
            try:
                request = await client.wait_for_grant(
                    request["id"], self.gpu_wait_timeout, on_wait=self._waiting
                )
            except GrantTimeout as e:
                self._gpu = None
                raise SpawnException(
                    f"No GPU for this server within {duration(e.waited)} "
                    f"(position {e.request.get('position') or '?'} in the queue); the request "
                    "was withdrawn: try again later or ask for something smaller.",
                    reason="gpu_wait_timeout",
                    status_code=503,
                ) from None
            except BrokerAPIError as e:
                self._gpu = None
                raise SpawnException(
                    f"The server's GPU request ended: {e.message}.", reason="gpu_request"
                ) from None
        lease = request["lease"]
        self._gpu.update(lease_id=lease["id"], devices=lease["devices"], ttl_s=lease["ttl_s"])
        self._report(60, f"Granted {size_text(request)}: {', '.join(lease['devices'])}")
        self._keep_lease()
        try:
            return await super().start()
        except BaseException:
            await self._give_back()
            raise

    def _unreachable(self, why: str) -> SpawnException:
        return SpawnException(
            f"The GPU broker at {self._broker_url} does not answer ({why}): check that its "
            "service runs (the hub's log says why it stopped), or start a server without a GPU.",
            reason="gpubroker_unreachable",
            status_code=503,
        )

    def get_env(self) -> dict[str, str]:
        env = super().get_env()
        if self._gpu and self._gpu.get("devices"):
            env.update(self._device_env(self._gpu["devices"]), **{LEASE_ENV: self._gpu["lease_id"]})
        else:  # a CPU-only server: no GPU a kernel could use without asking the broker
            env["CUDA_VISIBLE_DEVICES"] = ""
        return env

    def _device_env(self, devices: list[str]) -> dict[str, str]:
        """What pins a GPU server to its devices: here their UUIDs, which an engine that
        enforces placement itself (Slurm's gres) replaces with nothing."""
        joined = ",".join(devices)
        return {"CUDA_VISIBLE_DEVICES": joined, "NVIDIA_VISIBLE_DEVICES": joined}

    async def poll(self) -> int | None:
        status = await super().poll()
        if status is not None and not self._spawn_pending:  # not a start still waiting
            await self._give_back()
            self._revoke_token()
        elif self._gpu and self._gpu.get("lease_id"):
            self._keep_lease(now=self._renewing is None)  # a restarted hub renews at once
        return status

    async def stop(self, now: bool = False) -> None:
        await super().stop(now)
        await self._give_back()
        self._revoke_token()

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        if self._gpu and self._gpu.get("lease_id"):
            state["gpubroker"] = dict(self._gpu)
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self._gpu = state.get("gpubroker")

    # -- the lease

    def _keep_lease(self, now: bool = False) -> None:
        """Renew the lease while the server lives (``keep_alive``), ``now`` first (a
        restarted hub: the lease went unrenewed while it was down); a lease the broker
        ended (expired meanwhile, reclaimed) stops the server."""
        if self._renewing is not None and not self._renewing.done():
            return
        assert self._gpu is not None
        held = {"id": self._gpu["lease_id"], "ttl_s": self._gpu["ttl_s"]}
        client = self._client()

        async def renew_one(lease_id: str) -> dict[str, Any]:
            return await client.renew(lease_id, kernel=self._activity())

        async def renew() -> None:
            lost = await keep_alive(renew_one, held, now=now)
            if lost is not None:
                await self._lost(lost)

        self._renewing = asyncio.ensure_future(renew())

    def _activity(self) -> dict[str, Any] | None:
        """The whole server as one idle kernel last active when the hub last heard of it
        (the server reports its activity to the hub), for the broker's idle reclaim: a
        server nobody used for the idle timeout is warned, then stopped after the grace."""
        seen = self.orm_spawner.last_activity if self.orm_spawner is not None else None
        if seen is None:
            return None
        return kernel_report("idle", seen.replace(tzinfo=timezone.utc).timestamp())

    async def _lost(self, lost: Lost) -> None:
        self.log.warning(
            "%s lost its GPU lease %s (%s): stopping it",
            self._log_name,
            self._gpu and self._gpu.get("lease_id"),
            lost.message,
        )
        self._gpu = None
        self._renewing = None
        await super().stop(now=True)

    async def _give_back(self) -> None:
        """Release the lease (or withdraw the request) and stop renewing it."""
        if self._renewing is not None:
            if self._renewing is not asyncio.current_task():
                self._renewing.cancel()
            self._renewing = None
        held, self._gpu = self._gpu, None
        if not held:
            return
        try:
            client = self._client()
            if held.get("lease_id"):
                await client.release(held["lease_id"])
            else:
                await client.cancel(held["request_id"])
        except BrokerAPIError as e:
            if e.status not in (404, 409):  # not already gone
                self.log.warning("Could not give %s's GPU back: %s", self._log_name, e.message)
        except (OSError, SpawnException) as e:  # unrenewed, it expires
            self.log.warning(
                "Could not give %s's GPU back (%s): it returns to the queue once its lease expires",
                self._log_name,
                getattr(e, "message", None) or e,
            )

    # -- progress

    def _report(self, progress: int, message: str) -> None:
        self._progress.append({"progress": progress, "message": message})
        self._progressed.set()
        self._progressed = asyncio.Event()

    def _waiting(self, request: dict[str, Any], ahead: dict[str, int], length: int) -> None:
        self._report(20, waiting_message(request, ahead, length, self._why_waiting))

    async def progress(self) -> Any:
        """The broker's story of this start (queue position, ETA, the grant), live, then
        the spawner's own; the hub stops reading it once the start ends."""
        seen = 0
        while self._wants_gpu:
            for event in self._progress[seen:]:
                yield event
            seen = len(self._progress)
            if not self._spawn_pending or (self._gpu or {}).get("lease_id"):
                break
            changed = self._progressed
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(changed.wait(), 30)
        async for event in super().progress():
            yield event


class GPUBrokerSpawner(GPUBrokerSpawnerMixin, LocalProcessSpawner):
    """LocalProcessSpawner with a GPU reserved at the broker (``"gpubroker"``)."""


class SimpleGPUBrokerSpawner(GPUBrokerSpawnerMixin, SimpleLocalProcessSpawner):
    """SimpleLocalProcessSpawner (every server as the hub's OS user: demos and tests)
    with a GPU reserved at the broker (``"gpubroker-simple"``)."""


__all__ = [
    "GPUBrokerSpawner",
    "GPUBrokerSpawnerMixin",
    "SimpleGPUBrokerSpawner",
    "gpu_request",
    "options_from_form",
]
