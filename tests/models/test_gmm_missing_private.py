"""Issue 25: secure aggregation and differential privacy with missing values (NaN)."""

import warnings

import numpy as np
import pytest
from test_gmm_missing import _federation

import fedlatent as fl


def _fit(fed=None, runtime=None, **kw):
    fd = fl.FederatedDataset.from_arrays(_federation())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fl.FederatedGaussianMixture(2, random_state=0, verbose=False, federation=fed,
                                           **kw).fit(fd, runtime=runtime)


def test_secure_aggregation_equals_the_plain_fit():
    kw = dict(max_rounds=3, tol=0.0)
    plain = _fit(**kw)
    sec = _fit(fl.Federation(secure_aggregation=True), **kw)
    # the same EM through the fixed-point encoding of the masked sums
    np.testing.assert_allclose(sec.means_, plain.means_, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(sec.covariances_, plain.covariances_, rtol=1e-8, atol=1e-8)


def test_private_fit_noises_the_observed_counts_and_bounds_completions():
    fd = fl.FederatedDataset.from_arrays(_federation())
    rt = fl.InProcessRuntime(fd, record=True)
    dp = fl.DifferentialPrivacy(epsilon=5.0, delta=1e-5, clip=6.0)
    est = _fit(fl.Federation(privacy=dp), runtime=rt)
    assert np.all(np.isfinite(est.means_))
    assert est.n_iter_ == fl.FederatedGaussianMixture._private_max_rounds == 2  # the plan
    moments = [m for d, c, meth, m in rt.log if d == "up" and "nobs" in m]
    assert len(moments) == 4  # every site sent the pairwise form, noised
    nobs = np.asarray(moments[0]["nobs"])
    assert nobs.shape == (3, 3) and not np.allclose(nobs, np.rint(nobs))
    # the statistics' bound: a completed row stays in the clipping ball
    from fedlatent.models.gmm.missing import missing_statistics

    X = np.array([[np.nan, 50.0, np.nan]])
    params = {"weights": np.array([1.0]), "means": np.array([[0.0, 40.0, 100.0]]),
              "covariances": np.eye(3)[None] * 4.0, "center": np.zeros(3)}
    st, _ = missing_statistics(X, params, "full", bound=(np.zeros(3), 6.0))
    assert np.linalg.norm(st["sx"][0]) <= 6.0 + 1e-9
    assert np.trace(st["sxx"][0]) == pytest.approx(36.0, rel=1e-12)
