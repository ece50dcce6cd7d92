"""Inference for FederatedGaussianMixture (issue 24, item 1): Louis' observed information
equals minus the Hessian of the pooled log-likelihood for every covariance type; one component
gives the closed-form Gaussian MLE covariance; two components agree with a bootstrap of the
centralized EM; 95% intervals cover the truth."""

import numpy as np
import pytest
from scipy import stats

import fedlatent as fl
from fedlatent.engine.protocol.numerics import logsumexp
from fedlatent.models.gmm import FederatedGaussianMixture
from fedlatent.models.gmm.inference import full_covariances, gmm_information

COLUMNS = ["coef", "std err", "z", "P>|z|", "[0.025", "0.975]"]
COVS = {"full": np.array([[[1.0, 0.3], [0.3, 0.8]], [[0.6, -0.2], [-0.2, 1.5]]]),
        "tied": np.array([[1.0, 0.3], [0.3, 0.8]]),
        "diag": np.array([[1.0, 0.7], [0.5, 1.3]]),
        "spherical": np.array([0.8, 1.4])}


def federate(X, n_clients=3):
    parts = np.array_split(np.arange(len(X)), n_clients)
    return fl.FederatedDataset.from_arrays({f"c{i}": X[p] for i, p in enumerate(parts)},
                                           feature_names=["a", "b"])


def unpack(theta, K, d, ct):
    """(weights, means, sklearn-shaped covariances) of the free parameters."""
    iu = np.triu_indices(d)

    def sym(v):
        S = np.zeros((d, d))
        S[iu] = v
        return S + S.T - np.diag(np.diag(S))

    w = np.r_[theta[:K - 1], 1 - theta[:K - 1].sum()]
    rest = theta[K - 1:]
    if ct == "tied":
        return w, rest[:K * d].reshape(K, d), sym(rest[K * d:])
    c = {"full": len(iu[0]), "diag": d, "spherical": 1}[ct]
    blocks = rest.reshape(K, d + c)
    covs = blocks[:, d:]
    covs = np.stack([sym(v) for v in covs]) if ct == "full" else (
        covs if ct == "diag" else covs[:, 0])
    return w, blocks[:, :d], covs


def loglik(theta, X, K, ct):
    w, means, cov = unpack(theta, K, X.shape[1], ct)
    C = full_covariances(cov, ct, K, X.shape[1])
    lp = np.column_stack([stats.multivariate_normal(means[k], C[k]).logpdf(X) + np.log(w[k])
                          for k in range(K)])
    return logsumexp(lp, axis=1).sum()


def central_hessian(f, t, h=1e-4):
    P = t.size
    E = np.eye(P) * h
    H = np.empty((P, P))
    for i in range(P):
        for j in range(P):
            H[i, j] = (f(t + E[i] + E[j]) - f(t + E[i] - E[j]) - f(t - E[i] + E[j])
                       + f(t - E[i] - E[j])) / (4 * h * h)
    return H


@pytest.mark.parametrize("ct", ["full", "tied", "diag", "spherical"])
def test_information_is_minus_the_hessian_of_the_loglik(ct):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(50, 2))
    w, means, cov = np.array([0.4, 0.6]), np.array([[0.3, -0.2], [-0.5, 0.4]]), COVS[ct]
    iu = np.triu_indices(2)
    if ct == "tied":
        theta = np.concatenate([w[:-1], means.ravel(), cov[iu]])
    else:
        theta = np.concatenate([w[:-1]] + [np.r_[means[k], cov[k][iu] if ct == "full"
                                                 else np.atleast_1d(cov[k])] for k in range(2)])
    info, ll = gmm_information(X, w, means, cov, ct)
    H = central_hessian(lambda t: loglik(t, X, 2, ct), theta)
    np.testing.assert_allclose(info, -H, atol=1e-5 * np.abs(info).max())
    assert ll == pytest.approx(loglik(theta, X, 2, ct), rel=1e-10)


def duplication(d):
    """D with vec(S) = D vech(S) (vech: the upper triangle row by row)."""
    iu = np.triu_indices(d)
    D = np.zeros((d * d, len(iu[0])))
    for v, (a, b) in enumerate(zip(*iu, strict=True)):
        D[a * d + b, v] = D[b * d + a, v] = 1.0
    return D


@pytest.mark.parametrize("ct", ["full", "diag", "spherical"])
def test_one_component_is_the_closed_form_gaussian_mle_covariance(ct):
    rng = np.random.default_rng(0)
    n, d = 400, 2
    X = rng.multivariate_normal([1.0, -1.0], [[1.0, 0.4], [0.4, 2.0]], size=n)
    est = FederatedGaussianMixture(1, covariance_type=ct, reg_covar=0.0,
                                   random_state=0).fit(federate(X))
    cov = est.cov_params().loc["0", "0"]
    S = full_covariances(est.covariances_, ct, 1, d)[0]
    means = [f"mean {f}" for f in "ab"]
    np.testing.assert_allclose(cov.loc[means, means].to_numpy(), S / n, rtol=1e-6,
                               atol=1e-12 * S.max() / n)
    var = cov.drop(index=["weight", *means], columns=["weight", *means]).to_numpy()
    if ct == "full":  # Var(vech S) = (2/n) D+ (S kron S) D+^T
        Dp = np.linalg.pinv(duplication(d))
        want = 2.0 / n * Dp @ np.kron(S, S) @ Dp.T
    elif ct == "diag":
        want = np.diag(2.0 * np.diag(S) ** 2 / n)
    else:  # one variance over d coordinates
        want = np.array([[2.0 * S[0, 0] ** 2 / (n * d)]])
    np.testing.assert_allclose(var, want, rtol=1e-6, atol=1e-12 * np.abs(want).max())
    cross = cov.loc[means].drop(columns=["weight", *means]).to_numpy()
    assert np.abs(cross).max() < 1e-6 * np.abs(want).max()


def two_blobs(n, rng):
    z = rng.random(n) < 0.3
    return np.where(z[:, None], rng.multivariate_normal([0, 0], COVS["full"][0], n),
                    rng.multivariate_normal([3, 2], COVS["full"][1], n))


TRUTH_W, TRUTH_M = np.array([0.3, 0.7]), np.array([[0.0, 0.0], [3.0, 2.0]])


def fit_two(X, tol=1e-10):
    return FederatedGaussianMixture(2, tol=tol, max_rounds=2000, random_state=0,
                                    weights_init=TRUTH_W, means_init=TRUTH_M,
                                    precisions_init=np.linalg.inv(COVS["full"])).fit(federate(X))


def test_summary_columns_and_rows():
    est = fit_two(two_blobs(400, np.random.default_rng(2)))
    s = est.summary()
    assert list(s.table.columns) == COLUMNS
    assert list(s.table.loc["0"].index) == ["weight", "mean a", "mean b", "var a", "cov a,b",
                                            "var b"]
    assert "FederatedGaussianMixture results" in str(s)
    tied = FederatedGaussianMixture(2, covariance_type="tied", random_state=0).fit(
        federate(two_blobs(400, np.random.default_rng(2))))
    assert list(tied.summary().table.loc["tied"].index) == ["var a", "cov a,b", "var b"]


@pytest.mark.slow
def test_two_components_agree_with_a_bootstrap_of_the_central_em():
    from sklearn.mixture import GaussianMixture

    rng = np.random.default_rng(3)
    X = two_blobs(600, rng)
    est = fit_two(X)
    iu = np.triu_indices(2)
    draws = []
    for _ in range(300):
        Xb = X[rng.integers(0, len(X), len(X))]
        g = GaussianMixture(2, tol=1e-8, max_iter=2000, reg_covar=0.0, weights_init=est.weights_,
                            means_init=est.means_, precisions_init=est.precisions_).fit(Xb)
        draws.append(np.concatenate([g.weights_[:1], g.means_[0], g.covariances_[0][iu],
                                     g.means_[1], g.covariances_[1][iu]]))
    boot = np.std(draws, axis=0, ddof=1)
    bse = est.bse_.drop(index=("1", "weight")).to_numpy()
    np.testing.assert_allclose(bse, boot, rtol=0.15)


@pytest.mark.slow
def test_95_percent_intervals_cover_the_truth_93_to_97_percent():
    rng = np.random.default_rng(4)
    iu = np.triu_indices(2)
    truth = np.concatenate([[0.3], TRUTH_M[0], COVS["full"][0][iu], [0.7], TRUTH_M[1],
                            COVS["full"][1][iu]])
    keep = np.arange(truth.size) != 6  # the last weight is 1 - the first (the same interval)
    hits = []
    for _ in range(200):
        ci = fit_two(two_blobs(500, rng), tol=1e-8).conf_int(0.05)
        lo, hi = ci["lower"].to_numpy(), ci["upper"].to_numpy()
        hits.append(((lo <= truth) & (truth <= hi))[keep])
    coverage = float(np.mean(hits))
    assert 0.93 <= coverage <= 0.97, coverage
