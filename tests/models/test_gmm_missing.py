"""Issue 25: the Gaussian mixture with missing values (NaN, missing at random) handled by EM.

The federated fit is checked against a centralized missing-data EM written here row by row
(Little and Rubin, ch. 11: the E-step completes each row with its conditional mean and adds the
conditional covariance), from the same start.
"""

import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.data.client import ClientData
from fedlatent.engine.privacy.patterns import merge_rare_patterns

D = 3
MU = np.array([[0.0, 0.0, 0.0], [3.0, 2.5, -2.0]])
A = np.array([[1.0, 0.6, 0.0], [0.0, 1.0, 0.4], [0.0, 0.0, 0.8]])


def _rows(n, rng):
    z = rng.integers(0, 2, n)
    return MU[z] + rng.standard_normal((n, D)) @ A


def _mar(X, rng, rate=0.25):
    """Columns 1 and 2 missing with a probability rising with column 0 (observed), about
    ``rate`` of those values overall; column 0 missing completely at random (10%)."""
    X = X.copy()
    p = rate * 2 / (1 + np.exp(-(X[:, :1] - 1.5)))
    miss = np.hstack([rng.random((len(X), 1)) < 0.1, rng.random((len(X), 2)) < p])
    X[miss] = np.nan
    return X


def _federation(seed=0, n=60, sites=4):
    rng = np.random.default_rng(seed)
    data = {f"s{c}": _mar(_rows(n, rng), rng) for c in range(sites)}
    data["s3"][:, 2] = np.nan  # a site lacking a column
    return data


def _full(cov, ct, K):
    cov = np.asarray(cov, dtype=float)
    if ct == "full":
        return cov
    if ct == "tied":
        return np.stack([cov] * K)
    if ct == "spherical":
        return np.stack([np.eye(D) * c for c in cov])
    return np.stack([np.diag(c) for c in cov])


def _reference_em(X, w, means, covs, ct, n_iter, reg=1e-6):
    """Centralized missing-data EM, one row at a time (the test's own code)."""
    K = len(w)
    for _ in range(n_iter):
        nk, sx, sxx = np.zeros(K), np.zeros((K, D)), np.zeros((K, D, D))
        for x in X:
            o = ~np.isnan(x)
            m = ~o
            logp, xh, Cs = [], [], []
            for k in range(K):
                S = covs[k]
                Soo = S[np.ix_(o, o)]
                diff = x[o] - means[k][o]
                logp.append(np.log(w[k]) - 0.5 * (o.sum() * np.log(2 * np.pi)
                            + np.linalg.slogdet(Soo)[1] + diff @ np.linalg.solve(Soo, diff)))
                B = np.linalg.solve(Soo, S[np.ix_(o, m)])
                e = x.copy()
                e[m] = means[k][m] + diff @ B
                C = np.zeros((D, D))
                C[np.ix_(m, m)] = S[np.ix_(m, m)] - S[np.ix_(m, o)] @ B
                xh.append(e)
                Cs.append(C)
            logp = np.array(logp)
            q = np.exp(logp - logp.max())
            q /= q.sum()
            for k in range(K):
                nk[k] += q[k]
                sx[k] += q[k] * xh[k]
                sxx[k] += q[k] * (np.outer(xh[k], xh[k]) + Cs[k])
        w = nk / nk.sum()
        means = sx / nk[:, None]
        covs = sxx / nk[:, None, None] - np.einsum("ki,kj->kij", means, means)
        if ct == "tied":  # pooled within-component scatter
            covs = np.stack([np.einsum("k,kij->ij", nk, covs) / nk.sum()] * K)
        covs = covs + reg * np.eye(D)
        if ct == "diag":
            covs = np.stack([np.diag(np.diag(c)) for c in covs])
        if ct == "spherical":
            covs = np.stack([np.eye(D) * np.trace(c) / D for c in covs])
    return w, means, covs


COV0 = {"full": np.stack([np.eye(D) * 2.0] * 2), "diag": np.full((2, D), 2.0),
        "tied": np.eye(D) * 2.0, "spherical": np.full(2, 2.0)}


@pytest.mark.parametrize("ct", ["full", "diag", "tied", "spherical"])
def test_federated_equals_centralized_missing_data_em(ct):
    data = _federation()
    X = np.vstack(list(data.values()))
    assert 0.24 < np.isnan(X).mean() < 0.26  # 25% of the values missing, one site lacks x2
    w0 = np.array([0.5, 0.5])
    m0 = np.array([[0.5, 0.5, 0.5], [2.0, 2.0, -1.0]])
    cov0 = COV0[ct]
    prec0 = np.linalg.inv(cov0) if ct in ("full", "tied") else 1.0 / cov0
    n_iter = 6
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        gm = fl.FederatedGaussianMixture(
            2, covariance_type=ct, weights_init=w0, means_init=m0, precisions_init=prec0,
            max_rounds=n_iter, tol=0.0, random_state=0, verbose=False,
        ).fit(fl.FederatedDataset.from_arrays(data))
    # the rows each site fits: its rare missingness patterns merged (issue 39's rule)
    fitted = np.vstack([merge_rare_patterns(ClientData(x), fl.DisclosurePolicy()).X
                        for x in data.values()])
    assert fitted.shape[0] < X.shape[0]  # the rule changed something here
    w, mu, cov = _reference_em(fitted, w0, m0, _full(cov0, ct, 2), ct, n_iter)
    assert gm.n_iter_ == n_iter
    np.testing.assert_allclose(gm.weights_, w, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(gm.means_, mu, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(_full(gm.covariances_, ct, 2), cov, rtol=1e-8, atol=1e-10)


def test_predictions_use_the_observed_part():
    data = _federation()
    gm = fl.FederatedGaussianMixture(2, random_state=0, verbose=False, max_rounds=5).fit(
        fl.FederatedDataset.from_arrays(data))
    x = np.array([[np.nan, 1.0, np.nan], [0.5, np.nan, -1.0], [np.nan] * 3])
    logp = np.empty((3, 2))
    for i, row in enumerate(x):
        o = ~np.isnan(row)
        for k in range(2):
            S = gm.covariances_[k][np.ix_(o, o)]
            diff = row[o] - gm.means_[k][o]
            logp[i, k] = np.log(gm.weights_[k]) - 0.5 * (
                o.sum() * np.log(2 * np.pi) + np.linalg.slogdet(S)[1]
                + diff @ np.linalg.solve(S, diff)) if o.any() else np.log(gm.weights_[k])
    ref = np.logaddexp(logp[:, 0], logp[:, 1])
    # (a row with nothing observed scores log sum_k w_k = 0: rounding, not a relative error)
    np.testing.assert_allclose(gm.score_samples(x), ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(gm.predict_proba(x), np.exp(logp - ref[:, None]), rtol=1e-10)
    np.testing.assert_allclose(gm.predict_proba(x)[2], gm.weights_, rtol=1e-12)
    np.testing.assert_array_equal(gm.predict(x), gm.predict_proba(x).argmax(1))


def _split_columns():
    rng = np.random.default_rng(1)
    a, b = _rows(40, rng), _rows(40, rng)
    a[:, 2] = np.nan  # site a: columns x0, x1
    b[:, 1] = np.nan  # site b: columns x0, x2
    return fl.FederatedDataset.from_arrays({"a": a, "b": b})


def test_columns_never_observed_together_are_refused_before_round_1():
    fd = _split_columns()
    with pytest.raises(ValueError, match=r"^columns 'x1' and 'x2' are never observed together "
                       r"at any site: their covariance is not identified; .*"
                       r"covariance_type='diag'$"):
        fl.FederatedGaussianMixture(2, random_state=0, verbose=False).fit(fd)


def test_diag_needs_only_each_column():
    gm = fl.FederatedGaussianMixture(2, covariance_type="diag", random_state=0, verbose=False,
                                     max_rounds=20).fit(_split_columns())
    assert np.all(np.isfinite(gm.means_)) and np.all(gm.covariances_ > 0)
    # the two components are found: their means on x0 are near 0 and 3
    np.testing.assert_allclose(np.sort(gm.means_[:, 0]), [0.0, 3.0], atol=0.6)


def test_a_column_observed_nowhere_is_refused():
    rng = np.random.default_rng(2)
    a, b = _rows(30, rng), _rows(30, rng)
    a[:, 1] = b[:, 1] = np.nan
    fd = fl.FederatedDataset.from_arrays({"a": a, "b": b})
    with pytest.raises(ValueError, match=r"^column 'x1' is observed at no site"):
        fl.FederatedGaussianMixture(2, covariance_type="diag", random_state=0,
                                    verbose=False).fit(fd)


def test_kmeans_federated_start_refused_with_missing_values():
    with pytest.raises(ValueError, match=r"^init_params='kmeans-federated' runs k-means on "
                       r"complete rows"):
        fl.FederatedGaussianMixture(2, init_params="kmeans-federated", random_state=0,
                                    verbose=False).fit(
            fl.FederatedDataset.from_arrays(_federation()))
