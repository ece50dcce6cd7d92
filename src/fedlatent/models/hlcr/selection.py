"""Choosing K for HLCR by held-out predictive log-likelihood over events, federated.

Every agent holds out a fraction of each entity's events (one fold, drawn from its own data and
the fit's seed: :func:`~fedlatent.models.hlcr.model.holdout_mask`, as
:func:`fedlatent.datasets.split_events` makes folds). For each candidate K a chain runs on the
training events; then each agent scores its held-out events locally (the joint predictive
density of each entity's held-out events given its label, Theorem 1 against the fitted cluster
statistics) and sends two numbers, the summed log density and the count. The K with the best
mean held-out log density per event wins (the smallest K within :data:`K_TIE` of the best);
the fit then reruns on all events with it.

References
----------
Yang, Carette, Jimbo, Maruyama, "Federated Latent Class Regression for Hierarchical Data",
2022: Theorem 1 (the predictive density), section 6 (events held out within each pair).
"""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np

from ...engine.contract.model import Params
from ...engine.estimation.estimator import FitContext
from ...engine.faults import FederatedFitError
from ...engine.protocol.exchange import number, setup_clients
from ...engine.rounds.loop import LoopOptions
from .model import HELDOUT_QUERY, RESTART_QUERY
from .solvers import run_federated, run_gibbs

__all__ = ["choose_k"]

logger = logging.getLogger(__name__)

#: scores closer than this (nats per held-out event) are a tie, won by the smallest K: extra
#: clusters that stay empty do not change the held-out density
K_TIE = 0.005


def _switch(est, ctx: FitContext, K: int, holdout: float) -> tuple[FitContext, Params]:
    """Set the agents up for a chain with ``K`` clusters (holding out ``holdout``), labels
    forgotten, and its starting parameters."""
    from .fitting import start_params

    model = est._model_for(ctx.n_features, K, holdout, int(ctx.seed) % (2**31))
    n_units = setup_clients(ctx.runtime, model, ctx.federation.disclosure)
    new = replace(ctx, model=model, n_units=n_units)
    new.ask(RESTART_QUERY, expect={"n_entities": number(low=1)}, what="restart (choosing K)")
    return new, start_params(new, est._chain(), est._standardizes(), est.fit_intercept)


def _score(ctx: FitContext, params0: Params, result, pooled: bool) -> tuple[float, float]:
    """Summed held-out log density and number of held-out events, from the agents."""
    payload = {f"params/{k}": np.asarray(v) for k, v in params0.items()
               if k in ("T", "y_shift", "y_scale")}
    payload["params/D"] = np.asarray(result.params["D"])
    payload["params/c"] = np.asarray(result.params["c"])
    if np.isfinite(result.sigma):
        payload["params/sigma"] = np.array(result.sigma)
    if pooled:  # the centralized sampler's labels: the agents' scoring function, run here
        per = {}
        start = 0
        for cid, _ in ctx.data.items():
            n = ctx.model.n_units(ctx.data[cid])
            per[cid] = result.labels[start:start + n]
            start += n
        tot = [ctx.model._heldout(payload, ctx.data[c], {"labels": per[c]}) for c in per]
        return sum(r["loglik"] for r in tot), sum(r["n"] for r in tot)
    rep = ctx.ask(HELDOUT_QUERY, payload, expect={"loglik": number(), "n": number(low=0)},
                  what="held-out scoring (choosing K)")
    return (sum(float(r["loglik"]) for r in rep.values()),
            sum(float(r["n"]) for r in rep.values()))


def choose_k(est, ctx: FitContext, options: LoopOptions, round_loop):
    """Run one chain per K of ``est.n_clusters_range`` on the training events and score each.

    Returns
    -------
    ctx, params0 : the context and starting parameters of the final fit (all events, best K)
    scores : dict of int to float
        Mean held-out log predictive density per held-out event, in the target's units.
    """
    from .fitting import chain_for

    lo, hi = (int(v) for v in est.n_clusters_range)
    opts = replace(options, progress=False, callbacks=None, checkpoint=None, resume=False)
    scores: dict[int, float] = {}
    for K in range(lo, hi + 1):
        try:
            ck, p0 = _switch(est, ctx, K, float(est.holdout))
        except FederatedFitError as err:  # refused by sites the fit's setup admitted
            if not err.faults or K == lo:
                raise
            logger.warning("hlcr: K=%d is not tried: %s", K, err)
            continue
        chain = chain_for(est._chain(), p0)
        if est.solver == "gibbs":
            res = run_gibbs(est, ck, opts, p0, chain)
        else:
            res = run_federated(ck, p0, opts, round_loop, chain)
        ll, n = _score(ck, p0, res, est.solver == "gibbs")
        if n <= 0:
            raise ValueError("n_clusters='auto' found no held-out event: every entity has a "
                             "single event; give n_clusters an integer")
        scale = float(p0.get("y_scale", 1.0))
        scores[K] = ll / n - np.log(scale)  # density of the target in its own units
        logger.info("hlcr: K=%d held-out log predictive %.4f per event", K, scores[K])
    top = max(scores.values())
    best = min(k for k, v in scores.items() if v >= top - K_TIE)
    ck, p0 = _switch(est, ctx, best, 0.0)
    return ck, p0, scores
