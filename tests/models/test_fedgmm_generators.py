"""The FedGMM synthetic generators (paper text, reference script corrected and as published)
and the Bayes-optimal ceiling (issue 14, section 5)."""

import numpy as np
import pytest
from scipy.special import expit
from scipy.stats import multivariate_normal

from fedlatent.data.fedgmm_data import fedgmm_bayes_proba, make_fedgmm_synthetic


@pytest.fixture(scope="module")
def reference():
    return make_fedgmm_synthetic(12, n_features=5, generator="reference", n_test=400,
                                 random_state=3)


@pytest.fixture(scope="module")
def published():
    return make_fedgmm_synthetic(12, n_features=5, generator="reference-as-published",
                                 n_test=400, random_state=3)


def test_reference_sizes_and_splits(reference):
    sp = reference
    sizes = np.array(list(sp.train.sizes().values()))
    assert sp.val is None and sp.info["generator"] == "reference"
    assert sizes.min() >= 50 and sizes.max() <= 1000  # LogNormal(4, 2) + 50, capped at 1,000
    assert set(sp.test.sizes().values()) == {400}
    np.testing.assert_array_equal(sp.info["test_counts"].sum(axis=1), 400)
    assert sp.info["covariance_scale"] == pytest.approx(1 / np.sqrt(5))
    assert np.all(np.abs(sp.info["means"]) <= 1) and np.all(np.abs(sp.info["directions"]) <= 1)
    y = np.concatenate([cd.y for _, cd in sp.test.items()])
    assert set(np.unique(y)) == {0, 1}
    # the corrected script writes every row
    assert all(np.all(cd.X.any(axis=1)) for _, cd in sp.test.items())


def test_a_smaller_cap_bounds_the_training_sizes():
    sp = make_fedgmm_synthetic(20, 120, n_features=3, generator="reference", n_test=10,
                               random_state=0)
    sizes = np.array(list(sp.train.sizes().values()))
    assert sizes.min() >= 50 and sizes.max() == 120


def test_as_published_leaves_the_unwritten_rows_zero(published, reference):
    # the script never advances its write index: only max_m n_m rows are written, the rest
    # stay x = 0, y = 0 (same seed: same pi_c, sizes and component counts as "reference")
    np.testing.assert_array_equal(published.info["test_counts"], reference.info["test_counts"])
    for c, (_, cd) in enumerate(published.test.items()):
        zero = ~cd.X.any(axis=1)
        assert zero.sum() == 400 - published.info["test_counts"][c].max()
        assert np.all(cd.y[zero] == 0)


def test_unknown_generator_is_refused():
    with pytest.raises(ValueError, match=r"generator must be one of \['paper', 'reference', "
                                         r"'reference-as-published'\], got 'ref'"):
        make_fedgmm_synthetic(2, generator="ref")


def test_bayes_proba_matches_scipy(reference):
    sp, c = reference, 4
    X = sp.test[sp.test.client_ids[c]].X[:50]
    info = sp.info
    cov = info["covariance_scale"] * np.eye(5)
    dens = np.stack([info["pi"][c][m] * multivariate_normal(info["means"][m], cov).pdf(X)
                     for m in range(3)], axis=1)
    p_m = np.stack([expit((X - info["means"][m]) @ info["directions"][m]) for m in range(3)],
                   axis=1)
    expected = (dens * p_m).sum(axis=1) / dens.sum(axis=1)
    np.testing.assert_allclose(fedgmm_bayes_proba(X, info, c), expected, rtol=1e-10)


def test_bayes_proba_as_published_uses_the_written_shares(published):
    sp, c = published, 2
    info = sp.info
    X = sp.test[sp.test.client_ids[c]].X
    n = info["test_counts"][c]
    # component m keeps the rows no later component overwrote
    later = np.array([n[m + 1:].max() if m + 1 < len(n) else 0 for m in range(len(n))])
    w = np.maximum(n - later, 0) / n.max()
    cov = info["covariance_scale"] * np.eye(5)
    Xn = X[X.any(axis=1)]
    dens = np.stack([w[m] * multivariate_normal(info["means"][m], cov).pdf(Xn)
                     for m in range(3)], axis=1)
    p_m = np.stack([expit((Xn - info["means"][m]) @ info["directions"][m]) for m in range(3)],
                   axis=1)
    got = fedgmm_bayes_proba(X, info, c)
    np.testing.assert_allclose(got[X.any(axis=1)], (dens * p_m).sum(1) / dens.sum(1),
                               rtol=1e-10)
    assert np.all(got[~X.any(axis=1)] == 0.0)


def test_bayes_rule_is_exact_on_separated_paper_components():
    # deterministic labels and components far apart: the Bayes rule is right on every row
    sp = make_fedgmm_synthetic(4, 100, n_features=3, mean_scale=20.0, random_state=0)
    for c, (_, cd) in enumerate(sp.test.items()):
        p = fedgmm_bayes_proba(cd.X, sp.info, c)
        np.testing.assert_array_equal((p > 0.5).astype(int), cd.y)


def test_paper_generator_is_unchanged():
    # the default is still the paper's text, draw for draw (other tests' data rely on it)
    sp = make_fedgmm_synthetic(3, 50, n_features=2, random_state=0)
    assert sp.info["generator"] == "paper" and sp.val is not None
    rng = np.random.default_rng(0)
    means = rng.standard_normal((3, 2))
    np.testing.assert_array_equal(sp.info["means"], means)
