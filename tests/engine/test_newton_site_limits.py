"""Sites' limits under ``Federation(acceleration="newton")``: a reply of a multi-point round
carries ``1 + extra_points`` statistics, which the cohort rule of secure aggregation counts at
setup; a site that refuses extra points (its ``[limits] max-points``) makes the fit send fewer,
instead of being left out of round after round."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.faults import FederatedFitError
from fedlatent.engine.privacy.disclosure import DisclosurePolicy
from fedlatent.engine.protocol.exchange import cohort_refusal
from fedlatent.engine.site.policy import SitePolicy


def _replies(records, numbers=18, width=2):
    return {f"c{i}": {"reply_numbers": numbers, "n_records": r, "record_width": width}
            for i, r in enumerate(records)}


def test_the_cohort_rule_counts_every_statistic_of_a_multi_point_sum():
    """Four clients of 10 records of 2 values: 80 values admit 0.33 x 80 = 26.4 numbers, one
    statistic of 18 passes, three (54) do not."""
    policy = DisclosurePolicy(count_scope="aggregate")
    replies = _replies([10, 10, 10, 10, 50, 50])
    assert cohort_refusal(policy, replies, 4) is None
    assert cohort_refusal(policy, replies, 4, statistics=1) is None
    why = cohort_refusal(policy, replies, 4, statistics=3)
    assert why is not None and why.startswith(
        "the smallest aggregate secure aggregation can unmask (4 client(s): 'c0', 'c1', 'c2', "
        "'c3'): a round's sum of 3 statistics (the round's and 2 extra points of "
        "Federation(acceleration='newton'); acceleration='squarem' sends one) carries 54 free "
        "numbers about 40 record(s) of 2 value(s)")


def _small_fd(rows=10, clients=6, d=2, seed=0):
    rng = np.random.default_rng(seed)
    return fl.FederatedDataset.from_arrays(
        {f"c{i}": rng.normal(size=(rows, d)) + (i % 3) for i in range(clients)})


def test_a_secure_newton_fit_is_refused_at_setup_when_its_sums_would_saturate():
    fd = _small_fd()
    fed = fl.Federation(secure_aggregation=True, acceleration="newton")
    with pytest.raises(FederatedFitError, match=r"a round's sum of 3 statistics"):
        fl.FederatedGaussianMixture(2, random_state=0, federation=fed).fit(fd)


@pytest.mark.usefixtures("saturation_rule_off")
def test_a_site_refusing_extra_points_makes_the_fit_send_none(caplog):
    """Site c2 answers no extra point ([limits] max-points = 0): a multi-point round leaves it
    out (named), the fit then sends fewer points, down to none, at most one step a round of
    points sent (two: the proposal and the over-relaxed point), and every later round has
    every client."""
    rng = np.random.default_rng(3)
    fd = fl.FederatedDataset.from_arrays(
        {f"c{i}": rng.normal(size=(60, 2)) + rng.integers(0, 3) for i in range(4)})
    rt = fl.InProcessRuntime(fd, policies={"c2": SitePolicy(max_points=0)}, record=True)
    with caplog.at_level(logging.WARNING, logger="fedlatent.engine.rounds.newton"):
        est = fl.FederatedGaussianMixture(
            3, tol=1e-6, max_rounds=300, random_state=0, verbose=False,
            federation=fl.Federation(acceleration="newton")).fit(fd, runtime=rt)
    steps = [r.getMessage() for r in caplog.records if r.name == "fedlatent.engine.rounds.newton"]
    assert 1 <= len(steps) <= 2 and all("client(s) ['c2'] did not answer" in m for m in steps)
    assert steps[-1].endswith("Federation(acceleration='newton') sends at most 0 from now on")
    missing = [r.round for r in est.history_ if r.missing]
    assert missing and len(missing) == len(steps) and est.converged_
    assert all(r.missing == [] for r in est.history_ if r.round > max(missing))
    counts = [m.get("points", 0) for way, c, method, m in rt.log
              if way == "down" and method == "estep" and c == "c0"]
    assert max(counts) <= 2 and all(n == 0 for n in counts[max(missing):]), counts
