"""Accelerated EM in the statistic space: SQUAREM on the server's aggregated statistics.

The round loop computes ``F(S_hat)``, the plain FedEM (here: EM) step, from the round's
aggregate; :class:`Accelerator` decides which statistic the next round is sent instead (the
settings and the reasons for SQUAREM are in :mod:`fedlatent.engine.fedem.acceleration`). It reads
only the aggregate ``F(S_hat)`` and the round's summed objective, so it composes with secure
aggregation; the clients see nothing new (a round message carries an ``S_hat`` as always).

Every round evaluates one point ``x`` (the ``S_hat`` it was sent) and returns ``F(x)`` and the
objective at ``T(x)``. A cycle is two rounds: ``s0`` (a base round) then ``s1 = F(s0)``, after
which ``s2 = F(s1)`` is known and the extrapolated ``s'`` is sent; the round at ``s'`` is
either rejected by the safeguard (the plain ``s2`` is sent next) or is the next cycle's base.
A round with a missing or refused reply (its aggregate is not ``F(x)``), or a skipped round,
restarts the cycle.

The state machine itself is :mod:`fedlatent.engine.fedem.squarem` (a verifying site runs the
same code, :mod:`fedlatent.engine.node.replay_points`); this module holds the round loop's
side: the accelerator's protocol and the factory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from fedlatent.engine.fedem.squarem import (
    SAFEGUARD_RTOL,
    Accelerator,
    accelerated_state,
    domain_test,
)
from fedlatent.engine.fedem.update import FedEMState
from fedlatent.engine.stats import Stats

__all__ = ["Accelerator", "SAFEGUARD_RTOL", "ServerAccelerator", "accelerated_state",
           "accelerator_for", "domain_test",
           "refuse_model"]


class ServerAccelerator(Protocol):
    """What the round loop asks of an accelerator (SQUAREM here, subspace Newton in
    :mod:`fedlatent.engine.rounds.newton`): one attribute of the loop, one round path."""

    def reset(self) -> None:
        """Forget the path: the last round's aggregate was not the EM map (or none came)."""

    def points(self, model, params: dict, n_total: float) -> list[tuple[Stats, dict]]:
        """The next round's extra points ``[(x_j, T(x_j))]`` (empty: a one-point round)."""

    def state_after(self, old: FedEMState, plain: FedEMState, agg, plan) -> FedEMState:
        """The state the next round is sent, after a round whose plain step is ``plain``."""

    def may_stop(self, complete: bool) -> bool | None:
        """Whether the round just run may end the fit (None: the loop's plain-EM rule)."""

    def final(self, new_state: FedEMState, plain: FedEMState) -> FedEMState | None:
        """The state a fit that stops now ends on (None: ``new_state``)."""

def accelerator_for(model, federation, n_total: float,
                    params: Callable[[], dict]) -> Accelerator | None:
    """The run's :class:`Accelerator` under ``Federation(acceleration="squarem")`` (None
    without); a model whose round is not an EM map (``acceleration_refusal``) is refused.

    Its domain test is :func:`domain_test`."""
    settings = federation.squarem
    if settings is None:
        return None
    refuse_model(model)
    return Accelerator(settings, domain_test(model, n_total, params))


def refuse_model(model) -> None:
    """ValueError when ``model``'s round is not an EM map (``acceleration_refusal``)."""
    refusal = getattr(model, "acceleration_refusal", "")
    if refusal:
        raise ValueError(f"Federation(acceleration=...) is not available for model "
                         f"{model.name!r}: {refusal}; use acceleration=None")
