"""Subspace-Newton accelerated EM: several points a round (``Federation(acceleration="newton")``).

EM is the fixed point of ``F`` (one round: ``F(x) = sum_c w_c S_c(T(x))``); Newton on
``h(s) = F(s) - s`` needs the Jacobian of ``F``, which a federation can only read from
evaluations of ``F``. A multi-point round (:attr:`~fedlatent.engine.rounds.plan.RoundPlan.points`)
evaluates, beside its statistic (the *primary* point), extra points ``x_j`` whose ``F(x_j)``
and objectives come back in :attr:`~fedlatent.engine.rounds.aggregate.Aggregate.points`
(sums: secure aggregation still applies). :class:`NewtonAccelerator` is the server's state
between such rounds (the algorithm of ``benchmarks/accel_variants.py``'s B''; the settings and
the measurements in :mod:`fedlatent.engine.fedem.acceleration`):

- after round ``k``, which evaluated the primary ``x_0 = F(a)`` (``a`` the accepted point of
  the round before) and the extras, the accepted point is the best of them by objective (the
  primary's objective is at least ``a``'s by EM's monotonicity, so the accepted path never
  goes down);
- the secants of the round (``x_j - x_0`` and ``F(x_j) - F(x_0)``) and of the last
  ``memory`` rounds give an orthonormal subspace ``U`` and the Jacobian's action ``J U`` on it;
- round ``k + 1`` is sent the plain point ``F(a)`` as its statistic and two extras: the
  Newton proposal ``F(a) + J U c`` (``c`` the least-squares solution of
  ``(J U - U) c = -h(a)``) and the over-relaxed ``a + over * h(a)``, each halved towards
  ``F(a)`` while it leaves the model's domain and dropped if it still does.

Stopping is scikit-learn's rule on the accepted path: the primary's objective minus the
accepted point's, below ``tol`` in absolute value on a round with every reply (one EM step's
change). The fit ends on ``F`` of the best point evaluated. A round with a missing or refused
reply (its aggregate is not ``F``), or a skipped one, restarts from its plain step with no
extras and no memory, as SQUAREM's reset.

A model whose clients keep a state their E-step advances (``point_state``: FedGMM's mixing
weights) has the round messages also carry :meth:`NewtonAccelerator.client_fields`: the
point accepted, the rounds whose states the clients keep, and each extra point's coefficients
over ``F(a) - a`` and the secant columns, which each client applies to the states it kept
(:mod:`fedlatent.engine.node.pointstate`). Points are compared by the mean objective minus
the model's ``objective_penalty`` (what its M-step maximizes; 0 by default).

The state machine itself is :mod:`fedlatent.engine.fedem.subspace` (a verifying site runs the
same code, :mod:`fedlatent.engine.node.replay_points`); this module holds the round loop's
side: the factory, the step down when sites refuse extra points, and the round's state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fedlatent.data.validation import name_list
from fedlatent.engine.contract.model import FederatedModel
from fedlatent.engine.fedem.subspace import (
    NewtonAccelerator,
    newton_next,
    newton_points,
    secant_parts,
    secant_subspace,
)
from fedlatent.engine.fedem.update import FedEMState
from fedlatent.engine.protocol.messages import unpack
from fedlatent.engine.rounds.accelerate import domain_test, refuse_model

__all__ = ["NewtonAccelerator", "ServerNewton", "cap_exceeded", "newton_for", "newton_points",
           "newton_state", "secant_parts", "secant_subspace", "step_down"]

logger = logging.getLogger(__name__)


class ServerNewton(NewtonAccelerator):
    """The round loop's :class:`~fedlatent.engine.fedem.subspace.NewtonAccelerator`: its
    state after a round is :func:`newton_state` (the step down, the reset, the penalties)."""

    def state_after(self, old: FedEMState, plain: FedEMState, agg, plan) -> FedEMState:
        """:func:`newton_state`."""
        return newton_state(self, old, plain, agg, plan)


def newton_for(model, federation, n_total: float, params: Callable[[], dict],
               tol: float) -> NewtonAccelerator | None:
    """The run's :class:`NewtonAccelerator` under ``Federation(acceleration="newton")`` (None
    without); refuses a model whose round is not an EM map, or that declares a client state
    the extra points cannot carry (``multipoint_refusal``); a model with ``point_state`` gets
    its clients' states carried along (:meth:`NewtonAccelerator.client_fields`)."""
    settings = federation.newton
    if settings is None:
        return None
    refuse_model(model)
    refusal = getattr(model, "multipoint_refusal", "")
    if refusal:
        raise ValueError(f"Federation(acceleration='newton') is not available for model "
                         f"{model.name!r}: {refusal}, so the EM map is not a function of the "
                         "statistic alone and several points a round would each need a client "
                         "state; use acceleration='squarem' or None")
    own = getattr(type(model), "objective_penalty", None)  # (None: the default's 0)
    return ServerNewton(settings, domain_test(model, n_total, params), tol,
                             client_state=bool(getattr(model, "point_state", False)),
                             penalty=None if own in (None, FederatedModel.objective_penalty)
                             else model.objective_penalty)



#: the refusal rule of a site's own cap on a round's extra points (its ``[limits] max-points``)
POINTS_RULE = "limits.max-points"
#: what the saturation rule's refusal names (each extra point is one more statistic)
SATURATION_MARK = "max_parameters_per_record="


def cap_exceeded(text: str) -> bool:
    """Whether an error reply says the site's cap on a round's points was exceeded: its
    ``[limits] max-points`` refusal, or the saturation rule (which counts each extra point as
    one more statistic). Any other refusal or failure says nothing about the points."""
    from fedlatent.engine.site.guard import refusal_rules

    return POINTS_RULE in refusal_rules(text) or SATURATION_MARK in str(text)


def step_down(accel: NewtonAccelerator, plan, errors: dict[str, str]) -> None:
    """Clients answered a round of ``len(plan.points)`` extra points with an error saying
    their cap on points was exceeded (:func:`cap_exceeded`: a site's saturation rule counts
    each point as one more statistic, or its ``[limits] max-points``): the rest of the fit
    sends one extra point fewer, down to none (plain EM rounds), so that no site is left out
    of round after round. Other errors (a failure, another rule's refusal) leave it."""
    capped = {c: why for c, why in errors.items() if cap_exceeded(why)}
    if not capped:
        return
    accel.cap = min(accel.cap, len(plan.points) - 1)
    logger.warning("round %d: client(s) [%s] did not answer a round of %d extra point(s) "
                   "(%s); Federation(acceleration='newton') sends at most %d from now on",
                   plan.k, name_list(list(capped)), len(plan.points),
                   next(iter(capped.values())), accel.cap)


def newton_state(accel: NewtonAccelerator, old: FedEMState, plain: FedEMState, agg,
                 plan) -> FedEMState:
    """The state the next round starts from: ``plain`` (``F(S_hat)``) with its statistic
    replaced by the accelerator's choice; ``plain`` itself, and a new path, when a reply was
    missing or refused. Extra points the round did not return (a transport without
    multi-point rounds) are left out: the round then counts as a plain one."""
    if plan.points and agg.errors:
        step_down(accel, plan, agg.errors)
    if agg.missing or agg.rejected or not agg.units or plain.S_hat is None:
        accel.reset()
        return plain
    pen = (lambda j: 0.0) if accel.penalty is None else \
        (lambda j: accel.penalty(unpack(plan.msg, f"params{j or ''}")))
    evaluated = []
    if len(agg.points) == len(plan.points):
        evaluated = [(x, fx, obj / agg.units - pen(j))
                     for j, (x, (fx, obj)) in enumerate(zip(plan.points, agg.points,
                                                            strict=True), 1)]
    elif plan.points:
        logger.info("round %d: %d extra points sent, %d returned; kept the plain step",
                    plan.k, len(plan.points), len(agg.points))
    return newton_next(accel, old, plain, agg.objective_sum / agg.units - pen(0), evaluated,
                       plan.k)
