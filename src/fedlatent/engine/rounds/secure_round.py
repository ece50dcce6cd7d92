"""One FedEM round under secure aggregation: the server gets only the round's sums.

The clients send ``w_c Q_c`` (the weighted, possibly quantized, difference; the statistic itself
in the initialization round), ``n_c / N`` and ``objective_c / N`` masked (a multi-point round also
``w_c S_c(T(x_j))`` and ``objective_c(T(x_j)) / N`` of each extra point: one masked vector, one
unmasking, the sum split by field into :attr:`Aggregate.points`)
(:mod:`fedlatent.engine.secagg.secure`); the FedEM update needs only ``sum_c w_c Q_c``, so it is the
same update as without secure aggregation (:meth:`FedEMState.advance` of one summed reply).
Reply checks act on the aggregate (its shapes and finite values; on full passes the units it
claims equal the survivors' units; in the initialization round the model's invariants of the
summed statistic). The batched in-process path is not used (every client masks its own reply).
A round whose draw (after exclusions) falls below the threshold is skipped and recorded
(:func:`_skipped`), never ends the fit, unless no draw can ever reach the threshold.
"""

from __future__ import annotations

import logging

from fedlatent.data.validation import name_list
from fedlatent.engine.faults import FederatedFitError
from fedlatent.engine.protocol.messages import fault_detail
from fedlatent.engine.rounds.aggregate import EXCLUDED_SINCE, Aggregate
from fedlatent.engine.rounds.collectors import OneByOne, refuse_incomplete_init
from fedlatent.engine.rounds.plan import RoundPlan
from fedlatent.engine.secagg.secure_checks import (
    aggregate_problem,
    discard,
    point_sums,
    with_undo,
)

logger = logging.getLogger(__name__)

__all__ = ["SecureCollector"]


class SecureCollector(OneByOne):
    """The collector of a fit under secure aggregation: the round's sum, nothing per client
    (the evaluation pass and the control variates' start as :class:`OneByOne`)."""

    def gather(self, plan: RoundPlan) -> Aggregate:
        return gather_secure(self.rd, plan)


def _active(rounds, plan: RoundPlan) -> tuple[list[str], list[str], dict]:
    """Round ``k``'s participants without the clients excluded earlier in the fit."""
    chosen = [rounds.cids[i] for i in plan.idx]
    excluded = rounds.secure.excluded
    gone = [c for c in chosen if c in excluded]
    why = {c: f"{EXCLUDED_SINCE}{excluded[c]}" + ("" if "broke the checks" in excluded[c] else
                                                 " (declared dropped; its masks were recovered)")
           for c in gone}
    return [c for c in chosen if c not in excluded], gone, why


def _skipped(rounds, k: int, active: list[str], gone: list[str], errors: dict, p: float,
             init_round: bool) -> Aggregate:
    """The :class:`Aggregate` of a round whose draw is below the threshold: skipped, nothing sent
    (FederatedFitError when no later draw can reach the threshold either).

    Why skip rather than lower the threshold to the cohort: the Shamir shares were dealt once
    per fit, of degree ``t - 1``; a smaller cohort cannot unmask with them, and re-dealing
    shares for a lower threshold would let the server unmask a sum of fewer than ``t``
    clients, which the threshold exists to prevent (with ``t > n / 2`` it also keeps two
    disjoint groups from revealing both secrets of one client). A skipped round reveals
    nothing: no masked reply, no share; the server knows only the draw, a public function of
    the seed. The round counts toward ``max_rounds``; ``history_`` records it (``skipped``).
    """
    t = rounds.secure.config.threshold
    left = len(rounds.cids) - len(rounds.secure.excluded)
    if init_round or left < t:
        raise FederatedFitError(
            f"round {k}: {len(active)} clients can take part ({left} not excluded), fewer than "
            f"the secure aggregation threshold {t}; no round can be unmasked any more; kept the "
            f"parameters of round {k - 1}", rounds.params, k)
    why = (f"{len(active)} clients drawn [{name_list(active)}] (participation {p:g}"
           f"{', after exclusions' if gone else ''}), fewer than the secure aggregation "
           f"threshold {t}: skipped, nothing exchanged, the parameters of round {k - 1} kept")
    logger.warning("round %d: %s", k, why)
    return Aggregate(None, 0, 0.0, 0, 0, 0, list(gone), {}, errors, skipped=why)


def gather_secure(rounds, plan: RoundPlan) -> Aggregate:
    """Round ``plan.k`` through secure aggregation (see the module docstring)."""
    k, init_round = plan.k, plan.init_round
    active, gone, errors = _active(rounds, plan)
    if init_round and gone:
        raise FederatedFitError(f"round {k}: clients {name_list(gone)} are excluded; the "
                                "initialization round needs every client", rounds.params, k)
    if len(active) < rounds.secure.config.threshold:
        return _skipped(rounds, k, active, gone, errors, plan.p, init_round)
    try:
        msg = with_undo(rounds.secure, plan.msg)  # rounds discarded so far: undo them
        if rounds.secure.verify:  # each site replays S_hat itself (node/verify.py)
            msg = {k: v for k, v in msg.items() if not k.startswith("S_hat/")}
        res = rounds.secure.sum("estep", {c: msg for c in active}, round=k,
                                exchange="estep",
                                weights={c: rounds.weights[c] for c in active})
    except FederatedFitError as err:
        raise FederatedFitError(f"{err}; kept the parameters of round {k - 1}", rounds.params,
                                k) from err
    S, D = res["survivors"], res["dropped"]
    errors.update({c: res["errors"][c] for c in res["errors"]})
    _say_refusals(k, {c: errors[c] for c in D if c in errors})
    Q, why = _check_aggregate(rounds, plan, S, res["sums"])
    if why:  # never applied: the liar located and excluded, the round recorded
        return Aggregate(None, 0, 0.0, 0, res["bytes_down"], res["bytes_up"], gone + list(D),
                         {}, errors, skipped=discard(rounds, plan, S, why))
    if init_round:
        refuse_incomplete_init(rounds, k, {c: errors.get(c, "no reply") for c in D})
    down, up = res["bytes_down"], res["bytes_up"]
    if init_round:  # the fit's key set-up counts in its first round
        down, up = down + rounds.secure.setup_down, up + rounds.secure.setup_up
    sums = res["sums"]
    points = point_sums(plan, sums, f"the aggregate of clients [{name_list(S)}]") \
        if plan.points else []  # (checked with the aggregate)
    return Aggregate(Q, len(S), float(sums["objective"]), _units(rounds, S, sums), down, up,
                     gone + list(D), {}, errors, points=points)


def _say_refusals(k: int, said: dict[str, str]) -> None:
    """Log the dropped sites of round ``k`` that answered with an error or a refusal (a
    verifying site's, say), each with its reason: the round goes on without them."""
    if said:
        logger.warning("round %d: left out from now on (masks recovered), having answered with "
                       "an error or a refusal: %s", k, fault_detail(
                           {c: why.removeprefix(f"client {c!r}: ") for c, why in said.items()}))


def _units(rounds, S: list[str], sums) -> int | float:
    """The units the survivors' sum covers, without the fixed-point rounding: the survivors'
    units at setup when the sum claims them to within that rounding (a full pass), else the
    sum as sent (a whole number when the units are)."""
    n = float(sums["n"])
    units = float(sum(rounds.screen.n_units[c] for c in S))
    if abs(n - units) <= rounds.secure.units_slack(len(S)):
        return int(units) if units.is_integer() else units
    return round(n) if units.is_integer() else n


def _check_aggregate(rounds, plan: RoundPlan, S: list[str], sums):
    """``(Q, why)``: the round's sum over the survivors ``S`` as checked statistics
    (:func:`~fedlatent.engine.secagg.secure_checks.aggregate_problem`: shapes, finite values, the
    ring's range, the units, the model's invariants) and why it cannot be true (None: it can);
    disclosure control on the aggregate stops the fit naming the round."""
    k = plan.k
    Q, why = aggregate_problem(rounds, plan, S, sums)
    if not why:  # disclosure control on the aggregate (count_scope="aggregate")
        from fedlatent.engine.privacy.disclosure import check_aggregate, effective

        policy = effective(rounds.fed.disclosure, True)
        refusal = check_aggregate(policy, float(sums["n"]), "the round's statistic", S)
        if refusal:
            raise FederatedFitError(f"round {k}: {refusal}; kept the parameters of round "
                                    f"{k - 1}", rounds.params, k)
    return Q, why
