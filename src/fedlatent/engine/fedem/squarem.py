"""SQUAREM's state machine (:class:`Accelerator`): the statistic the next round is sent,
a public function of the history of aggregates and objectives. The server's round loop
(:mod:`fedlatent.engine.rounds.accelerate`) and a verifying site's replay
(:mod:`fedlatent.engine.node.replay_points`) run this same code; the settings are in
:mod:`fedlatent.engine.fedem.acceleration`."""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from fedlatent.engine.fedem.acceleration import Squarem
from fedlatent.engine.fedem.update import FedEMState
from fedlatent.engine.stats import Stats

__all__ = ["Accelerator", "SAFEGUARD_RTOL", "accelerated_state", "domain_test"]

logger = logging.getLogger(__name__)

#: the safeguard's rounding allowance: an extrapolated point is kept when its objective is at
#: least the previous EM point's minus this fraction of its magnitude (objectives are means
#: per unit, summed in different orders)
SAFEGUARD_RTOL = 1e-12

class Accelerator:
    """The SQUAREM state of one run (see the module docstring).

    Parameters
    ----------
    settings : Squarem
    valid : callable
        ``valid(S) -> bool``: whether ``S`` is in the model's domain (its invariants hold and
        the M-step gives finite parameters).

    Attributes
    ----------
    accepted, rejected, out_of_domain : int
        Extrapolations kept, extrapolations the safeguard refused (one round each), and
        proposals that left the domain (each a halving of the step, no round).
    em_step : bool
        Whether the last round evaluated was sent the plain EM step of the round before it
        (``x_k = F(x_{k-1})``): only then is the change of the objective between the two rounds
        one EM iteration's, the change scikit-learn's stopping rule tests.
    """

    def __init__(self, settings: Squarem, valid: Callable[[Stats], bool]):
        self.settings = settings
        self.valid = valid
        self.step_max = float(settings.step_max0)
        self.base: tuple[Stats, Stats] | None = None  # (s0, s1) after a base round
        self.pending: tuple[Stats, float] | None = None  # (s2, objective at s1) after s'
        self.accepted = self.rejected = self.out_of_domain = 0
        self.em_step = self._sent_plain = True  # round 2 is the EM step of round 1

    def reset(self) -> None:
        """Restart the cycle (the last round's aggregate was not the EM map); the next round
        is sent the plain step."""
        self.base = self.pending = None
        self._sent_plain = True

    def points(self, model, params: dict, n_total: float) -> list:
        """SQUAREM sends one point a round."""
        return []

    def state_after(self, old: FedEMState, plain: FedEMState, agg, plan) -> FedEMState:
        """:func:`accelerated_state`."""
        return accelerated_state(self, old, plain, agg)

    def may_stop(self, complete: bool) -> bool | None:
        """Only a round sent the EM step of the round before tests scikit-learn's rule."""
        return None if self.em_step else False

    def final(self, new_state: FedEMState, plain: FedEMState) -> FedEMState | None:
        """End on the EM step (its objective is at least the last round's), not on an
        extrapolation no round has evaluated."""
        return None if new_state is plain else plain

    def next_point(self, x: Stats, fx: Stats, objective: float) -> Stats:
        """The statistic the next round is sent, after a round that evaluated ``x`` and
        returned ``fx = F(x)`` with the mean objective ``objective`` at ``T(x)`` (not finite:
        no safeguard is possible, so the plain step, and the cycle restarts)."""
        self.em_step = self._sent_plain
        out = self._next(x, fx, objective)
        self._sent_plain = out is fx
        return out

    def _next(self, x: Stats, fx: Stats, objective: float) -> Stats:
        if not np.isfinite(objective):
            pending, self.pending, self.base = self.pending, None, None
            return fx if pending is None else pending[0]
        if self.pending is not None:
            s2, bar = self.pending
            self.pending = None
            if not objective >= bar - SAFEGUARD_RTOL * max(1.0, abs(bar)):
                self.rejected += 1
                self.step_max = max(float(self.settings.step_max0),
                                    self.step_max / self.settings.mstep)
                logger.info("SQUAREM: the extrapolated statistic lowered the objective "
                            "(%.10g < %.10g); the plain EM step is sent next", objective, bar)
                self.base = None
                return s2
            self.accepted += 1
        if self.base is None:  # x is a base point s0, fx = s1
            self.base = (x, fx)
            return fx
        s0, s1 = self.base
        self.base = None
        s_new = self.extrapolate(s0, s1, fx)
        if s_new is not fx:  # the next round checks it against the objective at s1
            self.pending = (fx, float(objective))
        return s_new

    def extrapolate(self, s0: Stats, s1: Stats, s2: Stats) -> Stats:
        """``s0 + 2 a r + a^2 v`` with the S3 step ``a = ||r|| / ||v||`` clamped to
        ``[1, step_max]`` and halved towards 1 while the result leaves the domain; ``s2``
        itself (the same object) when the step is 1."""
        r = s1.flatten() - s0.flatten()
        v = s2.flatten() - s1.flatten() - r
        nr, nv = float(np.linalg.norm(r)), float(np.linalg.norm(v))
        if not (np.isfinite(nr) and np.isfinite(nv)) or nv == 0.0:
            return s2
        a = min(max(nr / nv, 1.0), self.step_max)
        if a >= self.step_max:  # the step reached its bound: allow longer ones (SqS3)
            self.step_max *= self.settings.mstep
        base = s0.flatten()
        for _ in range(self.settings.backtracks + 1):
            if a <= 1.0:
                break
            cand = s0.unflatten(base + (2.0 * a) * r + (a * a) * v)
            if self.valid(cand):
                return cand
            self.out_of_domain += 1
            a = 1.0 + 0.5 * (a - 1.0)
        return s2

def domain_test(model, n_total: float, params: Callable[[], dict]) -> Callable[[Stats], bool]:
    """``valid(S)``: ``S`` finite, the model's invariants of a client's statistic
    (:meth:`~fedlatent.engine.contract.model.FederatedModel.check`) on ``S`` as sums over the
    ``n_total`` units, and a finite M-step at the current ``params()``."""

    def valid(S: Stats) -> bool:
        if not S.all_finite() or model.check(S * n_total, n_total) is not None:
            return False
        try:
            out = model.server_step(S, params(), n_total)
        except (FloatingPointError, OverflowError, ZeroDivisionError, ValueError,
                np.linalg.LinAlgError):
            return False
        return all(bool(np.all(np.isfinite(v))) for v in out.values())

    return valid


def accelerated_state(accel: Accelerator, old: FedEMState, plain: FedEMState,
                      agg) -> FedEMState:
    """The state the next round starts from: ``plain`` (the FedEM step ``F(S_hat)``) with its
    statistic replaced by the accelerator's choice; ``plain`` itself, and the cycle restarted,
    when a reply was missing or refused (the aggregate is then not ``F(S_hat)``)."""
    if agg.missing or agg.rejected or not agg.units or plain.S_hat is None:
        accel.reset()
        return plain
    S = accel.next_point(old.S_hat, plain.S_hat, agg.objective_sum / agg.units)
    return plain if S is plain.S_hat else FedEMState(S, plain.V)
