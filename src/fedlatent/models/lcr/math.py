"""Latent class regression math: log-densities, sufficient statistics and the M-step, as pure
functions.

A mixture of K linear regressions with Gaussian noise::

    p(y | x) = sum_k w_k N(y; x~^T beta_k, sigma_k^2),     x~ = [x, 1] (with an intercept)

EM's complete-data sufficient statistics are, per component k, summed over the rows with the
responsibilities r_ik::

    n_k = sum r,   A_k = sum r x~ x~^T,   b_k = sum r x~ y,   c_k = sum r y^2

and the M-step is a weighted least-squares solve per component (``A_k beta_k = b_k``), the
residual variance ``SSR_k / n_k`` with ``SSR_k = c_k - 2 beta_k^T b_k + beta_k^T A_k beta_k``,
and the weights ``n_k / n``. Every quantity is a ratio of sums, so the M-step gives the same
parameters from summed or mean statistics.

References
----------
Dempster, Laird, Rubin (1977), "Maximum likelihood from incomplete data via the EM algorithm";
DeSarbo, Cron (1988), "A maximum likelihood methodology for clusterwise linear regression",
Journal of Classification 5, 249-282 (the M-step of section 3); Leisch (2004), "FlexMix: A
general framework for finite mixture models and latent class regression in R", Journal of
Statistical Software 11(8) (random initial memberships).
"""

from __future__ import annotations

import numpy as np
from scipy import linalg

from ...engine.protocol.numerics import add_intercept, logsumexp
from ...engine.stats import Stats

__all__ = [
    "add_intercept",
    "lcr_log_prob",
    "lcr_m_step",
    "lcr_mixture_mean",
    "lcr_responsibilities",
    "lcr_stat_shapes",
    "lcr_statistics",
    "logsumexp",
    "n_free_parameters",
    "solve_weighted_least_squares",
]

_LOG_2PI = float(np.log(2.0 * np.pi))


def lcr_stat_shapes(n_components: int, n_coef: int) -> dict[str, tuple[int, ...]]:
    """Shapes of the statistic blocks for K components and p = d (+ 1) coefficients."""
    K, p = int(n_components), int(n_coef)
    return {"nk": (K,), "sxx": (K, p, p), "sxy": (K, p), "syy": (K,)}


def lcr_log_prob(
    Xt: np.ndarray, y: np.ndarray, beta: np.ndarray, noise_variance: np.ndarray
) -> np.ndarray:
    """log N(y_i; x~_i^T beta_k, sigma_k^2) for every row and component.

    Parameters
    ----------
    Xt : ndarray of shape (n_samples, n_coef)
        Design matrix (``[X, 1]`` with an intercept).
    y : ndarray of shape (n_samples,)
    beta : ndarray of shape (n_components, n_coef)
    noise_variance : ndarray of shape (n_components,)

    Returns
    -------
    ndarray of shape (n_samples, n_components)
    """
    resid = y[:, None] - Xt @ beta.T
    return -0.5 * (_LOG_2PI + np.log(noise_variance) + resid**2 / noise_variance)


def lcr_responsibilities(
    Xt: np.ndarray, y: np.ndarray, weights: np.ndarray, beta: np.ndarray,
    noise_variance: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Posterior probabilities of the components and the per-row log-likelihood.

    Returns
    -------
    resp : ndarray of shape (n_samples, n_components)
        Rows sum to 1.
    loglik : ndarray of shape (n_samples,)
        log p(y_i | x_i).
    """
    with np.errstate(divide="ignore"):  # an emptied component has weight 0: log 0 = -inf
        wlp = lcr_log_prob(Xt, y, beta, noise_variance) + np.log(weights)
    norm = logsumexp(wlp, axis=1)
    return np.exp(wlp - norm[:, None]), norm


def lcr_statistics(Xt: np.ndarray, y: np.ndarray, resp: np.ndarray) -> Stats:
    """Sufficient statistics of a mixture of linear regressions, summed over rows.

    Parameters
    ----------
    Xt : ndarray of shape (n_samples, n_coef)
    y : ndarray of shape (n_samples,)
    resp : ndarray of shape (n_samples, n_components)
        Responsibilities (rows sum to 1, or one-hot memberships).

    Returns
    -------
    Stats with blocks ``nk`` (K,) = sum r, ``sxx`` (K, p, p) = sum r x~ x~^T,
    ``sxy`` (K, p) = sum r x~ y and ``syy`` (K,) = sum r y^2.
    """
    nk = resp.sum(axis=0)
    # (K, p, n) @ (n, p): one product per component, no loop over rows
    sxx = (resp.T[:, None, :] * Xt.T[None, :, :]) @ Xt
    sxx = 0.5 * (sxx + np.transpose(sxx, (0, 2, 1)))
    sxy = (resp * y[:, None]).T @ Xt
    syy = resp.T @ (y * y)
    return Stats({"nk": nk, "sxx": sxx, "sxy": sxy, "syy": syy}, copy=False)


def solve_weighted_least_squares(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    """beta with ``A beta = b`` for a symmetric positive semi-definite ``A`` (p, p).

    A Cholesky solve when ``A`` is positive definite and well conditioned; otherwise (collinear
    columns, a component with fewer rows than coefficients) the minimum-norm least-squares
    solution (``lstsq``, SVD based), which is still a minimizer of the weighted residuals.
    """
    try:
        c = linalg.cho_factor(A, lower=True, check_finite=False)
        d = np.abs(np.diag(c[0]))
        if d.min() > np.sqrt(np.finfo(float).eps) * max(d.max(), 1e-300):
            return linalg.cho_solve(c, b, check_finite=False)
    except linalg.LinAlgError:
        pass
    return np.linalg.lstsq(A, b, rcond=None)[0]


def pooled_residual_variance(S: Stats) -> float:
    """The residual variance of the one-line regression on the pooled statistics (the sums
    over the components of ``nk``, ``sxx``, ``sxy``, ``syy``): the data's variance that a
    component's noise variance is compared with (:mod:`fedlatent.engine.contract.degenerate`)."""
    n = float(np.sum(S["nk"]))
    A, b = np.sum(S["sxx"], axis=0), np.sum(S["sxy"], axis=0)
    if not n > 0:
        return 0.0
    bk = solve_weighted_least_squares(A, b)
    return max(float(np.sum(S["syy"]) - 2.0 * bk @ b + bk @ A @ bk), 0.0) / n


def lcr_m_step(
    S: Stats, reg_noise: float, previous: dict[str, np.ndarray] | None = None,
    empty_tol: float = 1e-10, floor: float = 0.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weights, coefficients and noise variances from summed (or mean) statistics.

    Parameters
    ----------
    S : Stats
        Blocks ``nk``, ``sxx``, ``sxy``, ``syy`` (see :func:`lcr_statistics`).
    reg_noise : float
        Added to every noise variance (keeps a component that fits few rows exactly away from
        a zero variance).
    previous : dict or None
        Parameters (``beta``, ``noise_variance``) kept for a component whose responsibility
        mass is (numerically) zero. Without them an empty component is an error.
    empty_tol : float
        A component is empty when ``n_k <= empty_tol * sum_k n_k``.
    floor : float, default 0
        The least noise variance (before ``reg_noise``): a component collapsing onto a point
        mass is held there (:mod:`fedlatent.engine.contract.degenerate`).

    Returns
    -------
    weights : ndarray of shape (K,)
        ``n_k / n`` (0 for an empty component: it stays in the model with zero weight and
        keeps its previous coefficients and variance).
    beta : ndarray of shape (K, p)
    noise_variance : ndarray of shape (K,)
    """
    nk = np.asarray(S["nk"], dtype=np.float64)
    total = float(nk.sum())
    if not total > 0:
        raise ValueError("the statistics have no responsibility mass (sum of n_k <= 0)")
    K, p = S["sxy"].shape
    empty = nk <= empty_tol * total
    if np.any(empty) and previous is None:
        raise ValueError(
            f"component(s) {np.flatnonzero(empty).tolist()} received no rows at "
            "initialization; lower n_components or change random_state"
        )
    beta = np.empty((K, p))
    var = np.empty(K)
    for k in range(K):  # K small solves of size p; the rows were summed on the clients
        if empty[k]:
            beta[k] = previous["beta"][k]
            var[k] = previous["noise_variance"][k]
            continue
        A, b = S["sxx"][k], S["sxy"][k]
        bk = solve_weighted_least_squares(A, b)
        ssr = float(S["syy"][k] - 2.0 * bk @ b + bk @ A @ bk)
        beta[k] = bk
        var[k] = max(max(ssr, 0.0) / nk[k], floor) + reg_noise
    kept = np.where(empty, 0.0, nk)  # also drops negative masses of stochastic statistics
    return kept / kept.sum(), beta, var


def lcr_mixture_mean(Xt: np.ndarray, weights: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """E[y | x] = sum_k w_k x~^T beta_k, shape (n_samples,)."""
    return Xt @ (beta.T @ weights)


def n_free_parameters(n_components: int, n_coef: int) -> int:
    """K p coefficients, K noise variances and K - 1 weights."""
    K = int(n_components)
    return int(K * n_coef + K + K - 1)
