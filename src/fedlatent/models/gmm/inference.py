"""Inference for the Gaussian mixture: the observed information a client sends and the reported
parameters.

Free parameters (the order of the information matrix): the weights ``pi_1..pi_{K-1}``
(``pi_K = 1 - sum``), then per component its mean and its covariance parameters: the unique
entries ``sigma_ab`` (a <= b, row by row) for "full", the d variances for "diag", the one
variance for "spherical"; for "tied", every component's mean, then the shared covariance's
unique entries. All are linear in the unique entries of each component's covariance, so each
component's score and Hessian are taken in ``phi = (mu, vech Sigma)`` and mapped by a 0/1
matrix ``G_k`` (``phi_k = G_k theta``).

With ``e = x - mu``, ``u = Sigma^-1 e`` and ``E_v`` the symmetric unit matrix of entry ``v``:
score ``(u, f_v (u_a u_b - P_ab))`` (``f_v = 1/2`` on the diagonal, 1 off it), and, summed
with weights r (``N = sum r``, ``M1 = sum r e``, ``M2 = sum r e e^T``), minus the Hessian
``[[N P, P E_w P M1], [., -N tr(P E_v P E_w) / 2 + tr(P E_v P E_w P M2)]]``, ``P = Sigma^-1``.
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
from ...engine.protocol.numerics import logsumexp

__all__ = ["full_covariances", "gmm_information", "gmm_information_sums", "gmm_layout"]

CHUNK = 2048


def full_covariances(cov: np.ndarray, covariance_type: str, K: int, d: int) -> np.ndarray:
    """The K full (d, d) covariances of sklearn-shaped ``cov``."""
    cov = np.asarray(cov, dtype=np.float64)
    if covariance_type == "full":
        return cov
    if covariance_type == "tied":
        return np.broadcast_to(cov, (K, d, d)).copy()
    if covariance_type == "diag":
        return np.stack([np.diag(c) for c in cov])
    return np.stack([np.eye(d) * c for c in cov])


def _vech_pairs(d: int) -> tuple[np.ndarray, np.ndarray]:
    return np.triu_indices(d)


def _n_cov(d: int, covariance_type: str) -> int:
    return {"full": d * (d + 1) // 2, "tied": d * (d + 1) // 2, "diag": d, "spherical": 1}[
        covariance_type]


def _maps(K: int, d: int, covariance_type: str) -> tuple[list[np.ndarray], int]:
    """``G_k`` (q, P) for each component and the number of free parameters P."""
    ia, ib = _vech_pairs(d)
    m, c = ia.size, _n_cov(d, covariance_type)
    tied = covariance_type == "tied"
    P = K - 1 + K * d + (c if tied else K * c)
    diag_v = np.flatnonzero(ia == ib)  # vech positions of the variances
    maps = []
    for k in range(K):
        G = np.zeros((d + m, P))
        om = K - 1 + (k * d if tied else k * (d + c))
        G[np.arange(d), om + np.arange(d)] = 1.0
        oc = K - 1 + K * d if tied else om + d
        if covariance_type in ("full", "tied"):
            G[d + np.arange(m), oc + np.arange(m)] = 1.0
        elif covariance_type == "diag":
            G[d + diag_v, oc + np.arange(d)] = 1.0
        else:
            G[d + diag_v, oc] = 1.0
        maps.append(G)
    return maps, P


def _units(d: int) -> np.ndarray:
    ia, ib = _vech_pairs(d)
    E = np.zeros((ia.size, d, d))
    E[np.arange(ia.size), ia, ib] = 1.0
    E[np.arange(ia.size), ib, ia] = 1.0
    return E


def _complete_phi(N: float, M1, M2, prec, E) -> np.ndarray:
    """``sum r (-H)`` in ``phi = (mu, vech Sigma)`` from the weighted moments."""
    d, m = prec.shape[0], E.shape[0]
    A = np.einsum("ij,vjk,kl->vil", prec, E, prec)  # P E_v P
    out = np.empty((d + m, d + m))
    out[:d, :d] = N * prec
    out[:d, d:] = (A @ M1).T
    out[d:, :d] = out[:d, d:].T
    t1 = np.einsum("vij,wji->vw", A, E)
    t2 = np.einsum("vij,wjk,ki->vw", A, E, prec @ M2)
    out[d:, d:] = -0.5 * N * t1 + 0.5 * (t2 + t2.T)
    return out


def _chunk(X, w, means, covs, precs, logdets, maps, P, fw):
    K, d = means.shape
    ia, ib = _vech_pairs(d)
    f = np.where(ia == ib, 0.5, 1.0)
    E = _units(d)
    e = X[:, None, :] - means[None]  # (n, K, d)
    u = np.einsum("kij,nkj->nki", precs, e)
    logp = (-0.5 * np.einsum("nki,nki->nk", e, u) - 0.5 * logdets[None]
            - 0.5 * d * np.log(2 * np.pi) + np.log(w)[None])
    norm = logsumexp(logp, axis=1)
    resp = np.exp(logp - norm[:, None])
    wresp = resp if fw is None else resp * fw[:, None]  # a row of weight 2 is the row twice
    a = weight_scores(w)
    S = np.zeros((X.shape[0], K, P))
    complete = np.zeros((P, P))
    complete[:K - 1, :K - 1] = np.einsum("k,ki,kj->ij", wresp.sum(0), a, a)
    for k in range(K):  # a loop over components, each vectorized over the rows
        uk = u[:, k]
        s_phi = np.hstack([uk, f * (uk[:, ia] * uk[:, ib] - precs[k][ia, ib])])
        S[:, k] = s_phi @ maps[k]
        S[:, k, :K - 1] = a[k]
        r = wresp[:, k]
        M2 = (e[:, k] * r[:, None]).T @ e[:, k]
        H = _complete_phi(float(r.sum()), r @ e[:, k], M2, precs[k], E)
        complete += maps[k].T @ H @ maps[k]
    info, scores = louis_blocks(resp, S, complete, fw)
    return info, scores, float(norm.sum() if fw is None else norm @ fw)


def _pattern_maps(maps: list[np.ndarray], o: np.ndarray) -> list[np.ndarray]:
    """The rows of every ``G_k`` that belong to the coordinates ``o`` (a boolean mask): the
    means of ``o`` and the covariance entries within ``o``, in the order of the sub-model's
    ``phi = (mu_o, vech Sigma_oo)``."""
    d = o.size
    idx = np.flatnonzero(o)
    full = {(a, b): i for i, (a, b) in enumerate(zip(*_vech_pairs(d), strict=True))}
    ia, ib = _vech_pairs(idx.size)
    rows = np.r_[idx, [d + full[(idx[a], idx[b])] for a, b in zip(ia, ib, strict=True)]]
    return [G[rows.astype(np.int64)] for G in maps]


def gmm_information_sums(X: np.ndarray, weights, means, covariances, covariance_type: str,
                         sample_weight: np.ndarray | None = None,
                         entity: np.ndarray | None = None) -> InformationSums:
    """The information sums of the rows of ``X`` at the mixture (weights, means,
    sklearn-shaped covariances): Louis' observed information, the scores' outer products (per
    row, the rows' total, per entity) and the log-likelihood; ``sample_weight``: each row's
    frequency weight (a row of weight 2 counts twice); ``entity``: each row's entity.

    Rows with missing values (NaN, missing at random) count by the likelihood of their
    observed coordinates ``o``, a Gaussian mixture with the means ``mu_ko`` and covariances
    ``Sigma_koo``: a linear selection of the parameters, so each missingness pattern's
    information is the complete-data formula on the observed coordinates mapped back by the
    rows of ``G_k`` for ``o`` (Louis' formula with the missing coordinates integrated out
    exactly, as the Gaussian allows). Rows with nothing observed carry no information."""
    fw = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    X = np.asarray(X, dtype=np.float64)
    means = np.asarray(means, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    K, d = means.shape
    covs = full_covariances(covariances, covariance_type, K, d)
    maps, P = _maps(K, d, covariance_type)
    sums = InformationSums(P, entity)
    miss = np.isnan(X)
    if not miss.any():
        groups = [(np.ones(d, dtype=bool), np.arange(X.shape[0]))]
    else:
        masks, inv = np.unique(~miss, axis=0, return_inverse=True)
        inv = np.asarray(inv).ravel()
        groups = [(o, np.flatnonzero(inv == g)) for g, o in enumerate(masks) if o.any()]
    for o, idx in groups:
        m_o, c_o = means[:, o], covs[:, o][:, :, o]
        precs, logdets = np.linalg.inv(c_o), np.linalg.slogdet(c_o)[1]
        maps_o = maps if o.all() else _pattern_maps(maps, o)
        for start in range(0, idx.size, CHUNK):
            rows = idx[start:start + CHUNK]
            rw = None if fw is None else fw[rows]
            part = _chunk(X[np.ix_(rows, np.flatnonzero(o))], w, m_o, c_o, precs, logdets,
                          maps_o, P, rw)
            sums.add(*part, weight=rw, rows=rows)
    return sums


def gmm_information(X: np.ndarray, weights, means, covariances, covariance_type: str,
                    sample_weight: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """Louis' observed information summed over the rows of ``X`` at the mixture (weights,
    means, sklearn-shaped covariances), and their log-likelihood; ``sample_weight``: each
    row's frequency weight (a row of weight 2 counts twice)."""
    sums = gmm_information_sums(X, weights, means, covariances, covariance_type,
                                sample_weight)
    return 0.5 * (sums.info + sums.info.T), sums.loglik


def _cov_names(names: list[str], covariance_type: str) -> list[str]:
    if covariance_type == "spherical":
        return ["variance"]
    if covariance_type == "diag":
        return [f"var {a}" for a in names]
    ia, ib = _vech_pairs(len(names))
    return [f"var {names[a]}" if a == b else f"cov {names[a]},{names[b]}"
            for a, b in zip(ia, ib, strict=True)]


def _cov_values(cov: np.ndarray, covariance_type: str) -> np.ndarray:
    if covariance_type in ("full", "tied"):
        return cov[np.triu_indices(cov.shape[-1])]
    return np.atleast_1d(cov)


def gmm_layout(weights, means, covariances, covariance_type: str,
               names: list[str]) -> InferenceLayout:
    """The reported parameters per component (``weight``, ``mean <feature>``, the covariance
    entries ``var <f>`` / ``cov <f>,<g>`` or ``variance``; for "tied" the shared entries under
    component ``tied``) and their map from the free parameters."""
    means = np.asarray(means, dtype=np.float64)
    cov = np.asarray(covariances, dtype=np.float64)
    K, d = means.shape
    maps, P = _maps(K, d, covariance_type)
    eye = np.eye(P)
    index, est, rows = [], [], []
    cnames = _cov_names(names, covariance_type)
    for k in range(K):
        index.append((str(k), "weight"))
        est.append(float(weights[k]))
        rows.append(weight_row(k, K, P))
        om = K - 1 + (k * d if covariance_type == "tied" else k * (d + len(cnames)))
        for j in range(d):
            index.append((str(k), f"mean {names[j]}"))
            est.append(float(means[k, j]))
            rows.append(eye[om + j])
        if covariance_type != "tied":
            vals = _cov_values(cov[k], covariance_type)
            for j, cn in enumerate(cnames):
                index.append((str(k), cn))
                est.append(float(vals[j]))
                rows.append(eye[om + d + j])
    if covariance_type == "tied":
        vals = _cov_values(cov, covariance_type)
        for j, cn in enumerate(cnames):
            index.append(("tied", cn))
            est.append(float(vals[j]))
            rows.append(eye[K - 1 + K * d + j])
    payload = {"params/weights": np.asarray(weights, float), "params/means": means,
               "params/covariances": cov}
    return InferenceLayout(index, np.asarray(est), np.vstack(rows), payload, sums=True)
