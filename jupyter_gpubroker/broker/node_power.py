"""Which sleeping nodes to wake and which idle ones to let sleep, ahead of the forecast.

An engine with power saving (Slurm's) puts idle nodes to sleep and wakes one when work is
sent to it, so the first request after a trough waits for a node to start. The broker
knows more: the forecast says how many GPUs this hour and the next may ask, and its own
queue says what waits now. From those and the placer, :func:`plan_power` plans:

- wake a sleeping node that fits a request waiting now which no awake GPU can take (and
  no quota holds back);
- wake sleeping nodes, the fewest GPUs that cover it, while the forecast asks more than
  the awake nodes give the broker (their GPUs free or held by its leases; those waking
  up count as given), unless the day's cap on GPU-hours kept awake ahead is spent;
- otherwise let idle nodes sleep that the engine's power saving lets sleep, while the
  awake nodes left still give what the forecast asks; once the cap is spent, let the
  nodes woken ahead sleep too, whatever the forecast says.

A forecast never removes capacity that is held or waited for: a node is never put to
sleep while it runs anything (the engine says it is idle), while a lease holds one of its
devices, or while a waiting request fits it. GPUs are GPU-equivalents here, as in the
forecast: a MIG slice counts as its share of a GPU. Pure: the runtime's
``slurm_ahead`` reads the engine and carries the plan out.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..wire.sizes import Size
from ..wire.text import gpus, size_text
from .models import Device
from .placement import Placer

if TYPE_CHECKING:
    from .core import Broker

AWAKE, ASLEEP, WAKING, FALLING = "awake", "asleep", "waking up", "going to sleep"
"""A node's power state, as the broker says it. One going to sleep neither gives
capacity nor is woken."""


@dataclass(frozen=True)
class NodePower:
    """One node as the engine says it."""

    name: str
    power: str
    """``awake``, ``asleep``, ``waking up`` or ``going to sleep``."""
    idle: bool = False
    """Awake and running nothing at all (not even work without GPUs)."""
    may_sleep: bool = False
    """The engine's power saving lets it sleep."""


@dataclass(frozen=True)
class Need:
    """What the forecast asks this hour and the next, and that in words."""

    gpus: float
    reason: str


@dataclass(frozen=True)
class Cap:
    """The day's cap on GPU-hours kept awake ahead of the forecast."""

    spent: bool = False
    woken: frozenset[str] = frozenset()
    """The nodes woken ahead of the forecast that no lease has used yet."""
    reason: str = ""


@dataclass(frozen=True)
class Plan:
    up: tuple[tuple[str, str], ...] = ()
    """(node, why) to wake."""
    ahead: frozenset[str] = frozenset()
    """The nodes of ``up`` woken for the forecast alone (what the cap counts)."""
    down: tuple[tuple[str, str], ...] = ()
    """(node, why) to put to sleep."""


NO_CAP = Cap()


def plan_for(core: Broker, nodes: Sequence[NodePower], need: Need | None, cap: Cap) -> Plan:
    """:func:`plan_power` for ``core``'s queue now."""
    now = core.clock.now()
    startable = [
        r.size
        for r in core.book.waiting
        if not core.budgets.blocks(r, core.scheduler.gpu_eq(r.size), now)
    ]
    sizes = core.book.waiting.sizes.values()
    return plan_power(core.placer, sizes, startable, nodes, need, cap)


def plan_power(
    placer: Placer,
    waiting: Iterable[Size],
    startable: Iterable[Size],
    nodes: Sequence[NodePower],
    need: Need | None,
    cap: Cap = NO_CAP,
) -> Plan:
    """What to wake and what to let sleep now (see the module's docstring). ``waiting``:
    the sizes requests wait for; ``startable``: those of the requests among them that
    no quota holds back. ``need`` is None while there is no forecast yet."""
    waiting = list(waiting)
    on: dict[str, list[Device]] = defaultdict(list)
    for d in placer.devices.values():
        on[d.node].append(d)
    size = {n.name: sum(d.gpu_equivalents for d in on[n.name]) for n in nodes}
    given = sum(_gives(placer, on[n.name], n.power) for n in nodes)
    up = _for_waiting(placer, startable, nodes)
    given += sum(size[node] for node, _ in up)
    if need is not None and not cap.spent and need.gpus > given + 1e-9:
        ahead = _for_forecast(nodes, size, {node for node, _ in up}, need.gpus - given)
        words = f"{need.reason}; the awake nodes give {gpus(given)}"
        return Plan((*up, *((n, words) for n in ahead)), frozenset(ahead))
    if up:
        return Plan(up)
    return Plan(down=_to_sleep(placer, waiting, nodes, on, size, given, need, cap))


def _gives(placer: Placer, devices: list[Device], power: str) -> float:
    """What a node gives the broker: every GPU of one waking up, the free and held ones
    of one awake."""
    if power == WAKING:
        return sum(d.gpu_equivalents for d in devices)
    if power != AWAKE:
        return 0.0
    return sum(
        d.gpu_equivalents for d in devices if d.uuid in placer.held or placer.is_free(d.uuid)
    )


def _fit(placer: Placer, size: Size) -> set[str]:
    """The nodes that have room for one request of ``size`` (free or not)."""
    on = Counter(d.node for d in placer.compatible(size))
    return {node for node, n in on.items() if n >= placer.units(size)}


def _for_waiting(
    placer: Placer, startable: Iterable[Size], nodes: Sequence[NodePower]
) -> tuple[tuple[str, str], ...]:
    """A sleeping node for each waiting size that no free GPU takes and one of them fits."""
    up: dict[str, str] = {}
    for s in {s.key: s for s in startable}.values():
        if placer.find(s, "best_fit") is not None:
            continue  # it waits for its turn
        fit = _fit(placer, s)
        for n in nodes:
            if n.power == ASLEEP and n.name not in up and n.name in fit:
                up[n.name] = (
                    f"a request for {size_text(s.to_json())} waits, no awake GPU can take it, "
                    f"and {n.name} has room for it"
                )
                break
    return tuple(up.items())


def _for_forecast(
    nodes: Sequence[NodePower], size: dict[str, float], taken: set[str], short: float
) -> list[str]:
    """Sleeping nodes that cover ``short`` GPUs: each time the smallest that covers what
    is left, else the largest."""
    asleep = sorted(
        (n.name for n in nodes if n.power == ASLEEP and n.name not in taken and size[n.name]),
        key=lambda name: (size[name], name),
    )
    woken: list[str] = []
    while short > 1e-9 and asleep:
        name = next((x for x in asleep if size[x] >= short - 1e-9), asleep[-1])
        asleep.remove(name)
        woken.append(name)
        short -= size[name]
    return woken


def _to_sleep(
    placer: Placer,
    waiting: list[Size],
    nodes: Sequence[NodePower],
    on: dict[str, list[Device]],
    size: dict[str, float],
    given: float,
    need: Need | None,
    cap: Cap,
) -> tuple[tuple[str, str], ...]:
    """The idle nodes that may sleep now, with why: the ones woken ahead once the cap is
    spent, then the largest that the forecast does not need."""
    waited_for = set().union(*(_fit(placer, s) for s in {s.key: s for s in waiting}.values()))
    free = [
        n.name
        for n in nodes
        if n.power == AWAKE
        and n.idle
        and n.may_sleep
        and n.name not in waited_for
        and not any(d.uuid in placer.held for d in on[n.name])
    ]
    down: list[tuple[str, str]] = []
    if cap.spent:
        down += [(name, f"{cap.reason}; {name} is idle") for name in free if name in cap.woken]
        given -= sum(size[name] for name, _ in down)
    if need is None:
        return tuple(down)
    gone = {name for name, _ in down}
    for name in sorted((x for x in free if x not in gone), key=lambda x: (-size[x], x)):
        if given - size[name] >= need.gpus - 1e-9:
            given -= size[name]
            rest = f"the other awake nodes give {gpus(given)}"
            down.append((name, f"{need.reason}; {name} is idle, and {rest}"))
    return tuple(down)
