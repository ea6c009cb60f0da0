"""What a GPU server may ask for, as pure builders apart from the stateful spawner (as
KubeSpawner keeps ``make_pod`` apart): ``user_options`` checked as a broker request, the
options form's fields, why a start waits, and the choices a user has on this machine.
Tested without a hub."""

from __future__ import annotations

from html import escape
from typing import Any

from jupyter_gpubroker.wire.errors import BrokerError
from jupyter_gpubroker.wire.sizes import (
    MAX_DURATION_S,
    Size,
    gb_to_mib,
    hold_seconds,
)
from jupyter_gpubroker.wire.text import (
    count,
    devices_held,
    duration,
    eta_text,
    gigabytes,
    memory,
    period,
    queue_place,
    quota_allows,
    size_text,
    worth,
)

SIZE_FIELDS = ("gpus", "profile", "min_memory_gb", "share_gb")
GPU_KINDS = ("cpu", *SIZE_FIELDS)
"""The options form's choices (its ``gpu_kind``): CPU only, or one of the sizes."""
OPTION_FIELDS = (*SIZE_FIELDS, "compute_percent", "job_class", "limit_s", "expected_duration_s")
JOB_CLASSES = ("interactive", "batch")
SLACK = 1e-3
"""How far a sum of GPU-equivalents may pass a quota and still fit it: the API rounds a
slice's share of a GPU to four digits (1/7 to 0.1429), where a quota may be exact."""


def gpu_request(options: dict[str, Any]) -> dict[str, Any] | None:
    """The broker request ``user_options`` ask for (``None``: a CPU-only server), checked
    the way the broker checks a request; ``ValueError`` says what is wrong."""
    unknown = set(options) - set(OPTION_FIELDS)
    if unknown:
        raise ValueError(
            f"unknown server option(s) {', '.join(sorted(unknown))}: give one of "
            f"{', '.join(SIZE_FIELDS)} (none for a CPU-only server) and optionally job_class, "
            "limit_s and expected_duration_s"
        )
    size = {k: options[k] for k in SIZE_FIELDS if options.get(k) not in (None, "")}
    if options.get("compute_percent") not in (None, ""):
        size["compute_percent"] = options["compute_percent"]
    job_class = options.get("job_class") or "interactive"
    if job_class not in JOB_CLASSES:
        raise ValueError(f"job_class must be 'interactive' or 'batch', not {job_class!r}")
    if not size:
        return None
    request: dict[str, Any] = {**size, "job_class": job_class}
    try:
        Size(**size)
        for field, what in (("limit_s", "limit_s (the time limit)"), ("expected_duration_s", "")):
            if options.get(field) not in (None, ""):
                request[field] = hold_seconds(options[field], what or field)
    except BrokerError as e:
        raise ValueError(e.message) from None
    return request


def options_from_form(form: dict[str, list[str]]) -> dict[str, Any]:
    """The form's choice as ``user_options`` (the REST API's shape); numbers as numbers
    when they read as such, anything else is left for ``gpu_request`` to refuse; a
    ``gpu_kind`` the form does not offer is a ``ValueError``."""
    field = {k: v[0].strip() for k, v in form.items() if v}
    kind = field.get("gpu_kind", "cpu")
    if kind not in GPU_KINDS:  # never a CPU-only server for a choice the form lacks
        raise ValueError(
            f"gpu_kind must be {', '.join(GPU_KINDS[:-1])} or {GPU_KINDS[-1]}, not {kind!r}"
        )
    options: dict[str, Any] = {"job_class": field.get("job_class") or "interactive"}
    value = field.get(kind, "")
    if kind == "gpus":
        options["gpus"] = int(value) if value.isdigit() else value
    elif kind == "profile":
        options["profile"] = value
    elif kind == "min_memory_gb":
        options["min_memory_gb"] = _number(value)
    elif kind == "share_gb":
        options["share_gb"] = _number(value)
        percent = field.get("compute_percent", "")
        if percent:
            options["compute_percent"] = int(percent) if percent.isdigit() else _number(percent)
    hours = field.get("hours", "")
    if kind != "cpu" and hours:
        options["limit_s"] = _hours(hours)
    return options


def _hours(text: str) -> float:
    """The form's "For N hours" as a time limit in seconds; ``ValueError`` in the form's
    words (the core refuses one above the class's maximum with its own sentence)."""
    number = _number(text)
    if not isinstance(number, float) or not 0 < number * 3600 <= MAX_DURATION_S:
        raise ValueError(
            f"For how many hours: give a number of hours above 0 and up to a year, such as "
            f"2 or 0.5, not {text!r}"
        )
    return number * 3600


def _number(text: str) -> float | str:
    """A form's number as a float; text that is none is left for ``gpu_request`` to refuse."""
    try:
        return float(text)
    except ValueError:
        return text


def waiting_message(
    request: dict[str, Any], ahead: dict[str, int], length: int, reason: str = ""
) -> str:
    """Where a waiting server's request is and why: "Waiting for 1g.10gb (interactive):
    every 1g.10gb is in use; position 2 of 5, one request ahead (interactive); ETA 10:40
    (10:20-11:30)": the position once (``queue_place``). A quota's hold (the request's
    ``held_back``) is the reason, and says when it starts: no ETA from the queue then."""
    held = request.get("held_back")
    why = f"{held or reason}; " if held or reason else ""
    place = queue_place(request.get("position"), length, ahead)
    eta = "" if held else f"; ETA {eta_text(request)}"
    return f"Waiting for {size_text(request)} ({request['job_class']}): {why}{place}{eta}"


def _limit_words(limits: dict[str, Any], required: bool) -> list[str]:
    """A class's or profile's time limits as the form says them: "2 h 00 min if left
    empty" or "required", and "at most 8 h 00 min" (a year, no rule's: nothing)."""
    words = []
    if limits["default_s"] is not None:
        words.append(f"{duration(limits['default_s'])} if left empty")
    elif limits.get("required", required):
        words.append("required")
    if limits["max_s"] < MAX_DURATION_S:
        words.append(f"at most {duration(limits['max_s'])}")
    return words


def _profile_words(
    profile: str,
    by_class: dict[str, dict[str, Any]],
    classes: dict[str, list[str]],
    required: bool,
) -> list[tuple[str, list[str]]]:
    """What a profile's limits add to its class's (``classes``: their words): a tighter
    maximum, its own default. The form says them before the user picks the profile, once
    where every class gets the same ("a 3g.40gb slice"), else per class ("a 3g.40gb
    slice (batch)")."""
    own = {
        cls: [w for w in _limit_words(limits, required) if w not in classes[cls]]
        for cls, limits in by_class.items()
        if cls in classes
    }
    if len(own) == len(classes) and len({tuple(w) for w in own.values()}) == 1:
        return [(f"a {profile} slice", next(iter(own.values())))]
    return [(f"a {profile} slice ({cls})", words) for cls, words in own.items()]


def slices_by_profile(devices: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The MIG slices among ``devices``, by profile name."""
    profiles: dict[str, list[dict[str, Any]]] = {}
    for d in devices:
        if d["kind"] == "mig":
            profiles.setdefault(d["profile"], []).append(d)
    return profiles


def held_by(user: str, gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What ``user`` holds, as ``devices_held`` reads it: their devices and their shares,
    a share counted as its part of its GPU's memory, as the broker counts it."""
    devices = [d for g in gpus for d in g["devices"]]
    mine = [d for d in devices if (d["holder"] or {}).get("user") == user]
    return mine + [
        {
            "kind": "share",
            "memory_mib": x["memory_mib"],
            "gpu_equivalents": x["memory_mib"] / g["memory_mib"],
        }
        for g in gpus
        for x in (g.get("sharing") or {}).get("shares") or ()
        if x.get("user") == user
    ]


class Choices:
    """What a user may ask for on this machine and within their quota, from the broker's
    ``overview`` and the user's ``quotas``: for refusals and the options form."""

    def __init__(self, overview: dict[str, Any], quotas: list[dict[str, Any]]) -> None:
        self.overview = overview
        devices = [d for g in overview["gpus"] for d in g["devices"]]
        self.whole = [d for d in devices if d["kind"] != "mig" and d.get("lent") != "shared"]
        self.shared = [g for g in overview["gpus"] if (g.get("sharing") or {}).get("shares_now")]
        """The GPUs that take shares now, with what holds them."""
        self.profiles = slices_by_profile(devices)
        user = overview["me"]["user"]
        self._take_quotas(user, overview["me"].get("groups") or [], quotas)
        self.profile_equivalents = {p: ds[0]["gpu_equivalents"] for p, ds in self.profiles.items()}
        sizes = [d["memory_mib"] for d in devices if self.within_quota(d["gpu_equivalents"])]
        # GB as the broker compares them, rounded down: a size shown fits
        self.largest_gb = float(gigabytes(max(sizes, default=0)))
        self.smallest_gb = float(gigabytes(min(sizes, default=0)))
        self.mine = held_by(user, overview["gpus"])
        self.shared_mib = max(
            (g["memory_mib"] for g in overview["gpus"] if g.get("sharing")), default=0
        )
        self.held = sum(d["gpu_equivalents"] for d in self.mine)

    def _take_quotas(self, user: str, groups: list[str], quotas: list[dict[str, Any]]) -> None:
        """The user's own cap and share, and the quota of the group they are charged to."""
        by = {(q["kind"], q["name"]): q for q in quotas}
        own = by.get(("user", user)) or {}
        self.max_gpus: float | None = own.get("max_gpus")
        self.share: float | None = own.get("share")
        self.group = groups[0] if groups else None
        """The group a request is charged to, as the broker charges it (the first)."""
        self.group_quota: dict[str, Any] | None = by.get(("group", self.group or ""))

    def within_quota(self, gpu_equivalents: float) -> bool:
        """Whether a device this large is ever allowed: by the user's quota and by their
        group's."""
        caps = [self.max_gpus, (self.group_quota or {}).get("max_gpus")]
        return all(cap is None or gpu_equivalents <= cap + SLACK for cap in caps)

    def quota_wait(self, gpu_equivalents: float) -> str:
        """Why a quota would keep a new request of this size waiting now ("" if none does):
        the user's, or their group's, naming the group."""
        if self.max_gpus is not None and self.held + gpu_equivalents > self.max_gpus + SLACK:
            return f"waits: you hold what your quota allows ({self.quota()})"
        q = self.group_quota
        if q is None:
            return ""
        whose = f"group {self.group}"
        if q["max_gpus"] is not None and q["held_gpus"] + gpu_equivalents > q["max_gpus"] + SLACK:
            allows = quota_allows(q["max_gpus"], self.profile_equivalents, self.shared_mib)
            return f"waits: {whose}'s members hold what its quota allows ({allows})"
        if q["gpu_hours"] is not None and (q["spent_gpu_hours"] or 0) >= q["gpu_hours"]:
            return f"waits: {whose} has spent its GPU-hour budget for this period"
        return ""

    def group_text(self) -> str:
        """The group's share, cap and budget, as its members read them ("" without one)."""
        q = self.group_quota
        if q is None:
            return ""
        said = [f"share {q['share']:g}" if q["share"] is not None else "the default share"]
        if q["max_gpus"] is not None:
            held = worth(q["held_gpus"], self.profile_equivalents)
            allows = quota_allows(q["max_gpus"], self.profile_equivalents, self.shared_mib)
            said.append(f"its quota allows {allows} and its members hold {held} now")
        if q["gpu_hours"] is not None:
            spent = q["spent_gpu_hours"] or 0.0
            said.append(
                f"a budget of {q['gpu_hours']:g} GPU-hours per {period(q['period_s'])}, "
                f"{spent:.2f} spent"
            )
        return f"your group {self.group}: " + "; ".join(said)

    @staticmethod
    def free(devices: list[dict[str, Any]]) -> int:
        return sum(
            not d["holder"] and not d["drained"] and not d["vacating"] and not d.get("shares")
            for d in devices
        )

    def waits(self, **size: Any) -> str:
        """The expected wait for one choice: at once when a device is free and no quota
        holds it back, else why it waits, or how many wait for the same and when the last
        of them is expected to start."""
        held_back = self.quota_wait(self._equivalents(**size))
        if held_back:
            return held_back
        same = [e for e in self.overview["queue"] if all(e.get(k) == v for k, v in size.items())]
        if not same:
            return "starts at once" if self._free_for(**size) else "waits for a device to free"
        waiting = f"{count(len(same), 'request')} {'waits' if len(same) == 1 else 'wait'}"
        eta = eta_text(same[-1])
        if eta == "unknown":
            return f"{waiting} for the same, with no estimate yet of when"
        return f"{waiting} for the same; the last expected to start {eta}"

    def quota(self) -> str:
        """The user's quota in things: "one 1g.10gb slice at a time"."""
        return quota_allows(self.max_gpus, self.profile_equivalents, self.shared_mib)

    def blocked(self, request: dict[str, Any]) -> str:
        """Why a request waits, in words: the broker's when a quota holds it back (its
        user's or its group's, ``held_back``), else every fitting device being in use, or
        the requests ahead of it."""
        if request.get("held_back"):
            return str(request["held_back"])
        if request.get("share_gb"):
            return f"no GPU shared here has {request['share_gb']:g} GB free now"
        if self.free(self._fits(request)) == 0:
            return f"every {size_text(request)} is in use"
        if (request.get("position") or 1) > 1:
            return "the requests ahead of it come first"
        return "it is next: a free device is about to be granted"

    def _fits(self, size: dict[str, Any]) -> list[dict[str, Any]]:
        """The devices that could take one unit of ``size``."""
        if size.get("profile"):
            return self.profiles.get(size["profile"], [])
        if size.get("gpus"):
            return self.whole
        need = gb_to_mib(size["min_memory_gb"])
        return [d for g in self.overview["gpus"] for d in g["devices"] if d["memory_mib"] >= need]

    def _equivalents(self, **size: Any) -> float:
        """The GPU-equivalents a grant of ``size`` would hold (the smallest fitting device)."""
        if size.get("gpus"):
            return float(size["gpus"])
        return min((d["gpu_equivalents"] for d in self._fits(size)), default=0.0)

    def _free_for(self, **size: Any) -> bool:
        if "profile" in size:
            return self.free(self.profiles.get(size["profile"], [])) > 0
        if "gpus" in size:
            return self.free(self.whole) >= int(size["gpus"])
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
        if self.shared:
            rows.append(self._share_row(row))
        if self.largest_gb:
            rows.append(
                row.format(
                    kind="min_memory_gb",
                    checked="",
                    label="Any device with at least",
                    field='<input type="number" name="min_memory_gb" min="1" step="any" '
                    f'max="{self.largest_gb:g}" value="{self.smallest_gb:g}" aria-label="GB"> GB',
                    note=f"the largest has {self.largest_gb:.1f} GB, as NVIDIA names sizes (a "
                    "3g.20gb slice has 20 GB)",
                )
            )
        classes = "".join(f'<option value="{c}">{c}</option>' for c in JOB_CLASSES)
        quota = (
            f"your quota allows {self.quota()}"
            if self.max_gpus is not None
            else "no quota of your own"
        )
        share = f"your share: {self.share:g}" if self.share is not None else "the default share"
        group = f"; {escape(self.group_text())}" if self.group_quota else ""
        return (
            '<fieldset class="gpubroker-options"><legend>GPU</legend>'
            + "".join(rows)
            + '<div class="mt-2"><label for="gpu-class">Class</label> '
            f'<select name="job_class" id="gpu-class">{classes}</select></div>'
            '<div class="mt-2"><label for="gpu-hours">For</label> <input type="number" '
            'name="hours" id="gpu-hours" min="0" step="any" aria-label="hours"> hours (you '
            f'can extend it) <span class="form-text">{escape(self.limit_note())}</span></div>'
            f'<p class="form-text">You hold {devices_held(self.mine)} now; {quota}; '
            f"{share}{group}; {count(self.overview['length'], 'request')} in the queue.</p>"
            "</fieldset>"
        )

    def _share_row(self, row: str) -> str:
        """The choice of a share: its memory, an optional compute cap, the room free now
        and what holds a share on these GPUs ("enforced by MPS")."""
        room = max(g["sharing"]["room_mib"] for g in self.shared)
        largest = max(g["memory_mib"] for g in self.shared)
        holds = sorted({g["sharing"]["text"] for g in self.shared})
        return row.format(
            kind="share_gb",
            checked="",
            label="Part of a shared GPU:",
            field='<input type="number" name="share_gb" min="1" step="any" '
            f'max="{gigabytes(largest)}" value="8" aria-label="GB of a shared '
            'GPU"> GB, at most <input type="number" name="compute_percent" min="1" max="100" '
            'step="1" aria-label="percent of its compute"> % of its compute',
            note=escape(f"{memory(room)} free on a shared GPU now; {'; '.join(holds)}"),
        )

    def limit_note(self) -> str:
        """What the form's "For N hours" field does here, from the broker's time limits:
        "...; interactive: at most 8 h 00 min; a 3g.40gb slice: at most 4 h 00 min"."""
        limits = self.overview.get("time_limits") or {"required": False, "classes": {}}
        required = limits["required"]
        none = {"default_s": None, "max_s": MAX_DURATION_S}
        classes = {c: _limit_words(limits["classes"].get(c) or none, required) for c in JOB_CLASSES}
        said = ["how long you need the GPU: the server is stopped after that unless you extend it"]
        for cls, words in classes.items():
            said += [f"{cls}: {w}" for w in words]
        for profile, by_class in sorted((limits.get("profiles") or {}).items()):
            for who, words in _profile_words(profile, by_class, classes, required):
                said += [f"{who}: {w}" for w in words]
        return "; ".join(said)

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
        quota = f"; your quota allows {self.quota()}" if self.max_gpus is not None else ""
        group = f"; {self.group_text()}" if self.group_quota else ""
        return (
            f"you may ask for {', '.join(offers)}, with job_class interactive or batch{quota}"
            f"{group}"
        )
