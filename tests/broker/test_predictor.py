"""The run-time predictor: quantiles of past holds, fallbacks, and leases already running."""

from __future__ import annotations

import pytest

from jupyter_gpubroker.broker.predictor import Predictor


def test_quantiles_give_a_range_not_just_a_mean():
    p = Predictor(max_samples=100, half_life=1e9)  # equal weights: plain quantiles
    for held in range(1, 101):
        p.learn("ann", "", "batch", "gpu:1", float(held))
    est = p.hold("ann", "", "batch", "gpu:1")
    assert est is not None
    assert (est.low, est.median, est.high) == pytest.approx((10, 50, 90), abs=1)
    assert (est.samples, est.basis) == (100, "user+shape")


def test_recent_holds_weigh_more():
    p = Predictor(half_life=2)
    for held in [10.0] * 20 + [1000.0] * 5:
        p.learn("ann", "", "batch", "gpu:1", held)
    est = p.hold("ann", "", "batch", "gpu:1")
    assert est is not None and est.median == 1000  # the newest five outweigh twenty old ones


def test_an_unknown_shape_falls_back_to_the_user_then_the_group_then_the_class():
    p = Predictor(min_samples=2)
    for _ in range(3):
        p.learn("ann", "lab", "batch", "gpu:8", 7200.0)
        p.learn("bob", "lab", "batch", "gpu:1", 60.0)
        p.learn("cy", "", "interactive", "gpu:1", 600.0)
    user = p.hold("ann", "lab", "batch", "gpu:1")
    group = p.hold("dan", "lab", "batch", "gpu:1")
    everyone = p.hold("eve", "", "batch", "gpu:1")
    assert user is not None and (user.basis, user.median) == ("user", 7200)
    assert group is not None and group.basis == "group" and group.low == 60
    assert everyone is not None and everyone.basis == "class" and everyone.high == 7200
    assert p.hold("eve", "", "interactive", "gpu:4") is not None
    assert Predictor().hold("ann", "", "batch", "gpu:1") is None  # no history at all


def test_a_thin_fine_history_yields_to_a_coarser_one():
    p = Predictor(min_samples=3)
    p.learn("ann", "", "batch", "gpu:2", 10.0)
    for _ in range(5):
        p.learn("ann", "", "batch", "gpu:1", 500.0)
    est = p.hold("ann", "", "batch", "gpu:2")
    assert est is not None and est.basis == "user" and est.samples == 6


def test_a_lease_held_for_hours_is_not_about_to_end():
    p = Predictor(half_life=1e9)
    for held in [60.0] * 8 + [4 * 3600.0, 6 * 3600.0]:
        p.learn("ann", "", "interactive", "1g.10gb", held)
    fresh = p.remaining("ann", "", "interactive", "1g.10gb", 0.0)
    late = p.remaining("ann", "", "interactive", "1g.10gb", 3 * 3600.0)
    assert fresh is not None and fresh.median == 60
    assert late is not None and late.samples == 2
    assert (late.low, late.high) == (3600, 3 * 3600)  # from the holds longer than 3 h only


def test_a_lease_held_longer_than_any_before_has_an_unknown_end():
    p = Predictor()
    for _ in range(5):
        p.learn("ann", "", "batch", "gpu:1", 100.0)
    assert p.remaining("ann", "", "batch", "gpu:1", 100.0) is None


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError, match="must be positive"):
        Predictor(max_samples=0)
    with pytest.raises(ValueError, match="quantiles must rise"):
        Predictor(quantiles=(0.9, 0.5, 0.1))


def test_a_kept_answer_changes_when_a_history_it_read_learns():
    """``hold`` keeps its answers (the policy asks for every queued bucket); one that
    fell back to the class's history must follow that history, whoever taught it."""
    p = Predictor(min_samples=3)
    for _ in range(3):
        p.learn("bob", "", "batch", "gpu:1", 100.0)
    assert p.hold("ann", "", "batch", "gpu:1").median == 100  # type: ignore[union-attr]
    for _ in range(5):
        p.learn("cat", "", "batch", "gpu:1", 9000.0)  # only the class history is shared
    assert p.hold("ann", "", "batch", "gpu:1").median == 9000  # type: ignore[union-attr]
    for _ in range(3):
        p.learn("ann", "", "batch", "gpu:1", 7.0)
    assert p.hold("ann", "", "batch", "gpu:1").median == 7  # type: ignore[union-attr]
    assert p.shortest == 7
