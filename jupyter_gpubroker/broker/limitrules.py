"""Time-limit rules per job class, profile and group, and the precedence between them.

A rule (:class:`LimitRule`) gives the requests it applies to a default time limit (for a
request that states none), a maximum (the longest one may state or be extended to) and
whether a limit is required. A request is subject to its job class's rule, its
profile's (``profile_names``: "1g.10gb", "gpus=2") and each of its groups'. Of those:

- the maximum is the tightest of theirs;
- the default is the most specific one's (group, then profile, then class; of several
  groups the shortest), and never above that maximum;
- a limit is required where any of them (or ``BrokerConfig.limit_required``) says so and
  no default applies.

:class:`LimitRules` holds the rules in force: the configured ones (``BrokerConfig``,
``c.GPUBroker.*time_limit*``) and those an admin set at run time (the API, the hub's
admin page), which are kept in the store and replace the configured rule of the same
class, profile or group until an admin deletes them. A request checked after a change
gets the new rules; a lease keeps the limit it was granted. Each change sends a
``limits`` event with the rule now in force, so a front that shows limits reads them
again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..wire.errors import InvalidRequest
from ..wire.sizes import MAX_DURATION_S, Size, hold_seconds, number, said, seconds_between
from ..wire.text import duration
from .models import Event, JobClass, check_name

if TYPE_CHECKING:
    from .clock import Clock
    from .config import BrokerConfig
    from .store import Store

LIMIT_KINDS = ("class", "profile", "group")
"""What a rule is for, most general first."""
LimitKey = tuple[str, str]
"""(kind, name): ``("class", "interactive")``, ``("profile", "1g.10gb")``,
``("group", "students")``."""
MIN_LIMIT_S = 1.0
LIMIT_WORDS = seconds_between(MIN_LIMIT_S, MAX_DURATION_S)


def profile_name(size: Size) -> str:
    """How a rule names a request's size: the MIG profile ("1g.10gb"), else its short
    form ("gpus=2", "gpus=2@H100-80GB", "min_memory_gb=20")."""
    return size.profile or size.key


def profile_names(size: Size) -> list[str]:
    """The profile rules a request of ``size`` is subject to: its own, and for whole GPUs
    of one model also those for that many GPUs of any model."""
    names = [profile_name(size)]
    if size.model is not None:
        names.append(profile_name(Size(gpus=size.gpus)))
    return names


def check_key(kind: str, name: str) -> LimitKey:
    """A rule's (kind, name) as the rules keep it (a profile in its short form), or a
    clear ``InvalidRequest``."""
    if kind not in LIMIT_KINDS:
        raise InvalidRequest(
            f"time limits are set per 'class', 'profile' or 'group', not {kind!r}",
            fields={"kind": "say 'class', 'profile' or 'group'"},
        )
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"say which {kind} the time limits are for", fields={"name": "empty"})
    if kind == "class":
        if name not in {c.value for c in JobClass}:
            raise InvalidRequest(
                f"{name!r} is not a job class: job classes are 'interactive' and 'batch'",
                fields={"name": "not a job class"},
            )
    elif kind == "profile":
        try:
            name = profile_name(Size.parse(name))
        except InvalidRequest as e:
            raise type(e)(
                f"{name!r} is not a profile: {e.message}", fields={"name": e.message}
            ) from None
    else:
        check_name(name, "group")
    return kind, name


def _seconds(value: object, what: str) -> str | None:
    """What is wrong with ``value`` as a time limit (None: nothing)."""
    if value is None:
        return None
    try:
        number(value, f"the {what} time limit", MIN_LIMIT_S, MAX_DURATION_S, words=LIMIT_WORDS)
    except InvalidRequest as e:
        return e.message
    return None


@dataclass(frozen=True)
class LimitRule:
    """The time limits of one job class, profile or group (None: none from this rule)."""

    default_s: float | None = None
    """The limit of a request that states none."""
    max_s: float | None = None
    """The longest limit a request may state, or reach by extensions."""
    required: bool = False
    """Refuse a request that this rule applies to and that gets no limit."""

    def __post_init__(self) -> None:
        """Refuse a rule that could not be used, in one sentence per field."""
        problems = {
            f: p
            for f, p in (
                ("default_s", _seconds(self.default_s, "default")),
                ("max_s", _seconds(self.max_s, "maximum")),
            )
            if p
        }
        if not isinstance(self.required, bool):
            problems["required"] = f"'required' is true or false, not {said(self.required)}"
        default, most = self.default_s, self.max_s
        if not problems and default is not None and most is not None and default > most:
            problems["default_s"] = (
                f"the default time limit of {duration(default)} is above "
                f"the maximum of {duration(most)}"
            )
        if problems:
            raise InvalidRequest("; ".join(problems.values()), fields=problems)

    def to_json(self) -> dict[str, Any]:
        return {"default_s": self.default_s, "max_s": self.max_s, "required": self.required}


def rule_words(key: LimitKey | None) -> str:
    """Whom a rule is for, as a refusal says it: "interactive requests", "1g.10gb
    requests", "group 'students'" (None: no rule, the year every request is held to)."""
    if key is None:
        return "any request"
    kind, name = key
    return f"group {name!r}" if kind == "group" else f"{name} requests"


class LimitRules:
    """The time-limit rules in force (see the module's docstring)."""

    def __init__(
        self, config: BrokerConfig, store: Store, clock: Clock, emit: Callable[[Event], None]
    ) -> None:
        """``emit``: the core's, for the ``limits`` event each change sends."""
        self.configured = config.limit_rules()
        self.required = config.limit_required
        """``BrokerConfig.limit_required``: every request needs a limit."""
        self.store, self.clock, self._emit = store, clock, emit
        self._set: dict[LimitKey, LimitRule] = {}
        """The rules admins set at run time, kept in the store (read back here)."""
        for row in self.store.time_limits():
            rule = LimitRule(row["default_s"], row["max_s"], bool(row["required"]))
            self._set[(row["kind"], row["name"])] = rule

        self._in_force = self._merged()

    def _merged(self) -> dict[LimitKey, tuple[LimitRule, str]]:
        found = {k: (r, "config") for k, r in self.configured.items()}
        found.update((k, (r, "admin")) for k, r in self._set.items())
        return found

    def rules(self) -> dict[LimitKey, tuple[LimitRule, str]]:
        """Every rule in force, with where it comes from (``config`` or ``admin``)."""
        return dict(self._in_force)

    def set(self, kind: str, name: str, rule: LimitRule) -> LimitKey:
        """Replace the rule of a class, profile or group: committed, then in force."""
        key = check_key(kind, name)
        with self.store.transaction():
            self.store.upsert_time_limits(*key, rule.to_json())
        self._set[key] = rule
        self._changed(key)
        return key

    def delete(self, kind: str, name: str) -> bool:
        """Back to the configured rule (or none); False where no admin set one."""
        key = check_key(kind, name)
        if key not in self._set:
            return False
        with self.store.transaction():
            self.store.delete_time_limits(*key)
        del self._set[key]
        self._changed(key)
        return True

    def _changed(self, key: LimitKey) -> None:
        """Put the change in force and send a ``limits`` event (machine-wide, as a group's
        quota change) with the rule of ``key`` now in force and its source: after a
        delete the configured one, or none (all null), so a front never shows stale ones."""
        self._in_force = self._merged()
        rule, source = self._in_force.get(key, (LimitRule(), None))
        detail = {"kind": key[0], "name": key[1], **rule.to_json(), "source": source}
        self._emit(Event("limits", self.clock.now(), "", detail=detail))

    def applying(
        self, job_class: JobClass, size: Size, groups: Iterable[str]
    ) -> list[tuple[LimitKey, LimitRule]]:
        """The rules a request is subject to, most general first (class, profile, groups)."""
        return self._of(job_class, [("profile", p) for p in profile_names(size)], groups)

    def _of(
        self, job_class: JobClass, profiles: list[LimitKey], groups: Iterable[str]
    ) -> list[tuple[LimitKey, LimitRule]]:
        """The rules in force of a class, ``profiles`` and groups, most general first."""
        keys = [("class", job_class.value), *profiles]
        keys += [("group", g) for g in dict.fromkeys(groups)]
        rules = self._in_force
        return [(k, rules[k][0]) for k in keys if k in rules]

    def longest(
        self, job_class: JobClass, size: Size, groups: Iterable[str]
    ) -> tuple[float, LimitKey | None]:
        """The tightest maximum a request is subject to, and whose it is (None: a year,
        nobody's)."""
        return _tightest(self.applying(job_class, size, groups))

    def for_form(
        self, job_class: JobClass, groups: Iterable[str], profile: str | None = None
    ) -> dict[str, Any]:
        """What a form can say before a request is made, for a class (and a MIG
        ``profile`` it offers: that profile's rule too): the default (never above the
        maximum), the tightest maximum and whether a limit is required. ``profile`` is a
        device's name for it, not a ``Size``: one the catalogue lacks still reads."""
        profiles = [] if profile is None else [("profile", profile)]
        return self._stated(self._of(job_class, profiles, groups))

    def _stated(self, applying: list[tuple[LimitKey, LimitRule]]) -> dict[str, Any]:
        """What ``applying`` gives a request that states no limit, and allows one that does."""
        most = _tightest(applying)[0]
        default = _most_specific_default(applying)
        return {
            "default_s": None if default is None else min(default, most),
            "max_s": most,
            "required": self.required or any(rule.required for _, rule in applying),
        }

    def check(
        self, job_class: JobClass, size: Size, groups: Iterable[str], limit_s: float | None
    ) -> float | None:
        """The time limit a request gets: its own (checked against the tightest maximum),
        else the most specific default (never above that maximum); a clear
        ``InvalidRequest`` for a bad one, or for none where one is required."""
        applying = self.applying(job_class, size, groups)
        if limit_s is None:
            stated = self._stated(applying)
            default: float | None = stated["default_s"]
            if default is None and stated["required"]:
                raise InvalidRequest("a time limit is required here: say how long you need the GPU")
            return default
        limit_s = hold_seconds(limit_s, "the time limit")
        most, whose = _tightest(applying)
        if limit_s > most:
            raise InvalidRequest(
                f"the time limit of {duration(limit_s)} is longer than the {duration(most)} "
                f"allowed for {rule_words(whose)}"
            )
        return limit_s


def _tightest(applying: list[tuple[LimitKey, LimitRule]]) -> tuple[float, LimitKey | None]:
    found: tuple[float, LimitKey | None] = (MAX_DURATION_S, None)
    for key, rule in applying:
        if rule.max_s is not None and rule.max_s < found[0]:
            found = (rule.max_s, key)
    return found


def _most_specific_default(applying: list[tuple[LimitKey, LimitRule]]) -> float | None:
    """The default of the most specific kind that has one (of several groups: the
    shortest)."""
    for kind in reversed(LIMIT_KINDS):
        defaults = [r.default_s for k, r in applying if k[0] == kind and r.default_s is not None]
        if defaults:
            return min(defaults)
    return None
