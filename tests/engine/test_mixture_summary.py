"""summary() of the mixtures: latent class analysis reports standard errors from Louis'
observed information (issue 42, item 3: a statistician's summary at the defaults, missing
answers included); a mixture without its own observed information still has the base
mixture's point-estimate table (issue 24: every estimator with parameters to report)."""

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.estimation.base_mixture import FederatedMixture
from fedlatent.models.lca.example import make_lca_data
from fedlatent.models.lca.inference import lca_information_sums
from fedlatent.models.lca.math import offsets, one_hot, responsibilities

COLUMNS = ["coef", "std err", "z", "P>|z|", "[0.025", "0.975]"]


@pytest.fixture(scope="module")
def lca():
    fd = make_lca_data(n_clients=4, mean_size=200, n_classes=2, random_state=1)
    return fd, fl.LatentClassAnalysis(2, n_categories=3, random_state=0).fit(fd)


@pytest.mark.usefixtures("rare_level_rule_off")
@pytest.mark.usefixtures("saturation_rule_off")
def test_a_mixture_without_observed_information_reports_point_estimates(lca):
    _, est = lca
    s = FederatedMixture.summary(est)  # the base mixture's table
    t = s.table
    assert list(t.columns) == ["coef", "std err", "note"]
    assert t.index.names == ["component", "parameter"]
    n_probs = est.probabilities_.shape[1]
    assert list(t.loc["0"].index) == ["weights", *[f"probs[{j}]" for j in range(n_probs)]]
    np.testing.assert_array_equal(t.xs("weights", level="parameter")["coef"].to_numpy(),
                                  est.weights_)
    np.testing.assert_array_equal(t.loc["1", "coef"].to_numpy()[1:], est.probabilities_[1])
    assert t["std err"].isna().all() and s.info["Components"] == "2"


def _free(est):
    K = est.weights_.size
    off, cats = offsets(est.n_categories_), est.n_categories_
    t = list(est.weights_[:K - 1])
    for k in range(K):
        for j, R in enumerate(cats):
            t += list(est.probabilities_[k, off[j]:off[j] + R - 1])
    return np.array(t)


def _loglik(t, Z, K, cats):
    off = offsets(cats)
    w = np.r_[t[:K - 1], 1 - t[:K - 1].sum()]
    probs, pos = np.zeros((K, off[-1])), K - 1
    for k in range(K):
        for j, R in enumerate(cats):
            f = t[pos:pos + R - 1]
            probs[k, off[j]:off[j] + R - 1], probs[k, off[j] + R - 1] = f, 1 - f.sum()
            pos += R - 1
    return responsibilities(Z, w, probs)[1].sum()


@pytest.mark.parametrize("missing", [False, True])
def test_lca_information_is_minus_the_hessian_of_the_log_likelihood(lca, missing):
    fd, est = lca
    X = np.vstack([cd.X for _, cd in fd.items()])
    if missing:  # answers missing at random: they drop out of the likelihood
        X = X.copy()
        X[np.random.default_rng(0).random(X.shape) < 0.15] = np.nan
    Z = one_hot(X, est.n_categories_)
    t0 = _free(est)
    P, h = t0.size, 1e-5
    E = np.eye(P) * h
    f = (lambda t: _loglik(t, Z, 2, est.n_categories_))
    H = np.array([[(f(t0 + E[i] + E[j]) - f(t0 + E[i] - E[j]) - f(t0 - E[i] + E[j])
                    + f(t0 - E[i] - E[j])) / (4 * h * h) for j in range(P)] for i in range(P)])
    info = lca_information_sums(Z, est.weights_, est.probabilities_, est.n_categories_).info
    np.testing.assert_allclose(info, -H, atol=1e-5 * np.abs(info).max())


def test_lca_summary_reports_standard_errors(lca):
    fd, est = lca
    s = est.summary()
    t = s.table
    assert list(t.columns) == COLUMNS
    cats = est.n_categories_
    names = [f"{f}={c}" for f, R in zip(est.feature_names_in_, cats) for c in range(R)]
    assert list(t.loc["0"].index) == ["weight", *names]
    np.testing.assert_allclose(t.loc["1", "coef"].to_numpy()[1:], est.probabilities_[1],
                               rtol=1e-15)
    assert s.info["Covariance"] == "observed (Louis)" and (t["std err"] > 0).all()
    # the two weights' errors are one (they sum to 1), as are a variable's probabilities'
    assert t.loc[("0", "weight"), "std err"] == pytest.approx(t.loc[("1", "weight"),
                                                                    "std err"], rel=1e-10)
    cov = est.cov_params().loc["0", "0"].loc[names[:cats[0]], names[:cats[0]]].to_numpy()
    np.testing.assert_allclose(cov.sum(axis=1), 0.0, atol=1e-12)
