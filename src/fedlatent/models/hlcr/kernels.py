"""The compiled (numba) kernels of HLCR: in-place loops over entities and clusters.

The documented functions of :mod:`fedlatent.models.hlcr.math` call them; their array
arguments are not checked here.
Every kernel works on contiguous float64 arrays and allocates its small scratch buffers once.

References
----------
Yang, Carette, Jimbo, Maruyama. "Federated Latent Class Regression for Hierarchical Data"
(2022): Theorem 1 (entity marginal likelihood), eq. (2) (prior factor), Algorithms 2-3.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

__all__ = [
    "chol_terms",
    "cluster_terms",
    "draw_label",
    "entity_loglik",
    "entity_sums",
    "gibbs_sweep_kernel",
    "log_marginal_batch",
    "sample_local_kernel",
    "scratch",
]


@njit(cache=True)
def entity_sums(X, y, inv, E):
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


@njit(cache=True)
def chol_terms(M, v, L, u):
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
def entity_loglik(XtX_e, Xty_e, yty_e, n_e, Dk, ck, logdet_k, quad_k, inv_s2, log2pis2,
                   M, v, L, u):
    F = Dk.shape[0]
    for i in range(F):
        v[i] = ck[i] + Xty_e[i] * inv_s2
        for j in range(F):
            M[i, j] = Dk[i, j] + XtX_e[i, j] * inv_s2
    ld, q = chol_terms(M, v, L, u)
    return (-0.5 * n_e * log2pis2 - 0.5 * yty_e * inv_s2 + 0.5 * q - 0.5 * ld
            - 0.5 * quad_k + 0.5 * logdet_k)


@njit(cache=True)
def cluster_terms(D, c, L, u):
    """Each cluster's log det D_k and c_k^T D_k^-1 c_k (the normalizer of its posterior)."""
    K = D.shape[0]
    cl_ld = np.empty(K)
    cl_q = np.empty(K)
    for k in range(K):
        cl_ld[k], cl_q[k] = chol_terms(D[k], c[k], L, u)
    return cl_ld, cl_q


@njit(cache=True)
def scratch(F):
    """The work arrays of :func:`chol_terms` and :func:`entity_loglik` for F features:
    ``M`` (F, F), ``L`` (F, F, zeros: its upper triangle is never written), ``v``, ``u`` (F,)."""
    return np.empty((F, F)), np.zeros((F, F)), np.empty(F), np.empty(F)


@njit(cache=True)
def log_marginal_batch(XtX, Xty, yty, n, D, c, inv_s2, log2pis2):
    E, F = XtX.shape[0], XtX.shape[1]
    K = D.shape[0]
    M, L, v, u = scratch(F)
    cl_ld, cl_q = cluster_terms(D, c, L, u)
    out = np.empty((E, K))
    for e in range(E):
        for k in range(K):
            out[e, k] = entity_loglik(XtX[e], Xty[e], yty[e], n[e], D[k], c[k], cl_ld[k],
                                       cl_q[k], inv_s2, log2pis2, M, v, L, u)
    return out


@njit(cache=True)
def draw_label(logp, u):
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
def gibbs_sweep_kernel(XtX, Xty, yty, n, agent, z, D, c, Y, Nev, Nk, Nik, alpha, beta, inv_s2,
                 log2pis2, uniforms):
    """One sweep of Algorithm 2 over all entities, in place. Returns the number of changes."""
    E, F = XtX.shape[0], XtX.shape[1]
    K = D.shape[0]
    M, L, v, u = scratch(F)
    cl_ld, cl_q = cluster_terms(D, c, L, u)
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
        cl_ld[k0], cl_q[k0] = chol_terms(D[k0], c[k0], L, u)
        # eq. (1): prior (2) times marginal likelihood (Theorem 1)
        tot = 0.0
        for k in range(K):
            tot += Nk[k]
        for k in range(K):
            psi = (Nk[k] + alpha / K) / (tot + alpha)
            logp[k] = math.log(Nik[a, k] + beta * psi) + entity_loglik(
                XtX[e], Xty[e], yty[e], n[e], D[k], c[k], cl_ld[k], cl_q[k], inv_s2, log2pis2,
                M, v, L, u)
        k1 = draw_label(logp, uniforms[e])
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
        cl_ld[k1], cl_q[k1] = chol_terms(D[k1], c[k1], L, u)
    return changed


@njit(cache=True)
def sample_local_kernel(loglik, z, rows, Nk, alpha, beta, uniforms, logprior_out):
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
        k1 = draw_label(logp, uniforms[r])
        z[e] = k1
        Nik[k1] += 1.0
        logprior_out[r] = lp[k1]
    return z
