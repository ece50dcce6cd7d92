"""HLCR's internal standardization and its hyperparameter (sigma, delta) Gibbs step: pure
functions over sufficient statistics.

Standardizing is a linear change of variables, so it acts on an entity's statistics, never on
rows: with ``x~ = (x - m) / s`` (intercept kept as the last column) and ``y~ = (y - m_y) / s_y``,
``[x~, 1] = T [x, 1]`` with ``T = [[diag(1/s), -m/s], [0, 1]]`` and

    X~^T X~ = T X^T X T^T,   X~^T y~ = T (X^T y - m_y X^T 1) / s_y,
    y~^T y~ = (y^T y - 2 m_y 1^T y + n m_y^2) / s_y^2.

Without an intercept nothing is centred (that would change the model): ``x~ = x / s`` and
``y~ = y / s_y`` with root-mean-square scales. A Gaussian over the standardized coefficients
``N(H~ c~, H~)`` is the Gaussian ``w = s_y T^T w~ + m_y e_F`` in the user's units
(:func:`to_user_units`), so every fitted number is reported there.

The hyperparameters are drawn by a partially collapsed Gibbs step under conjugate priors:
given the labels, ``w_k ~ N(H_k c_k, H_k)`` (H_k, c_k at the current sigma, delta), then
``sigma^2 ~ IG(a + n/2, b + SSE(w)/2)`` and ``delta^2 ~ IG(a + K F/2, b + sum ||w_k||^2/2)``
(:func:`draw_hyper`). Both need only the clusters' summed statistics, so the federated server
draws them from the sums the agents already send.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "CONSTANT_RTOL",
    "HYPER_PRIOR",
    "constant_columns",
    "draw_hyper",
    "moments_scaling",
    "scaling_matrix",
    "to_user_units",
    "transform_statistics",
]

#: shape and rate ``(a, b)`` of the inverse-gamma priors on sigma^2 and delta^2 (on the
#: standardized scale: prior mode b/(a+1) = 0.5, weak next to hundreds of events)
HYPER_PRIOR = (1.0, 1.0)


#: a column whose pooled variance is at most this fraction of its mean square is constant to
#: rounding: centring it through sums (``sum x^2 - n m^2``) would cancel to noise, and an
#: agent's standardized statistics would carry that noise (refused as not PSD)
CONSTANT_RTOL = 1e-8


def constant_columns(n, sx, sxx) -> np.ndarray:
    """Which columns are constant, or nearly (variance <= ``CONSTANT_RTOL`` x mean square),
    from pooled moments: a boolean mask of shape (F,)."""
    n = float(n)
    mx, mxx = np.asarray(sx, float) / n, np.asarray(sxx, float) / n
    return mxx - mx**2 <= CONSTANT_RTOL * mxx


def moments_scaling(n, sx, sxx, sy, syy, fit_intercept: bool):
    """Shifts and scales from pooled moments.

    Parameters
    ----------
    n : float
        Number of events.
    sx, sxx : ndarray of shape (F,)
        Sums of x and x^2 over the events.
    sy, syy : float
        Sums of y and y^2.
    fit_intercept : bool
        True: centre and divide by the standard deviation; False: divide by the root mean
        square (no centring).

    Returns
    -------
    x_shift, x_scale : ndarray of shape (F,)
    y_shift, y_scale : float
        A (nearly) constant column (:func:`constant_columns`) is not centred: shift 0 and
        its root mean square as scale (1 for an all-zero column).
    """
    n = float(n)
    mx, mxx = np.asarray(sx, float) / n, np.asarray(sxx, float) / n
    my, myy = float(sy) / n, float(syy) / n
    if fit_intercept:
        const_x = constant_columns(n, sx, sxx)
        const_y = bool(constant_columns(n, np.array([sy]), np.array([syy]))[0])
        mx = np.where(const_x, 0.0, mx)
        vx = np.where(const_x, mxx, np.maximum(mxx - mx**2, 0.0))
        my, vy = (0.0, myy) if const_y else (my, max(myy - my**2, 0.0))
    else:
        mx, my = np.zeros_like(mx), 0.0
        vx, vy = mxx, myy
    sx_ = np.sqrt(vx)
    sx_ = np.where(sx_ > 0.0, sx_, 1.0)
    sy_ = float(np.sqrt(vy)) if vy > 0.0 else 1.0
    return mx, sx_, my, sy_


def scaling_matrix(x_shift, x_scale, fit_intercept: bool) -> np.ndarray:
    """``T`` with ``[x~, 1] = T [x, 1]`` (or ``x~ = T x`` without intercept); (F', F')."""
    s = np.asarray(x_scale, float)
    F = len(s)
    T = np.zeros((F + int(fit_intercept),) * 2)
    T[np.arange(F), np.arange(F)] = 1.0 / s
    if fit_intercept:
        T[:F, F] = -np.asarray(x_shift, float) / s
        T[F, F] = 1.0
    return T


def transform_statistics(XtX, Xty, yty, n, T, y_shift: float, y_scale: float):
    """Entity statistics of the standardized events (module docstring); same shapes.

    ``y_shift`` must be 0 without an intercept column (there is no ``X^T 1`` to centre with).
    """
    XtX_t = np.einsum("ij,ejk,lk->eil", T, XtX, T)
    if y_shift:
        ones = XtX[:, :, -1]  # X^T 1: the intercept column (last)
        Xty_c = Xty - y_shift * ones
        sum_y = Xty[:, -1]
        yty_c = yty - 2.0 * y_shift * sum_y + n * y_shift**2
    else:
        Xty_c, yty_c = Xty, yty
    return XtX_t, (Xty_c @ T.T) / y_scale, np.maximum(yty_c, 0.0) / y_scale**2


def to_user_units(D, c, sigma, T, y_shift: float, y_scale: float):
    """A Gaussian over standardized coefficients (precision ``D``, ``c = D mean``), and the
    noise sd, in the user's units.

    Parameters
    ----------
    D : ndarray of shape (..., F', F')
    c : ndarray of shape (..., F')
    sigma : float or ndarray
    T : ndarray of shape (F', F')
        :func:`scaling_matrix`.

    Returns
    -------
    D_u, c_u, sigma_u : precision, ``D_u mean_u`` and noise sd for ``w = s_y T^T w~ + m_y e``.
    """
    mean = np.linalg.solve(D, c[..., None])[..., 0]
    Tinv = np.linalg.inv(T)
    mean_u = y_scale * mean @ T
    if y_shift:
        mean_u[..., -1] += y_shift
    # Cov_u = s_y^2 T^T H T, so D_u = T^-1 D T^-T / s_y^2
    D_u = np.einsum("ij,...jk,lk->...il", Tinv, D, Tinv) / y_scale**2
    D_u = 0.5 * (D_u + np.swapaxes(D_u, -1, -2))
    c_u = np.einsum("...ij,...j->...i", D_u, mean_u)
    return D_u, c_u, np.asarray(sigma) * y_scale


def draw_hyper(XtX, Xty, yty, n_events: float, sigma: float, delta: float,
               rng: np.random.Generator, estimate_sigma: bool, estimate_delta: bool,
               prior: tuple[float, float] = HYPER_PRIOR):
    """One Gibbs step for the noise sd and the prior sd given the clusters' statistics.

    Parameters
    ----------
    XtX, Xty, yty : ndarrays of shapes (K, F, F), (K, F), (K,)
        Summed statistics of each cluster's events (no prior term).
    n_events : float
        Total number of events.
    sigma, delta : float
        Current values (the coefficients are drawn at them).
    rng : numpy.random.Generator
    estimate_sigma, estimate_delta : bool
        Which of the two to redraw (the other is returned unchanged).
    prior : (a, b)
        Inverse-gamma shape and rate of both priors.

    Returns
    -------
    sigma, delta : float

    Notes
    -----
    Partially collapsed Gibbs (van Dyk and Park, 2008): the labels were drawn with the
    coefficients integrated out; ``w_k | z, sigma, delta`` completes that block, then
    ``sigma^2 | w, z`` and ``delta^2 | w`` are the full conditionals ``IG(a + n/2, b + SSE/2)``
    and ``IG(a + K F/2, b + sum_k ||w_k||^2 / 2)``.
    """
    K, F = Xty.shape
    a, b = prior
    D = np.eye(F)[None] / delta**2 + XtX / sigma**2
    L = np.linalg.cholesky(D)
    mean = np.linalg.solve(D, (Xty / sigma**2)[..., None])[..., 0]
    # w = mean + L^-T eps has covariance D^-1
    eps = rng.standard_normal((K, F))
    w = mean + np.linalg.solve(np.swapaxes(L, 1, 2), eps[..., None])[..., 0]
    if estimate_sigma:
        sse = yty - 2.0 * np.einsum("kf,kf->k", w, Xty) + np.einsum("kf,kfg,kg->k", w, XtX, w)
        rate = b + 0.5 * float(np.maximum(sse, 0.0).sum())
        sigma = float(np.sqrt(rate / rng.gamma(a + 0.5 * float(n_events))))
    if estimate_delta:
        rate = b + 0.5 * float((w * w).sum())
        delta = float(np.sqrt(rate / rng.gamma(a + 0.5 * K * F)))
    return sigma, delta
