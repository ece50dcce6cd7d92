"""LatentClassAnalysis (issue 20, item 5): poLCA's model on the engine, added as new files only.

Exactness against a centralized EM written here, prediction and scores from the mixture base,
save/load, secure aggregation, differential privacy (a record moves its counts by at most one
per variable), the command line through the registry, the experiment.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fedlatent as fl

CATS = (3, 4, 2, 3)


def twenty_unequal_clients(seed=0):
    """20 clients of 5 to 150 rows, class shares differing by client (poLCA-style data)."""
    from fedlatent.models.lca.example import make_lca_data

    return make_lca_data(n_clients=20, mean_size=90, n_classes=3, n_categories=CATS,
                         random_state=seed)


def em(X, w, probs, rounds):
    """Centralized EM for latent class analysis, written out here: E-step (posterior of each
    class from independent categorical variables), M-step (shares; per class and variable,
    weighted category frequencies)."""
    off = np.concatenate([[0], np.cumsum(CATS)])
    for _ in range(rounds):
        logp = np.tile(np.log(w), (X.shape[0], 1))
        for j in range(len(CATS)):
            logp += np.log(probs[:, off[j] + X[:, j].astype(int)]).T
        post = np.exp(logp - logp.max(axis=1, keepdims=True))
        post /= post.sum(axis=1, keepdims=True)
        nk = post.sum(axis=0)
        w = nk / nk.sum()
        probs = np.zeros_like(probs)
        for j in range(len(CATS)):
            for r in range(CATS[j]):
                probs[:, off[j] + r] = post[X[:, j] == r].sum(axis=0) / nk
    return w, probs


def fit(est, fd, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        return est.fit(fd, **kw)


@pytest.mark.usefixtures("rare_level_rule_off")
@pytest.mark.usefixtures("saturation_rule_off")
@pytest.mark.parametrize("rounds", [1, 5, 12])
def test_federated_fit_equals_centralized_em(rounds):
    fd = twenty_unequal_clients()
    sizes = [cd.n_samples for _, cd in fd.items()]
    assert fd.n_clients == 20 and max(sizes) > 3 * min(sizes)
    est = fl.LatentClassAnalysis(3, n_categories=list(CATS), max_rounds=rounds, tol=0.0,
                                 random_state=1)
    p0 = est.initial_parameters(fd)
    fit(est, fd)
    assert est.n_iter_ == rounds
    X = np.vstack([cd.X for _, cd in fd.items()])
    w, probs = em(X, p0["weights"], p0["probs"], rounds)
    np.testing.assert_allclose(est.weights_, w, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(est.probabilities_, probs, rtol=1e-8, atol=1e-12)


@pytest.mark.usefixtures("rare_level_rule_off")
@pytest.mark.usefixtures("saturation_rule_off")
def test_the_random_start_is_a_sum_of_client_draws_on_the_simplex():
    fd = twenty_unequal_clients()
    p0 = fl.LatentClassAnalysis(3, n_categories=list(CATS), random_state=1) \
        .initial_parameters(fd)
    assert p0["weights"].sum() == pytest.approx(1.0, abs=1e-12)
    off = np.concatenate([[0], np.cumsum(CATS)])
    for j in range(len(CATS)):
        np.testing.assert_allclose(p0["probs"][:, off[j]:off[j + 1]].sum(axis=1), 1.0,
                                   atol=1e-12)
    again = fl.LatentClassAnalysis(3, n_categories=list(CATS), random_state=1) \
        .initial_parameters(fd)
    np.testing.assert_array_equal(p0["probs"], again["probs"])  # keyed by seed and client


@pytest.mark.usefixtures("rare_level_rule_off")
@pytest.mark.usefixtures("saturation_rule_off")
def test_predict_proba_score_bic_from_the_mixture_density():
    fd = twenty_unequal_clients()
    est = fit(fl.LatentClassAnalysis(3, max_rounds=30, random_state=0), fd)
    assert list(est.n_categories_) == list(CATS)  # read from the clients' codes
    X = fd[fd.client_ids[0]].X
    off = np.concatenate([[0], np.cumsum(CATS)])
    dens = np.tile(est.weights_, (len(X), 1))
    for j in range(len(CATS)):
        dens *= est.probabilities_[:, off[j] + X[:, j].astype(int)].T
    np.testing.assert_allclose(est.predict_proba(X), dens / dens.sum(1, keepdims=True),
                               rtol=1e-10)
    np.testing.assert_array_equal(est.predict(X), dens.argmax(1))
    ll = np.log(dens.sum(1))
    np.testing.assert_allclose(est.score_samples(X), ll, rtol=1e-12)
    assert est.score(X) == pytest.approx(ll.mean(), rel=1e-12)
    p = 2 + 3 * sum(r - 1 for r in CATS)
    assert est._n_parameters() == p
    assert est.bic(X) == pytest.approx(-2 * ll.sum() + p * np.log(len(X)), rel=1e-12)
    pooled = np.vstack([cd.X for _, cd in fd.items()])
    assert est.score(fd) == pytest.approx(est.score(pooled), rel=1e-12)  # on the clients


@pytest.mark.usefixtures("rare_level_rule_off")
@pytest.mark.usefixtures("saturation_rule_off")
def test_save_and_load_round_trip_and_refuse_broken_probabilities(tmp_path):
    fd = twenty_unequal_clients()
    est = fit(fl.LatentClassAnalysis(2, n_categories=list(CATS), max_rounds=5,
                                     random_state=0), fd)
    est.save(tmp_path / "m")
    back = fl.LatentClassAnalysis.load(tmp_path / "m")
    X = fd[fd.client_ids[3]].X
    np.testing.assert_array_equal(back.predict_proba(X), est.predict_proba(X))
    est.probabilities_ = est.probabilities_ * 1.5
    est.save(tmp_path / "bad")
    with pytest.raises(ValueError, match=r"field 'probabilities_' of variable 0 does not sum "
                                         r"to 1"):
        fl.LatentClassAnalysis.load(tmp_path / "bad")


@pytest.mark.usefixtures("rare_level_rule_off")
@pytest.mark.usefixtures("saturation_rule_off")
def test_a_bad_code_names_the_client_and_the_column():
    fd = twenty_unequal_clients()
    data = {c: cd.X.copy() for c, cd in fd.items()}
    data["c07"][2, 1] = 1.5
    bad = fl.FederatedDataset.from_arrays(data, feature_names=["a", "b", "c", "d"])
    with pytest.raises(ValueError, match=r"client 'c07': column 'b' holds 1.5, not a category "
                                         r"code in 0..3"):
        fl.LatentClassAnalysis(3, n_categories=list(CATS)).fit(bad)
    est = fit(fl.LatentClassAnalysis(2, max_rounds=2, random_state=0), fd)
    with pytest.raises(ValueError, match=r"X: column 'v3' holds 2, not a category code in "
                                         r"0..1"):
        est.predict(np.array([[0, 0, 2, 0]]))


@pytest.mark.usefixtures("rare_level_rule_off")
@pytest.mark.usefixtures("saturation_rule_off")
def test_secure_aggregation_equals_the_plain_fit():
    fd = twenty_unequal_clients()

    def est(secure):
        return fl.LatentClassAnalysis(3, n_categories=list(CATS), max_rounds=6, tol=0.0,
                                      random_state=2,
                                      federation=fl.Federation(secure_aggregation=secure))

    plain, secure = fit(est(False), fd), fit(est(True), fd)
    for name in ("weights_", "probabilities_"):
        a, b = getattr(secure, name), getattr(plain, name)
        assert np.max(np.abs(a - b)) / np.max(np.abs(b)) < 1e-6, name
    with pytest.raises(ValueError, match=r"under secure aggregation or differential privacy "
                                         r"give n_categories"):
        fl.LatentClassAnalysis(3, federation=fl.Federation(secure_aggregation=True)).fit(fd)


def test_one_record_moves_the_counts_by_at_most_one_per_variable():
    from fedlatent.engine.privacy import joint_sensitivity
    from fedlatent.models.lca.math import lca_statistics, one_hot, responsibilities
    from fedlatent.models.lca.model import LCAModel

    model = LCAModel(3, list(CATS))
    bound = model.dp_sensitivity({}, None)
    assert bound == {"nk": 1.0, "counts": pytest.approx(2.0)}  # sqrt(J), J = 4
    rng = np.random.default_rng(0)
    X = np.column_stack([rng.integers(0, r, size=50) for r in CATS]).astype(float)
    w = rng.dirichlet(np.ones(3))
    probs = np.hstack([rng.dirichlet(np.ones(r), size=3) for r in CATS])
    Z = one_hot(X, CATS)
    full = lca_statistics(Z, responsibilities(Z, w, probs)[0])
    worst = 0.0
    for i in range(len(X)):  # the exact change from removing each record in turn
        keep = np.arange(len(X)) != i
        part = lca_statistics(Z[keep], responsibilities(Z[keep], w, probs)[0])
        moved = np.sqrt(sum(float(np.sum((full[k] - part[k]) ** 2)) for k in full))
        worst = max(worst, moved)
    assert worst <= joint_sensitivity(bound) * (1 + 1e-12)
    assert worst > 0.5 * joint_sensitivity(bound)  # the bound is not loose by orders


@pytest.mark.usefixtures("rare_level_rule_off")
@pytest.mark.usefixtures("saturation_rule_off")
def test_differential_privacy_fits_within_its_budget():
    fd = twenty_unequal_clients()
    dp = fl.DifferentialPrivacy(epsilon=4.0, delta=1e-5, clip=1.0)
    est = fit(fl.LatentClassAnalysis(3, n_categories=list(CATS), random_state=0,
                                     federation=fl.Federation(privacy=dp)), fd)
    eps, delta = est.privacy_spent_
    assert eps <= 4.0 * (1 + 1e-9) and delta <= 1e-5
    assert est.weights_.sum() == pytest.approx(1.0, abs=1e-9) and np.all(est.weights_ >= 0)
    assert np.all(est.probabilities_ >= 0)  # noisy negative counts projected by the engine
    off = np.concatenate([[0], np.cumsum(CATS)])
    for j in range(len(CATS)):
        np.testing.assert_allclose(est.probabilities_[:, off[j]:off[j + 1]].sum(1), 1.0,
                                   atol=1e-9)


def test_registered_and_exported_without_editing_an_existing_file():
    from fedlatent.engine.contract.registry import estimator_class, model_class

    assert estimator_class("lca") is fl.LatentClassAnalysis
    assert model_class("lca").__name__ == "LCAModel"
    assert "LatentClassAnalysis" in dir(fl)


def test_the_experiment_returns_a_table_and_a_figure(tmp_path):
    table = fl.experiments.lca(quick=True, out=tmp_path, random_state=0)
    assert list(table["method"]) == ["centralized EM (pooled rows)", "federated, every client",
                                     "federated, half the clients per round"]
    cen, full = table.iloc[0], table.iloc[1]
    assert full["probabilities_error"] == pytest.approx(cen["probabilities_error"], rel=1e-8)
    assert full["loglik"] == pytest.approx(cen["loglik"], rel=1e-10)
    assert table["probabilities_error"].max() < 0.1  # near the truth (80 rows a client)
    assert (tmp_path / "lca.png").stat().st_size > 20_000
    assert table.attrs["figure"] == str(tmp_path / "lca.png")
