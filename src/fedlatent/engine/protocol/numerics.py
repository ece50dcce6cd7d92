"""Numerical helpers every model shares: one ``logsumexp``, one ``add_intercept``, one k-means.

The k-means is a small weighted k-means (k-means++ seeding, Lloyd iterations) in NumPy, used by
the kmeans-federated initializations: on each client (local centroids) and on the server
(clustering the clients' weighted centroids). Lean and single-threaded on purpose: it runs once
per client on small data, where thread-pool start-up costs more than the arithmetic.
"""

from __future__ import annotations

import numpy as np

__all__ = ["add_intercept", "kmeans", "lift_eigenvalues", "logsumexp"]


def lift_eigenvalues(M: np.ndarray, floor) -> tuple[np.ndarray, np.ndarray]:
    """The symmetric part of each matrix of ``M`` (..., p, p), its eigenvalues below ``floor``
    raised to it, in the matrices that have one; the others are returned (symmetrized)
    unchanged. ``floor`` is a number or an array of shape ``M.shape[:-2]``.

    The projection noisy moment matrices need (noise can leave the positive-definite cone),
    post-processing under differential privacy. Returns ``(matrices, moved)``, ``moved`` the
    boolean mask of the matrices changed."""
    M = 0.5 * (M + np.swapaxes(M, -1, -2))
    vals, vecs = np.linalg.eigh(M)
    fl = np.asarray(floor, dtype=np.float64)[..., None]
    moved = (vals < fl).any(axis=-1)
    if not moved.any():
        return M, moved
    lifted = np.einsum("...ij,...j,...kj->...ik", vecs, np.maximum(vals, fl), vecs)
    return np.where(moved[..., None, None], lifted, M), moved


def logsumexp(a: np.ndarray, axis: int = -1) -> np.ndarray:
    """log(sum(exp(a))) along ``axis``, stable (a lean version of scipy's for the hot path);
    -inf where every term is -inf. Along the last axis of a float64 matrix of fewer than 8
    columns (a mixture's log-responsibilities), column by column (:func:`_logsumexp_columns`:
    the same bits, several times faster)."""
    a = np.asarray(a)
    if a.ndim == 2 and axis in (-1, 1) and 0 < a.shape[1] < 8 and a.dtype == np.float64:
        return _logsumexp_columns(a)
    m = np.max(a, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        out = np.log(np.sum(np.exp(a - m), axis=axis, keepdims=True)) + m
    return np.squeeze(out, axis=axis)


def _logsumexp_columns(a: np.ndarray) -> np.ndarray:
    """:func:`logsumexp` of the rows of ``a`` (n, K), K < 8, one column at a time: the same
    operations, in the same order, as NumPy's reduction along a row of fewer than 8 entries
    (it adds them one after the other), without its per-row overhead: the same bits."""
    cols = [a[:, k] for k in range(a.shape[1])]
    m = cols[0].copy()
    for c in cols[1:]:
        np.maximum(m, c, out=m)  # (NaN propagates, as np.max)
    m[~np.isfinite(m)] = 0.0
    s = np.exp(cols[0] - m)
    t = np.empty_like(m)
    for c in cols[1:]:
        np.subtract(c, m, out=t)
        np.exp(t, out=t)
        s += t
    with np.errstate(divide="ignore"):
        np.log(s, out=s)
    s += m
    return s


def add_intercept(X: np.ndarray, fit_intercept: bool = True) -> np.ndarray:
    """``[X, 1]`` of shape (n_samples, n_features + 1) when ``fit_intercept``, else ``X``."""
    X = np.asarray(X, dtype=np.float64)
    if not fit_intercept:
        return X
    return np.hstack([X, np.ones((X.shape[0], 1))])


def _sqdist(X: np.ndarray, C: np.ndarray) -> np.ndarray:
    d2 = np.einsum("ij,ij->i", X, X)[:, None] - 2.0 * X @ C.T + np.einsum("ij,ij->i", C, C)
    return np.maximum(d2, 0.0)


def _plusplus(X, w, k, rng):
    n = X.shape[0]
    centers = np.empty((k, X.shape[1]))
    i = rng.choice(n, p=w / w.sum())
    centers[0] = X[i]
    d2 = _sqdist(X, centers[:1])[:, 0]
    for j in range(1, k):
        p = w * d2
        tot = p.sum()
        i = rng.choice(n, p=p / tot) if tot > 0 else rng.choice(n)
        centers[j] = X[i]
        d2 = np.minimum(d2, _sqdist(X, centers[j : j + 1])[:, 0])
    return centers


def kmeans(
    X: np.ndarray,
    k: int,
    rng: np.random.Generator,
    sample_weight: np.ndarray | None = None,
    n_init: int = 3,
    max_iter: int = 100,
    tol: float = 1e-8,
) -> tuple[np.ndarray, np.ndarray, float]:
    """Weighted k-means.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)
    k : int, 1 <= k <= n_samples
    rng : numpy Generator
    sample_weight : ndarray of shape (n_samples,) or None
    n_init : int
        Restarts; the lowest inertia wins.

    Returns
    -------
    centers : ndarray of shape (k, n_features)
    labels : ndarray of shape (n_samples,)
    inertia : float
        Weighted sum of squared distances to the closest center.
    """
    X = np.asarray(X, dtype=np.float64)
    n = X.shape[0]
    if not 1 <= k <= n:
        raise ValueError(f"k-means needs 1 <= k <= n_samples, got k={k} for {n} samples")
    w = np.ones(n) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    best = None
    for _ in range(max(1, n_init)):
        C = _plusplus(X, w, k, rng)
        prev = np.inf
        for _ in range(max_iter):
            d2 = _sqdist(X, C)
            labels = d2.argmin(1)
            inertia = float(np.sum(w * d2[np.arange(n), labels]))
            wsum = np.bincount(labels, weights=w, minlength=k)
            sums = np.zeros_like(C)
            np.add.at(sums, labels, X * w[:, None])
            empty = wsum <= 0
            C = np.where(empty[:, None], C, sums / np.where(empty, 1.0, wsum)[:, None])
            if prev - inertia <= tol * max(abs(prev), 1.0):
                break
            prev = inertia
        d2 = _sqdist(X, C)
        labels = d2.argmin(1)
        inertia = float(np.sum(w * d2[np.arange(n), labels]))
        if best is None or inertia < best[2]:
            best = (C.copy(), labels, inertia)
    return best
