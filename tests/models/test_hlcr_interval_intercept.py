"""HLCR's predictive intervals with the entity random intercept (issue 24): the intercept's
posterior variance (a known entity's, from its BLUP) and, for an entity never seen, the whole
``tau^2`` are part of the predictive variance, so 90% intervals cover 88-92% of held-out
events of data drawn from the model."""

import warnings

import numpy as np
import pandas as pd
import pytest

import fedlatent as fl
from fedlatent.engine.rounds.loop import ConvergenceWarning

SIGMA, TAU = 0.7, 1.0
#: two clusters: slopes of x0, x1 and the cluster's intercept
W = np.array([[1.5, -1.0, 0.5], [-1.0, 1.0, -0.5]])


def entities(seed, n_known=600, n_new=300, n_events=4):
    """Entities of 4 events drawn from a mixture of random-intercept regressions; the first 2
    events of a known entity are its training events, a new entity's are all held out."""
    rng = np.random.default_rng(seed)
    E = n_known + n_new
    k = rng.integers(2, size=E)
    ent = np.repeat(np.arange(E), n_events)
    X = rng.normal(size=(len(ent), 2))
    u = TAU * rng.normal(size=E)
    y = ((X * W[k[ent], :2]).sum(axis=1) + W[k[ent], 2] + u[ent]
         + SIGMA * rng.normal(size=len(ent)))
    df = pd.DataFrame({"agent": [f"a{e % 10}" for e in ent], "ent": [f"e{e}" for e in ent],
                       "x0": X[:, 0], "x1": X[:, 1], "y": y})
    rank = np.tile(np.arange(n_events), E)
    train = (ent < n_known) & (rank < 2)
    known = (ent < n_known) & ~train
    return df[train], df[known], df[ent >= n_known]


def covered(est, test, **kw):
    iv = est.predict_interval(test[["x0", "x1"]].to_numpy(), test.agent.to_numpy(),
                              test.ent.to_numpy(), alpha=0.1, **kw)
    y = test.y.to_numpy()
    return (iv[:, 0] <= y) & (y <= iv[:, 1])


@pytest.fixture(scope="module")
def hits():
    known, new = [], []
    for seed in range(4):
        train, test_known, test_new = entities(seed)
        fd = fl.FederatedDataset.from_pandas(train, client="agent", entity="ent", target="y",
                                             features=["x0", "x1"])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            est = fl.HLCR(2, solver="gibbs", random_intercept=True, max_rounds=60, n_chains=1,
                          random_state=seed).fit(fd)
        assert est.tau_ == pytest.approx(TAU, rel=0.15)
        known.append(covered(est, test_known))
        new.append(covered(est, test_new, unknown="prior"))
    return np.concatenate(known), np.concatenate(new)


def test_90_percent_intervals_of_known_entities_cover_88_to_92_percent(hits):
    known, _ = hits
    assert known.size == 4800
    # each known entity has 2 training events: its intercept's posterior variance
    # sigma^2 rho / (1 + 2 rho) is 40% of sigma^2, which intervals without it leave out
    assert 0.88 <= known.mean() <= 0.92, known.mean()


def test_90_percent_intervals_of_entities_never_seen_cover_88_to_92_percent(hits):
    _, new = hits
    assert new.size == 4800
    # an entity never seen: its intercept is the prior's N(0, tau^2), twice sigma^2 here
    assert 0.88 <= new.mean() <= 0.92, new.mean()


@pytest.mark.usefixtures("saturation_rule_off")  # small agents, the intercept's sums too
def test_known_entity_intervals_widen_by_the_intercept_variance():
    train, test_known, _ = entities(5, n_known=60, n_new=0)
    fd = fl.FederatedDataset.from_pandas(train, client="agent", entity="ent", target="y",
                                         features=["x0", "x1"])
    est = fl.HLCR(1, solver="gibbs", random_intercept=True, sigma=SIGMA, tau=TAU, delta=1e8,
                  standardize=False, max_rounds=2, n_chains=1, random_state=0).fit(fd)
    # one cluster, fixed sigma and tau: each known entity's intercept has the posterior
    # variance sigma^2 g, g = rho / (1 + n rho), with n = 2 training events
    rho = (TAU / SIGMA) ** 2
    np.testing.assert_allclose(est.random_effects_var_, SIGMA**2 * rho / (1 + 2 * rho),
                               rtol=1e-9)
    row = test_known.iloc[:1]
    x = np.r_[row[["x0", "x1"]].to_numpy()[0], 1.0]
    iv = est.predict_interval(row[["x0", "x1"]].to_numpy(), row.agent.to_numpy(),
                              row.ent.to_numpy(), alpha=0.1)
    H = np.linalg.inv(est.precisions_[0])
    sd = np.sqrt(SIGMA**2 + x @ H @ x + SIGMA**2 * rho / (1 + 2 * rho))
    np.testing.assert_allclose(iv[0, 1] - iv[0, 0], 2 * 1.6448536269514722 * sd, rtol=1e-6)
