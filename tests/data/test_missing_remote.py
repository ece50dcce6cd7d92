"""Issue 25 on data that stay on the clients (a RemoteDataset built from ``describe``): the
clients say whether they hold NaN or rows without a target; the fits equal the in-process
ones, and a model that cannot take NaN refuses before any round."""

import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.data.dataset import DataValidationError
from fedlatent.data.remote import RemoteDataset
from fedlatent.engine import InProcessRuntime


def _remote(fd, msg=None):
    rt = InProcessRuntime(fd)
    return RemoteDataset.from_replies(rt.call(fd.client_ids, "describe",
                                              {c: dict(msg or {}) for c in fd.client_ids})), rt


def _fit(est, fd, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        return est.fit(fd, **kw)


def test_gmm_on_remote_data_with_missing_values_equals_the_in_process_fit():
    rng = np.random.default_rng(0)
    data = {c: rng.normal(loc=3.0 * (i % 2), size=(60, 3)) for i, c in enumerate("abcd")}
    for X in data.values():
        X[rng.random(X.shape) < 0.2] = np.nan
    data["d"][:, 1] = np.nan
    fd = fl.FederatedDataset.from_arrays(data)
    rd, rt = _remote(fd)
    assert rd.extras["a"] == {"missing": True}
    kw = dict(random_state=0, verbose=False, max_rounds=4, tol=0.0)
    here = _fit(fl.FederatedGaussianMixture(2, **kw), fd)
    there = _fit(fl.FederatedGaussianMixture(2, **kw), rd, runtime=rt)
    np.testing.assert_allclose(there.means_, here.means_, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(there.covariances_, here.covariances_, rtol=1e-10, atol=1e-12)
    with pytest.raises(DataValidationError, match=r"^client 'a': its features have NaN values; "
                       r"drop or impute them before fitting$"):
        ys = {c: (X, np.arange(60.0)) for c, X in data.items()}
        fd_y = fl.FederatedDataset.from_arrays(ys)
        rd_y, rt_y = _remote(fd_y)
        fl.LatentClassRegression(2, random_state=0).fit(rd_y, runtime=rt_y)


def test_lcr_on_remote_data_counts_the_rows_left_out():
    rng = np.random.default_rng(1)
    data = {}
    for c in "abc":
        X = rng.normal(size=(40, 2))
        y = X @ np.array([1.0, 2.0]) + 0.1 * rng.normal(size=40)
        y[:5] = np.nan
        data[c] = (X, y)
    fd = fl.FederatedDataset.from_arrays(data)
    rd, rt = _remote(fd)
    kw = dict(random_state=0, max_rounds=4)
    here = _fit(fl.LatentClassRegression(1, **kw), fd)
    there = _fit(fl.LatentClassRegression(1, **kw), rd, runtime=rt)
    assert there.n_missing_target_ == here.n_missing_target_ == 15
    np.testing.assert_allclose(there.coef_, here.coef_, rtol=1e-10)
