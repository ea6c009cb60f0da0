"""Declared run-time limits for traces that record none (Slurm's ``--time``).

No public GPU trace here records what its users declared, so a replay that plans
with limits (EASY backfill, ``squeue --start``) has to model them. The model follows
Tsafrir, Etsion and Feitelson, "Modeling User Runtime Estimates" (JSSPP 2005,
LNCS 3834): users do not state a job's run time, they pick a round value (what the
paper calls modal estimates: about 20 values cover 90% of the jobs), usually well
above the job's need, so many jobs use a small fraction of their limit; and the
site's maximum is itself one of the most popular values (users who do not know ask
for all they may). As in their model, a limit is generated from the job's real run
time and is at least that run time, so no job runs past its limit. The site's
maximum is 7 days; a job that ran longer (openb's services run for months) declares
its run time rounded up to a day, as a site grants such services an exception.
(Cutting them at 7 days would free a handful of GPUs held for months and remove
openb's queue with them: the replay would no longer compare schedulers on the same
work.)

Checked against the literature with the search tool: "90% of the jobs with merely
20 estimate values" and the maximum as "an always-popular estimate" (Tsafrir,
"Using inaccurate estimates accurately", JSSPP 2010, summarizing the 2005 model).
Not checked, and so chosen here rather than taken from the paper: the list of round
values (:data:`MODES`: the usual minutes and hours of batch sites), the share of
jobs asking for the maximum (``P_MAX``), the padding users add before rounding up
(``PAD_MAX``: a factor drawn log-uniformly from 1 to 10) and the site maximum
(``SITE_MAX_S``, 7 days, a common Slurm ``MaxTime``). The paper fits its parameters
per log; these are one plausible setting, stated so that a reader can change them.

Three settings (``declare(trace, name)``):

``exact``
    the limit is the job's run time (what declaration could give at best);
``tsafrir``
    the model above;
``loose``
    the same model twice as loose: the padded need is doubled before it is
    rounded up to a round value (the maximum stays the maximum).

Each job's draw depends only on the seed and the job's place in the trace, so a
trace and its ``head(n)`` give their common jobs the same limits.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

from .traces import Trace

HOUR = 3600.0
DAY = 24 * HOUR
MODES: tuple[float, ...] = tuple(
    m * 60.0 for m in (15, 30, 60, 120, 180, 240, 360, 480, 720, 1080, 1440, 2160, 2880, 4320)
)
"""The round values users pick from below the site maximum, in seconds: 15 and 30
minutes, 1, 2, 3, 4, 6, 8, 12, 18, 24, 36, 48 and 72 hours."""
SITE_MAX_S = 7 * DAY
"""The longest limit the site allows (a longer job declares its run time, see above)."""
P_MAX = 0.15
"""The share of jobs that ask for the site maximum whatever they need."""
PAD_MAX = 10.0
"""Users pad their need by a factor drawn log-uniformly from 1 to this, then round up."""
LIMIT_MODELS = ("exact", "tsafrir", "loose")
LOOSENESS = {"tsafrir": 1.0, "loose": 2.0}


def modal_limit(duration_s: float, draw: random.Random, looseness: float = 1.0) -> float:
    """One job's declared limit under the model: the site maximum with probability
    ``P_MAX``, else its run time padded (times ``looseness``) and rounded up to the next
    round value, capped at the maximum; past the maximum, its run time rounded up to a
    day."""
    if duration_s > SITE_MAX_S:
        return math.ceil(duration_s / DAY) * DAY
    if draw.random() < P_MAX:
        return SITE_MAX_S
    padded = duration_s * math.exp(draw.random() * math.log(PAD_MAX)) * looseness
    return next((m for m in MODES if m >= padded), SITE_MAX_S)


def declare(trace: Trace, model: str, seed: int = 0) -> Trace:
    """``trace`` with every job's declared limit (``Job.limit_s``) under ``model``, one
    of :data:`LIMIT_MODELS`."""
    if model not in LIMIT_MODELS:
        raise ValueError(f"unknown limit model {model!r}; choose one of {', '.join(LIMIT_MODELS)}")
    if model == "exact":
        jobs = tuple(replace(j, limit_s=j.duration_s) for j in trace.jobs)
    else:
        loose = LOOSENESS[model]
        jobs = tuple(
            replace(j, limit_s=modal_limit(j.duration_s, random.Random(f"{seed}:{i}"), loose))
            for i, j in enumerate(trace.jobs)
        )
    note = f"declared limits: {model} (replay/limits.py, seed {seed})"
    return replace(trace, jobs=jobs, notes=(*trace.notes, note))


__all__ = ["LIMIT_MODELS", "MODES", "SITE_MAX_S", "declare", "modal_limit"]
