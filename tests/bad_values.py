"""Values for the property tests of every number the broker takes (the API's fields, the
settings): JSON of every kind, with the numbers at the edges weighted in (integers too
large for a float, 1e308, NaN, the infinities, subnormals, -0.0), and what a refusal of
one may never say."""

from __future__ import annotations

import math
import re

import hypothesis.strategies as st

EDGES = st.sampled_from(
    [10**400, -(10**400), 2**63, 2**64, 1e308, -1e308, math.nan, math.inf, -math.inf]
    + [5e-324, -0.0, 0, 1e-4, 31622400, 31622401, 1e15, 4.5e15]
)
NUMBERS = st.one_of(
    EDGES,
    st.integers(),
    st.integers(min_value=10**300, max_value=10**500),
    st.floats(allow_nan=True, allow_infinity=True),
)
SCALARS = st.one_of(
    NUMBERS, st.none(), st.booleans(), st.text(max_size=20), st.from_regex(r"\d{1,400}")
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
"""Any value a JSON body could carry (Python's json reads NaN and Infinity too)."""

LONG_NUMBER = re.compile(r"\d{16,}")
"""More digits than a person reads out: a refusal says 1e+400, never its 400 digits."""


EXCEPTION = re.compile(r"\w+(Error|Exception)\b|Traceback")
QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")


def reads_as_a_sentence(message: str) -> bool:
    """A refusal a person reads: one line, no number of 16 digits or more, no exception
    name outside the value it quotes, not a whole page."""
    return (
        "\n" not in message
        and not LONG_NUMBER.search(message)
        and not EXCEPTION.search(QUOTED.sub("", message))
        and len(message) <= 400
    )
