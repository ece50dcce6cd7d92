"""Literal ports of the HLCR paper's Algorithms 1 and 2 (event-by-event Woodbury recursions).

The reference the fast statistics path of ``fedlatent.models.hlcr`` must match. Deliberately
plain Python and NumPy, one event at a time, as written in the paper.

Two typos of the paper are corrected here (the appendix proof is followed):

- eq. (4) prints the predictive variance as ``sigma^2 + x^T A^-1 x / sigma^2``; the proof, eq.
  (27), gives ``sigma^2 + x^T A_{n-1}^-1 x`` (A is the posterior precision of w).
- Algorithm 1 updates ``A_n, b_n`` (lines 6-7) before evaluating ``p_ijn`` (line 8), but eq. (4)
  evaluates it with ``A_{n-1}, b_{n-1}``; we evaluate before updating, as eq. (4) says.

Reference: Yang, Carette, Jimbo, Maruyama, "Federated Latent Class Regression for Hierarchical
Data" (2022), Theorem 1, eqs. (4)-(9), (26)-(27), Algorithms 1-2.
"""

from __future__ import annotations

import math

import numpy as np


def prior_eq2(Ni: np.ndarray, Nk: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    """Eq. (2) for every k, literally."""
    K = len(Nk)
    return np.array([
        (Ni[k] + beta * (Nk[k] + alpha / K) / (Nk.sum() + alpha)) / (Ni.sum() + beta)
        for k in range(K)
    ])


def log_likelihood_algorithm1(Xij, yij, H, c, sigma):
    """log p(y_ij | cluster k) for every k by the recursion of Algorithm 1 (lines 4-9)."""
    K = len(c)
    s2 = sigma * sigma
    out = np.empty(K)
    for k in range(K):
        Ainv = np.array(H[k], dtype=float)  # line 4: A_0^-1 <- H^(k), b_0 <- c^(k)
        b = np.array(c[k], dtype=float)
        logp = 0.0
        for n in range(len(yij)):
            x = Xij[n]
            y = yij[n]
            mean = b @ Ainv @ x  # eq. (4)/(26)
            var = s2 + x @ Ainv @ x  # eq. (27)
            logp += -0.5 * math.log(2 * math.pi * var) - 0.5 * (y - mean) ** 2 / var
            b = b + x * y / s2  # line 6, eq. (7)
            Ax = Ainv @ x  # line 7, eq. (8)
            Ainv = Ainv - (1.0 / s2) * np.outer(Ax, Ax) / (1.0 + (1.0 / s2) * (x @ Ax))
        out[k] = logp
    return out


def sample_label_algorithm1(Xij, yij, H, c, prior, sigma, u):
    """SAMPLELABEL: Categorical(prior_k * prod_n p_ijn) drawn by inverse CDF with uniform ``u``."""
    logp = np.log(prior) + log_likelihood_algorithm1(Xij, yij, H, c, sigma)
    p = np.exp(logp - logp.max())
    cum = np.cumsum(p)
    return int(min(np.searchsorted(cum, u * cum[-1], side="right"), len(p) - 1))


def hlcr_algorithm2(events, agent_of, z0, K, alpha, beta, delta, sigma, uniforms):
    """Algorithm 2 with H kept by Woodbury downdates (9) and updates (8), event by event.

    Parameters
    ----------
    events : list over entities of (X_ij, y_ij)
    agent_of : list of int, the agent of each entity
    z0 : initial labels
    uniforms : ndarray (T, E), one uniform per entity per sweep

    Returns
    -------
    labels after every sweep (list of arrays), final H (K, F, F) and c (K, F)
    """
    s2 = sigma * sigma
    F = events[0][0].shape[1]
    z = np.array(z0, dtype=int)
    n_agents = max(agent_of) + 1
    Ni = np.zeros((n_agents, K))
    for e, a in enumerate(agent_of):
        Ni[a, z[e]] += 1
    H, c = [], []
    for k in range(K):  # lines 5-6
        D = np.eye(F) / delta**2
        ck = np.zeros(F)
        for e, (X, y) in enumerate(events):
            if z[e] == k:
                D = D + X.T @ X / s2
                ck = ck + X.T @ y / s2
        H.append(np.linalg.inv(D))
        c.append(ck)
    out = []
    for t in range(uniforms.shape[0]):
        for e, (X, y) in enumerate(events):
            a, k0 = agent_of[e], z[e]
            for n in range(len(y) - 1, -1, -1):  # lines 10-12, eq. (9)
                x = X[n]
                Hx = H[k0] @ x
                H[k0] = H[k0] + (1.0 / s2) * np.outer(Hx, Hx) / (1.0 - (1.0 / s2) * (x @ Hx))
                c[k0] = c[k0] - x * y[n] / s2
            Ni[a, k0] -= 1
            prior = prior_eq2(Ni[a], Ni.sum(axis=0), alpha, beta)
            k1 = sample_label_algorithm1(X, y, H, c, prior, sigma, uniforms[t, e])  # line 13
            z[e] = k1
            Ni[a, k1] += 1
            for n in range(len(y)):  # lines 14-16, eq. (8)
                x = X[n]
                Hx = H[k1] @ x
                H[k1] = H[k1] - (1.0 / s2) * np.outer(Hx, Hx) / (1.0 + (1.0 / s2) * (x @ Hx))
                c[k1] = c[k1] + x * y[n] / s2
        out.append(z.copy())
    return out, np.array(H), np.array(c)
