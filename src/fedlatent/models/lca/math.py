"""Latent class analysis, the pure math (poLCA's model): a mixture of ``K`` classes in which the
``J`` categorical variables of a row are independent given its class.

A row ``x`` holds ``J`` category codes, ``x_j`` in ``0 .. R_j - 1``. The parameters are the
class weights ``pi`` (K,) and, per class and variable, the probabilities of each category, stored
side by side as ``probs`` (K, sum R_j) (variable ``j``'s block is columns ``offsets[j]`` to
``offsets[j + 1]``). With ``Z`` the rows one-hot encoded (n, sum R_j), ``log p(x | k) = Z @
log(probs[k])``; the sufficient statistics of EM are, per class, the sum of the responsibilities
``nk`` (K,) and the responsibility-weighted category counts ``counts = resp^T Z`` (K, sum R_j).
"""

from __future__ import annotations

import numpy as np

from ...engine.protocol.numerics import logsumexp

__all__ = ["lca_log_prob", "lca_m_step", "lca_statistics", "n_free_parameters", "offsets",
           "one_hot"]

#: the smallest probability used inside a logarithm (an exact zero stays -inf-free)
TINY = 1e-300


def offsets(n_categories) -> np.ndarray:
    """``[0, R_0, R_0 + R_1, ...]``: where each variable's block starts (J + 1 entries)."""
    return np.concatenate([[0], np.cumsum(np.asarray(n_categories, dtype=np.int64))])


def one_hot(X: np.ndarray, n_categories) -> np.ndarray:
    """The rows' codes one-hot encoded, (n, sum R_j), as float64; a missing answer (NaN) is a
    block of zeros: the variable drops out of that row's likelihood and counts (poLCA)."""
    X = np.asarray(X)
    off = offsets(n_categories)
    n = X.shape[0]
    Z = np.zeros((n, int(off[-1])))
    if n:
        miss = np.isnan(X) if X.dtype.kind == "f" else None
        if miss is not None and miss.any():
            return _one_hot_missing(X, off, miss, Z)
        cols = X.astype(np.int64) + off[:-1][None, :]
        np.put_along_axis(Z, cols, 1.0, axis=1)
    return Z


def _one_hot_missing(X, off, miss, Z):
    cols = np.where(miss, 0, X).astype(np.int64) + off[:-1][None, :]
    np.put_along_axis(Z, cols, np.where(miss, 0.0, 1.0), axis=1)
    return Z


def lca_log_prob(Z: np.ndarray, weights: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """``log pi_k + log p(x_i | k)`` for every row and class, (n, K)."""
    return Z @ np.log(np.maximum(probs, TINY)).T + np.log(np.maximum(weights, TINY))[None, :]


def responsibilities(Z, weights, probs) -> tuple[np.ndarray, np.ndarray]:
    """The rows' class posteriors (n, K) and log-likelihoods (n,)."""
    wlp = lca_log_prob(Z, weights, probs)
    norm = logsumexp(wlp, axis=1)
    return np.exp(wlp - norm[:, None]), norm


def lca_statistics(Z: np.ndarray, resp: np.ndarray) -> dict[str, np.ndarray]:
    """``nk = sum_i r_ik`` (K,) and ``counts = sum_i r_ik z_i`` (K, sum R_j)."""
    return {"nk": resp.sum(axis=0), "counts": resp.T @ Z}


def lca_m_step(S, n_categories) -> tuple[np.ndarray, np.ndarray]:
    """The M-step from statistics ``S`` (sums or means: only ratios matter), counts >= 0.

    Weights ``nk / sum nk``; per class and variable, the counts divided by their total over the
    variable's categories (``nk`` when every reply is exact; robust to a stochastic-approximation
    or noisy ``S``). A class or block with no mass keeps uniform probabilities.
    """
    nk = np.maximum(np.asarray(S["nk"], dtype=np.float64), 0.0)
    counts = np.asarray(S["counts"], dtype=np.float64)
    K = nk.size
    tot = nk.sum()
    weights = nk / tot if tot > 0 else np.full(K, 1.0 / K)
    off = offsets(n_categories)
    probs = np.empty_like(counts)
    for j in range(len(off) - 1):  # one block per variable (J is small)
        block = counts[:, off[j]:off[j + 1]]
        s = block.sum(axis=1, keepdims=True)
        R = block.shape[1]
        probs[:, off[j]:off[j + 1]] = np.where(s > 0, block / np.where(s > 0, s, 1.0), 1.0 / R)
    return weights, probs


def n_free_parameters(K: int, n_categories) -> int:
    """``(K - 1) + K * sum_j (R_j - 1)`` (poLCA's count)."""
    R = np.asarray(n_categories, dtype=np.int64)
    return int(K - 1 + K * int((R - 1).sum()))
