"""HLCR's marginal log-likelihood at its point estimate and information criteria, for
``summary()`` and the comparison with its one-cluster model (the linear mixed model,
:func:`.waic.compare_with_mixed_model`).

At the point estimate (the clusters' posterior mean coefficients ``w_k`` with the intercept,
their smoothed shares ``psi_k = (N_k + alpha / K) / (N + alpha)``, ``sigma`` and ``tau``) the
marginal likelihood of an entity's events, its label and its random intercept integrated out,
is the Gaussian mixture

    p(y_e) = sum_k psi_k N(y_e; X_e w_k, sigma^2 I + tau^2 1 1^T)

computed by each agent from its entities' statistics (:func:`.waic.pointwise_loglik` with one
draw: the WAIC query with the point as its only draw, so only the agent's sum crosses). With one
cluster it is the random-intercept linear mixed model's likelihood (statsmodels' MixedLM fitted
by maximum likelihood, at the same fixed effects and variance components). The parameters
counted: ``K F`` coefficients (the intercept included), ``K - 1`` shares, ``sigma`` and ``tau``
(when the random intercept is fitted) as MixedLM counts its fixed effects, the random intercept's
variance and the scale; BIC's ``n`` is the number of events, as MixedLM's.
"""

from __future__ import annotations

import numpy as np

__all__ = ["WAIC_QUERY", "information_criteria", "point_loglik"]

#: the agents' WAIC sums over their entities (a candidate K's score; with the point estimate as
#: its only draw, the log-likelihood)
WAIC_QUERY = "waic"


def _point_payload(est) -> dict[str, np.ndarray]:
    """The point estimate as a WAIC payload of one draw (user's units, intercept last)."""
    K = int(est.n_clusters_)
    W = np.column_stack([est.coef_, est.intercept_]) if est.fit_intercept else est.coef_
    N = max(float(est.n_entities_), 1.0)
    counts = np.asarray(est.cluster_counts_, dtype=np.float64)
    psi = (counts / max(counts.sum(), 1e-300) * N + est.alpha / K) / (N + est.alpha)
    return {"params/W": W[None], "params/logpi": np.log(psi)[None],
            "params/sigma": np.array([float(est.sigma_)]),
            "params/tau": np.array([float(getattr(est, "tau_", 0.0) or 0.0)])}


def point_loglik(est) -> tuple[float, float]:
    """The marginal log-likelihood of every entity's events at the point estimate, summed by
    the agents on the fit's runtime, and the number of events behind it (cached)."""
    from ...engine.estimation.estimator import FitContext
    from ...engine.protocol.exchange import number, setup_clients

    payload = _point_payload(est)
    key = b"".join(np.asarray(v, dtype=np.float64).tobytes() for v in payload.values())
    cached = getattr(est, "_loglik_cache", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    rt = getattr(est, "_runtime", None)
    if rt is None:
        raise ValueError("HLCR's log-likelihood is computed by the agents of the fit: call it "
                         "on the fitted estimator (a loaded model has no agents)")
    from ...engine.estimation.inference import fit_sites

    rt = fit_sites(est, rt)  # the sites the fit was fitted on
    model = est._model_for(int(est.n_features_in_), int(est.n_clusters_))
    setup_clients(rt, model, est._federation().disclosure)
    rep = FitContext(rt, model, None, 0).ask(
        WAIC_QUERY, payload, what="log-likelihood (summary)",
        expect={"elpd": number(), "elpd_sq": number(low=0), "p_waic": number(),
                "n_entities": number(low=0), "n_events": number(low=0)})
    out = (sum(float(r["elpd"]) for r in rep.values()),
           sum(float(r["n_events"]) for r in rep.values()))
    est._loglik_cache = (key, out)
    return out


def n_parameters(est) -> int:
    """Coefficients (intercept included), shares, sigma, tau (module docstring)."""
    K = int(est.n_clusters_)
    F = int(est.n_features_in_) + int(bool(est.fit_intercept))
    return K * F + (K - 1) + 1 + int(bool(getattr(est, "random_intercept_", False)))


def information_criteria(est) -> dict[str, float]:
    """``loglik``, ``n_parameters``, ``aic`` and ``bic`` (``n`` the events) at the point."""
    ll, n = point_loglik(est)
    k = n_parameters(est)
    return {"loglik": ll, "n_parameters": float(k), "aic": -2.0 * ll + 2.0 * k,
            "bic": -2.0 * ll + k * np.log(max(n, 1.0)), "n_events": n}
