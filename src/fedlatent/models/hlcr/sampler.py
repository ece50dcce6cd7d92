"""HLCR's label samplers: the entry points of the numba kernels (Algorithm 2's collapsed Gibbs
sweep over the pooled data, Algorithm 3's sequential draws on one agent).

References
----------
Yang, Carette, Jimbo, Maruyama. "Federated Latent Class Regression for Hierarchical Data"
(2022): eqs. (1)-(2), Theorem 1, Algorithms 2 and 3.
"""

from __future__ import annotations

import math

import numpy as np

from .kernels import gibbs_sweep_kernel, sample_local_kernel
from .math import cluster_statistics

__all__ = ["gibbs_init", "gibbs_sweep", "sample_local_labels", "sample_public_prior_labels"]


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
    return int(gibbs_sweep_kernel(s["XtX"], s["Xty"], s["yty"], s["n"], s["agent"], s["z"],
                                  s["D"], s["c"], s["Y"], s["Nev"], s["Nk"], s["Nik"],
                                  float(alpha), float(beta), 1.0 / sigma**2,
                                  math.log(2 * math.pi * sigma**2),
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
    sample_local_kernel(np.ascontiguousarray(loglik), z, rows,
                        np.asarray(counts_global, np.float64), float(alpha), float(beta),
                        rng.random(len(rows)), lp)
    return z, lp


def sample_public_prior_labels(
    loglik: np.ndarray,
    labels: np.ndarray,
    counts_global: np.ndarray,
    alpha: float,
    rng: np.random.Generator,
    rows: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Labels of one agent's entities under the global prior only (differential privacy).

    As :func:`sample_local_labels` without the agent's own counts: every entity independently
    gets ``k`` with probability proportional to ``psi_k L_k``, ``psi_k = (N^(k) + alpha/K) /
    (N + alpha)`` from the broadcast counts (floored at 0) and ``L_k`` its marginal likelihood.
    No entity's label then depends on another's (see :mod:`.privacy`). Same draws as the
    kernel: one uniform per entity of ``rows``, inverse-CDF over the clusters in order.

    Returns
    -------
    labels : ndarray of int, shape (E,)
        New labels (a copy).
    log_prior : ndarray of shape (len(rows),)
        ``log psi`` of each drawn label.
    """
    E, K = loglik.shape
    rows = np.arange(E, dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
    Nk = np.maximum(np.asarray(counts_global, dtype=np.float64), 0.0)
    logpsi = np.log((Nk + alpha / K) / (Nk.sum() + alpha))
    logp = loglik[rows] + logpsi
    p = np.exp(logp - logp.max(axis=1, keepdims=True))
    cum = np.cumsum(p, axis=1)
    target = rng.random(len(rows)) * cum[:, -1]
    k = np.minimum((cum <= target[:, None]).sum(axis=1), K - 1)
    z = np.array(labels, dtype=np.int64, copy=True)
    z[rows] = k
    return z, logpsi[k]
