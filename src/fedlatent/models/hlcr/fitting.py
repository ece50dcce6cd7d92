"""What the HLCR estimator does around a solver: the starting parameters (with the checked
``"moments"`` exchange when it standardizes), the chain's diagnostic, and the fitted
attributes in the user's units.

References
----------
Yang, Carette, Jimbo, Maruyama, "Federated Latent Class Regression for Hierarchical Data",
2022: Algorithm 3, line 2 (the prior start).
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np

from ...engine.contract.model import Params
from ...engine.estimation.estimator import FitContext
from ...engine.fedem.history import History
from ...engine.node.replay_start import register_start
from ...engine.protocol.exchange import array, number
from .math import posterior_means
from .model import MOMENTS_QUERY, SIZES_QUERY, _num
from .privacy import dp_moments_scaling
from .scaling import constant_columns, moments_scaling, scaling_matrix, to_user_units
from .solvers import ChainSettings, HLCRFit, chain_diagnostic

__all__ = ["HYPER_START", "HLCRHistory", "finish_chain", "secure_sizes", "start_params",
           "store_fit", "uses_random_intercept"]

#: starting sigma and delta when they are estimated (standardized units)
HYPER_START = (0.5, 1.0)
#: starting sd of the entity random intercept when it is estimated (standardized units)
TAU_START = 0.5


def uses_random_intercept(est) -> bool:
    """Whether the fit has the entity random intercept: ``random_intercept`` as given, or for
    ``"auto"`` (the default) wherever it is available: with ``fit_intercept``, an integer
    ``n_clusters`` and no differential privacy (:func:`check_random_intercept`)."""
    if not isinstance(est.random_intercept, str):
        return bool(est.random_intercept)
    fed = est.federation
    return bool(est.fit_intercept and est.n_clusters != "auto"
                and (fed is None or fed.privacy is None))


def check_random_intercept(est) -> None:
    """``random_intercept=True`` needs the intercept column (its statistics are the entity's
    ``X^T 1`` and ``1^T y``) and no differential privacy (its ``u2`` sum has no sensitivity
    bound yet); with ``n_clusters="auto"`` (K by WAIC over screened candidates,
    :mod:`.waic`) not under secure aggregation (one chain). ``"auto"`` is off where these are
    missing (for ``n_clusters="auto"`` itself: each candidate K resolves it)."""
    if isinstance(est.random_intercept, str) or not est.random_intercept:
        return
    if not est.fit_intercept:
        raise ValueError("HLCR: random_intercept=True needs fit_intercept=True (the entity's "
                         "intercept varies around the cluster's); give fit_intercept=True")
    fed = est.federation
    if est.n_clusters == "auto" and fed is not None and fed.secure_aggregation:
        raise ValueError("HLCR: n_clusters='auto' is not available with random_intercept=True "
                         "under secure aggregation (K is chosen by WAIC among candidates whose "
                         "several chains mix); give an integer n_clusters")
    if fed is not None and fed.privacy is not None:
        raise ValueError("HLCR: random_intercept=True is not available under differential "
                         "privacy (its intercept sums have no sensitivity bound); give "
                         "random_intercept=False")


def start_params(ctx: FitContext, chain: ChainSettings, standardize: bool,
                 fit_intercept: bool, sizes: dict | None = None) -> Params:
    """Algorithm 3's start (the prior), plus, when the chain estimates sigma/delta or
    standardizes, the scaling ``T, y_shift, y_scale`` (from the agents' summed moments), the
    current ``sigma``, ``delta`` (fit units) and the seed and step of the server's draws. The
    paper's fixed-sigma path gets exactly the old parameters.

    Under differential privacy the moments are one noisy release (summed replies only, about
    the clipping centre; :func:`.privacy.dp_moments_scaling`) and ``sizes["n_events"]`` gets
    their noisy event count."""
    params = ctx.model.initial_params()
    if not (standardize or chain.estimate_sigma or chain.estimate_delta):
        return params
    sigma = chain.sigma
    if standardize:
        F = ctx.n_features
        what = "initialization (moments for standardizing)"
        if ctx.privacy is not None:
            tot = ctx.ask_sum(MOMENTS_QUERY, shapes={"n": (), "sx": (F,), "sxx": (F,),
                                                     "sy": (), "syy": ()}, what=what)
            mx, sx, my, sy, n_ev = dp_moments_scaling(tot, ctx.federation.privacy,
                                                      fit_intercept)
            if sizes is not None:
                sizes["n_events"] = n_ev
        elif ctx.secure is not None:  # the same sums, only their total seen
            tot = ctx.ask_sum(MOMENTS_QUERY, shapes={"n": (), "sx": (F,), "sxx": (F,),
                                                     "sy": (), "syy": ()}, what=what)
        else:
            rep = ctx.ask(MOMENTS_QUERY, expect={"n": number(low=1), "sx": array(F),
                                                 "sxx": array(F, low=0), "sy": number(),
                                                 "syy": number(low=0)}, what=what)
            tot = {k: sum(np.asarray(r[k], dtype=np.float64) for r in rep.values())
                   for k in ("n", "sx", "sxx", "sy", "syy")}
        if ctx.privacy is None:
            mx, sx, my, sy = moments_scaling(tot["n"], tot["sx"], tot["sxx"], tot["sy"],
                                             tot["syy"], fit_intercept)
            if fit_intercept:
                _warn_constant(ctx, tot)
        params.update(T=scaling_matrix(mx, sx, fit_intercept), y_shift=np.array(my),
                      y_scale=np.array(sy), x_shift=mx, x_scale=sx)
        if not chain.estimate_sigma:  # a fixed sigma is in the target's units
            sigma = chain.sigma / sy
    params.update(sigma=np.array(float(sigma)), delta=np.array(float(chain.delta)),
                  seed=np.array(float(int(ctx.seed) % (2**52))), step=np.array(0.0))
    if "tau" in params and standardize and not chain.estimate_tau:  # target's units
        params["tau"] = np.array(chain.tau / float(params["y_scale"]))
    return params


@register_start("hlcr")
def replay_hlcr_start(model, ctx) -> list[Params]:
    """The start a verifying site replays (:mod:`fedlatent.engine.node.replay_start`): the
    secure fit's own, the agents' summed sizes then :func:`start_params` (the prior; with
    standardizing, the summed moments' scaling; with estimated hyperparameters the seed of
    the server's draws, the committed one). None under differential privacy (its spread
    start); another candidate's warm start (``n_clusters="auto"``) is not replayed."""
    if model.dp_max_events is not None:
        return []
    secure_sizes(ctx, "initialization (agent sizes)")
    chain = ChainSettings(0, 1, model.sigma, model.delta, model.estimate_sigma,
                          model.estimate_delta, model.tau, model.estimate_tau)
    return [start_params(ctx, chain, model.standardize, model.fit_intercept)]


def _warn_constant(ctx: FitContext, tot: dict) -> None:
    """One warning naming the (nearly) constant features: they are not standardized (centring
    them through sums would leave only rounding noise), so with the intercept they mostly
    duplicate it."""
    const = np.flatnonzero(constant_columns(tot["n"], tot["sx"], tot["sxx"]))
    if not const.size:
        return
    from ...data.validation import name_list

    names = ctx.data.feature_names if ctx.data is not None else None
    cols = [str(names[j]) if names is not None else f"column {j}" for j in const]
    warnings.warn(
        f"HLCR: feature(s) {name_list(cols)} are constant across the federation (variance at "
        "most 1e-8 of the mean square): not standardized, so they mostly duplicate the "
        "intercept; drop them, or centre them yourself if they vary", UserWarning,
        stacklevel=4)


def secure_sizes(ctx: FitContext, what: str) -> tuple[int, int]:
    """The agents' summed entity and event counts under secure aggregation, checked on the
    aggregate: the entities set up, at least one event each, the fit's width on every agent."""
    from ...engine.rounds.loop import FederatedFitError

    tot = ctx.ask_sum(SIZES_QUERY, shapes={"n_entities": (), "n_events": (), "n_features": ()},
                      what=what)
    n_ent, n_ev, width = (float(np.rint(tot[k])) for k in ("n_entities", "n_events",
                                                            "n_features"))
    want = float(sum(ctx.n_units.values()))
    problem = None
    if n_ent != want:
        problem = f"report {n_ent:g} entities, {want:g} at setup"
    elif n_ev < n_ent:
        problem = f"report {n_ev:g} events for {n_ent:g} entities"
    elif width != ctx.n_features * len(ctx.client_ids):
        problem = f"report {width:g} features in all, not {ctx.n_features} each"
    if problem:
        raise FederatedFitError(f"{what}: the agents together {problem} (secure aggregation "
                                "hides which one); nothing of this exchange was used")
    return int(n_ent), int(n_ev)


def mean_intercepts(model, XtX, Xty, n, draws):
    """Every entity's posterior mean intercept (BLUP at each draw's posterior means, labels,
    sigma and tau) and its posterior variance given the draw (``sigma^2 g_e``), both averaged
    over the retained draws; fit units, shapes (E,). (None, None) when a draw has no labels
    (the runtime cannot see the agents').

    The BLUPs' spread across the draws is left out of the variance: it comes with the draws'
    labels (another cluster, another BLUP), whose spread ``predict_interval`` already has in
    its mixture over the draws' clusters; counted twice, 90% intervals of known entities
    covered 90.8% instead of 90.0% (tests/models/test_hlcr_interval_intercept.py's data)."""
    from .random_intercept import intercept_posterior

    total, var = np.zeros(len(n)), np.zeros(len(n))
    for d in draws:  # a loop over draws, vectorized over entities
        if d["labels"] is None or (np.asarray(d["labels"]) < 0).any():
            return None, None
        p = {k: d[k] for k in ("sigma", "tau") if d.get(k) is not None}
        sig = model.sigma_of(p)
        W = posterior_means(np.asarray(d["D"]), np.asarray(d["c"]))[np.asarray(d["labels"])]
        m, v = intercept_posterior(XtX, Xty, n, W, (model.tau_of(p) / sig) ** 2, sig)
        total += m
        var += v
    return total / len(draws), var / len(draws)


def chain_for(chain: ChainSettings, params0: Params) -> ChainSettings:
    """The chain's starting sigma in the fit's units (a fixed sigma divided by the scale)."""
    return replace(chain, sigma=_num(params0.get("sigma", chain.sigma)),
                   tau=_num(params0.get("tau", chain.tau)))


def finish_chain(est, ctx: FitContext, params0: Params, result: HLCRFit, tol: float) -> None:
    """The mixing diagnostic (in-process data only) and ``result.converged``: the ``tol``
    rule's verdict when ``tol > 0``, else ``mixing < est.MIXING_TOL`` (with a
    ConvergenceWarning when it fails), unless several chains of at least 4 draws run: their
    R-hat on label-invariant quantities then gives the verdict and the warning
    (:func:`.inference.store_chains`); the split-half difference measures the Monte Carlo
    error of the predictive mean against the target's sd, not the chains' agreement."""
    result.pred_change, result.mixing = np.full(len(result.draws), np.nan), float("nan")
    if ctx.data is not None and result.draws:
        parts = [ctx.model._plain_stats(cd, params0) for _, cd in ctx.data.items()]
        XtX, Xty, yty, n = (np.concatenate([p[i] for p in parts]) for i in range(4))
        if ctx.model.random_intercept:
            result.random_effects, result.random_effects_var = mean_intercepts(
                ctx.model, XtX, Xty, n, result.draws)
        N = float(n.sum())
        mean = float(Xty[:, -1].sum()) / N if est.fit_intercept else 0.0
        sd = float(np.sqrt(max(float(yty.sum()) / N - mean**2, 1e-300)))
        result.pred_change, result.mixing = chain_diagnostic(XtX, Xty, yty, n, result.draws, sd)
    if tol > 0:
        return
    result.converged = bool(result.mixing < est.MIXING_TOL)
    if est._n_chains() > 1 and len(result.draws) >= 4:  # the chains' R-hat judges (.inference)
        return
    if not result.converged and np.isfinite(result.mixing):
        from ...engine.errors import ConvergenceWarning

        warnings.warn(
            f"HLCR: the posterior predictive means of the two halves of the "
            f"{len(result.draws)} retained draws differ by {100 * result.mixing:.1f}% of the "
            f"target's sd (more than {100 * est.MIXING_TOL:g}%); raise max_rounds",
            ConvergenceWarning, stacklevel=4)


def _scaling(params0: Params, n_features: int, fit_intercept: bool):
    if "T" in params0:
        return (np.asarray(params0["T"]), _num(params0["y_shift"]), _num(params0["y_scale"]),
                np.asarray(params0["x_shift"]), np.asarray(params0["x_scale"]))
    return None, 0.0, 1.0, np.zeros(n_features), np.ones(n_features)


def store_fit(est, result: HLCRFit, params0: Params, chain: ChainSettings) -> None:
    """The fitted attributes from a solver's result (everything in the user's units)."""
    F = int(est.n_features_in_)
    T, my, sy, mx, sx = _scaling(params0, F, est.fit_intercept)

    def user(D, c, sigma):
        if T is None:
            return np.asarray(D, dtype=np.float64), np.asarray(c, dtype=np.float64), sigma
        return to_user_units(np.asarray(D), np.asarray(c), sigma, T, my, sy)

    def sig(v):  # a draw's sigma (fit units); the fixed one where the params carry none
        return chain.sigma if v is None or not np.isfinite(_num(v)) else _num(v)

    p = result.params
    K = int(np.shape(p["D"])[0])
    est.n_clusters_ = K
    est.pair_agents_, est.pair_entities_ = result.pair_agents, result.pair_entities
    est.labels_ = np.asarray(result.labels, dtype=np.int64)
    draws = result.draws
    sig_fit = sig(result.sigma)
    if chain.estimate_sigma and draws:
        sig_fit = float(np.sqrt(np.mean([sig(d["sigma"]) ** 2 for d in draws])))
    delta = float(result.delta) if np.isfinite(result.delta) else chain.delta
    if chain.estimate_delta and draws:
        delta = float(np.sqrt(np.mean([_num(d["delta"]) ** 2 for d in draws])))
    D, c, sigma_u = user(p["D"], p["c"], sig_fit)
    est._set_cluster_params(D, c, p["counts"])
    est.sigma_, est.delta_ = float(sigma_u), delta
    E = len(est.labels_)
    Ds, cs, ss = user(np.stack([d["D"] for d in draws]), np.stack([d["c"] for d in draws]),
                      np.array([sig(d["sigma"]) for d in draws]))
    est.draws_precisions_, est.draws_c_, est.draws_sigma_ = Ds, cs, np.asarray(ss, dtype=float)
    est.draws_counts_ = np.stack([np.asarray(d["counts"], dtype=float) for d in draws])
    est.draws_labels_ = np.stack([np.full(E, -1, dtype=np.int64) if d["labels"] is None
                                  else np.asarray(d["labels"], dtype=np.int64) for d in draws])
    store_intercepts(est, result, draws, chain, sy)
    est.feature_mean_, est.feature_scale_ = mx, sx
    est.target_mean_, est.target_scale_ = my, sy
    est.mixing_ = float(getattr(result, "mixing", np.nan))
    est.n_entities_, est.n_events_ = est._sizes
    kept = {id(d) for d in draws}
    path = []
    for e in result.path:
        De, ce, se = user(e["D"], e["c"], sig(e.get("sigma")))
        path.append({"D": De, "c": ce, "counts": e["counts"], "labels": e["labels"],
                     "sigma": float(se), "kept": id(e) in kept,
                     "tau": None if e.get("tau") is None else _num(e["tau"]) * sy})
    est._path = path
    est.history_log_joint_ = np.asarray(result.log_joint, dtype=float)
    est.history_train_mse_ = np.asarray(result.train_mse, dtype=float) * sy**2
    change = np.full(len(result.history), np.nan)
    pc = np.asarray(getattr(result, "pred_change", []), dtype=float)
    idx = [i for i, r in enumerate(result.history) if chain.keep(int(r.round))][:len(pc)]
    change[idx] = pc[:len(idx)]
    est._pred_change = change
    est.history_ = HLCRHistory(result.history, est)
    scores = getattr(est, "_k_scores", None)
    est.k_scores_ = scores


def store_intercepts(est, result: HLCRFit, draws, chain: ChainSettings, sy: float) -> None:
    """``random_intercept_``, ``tau_``, ``draws_tau_`` (user's units; 0 without the random
    intercept), ``random_effects_`` and ``random_effects_var_``: every known pair's posterior
    mean intercept and its posterior variance (where the labels are unknown: 0 and the prior's
    ``tau_**2``, what ``predict`` and ``predict_interval`` then use)."""
    E = len(est.labels_)
    est.random_intercept_ = uses_random_intercept(est)
    if not est.random_intercept_:
        est.tau_, est.draws_tau_, est.random_effects_ = 0.0, np.zeros(len(draws)), np.zeros(E)
        est.random_effects_var_ = np.zeros(E)
        return

    def tau(v):
        return chain.tau if v is None or not np.isfinite(_num(v)) else _num(v)

    est.draws_tau_ = np.array([tau(d.get("tau")) for d in draws], dtype=float) * sy
    est.tau_ = float(np.sqrt(np.mean(est.draws_tau_ ** 2))) if chain.estimate_tau \
        else tau(result.tau) * sy
    re, var = result.random_effects, result.random_effects_var
    known = re is not None and len(re) == E
    est.random_effects_ = np.asarray(re) * sy if known else np.zeros(E)
    est.random_effects_var_ = (np.asarray(var) * sy**2 if known and var is not None
                               else np.full(E, est.tau_**2))


class HLCRHistory(History):
    """The engine's round records plus the per-iteration log joint, training MSE and the
    change of the running posterior predictive mean."""

    def __init__(self, records, est):
        super().__init__(records)
        self.log_joint = list(np.asarray(est.history_log_joint_, dtype=float))
        self.train_mse = list(np.asarray(est.history_train_mse_, dtype=float))
        self.pred_change = list(np.asarray(getattr(est, "_pred_change", []), dtype=float))

    def to_frame(self):
        df = super().to_frame()
        n = len(df)
        df["pred_change"] = (self.pred_change + [np.nan] * n)[:n]
        df["log_joint"] = (self.log_joint + [np.nan] * n)[:n]
        df["train_mse"] = (self.train_mse + [np.nan] * n)[:n]
        return df
