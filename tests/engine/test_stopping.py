"""The default stopping rule, tol="auto" (issue 42, item 2): Aitken's estimate of the
log-likelihood's distance to its limit, and a fit that stops within 0.1 standard error of the
tol=1e-10 optimum in every parameter (LCR, the Gaussian mixture, LCA) on 20 data sets each;
a fit that runs out of rounds warns with its estimated distance."""

import math
import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.rounds.stopping import aitken_gap, gap_in_se, near_optimum


def test_aitken_recovers_the_gap_of_a_linear_sequence():
    L_star, c, r, n = -1.5, 0.2, 0.8, 1000.0
    obj = [L_star - c * r**k for k in range(10)]  # mean objectives
    assert aitken_gap(obj, n) == pytest.approx(n * c * r**9, rel=1e-9)
    assert aitken_gap(obj[:2], n) == math.inf  # three values needed
    rising = [0.0, 1e-3, 3e-3]  # EM speeding up (leaving a saddle): no estimate
    assert aitken_gap(rising, n) == math.inf
    flat = [-2.0, -2.0, -2.0]  # a fixed point
    assert aitken_gap(flat, n) == 0.0
    assert gap_in_se(0.005) == pytest.approx(0.1)


def test_the_rule_waits_for_two_rounds_below_the_target():
    n, r = 1000.0, 0.5
    # total gap g_k = 10 r^k nats: below 0.0025 (half of 0.1^2 / 2) from k = 12 on
    obj = [(-10.0 * r**k) / n for k in range(14)]
    assert not near_optimum(obj[:13], n)  # gap at k=12 below, at k=11 above
    assert near_optimum(obj[:14], n)


def _lcr_data(seed):
    rng = np.random.default_rng(seed)
    n, sep = int(rng.integers(300, 700)), rng.uniform(0.8, 2.0)
    X = rng.normal(size=(n, 2))
    z = rng.random(n) < rng.uniform(0.3, 0.6)
    y = np.where(z, sep + 2 * X[:, 0] - X[:, 1], -sep - X[:, 0]) + rng.normal(size=n)
    parts = np.array_split(np.arange(n), 3)
    return fl.FederatedDataset.from_arrays({f"c{i}": (X[p], y[p]) for i, p in enumerate(parts)})


def _gmm_data(seed):
    rng = np.random.default_rng(seed)
    n, sep = int(rng.integers(300, 700)), rng.uniform(1.5, 3.0)
    z = rng.random(n) < rng.uniform(0.3, 0.6)
    X = rng.normal(size=(n, 2)) * np.where(z, 1.0, 0.7)[:, None] + np.where(z, sep, 0.0)[:, None]
    parts = np.array_split(np.arange(n), 3)
    return fl.FederatedDataset.from_arrays({f"c{i}": X[p] for i, p in enumerate(parts)})


def _lca_data(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(400, 800))
    z = rng.random(n) < rng.uniform(0.3, 0.6)
    p1, p0 = rng.uniform(0.6, 0.85, size=5), rng.uniform(0.15, 0.4, size=5)
    X = (rng.random((n, 5)) < np.where(z[:, None], p1, p0)).astype(float)
    parts = np.array_split(np.arange(n), 3)
    return fl.FederatedDataset.from_arrays({f"c{i}": X[p] for i, p in enumerate(parts)})


MODELS = {
    "lcr": (_lcr_data, lambda **kw: fl.LatentClassRegression(2, n_init=1, **kw)),
    "gmm": (_gmm_data, lambda **kw: fl.FederatedGaussianMixture(2, **kw)),
    "lca": (_lca_data, lambda **kw: fl.LatentClassAnalysis(2, n_categories=2, **kw)),
}


def _lca_estimate_and_se(est, fd):
    """LCA's weights and category probabilities and their standard errors from a
    finite-difference Hessian of the pooled log-likelihood in the free parameters (the first
    weight, each class's probability of category 0 of each binary item)."""
    from fedlatent.engine.protocol.numerics import logsumexp
    from fedlatent.models.lca.math import lca_log_prob, one_hot

    Z = one_hot(np.vstack([cd.X for _, cd in fd.items()]), est.n_categories_)

    def reported(t):
        p0 = t[1:].reshape(2, -1)
        probs = np.stack([p0, 1 - p0], axis=2).reshape(2, -1)
        return np.r_[t[0], 1 - t[0], probs.ravel()], probs

    def loglik(t):
        rep, probs = reported(t)
        return logsumexp(lca_log_prob(Z, rep[:2], probs), axis=1).sum()

    t0 = np.r_[est.weights_[0], est.probabilities_[:, 0::2].ravel()]
    P, h = t0.size, 1e-5
    E = np.eye(P) * h
    H = np.array([[(loglik(t0 + E[i] + E[j]) - loglik(t0 + E[i] - E[j])
                    - loglik(t0 - E[i] + E[j]) + loglik(t0 - E[i] - E[j])) / (4 * h * h)
                   for j in range(P)] for i in range(P)])
    J = np.array([(reported(t0 + E[i])[0] - reported(t0 - E[i])[0]) / (2 * h)
                  for i in range(P)]).T
    return reported(t0)[0], np.sqrt(np.diag(J @ np.linalg.inv(-H) @ J.T))


def _estimate_and_se(est, fd):
    if isinstance(est, fl.LatentClassAnalysis):
        return _lca_estimate_and_se(est, fd)
    se = np.sqrt(np.diag(est.cov_params(cov_type="observed").to_numpy()))
    return est._inference_layout().estimate, se


def _distances(name, seed):
    """Every reported parameter's distance from the tol=1e-10 optimum, in its standard
    errors there, of the default fit (same data, same start)."""
    data, make = MODELS[name]
    fd = data(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("error", fl.ConvergenceWarning)  # the defaults converge
        fit = make(random_state=seed).fit(fd)
    best = make(random_state=seed, tol=1e-10, max_rounds=20000).fit(fd)
    assert fit.converged_ and best.converged_
    opt, se = _estimate_and_se(best, fd)
    here = _estimate_and_se(fit, fd)[0]
    return np.abs(here - opt) / se, fit.n_iter_, best.n_iter_


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_the_default_stops_within_a_tenth_of_a_standard_error_on_20_data_sets(name):
    worst, rounds = [], []
    for seed in range(20):
        dist, n_fit, n_best = _distances(name, seed)
        worst.append(float(dist.max()))
        rounds.append((n_fit, n_best))
    assert max(worst) < 0.1, (worst, rounds)
    assert all(a <= b for a, b in rounds)  # and stops before the tight fit


def test_a_fit_out_of_rounds_warns_with_its_distance():
    fd = _lcr_data(0)
    with pytest.warns(fl.ConvergenceWarning, match=r"did not converge in 8 rounds \(the "
                      r"log-likelihood is an estimated .* nats below its limit: the parameters "
                      r"may be up to .* standard errors from the optimum"):
        est = fl.LatentClassRegression(2, n_init=1, random_state=0, max_rounds=8).fit(fd)
    assert not est.converged_
    s = est.summary()
    assert s.info["Converged"] == "False"
    assert s.info["Distance to optimum"].startswith("at most ")
