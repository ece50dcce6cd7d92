"""HLCR and FedHLCR: hierarchical latent class regression for agent-entity-event data.

Agents (clients) hold entities, entities hold events ``(x, y)``. All events of one agent-entity
pair share a latent cluster ``z_ij``; cluster ``k`` is a Bayesian linear regression
``y ~ N(w_k^T x, sigma^2)`` with prior ``w_k ~ N(0, delta^2 I)``; labels follow the asymmetric-LDA
prior ``psi ~ Dir(alpha/K)``, ``theta_i ~ Dir(beta psi)``, ``z_ij ~ Cat(theta_i)``.

Two solvers:

``solver="gibbs"``
    Algorithm 2 of the paper, the exact collapsed Gibbs sampler on the pooled data (reference and
    research): remove an entity from its cluster, sample its label from eq. (1)-(2) and
    Theorem 1, add it back; one numba kernel sweeps all agents and entities.
``solver="federated"``
    FedHLCR, Algorithm 3, on the fedlatent engine: every agent samples its entities' labels
    against the broadcast cluster statistics and global counts, keeps labels and its own counts
    in its private state, and sends per-cluster sums; the server turns them into
    ``D_k = I/delta^2 + sum X^T X / sigma^2`` and ``c_k = sum X^T y / sigma^2``.
    ``Federation(step_size=gamma, participation=f, control_variates=False)`` gives the paper's
    smoothing (see :class:`HLCRModel` for the two differences with Algorithm 3).

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

import logging
import math
import time
from typing import Any

import numpy as np
from numba import njit
from scipy.special import gammaln

from ..data.dataset import ClientData, DataValidationError, FederatedDataset
from ..engine.federation import Federation
from ..engine.history import History, RoundRecord
from ..engine.inprocess import InProcessRuntime
from ..engine.loop import FitResult
from ..engine.messages import unpack
from ..engine.model import ClientStep, FederatedModel, Params, register_model
from ..engine.registry import register_estimator
from ..engine.runtime import Runtime
from ..engine.stats import Stats
from .base import FederatedEstimator, check_is_fitted, resolve_seed

__all__ = [
    "HLCR",
    "HLCRModel",
    "check_entities",
    "cluster_statistics",
    "entity_log_marginal",
    "entity_statistics",
    "gibbs_init",
    "gibbs_sweep",
    "hlcr_log_joint",
    "log_prior_factor",
    "predict_theorem2",
    "project_gram_psd",
    "sample_local_labels",
]

logger = logging.getLogger(__name__)
SOLVERS = ("gibbs", "federated")


# ---------------------------------------------------------------------------------------------
# Pure functions
# ---------------------------------------------------------------------------------------------
def add_intercept(X: np.ndarray, fit_intercept: bool) -> np.ndarray:
    """``X`` with a trailing column of ones when ``fit_intercept`` (the intercept gets the same
    ``N(0, delta^2)`` prior as the other coefficients)."""
    X = np.asarray(X, dtype=np.float64)
    if not fit_intercept:
        return X
    return np.hstack([X, np.ones((X.shape[0], 1))])


def entity_statistics(
    X: np.ndarray,
    y: np.ndarray,
    entity: np.ndarray,
    *,
    categories: np.ndarray | None = None,
    client: str = "?",
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

    Returns
    -------
    names : ndarray of str, shape (E,)
        Entity ids in sorted order (the order of every other output and of the labels).
    XtX : ndarray of shape (E, F, F)
    Xty : ndarray of shape (E, F)
    yty : ndarray of shape (E,)
    n : ndarray of shape (E,)
        Number of events of each entity.
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
    XtX, Xty, yty = _entity_sums(X, y, inv, len(names))
    return names, XtX, Xty, yty, n


@njit(cache=True)
def _entity_sums(X, y, inv, E):
    n, F = X.shape
    XtX = np.zeros((E, F, F))
    Xty = np.zeros((E, F))
    yty = np.zeros(E)
    for r in range(n):
        e = inv[r]
        yr = y[r]
        yty[e] += yr * yr
        for i in range(F):
            xi = X[r, i]
            Xty[e, i] += xi * yr
            for j in range(F):
                XtX[e, i, j] += xi * X[r, j]
    return XtX, Xty, yty


def check_entities(entity, client: str = "?") -> None:
    """Raise DataValidationError if a declared entity (categories of a pandas Categorical) has
    zero events, or if an entity id is missing."""
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


@njit(cache=True)
def _chol_terms(M, v, L, u):
    """log det M and v^T M^-1 v by one Cholesky of the (F, F) matrix M (NaN if not PD)."""
    F = M.shape[0]
    logdet = 0.0
    for j in range(F):
        s = M[j, j]
        for p in range(j):
            s -= L[j, p] * L[j, p]
        if s <= 0.0:
            return np.nan, np.nan
        d = math.sqrt(s)
        L[j, j] = d
        logdet += 2.0 * math.log(d)
        for i in range(j + 1, F):
            t = M[i, j]
            for p in range(j):
                t -= L[i, p] * L[j, p]
            L[i, j] = t / d
    quad = 0.0
    for i in range(F):
        t = v[i]
        for p in range(i):
            t -= L[i, p] * u[p]
        u[i] = t / L[i, i]
        quad += u[i] * u[i]
    return logdet, quad


@njit(cache=True)
def _entity_loglik(XtX_e, Xty_e, yty_e, n_e, Dk, ck, logdet_k, quad_k, inv_s2, log2pis2,
                   M, v, L, u):
    F = Dk.shape[0]
    for i in range(F):
        v[i] = ck[i] + Xty_e[i] * inv_s2
        for j in range(F):
            M[i, j] = Dk[i, j] + XtX_e[i, j] * inv_s2
    ld, q = _chol_terms(M, v, L, u)
    return (-0.5 * n_e * log2pis2 - 0.5 * yty_e * inv_s2 + 0.5 * q - 0.5 * ld
            - 0.5 * quad_k + 0.5 * logdet_k)


@njit(cache=True)
def _cluster_terms(D, c, L, u):
    """Each cluster's log det D_k and c_k^T D_k^-1 c_k (the normalizer of its posterior)."""
    K = D.shape[0]
    cl_ld = np.empty(K)
    cl_q = np.empty(K)
    for k in range(K):
        cl_ld[k], cl_q[k] = _chol_terms(D[k], c[k], L, u)
    return cl_ld, cl_q


@njit(cache=True)
def _log_marginal_batch(XtX, Xty, yty, n, D, c, inv_s2, log2pis2):
    E, F = XtX.shape[0], XtX.shape[1]
    K = D.shape[0]
    M = np.empty((F, F))
    L = np.zeros((F, F))
    v = np.empty(F)
    u = np.empty(F)
    cl_ld, cl_q = _cluster_terms(D, c, L, u)
    out = np.empty((E, K))
    for e in range(E):
        for k in range(K):
            out[e, k] = _entity_loglik(XtX[e], Xty[e], yty[e], n[e], D[k], c[k], cl_ld[k],
                                       cl_q[k], inv_s2, log2pis2, M, v, L, u)
    return out


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
    return _log_marginal_batch(
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


@njit(cache=True)
def _draw(logp, u):
    K = logp.shape[0]
    m = logp[0]
    for k in range(1, K):
        if logp[k] > m:
            m = logp[k]
    tot = 0.0
    for k in range(K):
        tot += math.exp(logp[k] - m)
    target = u * tot
    acc = 0.0
    for k in range(K):
        acc += math.exp(logp[k] - m)
        if acc > target:
            return k
    return K - 1


@njit(cache=True)
def _gibbs_sweep(XtX, Xty, yty, n, agent, z, D, c, Y, Nev, Nk, Nik, alpha, beta, inv_s2,
                 log2pis2, uniforms):
    """One sweep of Algorithm 2 over all entities, in place. Returns the number of changes."""
    E, F = XtX.shape[0], XtX.shape[1]
    K = D.shape[0]
    M = np.empty((F, F))
    L = np.zeros((F, F))
    v = np.empty(F)
    u = np.empty(F)
    cl_ld, cl_q = _cluster_terms(D, c, L, u)
    logp = np.empty(K)
    changed = 0
    for e in range(E):
        a = agent[e]
        k0 = z[e]
        # remove the entity from its cluster (Algorithm 2, lines 10-12)
        for i in range(F):
            c[k0, i] -= Xty[e, i] * inv_s2
            for j in range(F):
                D[k0, i, j] -= XtX[e, i, j] * inv_s2
        Y[k0] -= yty[e]
        Nev[k0] -= n[e]
        Nk[k0] -= 1.0
        Nik[a, k0] -= 1.0
        cl_ld[k0], cl_q[k0] = _chol_terms(D[k0], c[k0], L, u)
        # eq. (1): prior (2) times marginal likelihood (Theorem 1)
        tot = 0.0
        for k in range(K):
            tot += Nk[k]
        for k in range(K):
            psi = (Nk[k] + alpha / K) / (tot + alpha)
            logp[k] = math.log(Nik[a, k] + beta * psi) + _entity_loglik(
                XtX[e], Xty[e], yty[e], n[e], D[k], c[k], cl_ld[k], cl_q[k], inv_s2, log2pis2,
                M, v, L, u)
        k1 = _draw(logp, uniforms[e])
        if k1 != k0:
            changed += 1
        # add it to the new cluster (lines 14-16)
        z[e] = k1
        for i in range(F):
            c[k1, i] += Xty[e, i] * inv_s2
            for j in range(F):
                D[k1, i, j] += XtX[e, i, j] * inv_s2
        Y[k1] += yty[e]
        Nev[k1] += n[e]
        Nk[k1] += 1.0
        Nik[a, k1] += 1.0
        cl_ld[k1], cl_q[k1] = _chol_terms(D[k1], c[k1], L, u)
    return changed


@njit(cache=True)
def _sample_local(loglik, z, rows, Nk, alpha, beta, uniforms, logprior_out):
    """FedHLCR agent step: sequential labels of the entities ``rows`` (in place in ``z``).

    The agent's counts come from its own current labels (the entity itself excluded); the global
    counts ``Nk`` are the broadcast ones. Writes the log prior factor of each drawn label.
    """
    E, K = loglik.shape
    Nik = np.zeros(K)
    for e in range(E):
        if z[e] >= 0:
            Nik[z[e]] += 1.0
    tot = 0.0
    for k in range(K):
        tot += Nk[k]
    logp = np.empty(K)
    lp = np.empty(K)
    for r in range(rows.shape[0]):
        e = rows[r]
        if z[e] >= 0:
            Nik[z[e]] -= 1.0
        s = 0.0
        for k in range(K):
            lp[k] = Nik[k] + beta * (Nk[k] + alpha / K) / (tot + alpha)
            s += lp[k]
        for k in range(K):
            lp[k] = math.log(lp[k] / s)
            logp[k] = lp[k] + loglik[e, k]
        k1 = _draw(logp, uniforms[r])
        z[e] = k1
        Nik[k1] += 1.0
        logprior_out[r] = lp[k1]
    return z


def gibbs_init(
    entity_stats: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
    n_clusters: int,
    delta: float,
    sigma: float,
    rng: np.random.Generator,
    labels: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """State of the centralized sampler (Algorithm 2, lines 1-6).

    Parameters
    ----------
    entity_stats : list over agents of (XtX, Xty, yty, n)
        :func:`entity_statistics` of each agent (without the names).
    n_clusters : int
    delta, sigma : float
    rng : numpy.random.Generator
        Draws the initial labels uniformly (unless ``labels`` is given).
    labels : ndarray of int or None

    Returns
    -------
    dict of arrays: entity statistics ``XtX, Xty, yty, n``, ``agent`` (E,), labels ``z`` (E,),
    cluster statistics ``D`` (K, F, F), ``c`` (K, F), ``Y`` (K,), ``Nev`` (K,), ``Nk`` (K,)
    and per-agent counts ``Nik`` (n_agents, K). :func:`gibbs_sweep` updates it in place.
    """
    K = int(n_clusters)
    XtX = np.ascontiguousarray(np.concatenate([s[0] for s in entity_stats]))
    Xty = np.ascontiguousarray(np.concatenate([s[1] for s in entity_stats]))
    yty = np.concatenate([s[2] for s in entity_stats]).astype(np.float64)
    n = np.concatenate([s[3] for s in entity_stats]).astype(np.float64)
    agent = np.concatenate([np.full(len(s[3]), i, dtype=np.int64)
                            for i, s in enumerate(entity_stats)])
    if labels is None:
        z = rng.integers(0, K, size=len(n)).astype(np.int64)
    else:
        z = np.array(labels, dtype=np.int64)
    cl = cluster_statistics(XtX, Xty, yty, n, z, K, delta, sigma)
    Nik = np.zeros((len(entity_stats), K))
    np.add.at(Nik, (agent, z), 1.0)
    return {"XtX": XtX, "Xty": Xty, "yty": yty, "n": n, "agent": agent, "z": z,
            "D": np.ascontiguousarray(cl["D"]), "c": np.ascontiguousarray(cl["c"]),
            "Y": cl["yty"], "Nev": cl["n_events"], "Nk": cl["n_entities"], "Nik": Nik}


def gibbs_sweep(state: dict[str, np.ndarray], alpha: float, beta: float, sigma: float,
                uniforms: np.ndarray) -> int:
    """One collapsed Gibbs sweep over all agents and entities (Algorithm 2, lines 8-16).

    For each entity in turn: remove its statistics from its cluster, sample its label from
    eq. (1) = prior (2) x marginal likelihood (Theorem 1, from statistics), add it to the new
    cluster. Numba kernel; updates ``state`` (see :func:`gibbs_init`) in place.

    Parameters
    ----------
    uniforms : ndarray of shape (E,)
        One U(0, 1) draw per entity (inverse-CDF sampling of the label).

    Returns
    -------
    int : number of labels that changed.
    """
    s = state
    return int(_gibbs_sweep(s["XtX"], s["Xty"], s["yty"], s["n"], s["agent"], s["z"], s["D"],
                            s["c"], s["Y"], s["Nev"], s["Nk"], s["Nik"], float(alpha),
                            float(beta), 1.0 / sigma**2, math.log(2 * math.pi * sigma**2),
                            np.asarray(uniforms, dtype=np.float64)))


def sample_local_labels(
    loglik: np.ndarray,
    labels: np.ndarray,
    counts_global: np.ndarray,
    alpha: float,
    beta: float,
    rng: np.random.Generator,
    rows: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Sample the labels of one agent's entities in turn (Algorithm 3, lines 8-9).

    Parameters
    ----------
    loglik : ndarray of shape (E, K)
        Entity marginal likelihoods against the broadcast cluster statistics.
    labels : ndarray of int, shape (E,)
        Current labels (-1: not yet sampled); the agent's counts ``N_i^(k)`` come from them.
    counts_global : ndarray of shape (K,)
        Global entity counts ``N^(k)`` broadcast by the server.
    alpha, beta : float
    rng : numpy.random.Generator
    rows : ndarray of int or None
        Entities to resample (all when None).

    Returns
    -------
    labels : ndarray of int, shape (E,)
        New labels (a copy).
    log_prior : ndarray of shape (len(rows),)
        Log prior factor, eq. (2), of each drawn label.
    """
    E = loglik.shape[0]
    rows = np.arange(E, dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
    z = np.array(labels, dtype=np.int64, copy=True)
    lp = np.empty(len(rows))
    _sample_local(np.ascontiguousarray(loglik), z, rows, np.asarray(counts_global, np.float64),
                  float(alpha), float(beta), rng.random(len(rows)), lp)
    return z, lp


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
    G = np.empty((K, F + 1, F + 1))
    G[:, :F, :F] = XtX
    G[:, :F, F] = Xty
    G[:, F, :F] = Xty
    G[:, F, F] = yty
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


# ---------------------------------------------------------------------------------------------
# The model (engine contract): FedHLCR, Algorithm 3
# ---------------------------------------------------------------------------------------------
@register_model
class HLCRModel(FederatedModel):
    """FedHLCR on the engine. A unit is an entity; an agent sends per-cluster sums.

    Statistics an agent sends (sums over its entities labelled k): ``XtX`` (K, F, F), ``Xty``
    (K, F), ``yty`` (K,), ``n_events`` (K,), ``n_entities`` (K,), ``sse`` (K,) (squared error
    of the events under the broadcast posterior means, for the training MSE). Labels and the
    agent's counts ``N_i^(k)`` stay in its state (``labels``) and are never sent.

    Parameters sent down: ``D`` (K, F, F), ``c`` (K, F), ``counts`` (K,) (global ``N^(k)``),
    ``coef`` (K, F) posterior means, ``train_mse`` (scalar).

    Differences with Algorithm 3, all documented in the README:

    - The engine aggregates mean statistics and rescales by the participation probability:
      ``S <- S + gamma/p * sum_{c in A} w_c (S_c - S)`` (unbiased for the full-participation
      update). The paper adds the raw sums of the sampled agents, ``S <- (1 - gamma) S + gamma
      sum_{c in A} s_c``, whose fixed point is ``f * S_full`` (a fraction f of the data against
      the same prior). With ``p = 1`` both are ``(1 - gamma) S + gamma S_full``.
    - When ``gamma/p * sum_A w_c > 1`` the engine's update can leave a smoothed ``X^T X`` that
      is not positive semi-definite; the server step then projects it on the PSD cone (and
      counts on [0, inf)) so that ``D_k`` stays a precision. This is logged.
    - Agents sample labels in turn with their own counts ``N_i^(k)`` (the entity itself
      excluded) and the broadcast global counts ``N^(k)``; the entity's data are not removed
      from the broadcast statistics before sampling (as the paper says for FedHLCR).
    """

    name = "hlcr"

    def __init__(self, n_clusters: int, alpha: float, beta: float, delta: float, sigma: float,
                 fit_intercept: bool = True, n_features: int = 1):
        super().__init__(n_clusters=int(n_clusters), alpha=float(alpha), beta=float(beta),
                         delta=float(delta), sigma=float(sigma), fit_intercept=bool(fit_intercept),
                         n_features=int(n_features))
        self.K = int(n_clusters)
        self.alpha, self.beta = float(alpha), float(beta)
        self.delta, self.sigma = float(delta), float(sigma)
        self.fit_intercept = bool(fit_intercept)
        self.F = int(n_features) + int(self.fit_intercept)

    # ---- client side ----------------------------------------------------------------------
    def _entity_stats(self, data: ClientData):
        # an agent's entity statistics do not change between rounds: computed once per data
        cache = getattr(self, "_cache", None)
        if cache is not None and cache[0] is data:
            return cache[1]
        cats = getattr(data.entity, "categories", None)
        out = entity_statistics(add_intercept(data.X, self.fit_intercept), data.y,
                                data.entity if cats is None else np.asarray(data.entity),
                                categories=cats)
        self._cache = (data, out)
        return out

    def n_units(self, data: ClientData) -> int:
        return len(self._entity_stats(data)[0])

    def init_client_state(self, data: ClientData) -> dict[str, np.ndarray]:
        return {"labels": np.full(self.n_units(data), -1, dtype=np.int64)}

    def client_stats(self, params, data, state, rng, rows=None) -> ClientStep:
        _, XtX, Xty, yty, n = self._entity_stats(data)
        E = len(n)
        labels = np.asarray(state.get("labels", np.full(E, -1)), dtype=np.int64)
        rows = np.arange(E) if rows is None else np.asarray(rows, dtype=np.int64)
        loglik = entity_log_marginal(XtX[rows], Xty[rows], yty[rows], n[rows], params["D"],
                                     params["c"], self.sigma)
        full = np.zeros((E, self.K))
        full[rows] = loglik
        z, logprior = sample_local_labels(full, labels, params["counts"], self.alpha, self.beta,
                                          rng, rows)
        zr = z[rows]
        onehot = np.zeros((len(rows), self.K))
        onehot[np.arange(len(rows)), zr] = 1.0
        sse = entity_sse(XtX[rows], Xty[rows], yty[rows], params["coef"], zr)
        stats = Stats({
            "XtX": np.einsum("ek,eij->kij", onehot, XtX[rows]),
            "Xty": onehot.T @ Xty[rows],
            "yty": onehot.T @ yty[rows],
            "n_events": onehot.T @ n[rows],
            "n_entities": onehot.sum(axis=0),
            "sse": onehot.T @ sse,
        }, copy=False)
        objective = float(loglik[np.arange(len(rows)), zr].sum() + logprior.sum())
        return ClientStep(stats, len(rows), objective, {"labels": z})

    # ---- server side ----------------------------------------------------------------------
    def stat_shapes(self, params):
        K, F = self.K, self.F
        return {"XtX": (K, F, F), "Xty": (K, F), "yty": (K,), "n_events": (K,),
                "n_entities": (K,), "sse": (K,)}

    def initial_params(self) -> Params:
        """Algorithm 3, line 2: ``H = delta^2 I``, ``c = 0`` (no data), zero counts."""
        K, F = self.K, self.F
        return {"D": np.tile(np.eye(F) / self.delta**2, (K, 1, 1)), "c": np.zeros((K, F)),
                "counts": np.zeros(K), "coef": np.zeros((K, F)), "train_mse": np.array(np.nan)}

    def server_step(self, S: Stats, params: Params, n_total: float) -> Params:
        XtX, Xty, _, bad = project_gram_psd(S["XtX"] * n_total, S["Xty"] * n_total,
                                            S["yty"] * n_total)
        if bad.any():
            logger.debug("hlcr: smoothed statistics of clusters %s not a Gram matrix; "
                         "projected", np.flatnonzero(bad).tolist())
        F = self.F
        D = np.eye(F)[None] / self.delta**2 + XtX / self.sigma**2
        c = Xty / self.sigma**2
        counts = np.maximum(S["n_entities"] * n_total, 0.0)
        n_ev = float(np.maximum(S["n_events"], 0.0).sum())
        mse = float(np.maximum(S["sse"], 0.0).sum() / n_ev) if n_ev > 0 else float("nan")
        return {"D": D, "c": c, "counts": counts, "coef": posterior_means(D, c),
                "train_mse": np.array(mse)}


# ---------------------------------------------------------------------------------------------
# The estimator
# ---------------------------------------------------------------------------------------------
class _RoundTap(Runtime):
    """Wraps a runtime to record, server side, the parameters of every round and (in-process
    simulations only) the agents' labels after it: the path ``staged_predict`` replays."""

    def __init__(self, inner: Runtime, model: HLCRModel):
        self.inner = inner
        self.model = model
        self.path: dict[int, dict[str, Any]] = {}  # round -> params after it, labels
        self._last_round = 0  # the last round whose E-step was sent

    @property
    def client_ids(self):
        return self.inner.client_ids

    def _snapshot(self, params, first: int, last: int):
        states = self.inner.get_client_states()
        labels = None
        if states is not None:
            labels = {c: np.array(st["model/labels"]) for c, st in states.items()
                      if "model/labels" in st}
        entry = {"params": {k: np.array(v) for k, v in params.items()}, "labels": labels}
        # rounds in which no agent took part leave the statistic, hence the params, unchanged
        for r in range(first, last + 1):
            self.path[r] = entry

    def call(self, client_ids, method, messages):
        if method == "estep" and messages:
            msg = next(iter(messages.values()))
            rnd = int(msg["round"])
            if self._last_round:
                self._snapshot(unpack(msg, "params"), self._last_round, rnd - 1)
            self._last_round = rnd
        return self.inner.call(client_ids, method, messages)

    def finish(self, params, n_rounds: int):
        if self._last_round:
            self._snapshot(params, self._last_round, n_rounds)

    def get_client_states(self):
        return self.inner.get_client_states()

    def set_client_states(self, states):
        self.inner.set_client_states(states)


@register_estimator(
    "hlcr", target=True, entity=True,
    description="HLCR / FedHLCR: hierarchical latent class regression by Gibbs (Yang et al.)",
)
class HLCR(FederatedEstimator):
    """Hierarchical latent class regression (HLCR) and its federated version (FedHLCR).

    Parameters
    ----------
    n_clusters : int, default 4
        Number of linear models K (>= 1).
    alpha, beta : float, default 1.0
        Concentrations of the global and per-agent label priors (eq. (2)).
    delta : float, default 1.0
        Prior standard deviation of the coefficients, ``w_k ~ N(0, delta^2 I)``.
    sigma : float, default 1.0
        Noise standard deviation (> 0), fixed as in the paper.
    solver : {"federated", "gibbs"}, default "federated"
        "federated": FedHLCR (Algorithm 3) on the engine with ``federation``. "gibbs": the
        exact centralized collapsed Gibbs sampler (Algorithm 2) on the pooled data, a reference.
    max_iter : int, default 20
        Rounds (federated, the initialization round included) or sweeps (gibbs).
    burn_in : int or None
        Gibbs only: labels_ are the most frequent labels over the sweeps after ``burn_in``
        (None: the last sweep). The federated solver keeps the last sampled labels.
    tol : float, default 1e-6
        Stop when the mean per-entity log joint changes by less than ``tol`` between two
        iterations (with a sampler this happens when no label moves).
    federation : fl.Federation or None
        Federated solver settings; the paper's smoothing is
        ``Federation(step_size=gamma, participation=f, control_variates=False)``.
    fit_intercept : bool, default True
        Append a constant feature (its coefficient has the same prior).
    random_state : int, Generator or None
    verbose : bool or None
        Progress bar.

    Attributes
    ----------
    coef_ : ndarray of shape (K, n_features)
        Posterior means of the cluster coefficients, ``H_k c_k``.
    intercept_ : ndarray of shape (K,)
    covariances_ : ndarray of shape (K, F, F)
        Posterior covariances ``H_k = D_k^-1`` (F counts the intercept last).
    precisions_, c_ : ndarrays (K, F, F), (K, F)
        ``D_k`` and ``c_k`` of the paper.
    cluster_counts_ : ndarray of shape (K,)
        Entities per cluster ``N^(k)`` (smoothed in the federated solver).
    labels_ : ndarray of int, shape (n_pairs,)
        Cluster of every known (agent, entity) pair listed in ``pair_agents_``,
        ``pair_entities_``. For the federated solver the labels live on the agents; they are read
        from the runtime's client states (possible in-process), never from a message.
    history_ : History
        One row per iteration; ``history_.to_frame()`` adds ``log_joint`` and ``train_mse``
        (per entity / per event). Gibbs: the log joint of the labelling after the sweep
        (:func:`hlcr_log_joint`) and the training MSE under the posterior means. Federated: the
        mean over the participating entities of ``log p(y_e | z_e)`` against the broadcast
        statistics plus the log prior factor (2) of the drawn label (a Monte Carlo surrogate),
        and the training MSE implied by the smoothed server statistic (exact with all agents
        and gamma = 1).

    References
    ----------
    Yang, Carette, Jimbo, Maruyama, "Federated Latent Class Regression for Hierarchical Data",
    2022: Algorithms 2 and 3, eqs. (1)-(10).
    """

    _save_arrays = ("coef_", "intercept_", "precisions_", "c_", "covariances_",
                    "cluster_counts_", "labels_", "pair_agents_", "pair_entities_",
                    "history_log_joint_", "history_train_mse_")

    def __init__(self, n_clusters: int = 4, alpha: float = 1.0, beta: float = 1.0,
                 delta: float = 1.0, sigma: float = 1.0, solver: str = "federated",
                 max_iter: int = 20, burn_in: int | None = None, tol: float = 1e-6,
                 federation: Federation | None = None, fit_intercept: bool = True,
                 random_state=None, verbose: bool | None = None):
        self.n_clusters = n_clusters
        self.alpha = alpha
        self.beta = beta
        self.delta = delta
        self.sigma = sigma
        self.solver = solver
        self.max_iter = max_iter
        self.burn_in = burn_in
        self.tol = tol
        self.federation = federation
        self.fit_intercept = fit_intercept
        self.random_state = random_state
        self.verbose = verbose

    @property
    def max_rounds(self) -> int:
        return int(self.max_iter)

    # ---- validation -------------------------------------------------------------------------
    def _validate_params(self) -> None:
        K = self.n_clusters
        if isinstance(K, bool) or not isinstance(K, int | np.integer) or K < 1:
            raise ValueError(f"n_clusters must be an integer K >= 1, got {K!r}")
        for name in ("alpha", "beta", "delta", "sigma"):
            v = getattr(self, name)
            if not isinstance(v, int | float | np.number) or not np.isfinite(v) or v <= 0:
                raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
        if self.solver not in SOLVERS:
            raise ValueError(f"solver must be one of {SOLVERS}, got {self.solver!r}")
        if not isinstance(self.max_iter, int | np.integer) or self.max_iter < 1:
            raise ValueError(f"max_iter must be an integer >= 1, got {self.max_iter!r}")
        if self.burn_in is not None and not (0 <= int(self.burn_in) < int(self.max_iter)):
            raise ValueError(
                f"burn_in must be None or in [0, max_iter={self.max_iter}), got {self.burn_in!r}"
            )

    def _describe_local(self, fd: FederatedDataset) -> dict:
        self._validate_params()
        self._validate_data(fd)
        return {}

    def _validate_data(self, fd: FederatedDataset) -> None:
        if getattr(fd, "is_remote", False):  # every node ran the checks below on its own data
            return
        for cid, cd in fd.items():
            if cd.entity is None:
                raise DataValidationError(
                    f"client {cid!r} has no entity column; HLCR needs agent-entity-event data: "
                    "build the dataset with entity='COLUMN' (FederatedDataset.from_pandas)"
                )
            if cd.y is None:
                raise DataValidationError(
                    f"client {cid!r} has no target; HLCR is a regression: give target='COLUMN'"
                )
            y = np.asarray(cd.y)
            if not (np.issubdtype(y.dtype, np.number) or y.dtype == bool):
                raise DataValidationError(
                    f"client {cid!r}: target {fd.target_name or 'y'!r} is not numeric (dtype "
                    f"{y.dtype}); HLCR regresses a number: encode the target as numbers"
                )
            if not np.all(np.isfinite(y.astype(np.float64))):
                raise DataValidationError(
                    f"client {cid!r}: target {fd.target_name or 'y'!r} has NaN or infinite "
                    "values; drop those rows before fitting"
                )
            check_entities(cd.entity, cid)

    def _make_model(self, fd: FederatedDataset) -> HLCRModel:
        return HLCRModel(self.n_clusters, self.alpha, self.beta, self.delta, self.sigma,
                         self.fit_intercept, fd.n_features)

    def _initialize(self, runtime: Runtime, model: HLCRModel, seed: int) -> Params:
        return model.initial_params()

    # ---- fit --------------------------------------------------------------------------------
    def fit(self, fd: FederatedDataset, *, runtime: Runtime | None = None, **kwargs):
        """Fit on an agent-entity-event dataset (agent = client, ``fd`` built with an entity).

        ``runtime``, ``checkpoint``, ``resume``... are those of :meth:`FederatedEstimator.fit`
        (federated solver only).
        """
        self._validate_params()
        remote = getattr(fd, "is_remote", False)
        if not isinstance(fd, FederatedDataset) and not remote:
            raise TypeError(f"fit expects a fl.FederatedDataset, got {type(fd).__name__}")
        if remote and self.solver == "gibbs":
            raise ValueError("solver='gibbs' pools the data and cannot run on a RemoteDataset; "
                             "use solver='federated'")
        if self.solver == "gibbs":
            if runtime is not None or kwargs:
                raise ValueError("solver='gibbs' pools the data: runtime/checkpoint options "
                                 "apply to solver='federated' only")
            return self._fit_gibbs(fd)
        self._fd_pairs = fd
        model = self._make_model(fd)
        self._tap = _RoundTap(runtime if runtime is not None else InProcessRuntime(fd), model)
        try:
            super().fit(fd, runtime=self._tap, **kwargs)
        finally:
            self._tap = None
            self._fd_pairs = None
        return self

    def _pairs(self, fd: FederatedDataset):
        if getattr(fd, "is_remote", False):  # entity ids stay with their agents
            return np.array([], dtype=str), np.array([], dtype=str)
        agents, ents = [], []
        for cid, cd in fd.items():
            names = np.unique(np.asarray(cd.entity).astype(str))
            agents.append(np.full(len(names), cid, dtype=object))
            ents.append(names)
        return np.concatenate(agents).astype(str), np.concatenate(ents).astype(str)

    def _store(self, result: FitResult, model: HLCRModel) -> None:
        tap = self._tap
        tap.finish(result.params, result.n_rounds)
        self.pair_agents_, self.pair_entities_ = self._pairs(self._fd_pairs)
        states = tap.get_client_states()
        if states is not None:
            self.labels_ = np.concatenate([
                np.asarray(states[c]["model/labels"], dtype=np.int64)
                for c in self._fd_pairs.client_ids
            ])
        else:
            self.labels_ = np.full(len(self.pair_agents_), -1, dtype=np.int64)
        self._set_cluster_params(result.params["D"], result.params["c"], result.params["counts"])
        # rounds run before a resume are not in the tap: their training MSE is unknown
        self._path = [self._path_entry(tap.path[r]["params"], tap.path[r]["labels"])
                      for r in sorted(tap.path)]
        self.history_log_joint_ = np.array([r.objective for r in result.history], dtype=float)
        self.history_train_mse_ = np.array(
            [float(tap.path[r.round]["params"]["train_mse"]) if r.round in tap.path else np.nan
             for r in result.history], dtype=float)
        self.history_ = _HLCRHistory(result.history, self)

    def _path_entry(self, params, labels):
        lab = None
        if labels is not None:
            lab = np.concatenate([labels[c] for c in sorted(labels)])
        return {"D": params["D"], "c": params["c"], "counts": params["counts"], "labels": lab}

    def _set_cluster_params(self, D, c, counts) -> None:
        D = np.asarray(D, dtype=np.float64)
        self.precisions_ = D
        self.c_ = np.asarray(c, dtype=np.float64)
        self.covariances_ = np.linalg.inv(D)
        W = posterior_means(D, self.c_)
        F = self.n_features_in_
        self.coef_ = W[:, :F]
        self.intercept_ = W[:, F] if self.fit_intercept else np.zeros(len(W))
        self.cluster_counts_ = np.asarray(counts, dtype=np.float64)

    def _fit_gibbs(self, fd: FederatedDataset):
        self._validate_data(fd)
        seed = resolve_seed(self.random_state)
        rng = np.random.default_rng(seed)
        K = int(self.n_clusters)
        model = self._make_model(fd)
        st = [model._entity_stats(cd) for _, cd in fd.items()]
        state = gibbs_init(
            [s[1:] for s in st], K, self.delta, self.sigma, rng
        )
        n, z, A = state["n"], state["z"], len(st)
        history = History()
        lj, mses, path = [], [], []
        freq = np.zeros((len(n), K))
        converged = False
        for t in range(1, int(self.max_iter) + 1):
            t0 = time.perf_counter()
            changed = gibbs_sweep(state, self.alpha, self.beta, self.sigma,
                                  rng.random(len(n)))
            D, c, Nk = state["D"], state["c"], state["Nk"]
            cur = {"D": D, "c": c, "yty": state["Y"], "n_events": state["Nev"],
                   "n_entities": Nk}
            lj.append(hlcr_log_joint(cur, state["Nik"], self.alpha, self.beta, self.delta,
                                     self.sigma) / len(n))
            W = posterior_means(D, c)
            mses.append(float(entity_sse(state["XtX"], state["Xty"], state["yty"], W, z).sum()
                              / n.sum()))
            path.append({"D": D.copy(), "c": c.copy(), "counts": Nk.copy(), "labels": z.copy()})
            if self.burn_in is not None and t > self.burn_in:
                freq[np.arange(len(z)), z] += 1.0
            history.append(RoundRecord(round=t, objective=lj[-1], h_norm2=None,
                                       bytes_up=0, bytes_down=0, participants=A, step_size=1.0,
                                       seconds=time.perf_counter() - t0))
            logger.debug("hlcr gibbs sweep %d: %d labels changed", t, changed)
            if len(history) >= 2 and abs(history[-1].objective - history[-2].objective) < self.tol:
                converged = True
                break
        if self.burn_in is not None and freq.sum() > 0:
            z = freq.argmax(axis=1).astype(np.int64)
            cl = cluster_statistics(state["XtX"], state["Xty"], state["yty"], n, z, K,
                                    self.delta, self.sigma)
            D, c, Nk = cl["D"], cl["c"], cl["n_entities"]
        self.seed_ = seed
        self.n_features_in_ = fd.n_features
        self.feature_names_in_ = list(fd.feature_names)
        self.converged_ = converged
        self.n_rounds_ = len(history)
        self.pair_agents_, self.pair_entities_ = self._pairs(fd)
        self.labels_ = z.copy()
        self._set_cluster_params(D, c, Nk)
        self._path = path
        self.history_log_joint_ = np.array(lj)
        self.history_train_mse_ = np.array(mses)
        self.history_ = _HLCRHistory(history, self)
        return self

    # ---- persistence ------------------------------------------------------------------------
    def save(self, path) -> None:
        full = self.history_
        self.history_ = History(full)
        try:
            super().save(path)
        finally:
            self.history_ = full

    def _after_load(self) -> None:
        self.labels_ = np.asarray(self.labels_, dtype=np.int64)
        self.pair_agents_ = np.asarray(self.pair_agents_).astype(str)
        self.pair_entities_ = np.asarray(self.pair_entities_).astype(str)
        self.history_ = _HLCRHistory(self.history_, self)
        self._path = []

    # ---- prediction -------------------------------------------------------------------------
    def _agent_counts(self, labels: np.ndarray) -> dict[str, np.ndarray]:
        K = int(self.n_clusters)
        out: dict[str, np.ndarray] = {}
        ok = labels >= 0
        for a in np.unique(self.pair_agents_):
            m = (self.pair_agents_ == a) & ok
            out[str(a)] = np.bincount(labels[m], minlength=K).astype(float)
        return out

    def global_proportions(self, counts: np.ndarray | None = None) -> np.ndarray:
        """Cluster proportions for a new agent: ``(N^(k) + alpha/K) / (N + alpha)``; (K,)."""
        check_is_fitted(self)
        Nk = self.cluster_counts_ if counts is None else counts
        K = len(Nk)
        return (Nk + self.alpha / K) / (Nk.sum() + self.alpha)

    def _cluster_proba(self, agents, entities, context, D, c, counts, labels):
        K = int(self.n_clusters)
        agents = np.asarray(agents).astype(str)
        entities = np.asarray(entities).astype(str)
        key = np.char.add(np.char.add(agents, "\x1f"), entities)
        ukey, inv = np.unique(key, return_inverse=True)
        known_key = np.char.add(np.char.add(self.pair_agents_, "\x1f"), self.pair_entities_)
        order = np.argsort(known_key)
        pos = np.searchsorted(known_key[order], ukey)
        pos = np.minimum(pos, max(len(order) - 1, 0))
        hit = known_key[order][pos] == ukey
        lab_pair = np.where(hit, labels[order][pos], -1)
        psi = self.global_proportions(counts)
        acounts = self._agent_counts(labels)
        ctx = {}
        if context is not None:
            for cid, cd in context.items():
                names, XtX, Xty, yty, nn = entity_statistics(
                    add_intercept(cd.X, self.fit_intercept), cd.y, np.asarray(cd.entity),
                    client=cid)
                ll = entity_log_marginal(XtX, Xty, yty, nn, D, c, self.sigma)
                for j, e in enumerate(names):
                    ctx[f"{cid}\x1f{e}"] = ll[j]
        P = np.empty((len(ukey), K))
        for u, kk in enumerate(ukey):  # loop over distinct pairs, not events
            if lab_pair[u] >= 0:
                P[u] = np.eye(K)[lab_pair[u]]
                continue
            a = kk.split("\x1f", 1)[0]
            if a in acounts:
                Ni = acounts[a]
                prior = (Ni + self.beta * psi) / (Ni.sum() + self.beta)
            else:
                prior = psi
            lp = np.log(prior) + ctx.get(kk, 0.0)
            lp = np.exp(lp - lp.max())
            P[u] = lp / lp.sum()
        return P[inv]

    def predict_proba(self, agents, entities, context: FederatedDataset | None = None):
        """Posterior cluster probabilities of each row's (agent, entity) pair; (n, K).

        Known pairs: a point mass on their label. A new entity of a known agent: the agent's
        proportions ``(N_i^(k) + beta psi)/(N_i + beta)`` times the marginal likelihood
        (Theorem 1) of the entity's observed events in ``context`` (if any). A new agent: the
        global proportions ``psi`` (times the context likelihood).
        """
        check_is_fitted(self)
        return self._cluster_proba(agents, entities, context, self.precisions_, self.c_,
                                   self.cluster_counts_, self.labels_)

    def _predict_with(self, X, agents, entities, context, method, D, c, counts, labels):
        if method not in ("map", "mean"):
            raise ValueError(f"method must be 'map' or 'mean', got {method!r}")
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.n_features_in_:
            raise ValueError(
                f"X must have shape (n, {self.n_features_in_}), got {X.shape}"
            )
        Xa = add_intercept(X, self.fit_intercept)
        P = self._cluster_proba(agents, entities, context, D, c, counts, labels)
        W = posterior_means(D, c)
        per = Xa @ W.T  # (n, K): Theorem 2 under each cluster
        if method == "map":
            return per[np.arange(len(X)), P.argmax(axis=1)]
        return (P * per).sum(axis=1)

    def predict(self, X, agents, entities, context: FederatedDataset | None = None,
                method: str = "map") -> np.ndarray:
        """Predict targets (Theorem 2, ``c_k^T H_k x``).

        Parameters
        ----------
        X : ndarray of shape (n, n_features)
        agents, entities : array-like of shape (n,)
            Agent (client) and entity id of each row.
        context : FederatedDataset or None
            Observed events (with targets) of new pairs, used for their cluster posterior.
        method : {"map", "mean"}
            "map": the model of the most probable cluster; "mean": the posterior-mean prediction
            ``sum_k p(k) c_k^T H_k x``.

        Returns
        -------
        ndarray of shape (n,)
        """
        check_is_fitted(self)
        return self._predict_with(X, agents, entities, context, method, self.precisions_,
                                  self.c_, self.cluster_counts_, self.labels_)

    def predict_dataset(self, fd: FederatedDataset, context: FederatedDataset | None = None,
                        method: str = "map") -> np.ndarray:
        """Predictions for every event of ``fd`` (client order, rows in order); (n_events,)."""
        X, agents, ents = _flatten(fd)
        return self.predict(X, agents, ents, context=context, method=method)

    def staged_predict(self, fd: FederatedDataset, method: str = "map"):
        """Predictions for ``fd`` after every iteration of the last fit (not kept by save)."""
        check_is_fitted(self)
        X, agents, ents = _flatten(fd)
        for p in self._path:
            labels = p["labels"] if p["labels"] is not None else self.labels_
            yield self._predict_with(X, agents, ents, None, method, p["D"], p["c"], p["counts"],
                                     labels)

    def mse(self, fd: FederatedDataset, context: FederatedDataset | None = None,
            method: str = "map") -> float:
        """Mean squared error on the events of ``fd``."""
        y = np.concatenate([cd.y for _, cd in fd.items()]).astype(np.float64)
        return float(np.mean((self.predict_dataset(fd, context, method) - y) ** 2))


def _flatten(fd: FederatedDataset):
    Xs, agents, ents = [], [], []
    for cid, cd in fd.items():
        Xs.append(cd.X)
        agents.append(np.full(cd.n_samples, cid, dtype=object))
        if cd.entity is None:
            raise DataValidationError(f"client {cid!r} has no entity column")
        ents.append(np.asarray(cd.entity).astype(str))
    return np.vstack(Xs), np.concatenate(agents).astype(str), np.concatenate(ents)


class _HLCRHistory(History):
    """The engine's round records plus the per-iteration log joint and training MSE."""

    def __init__(self, records, est: HLCR):
        super().__init__(records)
        self.log_joint = list(np.asarray(est.history_log_joint_, dtype=float))
        self.train_mse = list(np.asarray(est.history_train_mse_, dtype=float))

    def to_frame(self):
        df = super().to_frame()
        n = len(df)
        df["log_joint"] = (self.log_joint + [np.nan] * n)[:n]
        df["train_mse"] = (self.train_mse + [np.nan] * n)[:n]
        return df
