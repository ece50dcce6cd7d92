"""Inference for the latent class analysis: Louis' observed information a client sends, and the
reported parameters (poLCA's standard errors, from the observed information rather than its
empirical score outer products).

Free parameters, in order: the class weights' (``pi_1..pi_{K-1}``, or with concomitant variables
the multinomial logit's ``gamma`` (K - 1, q), rows flattened), then per class and variable the
probabilities of its categories but the last (``theta_{k,j,R_j} = 1 - sum``). Per record, class
``k`` and observed variable ``j`` with category ``c``, the complete-data score in
``theta_{k,j,r}`` (``r < R_j``) is ``1{c = r} / theta_r - 1{c = R_j} / theta_{R_j}`` and minus its
Hessian ``1{c = r} / theta_r^2`` on the diagonal plus ``1{c = R_j} / theta_{R_j}^2`` everywhere; a
missing answer adds nothing. A probability at 0 (a boundary estimate) has no finite
information: the standard errors are then refused.
"""

from __future__ import annotations

import numpy as np

from ...engine.estimation.inference import (
    InferenceLayout,
    louis_information,
    weight_row,
    weight_scores,
)
from ..concomitant import concomitant_statistics
from .math import offsets

__all__ = ["lca_information", "lca_layout"]

#: rows per block of the per-record scores (bounds the memory at rows x K x P floats)
CHUNK = 2048


def _free_index(n_categories) -> tuple[np.ndarray, np.ndarray]:
    """For every free probability: its column in ``probs`` and its variable's last column."""
    off = offsets(n_categories)
    cols, last = [], []
    for j in range(len(off) - 1):
        cols += list(range(off[j], off[j + 1] - 1))
        last += [off[j + 1] - 1] * (off[j + 1] - 1 - off[j])
    return np.asarray(cols, dtype=np.int64), np.asarray(last, dtype=np.int64)


def _block(probs: np.ndarray, Z: np.ndarray, k: int, r: np.ndarray, cols, last):
    """Class ``k``'s scores (n, F) in its free probabilities and complete information (F, F)
    (``r``: its responsibilities times the frequency weights)."""
    th = probs[k]
    S = Z[:, cols] / th[cols] - Z[:, last] / th[last]
    c = r @ Z  # (sum R_j,) the class's weighted counts
    C = np.diag(c[cols] / th[cols] ** 2)
    same = last[:, None] == last[None, :]  # pairs of one variable
    C += same * (c[last] / th[last] ** 2)[:, None]
    return S, C


def _chunk(model, params, X: np.ndarray, fw) -> tuple[np.ndarray, float]:
    probs = np.asarray(params["probs"], dtype=np.float64)
    Z, Zt = model.codes(X), model.covariates(X)
    resp, ll, lp = model.e_step(params, Z, Zt)
    wresp = resp if fw is None else resp * fw[:, None]
    n, K = resp.shape
    cols, last = _free_index(model.n_categories)
    F = cols.size
    P0 = (K - 1) * (model.n_concomitant or 1)
    P = P0 + K * F
    S = np.zeros((n, K, P))
    complete = np.zeros((P, P))
    if Zt is not None:
        d = np.eye(K)[None, :, 1:] - np.exp(lp)[:, None, 1:]
        S[:, :, :P0] = (d[:, :, :, None] * Zt[:, None, None, :]).reshape(n, K, P0)
        complete[:P0, :P0] = concomitant_statistics(Zt, lp, wresp, fw)["chess"]
    else:
        a = weight_scores(np.asarray(params["weights"], dtype=np.float64))
        S[:, :, :P0] = a[None]
        complete[:P0, :P0] = np.einsum("k,ki,kj->ij", wresp.sum(0), a, a)
    for k in range(K):  # a loop over classes, each vectorized over the rows
        o = P0 + k * F
        S[:, k, o:o + F], complete[o:o + F, o:o + F] = _block(probs, Z, k,
                                                              wresp[:, k], cols, last)
    return louis_information(resp, S, complete, fw), float(ll.sum() if fw is None else ll @ fw)


def lca_information(model, params, X: np.ndarray,
                    weight: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """Louis' observed information summed over the rows ``X`` (n, d) and their
    log-likelihood; ValueError when a probability is at 0 (no finite information).

    Returns
    -------
    info : ndarray (P, P)
    loglik : float
    """
    probs = np.asarray(params["probs"], dtype=np.float64)
    if np.any(probs <= 0):
        raise ValueError("a category probability is 0 (a boundary estimate): its observed "
                         "information is not finite, so there are no standard errors")
    info, loglik = None, 0.0
    X = np.asarray(X, dtype=np.float64)
    for s in range(0, max(X.shape[0], 1), CHUNK):
        part, ll = _chunk(model, params, X[s:s + CHUNK],
                          None if weight is None else np.asarray(weight)[s:s + CHUNK])
        info = part if info is None else info + part
        loglik += ll
    return info, loglik


def lca_layout(model, params, variables: list[str],
               concomitant_names: list[str]) -> InferenceLayout:
    """The reported parameters: per class its ``weight`` (constant weights) or, for classes
    1..K-1, its concomitant coefficients (``concomitant:<name>``, ``concomitant:intercept``),
    then the probability of every category of every variable (``<variable>=<code>``; a
    variable's last is ``1 - sum`` of the others)."""
    probs = np.asarray(params["probs"], dtype=np.float64)
    K = probs.shape[0]
    cols, _ = _free_index(model.n_categories)
    F = cols.size
    c = model.n_concomitant
    P0 = (K - 1) * (c or 1)
    P = P0 + K * F
    eye = np.eye(P)
    off = offsets(model.n_categories)
    free_of = {int(col): i for i, col in enumerate(cols)}
    index, est, rows = [], [], []
    for k in range(K):
        if not c:
            index.append((str(k), "weight"))
            est.append(float(params["weights"][k]))
            rows.append(weight_row(k, K, P))
        elif k > 0:
            for j, name in enumerate([*concomitant_names, "intercept"]):
                index.append((str(k), f"concomitant:{name}"))
                est.append(float(params["gamma"][k - 1, j]))
                rows.append(eye[(k - 1) * c + j])
        o = P0 + k * F
        for j, var in enumerate(variables):
            for col in range(off[j], off[j + 1]):
                index.append((str(k), f"{var}={col - off[j]}"))
                est.append(float(probs[k, col]))
                if col in free_of:
                    rows.append(eye[o + free_of[col]])
                elif col == off[j]:  # a variable of one category: probability 1, fixed
                    rows.append(np.zeros(P))
                else:  # the last category: 1 - the others
                    rows.append(-eye[o + free_of[off[j]]:o + free_of[off[j]] + col - off[j]]
                                .sum(axis=0))
    payload = {f"params/{k}": np.asarray(v, dtype=np.float64) for k, v in params.items()}
    return InferenceLayout(index, np.asarray(est), np.vstack(rows), payload)
