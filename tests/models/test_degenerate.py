"""Degenerate components (issue 42, item 7): a component collapsing onto a point mass is held
at a variance of 1e-3 of the data's (the pooled regression's residual variance for the latent
class regression, the pooled covariance's smallest eigenvalue for the Gaussian mixture), with
one warning naming it; a fit without a collapse is untouched."""

import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.contract.degenerate import DEGENERATE_FRACTION


def _zero_inflated(n=600, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 1))
    y = np.where(rng.random(n) < 0.2, 0.0, 1 + 2 * X[:, 0] + rng.normal(size=n))
    parts = np.array_split(np.arange(n), 3)
    return fl.FederatedDataset.from_arrays({f"c{i}": (X[p], y[p]) for i, p in enumerate(parts)})


def test_lcr_point_mass_is_held_at_the_floor_with_a_warning():
    fd = _zero_inflated()
    with pytest.warns(UserWarning, match=r"LatentClassRegression: component\(s\) \d collapsed "
                                         r"onto a point mass \(noise variance"):
        est = fl.LatentClassRegression(2, random_state=0, n_init=1).fit(fd)
    (k,) = est.degenerate_components_
    X = np.vstack([cd.X for _, cd in fd.items()])
    y = np.concatenate([cd.y for _, cd in fd.items()])
    A = np.column_stack([X, np.ones(len(y))])
    b, *_ = np.linalg.lstsq(A, y, rcond=None)
    floor = DEGENERATE_FRACTION * float(np.mean((y - A @ b) ** 2))
    np.testing.assert_allclose(est.noise_variance_[k], floor + est.reg_noise, rtol=1e-8)
    assert np.isfinite(est.lower_bound_) and est.lower_bound_ < 10  # bounded: no spike to inf
    assert "point mass" in est._degenerate_reason(len(y))


def test_gmm_point_mass_is_held_at_the_floor_with_a_warning():
    rng = np.random.default_rng(1)
    X = np.vstack([np.tile([2.0, -1.0], (120, 1)), rng.normal(size=(480, 2))])
    X = X[rng.permutation(len(X))]
    fd = fl.FederatedDataset.from_arrays({f"c{i}": p for i, p in
                                          enumerate(np.array_split(X, 3))})
    with pytest.warns(UserWarning, match=r"FederatedGaussianMixture: component\(s\) \d "
                                         r"collapsed onto a point mass"):
        est = fl.FederatedGaussianMixture(2, random_state=0, max_rounds=300).fit(fd)
    (k,) = est.degenerate_components_
    floor = DEGENERATE_FRACTION * np.linalg.eigvalsh(np.cov(X.T, bias=True))[0]
    np.testing.assert_allclose(np.linalg.eigvalsh(est.covariances_[k])[0], floor, rtol=1e-6)
    assert np.linalg.eigvalsh(est.covariances_[1 - k])[0] > 10 * floor


@pytest.mark.parametrize("covariance_type", ["diag", "spherical"])
def test_gmm_diagonal_floors_are_per_feature(covariance_type):
    rng = np.random.default_rng(2)
    scale = [1.0, 10.0] if covariance_type == "diag" else [1.0, 1.0]
    X = np.vstack([np.tile([0.5, 3.0], (100, 1)), rng.normal(size=(400, 2)) * scale])
    fd = fl.FederatedDataset.from_arrays({"a": X[::2], "b": X[1::2]})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est = fl.FederatedGaussianMixture(2, covariance_type=covariance_type, random_state=0,
                                          max_rounds=300).fit(fd)
    assert any("point mass" in str(w.message) for w in caught)
    (k,) = est.degenerate_components_
    var = DEGENERATE_FRACTION * X.var(axis=0)
    want = var if covariance_type == "diag" else var.mean()
    np.testing.assert_allclose(est.covariances_[k], want, rtol=1e-6)


def test_a_fit_without_a_collapse_is_untouched():
    rng = np.random.default_rng(3)
    X = np.vstack([rng.normal(size=(300, 2)), rng.normal(size=(300, 2)) + 4])
    fd = fl.FederatedDataset.from_arrays({"a": X[::2], "b": X[1::2]})
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        est = fl.FederatedGaussianMixture(2, random_state=0).fit(fd)
    assert est.degenerate_components_ == []
