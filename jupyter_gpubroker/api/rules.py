"""The API's rules, once for every host: who may see and do what, and the answers.

``BrokerAPI`` is what a host calls. A host (the jupyter-server extension's handlers,
the JupyterHub service's) parses its HTTP input, builds an ``Identity`` from
its own auth with ``identify`` / ``token_identity``, calls one method per operation and
writes the JSON-ready answer it gets back; errors are the typed ``BrokerError``s of
``wire.errors``, which carry their HTTP status. Nothing here knows tornado or Jupyter,
nor the running broker's module: it takes one (``runtime.GPUBroker``) as an argument.

The rules: a user sees and acts on their own requests and leases; an admin on everyone's;
a kernel-scoped token only on its own kernel's requests (never as an admin, and it
cannot issue, renew or revoke tokens). Other users' objects are shown without ids, holders
or tokens (``api.shapes``). Only admins change quotas, see or change time limits, or see
usage by anything but their own user.

Admin operations (cancel another user's request, change a request's class, drain and
undrain a device, set and delete quotas and time limits) each write one audit record
(``Store.audited``) in the same transaction as their change, so nothing an admin did is acknowledged
unrecorded; reclaim records, the audit log and health alerts (their listing and their events)
are for admins only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..broker.limitrules import LIMIT_KINDS, LimitRule, check_key
from ..broker.models import (
    JobClass,
    Lease,
    LeaseState,
    Request,
    RequestState,
    check_name,
    parse_job_class,
)
from ..broker.reclaim import KernelState
from ..events import Positions
from ..wire.errors import Conflict, Forbidden, InvalidRequest, NotFound, Unsatisfiable
from ..wire.sizes import Size
from ..wire.text import SERVER_HOLDER
from ..wire.times import iso
from .admin import AdminRules
from .holders import check_holder, elsewhere, holder_pid
from .identity import Identity
from .parse import holder_of, only, parse_int, parse_time, reason_text
from .shapes import (
    devices_json,
    held_back_text,
    lease_json,
    queue_json,
    request_json,
    samples_json,
)
from .streams import StreamRules
from .tokens import TokenRules

__all__ = ["BrokerAPI", "only", "parse_int", "parse_time"]

SIZE_FIELDS = ("gpus", "profile", "min_memory_gb", "model", "share_gb", "compute_percent")
REQUEST_FIELDS = {
    *SIZE_FIELDS,
    "job_class",
    "holder",
    "owner",  # the old name of "holder", accepted for one release
    "expected_duration_s",
    "limit_s",
    "groups",
    "id",
}
LIMIT_FIELDS = ("default_s", "max_s", "required")
KERNEL_STATES = ("idle", "busy")
"""A kernel's execution state as a renewal reports it (``server.reclaimer`` watches them)."""


class BrokerAPI(AdminRules, StreamRules, TokenRules):
    """Every operation of the API for a running broker (``runtime``): the requests and
    leases here, an admin's drains and logs (``api.admin``), the event streams
    (``api.streams``), kernel tokens (``api.tokens``)."""

    # ------------------------------------------------------------ identity

    def identify(
        self,
        user: str,
        kernel_id: str | None = None,
        groups: Iterable[str] = (),
        admin: bool | None = None,
    ) -> Identity:
        """The identity of ``user`` (bound to ``kernel_id`` for a kernel token): its groups
        are ``c.GPUBroker.user_groups``' plus those its host knows (``groups``). A host that
        decides who is an admin says so (``admin``: the hub service, from the admin scope);
        otherwise admins are ``c.GPUBroker.admin_users`` and, in "owner" mode, the server's
        owner (the one user of a single-user server). A kernel token is never an admin.
        A user or group name ``check_name`` refuses is a 403 on every call."""
        rt = self.runtime
        named = [*rt.user_groups.get(user, []), *groups]
        try:  # every front's identity: one rule for names everywhere
            check_name(user, "user")
            for group in named:
                check_name(group, "group")
        except InvalidRequest as e:
            raise Forbidden(f"the GPU broker cannot serve this caller: {e.message}") from None
        if admin is None:
            admin = user in rt.admin_users or (rt.identity == "owner" and user == rt.owner)
        return Identity(
            user=user,
            groups=tuple(dict.fromkeys(named)),
            admin=admin and kernel_id is None,
            kernel_id=kernel_id,
        )

    def user_identity(self, username: str | None, groups: Iterable[str] = ()) -> Identity:
        """A logged-in user: in "owner" mode (a single-user server, whose credentials
        already grant everything) every caller is the owner; in "username" mode the name
        the host's login gave. ``None`` (nobody logged in: a kernel that no request
        started) is the server's owner."""
        rt = self.runtime
        named = username if rt.identity == "username" and username else rt.owner
        return self.identify(named, groups=groups)

    def token_identity(self, token: str) -> Identity | None:
        """Whom a kernel token speaks for; ``None`` when unknown, revoked or past its age."""
        held = self.runtime.token_holder(token)
        return None if held is None else self.identify(*held)

    def now(self) -> float:
        """The broker's time (UTC seconds, its injected clock): where a front's "the last
        N days" end."""
        return self.core.clock.now()

    def me(self, who: Identity) -> dict[str, Any]:
        return {
            "user": who.user,
            "groups": list(who.groups),
            "admin": who.admin,
            "kernel_id": who.kernel_id,
        }

    # ---------------------------------------------------------- visibility

    def _own_request(self, who: Identity, request_id: str) -> Request:
        r = self.core.request(request_id, self._viewer(who))
        if not self._kernel_may(who, r.holder):
            raise Forbidden("a kernel token acts only on its own kernel's requests")
        return r

    def _own_lease(self, who: Identity, lease_id: str) -> Lease:
        lease = self.core.lease(lease_id, self._viewer(who))
        self._own_request(who, lease.request_id)
        return lease

    # -------------------------------------------------------------- devices

    def devices(self, who: Identity) -> dict[str, Any]:
        """Every GPU and device with the sampler's latest readings (no NVML call here)."""
        core = self.core
        holders = core.holders()
        kernel_of = None
        if who.kernel_id is not None:  # a kernel token sees only its kernel's ids
            kernel_of = {x.request_id: core.request(x.request_id).holder for x in holders.values()}
        gpus = devices_json(
            core.inventory,
            self.runtime.readings(),
            holders,
            who.user,
            who.admin,
            kernel_id=who.kernel_id,
            kernel_of=kernel_of,
            drains=core.drained(),
            vacating=core.vacating(),
            causes=core.drain_causes(),
            outside=self.runtime.outside_now(),
            shared=core.sharers(),
            share_use=self.runtime.share_use(),
            sharing={
                g.uuid: s for g in core.inventory.gpus if (s := self.runtime.sharing_of(g.uuid))
            },
            idle_reclaim=self.runtime.idle_reclaim(),
        )
        engine = self.runtime.engine_state()
        if engine is None:
            return {"gpus": gpus}
        return {"gpus": gpus, "engine": {**engine, "since": iso(engine["since"])}}

    def device_metrics(self, who: Identity, uuid: str, since: str | None) -> dict[str, Any]:
        """A GPU's or MIG slice's samples since ``since`` (default: the last hour)."""
        core, sampler = self.core, self.runtime.sampler
        if sampler is None or (uuid not in core.placer.gpus and uuid not in core.placer.devices):
            raise NotFound(f"no GPU or device {uuid!r}")
        now = core.clock.now()
        start = parse_time("since", since)
        start = now - 3600.0 if start is None else start
        resolution, samples = sampler.samples.series(uuid, start, now)
        return samples_json(uuid, resolution, samples, sampler.samples.events(uuid, start))

    # ------------------------------------------------------ queue, requests

    def queue(self, who: Identity) -> dict[str, Any]:
        entries = self.core.queue()
        queue = queue_json(entries, who.user, who.admin, kernel_id=who.kernel_id)
        return {"queue": queue, "length": len(entries)}

    def _with_lease(
        self, who: Identity, r: Request, changed: bool = False, lease: Lease | None = None
    ) -> dict[str, Any]:
        """The request with its lease (``lease``, when the caller has it) and queue entry;
        ``changed``: right after a change the broker announced (submit, cancel), whose
        positions the event streams need too, so they are computed once for both. Only a
        waiting request has an entry: the queue is not looked at for any other."""
        entry, length, ahead = None, 0, None
        if r.state is RequestState.QUEUED:
            p = self.runtime.events.positions() if changed else Positions.of(self.core.queue())
            mine = p.by_holder.get((r.user, r.holder), [])
            entry = next((e for e in mine if e.request.id == r.id), None)
            length, ahead = p.length, p.ahead.get(r.id)
        held = held_back_text(self.core, r, who.user) if entry is not None else None
        d = request_json(r, entry, length, ahead, held)
        if r.lease_id and lease is None:
            lease = self.core.lease(r.lease_id)
        d["lease"] = self._lease_json(lease) if lease is not None else None
        return d

    def requests(self, who: Identity) -> dict[str, Any]:
        """Live requests: mine (a kernel token: its kernel's); an admin's: all."""
        p = Positions.of(self.core.queue())
        entries = {e.request.id: e for e in p.entries}
        return {
            "requests": [
                request_json(
                    r,
                    entries.get(r.id),
                    p.length,
                    p.ahead.get(r.id),
                    held_back_text(self.core, r, who.user) if r.id in entries else None,
                )
                for r in self.core.live_requests(self._viewer(who))
                if self._kernel_may(who, r.holder)
            ]
        }

    def submit(self, who: Identity, body: dict[str, Any]) -> dict[str, Any]:
        """A new request of ``who``; a kernel token's is always held by its kernel, a
        user's by the ``holder`` it names (a kernel id, ``server:<user>``, 'cli')."""
        only(body, REQUEST_FIELDS)
        size = Size(**{k: body[k] for k in SIZE_FIELDS if body.get(k) is not None})
        named = holder_of(body)
        holder = who.kernel_id if who.kernel_id is not None else named
        if who.kernel_id is not None:
            self._one_slice_per_kernel(who, size)
        engine = self.runtime.engine
        if engine is not None and not str(holder).startswith(SERVER_HOLDER):
            # Its lease would name a device on some node with no job of the engine to run
            # on it, and be released as an ended job's after engine_grace.
            raise Unsatisfiable(
                f"the GPUs here are {engine.name.capitalize()}'s: a GPU comes with a server"
                " started from the hub's spawn page (its GPU options), not to a kernel or the"
                " command line"
            )
        groups = self._groups(who, body.get("groups", []))
        job_class = parse_job_class(body.get("job_class", "interactive"))
        # Every group of the user's bounds its time limit, not only those it names (which
        # choose whom it is charged to): naming fewer groups escapes no group's maximum.
        limit_s = self.core.limits.check(
            job_class, size, [*groups, *who.groups], body.get("limit_s")
        )
        r = self.core.submit(
            who.user,
            size,
            groups=groups,
            job_class=job_class,
            holder=holder,
            expected_duration_s=body.get("expected_duration_s"),
            request_id=body.get("id"),
            limit_s=limit_s,
        )
        return self._with_lease(who, r, changed=True)

    def _one_slice_per_kernel(self, who: Identity, size: Size) -> None:
        """CUDA shows a process one MIG device: a kernel never gets a MIG slice beside
        another device. One request cannot yield two (whole GPUs come alone or as whole
        GPUs, a profile or a memory size as one device); two requests of one kernel could."""
        held = next(
            (
                r
                for r in self.core.live_requests(who.user)
                if r.holder == who.kernel_id and (r.size.gpus is None or size.gpus is None)
            ),
            None,
        )
        if held is not None:
            raise Conflict(
                f"this kernel already has request {held.id} for {held.size.key}: a kernel with "
                "a MIG slice or a share holds nothing beside it (CUDA shows a process one MIG "
                "device, and MPS one GPU's daemon); release that request first"
            )

    @staticmethod
    def _groups(who: Identity, asked: Any) -> list[str]:
        """The groups a request may name: its user's own, never someone else's (none
        named: all of its user's, the first charged)."""
        if not isinstance(asked, list) or not all(isinstance(g, str) for g in asked):
            raise InvalidRequest("'groups' must be a list of group names")
        foreign = [g for g in asked if g not in who.groups]
        if foreign:
            raise Forbidden(
                f"{who.user} is not a member of group(s) {', '.join(foreign)}"
                + (f"; their groups: {', '.join(who.groups)}" if who.groups else "")
            )
        return asked or list(who.groups)

    def request(self, who: Identity, request_id: str) -> dict[str, Any]:
        return self._with_lease(who, self._own_request(who, request_id))

    def cancel(self, who: Identity, request_id: str, reason: str | None = None) -> dict[str, Any]:
        """Withdraw (or release) one's own request; an admin's cancel of another user's
        is audited, and its holder's event says who cancelled it and why (``reason``)."""
        why = reason_text(reason)
        r = self._own_request(who, request_id)
        lease = self.core.lease(r.lease_id) if r.lease_id else None  # ended in place
        if r.user == who.user:
            return self._with_lease(who, self.core.cancel(r.id), changed=True, lease=lease)
        detail = {"user": r.user, "state": r.state.value, "reason": why}
        with self._audited(who, "cancel", r.id, detail):
            done = self.core.cancel(r.id, by=who.user, reason=why)
        return self._with_lease(who, done, changed=True, lease=lease)

    def change_request(
        self, who: Identity, request_id: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        """An admin moves a waiting request to the other class (``job_class``)."""
        self._require_admin(who, "change a request's class")
        unknown = set(body) - {"job_class", "reason"}
        if unknown or "job_class" not in body:
            raise InvalidRequest(
                "send {'job_class': 'interactive' or 'batch'} (and an optional 'reason')"
                + (f", not field(s) {', '.join(sorted(unknown))}" if unknown else "")
            )
        r = self.core.request(request_id)
        detail = {"user": r.user, "job_class": body["job_class"], "was": r.job_class.value}
        detail["reason"] = reason_text(body.get("reason"))
        with self._audited(who, "set_class", r.id, detail):
            changed = self.core.set_job_class(r.id, body["job_class"], by=who.user)
        return self._with_lease(who, changed, changed=True)

    def renew_request(self, who: Identity, request_id: str) -> dict[str, Any]:
        r = self._own_request(who, request_id)
        renewed = self._with_lease(who, self.core.renew_request(r.id))
        self._kernel_lives(who, r.user, r.holder)
        return renewed

    # --------------------------------------------------------------- leases

    def leases(self, who: Identity) -> dict[str, Any]:
        """Active leases: mine (a kernel token: its kernel's); an admin's: all."""
        core = self.core
        return {
            "leases": [
                self._lease_json(x)
                for x in core.leases(self._viewer(who))
                if self._kernel_may(who, core.request(x.request_id).holder)
            ]
        }

    def suspended(self, who: Identity) -> dict[str, Any]:
        """Ended leases whose kernels stay suspended: mine (a kernel token: its kernel's);
        an admin's: all."""
        core, viewer = self.core, self._viewer(who)
        leases = (core.lease(x) for x in self.runtime.suspended_leases())
        return {
            "suspended": [
                self._lease_json(x)
                for x in leases
                if viewer in (None, x.user)
                and self._kernel_may(who, core.request(x.request_id).holder)
            ]
        }

    def _lease_json(self, lease: Lease) -> dict[str, Any]:
        """A lease with what its holder's server does to the kernel once it is reclaimed
        (``GPUBroker.on_reclaim``: a server in remote mode carries it out) and how
        long it has been idle and which process holds it (null once ended, or where not
        known); a suspended kernel's, while it stays so, with ``suspended``, and once it
        does not, with why in its reason."""
        active = lease.state is LeaseState.ACTIVE
        shown = lease_json(lease)
        ended = None if active else self.runtime.suspension_ended(lease.id)
        if ended is not None:
            shown["reason"] = f"{shown['reason']}; {ended}"
        return {
            **shown,
            "on_reclaim": self.runtime.on_reclaim(lease),
            "idle_s": self.runtime.idle_s(lease.id) if active else None,
            "holder_pid": self.runtime.holder_pid(lease.id) if active else None,
            "suspended": self.runtime.suspended(lease.id),
            "share": self.runtime.share_of(lease),
            "moved": self.runtime.moved(lease.id) if active else None,
        }

    def lease(self, who: Identity, lease_id: str) -> dict[str, Any]:
        return self._lease_json(self._own_lease(who, lease_id))

    def release(self, who: Identity, lease_id: str) -> dict[str, Any]:
        lease = self._own_lease(who, lease_id)
        return self._lease_json(self.core.release(lease.id))

    def renew(
        self, who: Identity, lease_id: str, body: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The holder's heartbeat; ``body``'s ``kernel`` reports the holding kernel's
        execution state, which idle reclaim judges when the broker does not run it, and
        its ``holder_pid`` the holding process (the kernel's or the server's), whose
        descendants on the lease's devices are the lease's, not outside use: a process
        of the lease's user only (``api.holders``); its ``pid_namespace`` the namespace
        that pid counts in, which must be the broker's for the pid to be read."""
        lease = self._own_lease(who, lease_id)
        body = body or {}
        only(body, {"kernel", "holder_pid", "pid_namespace"})
        kernel = _kernel_report(body)
        unseen = elsewhere(self.runtime, body)
        pid = holder_pid(body, lowest=1 if unseen else 2)
        if pid is not None and not unseen:
            check_holder(self.runtime, lease, pid)
        renewed = self._lease_json(self.core.renew(lease.id))
        self._kernel_lives(who, lease.user, self.core.request(lease.request_id).holder)
        if kernel is not None:
            self.runtime.report_kernel(lease.id, kernel)
        if pid is not None:
            self.runtime.report_pid(lease.id, None if unseen else pid)
        return renewed

    def extend(self, who: Identity, lease_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """More time on one's own lease's time limit, where that delays no one the broker
        promised a start to (the core's ``Conflict`` says why not)."""
        lease = self._own_lease(who, lease_id)
        only(body, {"seconds"})
        if "seconds" not in body:
            raise InvalidRequest('say how many seconds more the lease needs: {"seconds": N}')
        return self._lease_json(self.core.extend(lease.id, body["seconds"]))

    def keep(self, who: Identity, lease_id: str) -> dict[str, Any]:
        """The holder's "keep it" on a reclaim warning: counts as activity on the lease."""
        lease = self._own_lease(who, lease_id)
        if lease.state is not LeaseState.ACTIVE:
            raise Conflict(f"lease {lease_id!r} already ended ({lease.state.value})")
        self.runtime.keep(lease.id)
        return self._lease_json(self.core.lease(lease.id))

    # ----------------------------------------------------- usage and quotas

    def usage(
        self, who: Identity, by: str = "user", since: str | None = None, until: str | None = None
    ) -> dict[str, Any]:
        """GPU-hours by user, group, profile or class; a non-admin sees only their own."""
        start, end = parse_time("since", since), parse_time("until", until)
        usage = self.core.usage(start, end, by)  # a bad 'by' is a 400 for anyone
        if not who.admin:
            if by != "user":
                raise Forbidden("only admins see usage grouped by anything but their own user")
            usage = {who.user: usage.get(who.user, 0.0)}
        return {"by": by, "gpu_hours": usage}

    def quotas(self, who: Identity) -> dict[str, Any]:
        """The quotas in force (a non-admin: their own and their groups', which hold back
        their requests too), each with what it holds now (``held_gpus``) and its budget's
        spend so far in the current period (``spent_gpu_hours``, null without a budget)."""
        core = self.core
        return {
            "quotas": [
                {
                    "kind": kind,
                    "name": name,
                    **q.to_json(),
                    "held_gpus": core.budgets.held(kind, name),
                    "spent_gpu_hours": core.budget_spent(kind, name),
                }
                for (kind, name), q in core.quotas().items()
                if who.admin
                or (kind, name) == ("user", who.user)
                or (kind == "group" and name in who.groups)
            ]
        }

    # ---------------------------------------------------------- time limits

    def limits(self, who: Identity) -> dict[str, Any]:
        """The time-limit rules in force (admins only): each class's, profile's and
        group's default and maximum, whether it requires a limit, and where it comes
        from (``config``: the traits; ``admin``: set here, replacing the configured one);
        ``required``: every request needs one (``c.GPUBroker.time_limit_required``)."""
        self._require_admin(who, "see and change time limits")
        limits = self.core.limits
        order = {kind: i for i, kind in enumerate(LIMIT_KINDS)}
        rules = sorted(limits.rules().items(), key=lambda kr: (order[kr[0][0]], kr[0][1]))
        return {
            "required": limits.required,
            "rules": [
                {"kind": kind, "name": name, **rule.to_json(), "source": source}
                for (kind, name), (rule, source) in rules
            ],
        }

    def set_limits(
        self, who: Identity, kind: str, name: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        """Set (replace) the time limits of a class, profile or group: requests checked
        from now on get them; granted leases keep theirs."""
        self._require_admin(who, "see and change time limits")
        only(body, LIMIT_FIELDS)
        rule = LimitRule(**body)
        if rule == LimitRule():
            raise InvalidRequest(
                "time limits set at least one of default_s, max_s or required; DELETE them "
                "to go back to the configured ones"
            )
        kind, name = check_key(kind, name)
        with self._audited(who, "set_time_limits", f"{kind}:{name}", rule.to_json()):
            self.core.limits.set(kind, name, rule)
        return {"kind": kind, "name": name, **rule.to_json(), "source": "admin"}

    def delete_limits(self, who: Identity, kind: str, name: str) -> None:
        """Back to the configured time limits of a class, profile or group (or none)."""
        self._require_admin(who, "see and change time limits")
        kind, name = check_key(kind, name)
        with self._audited(who, "delete_time_limits", f"{kind}:{name}", {}):
            if not self.core.limits.delete(kind, name):
                raise NotFound(f"no time limits were set here for {kind} {name!r}")

    # ------------------------------------------------------------- overview

    def overview(self, who: Identity) -> dict[str, Any]:
        """The whole picture a front shows, in one call: who I am, the devices with their
        holders, readings and health, the queue, and my requests and leases (and the
        leases of my suspended kernels), each as ``who`` may see it."""
        return {
            "me": self.me(who),
            **self.devices(who),
            **self.queue(who),
            **self.requests(who),
            **self.leases(who),
            **self.suspended(who),
            "time_limits": self.time_limits(who),
        }

    def time_limits(self, who: Identity) -> dict[str, Any]:
        """The time limit ``who``'s requests get per job class before a size is chosen
        (from the class's and ``who``'s groups' rules in force), and per MIG profile this
        machine offers and class (the profile's rule too): its default (null for none),
        the longest allowed and whether one is required; what a front's form says before
        the core refuses, a profile's own before the user picks it."""
        limits, groups = self.core.limits, who.groups
        offered = sorted({d.profile for d in self.core.inventory.devices if d.profile})
        return {
            "required": limits.required,
            "classes": {c.value: limits.for_form(c, groups) for c in JobClass},
            "profiles": {
                p: {c.value: limits.for_form(c, groups, p) for c in JobClass} for p in offered
            },
        }


def _kernel_report(body: dict[str, Any]) -> KernelState | None:
    """A renewal's ``kernel`` (``{execution_state, last_activity}``), checked."""
    kernel = body.get("kernel")
    if kernel is None:
        return None
    if not isinstance(kernel, dict) or set(kernel) != {"execution_state", "last_activity"}:
        raise InvalidRequest(
            "'kernel' must be an object with 'execution_state' and 'last_activity'"
        )
    if kernel["execution_state"] not in KERNEL_STATES:
        raise InvalidRequest(
            f"'execution_state' must be one of {', '.join(KERNEL_STATES)}, "
            f"not {kernel['execution_state']!r}"
        )
    if not isinstance(kernel["last_activity"], str):
        raise InvalidRequest("'last_activity' must be an ISO 8601 time")
    since = parse_time("last_activity", kernel["last_activity"])
    assert since is not None
    return KernelState(kernel["execution_state"], since)
