"""The saved Gaussian mixture's reader (fedlatent.models.gmm.saved: what ``fedlatent predict``
and ``fedlatent score`` read, without scikit-learn) predicts and scores as the estimator loaded
from the same files: the same hooks (GaussianPrediction) on the same arrays."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.models.gmm.saved import FederatedGaussianMixture as Reader
from fresh_process import in_fresh_process
from tolerance import assert_close

pytestmark = pytest.mark.usefixtures("saturation_rule_off_module")


def _fd(nan: bool = False):
    rng = np.random.default_rng(1)
    parts = {f"c{c}": rng.normal(size=(30, 3)) + 3 * (c % 2) for c in range(4)}
    if nan:
        parts["c1"][[2, 5], 1] = np.nan
    return fl.FederatedDataset.from_arrays(parts, feature_names=["a", "b", "c"])


@pytest.mark.parametrize("settings", [
    {"n_components": 2},
    {"n_components": 3, "covariance_type": "diag"},
    {"n_components": 2, "covariance_type": "tied"},
    {"n_components": "auto", "n_components_candidates": [1, 2]},
])
def test_the_reader_predicts_and_scores_as_the_loaded_estimator(tmp_path, settings):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fl.FederatedGaussianMixture(**settings, max_rounds=5, random_state=0,
                                    verbose=False).fit(_fd()).save(tmp_path / "m")
    est, rd = fl.FederatedGaussianMixture.load(tmp_path / "m"), Reader.load(tmp_path / "m")
    X = np.vstack([cd.X for _, cd in _fd(nan=True).items()])
    np.testing.assert_array_equal(rd.predict(X), est.predict(X))
    assert_close(rd.predict_proba(X), est.predict_proba(X))
    assert_close(rd.score_samples(X), est.score_samples(X))
    assert_close(rd.score_dataset(_fd()), est.score_dataset(_fd()))
    assert_close(rd.bic(_fd()), est.bic(_fd()))
    for fd in (_fd(), _fd(nan=True)):  # rows with NaN: their observed part's density
        np.testing.assert_array_equal(rd.predict_dataset(fd).to_numpy(),
                                      est.predict_dataset(fd).to_numpy())
    assert rd.n_components_ == est.n_components_
    assert rd.capabilities == est.capabilities and rd._score_name == est._score_name


def test_reading_a_saved_mixture_imports_no_scikit_learn(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fl.FederatedGaussianMixture(2, max_rounds=3, random_state=0,
                                    verbose=False).fit(_fd()).save(tmp_path / "m")
    code = ("import numpy as np\n"
            "from fedlatent.engine.contract.registry import reader_by_class_name\n"
            f"rd = reader_by_class_name('FederatedGaussianMixture').load({str(tmp_path / 'm')!r})\n"
            "result = rd.predict(np.zeros((2, 3))).tolist()\n")
    labels = Reader.load(tmp_path / "m").predict(np.zeros((2, 3))).tolist()
    assert in_fresh_process(code, ("sklearn", "scipy")) == (labels, [])


def test_a_class_without_a_reader_is_read_by_its_estimator():
    from fedlatent.engine.contract.registry import reader_by_class_name

    assert reader_by_class_name("FedGMM") is None
    assert reader_by_class_name("NoSuchEstimator") is None
    assert reader_by_class_name("FederatedGaussianMixture") is Reader


@pytest.mark.parametrize("cov_type", ["full", "diag", "tied", "spherical"])
def test_the_readers_densities_are_the_mixture_density_computed_apart(tmp_path, cov_type):
    """The reader and the estimator share their prediction code, so the reader is also checked
    against the mixture density written out with SciPy: log sum_k w_k N(x; mu_k, Sigma_k)."""
    from scipy.special import logsumexp
    from scipy.stats import multivariate_normal

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fl.FederatedGaussianMixture(2, covariance_type=cov_type, max_rounds=5, random_state=0,
                                    verbose=False).fit(_fd()).save(tmp_path / "m")
    rd = Reader.load(tmp_path / "m")
    X = np.vstack([cd.X for _, cd in _fd().items()])
    d, cov = X.shape[1], np.asarray(rd.covariances_)
    sigma = {"full": lambda k: cov[k], "tied": lambda k: cov,
             "diag": lambda k: np.diag(cov[k]), "spherical": lambda k: cov[k] * np.eye(d)}
    logp = np.column_stack([np.log(rd.weights_[k])
                            + multivariate_normal(rd.means_[k], sigma[cov_type](k)).logpdf(X)
                            for k in range(2)])
    np.testing.assert_allclose(rd.score_samples(X), logsumexp(logp, axis=1), rtol=1e-10)
    np.testing.assert_allclose(rd.predict_proba(X),
                               np.exp(logp - logsumexp(logp, axis=1, keepdims=True)),
                               rtol=1e-8, atol=1e-12)
