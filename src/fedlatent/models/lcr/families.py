"""Generalized linear components for the latent class regression: log-densities, means and the
statistics of one federated Newton step, as pure functions (flexmix's ``FLXMRglm``).

A component ``k`` of family ``f`` has the linear predictor ``eta_ik = x~_i^T beta_k + o_i``
(``o``: an offset, the log exposure of a Poisson count) and the canonical link:

==========  ======================================  =========================  ===============
family      log-density of ``y`` (trials ``m``)     mean ``mu``                weight ``v``
==========  ======================================  =========================  ===============
poisson     ``y eta - e^eta - log y!``              ``e^eta``                  ``mu``
binomial    ``log C(m, y) + y eta - m log(1+e^eta)``  ``m expit(eta)``           ``mu (1 - mu/m)``
==========  ======================================  =========================  ===============

With a canonical link the score of ``beta_k`` is ``(y - mu) x~`` and minus its Hessian
``v x~ x~^T`` (the observed and expected information agree). EM's M-step for a component is a
weighted GLM fit; one Newton (IRLS) step of it from the broadcast ``beta_k`` needs only the
responsibility-weighted sums

    grad_k = sum_i r_ik (y_i - mu_ik) x~_i,        hess_k = sum_i r_ik v_ik x~_i x~_i^T

and the server's step ``beta_k + hess_k^-1 grad_k`` is the same from sums or means. The sums hold
only at the ``beta_k`` they were computed at (a generalized EM: one Newton step a round).

References
----------
McCullagh, Nelder (1989), "Generalized Linear Models", 2nd ed., ch. 2 (IRLS) and 4, 6
(binomial, Poisson); Leisch (2004), "FlexMix", Journal of Statistical Software 11(8);
Gruen, Leisch (2008), "FlexMix version 2", Journal of Statistical Software 28(4) (``FLXMRglm``).
"""

from __future__ import annotations

import numpy as np
from scipy import special

from .math import solve_weighted_least_squares

__all__ = ["FAMILIES", "GLM_FAMILIES", "glm_log_density", "glm_mean", "glm_newton_step",
           "glm_statistics", "glm_stat_shapes", "glm_weight", "working_response"]

#: the families ``LatentClassRegression(family=...)`` takes
FAMILIES = ("gaussian", "poisson", "binomial")
#: the families whose components take Newton steps (the Gaussian's M-step is closed form)
GLM_FAMILIES = ("poisson", "binomial")


def _check_family(family: str) -> None:
    if family not in GLM_FAMILIES:
        raise ValueError(f"family must be one of {list(GLM_FAMILIES)} here, got {family!r}")


def glm_log_density(family: str, eta: np.ndarray, y: np.ndarray,
                    trials: np.ndarray) -> np.ndarray:
    """``log f(y_i | eta_ik)`` for every row and component.

    Parameters
    ----------
    family : {"poisson", "binomial"}
    eta : ndarray of shape (n_samples, n_components)
        Linear predictors (offsets included).
    y : ndarray of shape (n_samples,)
        Counts (Poisson) or successes out of ``trials`` (binomial).
    trials : ndarray of shape (n_samples,)
        Binomial trials ``m`` (ignored for Poisson).

    Returns
    -------
    ndarray of shape (n_samples, n_components)
    """
    _check_family(family)
    y = y[:, None]
    if family == "poisson":
        return y * eta - np.exp(eta) - special.gammaln(y + 1.0)
    m = trials[:, None]
    norm = special.gammaln(m + 1.0) - special.gammaln(y + 1.0) - special.gammaln(m - y + 1.0)
    return norm + y * eta - m * np.logaddexp(0.0, eta)


def glm_mean(family: str, eta: np.ndarray, trials: np.ndarray) -> np.ndarray:
    """``E[y | eta]``: ``e^eta`` (Poisson) or ``m expit(eta)`` (binomial), shape of ``eta``
    (``trials`` broadcast against its first axis)."""
    _check_family(family)
    if family == "poisson":
        return np.exp(eta)
    m = trials if eta.ndim == 1 else trials[:, None]
    return m * special.expit(eta)


def glm_weight(family: str, eta: np.ndarray, trials: np.ndarray) -> np.ndarray:
    """The IRLS weight ``v = var(y | eta)`` (canonical link: minus the Hessian's factor)."""
    if family == "poisson":
        return np.exp(eta)
    p = special.expit(eta)
    return trials[:, None] * p * (1.0 - p)


def glm_stat_shapes(n_components: int, n_coef: int) -> dict[str, tuple[int, ...]]:
    """The Newton statistics' shapes: ``grad`` (K, p), ``hess`` (K, p, p)."""
    K, p = int(n_components), int(n_coef)
    return {"grad": (K, p), "hess": (K, p, p)}


def glm_statistics(family: str, Xt: np.ndarray, y: np.ndarray, trials: np.ndarray,
                   eta: np.ndarray, resp: np.ndarray) -> dict[str, np.ndarray]:
    """The responsibility-weighted gradient and Hessian of every component's log-likelihood at
    the linear predictors ``eta``.

    Parameters
    ----------
    family : {"poisson", "binomial"}
    Xt : ndarray of shape (n_samples, n_coef)
        The design (``[X, 1]`` with an intercept).
    y, trials : ndarray of shape (n_samples,)
    eta : ndarray of shape (n_samples, n_components)
    resp : ndarray of shape (n_samples, n_components)
        Responsibilities (times frequency weights).

    Returns
    -------
    dict with ``grad`` (K, p) ``= sum_i r_ik (y_i - mu_ik) x~_i`` and ``hess`` (K, p, p)
    ``= sum_i r_ik v_ik x~_i x~_i^T`` (symmetric positive semi-definite).
    """
    _check_family(family)
    mu = glm_mean(family, eta, trials)
    grad = (resp * (y[:, None] - mu)).T @ Xt
    rv = resp * glm_weight(family, eta, trials)
    hess = (rv.T[:, None, :] * Xt.T[None, :, :]) @ Xt  # (K, p, n) @ (n, p)
    return {"grad": grad, "hess": 0.5 * (hess + np.transpose(hess, (0, 2, 1)))}


def glm_newton_step(beta: np.ndarray, grad: np.ndarray, hess: np.ndarray,
                    keep: np.ndarray) -> np.ndarray:
    """Every component's Newton step ``beta_k + hess_k^-1 grad_k`` (from sums or means: the
    scale cancels); a component in ``keep`` (no responsibility mass) keeps its ``beta_k``.

    Parameters
    ----------
    beta : ndarray of shape (K, p)
        The coefficients the statistics were computed at.
    grad : ndarray of shape (K, p)
    hess : ndarray of shape (K, p, p)
    keep : ndarray of shape (K,), bool

    Returns
    -------
    ndarray of shape (K, p)
    """
    out = np.array(beta, dtype=np.float64, copy=True)
    for k in np.flatnonzero(~np.asarray(keep)):  # K small solves of size p
        out[k] = out[k] + solve_weighted_least_squares(hess[k], grad[k])
    return out


def working_response(family: str, y: np.ndarray, trials: np.ndarray,
                     offset: np.ndarray) -> np.ndarray:
    """IRLS's starting working response on the linear-predictor scale (McCullagh and Nelder,
    section 2.5: ``mu`` started at ``y`` moved off the boundary): ``log(y + 1/2) - o``
    (Poisson) or ``log((y + 1/2) / (m - y + 1/2)) - o`` (binomial), shape (n_samples,)."""
    _check_family(family)
    if family == "poisson":
        return np.log(y + 0.5) - offset
    return np.log((y + 0.5) / (trials - y + 0.5)) - offset
