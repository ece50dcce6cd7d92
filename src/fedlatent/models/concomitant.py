"""Concomitant variables: class weights that depend on covariates by a multinomial logit
(flexmix's ``FLXPmultinom``, poLCA's covariates), as pure functions shared by the latent class
regression and the latent class analysis.

Row ``i``'s prior probability of class ``k`` is ``pi_ik = softmax_k(z~_i^T gamma_k)`` with
``z~ = [z, 1]`` (the concomitant columns and an intercept) and ``gamma_0 = 0`` (class 0 the
reference), ``gamma`` of shape (K - 1, q). EM's M-step for ``gamma`` is a multinomial logistic
regression of the responsibilities on ``z~``; one Newton step of it from the broadcast
``gamma`` needs only the sums (over rows of frequency weight ``f_i``, ``sum_k r_ik = f_i``)

    grad = sum_i (r_i - f_i pi_i)[1:] (x) z~_i,
    hess = sum_i f_i (diag p_i - p_i p_i^T) (x) z~_i z~_i^T

(``p_i = pi_i[1:]``, ``(x)`` the Kronecker product; rows of ``gamma`` flattened), and the server's
step ``gamma + hess^-1 grad`` is the same from sums or means. They hold only at the ``gamma``
they were computed at. Without concomitant variables (``q = 1``, the intercept alone) the fixed
point is the constant weights ``n_k / n``.

References
----------
Dayton, Macready (1988), "Concomitant-variable latent-class models", JASA 83(401), 173-178;
Linzer, Lewis (2011), "poLCA", Journal of Statistical Software 42(10), section 2.3 (Newton-Raphson
for the covariate coefficients); Gruen, Leisch (2008), "FlexMix version 2", Journal of Statistical
Software 28(4) (``FLXPmultinom``).
"""

from __future__ import annotations

import numpy as np

from ..engine.protocol.numerics import add_intercept
from .logistic import logistic_log_proba, newton_solve

__all__ = ["add_intercept", "concomitant_log_prior", "concomitant_newton_step",
           "concomitant_stat_shapes", "concomitant_statistics", "load_concomitant",
           "n_concomitant_parameters", "save_concomitant"]


def concomitant_stat_shapes(n_components: int, n_cols: int) -> dict[str, tuple[int, ...]]:
    """``cgrad`` (K - 1, q) and ``chess`` ((K - 1) q, (K - 1) q) for ``q`` columns of ``z~``."""
    K, q = int(n_components), int(n_cols)
    return {"cgrad": (K - 1, q), "chess": ((K - 1) * q, (K - 1) * q)}


def concomitant_log_prior(Zt: np.ndarray, gamma: np.ndarray) -> np.ndarray:
    """``log pi_ik`` (n, K) for rows ``Zt`` (n, q) (with their intercept column) and
    ``gamma`` (K - 1, q)."""
    return logistic_log_proba(Zt, gamma)


def concomitant_statistics(Zt: np.ndarray, log_prior: np.ndarray, resp: np.ndarray,
                           freq: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The Newton statistics of the concomitant model at the priors ``exp(log_prior)``.

    Parameters
    ----------
    Zt : ndarray of shape (n_samples, q)
    log_prior : ndarray of shape (n_samples, K)
        :func:`concomitant_log_prior` at the broadcast ``gamma``.
    resp : ndarray of shape (n_samples, K)
        Responsibilities times the rows' frequency weights.
    freq : ndarray of shape (n_samples,) or None
        Frequency weights (None: 1 for every row).

    Returns
    -------
    dict with ``cgrad`` (K - 1, q) and ``chess`` ((K - 1) q, (K - 1) q).
    """
    n, q = Zt.shape
    f = np.ones(n) if freq is None else np.asarray(freq, dtype=np.float64)
    p = np.exp(log_prior[:, 1:])  # (n, K - 1)
    Km1 = p.shape[1]
    grad = (resp[:, 1:] - f[:, None] * p).T @ Zt
    B = (p[:, :, None] * Zt[:, None, :]).reshape(n, Km1 * q)
    hess = -(B * f[:, None]).T @ B
    for k in range(Km1):  # the block diagonal: one product per class
        blk = slice(k * q, (k + 1) * q)
        hess[blk, blk] += (Zt * (f * p[:, k])[:, None]).T @ Zt
    return {"cgrad": grad, "chess": 0.5 * (hess + hess.T)}


def concomitant_newton_step(gamma: np.ndarray, cgrad: np.ndarray,
                            chess: np.ndarray) -> np.ndarray:
    """``gamma + chess^-1 cgrad`` (rows of ``gamma`` flattened), shape (K - 1, q)."""
    gamma = np.asarray(gamma, dtype=np.float64)
    return gamma + newton_solve(np.asarray(cgrad).ravel(), chess, 0.0, gamma.shape)


def n_concomitant_parameters(n_components: int, n_cols: int) -> int:
    """``(K - 1) q``: the concomitant coefficients (they replace the ``K - 1`` free weights)."""
    return int((int(n_components) - 1) * int(n_cols))


def save_concomitant(estimator) -> dict:
    """The saved model's ``concomitant`` entry of a fitted estimator (``{}`` without one)."""
    coef = getattr(estimator, "concomitant_coef_", None)
    if coef is None:
        return {}
    return {"concomitant": {"coef": coef.tolist(),
                            "intercept": estimator.concomitant_intercept_.tolist()}}


def load_concomitant(meta: dict, n_components: int, n_cols: int
                     ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``(coef (K, c), intercept (K,))`` of a saved model's ``concomitant`` entry, or
    ``(None, None)`` without one; a wrong shape or a non-finite value is refused (ValueError)."""
    doc = meta.get("concomitant")
    if doc is None:
        return None, None
    K, c = int(n_components), int(n_cols)
    coef = np.asarray(doc["coef"], dtype=np.float64)
    icpt = np.asarray(doc["intercept"], dtype=np.float64)
    if coef.shape != (K, c) or icpt.shape != (K,) or not (
            np.isfinite(coef).all() and np.isfinite(icpt).all()):
        raise ValueError(f"entry 'concomitant' must hold finite coef {(K, c)} and "
                         f"intercept {(K,)}")
    return coef, icpt
