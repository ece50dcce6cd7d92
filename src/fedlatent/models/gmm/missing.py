"""The Gaussian mixture's E-step on rows with missing values (NaN), missing at random.

Each row contributes the likelihood of its observed coordinates ``o``; given component ``k``,
its missing coordinates ``m`` are Gaussian with the conditional mean and covariance

    x_m | x_o, k ~ N(mu_m + S_mo S_oo^-1 (x_o - mu_o),  S_mm - S_mo S_oo^-1 S_om)

so the statistics carry ``E[x | x_o, k]`` and ``E[x x^T | x_o, k]`` (the conditional covariance
added on the missing block) and stay sums over rows: the M-step is the complete-data one.
Rows are grouped by their missingness pattern; the work is vectorized within a group (a loop
over distinct patterns and components, never over rows). Only for clients whose rows hold NaN:
the complete-data path (:func:`~fedlatent.models.gmm.math.gmm_statistics`) is untouched.

References
----------
Dempster, Laird, Rubin (1977), section 4.1.3; Little and Rubin (2019), "Statistical Analysis
with Missing Data", 3rd ed., chapters 11 and 17 (EM for the normal and its mixtures);
Ghahramani and Jordan (1994), "Supervised learning from incomplete data via an EM approach".
"""

from __future__ import annotations

import numpy as np

from ...engine.protocol.numerics import logsumexp
from ...engine.stats import Stats
from .inference import full_covariances

__all__ = ["add_group_sums", "conditional_parts", "empty_sums", "missing_log_prob",
           "missing_statistics", "pattern_parts", "patterns"]


def patterns(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(observed, group)``: the distinct observed-masks (G, d) and each row's group (n,)."""
    obs, group = np.unique(~np.isnan(X), axis=0, return_inverse=True)
    return obs, np.asarray(group).ravel()


def conditional_parts(Xo: np.ndarray, mean: np.ndarray, cov: np.ndarray, o: np.ndarray):
    """For rows ``Xo`` (n, |o|) observed on mask ``o``, under ``N(mean, cov)``:
    ``(logpdf (n,), xhat (n, d), C (|m|, |m|))``, the observed part's log-density, the rows
    completed with the conditional means and the conditional covariance of the missing part."""
    m = ~o
    xhat = np.empty((Xo.shape[0], mean.size))
    xhat[:, o] = Xo
    if not o.any():  # nothing observed: the prior
        xhat[:, m] = mean
        return np.zeros(Xo.shape[0]), xhat, cov.copy()
    L = np.linalg.cholesky(cov[np.ix_(o, o)])
    diff = Xo - mean[o]
    z = np.linalg.solve(L, diff.T)  # (|o|, n)
    logpdf = -0.5 * (o.sum() * np.log(2 * np.pi) + np.einsum("ij,ij->j", z, z)) \
        - np.log(np.diag(L)).sum()
    if not m.any():
        return logpdf, xhat, np.zeros((0, 0))
    S_om = cov[np.ix_(o, m)]
    W = np.linalg.solve(L, S_om)  # L^-1 S_om: S_mo S_oo^-1 S_om = W^T W
    xhat[:, m] = mean[m] + z.T @ W
    C = cov[np.ix_(m, m)] - W.T @ W
    return logpdf, xhat, 0.5 * (C + C.T)


def pattern_parts(X: np.ndarray, means: np.ndarray, full: np.ndarray):
    """Per missingness pattern group: ``(rows, o, parts)``, the group's rows, its observed
    mask and ``parts[k]``, the :func:`conditional_parts` of its rows under component ``k``
    (``full``: the (K, d, d) covariances)."""
    obs, group = patterns(X)
    for g, o in enumerate(obs):
        rows = np.flatnonzero(group == g)
        Xo = X[np.ix_(rows, o)]
        yield rows, o, [conditional_parts(Xo, means[k], full[k], o)
                        for k in range(means.shape[0])]


def missing_log_prob(X: np.ndarray, means: np.ndarray, cov: np.ndarray,
                     covariance_type: str) -> np.ndarray:
    """``log N(x_o; mu_k,o, S_k,oo)`` (n, K) of rows with NaN: each row's observed part."""
    K, d = means.shape
    full = full_covariances(cov, covariance_type, K, d)
    out = np.empty((X.shape[0], K))
    for rows, _, parts in pattern_parts(X, means, full):
        out[rows] = np.stack([p[0] for p in parts], axis=1)
    return out


def _bound(xhat: np.ndarray, C: np.ndarray, m: np.ndarray, c0: np.ndarray, R: float):
    """Under differential privacy: each completed row's ``||xhat - c0||^2 + tr C`` (its
    contribution's bound) at most ``R^2``, by shrinking towards ``c0`` (per row factors)."""
    dev = xhat - c0
    size = np.einsum("ij,ij->i", dev, dev) + np.trace(C)
    a = np.minimum(1.0, R / np.sqrt(np.maximum(size, 1e-300)))
    return c0 + dev * a[:, None], a ** 2


def add_group_sums(st: dict, q: np.ndarray, xhat: np.ndarray, C: np.ndarray, m: np.ndarray,
                k: int, center: np.ndarray, ct: str, shrink) -> None:
    """Add one pattern group's expected statistics for component ``k`` into ``st``."""
    Xc = xhat - center
    qs = q if shrink is None else q * shrink  # DP: the conditional covariance shrunk too
    st["nk"][k] += q.sum()
    st["sx"][k] += q @ Xc
    if ct in ("full", "tied"):
        add = (Xc * q[:, None]).T @ Xc
        add[np.ix_(m, m)] += qs.sum() * C
        if ct == "full":
            st["sxx"][k] += add
        else:
            st["sxx"] += add
    else:
        add = q @ (Xc * Xc)
        add[m] += qs.sum() * np.diag(C)
        st["sxx"][k] += add


def empty_sums(K: int, d: int, covariance_type: str) -> dict:
    """Zero ``nk``, ``sx``, ``sxx`` in the layout of
    :func:`~fedlatent.models.gmm.math.gmm_statistics`, for :func:`add_group_sums`."""
    sxx = {"full": (K, d, d), "tied": (d, d)}.get(covariance_type, (K, d))
    return {"nk": np.zeros(K), "sx": np.zeros((K, d)), "sxx": np.zeros(sxx)}


def missing_statistics(X: np.ndarray, params: dict, covariance_type: str,
                       bound: tuple[np.ndarray, float] | None = None) -> tuple[Stats, np.ndarray]:
    """The expected sufficient statistics of rows with NaN and their log-likelihoods.

    Parameters
    ----------
    X : ndarray of shape (n, d), NaN where missing
    params : dict
        ``weights``, ``means``, ``covariances`` (scikit-learn's shapes) and ``center``.
    covariance_type : {"full", "tied", "diag", "spherical"}
    bound : (centre, radius) or None
        Under differential privacy: every completed row shrunk into the ball (see
        :func:`_bound`), so that one record's contribution keeps the complete-data bound.

    Returns
    -------
    stats : Stats
        ``nk``, ``sx``, ``sxx`` as :func:`~fedlatent.models.gmm.math.gmm_statistics`.
    norm : ndarray of shape (n,)
        Each row's log-likelihood of its observed part, in row order.
    """
    w, means, center = params["weights"], params["means"], params["center"]
    K, d = means.shape
    full = full_covariances(params["covariances"], covariance_type, K, d)
    st = empty_sums(K, d, covariance_type)
    norm = np.empty(X.shape[0])
    for rows, o, parts in pattern_parts(X, means, full):
        wlp = np.stack([p[0] for p in parts], axis=1) + np.log(w)
        norm[rows] = logsumexp(wlp, axis=1)
        resp = np.exp(wlp - norm[rows][:, None])
        for k, (_, xhat, C) in enumerate(parts):
            shrink = None
            if bound is not None:
                xhat, shrink = _bound(xhat, C, ~o, *bound)
            add_group_sums(st, resp[:, k], xhat, C, ~o, k, center, covariance_type, shrink)
    return Stats(st, copy=False), norm
