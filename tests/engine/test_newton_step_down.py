"""Subspace Newton sends fewer extra points only when a site says its cap on points was
exceeded (its ``[limits] max-points`` or the saturation rule, which counts each point as one
more statistic): a failure or a refusal by another rule in a round with points says nothing
about the points (before: any error reply lowered the cap for the rest of the fit)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.fedem.acceleration import SubspaceNewton
from fedlatent.engine.fedem.subspace import NewtonAccelerator
from fedlatent.engine.privacy.disclosure import DisclosurePolicy, check_reply_numbers
from fedlatent.engine.protocol.messages import ERROR_KEY
from fedlatent.engine.rounds.newton import cap_exceeded, step_down
from fedlatent.engine.site.guard import SiteGuard
from fedlatent.engine.site.policy import SitePolicy


def _saturated() -> str:
    return check_reply_numbers(DisclosurePolicy(), "client 'c1'", 3 * 18, 20, 2,
                               "a reply of 3 statistics (the round's and 2 extra points)")


def _max_points() -> str:
    guard = SiteGuard(SitePolicy(max_points=0), "c1")
    return guard.refusal_text("limits.max-points", "round 5 asks 2 extra point(s), above its "
                              "limit 0", "ask at most 0 extra point(s) a round")


OTHERS = {
    "failure": "client 'c1': ValueError: the E-step failed (a transient fault)",
    "one-answer": SiteGuard(SitePolicy(), "c1").refusal_text(
        "one-answer", "estep of round 5 was answered already", "a server asks each question "
        "once"),
    "verification": "client 'c1': round 5 refused: parameter 'means' differs from the replay "
                    "of the verified aggregate by 1e-06 at (0, 0)",
}


def _accel(cap: int = 2) -> NewtonAccelerator:
    accel = NewtonAccelerator(SubspaceNewton(), lambda S: True, 0.0)
    accel.cap = cap
    return accel


def _plan(points: int = 2):
    return SimpleNamespace(k=5, points=[object()] * points)


def test_only_a_cap_refusal_says_the_points_were_too_many():
    assert cap_exceeded(_saturated()) and cap_exceeded(_max_points())
    assert not any(cap_exceeded(text) for text in OTHERS.values())


@pytest.mark.parametrize("why", sorted(OTHERS))
def test_another_error_leaves_the_cap(why):
    accel = _accel()
    step_down(accel, _plan(), {"c1": OTHERS[why]})
    assert accel.cap == 2


@pytest.mark.parametrize("text", [_saturated, _max_points], ids=["saturation", "max-points"])
def test_a_cap_refusal_among_others_lowers_it_by_one_naming_only_those(text, caplog):
    accel = _accel()
    with caplog.at_level(logging.WARNING, logger="fedlatent.engine.rounds.newton"):
        step_down(accel, _plan(), {"c0": OTHERS["failure"], "c1": text()})
    assert accel.cap == 1
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith("round 5: client(s) ['c1'] did not answer a round of 2 extra "
                           "point(s) (") and said.endswith("sends at most 1 from now on")


class FailsOnce:
    """Client ``c1``'s E-step reply of the first round with extra points is a failure."""

    def __init__(self, rt):
        self.rt, self.failed = rt, None
        self.client_ids = rt.client_ids

    def __getattr__(self, name):
        return getattr(self.rt, name)

    def call(self, client_ids, method, messages):
        replies = self.rt.call(client_ids, method, messages)
        m = messages.get("c1", {})
        if method == "estep" and self.failed is None and int(m.get("points", 0) or 0) > 0:
            self.failed = int(m["round"])
            replies["c1"] = {ERROR_KEY: "client 'c1': ValueError: a transient fault"}
        return replies


@pytest.mark.usefixtures("saturation_rule_off")
def test_a_failing_reply_in_a_round_with_points_does_not_thin_the_rest_of_the_fit():
    rng = np.random.default_rng(3)
    fd = fl.FederatedDataset.from_arrays(
        {f"c{i}": rng.normal(size=(60, 2)) + rng.integers(0, 3) for i in range(4)})
    rt = fl.InProcessRuntime(fd, record=True)
    wrapped = FailsOnce(rt)
    est = fl.FederatedGaussianMixture(
        3, tol=0.0, max_rounds=30, random_state=0, verbose=False,
        federation=fl.Federation(acceleration="newton")).fit(fd, runtime=wrapped)
    assert wrapped.failed is not None
    assert [r.round for r in est.history_ if r.errors] == [wrapped.failed]
    later = [int(m.get("points", 0) or 0) for way, c, method, m in rt.log
             if way == "down" and method == "estep" and c == "c0"
             and int(m["round"]) > wrapped.failed]
    assert max(later) == SubspaceNewton().extra_points == 2, later
