"""SEC's Cluster step and its pieces: dissimilarity (eq. 2), affinity, spectral embedding and
clustering (Ng, Jordan and Weiss), k-means, the number of clusters (gap statistic, Remark 2's
penalty), the prediction of eq. (4) and the clustering accuracy. Pure functions of arrays; they
run on the server.

References
----------
Ye, Ghanadan and Ding, "Meta Clustering for Collaborative Learning" (2023): Section 3
(Algorithm 1, eqs. 2-4, Remark 2).
Ng, Jordan and Weiss, "On spectral clustering: analysis and an algorithm", NIPS 2002.
Tibshirani, Walther and Hastie, "Estimating the number of clusters in a data set via the gap
statistic", JRSS-B 63 (2001).
"""

from __future__ import annotations

import numpy as np
from scipy import linalg

__all__ = [
    "affinity",
    "auto_affinity_scale",
    "clustering_accuracy",
    "default_max_clusters",
    "dissimilarity",
    "gap_statistic",
    "kmeans",
    "normalized_affinity",
    "penalty_selection",
    "selection_embedding",
    "spectral_clustering",
    "spectral_embedding",
    "weighted_prediction",
    "within_cluster_dispersion",
]


def dissimilarity(E: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Eq. (2): ``v_ij = |e_{i->j} - e_j| + |e_{j->i} - e_i|``, ``v_ii = 0``.

    Parameters
    ----------
    E : ndarray of shape (L, L)
        ``E[i, j] = e_{i->j}``, the MSE of learner i's model on learner j's data.
    e : ndarray of shape (L,)
        In-sample MSE of each learner's own model.

    Returns
    -------
    V : ndarray of shape (L, L), symmetric, zero diagonal
    """
    E = np.asarray(E, dtype=np.float64)
    e = np.asarray(e, dtype=np.float64)
    D = np.abs(E - e[None, :])
    V = D + D.T
    np.fill_diagonal(V, 0.0)
    return V


def auto_affinity_scale(V: np.ndarray) -> float:
    """The ``a`` of ``S = exp(-a V)`` chosen from the scale of V: ``a = 1 / mean(v_ij, i < j)``.

    The mean off-diagonal dissimilarity gets similarity ``exp(-1)``, so S is well spread
    whatever the units of the response (the paper's remark that a fixed ``a = 1`` can make all
    ``S_ij`` underflow when V is large). The mean, unlike the median, is set by the
    between-cluster dissimilarities even when one cluster holds most learners, so small
    within-cluster differences (learners selecting different candidates) are not magnified
    into spurious clusters. If V is all zero, ``a = 1``.

    Parameters
    ----------
    V : ndarray of shape (L, L)

    Returns
    -------
    float
    """
    V = np.asarray(V, dtype=np.float64)
    iu = np.triu_indices(V.shape[0], 1)
    v = V[iu]
    if v.size == 0:
        return 1.0
    mean = float(np.mean(v))
    return 1.0 / mean if mean > 0 else 1.0


def default_max_clusters(n_learners: int) -> int:
    """The largest K considered by default: ``round(sqrt(2 L))``, within ``[2, max(2, L // 2)]``.

    Twice the rule of thumb ``K ~ sqrt(L / 2)`` (Mardia, Kent and Bibby, 1979, Section 13.4),
    so a criterion that wants the cap has room beyond the usual K, and at most ``L / 2``:
    beyond, clusters are mostly singletons and the dispersion of k-means on L points carries
    no information (``W_L = 0`` for data and references alike). 20 learners: 6; 46: 10.

    Parameters
    ----------
    n_learners : int

    Returns
    -------
    int
    """
    L = int(n_learners)
    return int(min(max(2, L // 2), max(2, round(np.sqrt(2.0 * L)))))


def affinity(V: np.ndarray, a: float) -> np.ndarray:
    """``S_ij = exp(-a v_ij)`` (Algorithm 1, step 1). Returns ndarray of shape (L, L)."""
    return np.exp(-float(a) * np.asarray(V, dtype=np.float64))


def normalized_affinity(S: np.ndarray) -> np.ndarray:
    """``D^-1/2 S D^-1/2`` with ``D = diag(row sums of S)`` (Algorithm 1, step 2a)."""
    S = np.asarray(S, dtype=np.float64)
    d = S.sum(1)
    if np.any(d <= 0):
        raise ValueError("a learner has zero total similarity; the affinity scale is too large")
    r = 1.0 / np.sqrt(d)
    return r[:, None] * S * r[None, :]


def _eigh_desc(M: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w, U = linalg.eigh(0.5 * (M + M.T))
    order = np.argsort(w)[::-1]
    return w[order], U[:, order]


def _row_normalize(U: np.ndarray) -> np.ndarray:
    nrm = np.linalg.norm(U, axis=1, keepdims=True)
    return U / np.where(nrm > 0, nrm, 1.0)


def spectral_embedding(S: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the top-k eigenvectors of the normalized affinity, each scaled to unit norm.

    Parameters
    ----------
    S : ndarray of shape (L, L)
    k : int

    Returns
    -------
    U_star : ndarray of shape (L, k)
        Algorithm 1, steps 2b-2c.
    eigenvalues : ndarray of shape (L,)
        All eigenvalues of ``D^-1/2 S D^-1/2``, largest first.
    """
    w, U = _eigh_desc(normalized_affinity(S))
    return _row_normalize(U[:, :k]), w


def selection_embedding(S: np.ndarray, max_clusters: int) -> np.ndarray:
    """The embedding on which K is chosen: top ``max_clusters`` eigenvectors weighted by their
    (non-negative) eigenvalues, rows scaled to unit norm.

    The top-K embedding of Algorithm 1 changes dimension with K (its rows are all equal for
    K = 1), so within-cluster dispersions of different K are compared on one fixed embedding.
    Weighting by the eigenvalue (a diffusion-map step) keeps the directions of eigenvalue ~0,
    which are arbitrary for a block-diagonal S, from scattering the rows.

    Returns
    -------
    ndarray of shape (L, max_clusters)
    """
    w, U = _eigh_desc(normalized_affinity(S))
    k = min(int(max_clusters), U.shape[0])
    return _row_normalize(U[:, :k] * np.clip(w[:k], 0.0, None)[None, :])


def _kmeans_batch(Y: np.ndarray, k: int, n_init: int, rng: np.random.Generator,
                  max_iter: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """Lloyd's k-means with k-means++ seeding on a batch of data sets, all restarts at once.

    Y : (B, n, d). Returns labels (B, n) and inertia (B,) of the best restart of each set.
    """
    B, n, d = Y.shape
    R = max(int(n_init), 1)
    k = int(k)
    bi = np.arange(B)[:, None]
    sq = np.einsum("bnd,bnd->bn", Y, Y)  # (B, n)
    C = np.empty((B, R, k, d))
    idx = rng.integers(n, size=(B, R))
    C[:, :, 0] = Y[bi, idx]
    d2 = ((Y[:, None, :, :] - C[:, :, 0][:, :, None, :]) ** 2).sum(-1)  # (B, R, n)
    for c in range(1, k):
        tot = d2.sum(-1, keepdims=True)
        p = np.where(tot > 0, d2 / np.where(tot > 0, tot, 1.0), 1.0 / n)
        cum = np.cumsum(p, -1)
        u = rng.random((B, R, 1)) * cum[..., -1:]
        idx = np.minimum((cum < u).sum(-1), n - 1)
        C[:, :, c] = Y[bi, idx]
        d2 = np.minimum(d2, ((Y[:, None, :, :] - C[:, :, c][:, :, None, :]) ** 2).sum(-1))
    labels = None
    for _ in range(max_iter):
        D = (sq[:, None, :, None] - 2.0 * np.einsum("bnd,brkd->brnk", Y, C)
             + np.einsum("brkd,brkd->brk", C, C)[:, :, None, :])
        new = D.argmin(-1)  # (B, R, n)
        if labels is not None and np.array_equal(new, labels):
            break
        labels = new
        M = (labels[..., None] == np.arange(k)).astype(np.float64)  # (B, R, n, k)
        cnt = M.sum(2)  # (B, R, k)
        sums = np.einsum("brnk,bnd->brkd", M, Y)
        C = np.where(cnt[..., None] > 0, sums / np.maximum(cnt, 1.0)[..., None], C)
    assert labels is not None
    # exact inertia at the final assignment, centres = means of the assigned points
    M = (labels[..., None] == np.arange(k)).astype(np.float64)
    cnt = M.sum(2)
    sums = np.einsum("brnk,bnd->brkd", M, Y)
    C = sums / np.maximum(cnt, 1.0)[..., None]
    resid = Y[:, None, :, :] - np.take_along_axis(C, labels[..., None], axis=2)
    inertia = (resid**2).sum((-1, -2))  # (B, R)
    best = inertia.argmin(1)
    return labels[np.arange(B), best], inertia[np.arange(B), best]


def _canonical(labels: np.ndarray) -> np.ndarray:
    """Relabel clusters 0, 1, ... in order of first appearance."""
    _, first = np.unique(labels, return_index=True)
    order = np.argsort(first)
    mapping = np.empty(order.size, dtype=np.int64)
    mapping[np.unique(labels)[order]] = np.arange(order.size)
    return mapping[labels]


def kmeans(Y: np.ndarray, k: int, n_init: int = 10, rng: np.random.Generator | None = None,
           max_iter: int = 100) -> tuple[np.ndarray, float]:
    """k-means (Lloyd, k-means++ seeding) with ``n_init`` restarts; the best inertia wins.

    Parameters
    ----------
    Y : ndarray of shape (n, d)
    k : int
    n_init : int
    rng : Generator

    Returns
    -------
    labels : ndarray of shape (n,)
        Clusters numbered in order of first appearance.
    inertia : float
        Sum of squared distances to the cluster means.
    """
    rng = np.random.default_rng(rng)
    Y = np.asarray(Y, dtype=np.float64)
    lab, inertia = _kmeans_batch(Y[None], k, n_init, rng, max_iter)
    return _canonical(lab[0]), float(inertia[0])


def within_cluster_dispersion(Y: np.ndarray, labels: np.ndarray) -> float:
    """First term of eq. (3): ``sum_t sum_{i,j in S_t} ||u_i - u_j||^2 / (2 |S_t|)``.

    Equal to the within-cluster sum of squares around the cluster means.
    """
    Y = np.asarray(Y, dtype=np.float64)
    total = 0.0
    for t in np.unique(labels):
        Z = Y[labels == t]
        total += float(((Z - Z.mean(0)) ** 2).sum())
    return total


def gap_statistic(
    Y: np.ndarray,
    max_clusters: int = 10,
    n_refs: int = 20,
    n_init: int = 10,
    rng: np.random.Generator | None = None,
    rule: str = "tibshirani",
) -> tuple[int, dict[str, np.ndarray]]:
    """Number of clusters by the gap statistic (Tibshirani, Walther and Hastie, 2001).

    ``Gap(K) = E*[log W*_K] - log W_K`` with W the within-cluster dispersion of k-means, and
    reference data drawn uniformly in the box aligned with the principal axes of Y (their
    method "b"), ``s_K = sd*(log W*_K) sqrt(1 + 1/B)``.

    ``rule="tibshirani"`` (default, their eq. 5.1): the smallest K with
    ``Gap(K) >= Gap(K+1) - s_{K+1}``. It cannot see past K = 1 when three or more clusters are
    equally far apart (vertices of a simplex, as for a block-diagonal similarity with equal
    blocks: merging two of three clusters halves W as it does for uniform data).
    ``rule="global"``: the smallest K within one standard error of the largest gap (R's
    ``cluster::clusGap`` "globalSEmax", after Dudoit and Fridlyand, 2002); it finds equidistant
    clusters but follows within-cluster structure to large K on noisy SEC embeddings.

    Parameters
    ----------
    Y : ndarray of shape (n, d)
    max_clusters : int
    n_refs : int
        B, the number of reference data sets.
    n_init : int
        k-means restarts.
    rng : Generator
    rule : {"tibshirani", "global"}

    Returns
    -------
    k : int
    info : dict with arrays ``k``, ``W``, ``gap``, ``s`` of length max_clusters
    """
    rng = np.random.default_rng(rng)
    Y = np.asarray(Y, dtype=np.float64)
    n = Y.shape[0]
    kmax = max(1, min(int(max_clusters), n))
    mu = Y.mean(0)
    Yc = Y - mu
    _, _, Vt = np.linalg.svd(Yc, full_matrices=False)
    P = Yc @ Vt.T
    lo, hi = P.min(0), P.max(0)
    refs = rng.uniform(lo, hi, size=(int(n_refs), n, P.shape[1])) @ Vt + mu
    # a floor for log W so exact clusterings (W = 0) give a large, finite gap
    floor = 1e-12 * max(float((Yc**2).sum()), 1e-300)
    W = np.empty(kmax)
    logW_ref = np.empty((kmax, int(n_refs)))
    for k in range(1, kmax + 1):
        _, wk = _kmeans_batch(Y[None], k, n_init, rng)
        _, wr = _kmeans_batch(refs, k, n_init, rng)
        W[k - 1] = wk[0]
        logW_ref[k - 1] = np.log(np.maximum(wr, floor))
    logW = np.log(np.maximum(W, floor))
    gap = logW_ref.mean(1) - logW
    s = logW_ref.std(1) * np.sqrt(1.0 + 1.0 / int(n_refs))
    if rule == "tibshirani":
        k_hat = kmax
        for k in range(1, kmax):
            if gap[k - 1] >= gap[k] - s[k]:
                k_hat = k
                break
    elif rule == "global":
        best = int(np.argmax(gap))
        k_hat = int(np.flatnonzero(gap >= gap[best] - s[best])[0]) + 1
    else:
        raise ValueError(f"rule must be 'tibshirani' or 'global', got {rule!r}")
    return k_hat, {"k": np.arange(1, kmax + 1), "W": W, "gap": gap, "s": s}


def penalty_selection(
    Y: np.ndarray,
    max_clusters: int,
    penalty: float,
    n_init: int = 10,
    rng: np.random.Generator | None = None,
) -> tuple[int, dict[str, np.ndarray]]:
    """Number of clusters by Remark 2: minimize ``W_K + K * lambda_n`` (eq. 3) over K.

    Parameters
    ----------
    Y : ndarray of shape (n, d)
    max_clusters : int
    penalty : float
        ``lambda_n``.

    Returns
    -------
    k : int
    info : dict with arrays ``k``, ``W``, ``objective``
    """
    rng = np.random.default_rng(rng)
    Y = np.asarray(Y, dtype=np.float64)
    kmax = max(1, min(int(max_clusters), Y.shape[0]))
    W = np.array([_kmeans_batch(Y[None], k, n_init, rng)[1][0] for k in range(1, kmax + 1)])
    obj = W + float(penalty) * np.arange(1, kmax + 1)
    return int(np.argmin(obj)) + 1, {"k": np.arange(1, kmax + 1), "W": W, "objective": obj}


def spectral_clustering(
    S: np.ndarray, k: int, n_init: int = 10, rng: np.random.Generator | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Algorithm 1, step 2 (Ng, Jordan and Weiss): labels of the L learners for a given K.

    Parameters
    ----------
    S : ndarray of shape (L, L)
    k : int
    n_init : int
    rng : Generator

    Returns
    -------
    labels : ndarray of shape (L,)
    U_star : ndarray of shape (L, k)
    eigenvalues : ndarray of shape (L,), largest first
    """
    U, w = spectral_embedding(S, k)
    labels, _ = kmeans(U, k, n_init=n_init, rng=rng)
    return labels, U, w


def weighted_prediction(preds: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Eq. (4): ``sum_i n_i / (sum_j n_j) f_i(x)``.

    Parameters
    ----------
    preds : ndarray of shape (n_models, n_samples)
    n : ndarray of shape (n_models,)

    Returns
    -------
    ndarray of shape (n_samples,)
    """
    w = np.asarray(n, dtype=np.float64)
    return (w / w.sum()) @ np.asarray(preds, dtype=np.float64)


def clustering_accuracy(true: np.ndarray, pred: np.ndarray) -> float:
    """Fraction of learners correctly labelled under the best matching of cluster labels.

    Uses the Hungarian algorithm on the contingency table (clusters in excess stay unmatched).
    """
    from scipy.optimize import linear_sum_assignment

    t = np.unique(true, return_inverse=True)[1]
    p = np.unique(pred, return_inverse=True)[1]
    C = np.zeros((t.max() + 1, p.max() + 1))
    np.add.at(C, (t, p), 1.0)
    r, c = linear_sum_assignment(-C)
    return float(C[r, c].sum() / t.size)
