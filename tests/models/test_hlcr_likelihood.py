"""HLCR's likelihood in summary() (issue 42, item 5): the marginal log-likelihood at the point
estimate, its parameters, AIC and BIC; with one cluster they are the random-intercept mixed
model's (statsmodels MixedLM by maximum likelihood, same variance components) to 1e-4; and a
comparison with the mixed model in one call."""

import warnings

import numpy as np
import pandas as pd
import pytest

import fedlatent as fl
from fedlatent.models.hlcr import HLCR


def hierarchical(seed=0, n_agents=3, n_entities=15):
    rng = np.random.default_rng(seed)
    rows = []
    for a in range(n_agents):
        for e in range(n_entities):
            m = int(rng.integers(3, 12))
            x = rng.normal(size=m)
            y = 2.0 + 1.5 * x + rng.normal(scale=0.9) + rng.normal(scale=0.7, size=m)
            rows.append(pd.DataFrame({"x": x, "y": y, "agent": f"a{a}", "entity": f"e{a}-{e}"}))
    return pd.concat(rows, ignore_index=True)


@pytest.fixture(scope="module")
def mixed():
    smf = pytest.importorskip("statsmodels.formula.api")
    df = hierarchical()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = smf.mixedlm("y ~ x", df, groups=df["entity"]).fit(reml=False)
    fd = fl.FederatedDataset.from_pandas(df, client="agent", entity="entity", target="y",
                                         features=["x"])
    return df, fd, res


def test_one_cluster_log_likelihood_is_mixedlm_ml(mixed):
    _, fd, res = mixed
    sigma, tau = float(np.sqrt(res.scale)), float(np.sqrt(res.cov_re.iloc[0, 0]))
    est = HLCR(n_clusters=1, sigma=sigma, tau=tau, delta=1e4, standardize=False,
               random_intercept=True, max_rounds=20, random_state=0).fit(fd)
    np.testing.assert_allclose([est.coef_[0, 0], est.intercept_[0]],
                               [res.fe_params["x"], res.fe_params["Intercept"]], atol=1e-5)
    s = est.summary()
    from fedlatent.models.hlcr.likelihood import information_criteria

    crit = information_criteria(est)
    assert crit["loglik"] == pytest.approx(res.llf, abs=1e-4)
    assert crit["aic"] == pytest.approx(res.aic, abs=2e-4)
    assert crit["bic"] == pytest.approx(res.bic, abs=2e-4)
    assert crit["n_parameters"] == 4  # intercept, slope, sigma, tau: MixedLM's count
    assert s.info["Log-likelihood"] == f"{crit['loglik']:.6g} (at the point estimate)"
    assert s.info["AIC"] == f"{crit['aic']:.6g}" and s.info["Parameters"] == "4"


def test_the_agents_log_likelihood_is_mixedlm_loglike_at_any_point(mixed):
    """The formula itself: at statsmodels' ML estimate, set as HLCR's point."""
    df, fd, res = mixed
    est = HLCR(n_clusters=1, max_rounds=20, random_state=0).fit(fd)
    est.coef_ = np.array([[res.fe_params["x"]]])
    est.intercept_ = np.array([res.fe_params["Intercept"]])
    est.sigma_, est.tau_ = float(np.sqrt(res.scale)), float(np.sqrt(res.cov_re.iloc[0, 0]))
    from fedlatent.models.hlcr.likelihood import point_loglik

    assert point_loglik(est)[0] == pytest.approx(res.llf, abs=1e-8)
    assert point_loglik(est)[1] == len(df)


def test_compare_mixed_sets_k_beside_the_mixed_model(mixed):
    _, fd, _ = mixed
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        est = HLCR(n_clusters=2, max_rounds=40, random_state=0).fit(fd)
        table = est.compare_mixed(fd)
    assert list(table.index) == [1, 2] and table.index.name == "n_clusters"
    assert list(table.columns) == ["loglik", "n_parameters", "aic", "bic", "elpd_waic",
                                   "lr_statistic"]
    assert table.loc[2, "n_parameters"] == table.loc[1, "n_parameters"] + 3
    assert table.loc[1, "lr_statistic"] == 0.0
    np.testing.assert_allclose(table["aic"], -2 * table["loglik"] + 2 * table["n_parameters"])
    # the K = 2 row is this fit's own criteria, and its statistic the two rows' difference
    from fedlatent.models.hlcr.likelihood import information_criteria

    assert table.loc[2, "loglik"] == pytest.approx(information_criteria(est)["loglik"],
                                                   rel=1e-10)
    assert table.loc[2, "lr_statistic"] == pytest.approx(
        2 * (table.loc[2, "loglik"] - table.loc[1, "loglik"]), rel=1e-10)
