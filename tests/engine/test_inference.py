"""The engine's inference pieces (issue 24, items 1 and 4): weight scores, normal-theory
tables, the Summary object, the information asked as one federated sum (plain, secure
aggregation, a loaded model), the refusal under differential privacy, and the size selection
that skips (and reports) unconverged or degenerate candidates."""

import warnings

import numpy as np
import pytest
from scipy import stats

import fedlatent as fl
from fedlatent.engine.estimation.inference import Summary, degenerate_reason, weight_scores, z_table
from fedlatent.models.gmm import FederatedGaussianMixture
from fedlatent.models.lcr import LatentClassRegression


def blobs(n=300, seed=0, n_clients=4):
    rng = np.random.default_rng(seed)
    z = rng.random(n) < 0.4
    X = np.where(z[:, None], rng.normal([0, 0], 1.0, (n, 2)), rng.normal([4, 3], 0.7, (n, 2)))
    parts = np.array_split(np.arange(n), n_clients)
    return fl.FederatedDataset.from_arrays({f"c{i}": X[p] for i, p in enumerate(parts)})


def test_weight_scores_are_the_derivatives_of_log_weights():
    w = np.array([0.2, 0.3, 0.5])
    a = weight_scores(w)
    h = 1e-6
    for k in range(3):
        def logw(t, k=k):
            return np.log(np.r_[t, 1 - t.sum()][k])
        num = [(logw(w[:2] + h * e) - logw(w[:2] - h * e)) / (2 * h) for e in np.eye(2)]
        np.testing.assert_allclose(a[k], num, rtol=1e-6)


def test_z_table_numbers():
    se, z, p, lo, hi = z_table(np.array([1.96, -1.0]), np.diag([1.0, 0.25]), alpha=0.05)
    np.testing.assert_allclose(se, [1.0, 0.5])
    np.testing.assert_allclose(z, [1.96, -2.0])
    np.testing.assert_allclose(p, [2 * stats.norm.sf(1.96), 2 * stats.norm.sf(2.0)])
    q = stats.norm.ppf(0.975)
    np.testing.assert_allclose(lo, [1.96 - q, -1.0 - 0.5 * q])
    np.testing.assert_allclose(hi, [1.96 + q, -1.0 + 0.5 * q])


def test_summary_prints_its_header_and_table():
    import pandas as pd

    table = pd.DataFrame({"coef": [1.5]}, index=pd.MultiIndex.from_tuples(
        [("0", "x")], names=["component", "parameter"]))
    s = Summary("M results", {"Observations": "10"}, table)
    text = str(s)
    assert text.splitlines()[0].strip() == "M results"
    assert "Observations:" in text and "1.5" in text
    assert s.as_frame() is not s.table and s.as_frame().equals(s.table)


def test_information_under_secure_aggregation_equals_the_plain_one():
    pytest.importorskip("cryptography")
    fd = blobs()
    kw = dict(n_components=2, random_state=0, tol=1e-8)
    plain = FederatedGaussianMixture(**kw).fit(fd)
    sec = FederatedGaussianMixture(**kw, federation=fl.Federation(secure_aggregation=True)).fit(fd)
    np.testing.assert_allclose(sec.means_, plain.means_, rtol=1e-6)
    np.testing.assert_allclose(sec.bse_.to_numpy(), plain.bse_.to_numpy(), rtol=1e-4)


def test_refused_under_differential_privacy():
    fd = blobs()
    est = FederatedGaussianMixture(2, random_state=0, federation=fl.Federation(
        privacy=fl.DifferentialPrivacy(5.0, 1e-5, clip=10.0))).fit(fd)
    with pytest.raises(ValueError, match="refused under differential privacy: the clients' "
                                         "noise is not in the observed information"):
        est.cov_params()


def test_a_loaded_model_asks_the_data_it_is_given(tmp_path):
    fd = blobs()
    est = FederatedGaussianMixture(2, random_state=0, tol=1e-8).fit(fd)
    est.save(tmp_path / "m")
    back = FederatedGaussianMixture.load(tmp_path / "m")
    with pytest.raises(ValueError, match=r"give the data of the fit, e.g. est.cov_params\(fd\)"):
        back.cov_params()
    np.testing.assert_allclose(back.cov_params(fd).to_numpy(), est.cov_params().to_numpy(),
                               rtol=1e-10)
    np.testing.assert_allclose(back.bse_.to_numpy(), est.bse_.to_numpy(), rtol=1e-10)


def test_an_unconverged_fit_is_refused_rather_than_given_negative_variances():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 2))  # one Gaussian: two components are not identified
    fd = fl.FederatedDataset.from_arrays({"a": X[:150], "b": X[150:]})
    est = FederatedGaussianMixture(3, random_state=0, max_rounds=3).fit(fd)
    with pytest.raises(ValueError, match="observed information is not positive definite"):
        est.cov_params(cov_type="observed")
    # the default falls back to the empirical information, and says so (issue 42, item 3)
    var = np.diag(est.cov_params().to_numpy())
    assert np.isfinite(var).all() and (var > 0).all()
    s = est.summary()
    assert s.info["Covariance"] == "empirical (outer product of the scores)"
    assert s.info["Covariance note"].startswith("the observed information is not positive "
                                                "definite (smallest eigenvalue")


def test_degenerate_reason_rules():
    assert degenerate_reason([0.5, 0.5], [1.0, 2.0], 0.0, 100, 3) == ""
    assert "weight" in degenerate_reason([0.99, 0.01], [1.0, 2.0], 0.0, 100, 3)
    assert "zero variance" in degenerate_reason([0.5, 0.5], [1.0, 1e-6], 1e-6, 100, 3)


def zero_inflated(n=600, seed=0):
    """y = 1 + 2x + N(0, 1) for 80% of the rows, exactly 0 for the others."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 1))
    y = np.where(rng.random(n) < 0.2, 0.0, 1 + 2 * X[:, 0] + rng.normal(size=n))
    parts = np.array_split(np.arange(n), 3)
    return fl.FederatedDataset.from_arrays({f"c{i}": (X[p], y[p]) for i, p in enumerate(parts)})


def test_bic_skips_a_component_collapsed_on_a_zero_variance():
    fd = zero_inflated()
    est = LatentClassRegression("auto", n_components_candidates=[1, 2], random_state=0,
                                tol=1e-8, max_rounds=500).fit(fd)
    table = est.selection_scores_
    assert table.loc[2, "bic"] < table.loc[1, "bic"]  # BIC alone would take the collapse
    assert "point mass" in table.loc[2, "skipped"] and table.loc[1, "skipped"] == ""
    assert est.n_components_ == 1


def test_unconverged_candidates_are_skipped_and_reported():
    fd = blobs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = FederatedGaussianMixture("auto", n_components_candidates=[1, 2, 3],
                                       max_rounds=3, tol=1e-3, random_state=0).fit(fd)
    table = est.selection_scores_
    assert list(table.columns[-1:]) == ["skipped"]
    # 3 rounds: K = 3 converged in 4 once the k-means start's merged rows were translated
    assert table.loc[3, "skipped"] == "did not converge in 3 rounds"
    for k in table.index:
        assert (table.loc[k, "skipped"] == "") == bool(table.loc[k, "converged"])
    assert bool(table.loc[est.n_components_, "converged"])


def test_every_candidate_skipped_keeps_the_best_with_a_warning():
    fd = blobs()
    with pytest.warns(UserWarning, match="every candidate n_components was skipped"):
        est = FederatedGaussianMixture("auto", n_components_candidates=[2, 3], max_rounds=1,
                                       random_state=0).fit(fd)
    assert est.selection_scores_["skipped"].str.startswith("did not converge").all()
    assert est.n_components_ == int(est.selection_scores_["bic"].idxmin())
