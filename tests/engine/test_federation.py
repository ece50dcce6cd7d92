import math

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine import Stats


def test_quantizer_is_unbiased_and_within_its_variance_bound():
    q = fl.Quantizer(levels=3)
    rng = np.random.default_rng(0)
    x = Stats({"a": rng.normal(size=20), "b": rng.normal(size=(2, 2)) * 100})
    draws = [q(x, rng) for _ in range(20000)]
    for k in ("a", "b"):
        vals = np.array([d[k] for d in draws])
        # unbiased: the Monte Carlo mean is within 5 standard errors of x
        se = vals.std(axis=0) / math.sqrt(len(draws))
        assert np.all(np.abs(vals.mean(axis=0) - x[k]) < 5 * se + 1e-12)
    omega = q.omega(x.shapes)
    assert omega == pytest.approx(max(min(20 / 9, math.sqrt(20) / 3), min(4 / 9, 2 / 3)))
    for k in ("a", "b"):
        second = np.mean([np.sum(d[k] ** 2) for d in draws])
        assert second <= (1 + omega) * np.sum(x[k] ** 2)


def test_quantized_values_are_on_the_grid():
    q = fl.Quantizer(levels=4)
    x = Stats({"a": np.array([3.0, -4.0, 0.0])})
    out = q(x, np.random.default_rng(0))["a"]
    levels = np.abs(out) / 5.0 * 4  # norm 5
    np.testing.assert_allclose(levels, np.round(levels), atol=1e-12)
    assert out[2] == 0.0
    assert q.bits_per_block(3) == 32 + 3 * (1 + 3)


def test_alpha_defaults_to_one_over_one_plus_omega():
    fed = fl.Federation(quantizer=fl.Quantizer(2))
    shapes = {"a": (8,)}
    assert fed.alpha_for(shapes) == pytest.approx(1 / (1 + min(8 / 4, math.sqrt(8) / 2)))
    assert fl.Federation().alpha_for(shapes) == 1.0
    assert fl.Federation(alpha=0.3, quantizer=fl.Quantizer(2)).alpha_for(shapes) == 0.3


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"participation": 0.0}, r"participation=\.\.\.\) must be in \(0, 1\], got 0.0"),
        ({"participation": 1.5}, r"participation=\.\.\.\) must be in \(0, 1\], got 1.5"),
        ({"step_size": 0}, r"step_size=\.\.\.\) must be in \(0, 1\] or a callable, got 0"),
        ({"client_weighting": "size"}, r"must be 'samples' or 'uniform', got 'size'"),
        ({"quantizer": 4}, r"must be None or a fl.Quantizer"),
        ({"batch_size": 0}, r"batch_size=\.\.\.\) must be >= 1, got 0"),
    ],
)
def test_federation_validation_messages(kwargs, message):
    with pytest.raises(ValueError, match=message):
        fl.Federation(**kwargs).validate()


def test_quantizer_and_spider_validate_their_arguments():
    with pytest.raises(ValueError, match=r"levels=\.\.\.\) must be an integer >= 1, got 0"):
        fl.Quantizer(0)
    with pytest.raises(ValueError, match=r"inner_rounds=\.\.\.\) must be >= 1"):
        fl.Spider(0, 4)


def test_step_schedule_decreases():
    s = fl.StepSchedule(scale=0.5, decay=10, power=0.6)
    assert s(1) == 0.5
    assert s(11) == pytest.approx(0.5 / 2**0.6)
    assert fl.Federation(step_size=s).gamma(11) == pytest.approx(0.5 / 2**0.6)
