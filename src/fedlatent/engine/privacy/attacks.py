"""Reconstruction attacks an honest-but-curious server can run on one client's statistics.

Pure functions over what crosses (no access to the client's data). They show why
:class:`.disclosure.DisclosurePolicy` exists: each succeeds exactly on raw statistics over one
or two records, and the policy's defaults refuse those statistics. The engine's integration runs
them against real replies.

- :func:`rows_from_one_record`: a client with one row sends it: ``row = c + sum_k sx_k / n``.
- :func:`rows_from_two_records`: two rows from ``(n, sum x, sum x x^T)``: the centred scatter
  ``S = sum x x^T - n m m^T`` of two points ``m +- d`` is ``2 d d^T``, so its top eigenpair gives
  ``d`` (the pair is unique as a set; which is "first" is not).
- :func:`record_from_regression_block`: one event in a regression block: ``X^T X = x x^T`` and
  ``X^T y = x y``; the intercept column (``x_j = 1``) fixes the sign, then ``x = X^T X[:, j]``
  and ``y = X^T y[j]``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["record_from_regression_block", "rows_from_one_record", "rows_from_two_records"]


def _moments(sx: np.ndarray, sxx: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Sum over components of per-component (K, d) / (K, d, d) sums (or pass-through)."""
    sx = np.asarray(sx, dtype=np.float64)
    s1 = sx.sum(axis=0) if sx.ndim == 2 else sx
    if sxx is None:
        return s1, None
    sxx = np.asarray(sxx, dtype=np.float64)
    s2 = sxx.sum(axis=0) if sxx.ndim == 3 else sxx
    return s1, s2


def rows_from_one_record(n: float, sx: np.ndarray, center: np.ndarray | None = None) -> np.ndarray:
    """The mean row ``c + (sum_k sx_k) / n``; the client's row itself when ``n == 1``.

    Parameters
    ----------
    n : float
        The client's record count (or ``sum_k nk``).
    sx : ndarray of shape (K, d) or (d,)
        Per-component (or total) sums of ``r (x - c)``.
    center : ndarray of shape (d,) or None
        The centre the statistics are taken around (public: it is broadcast).

    Returns
    -------
    ndarray of shape (1, d)
    """
    s1, _ = _moments(sx)
    c = np.zeros_like(s1) if center is None else np.asarray(center, dtype=np.float64)
    return (c + s1 / float(n))[None, :]


def rows_from_two_records(n: float, sx: np.ndarray, sxx: np.ndarray,
                          center: np.ndarray | None = None) -> np.ndarray:
    """Both rows of a two-record client from its count, sum and sum of outer products.

    Parameters
    ----------
    n : float
        Must be 2 for the reconstruction to be exact.
    sx : ndarray of shape (K, d) or (d,)
        Sums of ``r (x - c)`` per component (summed here over components).
    sxx : ndarray of shape (K, d, d) or (d, d)
        Sums of ``r (x - c)(x - c)^T`` (full covariance statistics).
    center : ndarray of shape (d,) or None

    Returns
    -------
    ndarray of shape (2, d)
        ``m + d`` and ``m - d`` (their order is not identifiable).
    """
    s1, s2 = _moments(sx, sxx)
    c = np.zeros_like(s1) if center is None else np.asarray(center, dtype=np.float64)
    m = s1 / float(n)
    scatter = s2 - float(n) * np.outer(m, m)
    w, V = np.linalg.eigh(0.5 * (scatter + scatter.T))
    d = np.sqrt(max(w[-1], 0.0) / 2.0) * V[:, -1]
    return np.stack([c + m + d, c + m - d])


def record_from_regression_block(xtx: np.ndarray, xty: np.ndarray,
                                 intercept_index: int | None = -1) -> tuple[np.ndarray, float]:
    """The design row and target of a one-record regression block.

    Parameters
    ----------
    xtx : ndarray of shape (p, p)
        ``X^T X`` of the block (``x x^T`` for one record).
    xty : ndarray of shape (p,)
        ``X^T y`` (``x y``).
    intercept_index : int or None
        Column of the design that is constantly 1 (HLCR and the LCR put it last). ``None``:
        no intercept; ``x`` comes from the top eigenpair of ``X^T X`` and ``(x, y)`` is known
        up to a common sign (the first non-zero entry of ``x`` is made positive).

    Returns
    -------
    x : ndarray of shape (p,)
    y : float
    """
    xtx = np.asarray(xtx, dtype=np.float64)
    xty = np.asarray(xty, dtype=np.float64)
    if intercept_index is not None:
        return xtx[:, intercept_index].copy(), float(xty[intercept_index])
    w, V = np.linalg.eigh(0.5 * (xtx + xtx.T))
    x = np.sqrt(max(w[-1], 0.0)) * V[:, -1]
    nz = np.flatnonzero(np.abs(x) > 1e-12 * max(np.abs(x).max(), 1e-300))
    if nz.size and x[nz[0]] < 0:
        x = -x
    return x, float(x @ xty / max(x @ x, 1e-300))
