"""Every number setting (``c.GPUBroker.*`` and the other classes' of this package) held
to the broker's one check: whatever a config file sets (an integer too large for a float,
NaN, an infinity, 1e308, text, a list), it is taken within its bounds or refused with a
config error in one sentence naming the setting. traitlets' own ``Float`` took NaN and
infinities and failed on a huge integer with a bare ``OverflowError``."""

from __future__ import annotations

import math
from typing import Any

import pytest
from bad_values import JSON, reads_as_a_sentence
from hypothesis import given, settings
from runtime_helpers import make
from traitlets import Float, HasTraits, Int, TraitError

from hub_spawner.kubernetes import GPUBrokerKubeSpawner
from hub_spawner.service import GPUBrokerService
from hub_spawner.spawner import SimpleGPUBrokerSpawner
from jupyter_gpubroker.engines.kubernetes import KubernetesInventory
from jupyter_gpubroker.engines.slurm import SlurmInventory
from jupyter_gpubroker.kernel.magic import GPUMagics
from jupyter_gpubroker.runtime import GPUBroker
from jupyter_gpubroker.server.app import GPUBrokerExtension
from jupyter_gpubroker.server.provisioner import GPUProvisioner
from jupyter_gpubroker.wire.traits import Number, Whole

CLASSES = [
    GPUBroker,
    GPUProvisioner,
    GPUBrokerExtension,
    GPUBrokerService,
    SimpleGPUBrokerSpawner,
    GPUBrokerKubeSpawner,
    SlurmInventory,
    KubernetesInventory,
    GPUMagics,
]
OURS = {"jupyter_gpubroker", "hub_spawner"}


def own_numbers(cls: type[HasTraits]) -> list[str]:
    """The number settings ``cls`` declares itself (JupyterHub's own spawner settings are
    JupyterHub's)."""
    declared = {
        name
        for klass in cls.__mro__
        if klass.__module__.split(".")[0] in OURS
        for name in vars(klass)
    }
    return sorted(
        name
        for name, trait in cls.class_traits(config=True).items()
        if name in declared and isinstance(trait, (Float, Int))
    )


SETTINGS = [(cls, name) for cls in CLASSES for name in own_numbers(cls)]


def test_every_number_setting_of_the_package_is_checked() -> None:
    """None is a plain traitlets ``Float`` or ``Int`` any more (those take NaN, an
    infinity, or an integer no float holds)."""
    assert len(SETTINGS) > 35
    plain = [
        f"{cls.__name__}.{name}"
        for cls, name in SETTINGS
        if not isinstance(cls.class_traits()[name], (Number, Whole))
    ]
    assert plain == []


class Owner:
    """What a setting's check sees of the object it is set on: its class's name."""


@pytest.mark.parametrize(("cls", "name"), SETTINGS, ids=lambda x: getattr(x, "__name__", x))
def test_a_number_setting_takes_a_number_in_its_bounds_or_says_why(
    cls: type[HasTraits], name: str
) -> None:
    trait = cls.class_traits()[name]
    owner = type(cls.__name__, (Owner,), {})()

    @settings(max_examples=60, deadline=None, database=None)
    @given(value=JSON)
    def checked(value: Any) -> None:
        try:
            taken = trait.validate(owner, value)
        except TraitError as e:
            message = str(e)
            assert message.startswith(f"{cls.__name__}.{name} must be "), message
            assert reads_as_a_sentence(message), message
            return
        if taken is not None:
            assert isinstance(taken, (int, float)) and math.isfinite(taken)
            assert trait.lo <= taken <= trait.hi

    checked()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("idle_timeout_by_class", {"batch": 10**400}),
        ("idle_timeout_by_profile", {"1g.10gb": math.inf}),
        ("server_idle_timeout_by_profile", {"gpu": [60]}),
        ("max_time_limit", {"interactive": 10**400}),
        ("typical_hold", {"batch": {"h": 2}}),
        ("time_limit_warning", 10**400),
        ("max_extensions", {"interactive": 10**400}),
        ("drain_xids", [79, 10**400]),
        ("policy_params", {"half_life_s": 10**400}),
        (
            "windows",
            [{"name": "day", "start": "08:00", "end": "18:00", "weights": {"batch": 1e308}}],
        ),
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_a_setting_holding_numbers_refuses_a_bad_one_in_a_sentence(
    tmp_path: Any, name: str, value: Any
) -> None:
    """Set as a config file does: a config error (at once, or when the broker starts)
    naming the setting, never an exception of its own."""
    try:
        rt = make(tmp_path, **{name: value})
        rt.start()
        rt.stop()
    except TraitError as e:
        message = str(e)
    except Exception as e:  # the broker's ConfigError at start
        assert type(e).__name__ == "ConfigError", repr(e)
        message = e.message  # type: ignore[attr-defined]
    else:
        pytest.fail(f"{name}={value!r} was taken")
    assert reads_as_a_sentence(message), message
    assert name in message or "policy" in message or "window" in message, message
