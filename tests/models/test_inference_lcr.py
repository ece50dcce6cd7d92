"""Inference for LatentClassRegression (issue 24, items 1 and 2): Louis' observed information
equals minus the Hessian of the pooled log-likelihood; one component gives OLS's standard errors
(MLE scale); two components agree with a bootstrap of the centralized EM; 95% intervals cover
the truth; prediction intervals cover new data."""

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.models.lcr import LatentClassRegression
from fedlatent.models.lcr.inference import lcr_information, mixture_quantiles
from fedlatent.models.lcr.math import lcr_m_step, lcr_responsibilities, lcr_statistics

COLUMNS = ["coef", "std err", "z", "P>|z|", "[0.025", "0.975]"]


def federate(X, y, n_clients=3):
    parts = np.array_split(np.arange(len(y)), n_clients)
    return fl.FederatedDataset.from_arrays({f"c{i}": (X[p], y[p]) for i, p in enumerate(parts)},
                                           feature_names=[f"x{j}" for j in range(X.shape[1])])


def two_lines(n, rng):
    """y = 1 + 2x + N(0, 0.5^2) w.p. 0.4, y = -1 - x + N(0, 1) otherwise."""
    X = rng.normal(size=(n, 1))
    z = rng.random(n) < 0.4
    y = np.where(z, 1 + 2 * X[:, 0] + 0.5 * rng.normal(size=n),
                 -1 - X[:, 0] + rng.normal(size=n))
    return X, y


TRUTH = {"weights": np.array([0.4, 0.6]), "beta": np.array([[2.0, 1.0], [-1.0, -1.0]]),
         "noise_variance": np.array([0.25, 1.0])}


def fit_two(X, y, tol=1e-10):
    return LatentClassRegression(2, tol=tol, max_rounds=2000, random_state=0,
                                 weights_init=TRUTH["weights"], coef_init=TRUTH["beta"][:, :1],
                                 intercept_init=TRUTH["beta"][:, 1],
                                 noise_variance_init=TRUTH["noise_variance"]).fit(federate(X, y))


def loglik(theta, Xt, y, K):
    p = Xt.shape[1]
    w = np.r_[theta[:K - 1], 1 - theta[:K - 1].sum()]
    blocks = theta[K - 1:].reshape(K, p + 1)
    return lcr_responsibilities(Xt, y, w, blocks[:, :p], blocks[:, p])[1].sum()


def central_hessian(f, t, h=1e-4):
    P = t.size
    E = np.eye(P) * h
    H = np.empty((P, P))
    for i in range(P):
        for j in range(P):
            H[i, j] = (f(t + E[i] + E[j]) - f(t + E[i] - E[j]) - f(t - E[i] + E[j])
                       + f(t - E[i] - E[j])) / (4 * h * h)
    return H


def test_information_is_minus_the_hessian_of_the_loglik():
    rng = np.random.default_rng(1)
    n, K = 60, 3
    Xt = np.column_stack([rng.normal(size=(n, 2)), np.ones(n)])
    y = rng.normal(size=n)
    w, beta, var = np.array([0.2, 0.3, 0.5]), rng.normal(size=(K, 3)), np.array([0.5, 1, 2])
    theta = np.concatenate([w[:-1]] + [np.r_[beta[k], var[k]] for k in range(K)])
    info, ll = lcr_information(Xt, y, w, beta, var)
    H = central_hessian(lambda t: loglik(t, Xt, y, K), theta)
    assert info.shape == (K - 1 + K * 4,) * 2
    np.testing.assert_allclose(info, -H, atol=1e-4 * np.abs(info).max())
    assert ll == pytest.approx(lcr_responsibilities(Xt, y, w, beta, var)[1].sum(), rel=1e-12)


def test_one_component_standard_errors_are_ols_at_the_mle_scale():
    sm = pytest.importorskip("statsmodels.api")
    rng = np.random.default_rng(0)
    n = 300
    X = rng.normal(size=(n, 2))
    y = X @ [1.0, -2.0] + 0.5 + 0.7 * rng.normal(size=n)
    est = LatentClassRegression(1, reg_noise=0.0, random_state=0).fit(federate(X, y))
    ols = sm.OLS(y, sm.add_constant(X)).fit()
    bse = est.bse_
    mine = bse.loc[("0", ["intercept", "x0", "x1"])].to_numpy()
    # statsmodels divides the residual sum of squares by n - p; the MLE by n
    np.testing.assert_allclose(mine, ols.bse * np.sqrt((n - 3) / n), rtol=1e-6)
    # the MLE variance of the MLE variance is 2 s^4 / n
    s2 = est.noise_variance_[0]
    assert bse[("0", "noise_variance")] == pytest.approx(np.sqrt(2 * s2**2 / n), rel=1e-6)
    ci = est.conf_int(0.05).loc[("0", "x0")]
    assert ci["upper"] - ci["lower"] == pytest.approx(2 * 1.959963984540054 * bse[("0", "x0")],
                                                      rel=1e-9)


def test_summary_columns_and_rows_named_by_the_features():
    rng = np.random.default_rng(2)
    X, y = two_lines(400, rng)
    est = fit_two(X, y)
    s = est.summary()
    assert list(s.table.columns) == COLUMNS
    assert list(s.table.index.get_level_values("parameter")[:4]) == [
        "weight", "x0", "intercept", "noise_variance"]
    assert s.table.shape == (8, 6)
    assert "LatentClassRegression results" in str(s) and "std err" in str(s)
    assert s.info["Observations"] == "400"
    assert list(est.summary(alpha=0.1).table.columns[-2:]) == ["[0.05", "0.95]"]
    with pytest.raises(ValueError, match=r"alpha must be in \(0, 1\)"):
        est.conf_int(1.5)


def central_em(X, y, start, tol=1e-10, max_iter=2000):
    """Plain EM on pooled data (the library's E- and M-step formulas), from ``start``."""
    Xt = np.column_stack([X, np.ones(len(y))])
    w, beta, var = start["weights"], start["beta"], start["noise_variance"]
    prev = -np.inf
    for _ in range(max_iter):
        resp, ll = lcr_responsibilities(Xt, y, w, beta, var)
        S = lcr_statistics(Xt, y, resp)
        w, beta, var = lcr_m_step(S, 0.0)
        if ll.sum() - prev < tol:
            break
        prev = ll.sum()
    return np.concatenate([w, beta.ravel(), var])


@pytest.mark.slow
def test_two_components_agree_with_a_bootstrap_of_the_central_em():
    rng = np.random.default_rng(3)
    X, y = two_lines(800, rng)
    est = fit_two(X, y)
    start = {k: np.asarray(v) for k, v in est._fitted_params().items()}
    draws = []
    for _ in range(300):
        i = rng.integers(0, len(y), len(y))
        draws.append(central_em(X[i], y[i], start, tol=1e-8))
    boot = np.std(draws, axis=0, ddof=1)
    bse = est.bse_
    mine = np.concatenate([bse.xs("weight", level="parameter").to_numpy(),
                           *[bse.loc[(str(k), ["x0", "intercept"])].to_numpy() for k in (0, 1)],
                           bse.xs("noise_variance", level="parameter").to_numpy()])
    np.testing.assert_allclose(mine, boot, rtol=0.15)


@pytest.mark.slow
def test_95_percent_intervals_cover_the_truth_93_to_97_percent():
    rng = np.random.default_rng(4)
    truth = np.array([0.4, 2.0, 1.0, 0.25, 0.6, -1.0, -1.0, 1.0])  # (component, parameter)
    hits = []
    for _ in range(200):
        X, y = two_lines(500, rng)
        ci = fit_two(X, y, tol=1e-8).conf_int(0.05)
        lo, hi = ci["lower"].to_numpy(), ci["upper"].to_numpy()
        keep = np.arange(8) != 4  # the last weight is 1 - the first (the same interval)
        hits.append(((lo <= truth) & (truth <= hi))[keep])
    coverage = float(np.mean(hits))
    assert 0.93 <= coverage <= 0.97, coverage


def test_mixture_quantiles_of_one_normal_are_its_quantiles():
    from scipy import stats

    means = np.array([[0.0], [3.0]])
    q = mixture_quantiles(means, np.array([2.0]), np.array([1.0]), np.array([0.025, 0.975]))
    np.testing.assert_allclose(q, means + 2.0 * stats.norm.ppf([0.025, 0.975]), atol=1e-9)


def test_prediction_intervals_cover_new_data_at_their_level():
    rng = np.random.default_rng(5)
    X, y = two_lines(4000, rng)
    est = fit_two(X, y, tol=1e-8)
    Xn, yn = two_lines(20000, rng)
    for alpha in (0.1, 0.5):
        iv = est.predict_interval(Xn, alpha=alpha)
        assert iv.shape == (20000, 2) and np.all(iv[:, 0] < iv[:, 1])
        cover = np.mean((iv[:, 0] <= yn) & (yn <= iv[:, 1]))
        assert abs(cover - (1 - alpha)) < 0.015, (alpha, cover)


def test_the_readme_inference_example_prints_its_table():
    rng = np.random.default_rng(0)

    def client(n):
        x, z = rng.normal(size=(n, 1)), rng.random(n) < 0.4
        return x, np.where(z, 1 + 2 * x[:, 0] + 0.5 * rng.normal(size=n),
                           -1 - x[:, 0] + rng.normal(size=n))

    fd = fl.FederatedDataset.from_arrays({f"c{i}": client(300) for i in range(4)},
                                         feature_names=["x"])
    t = LatentClassRegression(2, tol=1e-8, random_state=0).fit(fd).summary().table
    np.testing.assert_allclose(t.loc[("0", "weight"), ["coef", "std err"]], [0.5816, 0.01718],
                               rtol=5e-4)
    np.testing.assert_allclose(t.loc[("0", "x"), ["coef", "std err"]], [-0.9728, 0.03905],
                               rtol=5e-4)
