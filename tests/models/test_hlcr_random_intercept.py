"""HLCR with an entity random intercept (issue 24, item 6): the adjusted statistics are the
entity's Gaussian likelihood under ``sigma^2 I + tau^2 1 1^T``; with one cluster and a flat
prior it is the random-intercept linear mixed model (statsmodels MixedLM, ML)."""

import warnings

import numpy as np
import pandas as pd
import pytest

import fedlatent as fl
from fedlatent.engine.rounds.loop import ConvergenceWarning
from fedlatent.models.hlcr import HLCR
from fedlatent.models.hlcr.math import entity_log_marginal, entity_statistics
from fedlatent.models.hlcr.random_intercept import adjust_statistics, intercept_posterior

sm = pytest.importorskip("statsmodels.formula.api")


def mixed_data(n_ent=40, seed=0, tau=1.5, sigma=1.0, two_agents=True):
    """Unbalanced entities (2-14 events) whose covariate mean varies between entities, so
    that GLS differs from OLS."""
    rng = np.random.default_rng(seed)
    rows = []
    for e in range(n_ent):
        n = int(rng.integers(2, 15))
        x = rng.normal(0.8 * rng.normal(), 1.0, size=n)
        u = tau * rng.normal()
        y = 2.0 + 1.5 * x + u + sigma * rng.normal(size=n)
        rows.append(pd.DataFrame({"agent": f"a{e % 2 if two_agents else 0}",
                                  "ent": f"e{e:03d}", "x": x, "y": y}))
    return pd.concat(rows, ignore_index=True)


def federated(df):
    return fl.FederatedDataset.from_pandas(df, client="agent", entity="ent", target="y",
                                           features=["x"])


def mixedlm(df):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sm.mixedlm("y ~ x", df, groups=df["ent"]).fit(reml=False)


@pytest.fixture(scope="module")
def data():
    df = mixed_data()
    return df, federated(df), mixedlm(df)


def test_adjusted_statistics_are_the_entity_likelihood_under_the_intercept_covariance():
    rng = np.random.default_rng(1)
    n, F = 7, 3
    X = np.c_[rng.normal(size=(n, F - 1)), np.ones(n)]
    y = rng.normal(size=n)
    sigma, tau = 0.8, 1.3
    V = sigma**2 * np.eye(n) + tau**2 * np.ones((n, n))
    _, XtX, Xty, yty, nn = entity_statistics(X, y, np.zeros(n, dtype=int))
    A, b, c = adjust_statistics(XtX, Xty, yty, nn, (tau / sigma) ** 2)
    Vi = np.linalg.inv(V) * sigma**2
    np.testing.assert_allclose(A[0], X.T @ Vi @ X, rtol=1e-12)
    np.testing.assert_allclose(b[0], X.T @ Vi @ y, rtol=1e-12)
    assert c[0] == pytest.approx(y @ Vi @ y, rel=1e-12)
    # Theorem 1 on the adjusted statistics, plus -1/2 log(1 + n rho), is the exact marginal
    # N(y; 0, V + X H X^T) of the entity under a cluster with prior N(0, H)
    H = np.diag([0.5, 2.0, 1.5])
    ll = entity_log_marginal(A, b, c, nn, np.linalg.inv(H)[None],
                             np.zeros((1, F)), sigma)[0, 0]
    ll -= 0.5 * np.log1p(n * (tau / sigma) ** 2)
    C = V + X @ H @ X.T
    exact = -0.5 * (n * np.log(2 * np.pi) + np.linalg.slogdet(C)[1] + y @ np.linalg.solve(C, y))
    assert ll == pytest.approx(exact, rel=1e-12)
    # the intercept's posterior given w: N(tau^2 1^T V^-1 (y - X w), tau^2 - tau^4 1^T V^-1 1)
    w = rng.normal(size=F)
    m, v = intercept_posterior(XtX, Xty, nn, w[None], (tau / sigma) ** 2, sigma)
    one = np.ones(n)
    assert m[0] == pytest.approx(tau**2 * one @ np.linalg.solve(V, y - X @ w), rel=1e-12)
    assert v[0] == pytest.approx(tau**2 - tau**4 * one @ np.linalg.solve(V, one), rel=1e-12)


@pytest.mark.parametrize("solver", ["gibbs", "federated"])
def test_one_cluster_at_mixedlm_variances_gives_its_gls_and_blups(data, solver):
    df, fd, m = data
    est = HLCR(1, random_intercept=True, sigma=float(np.sqrt(m.scale)),
               tau=float(np.sqrt(m.cov_re.iloc[0, 0])), delta=1e8, standardize=False,
               solver=solver, max_rounds=3, n_chains=1, random_state=0).fit(fd)
    np.testing.assert_allclose([est.intercept_[0], est.coef_[0, 0]], m.fe_params.to_numpy(),
                               rtol=1e-6)
    ols = np.polyfit(df.x, df.y, 1)  # GLS is not OLS here: the comparison has teeth
    assert abs(ols[0] - m.fe_params["x"]) > 1e-2
    blup = pd.Series({k: float(v.iloc[0]) for k, v in m.random_effects.items()})
    np.testing.assert_allclose(est.random_effects_, blup[est.pair_entities_].to_numpy(),
                               rtol=1e-6, atol=1e-9)
    # the entity predictions: fixed part plus the entity's BLUP, as MixedLM's
    pred = est.predict_dataset(fd)
    np.testing.assert_allclose(pred.to_numpy(),
                               m.fittedvalues.to_numpy(), rtol=1e-6)


def test_one_cluster_learns_mixedlm_ml_variance_components_within_2_percent():
    df = mixed_data(n_ent=200, seed=3)  # 1,600 events: sigma's IG(1, 1) prior weighs < 1%
    m = mixedlm(df)
    est = HLCR(1, random_intercept=True, delta=1e8, solver="gibbs", max_rounds=120,
               n_chains=1, random_state=0).fit(federated(df))
    assert est.tau_**2 == pytest.approx(float(m.cov_re.iloc[0, 0]), rel=0.02)
    assert est.sigma_**2 == pytest.approx(float(m.scale), rel=0.02)
    np.testing.assert_allclose([est.intercept_[0], est.coef_[0, 0]], m.fe_params.to_numpy(),
                               rtol=0.01)
    assert est.draws_tau_.shape == est.draws_sigma_.shape and (est.draws_tau_ > 0).all()


def test_federated_learns_the_same_variances_as_the_centralized_sampler(data):
    df, fd, m = data
    fits = [HLCR(1, random_intercept=True, delta=1e8, solver=s, max_rounds=80, n_chains=1,
                 random_state=0).fit(fd) for s in ("gibbs", "federated")]
    assert fits[1].tau_ == pytest.approx(fits[0].tau_, rel=0.03)
    assert fits[1].tau_**2 == pytest.approx(float(m.cov_re.iloc[0, 0]), rel=0.05)
    # the agents sent one more per-cluster sum, u2, and nothing per entity
    assert set(fits[1].history_.to_frame().columns) >= {"log_joint", "train_mse"}


def test_two_clusters_of_random_intercept_regressions_are_recovered():
    rng = np.random.default_rng(5)
    frames = []
    for e in range(60):
        k, n = e % 2, 12
        x = rng.normal(size=n)
        y = (3.0 * x if k else -3.0 * x) + 2.0 * rng.normal() + 0.5 * rng.normal(size=n)
        frames.append(pd.DataFrame({"agent": f"a{e % 3}", "ent": f"e{e}", "x": x, "y": y,
                                    "k": k}))
    df = pd.concat(frames, ignore_index=True)
    fd = federated(df)
    est = HLCR(2, random_intercept=True, max_rounds=40, n_chains=1, random_state=0).fit(fd)
    order = np.argsort(est.coef_[:, 0])
    # MixedLM told the true clusters (a slope and a level per cluster) estimates the same tau
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = sm.mixedlm("y ~ C(k) + x:C(k)", df, groups=df["ent"]).fit(reml=False)
    np.testing.assert_allclose(est.coef_[order, 0], m.fe_params.iloc[2:].to_numpy(), atol=0.01)
    assert est.tau_**2 == pytest.approx(float(m.cov_re.iloc[0, 0]), rel=0.02)
    plain = HLCR(2, max_rounds=40, n_chains=1, random_state=0, random_intercept=False).fit(fd)
    assert est.mse(fd) < 0.5 * plain.mse(fd)  # the entity levels are predicted


def test_new_entity_with_context_gets_its_blup(data):
    df, fd, m = data
    est = HLCR(1, random_intercept=True, sigma=float(np.sqrt(m.scale)),
               tau=float(np.sqrt(m.cov_re.iloc[0, 0])), delta=1e8, standardize=False,
               solver="gibbs", max_rounds=2, n_chains=1, random_state=0).fit(fd)
    one = df[df.ent == "e000"].assign(ent="new")
    ctx = federated(one)
    X = np.array([[0.3]])
    pred = est.predict(X, [one.agent.iloc[0]], ["new"], context=ctx)
    known = est.predict(X, [one.agent.iloc[0]], ["e000"])
    assert pred[0] == pytest.approx(known[0], rel=1e-9)  # the same events: the same BLUP
    with pytest.warns(UserWarning, match="did not see"):
        prior = est.predict(X, ["a0"], ["nobody"])
    assert prior[0] == pytest.approx(est.intercept_[0] + 0.3 * est.coef_[0, 0], rel=1e-12)


def test_save_and_load_keep_the_entity_intercepts(data, tmp_path):
    _, fd, _ = data
    est = HLCR(1, random_intercept=True, max_rounds=6, n_chains=1, random_state=0).fit(fd)
    est.save(tmp_path / "m")
    back = HLCR.load(tmp_path / "m")
    np.testing.assert_array_equal(back.random_effects_, est.random_effects_)
    assert back.tau_ == est.tau_
    np.testing.assert_allclose(back.predict_dataset(fd), est.predict_dataset(fd), rtol=1e-12)


@pytest.mark.parametrize("kw, msg", [
    ({"fit_intercept": False}, "random_intercept=True needs fit_intercept=True"),
    ({"n_clusters": "auto", "federation": fl.Federation(secure_aggregation=True)},
     "n_clusters='auto' is not available with random_intercept=True"),
])
def test_refusals(kw, msg):
    with pytest.raises(ValueError, match=msg):
        HLCR(**{"n_clusters": 2, **kw}, random_intercept=True)._check_params()


def test_without_the_random_intercept_nothing_changes(data):
    _, fd, _ = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        # random_intercept is "auto" (on) by default: the paper's model is asked for
        est = HLCR(2, max_rounds=6, n_chains=1, random_state=0, random_intercept=False).fit(fd)
    assert est.tau_ == 0.0 and not est.random_effects_.any()
    # the model every agent rebuilds keeps its old configuration (no new key)
    assert "random_intercept" not in est._model_for(1, 2).config
    assert est._model_for(1, 2).stat_shapes({}).keys() == {"XtX", "Xty", "yty", "n_events",
                                                           "n_entities", "sse"}
