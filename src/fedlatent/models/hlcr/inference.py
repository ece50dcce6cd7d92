"""HLCR's inference: several chains, their diagnostics, an ArviZ-style ``summary()`` and
posterior predictive intervals.

Chains
    ``HLCR(n_chains=m)`` runs the chain of the fit (chain 0: its draws are ``draws_*``, what
    ``predict`` averages over, unchanged by the other chains) and ``m - 1`` more from other
    seeds on the same agents (each after a restart of the agents' labels), keeping only their
    retained draws. Labels are exchangeable, so each extra chain's clusters are matched to
    chain 0's (the assignment of least squared distance between the clusters' mean
    coefficients) before anything is compared.
Posterior of a coefficient
    Given the labels (and sigma, delta) a cluster's coefficients are Gaussian with mean
    ``H_k c_k`` and covariance ``H_k`` (Rao-Blackwellization), so their posterior is the equal
    mixture over the retained draws of those Gaussians: mean the mean of the conditional
    means, variance the mean of ``H_k`` plus the variance of the means, quantiles by bisection
    on the mixture's distribution function. R-hat and ESS are computed on the conditional means.
Posterior predictive of a new event
    At one draw, ``sum_k p(k) N(x^T H_k c_k + u_e, sigma^2 + x^T H_k x + v_e)`` (``p(k)`` the
    pair's cluster probabilities, as ``predict``), averaged over chain 0's retained draws. With
    the random intercept ``u_e`` is the entity's intercept (its BLUP, as ``predict``) and
    ``v_e`` its posterior variance: ``random_effects_var_`` for a known pair, ``sigma^2 g_e``
    from a new pair's events in ``context``, the whole ``tau^2`` for an entity never seen
    (without it both are 0).
"""

from __future__ import annotations

import warnings

import numpy as np
from scipy import special
from scipy.optimize import linear_sum_assignment

from ...engine.estimation.estimator import check_is_fitted
from ...engine.estimation.inference import Summary, sites_info
from .diagnostics import ess_bulk, ess_tail, rhat
from .model import _num
from .scaling import to_user_units

__all__ = ["INVARIANT", "RHAT_TOL", "HLCRInference", "chain_arrays", "extra_chains",
           "invariant_rhats", "mixture_quantiles", "rhat_threshold", "stack_chains"]

#: a chain whose largest R-hat exceeds this raises a ConvergenceWarning (Vehtari et al. 2021)
RHAT_TOL = 1.01


def mixture_quantiles(means: np.ndarray, sds: np.ndarray, weights: np.ndarray,
                      probs, n_iter: int = 100) -> np.ndarray:
    """Quantiles of the normal mixtures ``sum_j w[i, j] N(means[i, j], sds[i, j]^2)`` of every
    row ``i``, by bisection on the distribution function (vectorized over the rows);
    (n, len(probs))."""
    means, sds = np.asarray(means, dtype=np.float64), np.asarray(sds, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum(axis=1, keepdims=True)
    safe = np.maximum(sds, 1e-300)
    lo0 = (means - 12.0 * sds).min(axis=1)
    hi0 = (means + 12.0 * sds).max(axis=1)
    out = np.empty((means.shape[0], len(probs)))
    for j, prob in enumerate(probs):
        lo, hi = lo0.copy(), hi0.copy()
        for _ in range(n_iter):
            mid = 0.5 * (lo + hi)
            below = (w * special.ndtr((mid[:, None] - means) / safe)).sum(axis=1) < prob
            lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
        out[:, j] = 0.5 * (lo + hi)
    return out


def chain_arrays(draws, params0, chain, n_features: int, fit_intercept: bool) -> dict:
    """One chain's retained draws in the user's units: ``coef`` (T, K, F') the conditional
    posterior means (intercept last), ``coef_var`` (T, K, F') their conditional variances,
    ``share`` (T, K) the clusters' shares of the entities, ``sigma`` and ``delta`` (T,)."""
    from .fitting import _scaling

    Tm, my, sy, _, _ = _scaling(params0, n_features, fit_intercept)
    D = np.stack([np.asarray(d["D"], dtype=np.float64) for d in draws])
    c = np.stack([np.asarray(d["c"], dtype=np.float64) for d in draws])

    def value(v, fixed):
        return fixed if v is None or not np.isfinite(_num(v)) else _num(v)

    sig = np.array([value(d.get("sigma"), chain.sigma) for d in draws])
    if Tm is not None:
        D, c, sig = to_user_units(D, c, sig, Tm, my, sy)
    H = np.linalg.inv(D)
    counts = np.stack([np.asarray(d["counts"], dtype=np.float64) for d in draws])
    return {"coef": np.linalg.solve(D, c[..., None])[..., 0],
            "coef_var": np.diagonal(H, axis1=-2, axis2=-1).copy(),
            "share": counts / np.maximum(counts.sum(axis=1, keepdims=True), 1e-300),
            "sigma": np.asarray(sig, dtype=np.float64),
            "delta": np.array([value(d.get("delta"), chain.delta) for d in draws]),
            "tau": np.array([_get(d, "tau") for d in draws]) * sy,
            "log_joint": np.array([_get(d, "log_joint") for d in draws]),
            "train_mse": np.array([_get(d, "train_mse") for d in draws]) * sy**2}


def _get(draw: dict, name: str) -> float:
    """A draw's label-invariant summary (NaN where the solver did not record it)."""
    v = draw.get(name)
    return float("nan") if v is None else _num(v)


def stack_chains(chains: list[dict]) -> dict:
    """The chains' arrays stacked (n_chains, T, ...) on their common length, each extra
    chain's clusters matched to chain 0's."""
    T = min(len(ch["sigma"]) for ch in chains)
    ref = chains[0]["coef"][:T].mean(axis=0)  # (K, F')
    out = {k: [v[:T]] for k, v in chains[0].items()}
    for ch in chains[1:]:
        cost = ((ref[:, None, :] - ch["coef"][:T].mean(axis=0)[None]) ** 2).sum(axis=-1)
        _, perm = linear_sum_assignment(cost)
        for k, v in ch.items():
            out[k].append(v[:T][:, perm] if v.ndim > 1 else v[:T])
    return {k: np.stack(v) for k, v in out.items()}


def _restart(ctx) -> None:
    """The agents' labels back to unknown, before another chain on the same agents: in a
    simulation whose runtime holds the agents' states, set there (no message: the fit's
    traffic is the one chain's plus the other chains' rounds); else the restart query."""
    from ...engine.protocol.exchange import number
    from .model import RESTART_QUERY

    states = ctx.runtime.get_client_states()
    if states is not None and all("model/labels" in st for st in states.values()):
        ctx.runtime.set_client_states({c: {**st, "model/labels": np.full_like(
            np.asarray(st["model/labels"]), -1)} for c, st in states.items()})
        return
    ctx.ask(RESTART_QUERY, expect={"n_entities": number(low=1)}, what="restart (next chain)")


def _chain_setup(est, ctx, c: int) -> None:
    """Chain ``c + 1`` is a run of its own for the sites: a site with a policy answers each
    (run, exchange, round) once (:mod:`fedlatent.engine.site`), and this chain asks the same
    rounds again with other draws. So the clients are set up again under the chain's label
    (extra chains run without differential privacy or secure aggregation)."""
    from ...engine.privacy.disclosure import effective
    from ...engine.protocol.exchange import setup_clients

    setup_clients(ctx.runtime, ctx.model, effective(ctx.federation.disclosure, False),
                  run=f"{est._run_label(ctx.seed)}-chain{c + 1}")


def extra_chains(est, ctx, params0, options, chain, round_loop, n_chains: int) -> list[dict]:
    """The retained draws (:func:`chain_arrays`) of chains 1..n_chains-1, each from its own
    seed, with the solver of ``est``; the agents' states of chain 0 are put back after them
    (when the runtime can hand them over)."""
    from dataclasses import replace

    from .solvers import run_federated, run_gibbs

    out = []
    rt = ctx.runtime
    states = rt.get_client_states() if est.solver == "federated" else None
    for c in range(1, n_chains):
        seed = int(np.random.SeedSequence(int(ctx.seed), spawn_key=(0xC4A1, c))
                   .generate_state(1)[0])
        p0 = dict(params0)
        if "seed" in p0:
            p0["seed"] = np.array(float(seed % (2**52)))
        opts = replace(options, seed=seed, checkpoint=None, resume=False, callbacks=None,
                       description=f"{options.description} chain {c + 1}")
        cctx = replace(ctx, seed=seed)
        if est.solver == "gibbs":
            res = run_gibbs(est, cctx, opts, p0, chain)
        else:
            _chain_setup(est, ctx, c)
            _restart(cctx)
            with warnings.catch_warnings():
                from ...engine.errors import ConvergenceWarning

                warnings.simplefilter("ignore", ConvergenceWarning)
                res = run_federated(cctx, p0, opts, round_loop, chain)
        out.append(chain_arrays(res.draws, params0, chain, ctx.n_features, est.fit_intercept))
    if states is not None:
        rt.set_client_states(states)
    return out


def _row(draws: np.ndarray, lo: float, hi: float, mixture_var: np.ndarray | None = None):
    """mean, sd, the two quantiles, ess_bulk, ess_tail, r_hat of one scalar's draws
    (n_chains, T); with ``mixture_var`` the draws are conditional means of Gaussians."""
    flat = draws.ravel()
    if mixture_var is None:
        sd = float(np.std(flat, ddof=1)) if flat.size > 1 else 0.0
        q = np.quantile(flat, [lo, hi])
    else:
        sd = float(np.sqrt(np.mean(mixture_var) + np.var(flat)))
        q = mixture_quantiles(flat[None], np.sqrt(mixture_var.ravel())[None],
                              np.ones((1, flat.size)), [lo, hi])[0]
    return [float(flat.mean()), sd, float(q[0]), float(q[1]), ess_bulk(draws),
            ess_tail(draws), rhat(draws)]


def posterior_table(arrays: dict, names: list[str], prob: float = 0.9):
    """The ArviZ-style table of the stacked chains (:func:`stack_chains`): per cluster its
    entity ``share`` and coefficients (``names``: the features, then ``intercept``), then
    ``sigma`` and ``delta``; columns mean, sd, the equal-tailed ``prob`` interval, ess_bulk,
    ess_tail, r_hat."""
    import pandas as pd

    lo, hi = (1.0 - prob) / 2.0, (1.0 + prob) / 2.0
    rows, index = [], []
    K = arrays["coef"].shape[2]
    for k in range(K):
        index.append((str(k), "share"))
        rows.append(_row(arrays["share"][:, :, k], lo, hi))
        for j, name in enumerate(names):
            index.append((str(k), name))
            rows.append(_row(arrays["coef"][:, :, k, j], lo, hi, arrays["coef_var"][:, :, k, j]))
    for name in ("sigma", "delta"):
        index.append(("all", name))
        rows.append(_row(arrays[name], lo, hi))
    cols = ["mean", "sd", f"{100 * lo:g}%", f"{100 * hi:g}%", "ess_bulk", "ess_tail", "r_hat"]
    idx = pd.MultiIndex.from_tuples(index, names=["cluster", "parameter"])
    return pd.DataFrame(rows, index=idx, columns=cols)


def rhat_threshold(n_chains: int, n_draws: int, n_quantities: int = 1,
                   level: float = 0.01) -> float:
    """The R-hat above which chains are judged to disagree: :data:`RHAT_TOL`, or, when the
    chains are short, the value independent draws of this shape exceed with probability
    ``level`` (over ``n_quantities`` quantities, each with its bulk and tail R-hat).

    For ``M = 2 n_chains`` split chains of ``n = n_draws // 2`` independent normal draws the
    basic R-hat satisfies ``R^2 = (n - 1)/n + (B/W)/n`` with ``B/W ~ F(M - 1, M (n - 1))``;
    the bound is that at the ``1 - level / (2 n_quantities)`` quantile. It tends to 1 as the
    chains grow, so long runs are judged by the 1.01 of Vehtari et al. (2021); with the
    default 2 chains of 50 draws it is about 1.09 (independent draws exceed 1.01 in 38% of
    the cases: 1.01 presumes hundreds of draws).
    """
    from scipy import stats

    M, n = 2 * int(n_chains), int(n_draws) // 2
    if M < 2 or n < 2:
        return float("nan")
    q = float(stats.f.ppf(1.0 - level / (2.0 * max(int(n_quantities), 1)), M - 1, M * (n - 1)))
    return max(RHAT_TOL, float(np.sqrt((n - 1.0 + q) / n)))


#: the label-invariant quantities whose R-hat judges the chains (a mixture's cluster
#: parameters are identified only up to the matching of the clusters)
INVARIANT = ("log_joint", "train_mse", "sigma", "tau", "delta")


def invariant_rhats(arrays: dict) -> dict[str, float]:
    """R-hat of every label-invariant quantity the chains recorded (finite, not fixed)."""
    out = {}
    for name in INVARIANT:
        x = arrays.get(name)
        if x is not None and np.all(np.isfinite(x)):
            with np.errstate(divide="ignore", invalid="ignore"):  # a split half that is flat
                r = rhat(x)
            if np.isfinite(r):
                out[name] = r
    return out


def store_chains(est, result, params0, chain, extra: list[dict]) -> None:
    """``chains_`` (the stacked draws of every chain), ``rhat_max_`` (the summary table's
    largest R-hat, over the clusters holding at least one entity on average, and sigma,
    delta) and ``rhat_invariant_`` (the largest R-hat of the label-invariant quantities:
    the per-entity log joint, the training MSE, sigma, tau, delta). The latter judges the
    chains: above :func:`rhat_threshold` a ConvergenceWarning names the quantity and
    ``converged_`` is False (below it, True)."""
    first = chain_arrays(result.draws, params0, chain, int(est.n_features_in_),
                         est.fit_intercept)
    est.chains_ = stack_chains([first, *extra])
    est.n_chains_ = len(extra) + 1
    est.rhat_max_ = est.rhat_invariant_ = float("nan")
    if est.n_chains_ < 2:
        return
    r = posterior_table(est.chains_, _coef_names(est))["r_hat"]
    share = est.chains_["share"].mean(axis=(0, 1))
    empty = [str(k) for k in np.flatnonzero(share * max(int(est.n_entities_), 1) < 1.0)]
    r = r.drop(index=empty, level="cluster")  # a cluster of < 1 entity: its prior, no verdict
    if r.notna().any():
        est.rhat_max_ = float(r.max())
    inv = invariant_rhats(est.chains_)
    if not inv:
        return
    worst = max(inv, key=inv.get)
    est.rhat_invariant_ = inv[worst]
    limit = rhat_threshold(est.n_chains_, est.chains_["sigma"].shape[1], len(inv))
    est.converged_ = bool(est.rhat_invariant_ <= limit)
    if not est.converged_:
        from ...engine.errors import ConvergenceWarning

        warnings.warn(
            f"HLCR: the {est.n_chains_} chains disagree: R-hat of cluster all {worst!r} is "
            f"{est.rhat_invariant_:.3f} (> {RHAT_TOL}); raise max_rounds (and burn_in): "
            f"independent draws as many as these exceed {limit:.3f} in 1% of the cases",
            ConvergenceWarning, stacklevel=5)


def _coef_names(est) -> list[str]:
    names = [str(f) for f in est.feature_names_in_]
    return names + ["intercept"] if est.fit_intercept else names


class HLCRInference:
    """``summary()`` and ``predict_interval()`` for :class:`~fedlatent.models.hlcr.HLCR`."""

    def summary(self, prob: float = 0.9) -> Summary:
        """ArviZ-style posterior summary over every chain: per cluster its share of the
        entities and its coefficients (intercept last), then ``sigma`` (user's units) and
        ``delta`` (the fit's units); columns ``mean``, ``sd``, the equal-tailed ``prob``
        interval (``5%``, ``95%`` at 0.9), ``ess_bulk``, ``ess_tail``, ``r_hat`` (NaN for one
        chain or a fixed value). Clusters of the chains are matched to chain 0's. The header
        gives the marginal log-likelihood at the point estimate, its parameters, AIC and BIC
        (:mod:`.likelihood`; :meth:`compare_mixed` sets them beside the mixed model's).

        Returns
        -------
        Summary
        """
        check_is_fitted(self)
        prob = float(prob)
        if not 0.0 < prob < 1.0:
            raise ValueError(f"prob must be in (0, 1) (0.9 for 90% intervals), got {prob}")
        if getattr(self, "chains_", None) is None:
            raise ValueError("HLCR.summary needs the chains' draws, which save() does not "
                             "keep: call it on the fitted estimator")
        table = posterior_table(self.chains_, _coef_names(self), prob)
        info = {"Model": type(self).__name__, "Clusters": str(self.n_clusters_),
                "Entities": str(self.n_entities_), "Events": str(self.n_events_),
                "Chains": str(self.n_chains_),
                "Draws per chain": str(self.chains_["sigma"].shape[1]),
                "Solver": str(self.solver), "Largest R-hat": f"{self.rhat_max_:.4g}"}
        if getattr(self, "_runtime", None) is not None:  # the agents of the fit answer
            from .likelihood import information_criteria

            crit = information_criteria(self)
            info["Log-likelihood"] = f"{crit['loglik']:.6g} (at the point estimate)"
            info["Parameters"] = str(int(crit["n_parameters"]))
            info["AIC"], info["BIC"] = f"{crit['aic']:.6g}", f"{crit['bic']:.6g}"
        table_k = getattr(self, "selection_scores_", None)
        if table_k is not None and "skipped" in table_k:  # n_clusters="auto" (.waic)
            skipped = table_k[table_k["skipped"] != ""]["skipped"]
            info["K chosen by"] = ("WAIC (the smallest K within a standard error of the "
                                   "best), candidates screened with short chains")
            info["Candidates skipped"] = "; ".join(
                f"K={k}: {why}" for k, why in skipped.items()) or "none"
        info.update(sites_info(self))
        return Summary(f"{type(self).__name__} posterior", info, table)

    def compare_mixed(self, fd):
        """This fit against its one-cluster model, the linear mixed model (fitted with the same
        settings on ``fd``, the data of this fit): log-likelihood at the point estimate,
        parameters, AIC, BIC, WAIC's elpd and the likelihood-ratio statistic, one row per
        ``n_clusters`` (:func:`.waic.compare_with_mixed_model`)."""
        from .waic import compare_with_mixed_model

        check_is_fitted(self)
        return compare_with_mixed_model(self, fd)

    def predict_interval(self, X, agents, entities, alpha: float = 0.1, context=None,
                         unknown: str = "warn") -> np.ndarray:
        """Central ``1 - alpha`` posterior predictive intervals of new events, shape (n, 2):
        quantiles of the mixture over chain 0's retained draws and the clusters of
        ``N(x^T H_k c_k + u_e, sigma^2 + x^T H_k x + v_e)`` weighted by the pair's cluster
        probabilities (``context``, ``unknown``: as :meth:`predict`); ``u_e``, ``v_e``: the
        entity intercept's posterior mean and variance with the random intercept (module
        docstring; the prior's 0 and ``tau^2`` for an entity never seen), else 0."""
        from ...engine.estimation.inference import _check_alpha

        check_is_fitted(self)
        alpha = _check_alpha(alpha)
        Xa, pairs, ctx = self._prepare(X, agents, entities, "mean", unknown, context)
        mus, sds, ws = [], [], []
        for t in range(len(self.draws_sigma_)):
            D, c = self.draws_precisions_[t], self.draws_c_[t]
            sig = float(self.draws_sigma_[t])
            ws.append(self._cluster_proba(pairs, ctx, D, c, self.draws_counts_[t],
                                          self.draws_labels_[t], sig,
                                          self._rho(sig, self.draws_tau_[t])))
            H = np.linalg.inv(D)
            mu = Xa @ np.linalg.solve(D, c[..., None])[..., 0].T
            rho = self._rho(sig, self.draws_tau_[t])
            var = sig**2 + np.einsum("nf,kfg,ng->nk", Xa, H, Xa)
            if rho:  # the entity's intercept: its level and its uncertainty
                mu = mu + self._entity_level(pairs, ctx, D, c, rho)
                var = var + self._entity_var(pairs, ctx, sig, rho)[:, None]
            mus.append(mu)
            sds.append(np.sqrt(var))
        return mixture_quantiles(np.hstack(mus), np.hstack(sds), np.hstack(ws),
                                 [alpha / 2.0, 1.0 - alpha / 2.0])
