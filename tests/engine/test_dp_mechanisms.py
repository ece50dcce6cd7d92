"""The Gaussian mechanism on named arrays: the aggregated noise carries the calibrated variance
(local and distributed), relative scales, reproducibility and argument checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedlatent.engine.privacy import gaussian_mechanism, joint_sensitivity, noise_stds
from fedlatent.engine.stats import Stats

N_SEEDS, N_PARTIES, Z, DELTA_2 = 200, 5, 2.5, 0.7
SHAPES = {"nk": (16,), "sx": (16, 4), "sxx": (16, 4, 4)}


def _party_stats(rng):
    return [Stats({k: rng.normal(size=s) for k, s in SHAPES.items()}) for _ in range(N_PARTIES)]


def _aggregate_noise(n_parties_share, scales=None):
    """Noise in the sum over the parties' noisy statistics, one row per seed, per block."""
    parties = _party_stats(np.random.default_rng(0))
    exact = {k: sum(p[k] for p in parties) for k in SHAPES}
    out = {k: [] for k in SHAPES}
    for seed in range(N_SEEDS):
        noisy = [gaussian_mechanism(p, sensitivity=DELTA_2, noise_multiplier=Z,
                                    rng=np.random.default_rng([seed, c]),
                                    n_parties=n_parties_share, scales=scales)
                 for c, p in enumerate(parties)]
        for k in SHAPES:
            out[k].append((sum(q[k] for q in noisy) - exact[k]).ravel())
    return {k: np.array(v) for k, v in out.items()}


@pytest.mark.parametrize("mode, share, expected_var", [
    ("distributed", N_PARTIES, (Z * DELTA_2) ** 2),            # the sum carries sigma^2
    ("local", 1, N_PARTIES * (Z * DELTA_2) ** 2),              # each client adds sigma^2
])
def test_aggregated_noise_variance_matches_the_calibration(mode, share, expected_var):
    noise = _aggregate_noise(share)
    pooled = np.concatenate([v.ravel() for v in noise.values()])
    assert pooled.size == N_SEEDS * sum(math.prod(s) for s in SHAPES.values())
    assert np.var(pooled) == pytest.approx(expected_var, rel=0.10)
    # per entry over the 200 seeds as well (the 10% band on the mean of the per-entry variances)
    per_entry = np.concatenate([v for v in noise.values()], axis=1).var(axis=0)
    assert per_entry.mean() == pytest.approx(expected_var, rel=0.10)
    # centred: |mean| within 4 standard errors
    assert abs(pooled.mean()) < 4 * math.sqrt(expected_var / pooled.size)


def test_relative_scales_put_the_noise_where_asked_with_the_same_joint_multiplier():
    scales = {"nk": 1.0, "sx": 3.0, "sxx": 9.0}
    noise = _aggregate_noise(N_PARTIES, scales=scales)
    for k, s in scales.items():
        assert np.var(noise[k]) == pytest.approx((Z * DELTA_2 * s) ** 2, rel=0.10)


def test_joint_sensitivity_combines_block_bounds():
    R = 2.0
    per_block = {"nk": 1.0, "sx": R, "sxx": R * R}
    assert joint_sensitivity(per_block) == pytest.approx(math.sqrt(1 + R**2 + R**4))
    # rescaled by the block bounds themselves: every block contributes 1
    assert joint_sensitivity(per_block, scales=per_block) == pytest.approx(math.sqrt(3.0))
    with pytest.raises(ValueError, match=r"sensitivity of block 'sx' must be finite and >= 0"):
        joint_sensitivity({"nk": 1.0, "sx": -1.0})
    with pytest.raises(ValueError, match=r"noise scale of block 'nk' must be finite and > 0"):
        joint_sensitivity({"nk": 1.0}, scales={"nk": 0.0})


def test_noise_stds_per_block_and_party():
    sds = noise_stds(["a", "b"], 2.0, 3.0, n_parties=4, scales={"a": 1.0, "b": 0.5})
    assert sds == {"a": 3.0, "b": 1.5}
    with pytest.raises(ValueError, match=r"no noise scale for block 'b'; scales has \['a'\]"):
        noise_stds(["a", "b"], 1.0, 1.0, scales={"a": 1.0})
    with pytest.raises(ValueError, match=r"n_parties must be a positive integer, got 0"):
        noise_stds(["a"], 1.0, 1.0, n_parties=0)
    with pytest.raises(ValueError, match=r"noise_multiplier must be finite and > 0"):
        noise_stds(["a"], 1.0, 0.0)
    with pytest.raises(ValueError, match=r"sensitivity must be finite and >= 0"):
        noise_stds(["a"], math.nan, 1.0)


def test_same_generator_seed_same_release_and_input_untouched():
    st = Stats({"n": [3.0, 4.0], "s": np.ones((2, 3))})
    before = {k: v.copy() for k, v in st.items()}
    a = gaussian_mechanism(st, sensitivity=1.0, noise_multiplier=1.0,
                           rng=np.random.default_rng(7))
    b = gaussian_mechanism(st, sensitivity=1.0, noise_multiplier=1.0,
                           rng=np.random.default_rng(7))
    c = gaussian_mechanism(st, sensitivity=1.0, noise_multiplier=1.0,
                           rng=np.random.default_rng(8))
    assert list(a) == ["n", "s"] and a["s"].shape == (2, 3)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["s"], c["s"])
    assert all(np.array_equal(st[k], before[k]) for k in st)


def test_rng_must_be_the_callers_generator():
    with pytest.raises(TypeError, match=r"rng must be a numpy.random.Generator .*got int"):
        gaussian_mechanism({"a": [1.0]}, sensitivity=1.0, noise_multiplier=1.0, rng=3)
