"""fl.experiments.privacy_utility (issue 12, section 4): its data, its public bounds and its
table; the DP-dependent checks are in test_privacy_utility_dp.py."""

from __future__ import annotations

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.experiments.privacy_utility import (
    make_privacy_data,
    privacy_process,
    public_bounds,
)


def _module():
    import sys

    return sys.modules["fedlatent.experiments.privacy_utility"]


def test_the_process_is_standardized_and_well_separated():
    p = privacy_process()
    assert (p.n_features, p.n_components) == (4, 3)
    mean = p.weights @ p.means
    second = np.einsum("k,kij->ij", p.weights,
                       p.covariances + np.einsum("ki,kj->kij", p.means, p.means))
    np.testing.assert_allclose(mean, 0.0, atol=1e-12)
    np.testing.assert_allclose(np.diag(second - np.outer(mean, mean)), 1.0, rtol=1e-12)
    # the Bayes rule recovers the component of (almost) every row: well separated
    from scipy.stats import multivariate_normal

    rng = np.random.default_rng(5)
    z = rng.choice(3, size=20_000, p=p.weights)
    X, _, _ = _module()._draw(p, z, rng)
    lp = np.stack([np.log(p.weights[k]) + multivariate_normal(p.means[k], p.covariances[k])
                   .logpdf(X) for k in range(3)], axis=1)
    assert np.mean(lp.argmax(axis=1) == z) > 0.98
    # one process for every size and seed
    np.testing.assert_array_equal(privacy_process().means, p.means)


def test_the_data_split_sizes_and_views():
    d = make_privacy_data(10_000, 10, random_state=3)
    assert set(d.train) == set(d.test) == {"x", "regression", "classification", "entity"}
    assert d.train["x"].n_samples == 10_000 and d.test["x"].n_samples == 2_000
    assert d.train["x"].n_clients == 10
    assert {cd.n_samples for _, cd in d.train["x"].items()} == {1_000}
    for task in ("regression", "classification", "entity"):  # one draw, four views
        for split in ("train", "test"):
            np.testing.assert_array_equal(getattr(d, split)[task].pooled().X,
                                          getattr(d, split)["x"].pooled().X)
    labels = np.unique(d.train["classification"].pooled().y)
    assert labels.tolist() == [0, 1]
    ent = d.train["entity"]
    assert ent.entity_name == "entity"
    _, cd = next(iter(ent.items()))
    # 100 entities of 10 training events; their 2 held-out events are in the test view
    assert np.unique(cd.entity).size == 100 and np.all(np.unique(cd.entity, return_counts=True)
                                                        [1] == 10)
    np.testing.assert_array_equal(make_privacy_data(10_000, 10, random_state=3).train["x"]
                                  .pooled().X, d.train["x"].pooled().X)


def test_an_entity_shares_one_component():
    """The events of an entity are draws of one component: within an entity, the regression
    residual of the true component's line is the noise (sd 0.5) for every event."""
    p = privacy_process()
    d = make_privacy_data(2_000, 2, random_state=1)
    _, cd = next(iter(d.train["entity"].items()))
    X, y = cd.X, cd.y
    res = y[:, None] - (X @ p.beta.T + p.intercept)  # (n, K) residual for each component
    ent = np.asarray(cd.entity)
    k_of = {e: int(np.argmin(np.sum(res[ent == e] ** 2, axis=0))) for e in np.unique(ent)}
    r = res[np.arange(len(y)), [k_of[e] for e in ent]]
    assert abs(np.std(r) - 0.5) < 0.05


def test_public_bounds_are_quantiles_of_the_process():
    p = privacy_process()
    clip, (lo, hi) = public_bounds(p, 0.95)
    rng = np.random.default_rng(11)
    z = rng.choice(3, size=200_000, p=p.weights)
    X, y, _ = _module()._draw(p, z, rng)
    assert abs(np.mean(np.linalg.norm(X, axis=1) > clip) - 0.05) < 0.003
    assert abs(np.mean((y < lo) | (y > hi)) - 0.001) < 0.0005
    assert public_bounds(p, 0.99)[0] > clip


def test_no_model_gives_an_empty_table_with_the_columns(tmp_path, saved_figures):
    table = fl.experiments.privacy_utility(quick=True, out=tmp_path, random_state=0,
                                           models=())
    assert table.empty
    assert list(table.columns) == [
        "model", "metric", "n_records", "epsilon", "delta", "value", "value_std", "nonprivate",
        "ratio", "relative_loss", "epsilon_spent", "seconds", "n_seeds", "failed"]
    assert saved_figures == []


def test_a_model_without_dp_support_is_skipped_with_its_reason(monkeypatch):
    from fedlatent.engine.contract.model import Capabilities
    from fedlatent.models.gmm import FederatedGaussianMixture

    monkeypatch.setattr(FederatedGaussianMixture, "capabilities", Capabilities(
        secure_aggregation=True, privacy_refusal="no bounded sensitivity"))
    table = fl.experiments.privacy_utility(quick=True, out=None, random_state=0,
                                           models=("FederatedGaussianMixture",))
    assert table.empty
    assert table.attrs["skipped"] == {"FederatedGaussianMixture": "no bounded sensitivity"}


@pytest.mark.parametrize("n", [1_000, 10_000])
def test_sizes_round_to_whole_entities(n):
    d = make_privacy_data(n, 4, random_state=0)
    assert d.train["x"].n_samples == (n // 4 // 10) * 10 * 4


# ---- the private fits (need Federation(privacy=...) and the accountant) -------------------------
def _plain_gmm_score(n, seed=0):
    from fedlatent.models.gmm import FederatedGaussianMixture

    d = make_privacy_data(n, 10, random_state=seed)
    est = FederatedGaussianMixture(3, max_rounds=10, tol=0.0, random_state=seed, verbose=False)
    with pytest.warns(fl.ConvergenceWarning, match="did not converge in 10 rounds"):
        est.fit(d.train["x"])  # tol=0: every planned round runs, as in the experiment
    return est.score(d.test["x"].pooled().X)


@pytest.mark.slow  # 8 s of CPU; about 35 s of wall time on the shared 2-core machine
def test_quick_run_gives_the_table_and_its_figure(tmp_path, saved_figures):
    pytest.importorskip("dp_accounting")
    table = fl.experiments.privacy_utility(quick=True, out=tmp_path, random_state=0,
                                           models=("FederatedGaussianMixture",))
    assert table.shape == (3, 14)
    assert table["epsilon"].tolist() == [np.inf, 1.0, 8.0]
    assert set(table["n_records"]) == {10_000} and set(table["n_seeds"]) == {1}
    assert table["failed"].sum() == 0
    plain = table.iloc[0]
    # the no-DP row is a plain fit with the same settings, and the reference of every ratio
    assert plain["value"] == _plain_gmm_score(10_000)
    assert (plain["ratio"], plain["relative_loss"], plain["epsilon_spent"]) == (1.0, 0.0, 0.0)
    assert np.all(table["nonprivate"] == plain["value"])
    private = table.iloc[1:]
    np.testing.assert_allclose(private["ratio"], private["value"] / plain["value"])
    # the accountant's spend: at most the budget, and (nearly) all of it for the planned rounds
    assert np.all(private["epsilon_spent"] <= private["epsilon"] * (1 + 1e-9))
    assert np.all(private["epsilon_spent"] >= 0.9 * private["epsilon"])
    # more budget, less noise: epsilon 8 is closer to the plain fit than epsilon 1
    assert 0.0 <= private["relative_loss"].iloc[1] < private["relative_loss"].iloc[0]
    assert [name for name, _ in saved_figures] == ["privacy_utility.png"]
    assert (tmp_path / "privacy_utility.png").stat().st_size > 0


def test_gmm_at_epsilon_1_and_1e5_records_is_within_5_percent_of_the_plain_fit():
    """Issue 12's done-when: at epsilon = 1, delta = 1e-5 and 10^5 records the federated GMM's
    mean held-out log-likelihood is within 5% of the non-private fit."""
    pytest.importorskip("dp_accounting")
    table = fl.experiments.privacy_utility(sizes=(100_000,), epsilons=(1.0,), n_seeds=1,
                                           models=("FederatedGaussianMixture",), out=None,
                                           random_state=0)
    row = table[table["epsilon"] == 1.0].iloc[0]
    assert row["epsilon_spent"] <= 1.0 + 1e-9
    assert 0.0 <= row["relative_loss"] < 0.05
