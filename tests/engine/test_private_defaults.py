"""Issue 19, item 8: under ``Federation(privacy=...)`` a fit whose ``max_rounds`` is not given
plans a short, documented number of rounds (every round is paid from the budget); an explicit
``max_rounds`` is honoured; without privacy the default stays 100 rounds."""

import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.privacy.dp import planned_releases

pytest.importorskip("dp_accounting")


@pytest.fixture(scope="module")
def fd():
    rng = np.random.default_rng(0)
    return fl.FederatedDataset.from_arrays(
        {f"c{i}": np.clip(rng.normal(size=(400, 2)) + (-1) ** i, -3, 3) for i in range(4)})


def _dp():
    return fl.DifferentialPrivacy(epsilon=1.0, delta=1e-5, clip=4.0, noise_seed=0)


def test_the_private_default_is_the_estimators_plan_and_the_plan_uses_it(fd):
    from fedlatent.engine.rounds.loop import PRIVATE_MAX_ROUNDS

    assert PRIVATE_MAX_ROUNDS == 3  # the engine's default; the GMM plans its own 2 rounds
    assert fl.FederatedGaussianMixture._private_max_rounds == 2
    est = fl.FederatedGaussianMixture(2, federation=fl.Federation(privacy=_dp()),
                                      random_state=0, verbose=False)
    assert est.max_rounds is None  # the constructor stores; fit resolves
    with warnings.catch_warnings():
        warnings.simplefilter("error", fl.ConvergenceWarning)  # the plan is the design
        est.fit(fd)
    # the GMM's start costs 2 releases, each round one
    assert est.privacy_calibration_.releases == planned_releases(2, 1, 2) == 4
    assert est.n_iter_ == 2 and len(est.history_) == 2
    assert 0.99 <= est.privacy_spent_[0] <= 1.0  # the whole budget, never above it


def test_an_explicit_max_rounds_is_honoured_under_privacy(fd):
    est = fl.FederatedGaussianMixture(2, max_rounds=6, federation=fl.Federation(privacy=_dp()),
                                      random_state=0, verbose=False).fit(fd)
    assert est.privacy_calibration_.releases == planned_releases(6, 1, 2) == 8
    assert est.n_iter_ == 6


@pytest.mark.parametrize("name,private_rounds,plain", [
    ("FederatedGaussianMixture", 2, 1000), ("LatentClassRegression", 3, 1000), ("FedGMM", 5, 100)])
def test_max_rounds_defaults_to_none_and_resolves_to_100_without_privacy(name, private_rounds,
                                                                         plain):
    est = getattr(fl, name)()
    assert est.get_params()["max_rounds"] is None
    assert est._max_rounds() == plain  # 1,000 under tol="auto" (the mixtures' default)
    if plain == 1000:
        assert est.set_params(tol=1e-3)._max_rounds() == 100
        est.set_params(tol="auto")
    est.set_params(federation=fl.Federation(privacy=_dp()))
    assert est._max_rounds() == private_rounds
    est.set_params(max_rounds=7)
    assert est._max_rounds() == 7


def test_resolve_max_rounds():
    from fedlatent.engine.rounds.loop import resolve_max_rounds

    assert resolve_max_rounds(None, False) == 100
    assert resolve_max_rounds(None, True) == 3
    assert resolve_max_rounds(12, True) == 12
    assert resolve_max_rounds(None, True, 5) == 5
    assert resolve_max_rounds(None, False, 5) == 100


def test_max_rounds_is_still_validated():
    with pytest.raises(ValueError, match="max_rounds"):
        fl.FederatedGaussianMixture(2, max_rounds=0)._validate_params()
