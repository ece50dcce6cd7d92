"""Whole federated fits under ``Federation(acceleration="newton")`` (issue 23 done-when 1): the
in-process multi-point rounds carry the accelerator's extra points, and the fit reaches
centralized EM's log-likelihood in a third of its iterations. The state machine itself:
test_newton_accel.py."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.mixture import GaussianMixture
from test_acceleration import overlapping_gmm

import fedlatent as fl

# small clients (50 rows of 2 values): three statistics a reply exceed the saturation rule,
# tested on its own in test_rules_saturation.py
pytestmark = pytest.mark.usefixtures("saturation_rule_off_module")


def overlapping(seed=3, n=300, clients=6, K=3, d=2):
    """Three 2-dimensional components about one standard deviation apart (slow plain EM)."""
    return overlapping_gmm(seed, n, clients, K, d, scale=1.2)


@pytest.fixture(scope="module")
def fits():
    """The accelerated fit (messages recorded) and scikit-learn's EM from the same start (plain
    federated EM's iterations exactly: 100 here, tested in the exactness tests)."""
    X, fd, start = overlapping()
    rt = fl.InProcessRuntime(fd, record=True)
    newton = fl.FederatedGaussianMixture(3, tol=1e-6, max_rounds=1000, random_state=0,
                                         federation=fl.Federation(acceleration="newton"),
                                         verbose=False, **start).fit(fd, runtime=rt)
    sk = GaussianMixture(3, tol=1e-6, max_iter=1000, **start).fit(X)
    return X, newton, rt, sk


def test_newton_reaches_em_log_likelihood_in_a_third_of_the_rounds(fits):
    X, newton, _, sk = fits
    assert newton.converged_ and sk.converged_ and sk.n_iter_ == 100
    assert newton.n_iter_ <= sk.n_iter_ / 3, (newton.n_iter_, sk.n_iter_)
    assert newton.score(X) >= sk.score(X) - 1e-7, (newton.score(X), sk.score(X))


def test_rounds_carry_two_extra_points_and_the_recorded_objective_never_falls(fits):
    """Round 4 on carries the Newton proposal and the over-relaxed point beside the round's
    statistic; each round's statistic is the EM step of the best point of the round before,
    so the recorded objectives never go down, and the fit ends at least as high."""
    X, newton, rt, _ = fits
    counts = [m.get("points", 0) for m in round_messages(rt)]
    assert counts[:3] == [0, 0, 0] and set(counts[4:]) == {2}, counts
    objectives = np.array([r.objective for r in newton.history_])
    assert np.all(np.diff(objectives[1:]) >= -1e-12)
    assert newton.score(X) >= objectives.max() - 1e-12


def round_messages(rt) -> list[dict]:
    """The first client's round messages, in order (one per round)."""
    first = rt.client_ids[0]
    return [msg for way, cid, method, msg in rt.log
            if way == "down" and cid == first and method == "estep"]


def test_secure_aggregation_gives_the_same_accelerated_rounds():
    """The extra points cross masked as the round's statistic does (sums in a fixed-point
    ring): 12 rounds agree with the plain channel's to the ring's rounding, and are Newton's,
    not EM's (plain EM's 12th round is lower)."""
    X, fd, start = overlapping(n=300, clients=4)
    runs = {}
    for acc, secure in (("newton", False), ("newton", True), (None, False)):
        fed = fl.Federation(acceleration=acc, secure_aggregation=secure)
        with pytest.warns(fl.ConvergenceWarning):
            runs[acc, secure] = fl.FederatedGaussianMixture(
                3, tol=0.0, max_rounds=12, random_state=0, **start, federation=fed,
                verbose=False).fit(fd)
    plain_ch, secure_ch, em = ([r.objective for r in est.history_] for est in runs.values())
    np.testing.assert_allclose(secure_ch, plain_ch, rtol=1e-9)
    np.testing.assert_allclose(runs["newton", True].means_, runs["newton", False].means_,
                               rtol=1e-7, atol=1e-8)
    assert secure_ch[-1] > em[-1] + 1e-4, (secure_ch[-1], em[-1])


def test_batched_clients_give_the_one_by_one_accelerated_fit(fits):
    """The in-process batched round (not recording) evaluates the same points: the same rounds
    and parameters to rounding."""
    X, newton, _, _ = fits
    _, fd, start = overlapping()
    rt = fl.InProcessRuntime(fd)
    batched = fl.FederatedGaussianMixture(3, tol=1e-6, max_rounds=1000, random_state=0,
                                          federation=fl.Federation(acceleration="newton"),
                                          verbose=False, **start).fit(fd, runtime=rt)
    assert rt.batched_calls > 0
    assert batched.n_iter_ == newton.n_iter_
    # (the two paths sum in different orders; Newton's solves amplify the last bits over
    # the rounds: 5e-12 on one Xeon)
    np.testing.assert_allclose(batched.means_, newton.means_, rtol=1e-10, atol=1e-10)
