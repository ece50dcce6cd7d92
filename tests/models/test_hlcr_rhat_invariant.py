"""HLCR's chains are judged by the R-hat of label-invariant quantities (the per-entity log
joint, the training MSE, sigma, tau, delta) against a threshold calibrated to their length
(issue 24, item 6's diagnostics)."""

import warnings
from types import SimpleNamespace

import numpy as np
import pytest

from fedlatent.engine.rounds.loop import ConvergenceWarning
from fedlatent.models.hlcr.diagnostics import rhat
from fedlatent.models.hlcr.inference import chain_arrays, rhat_threshold, store_chains
from fedlatent.models.hlcr.solvers import ChainSettings


def test_threshold_is_what_independent_draws_exceed_in_one_percent_of_the_cases():
    # F(3, 96) quantile at 1 - 0.01 / 8: sqrt((24 + q) / 25)
    assert rhat_threshold(2, 50, 4) == pytest.approx(1.0898, abs=2e-4)
    assert rhat_threshold(2, 1000, 4) == 1.01  # long chains: Vehtari et al.'s 1.01
    assert rhat_threshold(4, 200, 1) < rhat_threshold(2, 200, 1) < rhat_threshold(2, 50, 1)
    rng = np.random.default_rng(0)
    worst = np.array([max(rhat(rng.normal(size=(2, 50))) for _ in range(4))
                      for _ in range(100)])
    assert (worst > 1.01).mean() > 0.7  # the old rule: independent draws "disagree"
    assert (worst > rhat_threshold(2, 50, 4)).mean() <= 0.02


def draws(rng, coef, lj, T=50):
    """T fake draws of two clusters (posterior means ``coef`` plus noise) with a log joint
    about ``lj``."""
    D = np.eye(2)[None].repeat(2, axis=0) * 50.0
    out = []
    for _ in range(T):
        mean = np.asarray(coef, float) + 0.01 * rng.normal(size=(2, 2))
        out.append({"D": D, "c": np.einsum("kij,kj->ki", D, mean),
                    "counts": np.array([5.0, 5.0]), "sigma": 1.0 + 0.05 * rng.normal(),
                    "delta": 1.0, "log_joint": lj + 0.1 * rng.normal(),
                    "train_mse": 2.0 + 0.05 * rng.normal()})
    return out


@pytest.fixture
def est():
    return SimpleNamespace(n_features_in_=1, fit_intercept=True, n_entities_=10,
                           feature_names_in_=np.array(["x"]), converged_=False)


def test_chains_in_different_modes_of_the_log_joint_warn_and_are_not_converged(est):
    rng = np.random.default_rng(1)
    chain = ChainSettings(0, 1, 1.0, 1.0, True, False)
    other = chain_arrays(draws(rng, [[1, 0], [-1, 0]], -9.0), {}, chain, 1, True)
    with pytest.warns(ConvergenceWarning, match=r"the 2 chains disagree: R-hat of cluster all "
                      r"'log_joint' is \d+\.\d+ \(> 1.01\); raise max_rounds \(and burn_in\): "
                      r"independent draws as many as these exceed 1\.0\d\d in 1% of the cases"):
        store_chains(est, SimpleNamespace(draws=draws(rng, [[1, 0], [-1, 0]], -11.0)), {},
                     chain, [other])
    assert est.rhat_invariant_ > 1.5 and est.converged_ is False


def test_chains_that_agree_on_invariant_quantities_pass_though_a_cluster_differs(est):
    rng = np.random.default_rng(2)
    chain = ChainSettings(0, 1, 1.0, 1.0, True, False)
    # chain 1 puts its second cluster elsewhere (another mode of a cluster's coefficients);
    # what the fit predicts and how well it fits agree
    other = chain_arrays(draws(rng, [[1, 0], [-1, 0.5]], -10.0), {}, chain, 1, True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        store_chains(est, SimpleNamespace(draws=draws(rng, [[1, 0], [-1, 0]], -10.0)), {},
                     chain, [other])
    assert est.rhat_max_ > 1.5  # the summary still shows the cluster's disagreement
    assert est.rhat_invariant_ < rhat_threshold(2, 50, 3) and est.converged_ is True


def test_chains_each_stuck_at_its_own_value_disagree_without_a_numpy_warning():
    # each (split) chain constant, the two at different values: no within-chain variance, so
    # R-hat is infinite (the chains disagree), computed without dividing by zero
    x = np.repeat([[0.0], [1.0]], 8, axis=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert rhat(x) == np.inf
        assert np.isnan(rhat(np.zeros((2, 8))))  # one value everywhere: nothing to judge
