"""HLCR's math: pure functions over arrays (entity and cluster statistics, the entity marginal
likelihood of Theorem 1, the prior factor (2), posterior means and predictions, the log joint,
the PSD projection). The loops run in the numba kernels of :mod:`.kernels`; the samplers are in
:mod:`.sampler`.

The entity marginal likelihood of Theorem 1 is computed from the entity's sufficient statistics
(``X^T X``, ``X^T y``, ``y^T y``, ``n``) as a ratio of Gaussian normalizers: one Cholesky per
(entity, cluster), independent of the number of events, instead of the event-by-event Woodbury
recursion of Algorithm 1 (kept in ``tests/hlcr_reference.py`` as the reference it must match).

References
----------
Yang, Carette, Jimbo, Maruyama. "Federated Latent Class Regression for Hierarchical Data"
(2022): model section 4.1, prior factor eq. (2), Theorem 1 / eqs. (3)-(7) and (27), Algorithms
1-3, prediction Theorem 2 / eq. (10). Wallach, Mimno, McCallum (2009) for the asymmetric prior.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import gammaln

from ...data.dataset import DataValidationError
from ...engine.protocol.messages import bordered
from .kernels import entity_sums, log_marginal_batch

__all__ = [
    "check_entities",
    "cluster_statistics",
    "entity_log_marginal",
    "entity_sse",
    "entity_statistics",
    "hlcr_log_joint",
    "log_prior_factor",
    "posterior_means",
    "predict_theorem2",
    "project_gram_psd",
]


def entity_statistics(
    X: np.ndarray,
    y: np.ndarray,
    entity: np.ndarray,
    *,
    categories: np.ndarray | None = None,
    client: str = "?",
    weight: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Sufficient statistics of every entity of one agent.

    Parameters
    ----------
    X : ndarray of shape (n_events, F)
    y : ndarray of shape (n_events,)
    entity : ndarray of shape (n_events,)
        Entity id of each event; ids are compared as strings.
    categories : ndarray of shape (n_entities,) or None
        The declared entities of the agent (for example the categories of a pandas Categorical).
        None: the distinct ids in ``entity``. A declared entity without events is an error.
    client : str
        Agent name used in error messages.
    weight : ndarray of shape (n_events,) or None
        Frequency weight of each event: an event of weight ``w`` counts as ``w`` events of the
        same entity (its sums and its count ``n``); an entity's weights must sum to at least 1
        (every entity is at least one event).

    Returns
    -------
    names : ndarray of str, shape (E,)
        Entity ids in sorted order (the order of every other output and of the labels).
    XtX : ndarray of shape (E, F, F)
    Xty : ndarray of shape (E, F)
    yty : ndarray of shape (E,)
    n : ndarray of shape (E,)
        Number of events of each entity (the sum of their weights, with ``weight``).
    """
    X = np.ascontiguousarray(X, dtype=np.float64)
    y = np.ascontiguousarray(y, dtype=np.float64)
    raw = np.asarray(entity)
    if categories is None:
        if raw.dtype.kind in "iufb":  # unique on numbers (fast), then order by the string ids
            uniq, inv = np.unique(raw, return_inverse=True)
            names = uniq.astype(str)
            perm = np.argsort(names, kind="stable")
            rank = np.empty_like(perm)
            rank[perm] = np.arange(len(perm))
            names, inv = names[perm], rank[inv.reshape(-1)]
        else:
            names, inv = np.unique(raw.astype(str), return_inverse=True)
    else:
        keys = raw.astype(str)
        names = np.unique(np.asarray(categories).astype(str))
        inv = np.searchsorted(names, keys)
        inv = np.minimum(inv, len(names) - 1)
        unknown = names[inv] != keys
        if unknown.any():
            raise DataValidationError(
                f"client {client!r}: entity {str(keys[unknown][0])!r} is not among the declared "
                "entities; add it to the categories"
            )
    inv = np.ascontiguousarray(inv.reshape(-1), dtype=np.int64)
    n = np.bincount(inv, minlength=len(names)).astype(np.float64)
    empty = np.flatnonzero(n == 0)
    if empty.size:
        raise DataValidationError(
            f"client {client!r}: entity {str(names[empty[0]])!r} has zero events "
            f"({empty.size} such entities); drop entities without events (e.g. "
            "remove_unused_categories) before fitting"
        )
    if weight is None:
        return names, *entity_sums(X, y, inv, len(names)), n
    return names, *_weighted_entity_sums(X, y, inv, names, weight, client)


def _weighted_entity_sums(X, y, inv, names, weight, client):
    """``XtX, Xty, yty, n`` of each entity with frequency-weighted events (the sums of rows
    scaled by ``sqrt(w)``: ``sum w x x^T`` and ``sum w x y``)."""
    w = np.asarray(weight, dtype=np.float64)
    n = np.bincount(inv, weights=w, minlength=len(names))
    _refuse_light(names, n, client)
    r = np.sqrt(w)
    XtX, Xty, yty = entity_sums(np.ascontiguousarray(X * r[:, None]),
                                np.ascontiguousarray(y * r), inv, len(names))
    return XtX, Xty, yty, n


def _refuse_light(names: np.ndarray, n: np.ndarray, client: str) -> None:
    """Refuse entities whose events' frequency weights ``n`` sum to less than 1."""
    light = np.flatnonzero(n < 1.0)
    if light.size:
        raise DataValidationError(
            f"client {client!r}: the events of entity {str(names[light[0]])!r} weigh "
            f"{n[light[0]]:g} in all ({light.size} such entities); every entity is at least one "
            "event: give its events weights summing to 1 or more, or drop it")


def check_entities(entity, client: str = "?", weight: np.ndarray | None = None) -> None:
    """Raise DataValidationError if a declared entity (categories of a pandas Categorical) has
    zero events, if an entity id is missing, or (``weight``: the events' frequency weights) if
    an entity's events weigh less than 1 in all."""
    import pandas as pd

    cats = getattr(entity, "categories", None)
    keys = np.asarray(entity)
    if pd.isna(keys).any():
        raise DataValidationError(
            f"client {client!r}: the entity column has {int(pd.isna(keys).sum())} missing ids; "
            "every event needs an entity id"
        )
    if cats is not None:
        keys = keys.astype(str)
        names = np.asarray(cats).astype(str)
        present = np.isin(names, keys)
        if not present.all():
            raise DataValidationError(
                f"client {client!r}: entity {str(names[~present][0])!r} has zero events "
                f"({int((~present).sum())} such entities); drop entities without events (e.g. "
                "remove_unused_categories) before fitting"
            )
    if weight is not None:
        names, inv = np.unique(keys.astype(str), return_inverse=True)
        _refuse_light(names, np.bincount(inv.reshape(-1), weights=weight,
                                         minlength=len(names)), client)


def cluster_statistics(
    XtX: np.ndarray,
    Xty: np.ndarray,
    yty: np.ndarray,
    n: np.ndarray,
    labels: np.ndarray,
    n_clusters: int,
    delta: float,
    sigma: float,
) -> dict[str, np.ndarray]:
    """Cluster statistics from scratch (Algorithm 2, lines 5-6).

    Parameters
    ----------
    XtX, Xty, yty, n : entity statistics, shapes (E, F, F), (E, F), (E,), (E,)
    labels : ndarray of int, shape (E,)
    n_clusters : int
    delta, sigma : float

    Returns
    -------
    dict with ``D`` (K, F, F) = I/delta^2 + sum X^T X / sigma^2, ``c`` (K, F) = sum X^T y /
    sigma^2, ``yty`` (K,), ``n_events`` (K,), ``n_entities`` (K,) for the entities labelled k.
    """
    K, F = int(n_clusters), XtX.shape[1]
    onehot = np.zeros((len(labels), K))
    onehot[np.arange(len(labels)), labels] = 1.0
    D = np.einsum("ek,eij->kij", onehot, XtX) / sigma**2 + np.eye(F)[None] / delta**2
    c = onehot.T @ Xty / sigma**2
    return {
        "D": D,
        "c": c,
        "yty": onehot.T @ yty,
        "n_events": onehot.T @ n,
        "n_entities": onehot.sum(axis=0),
    }


def entity_log_marginal(
    XtX: np.ndarray,
    Xty: np.ndarray,
    yty: np.ndarray,
    n: np.ndarray,
    D: np.ndarray,
    c: np.ndarray,
    sigma: float,
) -> np.ndarray:
    """Log marginal likelihood of every entity's targets under every cluster (Theorem 1).

    ``log p(y_e | X_e, cluster k) = -n/2 log(2 pi sigma^2) - y^T y / (2 sigma^2)
    + 1/2 c'^T D'^-1 c' - 1/2 log det D' - (1/2 c_k^T D_k^-1 c_k - 1/2 log det D_k)`` with
    ``D' = D_k + X^T X / sigma^2`` and ``c' = c_k + X^T y / sigma^2``: one Cholesky per
    (entity, cluster), whatever the number of events. Equals the product (3) of the predictive
    densities (4) of the event-by-event recursion (with the variance of eq. (27),
    ``sigma^2 + x^T A^-1 x``).

    Parameters
    ----------
    XtX, Xty, yty, n : entity statistics, shapes (E, F, F), (E, F), (E,), (E,)
    D : ndarray of shape (K, F, F)
        Cluster precisions (the entity's own data excluded, as in Algorithm 2).
    c : ndarray of shape (K, F)
    sigma : float

    Returns
    -------
    ndarray of shape (E, K)
    """
    return log_marginal_batch(
        np.ascontiguousarray(XtX, dtype=np.float64), np.ascontiguousarray(Xty, dtype=np.float64),
        np.ascontiguousarray(yty, dtype=np.float64), np.ascontiguousarray(n, dtype=np.float64),
        np.ascontiguousarray(D, dtype=np.float64), np.ascontiguousarray(c, dtype=np.float64),
        1.0 / sigma**2, math.log(2.0 * math.pi * sigma**2),
    )


def log_prior_factor(
    counts_agent: np.ndarray, counts_global: np.ndarray, alpha: float, beta: float
) -> np.ndarray:
    """Log of the label prior, eq. (2), up to its k-independent denominator.

    ``p(z_ij = k | z_-ij) = (N_i^(k) + beta (N^(k) + alpha/K) / (sum_k N^(k) + alpha))
    / (sum_k N_i^(k) + beta)``

    Parameters
    ----------
    counts_agent : ndarray of shape (..., K)
        ``N_i^(k)`` without the entity being sampled.
    counts_global : ndarray of shape (K,)
        ``N^(k)`` without the entity being sampled.
    alpha, beta : float

    Returns
    -------
    ndarray of shape (..., K), normalized over k (log probabilities).
    """
    K = counts_global.shape[-1]
    psi = (counts_global + alpha / K) / (counts_global.sum() + alpha)
    num = counts_agent + beta * psi
    return np.log(num) - np.log(num.sum(axis=-1, keepdims=True))


def project_gram_psd(XtX: np.ndarray, Xty: np.ndarray, yty: np.ndarray, rtol: float = 1e-9):
    """Project each cluster's ``[[X^T X, X^T y], [y^T X, y^T y]]`` on the PSD cone.

    Exact sums are Gram matrices of ``[X, y]``, hence PSD. A stochastic-approximation update
    (partial participation with step ``gamma/p``, control variates, quantization) can leave a
    combination that is not: the cluster's ``X^T X`` may lose positive semi-definiteness, or
    ``X^T y`` may be inconsistent with it, which makes the posterior mean ``H c`` blow up.
    Clusters whose smallest eigenvalue is below ``-rtol * scale`` are replaced by their
    nearest PSD matrix (Frobenius norm: negative eigenvalues set to 0); the others are returned
    unchanged (bit for bit), so exact federated sums are never altered.

    Parameters
    ----------
    XtX : ndarray of shape (K, F, F)
    Xty : ndarray of shape (K, F)
    yty : ndarray of shape (K,)

    Returns
    -------
    XtX, Xty, yty : the projected blocks
    projected : ndarray of bool, shape (K,)
    """
    K, F = Xty.shape
    G = bordered(XtX, Xty, yty)
    G = 0.5 * (G + np.swapaxes(G, 1, 2))
    lam, vec = np.linalg.eigh(G)
    scale = max(float(np.abs(lam).max()), 1.0)
    bad = (lam < -rtol * scale).any(axis=1)
    if not bad.any():
        return XtX, Xty, yty, bad
    P = np.einsum("kij,kj,klj->kil", vec, np.maximum(lam, 0.0), vec)
    XtX = np.where(bad[:, None, None], P[:, :F, :F], XtX)
    Xty = np.where(bad[:, None], P[:, :F, F], Xty)
    yty = np.where(bad, P[:, F, F], yty)
    return XtX, Xty, yty, bad


def posterior_means(D: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Posterior means ``w_k = H_k c_k`` with ``H_k = D_k^-1``; shape (K, F)."""
    return np.linalg.solve(D, c[..., None])[..., 0]


def predict_theorem2(X: np.ndarray, D: np.ndarray, c: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Theorem 2, eq. (10): ``y_hat = c_z^T H_z x`` for events with cluster labels ``labels``.

    Parameters
    ----------
    X : ndarray of shape (n, F)
    D : ndarray of shape (K, F, F)
    c : ndarray of shape (K, F)
    labels : ndarray of int, shape (n,)

    Returns
    -------
    ndarray of shape (n,)
    """
    W = posterior_means(D, c)
    return np.einsum("nf,nf->n", X, W[labels])


def entity_sse(XtX, Xty, yty, W, labels) -> np.ndarray:
    """Squared error of each entity's events under the mean ``W[labels]``, from statistics only:
    ``y^T y - 2 w^T X^T y + w^T X^T X w``; shape (E,)."""
    w = W[labels]
    return yty - 2.0 * np.einsum("ef,ef->e", w, Xty) + np.einsum("ef,efg,eg->e", w, XtX, w)


def hlcr_log_joint(
    cl: dict[str, np.ndarray],
    counts_agent: np.ndarray,
    alpha: float,
    beta: float,
    delta: float,
    sigma: float,
) -> float:
    """Log joint ``log p(y | X, z) + log p(z)`` of a labelling, from cluster statistics.

    ``log p(y | X, z)`` is exact: per cluster ``-n_k/2 log(2 pi sigma^2) - Y_k/(2 sigma^2)
    + 1/2 c_k^T D_k^-1 c_k - 1/2 log det D_k - F log delta``. For ``log p(z)`` the global
    proportions are plugged in at their posterior mean ``psi = (N^(k) + alpha/K)/(N + alpha)``:
    ``sum_i log DirMult(N_i | beta psi)`` (the exact value integrates psi out, which has no
    closed form).

    Parameters
    ----------
    cl : dict
        :func:`cluster_statistics` output.
    counts_agent : ndarray of shape (n_agents, K)
    """
    D, c = cl["D"], cl["c"]
    K, F = c.shape
    Lc = np.linalg.cholesky(D)
    u = np.linalg.solve(Lc, c[..., None])[..., 0]
    logdet = 2.0 * np.log(np.diagonal(Lc, axis1=1, axis2=2)).sum(axis=1)
    ll = float(np.sum(
        -0.5 * cl["n_events"] * math.log(2 * math.pi * sigma**2) - 0.5 * cl["yty"] / sigma**2
        + 0.5 * (u * u).sum(axis=1) - 0.5 * logdet - F * math.log(delta)
    ))
    Nk = counts_agent.sum(axis=0)
    psi = (Nk + alpha / K) / (Nk.sum() + alpha)
    a = beta * psi
    Ni = counts_agent.sum(axis=1)
    lz = float(np.sum(gammaln(beta) - gammaln(Ni + beta))
               + np.sum(gammaln(counts_agent + a) - gammaln(a)))
    return ll + lz
