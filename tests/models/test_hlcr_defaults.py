"""HLCR's defaults (issue 24): the entity random intercept is on wherever it is available
(``random_intercept="auto"``); FedHLCR's log joint, which judges its chains, is the entities'
marginal likelihood under the random intercept (the term the adjusted statistics leave out
included, as in the centralized sampler)."""

import warnings

import numpy as np
import pandas as pd
import pytest

import fedlatent as fl
from fedlatent.engine.rounds.loop import ConvergenceWarning


@pytest.fixture(scope="module")
def synth():
    return fl.datasets.make_synthhlcr(n_agents=24, n_entities=24, entities_per_agent=4,
                                      events_per_entity=12, n_clusters=3, n_features=3,
                                      sigma=0.5, delta=1.0, random_state=7)


def fit(fd, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return fl.HLCR(**{"n_clusters": 3, "random_state": 0, **kw}).fit(fd)


@pytest.mark.parametrize("kw, on", [
    ({}, True), ({"random_intercept": False}, False), ({"fit_intercept": False}, False),
    ({"n_clusters": "auto"}, False), ({"random_intercept": True}, True),
    ({"federation": fl.Federation(privacy=fl.DifferentialPrivacy(
        epsilon=1.0, delta=1e-5, clip=1.0))}, False),
])
def test_random_intercept_is_on_by_default_wherever_it_is_available(kw, on):
    from fedlatent.models.hlcr.fitting import uses_random_intercept

    est = fl.HLCR(**{"n_clusters": 2, **kw})
    est._check_params()  # "auto" is never refused
    assert uses_random_intercept(est) is on


@pytest.mark.usefixtures("saturation_rule_off")  # small agents, the intercept's sums too
def test_a_default_fit_learns_the_entity_intercept_and_says_so(synth, tmp_path):
    est = fit(synth, max_rounds=6, n_chains=1)
    assert est.random_intercept_ is True and est.tau_ > 0
    assert est.random_effects_.shape == est.labels_.shape and est.random_effects_.any()
    est.save(tmp_path / "m")
    assert fl.HLCR.load(tmp_path / "m").random_intercept_ is True
    paper = fit(synth, max_rounds=6, n_chains=1, random_intercept=False)
    assert paper.random_intercept_ is False and paper.tau_ == 0.0


def test_federated_log_joint_is_the_marginal_likelihood_under_the_random_intercept():
    rng = np.random.default_rng(3)
    rows = []
    for e in range(12):
        n = int(rng.integers(2, 9))
        x = rng.normal(size=n)
        rows.append(pd.DataFrame({"agent": f"a{e % 2}", "ent": f"e{e}", "x": x,
                                  "y": 1.0 + 2.0 * x + 1.5 * rng.normal() + rng.normal(size=n)}))
    df = pd.concat(rows, ignore_index=True)
    fd = fl.FederatedDataset.from_pandas(df, client="agent", entity="ent", target="y",
                                         features=["x"])
    sigma, tau = 0.9, 1.4
    est = fl.HLCR(1, sigma=sigma, tau=tau, delta=3.0, random_intercept=True, standardize=False,
                  max_rounds=3, n_chains=1, random_state=0).fit(fd)
    # round 2's objective (per entity): every entity's log N(y_e; X_e m, V_e + X_e H X_e^T) at
    # the clusters broadcast after round 1 (one cluster: the label's prior factor is 1)
    H = np.linalg.inv(est._path[0]["D"][0])
    m = H @ est._path[0]["c"][0]
    want = 0.0
    for _, g in df.groupby("ent"):
        X = np.c_[g.x.to_numpy(), np.ones(len(g))]
        C = sigma**2 * np.eye(len(g)) + tau**2 + X @ H @ X.T
        r = g.y.to_numpy() - X @ m
        want -= 0.5 * (len(g) * np.log(2 * np.pi) + np.linalg.slogdet(C)[1]
                       + r @ np.linalg.solve(C, r))
    assert est.history_.to_frame().objective.iloc[1] * 12 == pytest.approx(want, rel=1e-9)
