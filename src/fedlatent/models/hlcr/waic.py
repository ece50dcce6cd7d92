"""Choosing HLCR's K at about the cost of a few fits of one K (issues 24, 40 and 42), and the
WAIC of a fit.

``HLCR(n_clusters="auto")`` with the entity random intercept (the default) screens the K of
``n_clusters_range`` smallest first (:func:`fit_by_waic`): each candidate runs one chain of half
``max_rounds``, starting where the candidate before it ended (its clusters, the largest split in
two: :func:`warm_start`), and is scored by BIC at its point estimate (the marginal
log-likelihood of :mod:`.likelihood`, ``n`` the events, as flexmix and mclust choose mixture
sizes) and by WAIC (Watanabe 2010; Vehtari, Gelman and Gabry 2017; reported). The scan stops
once :data:`PATIENCE` candidates in a row have a larger BIC than the best (they are not expected
to win). The lowest BIC wins and is fitted with the full chains from where its screening ended.
No candidate is skipped because its chains disagree: on mlmRev's Chem97 the former procedure
(every K from the prior, two chains of 400 rounds, non-mixing candidates skipped, WAIC) skipped
every K > 1 and chose K = 1 silently. WAIC does not choose: a short chain that stays on its
labels understates WAIC's effective number of parameters (on mlmRev's Exam 4 for K = 2, 4 and 5
against 14-29 in chains ten times longer), so it favoured clusters a longer run rejects; the
point estimate's log-likelihood moves little between the two (under 1 nat). The fit's own
ConvergenceWarning (its two full chains) is the fit's; a user who fixes a K whose chains do not
mix still gets it.

The unit of the WAIC is an entity (its events are dependent through its label and its
intercept): at every retained draw ``s`` of every chain, each agent computes for each of its
entities

    log p(y_e | theta_s) = log sum_k psi_sk N(y_e; X_e w_sk, sigma_s^2 I + tau_s^2 1 1^T)

with ``w_sk`` the cluster's conditional posterior mean at the draw (the draws keep the
coefficients' conditional Gaussians, not a coefficient draw), ``psi_sk = (N_sk + alpha/K) /
(N + alpha)`` the global cluster shares, the label summed out (so the clusters of different
chains need no matching), the Gaussian's quadratic form and log determinant in closed form from
the entity's statistics (:mod:`.random_intercept`). Only the agent's sums of ``elpd_e`` (the
entity's ``lppd - p_waic``), of their squares, of ``p_waic`` and the counts cross.

References
----------
Watanabe, "Asymptotic equivalence of Bayes cross validation and widely applicable information
criterion in singular learning theory", JMLR 11 (2010). Vehtari, Gelman, Gabry, "Practical
Bayesian model evaluation using leave-one-out cross-validation and WAIC", Statistics and
Computing 27 (2017).
"""

from __future__ import annotations

import numpy as np

from .likelihood import WAIC_QUERY, information_criteria

__all__ = ["WAIC_PAIRS_QUERY", "WAIC_QUERY", "compare_with_mixed_model", "entity_elpd",
           "entity_waic_pairs", "entity_waic_terms", "fit_by_waic", "pointwise_loglik",
           "waic_selection"]

#: the agents' sums for the standard errors of the candidates' WAIC differences
WAIC_PAIRS_QUERY = "waic_pairs"


def pointwise_loglik(XtX, Xty, yty, n, W, logpi, sigma, tau) -> np.ndarray:
    """Every entity's log density at every draw, the label summed out (module docstring).

    Parameters
    ----------
    XtX, Xty, yty, n : entity statistics in the user's units, (E, F, F), (E, F), (E,), (E,)
        With the intercept column last when ``tau`` is not 0.
    W : ndarray (S, K, F)
        The clusters' coefficients at each draw.
    logpi : ndarray (S, K)
        Log cluster shares at each draw.
    sigma, tau : ndarrays (S,)
        Noise and random-intercept sd at each draw (tau 0: no random intercept).

    Returns
    -------
    ndarray (E, S)
    """
    W = np.asarray(W, dtype=np.float64)
    sig2 = np.asarray(sigma, dtype=np.float64) ** 2
    rho = np.asarray(tau, dtype=np.float64) ** 2 / sig2
    n = np.asarray(n, dtype=np.float64)
    sse = (yty[:, None, None] - 2.0 * np.einsum("skf,ef->esk", W, Xty)
           + np.einsum("skf,efg,skg->esk", W, XtX, W))
    g = rho[None, :] / (1.0 + n[:, None] * rho[None, :])  # (E, S)
    r1 = Xty[:, -1][:, None, None] - np.einsum("ef,skf->esk", XtX[:, :, -1], W)
    quad = np.maximum(sse - g[:, :, None] * r1**2, 0.0) / sig2[None, :, None]
    logdet = (n[:, None] * np.log(2.0 * np.pi * sig2)[None, :]
              + np.log1p(n[:, None] * rho[None, :]))  # (E, S)
    comp = np.asarray(logpi, dtype=np.float64)[None] - 0.5 * quad
    top = comp.max(axis=2)
    return top + np.log(np.exp(comp - top[:, :, None]).sum(axis=2)) - 0.5 * logdet


def entity_elpd(XtX, Xty, yty, n, W, logpi, sigma, tau) -> tuple[np.ndarray, np.ndarray]:
    """Every entity's ``elpd_e = lppd_e - p_e`` and ``p_e`` (the variance over the draws of
    its log density), shapes (E,), (E,)."""
    ll = pointwise_loglik(XtX, Xty, yty, n, W, logpi, sigma, tau)
    S = ll.shape[1]
    top = ll.max(axis=1)
    lppd = top + np.log(np.exp(ll - top[:, None]).sum(axis=1)) - np.log(S)
    p = ll.var(axis=1, ddof=1) if S > 1 else np.zeros(len(lppd))
    return lppd - p, p


def entity_waic_terms(XtX, Xty, yty, n, W, logpi, sigma, tau) -> dict[str, float]:
    """One agent's WAIC sums over its entities: ``elpd`` (sum of ``elpd_e``), ``elpd_sq`` (of
    their squares), ``p_waic`` (of ``p_e``), ``n_entities`` and ``n_events``."""
    elpd, p = entity_elpd(XtX, Xty, yty, n, W, logpi, sigma, tau)
    return {"elpd": float(elpd.sum()), "elpd_sq": float((elpd**2).sum()),
            "p_waic": float(p.sum()), "n_entities": float(len(elpd)),
            "n_events": float(np.asarray(n, dtype=np.float64).sum())}


def entity_waic_pairs(XtX, Xty, yty, n, params: dict) -> dict[str, np.ndarray]:
    """One agent's sums for the noise of the differences between ``m`` candidates (their
    draws ``W0, logpi0, sigma0, tau0``, ``W1``, ... in ``params``): ``elpd`` (m,) the sums of
    every candidate's ``elpd_e`` and ``sq`` (m * m,) those of ``(elpd_e(i) - elpd_e(j))^2``."""
    m = int(round(float(np.asarray(params["m"]).reshape(-1)[0])))
    M = np.stack([entity_elpd(XtX, Xty, yty, n, params[f"W{i}"], params[f"logpi{i}"],
                              params[f"sigma{i}"], params[f"tau{i}"])[0] for i in range(m)],
                 axis=1)  # (E, m)
    d = M[:, :, None] - M[:, None, :]
    return {"elpd": M.sum(axis=0), "sq": (d**2).sum(axis=0).reshape(-1)}


def waic_payload(est) -> dict[str, np.ndarray]:
    """The draws of every chain of a fitted HLCR (user's units) as the WAIC query's payload."""
    ch = est.chains_
    C, T, K, F = ch["coef"].shape
    N = max(float(est.n_entities_), 1.0)
    psi = (ch["share"].reshape(C * T, K) * N + est.alpha / K) / (N + est.alpha)
    tau = np.nan_to_num(ch["tau"].reshape(C * T), nan=0.0)
    return {"params/W": ch["coef"].reshape(C * T, K, F), "params/logpi": np.log(psi),
            "params/sigma": ch["sigma"].reshape(C * T), "params/tau": tau}


def waic_score(est, fd) -> dict[str, float]:
    """The selection's score of a fitted candidate: ``elpd_waic`` (its total over the
    entities, user's units), ``se`` (Vehtari et al.'s ``sqrt(E var(elpd_e))``), ``p_waic``,
    ``elpd_per_event`` and its chains' ``rhat_invariant``; asked of the agents on the
    candidate's own runtime."""
    from ...engine.estimation.estimator import FitContext
    from ...engine.protocol.exchange import number, setup_clients

    model = est._waic_model = est._make_model(fd)
    rt = est._runtime
    setup_clients(rt, model, est._federation().disclosure)
    rep = FitContext(rt, model, None, 0).ask(
        WAIC_QUERY, waic_payload(est), what="WAIC (choosing K)",
        expect={"elpd": number(), "elpd_sq": number(low=0), "p_waic": number(),
                "n_entities": number(low=0), "n_events": number(low=0)})
    tot = {k: sum(float(r[k]) for r in rep.values())
           for k in ("elpd", "elpd_sq", "p_waic", "n_entities", "n_events")}
    E = max(tot["n_entities"], 1.0)
    var = max(tot["elpd_sq"] / E - (tot["elpd"] / E) ** 2, 0.0)
    return {"elpd_waic": tot["elpd"], "se": float(np.sqrt(E * var)), "p_waic": tot["p_waic"],
            "elpd_per_event": tot["elpd"] / max(tot["n_events"], 1.0),
            "n_events": tot["n_events"], "rhat_invariant": float(est.rhat_invariant_)}


def waic_selection(est):
    """The :class:`~fedlatent.engine.contract.selection.Selection` of ``n_clusters="auto"``
    with the random intercept: every K of ``n_clusters_range``, by ``elpd_waic``."""
    from ...engine.contract.selection import Selection

    lo, hi = (int(v) for v in est.n_clusters_range)
    return Selection("n_clusters", tuple(range(lo, hi + 1)), "elpd_waic", waic_score,
                     lower_is_better=False)


def pair_se(fitted: dict, ks: list[int]) -> np.ndarray:
    """Standard errors of the elpd differences of the candidates ``ks`` (m, m): the agents'
    paired sums (:func:`entity_waic_pairs`) on the runtime of the first, ``sqrt(E var_e(
    elpd_e(i) - elpd_e(j)))`` (Vehtari et al. 2017, eq. 24)."""
    from ...engine.estimation.estimator import FitContext
    from ...engine.protocol.exchange import array, setup_clients

    first = fitted[ks[0]]
    payload = {"params/m": np.array(float(len(ks)))}
    for i, k in enumerate(ks):
        payload.update({f"{key}{i}": v for key, v in waic_payload(fitted[k]).items()})
    model = first._waic_model
    setup_clients(first._runtime, model, first._federation().disclosure)
    m = len(ks)
    rep = FitContext(first._runtime, model, None, 0).ask(
        WAIC_PAIRS_QUERY, payload, what="WAIC differences (choosing K)",
        expect={"elpd": array(m), "sq": array(m * m, low=0)})
    tot = sum(np.asarray(r["elpd"], dtype=np.float64) for r in rep.values())
    sq = sum(np.asarray(r["sq"], dtype=np.float64) for r in rep.values()).reshape(m, m)
    E = max(float(first.n_entities_), 1.0)
    diff = tot[:, None] - tot[None, :]
    return np.sqrt(np.maximum(sq - diff**2 / E, 0.0))


def _choice(table, fitted: dict) -> int:
    """The smallest eligible K (not skipped, finite WAIC) whose elpd is within one standard
    error of its difference (:func:`pair_se`) of the best eligible one; among all finite
    ones when every candidate was skipped."""
    crit = table["elpd_waic"].to_numpy(dtype=np.float64)
    finite = np.isfinite(crit)
    ok = finite & (table["skipped"].to_numpy() == "")
    if not ok.any():
        ok = finite
    ks = [int(k) for k, good in zip(table.index, ok) if good]
    vals = np.array([table.loc[k, "elpd_waic"] for k in ks], dtype=np.float64)
    best = int(np.argmax(vals))
    se = pair_se(fitted, ks) if len(ks) > 1 else np.zeros((1, 1))
    table["se_diff"] = np.nan
    for i, k in enumerate(ks):
        table.loc[k, "se_diff"] = se[i, best]
    return min(k for i, k in enumerate(ks) if vals[i] >= vals[best] - se[i, best])


#: the candidates' screening chains are this fraction of ``max_rounds`` (at least
#: :data:`MIN_SCREEN` rounds): each candidate starts where the one before it ended
SCREEN_FRACTION = 0.5
MIN_SCREEN = 20
#: chains per screened candidate: one (its WAIC needs draws, not a verdict on mixing)
SCREEN_CHAINS = 1
#: the scan of K stops after this many candidates in a row that do not beat the best so far
#: by a standard error of their difference (they cannot win: the choice is the smallest K within
#: a standard error of the best)
PATIENCE = 2


def warm_start(params: dict, previous: dict, K: int) -> dict:
    """A start for ``K`` clusters from another fit's final parameters (fit units): the same
    clusters, or with ``K`` one more, its largest cluster split in two halves of its data (a
    split move: both halves alike, the agents' next draws separate them where the data
    differ); the scales (sigma, delta, tau) carried over. ``params`` gives everything else
    (the standardization, the seed and step of the server's draws)."""
    D = np.asarray(previous["D"], dtype=np.float64)
    c = np.asarray(previous["c"], dtype=np.float64)
    counts = np.asarray(previous["counts"], dtype=np.float64)
    K0, F = c.shape
    if K not in (K0, K0 + 1):
        raise ValueError(f"a warm start goes from K to K or K + 1 clusters, not {K0} to {K}")
    if K == K0 + 1:
        delta = float(np.asarray(previous.get("delta", params.get("delta", 1.0))))
        prior = np.eye(F) / delta**2
        k = int(np.argmax(counts))
        half = prior + 0.5 * (D[k] - prior)
        D = np.concatenate([D, half[None]])
        D[k] = half
        c = np.concatenate([c, 0.5 * c[k][None]])
        c[k] = 0.5 * c[k]
        counts = np.concatenate([counts, [0.5 * counts[k]]])
        counts[k] *= 0.5
    from .math import posterior_means

    out = dict(params)
    out.update(D=D, c=c, counts=counts, coef=posterior_means(D, c))
    for key in ("sigma", "delta", "tau", "train_mse"):
        if key in previous and key in params:
            out[key] = np.array(previous[key], copy=True)
    return out


def _screen_rounds(est) -> int:
    return max(int(round(est.max_rounds * SCREEN_FRACTION)), MIN_SCREEN)


def _row(cand, fd) -> dict:
    """A screened candidate's row of ``selection_scores_``: its BIC (the criterion), the
    log-likelihood and parameters behind it (:mod:`.likelihood`), its WAIC and chain."""
    crit = information_criteria(cand)
    got = waic_score(cand, fd)
    return {"bic": crit["bic"], "loglik": crit["loglik"],
            "n_parameters": int(crit["n_parameters"]), **got, "n_iter": int(cand.n_iter_),
            "converged": bool(cand.converged_), "error": "", "skipped": ""}


def _cannot_win(table_rows: list, fitted: dict, ks: list[int]) -> bool:
    """Whether the last :data:`PATIENCE` candidates each have a larger BIC than the best so
    far (they, and larger K, are not expected to win)."""
    bic = np.array([r["bic"] for r in table_rows])
    best = int(np.argmin(bic))
    return len(ks) - 1 - best >= PATIENCE


def _screen(est, fd, candidates, fit_one):
    """The candidates, smallest first, each from where the one before ended (:func:
    `warm_start`) with :func:`_screen_rounds` rounds, until they cannot win
    (:func:`_cannot_win`). Returns the rows, the fitted candidates and the K not run."""
    from sklearn.base import clone

    rows, fitted, ks, previous = [], {}, [], None
    for K in candidates:
        cand = clone(est).set_params(n_clusters=int(K), max_rounds=_screen_rounds(est),
                                     burn_in=None, thin=None, n_chains=SCREEN_CHAINS)
        if previous is not None and int(K) in (previous[0], previous[0] + 1):
            cand._warm = previous[1]
        fit_one(cand, fd)
        rows.append(_row(cand, fd))
        fitted[int(K)] = cand
        ks.append(int(K))
        previous = (int(K), cand._final_params)
        if _cannot_win(rows, fitted, ks):
            break
    return rows, fitted, [int(k) for k in candidates if int(k) not in fitted]


def fit_by_waic(est, fd, selection, *, runtime, progress, callbacks, checkpoint, resume,
                final_sites=None):
    """HLCR's ``fit`` with ``n_clusters="auto"`` and the random intercept, at about the cost of
    a few fits of one K (issue 40, item 5):

    1. Screening: the candidates of ``n_clusters_range``, smallest first, each one chain of
       half ``max_rounds`` starting where the one before ended (its clusters, the largest
       split in two: :func:`warm_start`), scored by BIC at the point estimate and by WAIC;
       the scan stops once :data:`PATIENCE` candidates in a row have a larger BIC than the
       best.
    2. The choice: the lowest BIC. No candidate is skipped for its chains.
    3. The fit: the chosen K with the full ``max_rounds`` and chains, from where its
       screening chain ended, on ``final_sites(K)`` (``(fd, runtime)`` of the sites admitting
       it; None: ``fd``, ``runtime``); its ConvergenceWarning, if its chains disagree, is the
       fit's.

    ``est`` takes the fit's attributes, ``n_clusters_`` and ``selection_scores_`` (per
    candidate ``bic``, ``loglik``, ``n_parameters``, the WAIC columns and ``se_diff``, the
    standard error of its WAIC difference with the chosen K; candidates not run have NaN and
    say why in ``skipped``). Returns ``est``."""
    import warnings

    import pandas as pd
    from sklearn.base import clone

    from ...engine.contract.selection import adopt_candidate, refuse_checkpoint
    from ...engine.errors import ConvergenceWarning

    refuse_checkpoint("n_clusters", checkpoint, resume)

    def fit_one(cand, data):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            cand.fit(data, runtime=runtime, progress=progress, callbacks=callbacks)
        return cand

    rows, fitted, not_run = _screen(est, fd, selection.candidates, fit_one)
    ks = list(fitted)
    best = ks[int(np.argmin([r["bic"] for r in rows]))]
    se = pair_se(fitted, ks)[:, ks.index(best)] if len(ks) > 1 else np.zeros(1)
    for r, s in zip(rows, se):  # the WAIC differences' noise, for the reader
        r["se_diff"] = float(s)
    rows += [{"bic": np.nan, "n_iter": 0, "converged": False, "error": "", "skipped": (
        f"not run: the {PATIENCE} candidates before it had a larger BIC than K={best}")}
        for _ in not_run]
    table = pd.DataFrame(rows, index=pd.Index(ks + not_run, name="n_clusters")).sort_index()
    final = clone(est).set_params(n_clusters=best)
    final._warm = fitted[best]._final_params
    data, rt = (fd, runtime) if final_sites is None else final_sites(best)
    final.fit(data, runtime=rt, progress=progress, callbacks=callbacks)
    adopt_candidate(est, final, "n_clusters", table)
    return est


def compare_with_mixed_model(est, fd):
    """This fit against its one-cluster model (the linear mixed model with the random
    intercept), fitted with the same settings on ``fd``: a DataFrame indexed by ``n_clusters``
    with ``loglik``, ``n_parameters``, ``aic``, ``bic``, ``elpd_waic`` and ``lr_statistic``
    (``2 (loglik_K - loglik_1)``; its chi-square reference does not apply to a mixture's
    number of components, so read AIC, BIC and WAIC)."""
    import pandas as pd
    from sklearn.base import clone

    fits = {int(est.n_clusters_): est}
    if 1 not in fits:
        one = clone(est).set_params(n_clusters=1)
        fits[1] = one.fit(fd)
    rows = {}
    for k in sorted(fits):
        crit = information_criteria(fits[k])
        crit["elpd_waic"] = waic_score(fits[k], fd)["elpd_waic"]
        rows[k] = crit
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "n_clusters"
    table["lr_statistic"] = 2.0 * (table["loglik"] - table.loc[1, "loglik"])
    return table[["loglik", "n_parameters", "aic", "bic", "elpd_waic", "lr_statistic"]]
