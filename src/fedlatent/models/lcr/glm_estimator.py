"""The estimator's side of the generalized latent class regression (families, offsets, trials,
concomitant variables): target checks, the start, the fitted attributes and the mean response.
Small functions :class:`~fedlatent.models.lcr.estimator.LatentClassRegression` calls, so that its
Gaussian path stays as it was."""

from __future__ import annotations

import numpy as np

from ...engine.contract.model import Capabilities, Params
from .families import glm_mean
from .glm_model import LCRGLMModel

__all__ = ["glm_capabilities", "glm_fitted_params", "glm_predict_mean", "glm_start",
           "glm_store", "glm_target_problem"]


def glm_capabilities(family: str) -> Capabilities:
    """Secure aggregation (every sum through the engine), no differential privacy yet."""
    why = ("a Poisson count's gradient (y - mu) x and Hessian mu x x^T grow without bound with "
           "mu = exp(x^T beta)" if family == "poisson" else
           "its Newton statistics (gradients and Hessians of the components and of the "
           "concomitant logit) have no per-record bound implemented yet")
    return Capabilities(secure_aggregation=True, differential_privacy=False,
                        missing_target=True,
                        privacy_refusal=f"{why}; fit without privacy, or the Gaussian family "
                                        "with constant weights, no offset and no trials")


def glm_target_problem(family: str, cid: str, cd, target: str, roles,
                       names) -> str | None:
    """What is wrong with one client's target for a Poisson or binomial family (None when it
    is usable): counts >= 0; successes in ``[0, trials]`` with trials > 0 (0/1 without a
    trials column). Rows whose target is missing are left out, not checked."""
    y = np.asarray(cd.y, dtype=np.float64)
    live = ~np.isnan(y)
    y = y[live]
    if family == "poisson":
        bad = y < 0
        if bad.any():
            return (f"client {cid!r}: target {target!r} has {int(bad.sum())} negative values; "
                    "a Poisson target is a count >= 0")
        return None
    m = np.ones_like(y) if roles.trials is None else np.asarray(cd.X, float)[live, roles.trials]
    tname = "1 (no trials column)" if roles.trials is None else repr(names[roles.trials])
    if np.any(~(m > 0)):
        return (f"client {cid!r}: trials column {tname} has {int(np.sum(~(m > 0)))} values "
                "that are not > 0; every row needs at least one trial")
    bad = (y < 0) | (y > m)
    if bad.any():
        return (f"client {cid!r}: target {target!r} has {int(bad.sum())} values outside "
                f"[0, trials] (trials: {tname}); a binomial target counts successes")
    return None


def glm_start(model: LCRGLMModel, params: Params) -> Params:
    """The generalized model's start from the Gaussian start on the working response
    (:meth:`LCRGLMModel.responsibility_stats`): the lines as linear predictors; no noise
    variance for the Poisson and binomial families; the concomitant logit at the start's
    weights (intercepts ``log(w_k / w_0)``, slopes 0)."""
    out = {k: np.array(v, dtype=np.float64, copy=True) for k, v in params.items()}
    if not model.gaussian:
        out.pop("noise_variance", None)
    c = model.n_concomitant
    if c:
        w = np.maximum(out["weights"], 1e-300)
        gamma = np.zeros((model.K - 1, c))
        gamma[:, -1] = np.log(w[1:] / w[0])
        out["gamma"] = gamma
    return out


def glm_store(est, params: Params) -> None:
    """``concomitant_coef_`` (K, c) and ``concomitant_intercept_`` (K,), class 0's zeros
    (None without concomitant variables)."""
    gamma = params.get("gamma")
    if gamma is None:
        est.concomitant_coef_ = est.concomitant_intercept_ = None
        return
    g = np.vstack([np.zeros((1, gamma.shape[1])), np.asarray(gamma, dtype=np.float64)])
    est.concomitant_coef_, est.concomitant_intercept_ = g[:, :-1], g[:, -1]


def glm_fitted_params(est, params: Params) -> Params:
    """``params`` with the fitted concomitant ``gamma`` (K - 1, c + 1) and without the NaN
    noise variance of a Poisson or binomial fit."""
    out = dict(params)
    if est.family != "gaussian":
        out.pop("noise_variance", None)
    coef = getattr(est, "concomitant_coef_", None)
    if coef is not None:
        out["gamma"] = np.hstack([coef, est.concomitant_intercept_[:, None]])[1:]
    return out


def glm_predict_mean(model: LCRGLMModel, params: Params, X: np.ndarray,
                     components: bool = False) -> np.ndarray:
    """The mean response ``sum_k pi_k(z) E_k[y | x]`` (n,) of checked rows ``X``, or with
    ``components`` each component's ``E_k[y | x]`` (n, K): the line (Gaussian), ``exp(eta)``
    (Poisson), ``trials * expit(eta)`` (binomial), offsets included."""
    rp = model.parts(X, np.zeros(X.shape[0]))
    eta = rp.Xt @ np.asarray(params["beta"], dtype=np.float64).T + rp.offset[:, None]
    means = eta if model.gaussian else glm_mean(model.family, eta, rp.trials)
    if components:
        return means
    return (np.exp(model.log_prior(params, rp)) * means).sum(axis=1)
