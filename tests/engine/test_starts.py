"""Issue 19, item 10: multi-start (``n_init``) for every EM mixture, in the base estimator:
each start from its own child seed, the best by the federated log-likelihood kept, one line
per start in ``init_scores_``; refused where starts cannot be compared or cost budget."""

import warnings

import numpy as np
import pytest

import fedlatent as fl


def start_seeds(seed, n):
    from fedlatent.engine.contract.starts import start_seeds as seeds

    return seeds(seed, n)


@pytest.fixture(scope="module")
def fd():
    rng = np.random.default_rng(1)
    centres = np.array([[0.0, 0.0], [4.0, 0.0], [0.0, 4.0], [4.0, 4.0]])
    data = {}
    for c in range(3):
        lab = rng.integers(0, 4, 300)
        data[f"c{c}"] = centres[lab] + rng.normal(scale=0.8, size=(300, 2))
    return fl.FederatedDataset.from_arrays(data)


def _gmm(**kw):
    return fl.FederatedGaussianMixture(4, init_params="random", tol=1e-4, max_rounds=40,
                                       verbose=False, **kw)


def _quiet(est, fd):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        return est.fit(fd)


def test_start_seeds_begin_with_the_fit_seed_and_differ():
    seeds = start_seeds(7, 5)
    assert seeds[0] == 7 and len(set(seeds)) == 5
    assert start_seeds(7, 5) == seeds and start_seeds(7, 3) == seeds[:3]
    assert all(0 <= s < 2**63 for s in seeds)


def test_n_init_5_is_the_best_of_the_5_single_fits_with_those_seeds(fd):
    multi = _quiet(_gmm(n_init=5, random_state=0), fd)
    singles = [_quiet(_gmm(random_state=s), fd) for s in start_seeds(0, 5)]
    finals = [s.history_[-1].objective for s in singles]
    table = multi.init_scores_
    assert list(table.index) == [0, 1, 2, 3, 4]
    assert table["seed"].tolist() == start_seeds(0, 5)
    np.testing.assert_allclose(table["score"], finals, rtol=1e-12)
    assert table["n_iter"].tolist() == [s.n_iter_ for s in singles]
    best = int(np.argmax(finals))
    assert multi.best_start_ == best and multi.seed_ == start_seeds(0, 5)[best]
    assert len(set(np.round(finals, 6))) > 1  # the starts really end at different optima
    np.testing.assert_allclose(multi.means_, singles[best].means_, rtol=1e-12)
    np.testing.assert_allclose(multi.weights_, singles[best].weights_, rtol=1e-12)
    assert multi.n_iter_ == singles[best].n_iter_
    assert len(multi.history_) == len(singles[best].history_)


def test_n_init_1_is_the_single_fit(fd):
    a = _quiet(_gmm(random_state=3), fd)
    b = _quiet(_gmm(random_state=3, n_init=1), fd)
    np.testing.assert_array_equal(a.means_, b.means_)
    assert not hasattr(b, "init_scores_")


def test_partial_participation_scores_the_starts_on_every_client(fd):
    fed = fl.Federation(participation=0.5)
    multi = _quiet(_gmm(n_init=3, random_state=0, federation=fed), fd)
    # each start's score is the log-likelihood of its final parameters over every row
    single = _quiet(_gmm(random_state=start_seeds(0, 3)[multi.best_start_], federation=fed), fd)
    pooled = np.vstack([fd[c].X for c in fd.client_ids])
    assert multi.init_scores_["score"].max() == pytest.approx(single.score(pooled), rel=1e-12)


def test_lcr_and_fedgmm_take_n_init():
    rng = np.random.default_rng(0)
    data = {}
    for c in range(4):
        x = rng.uniform(0, 10, size=(80, 1))
        z = rng.random(80) < 0.5
        data[f"c{c}"] = (x, np.where(z, 5 + 2 * x[:, 0], 15 - x[:, 0]) + rng.normal(size=80))
    fd = fl.FederatedDataset.from_arrays(data)
    lcr = _quiet(fl.LatentClassRegression(2, n_init=4, random_state=0), fd)
    assert lcr.init_scores_.shape[0] == 4
    assert lcr.init_scores_["score"].max() == pytest.approx(lcr.history_[-1].objective,
                                                            rel=1e-12)
    # LCR's default: 3 starts; one where the start is given
    assert _quiet(fl.LatentClassRegression(2, random_state=0), fd).init_scores_.shape[0] == 3
    given = fl.LatentClassRegression(2, random_state=0, weights_init=[0.5, 0.5],
                                     coef_init=[[2.0], [-1.0]], intercept_init=[5.0, 15.0],
                                     noise_variance_init=[1.0, 1.0])
    assert not hasattr(_quiet(given, fd), "init_scores_")
    assert "n_init" in fl.FedGMM().get_params()


def test_n_init_is_refused_where_starts_cost_budget_or_cannot_be_compared(fd, tmp_path):
    pytest.importorskip("dp_accounting")
    dp = fl.DifferentialPrivacy(epsilon=1.0, delta=1e-5, clip=8.0)
    with pytest.raises(ValueError, match=r"FederatedGaussianMixture\(n_init=3\) under "
                       "differential privacy: every start would spend the privacy budget "
                       "again; use n_init=1"):
        _gmm(n_init=3, federation=fl.Federation(privacy=dp)).fit(fd)
    with pytest.raises(ValueError, match=r"\(n_init=2\) with a checkpoint: a checkpoint is "
                       "of one run"):
        _gmm(n_init=2).fit(fd, checkpoint=tmp_path / "ck")
    with pytest.raises(ValueError, match=r"FedGMM\(n_init=2\): the starts are compared by "
                       r"the log-likelihood over every client, .*\(FedGMM has none\)"):
        fl.FedGMM(n_init=2, federation=fl.Federation(participation=0.5))._validate_params() \
            or fl.FedGMM(n_init=2, federation=fl.Federation(participation=0.5)).fit(fd)
    # LCR's default n_init=None is one start under privacy (no refusal)
    est = fl.LatentClassRegression(2, federation=fl.Federation(privacy=dp))
    from fedlatent.engine.contract.starts import n_starts

    assert n_starts(est, {}) == 1


def test_a_kept_start_that_did_not_converge_warns_once(fd):
    with pytest.warns(fl.ConvergenceWarning, match="did not converge in 3 rounds") as rec:
        est = fl.FederatedGaussianMixture(4, init_params="random", tol=1e-9, max_rounds=3,
                                          n_init=3, random_state=0, verbose=False).fit(fd)
    assert sum(issubclass(w.category, fl.ConvergenceWarning) for w in rec) == 1
    assert est.converged_ is False


def test_n_init_under_secure_aggregation_picks_the_start_the_plain_fit_picks(fd):
    pytest.importorskip("cryptography")

    def est(secure):
        return fl.FederatedGaussianMixture(
            4, init_params="random", tol=1e-4, max_rounds=8, n_init=2, random_state=0,
            verbose=False, federation=fl.Federation(secure_aggregation=secure))

    plain, secure = _quiet(est(False), fd), _quiet(est(True), fd)
    assert secure.best_start_ == plain.best_start_
    np.testing.assert_allclose(secure.init_scores_["score"], plain.init_scores_["score"],
                               rtol=1e-6)
    np.testing.assert_allclose(secure.means_, plain.means_, rtol=1e-5, atol=1e-6)


def test_a_one_start_refit_drops_the_earlier_multi_start_table():
    fd = fl.FederatedDataset.from_arrays(
        {f"c{i}": np.random.default_rng(i).normal(size=(60, 2)) for i in range(4)})
    est = fl.FederatedGaussianMixture(2, n_init=2, max_rounds=5, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(fd)
        assert len(est.init_scores_) == 2
        est.set_params(n_init=1).fit(fd)
    assert not hasattr(est, "init_scores_") and not hasattr(est, "best_start_")
