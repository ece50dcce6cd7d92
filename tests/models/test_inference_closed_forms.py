"""Item 1 of issue 24, the remaining closed form: a one-component "tied" Gaussian mixture is
the one Gaussian, so its observed information gives the Gaussian MLE covariance of the mean
(S / n) and of the covariance entries ((2/n) D+ (S kron S) D+^T) to 1e-6."""

import numpy as np

import fedlatent as fl
from fedlatent.models.gmm import FederatedGaussianMixture


def duplication_pinv(d):
    iu = np.triu_indices(d)
    D = np.zeros((d * d, len(iu[0])))
    for v, (a, b) in enumerate(zip(*iu, strict=True)):
        D[a * d + b, v] = D[b * d + a, v] = 1.0
    return np.linalg.pinv(D)


def test_one_tied_component_is_the_closed_form_gaussian_mle_covariance():
    rng = np.random.default_rng(7)
    n, d = 500, 3
    A = rng.normal(size=(d, d))
    X = rng.multivariate_normal([0.5, -1.0, 2.0], A @ A.T + np.eye(d), size=n)
    parts = np.array_split(np.arange(n), 4)
    fd = fl.FederatedDataset.from_arrays({f"c{i}": X[p] for i, p in enumerate(parts)},
                                         feature_names=["a", "b", "c"])
    est = FederatedGaussianMixture(1, covariance_type="tied", reg_covar=0.0,
                                   random_state=0).fit(fd)
    S = np.asarray(est.covariances_)
    np.testing.assert_allclose(S, np.cov(X.T, bias=True), rtol=1e-6)
    cov = est.cov_params()
    means = [("0", f"mean {f}") for f in "abc"]
    np.testing.assert_allclose(cov.loc[means, means].to_numpy(), S / n, rtol=1e-6)
    entries = [k for k in cov.index if k[0] == "tied"]
    assert [k[1] for k in entries] == ["var a", "cov a,b", "cov a,c", "var b", "cov b,c",
                                       "var c"]
    Dp = duplication_pinv(d)
    want = 2.0 / n * Dp @ np.kron(S, S) @ Dp.T
    np.testing.assert_allclose(cov.loc[entries, entries].to_numpy(), want, rtol=1e-6)
    assert np.abs(cov.loc[means, entries].to_numpy()).max() < 1e-6 * np.abs(want).max()
