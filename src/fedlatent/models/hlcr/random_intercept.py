"""HLCR with an entity random intercept: a mixture of random-intercept regressions.

An entity ``e`` of cluster ``k`` has ``y_e = X_e w_k + u_e 1 + eps``, ``u_e ~ N(0, tau^2)``,
``eps ~ N(0, sigma^2 I)``: its events share the covariance ``V_e = sigma^2 I + tau^2 1 1^T``.
With ``rho = tau^2 / sigma^2`` and ``g_e = rho / (1 + n_e rho)`` (Woodbury and the matrix
determinant lemma)

    V_e^-1 = (I - g_e 1 1^T) / sigma^2,    log det V_e = n_e log sigma^2 + log(1 + n_e rho),

so the entity's Gaussian likelihood in ``w`` is that of the independent-noise model with the
*adjusted* statistics

    X^T X - g a a^T,   X^T y - g a s,   y^T y - g s^2,   a = X^T 1,  s = 1^T y,

times the constant ``(1 + n_e rho)^(-1/2)``. With an intercept column (last), ``a`` is the last
column of the entity's ``X^T X`` and ``s`` the last entry of its ``X^T y``: no new statistic
is needed, and the adjusted ones are again sums over one entity (PSD: ``I - g 1 1^T`` is).
Everything the collapsed sampler and FedHLCR do (Theorem 1's marginal likelihood, the cluster
sums, the sigma draw given ``rho``) then runs unchanged on the adjusted statistics; the
constant does not depend on the cluster, so it changes no label probability (only the log
joint). With one cluster and a flat prior the posterior mean of ``w`` is the GLS estimate of
the random-intercept linear mixed model and :func:`intercept_posterior` its BLUP.

The intercept's variance ``tau^2`` is learned by an EM-style update (as in Laird and Ware's EM
for the linear mixed model): given the labels, the coefficients at their posterior mean and
sigma, ``u_e | y_e ~ N(g_e (s - a^T w), sigma^2 g_e)`` and ``tau^2 <- mean_e E[u_e^2 | y_e]``.
Its terms are one more per-cluster sum (``u2``) an agent computes from its entities'
statistics; its fixed point with one cluster is the maximum-likelihood ``tau^2`` (the
``sigma^2`` draw given ``rho`` is conjugate and centred on the profile ML ``SSE_V / n``).
A Gibbs step would need a per-entity draw of ``u_e`` given a coefficient *draw* the server
would broadcast; an MH step on ``rho`` would need the agents to score every proposal.
"""

from __future__ import annotations

import numpy as np

__all__ = ["adjust_statistics", "intercept_posterior", "intercept_second_moment",
           "log_det_correction"]


def _shrink(n: np.ndarray, rho: float) -> np.ndarray:
    """``g_e = rho / (1 + n_e rho)``; shape (E,)."""
    n = np.asarray(n, dtype=np.float64)
    return rho / (1.0 + n * rho)


def adjust_statistics(XtX: np.ndarray, Xty: np.ndarray, yty: np.ndarray, n: np.ndarray,
                      rho: float):
    """The entities' statistics under ``V_e = sigma^2 (I + rho 1 1^T)`` (module docstring).

    Parameters
    ----------
    XtX, Xty, yty, n : entity statistics, shapes (E, F, F), (E, F), (E,), (E,)
        With the intercept column last (``X^T 1`` is ``XtX[:, :, -1]``).
    rho : float
        ``tau^2 / sigma^2 >= 0``; 0 returns the statistics unchanged (as new arrays).

    Returns
    -------
    XtX, Xty, yty : adjusted, same shapes
    """
    g = _shrink(n, float(rho))
    a = XtX[:, :, -1]
    s = Xty[:, -1]
    XtX_a = XtX - g[:, None, None] * a[:, :, None] * a[:, None, :]
    Xty_a = Xty - (g * s)[:, None] * a
    yty_a = yty - g * s * s
    XtX_a = 0.5 * (XtX_a + np.swapaxes(XtX_a, 1, 2))
    return (np.ascontiguousarray(XtX_a), np.ascontiguousarray(Xty_a),
            np.maximum(yty_a, 0.0))


def intercept_posterior(XtX: np.ndarray, Xty: np.ndarray, n: np.ndarray, W: np.ndarray,
                        rho: float, sigma: float):
    """Posterior mean and variance of every entity's intercept ``u_e`` given coefficients.

    Parameters
    ----------
    XtX, Xty, n : raw entity statistics (intercept column last), (E, F, F), (E, F), (E,)
    W : ndarray of shape (E, F)
        The coefficients of each entity's cluster (e.g. the posterior means at its label).
    rho, sigma : float

    Returns
    -------
    mean : ndarray (E,)
        ``g_e (1^T y_e - (X_e^T 1)^T w)``: the BLUP at ``w``.
    var : ndarray (E,)
        ``sigma^2 g_e``.
    """
    g = _shrink(n, float(rho))
    resid = Xty[:, -1] - np.einsum("ef,ef->e", XtX[:, :, -1], W)
    return g * resid, sigma**2 * g


def intercept_second_moment(XtX, Xty, n, W, rho: float, sigma: float) -> np.ndarray:
    """``E[u_e^2 | y_e] = mean^2 + var`` of :func:`intercept_posterior`; shape (E,)."""
    m, v = intercept_posterior(XtX, Xty, n, W, rho, sigma)
    return m * m + v


def log_det_correction(n: np.ndarray, rho: float) -> float:
    """``-1/2 sum_e log(1 + n_e rho)``: what the adjusted statistics leave out of the entities'
    log likelihood (the same under every cluster)."""
    return float(-0.5 * np.log1p(np.asarray(n, dtype=np.float64) * float(rho)).sum())
