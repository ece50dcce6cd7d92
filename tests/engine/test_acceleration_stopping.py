"""Accelerated EM stops by scikit-learn's rule (issue 23, item 1): the change of the mean
log-likelihood over one EM step below ``tol``, never the change into or out of an extrapolated
point (a refused extrapolation's round lowers the objective, and a change below ``tol`` there
says nothing about convergence)."""

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from sklearn.mixture import GaussianMixture

import fedlatent as fl
from fedlatent.engine.fedem.acceleration import Squarem
from fedlatent.engine.rounds.accelerate import Accelerator
from fedlatent.engine.stats import Stats

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from rounds_to_tol import gmm_data  # noqa: E402  (the benchmark's own data)


def test_em_step_flags_the_rounds_sent_the_plain_map():
    """Rounds: base (plain), then s1 (plain), s' (extrapolated); a kept s' is followed by the
    plain F(s'); a refused one by s2, which is not the EM step of the round at s'."""
    F = (lambda s: Stats({"s": 0.9 * s["s"] + 1.0}))  # fixed point 10
    L = (lambda s: -float((s["s"][0] - 10.0) ** 2))
    acc = Accelerator(Squarem(), lambda S: True)
    assert acc.em_step  # round 2 is the EM step of the initialization round
    s0 = Stats({"s": np.array([0.0])})
    s1 = F(s0)
    assert acc.next_point(s0, s1, L(s0)) is s1 and acc.em_step
    s2 = F(s1)
    s_new = acc.next_point(s1, s2, L(s1))
    assert s_new is not s2 and acc.em_step  # the round at s1 was the plain step
    f_new = F(s_new)
    assert acc.next_point(s_new, f_new, L(s_new)) is f_new
    assert not acc.em_step  # the round at s' was an extrapolation
    assert acc.next_point(f_new, F(f_new), L(f_new)) is not None and acc.em_step
    refused = Accelerator(Squarem(), lambda S: True)
    refused.next_point(s0, s1, L(s0))
    s_new = refused.next_point(s1, s2, L(s1))
    assert refused.next_point(s_new, F(s_new), L(s1) - 1.0) is s2  # the safeguard refused
    assert not refused.em_step and refused.rejected == 1
    refused.next_point(s2, F(s2), L(s2))
    assert not refused.em_step  # s2 is F(s1), not the EM step of the refused round at s'


@pytest.mark.usefixtures("saturation_rule_off")
def test_an_accelerated_fit_ends_on_an_em_step_below_tol():
    """4 overlapping components in 5 dimensions, 1,000 rows on 5 clients, the same start as
    scikit-learn: the fit ends on a round whose objective rose by less than tol over the round
    before it (one EM step), never on a refused extrapolation's round."""
    X, fd, start = gmm_data(4, n=1000, clients=5)
    sk = GaussianMixture(4, tol=1e-6, max_iter=2000, **start).fit(X)
    with warnings.catch_warnings():
        warnings.simplefilter("error", fl.ConvergenceWarning)
        gm = fl.FederatedGaussianMixture(4, tol=1e-6, max_rounds=500, random_state=0, **start,
                                         federation=fl.Federation(acceleration="squarem"),
                                         verbose=False).fit(fd)
    last, before = gm.history_[-1].objective, gm.history_[-2].objective
    assert gm.converged_ and 0.0 <= last - before < 1e-6, (last, before)
    assert gm.score(X) >= sk.score(X), (gm.score(X), sk.score(X))
    assert gm.n_iter_ < sk.n_iter_, (gm.n_iter_, sk.n_iter_)
