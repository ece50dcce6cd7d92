"""The federated Gaussian mixture as a scikit-learn GaussianMixture."""

import warnings

import numpy as np
import pandas as pd
import pytest
from sklearn.mixture import GaussianMixture

import fedlatent as fl


@pytest.mark.usefixtures("saturation_rule_off")
@pytest.mark.parametrize("cov", ["full", "tied", "diag", "spherical"])
def test_to_sklearn_scores_like_the_federated_mixture(blobs_fd, cov):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        fed = fl.FederatedGaussianMixture(3, covariance_type=cov, max_rounds=8, random_state=0,
                                          verbose=False).fit(blobs_fd)
    sk = fed.to_sklearn()
    assert isinstance(sk, GaussianMixture)
    X = pd.DataFrame(blobs_fd.pooled().X, columns=blobs_fd.feature_names)
    a, b = fed.score_samples(X), sk.score_samples(X)
    assert np.max(np.abs(a - b)) <= 1e-12 * max(1.0, np.max(np.abs(a)))
    np.testing.assert_array_equal(fed.predict(X), sk.predict(X))
    np.testing.assert_allclose(sk.predict_proba(X), fed.predict_proba(X), rtol=0, atol=1e-12)
    assert sk.n_iter_ == fed.n_iter_ == fed.n_rounds_


@pytest.mark.usefixtures("saturation_rule_off")
def test_fit_predict_equals_fit_then_predict_dataset(blobs_fd):
    kw = dict(max_rounds=6, random_state=1, verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        labels = fl.FederatedGaussianMixture(3, **kw).fit_predict(blobs_fd)
        est = fl.FederatedGaussianMixture(3, **kw).fit(blobs_fd)
    np.testing.assert_array_equal(labels, est.predict_dataset(blobs_fd))
    assert labels.shape == (blobs_fd.n_samples,)
    np.testing.assert_array_equal(
        labels, np.concatenate([est.predict(cd.X) for _, cd in blobs_fd.items()])
    )
    assert est.score_dataset(blobs_fd) == pytest.approx(est.score(blobs_fd.pooled().X), rel=1e-12)
