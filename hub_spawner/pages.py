"""The hub pages of the GPU broker service: "My GPUs" for every user, the admin page.

``page_handlers(prefix)`` mounts them in the service: "My GPUs" at the prefix (the link
in the hub's Services menu), the admin page at ``admin`` (``custom:gpubroker:admin``
only), its usage as CSV at ``admin/usage.csv``. They render on the server with the
hub's own stylesheet and dark-mode switch (its static files, from the hub), so they look
like the hub in both themes, and need no JavaScript: every action is a plain form post
with the hub's XSRF token (``_xsrf``) to ``my/<action>`` or ``admin/<action>``.

Thin fronts of the one API, served by the host of the broker as its REST handlers are:
they build the caller's ``Identity`` from HubAuth and call the ``BrokerAPI`` method the
REST API calls (the same rules, the same audit records), in this process rather than
over HTTP to itself; they touch neither the core nor the runtime, only ``api`` and the
wire types. Each action then redirects back with what happened (post/redirect/get). A
refused action shows the page again with the broker's reason, next to the form field it
is about, and the values the admin typed; nothing changed.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from jupyterhub.services.auth import HubOAuthenticated
from jupyterhub.utils import url_path_join
from markupsafe import Markup
from tornado import web

from jupyter_gpubroker.api.identity import Identity
from jupyter_gpubroker.api.rules import BrokerAPI, parse_int
from jupyter_gpubroker.server.handlers import broker_error, broker_errors
from jupyter_gpubroker.wire.errors import BrokerError, InvalidRequest
from jupyter_gpubroker.wire.sizes import QUOTA_BOUNDS, parse_duration, quantity
from jupyter_gpubroker.wire.text import (
    audit_detail,
    devices_held,
    duration,
    eta_text,
    gigabytes,
    gpu_hours,
    holder,
    idle_reclaim_text,
    lease_size,
    memory,
    period,
    sentence,
    size_text,
    visible,
)
from jupyter_gpubroker.wire.times import iso

from .culling import EXTEND_S, time_extended_text, time_limit_text, time_limit_warned
from .forecast_view import forecast_view
from .hubauth import ADMIN_SCOPE, HubAuthFromSettings, check_user, hub_identity, require_use
from .options import JOB_CLASSES, Choices
from .whatif_view import whatif_view

TEMPLATES = Path(__file__).with_name("templates")
USAGE_BY = ("user", "group", "profile", "day")
"""The admin page's usage charts (the API's ``usage`` ``by``)."""
USAGE_DAYS = 30
"""Days of usage the admin page shows unless ``days`` says otherwise."""
ALERT_ROWS = 20
"""Ended alerts shown under the active ones (the CLI and GET alerts page further)."""
AUDIT_ROWS = 25
PERIODS = {str(s): period(s) for s in (3600, 86400, 604800, 2592000)}
"""The budget periods the quota form offers (any other one set through the API is kept)."""
FLASH = "gpubroker-flash"


def _shown(value: Any) -> Any:
    """Every value a page writes: text with its bidirectional controls escaped (no name
    holds one, but a reason or a value typed into a refused form may), so nothing on a
    page reads reversed; HTML escaping is autoescape's, and markup (a macro's, the XSRF
    field) was built from values shown so already."""
    return visible(value) if isinstance(value, str) and not isinstance(value, Markup) else value


_env = Environment(
    loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(), finalize=_shown
)


def _when(value: str | None) -> str:
    """An API time as the pages show it: "2026-12-01 12:40 UTC"."""
    if not value:
        return ""
    return datetime.fromisoformat(value).strftime("%Y-%m-%d %H:%M UTC")


def _num(value: float | None) -> str:
    """A number as a form shows it (none: empty), sevenths as the fractions typed ("1/7",
    a 1g.10gb slice's share of a GPU)."""
    if value is None:
        return ""
    sevenths = value * 7
    if abs(sevenths - round(sevenths)) < 1e-9 and round(sevenths) % 7:
        return f"{round(sevenths)}/7"
    return f"{value:.15g}"


SPANS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def _span(seconds: float | None) -> str:
    """A time limit as its form field shows it, in words ``parse_duration`` reads back:
    "2h", "1h30m", "1d" (none: empty; a fraction of a second: the number)."""
    if seconds is None:
        return ""
    if seconds != int(seconds):
        return _num(seconds)
    left, parts = int(seconds), []
    for unit, size in SPANS:
        n, left = divmod(left, size)
        if n:
            parts.append(f"{n}{unit}")
    return "".join(parts)


_env.filters.update(
    when=_when,
    num=_num,
    duration=duration,
    memory=memory,
    gb=gigabytes,
    lease_size=lease_size,
    span=_span,
    size=size_text,
    eta=eta_text,
    hours=gpu_hours,
    audit=audit_detail,
    period=lambda s: period(float(s)),
    idle_reclaim=lambda said: sentence(idle_reclaim_text(said["action"], said["reason"])),
)


def bars(values: dict[str, float], sort_by_key: bool = False) -> list[dict[str, Any]]:
    """A bar chart's rows: each key's GPU-hours and bar length in % of the largest."""
    top = max(values.values(), default=0.0) or 1.0
    items = sorted(values.items()) if sort_by_key else sorted(values.items(), key=lambda x: -x[1])
    return [{"key": k or "(none)", "value": v, "pct": 100.0 * v / top} for k, v in items]


class PageHandler(HubAuthFromSettings, HubOAuthenticated, web.RequestHandler):
    """A page of a logged-in hub user with the use scope: a browser without the service's
    login is sent through the hub's OAuth; a form post without a valid XSRF token, whose
    login cookie the hub's auth then ignores, is refused with a sentence. A broker error
    shows its sentence with its status (``@broker_errors`` on each method)."""

    who: Identity

    @property
    def api(self) -> BrokerAPI:
        return self.settings["gpubroker_api"]  # type: ignore[no-any-return]

    @broker_errors
    async def prepare(self) -> None:
        model = await self.hub_auth.get_user(self, sync=False)
        if not model:
            if self.request.method in ("GET", "HEAD"):
                self.redirect(self.get_login_url())
                return
            raise web.HTTPError(
                403,
                "This form was refused: it carries no valid XSRF token of your login (reload "
                "the page and send it again), or you are not logged in.",
            )
        check_user(model, self.hub_scopes)
        require_use(model)
        self.current_user = model
        self.who = hub_identity(self.api, model)

    def url(self, *parts: str) -> str:
        return str(url_path_join(self.hub_auth.base_url, *parts))

    def render_page(self, template: str, status: int = 200, **context: Any) -> None:
        hub = self.hub_auth.hub_prefix
        self.set_status(status)
        self.set_header("Cache-Control", "no-store")
        self.finish(
            _env.get_template(template).render(
                who=getattr(self, "who", None),
                hub_prefix=hub,
                static=lambda path: url_path_join(hub, "static", path),
                url=self.url,
                xsrf_form_html=self.xsrf_form_html,
                flash=self._take_flash(),
                **context,
            )
        )

    def _take_flash(self) -> str:
        """What the last action did (set before its redirect), shown once."""
        flash = self.get_signed_cookie(FLASH, max_age_days=1)
        if flash:
            self.clear_cookie(FLASH, path=self.hub_auth.base_url)
        return flash.decode() if flash else ""

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        error = broker_error(exc)
        message = error.message if error else getattr(exc, "log_message", None) or self._reason
        self.render_page("error.html", status_code, code=status_code, message=message)

    def require_admin(self) -> None:
        if not self.who.admin:
            raise web.HTTPError(
                403,
                f"Only GPU broker admins see this page: {self.who.user} lacks the "
                f"{ADMIN_SCOPE} scope (a hub admin grants it in c.JupyterHub.load_roles).",
            )

    # -- the pages' contents, from the API

    def my_context(self) -> dict[str, Any]:
        api, who = self.api, self.who
        overview = api.overview(who)
        quotas = api.quotas(who)["quotas"]
        choices = Choices(overview, quotas)
        waiting = [r for r in overview["requests"] if r["state"] == "queued"]
        # their own; their group's comes with the choices (``group_text``)
        quota = next((q for q in quotas if (q["kind"], q["name"]) == ("user", who.user)), None)
        budget_left = None
        if quota and quota["gpu_hours"] is not None:
            budget_left = max(0.0, quota["gpu_hours"] - (quota["spent_gpu_hours"] or 0.0))
        return {
            "page": "my",
            "waiting": [
                {**r, "why": choices.blocked(r), "holder_text": holder(r["holder"])}
                for r in waiting
            ],
            "leases": overview["leases"],
            "suspended": overview["suspended"],
            "time_up": {
                x["id"]: time_limit_text(x, server=False)
                for x in overview["leases"]
                if time_limit_warned(x)
            },
            "queue_length": overview["length"],
            "quota": quota,
            "held": devices_held(choices.mine),
            "allows": choices.quota(),
            "group": sentence(choices.group_text()) if choices.group_quota else "",
            "budget_left": budget_left,
            "periods": PERIODS,
            "used": api.usage(who, "user")["gpu_hours"].get(who.user, 0.0),
            "outside": [
                o["text"]
                for g in overview["gpus"]
                for d in g["devices"]
                for o in d["outside"]
                if o["user"] == who.user
            ],
        }

    def usage_days(self) -> tuple[int, str]:
        """The days of usage asked for (``days``) and the ISO time they start."""
        days = parse_int("days", self.get_argument("days", None), 1, 3660, USAGE_DAYS)
        return days, str(iso(self.api.now() - days * 86400.0))

    def admin_context(self) -> dict[str, Any]:
        days, since = self.usage_days()
        return admin_view(self.api, self.who, days, since, self.get_argument("after", None))


def admin_view(
    api: BrokerAPI, who: Identity, days: int, since: str, after: str | None
) -> dict[str, Any]:
    """What the admin page shows: quotas, time limits, alerts, queue, devices and the
    engine they are read from, usage since ``since`` (``days`` days), the demand
    forecast and the what-if replays, the audit log after ``after``."""
    audit = api.audit(who, after=after, limit=str(AUDIT_ROWS))
    quotas = api.quotas(who)["quotas"]
    alerts = api.alerts(who, limit=str(ALERT_ROWS))
    devices = api.devices(who)
    return {
        "page": "admin",
        "limits": api.limits(who),
        "alerts": alerts["active"],
        "alert_history": alerts["history"],
        "quotas": sorted(quotas, key=lambda q: (q["kind"], q["name"])),
        "periods": PERIODS,
        "queue": api.queue(who)["queue"],
        "job_classes": JOB_CLASSES,
        "gpus": devices["gpus"],
        "engine": devices.get("engine"),
        "days": days,
        "charts": {
            by: bars(api.usage(who, by, since)["gpu_hours"], sort_by_key=by == "day")
            for by in USAGE_BY
        },
        "forecast": forecast_view(api.forecast(who)),
        "whatif": whatif_view(api.whatif_state(who), api.now()),
        "audit": audit["audit"],
        "audit_next": audit["next_after"],
        "audit_paged": after is not None,
    }


class UnavailablePage(PageHandler):
    """Every page while the broker cannot run: the reason the API and the spawn form give,
    on the hub's look, to a logged-in user of the broker (a browser logs in first, as on
    any page; no page a user reaches says a bare "Forbidden")."""

    async def prepare(self) -> None:
        model = await self.hub_auth.get_user(self, sync=False)
        if not model:
            self.redirect(self.get_login_url())
            return
        check_user(model, self.hub_scopes)
        require_use(model)
        self.current_user = model

    def get(self, *_: str) -> None:
        why = self.settings["unavailable"]
        raise web.HTTPError(503, f"The GPU broker cannot run now: {why.rstrip('.')}.")

    post = get


class MyPage(PageHandler):
    """What I hold and wait for, my quota, budget and usage; release and cancel."""

    @broker_errors
    def get(self) -> None:
        self.render_page("my.html", **self.my_context())


class AdminPage(PageHandler):
    """Quotas, time limits, the live queue, the devices, usage charts and the audit log."""

    @broker_errors
    def get(self) -> None:
        self.require_admin()
        self.render_page("admin.html", **self.admin_context())


class UsageCSV(PageHandler):
    """The admin page's usage, one row per (by, key): GPU-hours over its days."""

    @broker_errors
    def get(self) -> None:
        self.require_admin()
        since = self.usage_days()[1]
        usage = {by: self.api.usage(self.who, by, since)["gpu_hours"] for by in USAGE_BY}
        self.set_header("Content-Type", "text/csv; charset=utf-8")
        self.set_header("Content-Disposition", 'attachment; filename="gpubroker-usage.csv"')
        self.finish(usage_csv(usage))


FORMULA_STARTS = ("=", "+", "-", "@")
"""What makes a spreadsheet read a cell as a formula: a user or group name may start so."""


def usage_csv(usage: dict[str, dict[str, float]]) -> str:
    """GPU-hours by (by, key) as CSV; a key a spreadsheet would run as a formula (a name
    such as ``=HYPERLINK(...)``) starts with ``'``, which shows it as the text it is."""
    out = io.StringIO()
    rows = csv.writer(out)
    rows.writerow(["by", "key", "gpu_hours"])
    for by, hours_by_key in usage.items():
        for key, hours in sorted(hours_by_key.items()):
            cell = f"'{key}" if key.startswith(FORMULA_STARTS) else key
            rows.writerow([by, cell, f"{hours:.6f}"])
    return out.getvalue()


Form = dict[str, str]
Action = Callable[[BrokerAPI, Identity, Form], str]


QUOTA_FIELDS = {
    "share": ("Share", "a weight such as 1 or 2.5"),
    "max_gpus": ("Most at once", "GPU-equivalents such as 2, 0.5 or 1/7 (a 1g.10gb slice), or 0"),
    "gpu_hours": ("Budget", "GPU-hours such as 100, or 0"),
    "period_s": ("Period", "one of the periods offered"),
}
"""Each quota field as the admin page names it (its column), and what it takes."""


def _quota_number(form: Form, field: str) -> float | None:
    """A quota's field as typed (empty: none): a number or a fraction ("1/7"), within the
    bounds the broker keeps (``QUOTA_BOUNDS``), else the sentence saying what is wrong,
    named as the page names the field, next to it."""
    text = form.get(field, "").strip()
    if not text:
        return None
    top, _, bottom = text.partition("/")
    try:
        value: float | None = float(top) / float(bottom) if bottom else float(top)
    except (ValueError, ZeroDivisionError):
        value = None
    lo, hi = QUOTA_BOUNDS[field]
    if value is None or not quantity(value, lo, hi):
        label, takes = QUOTA_FIELDS[field]
        upper = f" up to {hi:,.0f}" if value is not None and value > hi else ""
        message = f"{label} must be {takes}{upper}, not {text!r}"
        raise InvalidRequest(message, fields={field: message})
    return value


def _set_quota(api: BrokerAPI, who: Identity, form: Form) -> str:
    body, problems = {}, {}
    for field in QUOTA_BOUNDS:
        try:
            body[field] = _quota_number(form, field)
        except InvalidRequest as e:
            problems.update(e.fields)
    if not problems and (body.get("gpu_hours") is None) != (body.get("period_s") is None):
        if body.get("period_s") is None:
            problems["period_s"] = "A budget needs a period: choose one, or empty its GPU-hours"
        else:
            problems["gpu_hours"] = "A budget needs its GPU-hours, or choose no budget"
    if problems:
        raise InvalidRequest("; ".join(problems.values()), fields=problems)
    kind, name = form.get("kind", ""), form.get("name", "").strip()
    api.set_quota(who, kind, name, body)
    return f"The quota of {kind} {name} is set."


def _delete_quota(api: BrokerAPI, who: Identity, form: Form) -> str:
    api.delete_quota(who, form.get("kind", ""), form.get("name", ""))
    return f"{form.get('kind')} {form.get('name')} is back on the default share and no limits."


def _limit(form: Form, field: str, what: str) -> float | None:
    """A time limit typed in a form ("2h", "5400"; empty: none), or the sentence saying
    what is wrong with it, next to its field."""
    text = form.get(field, "").strip()
    if not text:
        return None
    try:
        return parse_duration(text, what)
    except InvalidRequest as e:
        raise InvalidRequest(e.message, fields={field: e.message}) from None


def _set_limits(api: BrokerAPI, who: Identity, form: Form) -> str:
    body = {
        "default_s": _limit(form, "default_s", "the default time limit"),
        "max_s": _limit(form, "max_s", "the maximum time limit"),
        "required": bool(form.get("required")),
    }
    rule = api.set_limits(who, form.get("kind", ""), form.get("name", "").strip(), body)
    return f"The time limits of {rule['kind']} {rule['name']} are set."


def _delete_limits(api: BrokerAPI, who: Identity, form: Form) -> str:
    api.delete_limits(who, form.get("kind", ""), form.get("name", ""))
    return f"{form.get('kind')} {form.get('name')} is back on the configured time limits."


MIG_RECUTTING = {"on": True, "off": False}


def _whatif(api: BrokerAPI, who: Identity, form: Form) -> str:
    """Start a what-if replay (the page shows it running, then its figures): GPUs added
    or taken away, another policy, MIG re-cutting on or off, another idle timeout (in
    minutes) or reclaim action; empty: as recorded."""
    body: dict[str, Any] = {}
    text = form.get("gpus", "").strip() or "0"
    try:
        body["gpus"] = int(text)
    except ValueError:
        message = (
            f"GPUs added must be a whole number such as 2, or -1 to take one away, not {text!r}"
        )
        raise InvalidRequest(message, fields={"gpus": message}) from None
    if form.get("policy"):
        body["policy"] = form["policy"]
    if form.get("dynamic_mig") in MIG_RECUTTING:
        body["dynamic_mig"] = MIG_RECUTTING[form["dynamic_mig"]]
    if minutes := form.get("idle_timeout", "").strip():
        try:
            body["idle_timeout"] = float(minutes) * 60
        except ValueError:
            message = f"The idle timeout must be minutes, such as 10, not {minutes!r}"
            raise InvalidRequest(message, fields={"idle_timeout": message}) from None
    if form.get("reclaim_action"):
        body["reclaim_action"] = form["reclaim_action"]
    api.whatif(who, body)  # its outcome is kept for the page: the future is not awaited
    return "The what-if replay runs: its figures show under What if once it is done."


def _cancel(api: BrokerAPI, who: Identity, form: Form) -> str:
    r = api.cancel(who, form.get("request_id", ""), form.get("reason") or None)
    return f"{r['user']}'s request for {size_text(r)} is {r['state']}."


def _set_class(api: BrokerAPI, who: Identity, form: Form) -> str:
    body = {"job_class": form.get("job_class", ""), "reason": form.get("reason") or None}
    r = api.change_request(who, form.get("request_id", ""), body)
    return f"{r['user']}'s request for {size_text(r)} is now {r['job_class']}."


def _extend(api: BrokerAPI, who: Identity, form: Form) -> str:
    lease = api.extend(who, form.get("lease_id", ""), {"seconds": EXTEND_S})
    return time_extended_text(lease)


def _release(api: BrokerAPI, who: Identity, form: Form) -> str:
    lease = api.release(who, form.get("lease_id", ""))
    return f"Released {', '.join(lease['devices'])}."


def _drain(api: BrokerAPI, who: Identity, form: Form) -> str:
    body: dict[str, Any] = {"reason": form.get("reason", "")}
    if form.get("move"):
        body["move"] = True
    return str(api.drain(who, form.get("uuid", ""), body)["message"])


def _undrain(api: BrokerAPI, who: Identity, form: Form) -> str:
    reason = form.get("reason") or None
    return str(api.undrain(who, form.get("uuid", ""), reason)["message"])


ACTIONS: dict[str, dict[str, Action]] = {
    "my": {"cancel": _cancel, "release": _release, "extend": _extend},
    "admin": {
        "quota": _set_quota,
        "quota-delete": _delete_quota,
        "limits": _set_limits,
        "limits-delete": _delete_limits,
        "cancel": _cancel,
        "class": _set_class,
        "drain": _drain,
        "undrain": _undrain,
        "whatif": _whatif,
    },
}


class ActionHandler(PageHandler):
    """A form post: ``page`` (``my`` or ``admin``) and its ``action``, done by the API as
    the logged-in user (whose rules refuse anything not theirs to do)."""

    @broker_errors
    def post(self, page: str, action: str) -> None:
        do = ACTIONS[page].get(action)
        if do is None:
            raise web.HTTPError(404, f"No action {action!r} on this page.")
        if page == "admin":
            self.require_admin()
        form = {k: self.get_body_argument(k, "") for k in self.request.body_arguments}
        form.pop("_xsrf", None)
        try:
            done = do(self.api, self.who, form)
        except BrokerError as e:
            fields = e.fields if isinstance(e, InvalidRequest) else {}
            failed = {"action": action, "form": form, "message": e.message, "fields": fields}
            if page == "admin":
                self.render_page("admin.html", e.status, failed=failed, **self.admin_context())
            else:
                self.render_page("my.html", e.status, failed=failed, **self.my_context())
            return
        self.set_signed_cookie(FLASH, done, path=self.hub_auth.base_url, httponly=True)
        back = self.url("admin") if page == "admin" else self.url()
        self.redirect(back + ("#whatif" if action == "whatif" else ""), status=303)


def page_handlers(prefix: str) -> list[tuple[str, type[web.RequestHandler]]]:
    """The pages' routes under the service's ``prefix``."""
    root = prefix.rstrip("/")
    return [
        (root + "/?", MyPage),
        (root + "/admin/?", AdminPage),
        (root + "/admin/usage.csv", UsageCSV),
        (root + "/(my|admin)/([a-z-]+)", ActionHandler),
    ]
