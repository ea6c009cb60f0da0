"""c.GPUBroker's time-limit traits: said in seconds or words, passed to the core, bad
values refused with one sentence."""

from __future__ import annotations

import pytest
from runtime_helpers import make
from traitlets import TraitError

from jupyter_gpubroker.wire.errors import ConfigError, InvalidRequest
from jupyter_gpubroker.wire.sizes import Size


def test_limits_in_words_reach_the_core(tmp_path) -> None:
    rt = make(
        tmp_path,
        default_time_limit={"interactive": "2h"},
        max_time_limit={"interactive": "4h", "batch": 86400},
        time_limit_warning="5min",
        time_limit_grace=30,
        max_extensions={"interactive": 1},
        typical_hold={"interactive": "90min"},
    )
    rt.start()
    try:
        config = rt.core.config
        assert config.default_limit_s == {"interactive": 7200.0}
        assert config.max_limit_s == {"interactive": 14400.0, "batch": 86400.0}
        assert (config.limit_warning_s, config.limit_grace_s) == (300.0, 30.0)
        assert config.max_extensions == {"interactive": 1}
        assert config.typical_hold_s == {"interactive": 5400.0}
        assert rt.core.submit("ann", Size(gpus=1)).limit_s == 7200.0
        with pytest.raises(InvalidRequest, match="longer than the 4 h 00 min allowed"):
            rt.core.submit("ann", Size(gpus=1), limit_s=5 * 3600.0)
    finally:
        rt.stop()


def test_limits_per_profile_and_group_reach_the_core(tmp_path) -> None:
    rt = make(
        tmp_path,
        max_time_limit={"interactive": "8h"},
        default_time_limit_by_profile={"1": "3h"},
        max_time_limit_by_profile={"gpus=1": "6h"},
        default_time_limit_by_group={"students": "1h"},
        max_time_limit_by_group={"students": "2h"},
    )
    rt.start()
    try:
        assert rt.core.config.default_limit_by_profile_s == {"1": 10800.0}
        assert rt.core.submit("ann", Size(gpus=1)).limit_s == 10800.0  # "1" is gpus=1
        assert rt.core.submit("ann", Size(gpus=1), groups=["students"]).limit_s == 3600.0
        with pytest.raises(InvalidRequest, match="longer than the 2 h 00 min allowed for group"):
            rt.core.submit("ann", Size(gpus=1), groups=["students"], limit_s=3 * 3600.0)
        with pytest.raises(InvalidRequest, match="longer than the 6 h 00 min allowed for gpus=1"):
            rt.core.submit("ann", Size(gpus=1), limit_s=7 * 3600.0)
    finally:
        rt.stop()


def test_a_required_limit_refuses_requests_without_one(tmp_path) -> None:
    rt = make(tmp_path, time_limit_required=True)
    rt.start()
    try:
        with pytest.raises(InvalidRequest, match="a time limit is required"):
            rt.core.submit("ann", Size(gpus=1))
    finally:
        rt.stop()


@pytest.mark.parametrize(
    ("trait", "value", "words"),
    [
        ("default_time_limit", {"interactive": "2 fortnights"}, "a duration like '90s'"),
        ("max_time_limit", {"gpu": "2h"}, "job classes are 'interactive' and 'batch'"),
        ("time_limit_warning", "-5min", "a duration like"),
        ("time_limit_grace", 10 * 366 * 86400.0, "at most a year"),
        ("max_extensions", {"interactive": -1}, "a whole number from 0 to 1000, not -1"),
        ("default_time_limit_by_profile", {"1g.10gb": "soon"}, "a duration like '90s'"),
        ("max_time_limit_by_profile", {"9g.99gb": "2h"}, "'9g.99gb' is not a profile"),
        ("max_time_limit_by_profile", {"2": "2h", "gpus=2": "3h"}, "'gpus=2' are set twice"),
        ("default_time_limit_by_group", {"students": 0}, "more than zero, such as .2h., not 0"),
        ("max_time_limit_by_group", {"a\nb": "2h"}, "but control characters and line breaks"),
        ("typical_hold", {"interactive": "0s"}, "typical_hold\\['interactive'\\] must be"),
        ("typical_hold", {"notebook": "2h"}, "job classes are 'interactive' and 'batch'"),
    ],
)
def test_bad_limit_settings_are_refused_in_a_sentence(tmp_path, trait, value, words) -> None:
    with pytest.raises(TraitError, match=f"GPUBroker.{trait}: .*{words}"):
        make(tmp_path, **{trait: value})


@pytest.mark.parametrize(
    ("traits", "words"),
    [
        (
            {"default_time_limit": {"batch": "1d"}, "max_time_limit": {"batch": "2h"}},
            "class 'batch'",
        ),
        (
            {"default_time_limit_by_group": {"ml": "1d"}, "max_time_limit_by_group": {"ml": "2h"}},
            "group 'ml'",
        ),
    ],
)
def test_a_default_above_its_maximum_stops_the_start_in_a_sentence(tmp_path, traits, words) -> None:
    rt = make(tmp_path, **traits)
    with pytest.raises(
        ConfigError, match=f"{words}: the default time limit of 24 h 00 min is above"
    ):
        rt.start()
