"""An admin's rules: quotas, drains and undrains, the release of servers a hub says are
not running (a host routine's, as an admin), and the reclaim records, audit log and health
alerts, which only admins read. Each change writes its audit record in the same
transaction (``Rules._audited``)."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any

from ..broker.budgets import Quota
from ..broker.forecast import WEEK_S, forecast, spans
from ..broker.models import check_name
from ..broker.recorded import demand
from ..wire.errors import Conflict, InvalidRequest, NotFound
from ..wire.sizes import QUOTA_BOUNDS
from ..wire.text import SERVER_HOLDER
from .base import Rules
from .identity import Identity
from .parse import only, parse_int, parse_time, reason_text
from .shapes import alert_json, audit_json, drain_json, reclaim_json

AUDIT_PAGE = 100
"""Audit records or ended alerts per page unless ``limit`` says otherwise (at most
``MAX_AUDIT_PAGE``)."""
MAX_AUDIT_PAGE = 1000


class AdminRules(Rules):
    """Quotas, drains, reclaim records, the audit log and alerts."""

    # -------------------------------------------------------- quotas (admins)

    def set_quota(
        self, who: Identity, kind: str, name: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        self._require_admin(who)
        only(body, QUOTA_BOUNDS)
        if all(v is None for v in body.values()):
            raise InvalidRequest(
                "a quota sets at least one of share, max_gpus or gpu_hours with period_s; "
                "DELETE it to go back to the defaults"
            )
        quota = Quota(**body)
        with self._audited(who, "set_quota", f"{kind}:{name}", quota.to_json()):
            self.core.set_quota(kind, name, quota)
        return {"kind": kind, "name": name, **quota.to_json()}

    def delete_quota(self, who: Identity, kind: str, name: str) -> None:
        self._require_admin(who)
        with self._audited(who, "delete_quota", f"{kind}:{name}", {}):
            self.core.delete_quota(kind, name)

    # ------------------------------------------------------- drains (admins)

    def drain(self, who: Identity, uuid: str, body: dict[str, Any]) -> dict[str, Any]:
        """An admin drains a GPU or device: nothing new is granted on it until an admin
        undrains it, whatever its health; holders keep their leases and get an event."""
        self._require_admin(who, "drain and undrain devices")
        unknown = set(body) - {"reason", "move"}
        move = body.get("move", False)
        if unknown or not isinstance(body.get("reason"), str) or not body["reason"].strip():
            raise InvalidRequest(
                "send {'reason': '<why it is drained>'} and, to move its kernels, 'move': true"
            )
        if not isinstance(move, bool):
            raise InvalidRequest("'move' is true or false")
        reason = reason_text(body["reason"])
        core = self.core
        self._device(uuid)
        before, cause = core.drained().get(uuid), core.drain_cause(uuid)
        detail = {"reason": reason, "was": None if before is None else before[0], "cause": cause}
        with self._audited(who, "drain", uuid, detail):
            core.drain(uuid, f"drained by {who.user}: {reason}", cause="admin", take_over=True)
        message = f"{uuid} takes no new grants until an admin undrains it"
        if before is not None and cause == "health":
            message += f", even once healthy (its health check drained it: {before[0]})"
        if not move:
            return self._drain_state(uuid, message + "; its holders keep their leases")
        moves = self.runtime.move_off(
            uuid, f"{self._label(uuid)} is drained by {who.user}: {reason}", who.user
        )
        going = sum(1 for m in moves.values() if m == "moving")
        message += f"; {going} of its {len(moves)} kernel(s) moving to other GPUs"
        if going < len(moves):
            message += ", the others keep their leases (see moves)"
        return {**self._drain_state(uuid, message), "moves": moves}

    def undrain(self, who: Identity, uuid: str, reason: str | None = None) -> dict[str, Any]:
        """An admin lifts a drain, never a health check's: a GPU drained by its health
        check is lifted by it once it recovers; an admin's drain of a GPU still faulty is
        handed to its health check, which lifts it then."""
        self._require_admin(who, "drain and undrain devices")
        why = reason_text(reason)
        core = self.core
        gpu = self._device(uuid)
        cause, drain = core.drain_cause(uuid), core.drained().get(uuid)
        healthy_for = self._healthy_for()
        if drain is None:
            over = core.drained().get(gpu)
            if over is not None:
                raise Conflict(f"{uuid} is not drained itself; its GPU {gpu} is: undrain that")
            raise Conflict(f"{uuid} is not drained")
        if cause == "health":
            raise Conflict(
                f"{uuid} was drained by its health check ({drain[0]}); it takes grants again "
                f"on its own once it shows no fault for {healthy_for:g} s, and an admin cannot "
                "lift it before"
            )
        faults = self._faults(uuid)
        detail = {"reason": why, "was": drain[0], "cause": cause, "faults": list(faults)}
        with self._audited(who, "undrain", uuid, detail):
            if faults:
                still = (
                    f"still unhealthy ({', '.join(faults)}): drained until it shows no fault "
                    f"for {healthy_for:g} s"
                )
                core.drain(uuid, still, cause="health", take_over=True)
            else:
                core.undrain(uuid, f"undrained by {who.user}" + (f": {why}" if why else ""))
        if faults:
            message = (
                f"{uuid} stays drained: its health check still finds it faulty "
                f"({', '.join(faults)}) and lifts the drain once it shows no fault for "
                f"{healthy_for:g} s"
            )
        elif gpu != uuid and core.drained().get(gpu):
            message = f"{uuid} is undrained, but its GPU {gpu} is still drained"
        else:
            message = f"{uuid} takes grants again"
        return self._drain_state(uuid, message)

    def _device(self, uuid: str) -> str:
        """The GPU of a GPU or device UUID (404 when neither)."""
        placer = self.core.placer
        if uuid in placer.gpus:
            return uuid
        if uuid in placer.devices:
            return placer.devices[uuid].gpu_uuid
        raise NotFound(f"no GPU or device {uuid!r}")

    def _label(self, uuid: str) -> str:
        """What a person calls a GPU or device: ``GPU 3``, ``GPU 3 / 1g.10gb@2``."""
        placer = self.core.placer
        if uuid in placer.devices:
            return placer.devices[uuid].label
        under = placer.under(uuid)
        return under[0].label.split(" / ")[0] if under else uuid

    def _faults(self, uuid: str) -> tuple[str, ...]:
        """What a GPU's health check still holds against it (devices: nothing of their own)."""
        sampler = self.runtime.sampler
        if sampler is None or uuid not in self.core.placer.gpus:
            return ()
        return sampler.health.unhealthy(uuid)

    def _healthy_for(self) -> float:
        sampler = self.runtime.sampler
        return sampler.health.config.healthy_for_s if sampler is not None else 0.0

    def _drain_state(self, uuid: str, message: str) -> dict[str, Any]:
        core = self.core
        return drain_json(uuid, core.drained().get(uuid), core.drain_cause(uuid), message)

    # ------------------------------------- servers that do not run (a host routine)

    def server_leases(self, who: Identity) -> list[dict[str, str]]:
        """The active leases of single-user servers (holder ``server:<name>``): each
        ``lease_id``, ``user`` and ``server`` (``user`` or ``user:name``)."""
        self._require_admin(who, "list the leases of every user's server")
        core = self.core
        held = ((x, core.request(x.request_id).holder) for x in core.leases())
        return [
            {"lease_id": x.id, "user": x.user, "server": holder[len(SERVER_HOLDER) :]}
            for x, holder in held
            if holder.startswith(SERVER_HOLDER)
        ]

    def release_stopped_server(self, who: Identity, lease_id: str) -> None:
        """Give back the lease of a server its hub says does not run, charged up to its
        last renewal (the hub tells no stop time, and a running server renews every third
        of the TTL); audited with the reason, ``who`` (the hub service) as the actor."""
        self._require_admin(who, "release the leases of servers that are not running")
        core = self.core
        lease = core.lease(lease_id)
        holder = core.request(lease.request_id).holder
        if not holder.startswith(SERVER_HOLDER):
            raise Conflict(f"lease {lease_id} is not a server's: its holder is {holder!r}")
        server = holder[len(SERVER_HOLDER) :]
        reason = f"server {server} is not running"
        detail = {"user": lease.user, "server": server, "reason": reason}
        with self._audited(who, "release_stopped_server", lease.id, detail):
            core.release(lease.id, reason=reason, charged_until=lease.expires_at - lease.ttl_s)

    # --------------------------------------------- reclaims and audit (admins)

    def reclaims(
        self,
        who: Identity,
        user: str | None = None,
        since: str | None = None,
        until: str | None = None,
    ) -> dict[str, Any]:
        """Reclaimed leases with their cause and the evidence the decision saw."""
        self._require_admin(who, "see reclaim records")
        if user is not None:
            check_name(user, "user")
        rows = self.core.store.reclaims(
            parse_time("since", since), parse_time("until", until), user
        )
        return {"reclaims": [reclaim_json(r) for r in rows]}

    def forecast(
        self, who: Identity, weeks: str | None = None, backtest_weeks: str | None = None
    ) -> dict[str, Any]:
        """Demand per hour of the week (UTC) from the state file's history, with its error
        over the last weeks (``broker.forecast``): what capacity a site needs, and when;
        and what acts on it here (``acting``)."""
        self._require_admin(who, "see the demand forecast")
        span = parse_int("weeks", weeks, 1, 52, 8)
        tests = parse_int("backtest_weeks", backtest_weeks, 0, 52, 4)
        now = self.core.clock.now()
        rows = demand(self.core.store, now - (span + tests) * WEEK_S, now)
        found = forecast(spans(rows), now, weeks=span, backtest_weeks=tests).to_json()
        return {**found, "acting": self.runtime.acting_ahead()}

    def whatif(self, who: Identity, body: dict[str, Any]) -> Future[Any]:
        """Replay the state file's recorded requests through the core as they were and
        with ``body``'s changes (``runtime.whatif``), in a worker thread: the future's
        result is the figures beside what really happened."""
        self._require_admin(who, "run what-if replays")
        state = self.runtime.state_file
        if state == ":memory:":
            raise Conflict(
                "this broker keeps its state in memory (c.GPUBroker.state_file), so it "
                "recorded no history to replay"
            )
        now = self.core.clock.now()
        return self.runtime.whatifs.start(Path(state).expanduser(), now, who.user, body)

    def whatif_state(self, who: Identity) -> dict[str, Any]:
        """The what-if replay running now and the last one done."""
        self._require_admin(who, "run what-if replays")
        return self.runtime.whatifs.state()

    def audit(
        self,
        who: Identity,
        since: str | None = None,
        actor: str | None = None,
        after: str | None = None,
        limit: str | None = None,
    ) -> dict[str, Any]:
        """What admins did, oldest first, a page at a time: ``next_after`` is the ``after``
        of the next page (null on the last)."""
        self._require_admin(who, "read the audit log")
        if actor is not None:
            check_name(actor, "actor")
        page = parse_int("limit", limit, 1, MAX_AUDIT_PAGE, AUDIT_PAGE)
        start = parse_int("after", after, 0, 2**62, 0)
        rows = self.core.store.audit(parse_time("since", since), actor, start, page + 1)
        more = len(rows) > page
        rows = rows[:page]
        return {
            "audit": [audit_json(r) for r in rows],
            "next_after": rows[-1]["id"] if more else None,
        }

    def alerts(
        self, who: Identity, limit: str | None = None, before: str | None = None
    ) -> dict[str, Any]:
        """The active health alerts, oldest first, and a page of the ended ones, newest
        first: ``next_before`` is the ``before`` of the next page (null on the last)."""
        self._require_admin(who, "see health alerts")
        page = parse_int("limit", limit, 1, MAX_AUDIT_PAGE, AUDIT_PAGE)
        start = parse_int("before", before, 1, 2**62, 2**62)
        store = self.core.store
        history = store.alert_history(start, page + 1)
        more = len(history) > page
        history = history[:page]
        return {
            "active": [alert_json(a) for a in store.active_alerts()],
            "history": [alert_json(a) for a in history],
            "next_before": history[-1]["id"] if more else None,
        }
