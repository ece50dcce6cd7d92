"""Inference for latent class analysis: the information a client sends and the reported
parameters (poLCA's standard errors, from Louis' observed information instead of poLCA's
empirical one).

Free parameters (the order of the information matrix): the class weights ``pi_1..pi_{K-1}``
(``pi_K = 1 - sum``), then per class and variable ``j`` the probabilities of its first
``R_j - 1`` categories (the last is one minus their sum). Per row and class the complete-data
log-density is ``log pi_k + sum_j log p_kj(x_j)``; in a variable's free probabilities its score
is ``z_m / p_m - z_R / p_R`` and minus its Hessian ``z_m / p_m^2 [m = l] + z_R / p_R^2`` (``z``
the row's one-hot answer, zero for a missing answer, which therefore adds nothing, as in the
E-step). A probability on the boundary (below :data:`BOUNDARY`) is held fixed: its row and
column of the information are zero, and ``summary()`` reports it without a standard error.
"""

from __future__ import annotations

import numpy as np

from ...engine.estimation.inference import (
    InferenceLayout,
    InformationSums,
    louis_blocks,
    weight_row,
    weight_scores,
)
from .math import offsets, responsibilities

__all__ = ["BOUNDARY", "lca_information_sums", "lca_layout"]

CHUNK = 2048
#: a category probability below this is on the boundary of the simplex (held fixed)
BOUNDARY = 1e-8


def _n_free(K: int, cats) -> int:
    return K - 1 + K * int(sum(int(r) - 1 for r in cats))


def _block_scores(Z, probs, k, cats):
    """Class ``k``'s scores in its free probabilities (n, sum (R_j - 1)) and the weights of
    its complete information ``(diag, corner)`` per block (zero at the boundary)."""
    off = offsets(cats)
    cols, inv_p, inv_last = [], [], []
    for j in range(len(cats)):
        p = probs[k, off[j]:off[j + 1]]
        ok = p >= BOUNDARY
        ip = np.where(ok, 1.0 / np.where(ok, p, 1.0), 0.0)
        zb = Z[:, off[j]:off[j + 1]]
        last = ip[-1] if ok[:-1].any() else 0.0
        cols.append(zb[:, :-1] * ip[:-1] - zb[:, -1:] * last)
        inv_p.append(ip[:-1])
        inv_last.append(np.full(len(p) - 1, last))
    return np.hstack(cols), inv_p, inv_last


def _complete_block(counts_k, inv_p, inv_last, cats) -> np.ndarray:
    """``sum_i r_ik (-H_ik)`` of class ``k``'s free probabilities from its weighted counts."""
    off = offsets(cats)
    size = int(sum(int(r) - 1 for r in cats))
    out = np.zeros((size, size))
    pos = 0
    for j, R in enumerate(cats):
        c = counts_k[off[j]:off[j + 1]]
        m = int(R) - 1
        blk = np.diag(c[:-1] * inv_p[j] ** 2) + c[-1] * np.outer(inv_last[j], inv_last[j])
        out[pos:pos + m, pos:pos + m] = blk
        pos += m
    return out


def _chunk(Z, weights, probs, cats, fw):
    K = weights.size
    P = _n_free(K, cats)
    resp, norm = responsibilities(Z, weights, probs)
    wresp = resp if fw is None else resp * fw[:, None]
    a = weight_scores(weights)
    S = np.zeros((Z.shape[0], K, P))
    S[:, :, :K - 1] = a[None]
    complete = np.zeros((P, P))
    complete[:K - 1, :K - 1] = np.einsum("k,ki,kj->ij", wresp.sum(0), a, a)
    q = P - (K - 1)
    q //= max(K, 1)
    counts = wresp.T @ Z
    for k in range(K):  # a loop over classes, each vectorized over the rows
        o = K - 1 + k * q
        sk, inv_p, inv_last = _block_scores(Z, probs, k, cats)
        S[:, k, o:o + q] = sk
        complete[o:o + q, o:o + q] = _complete_block(counts[k], inv_p, inv_last, cats)
    info, scores = louis_blocks(resp, S, complete, fw)
    return info, scores, float(norm.sum() if fw is None else norm @ fw)


def lca_information_sums(Z: np.ndarray, weights, probs, n_categories,
                         sample_weight: np.ndarray | None = None,
                         entity: np.ndarray | None = None) -> InformationSums:
    """The information sums of the one-hot rows ``Z`` (n, sum R_j; a missing answer a block of
    zeros) at (weights, probs): Louis' observed information, the scores' outer products (per
    row, the rows' total, per entity) and the log-likelihood."""
    w = np.asarray(weights, dtype=np.float64)
    probs = np.asarray(probs, dtype=np.float64)
    cats = [int(r) for r in n_categories]
    sums = InformationSums(_n_free(w.size, cats), entity)
    fw = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    for start in range(0, Z.shape[0], CHUNK):
        rows = slice(start, start + CHUNK)
        rw = None if fw is None else fw[rows]
        sums.add(*_chunk(Z[rows], w, probs, cats, rw), weight=rw, rows=rows)
    return sums


def lca_layout(weights, probs, n_categories, names: list[str]) -> InferenceLayout:
    """The reported parameters per class: ``weight``, then every category's probability of
    every variable (``<variable>=<code>``, the last of each variable one minus the others),
    and their map from the free parameters."""
    w = np.asarray(weights, dtype=np.float64)
    probs = np.asarray(probs, dtype=np.float64)
    cats = [int(r) for r in n_categories]
    K = w.size
    P = _n_free(K, cats)
    q = (P - (K - 1)) // max(K, 1)
    off = offsets(cats)
    eye = np.eye(P)
    index, est, rows = [], [], []
    for k in range(K):
        index.append((str(k), "weight"))
        est.append(float(w[k]))
        rows.append(weight_row(k, K, P))
        pos = K - 1 + k * q
        for j, R in enumerate(cats):
            free = eye[pos:pos + R - 1]
            for c in range(R):
                index.append((str(k), f"{names[j]}={c}"))
                est.append(float(probs[k, off[j] + c]))
                rows.append(free[c] if c < R - 1 else -free.sum(axis=0))
            pos += R - 1
    payload = {"params/weights": w, "params/probs": probs}
    return InferenceLayout(index, np.asarray(est), np.vstack(rows), payload)
