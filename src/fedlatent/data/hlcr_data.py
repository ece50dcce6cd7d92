"""SYNTHHLCR: synthetic agent-entity-event data drawn from the HLCR model (Yang et al., sec. 6).

References
----------
Yang, Carette, Jimbo, Maruyama, "Federated Latent Class Regression for Hierarchical Data", 2022,
section 4.1 (generative model, Figure 2) and section 6 (SYNTHHLCR).
"""

from __future__ import annotations

import numpy as np

from .dataset import ClientData, FederatedDataset

__all__ = ["make_synthhlcr", "split_events"]


def _dirichlet(rng: np.random.Generator, conc: np.ndarray) -> np.ndarray:
    g = rng.gamma(conc)
    if g.sum() <= 0.0:  # every draw underflowed: fall back to one category at random
        g = np.zeros_like(conc)
        g[rng.choice(len(conc), p=conc / conc.sum())] = 1.0
    return g / g.sum()


def make_synthhlcr(
    n_agents: int = 128,
    n_entities: int = 128,
    entities_per_agent: float = 4.0,
    events_per_entity: float = 20.0,
    n_clusters: int = 16,
    n_features: int = 10,
    sigma: float = 1.0,
    delta: float = 1.0,
    alpha: float = 1.0,
    beta: float = 1.0,
    random_state=None,
    return_truth: bool = False,
):
    """Draw a SYNTHHLCR dataset from the HLCR generative model.

    1. ``w_k ~ N(0, delta^2 I)`` for each of ``n_clusters`` clusters;
    2. ``psi ~ Dir(alpha/K)``; 3. ``theta_i ~ Dir(beta psi)`` per agent;
    4. agent i holds ``1 + Poisson(N* - 1)`` distinct entities out of ``n_entities`` (at most all),
       each with ``z_ij ~ Cat(theta_i)``;
    5. entity (i, j) has ``1 + Poisson(N** - 1)`` events with ``x ~ N(0, I_F)`` and
       ``y = w_{z_ij}^T x + N(0, sigma^2)``.

    Parameters
    ----------
    n_agents, n_entities : int
        128 and 128 in the paper.
    entities_per_agent : float
        Average number of entities per agent N* (>= 1).
    events_per_entity : float
        Average number of events per agent-entity pair N** (>= 1).
    n_clusters, n_features : int
    sigma, delta, alpha, beta : float
        Noise, coefficient prior and label-prior concentrations.
    random_state : int, Generator or None
    return_truth : bool
        Also return a dict with the true coefficients ``W`` (K, F), global proportions ``psi``
        and labels ``labels`` ({(agent, entity): k}).

    Returns
    -------
    fd : FederatedDataset
        Agents are clients (``"a000"``...), the entity column holds ``"e000"``...; every pair has
        at least one event.
    truth : dict, only if ``return_truth``
    """
    for name, v in (("n_agents", n_agents), ("n_entities", n_entities),
                    ("n_clusters", n_clusters), ("n_features", n_features)):
        if int(v) < 1:
            raise ValueError(f"{name} must be >= 1, got {v!r}")
    if entities_per_agent < 1 or events_per_entity < 1:
        raise ValueError("entities_per_agent and events_per_entity must be >= 1")
    if sigma <= 0 or delta <= 0 or alpha <= 0 or beta <= 0:
        raise ValueError("sigma, delta, alpha and beta must be > 0")
    rng = np.random.default_rng(random_state)
    K, F = int(n_clusters), int(n_features)
    W = rng.normal(0.0, delta, size=(K, F))
    psi = _dirichlet(rng, np.full(K, alpha / K))
    clients: dict[str, ClientData] = {}
    labels: dict[tuple[str, str], int] = {}
    width = len(str(max(n_agents, n_entities) - 1))
    for i in range(int(n_agents)):
        aid = f"a{i:0{width}d}"
        theta = _dirichlet(rng, beta * psi + 1e-300)
        m = min(int(n_entities), 1 + int(rng.poisson(entities_per_agent - 1)))
        ents = np.sort(rng.choice(int(n_entities), size=m, replace=False))
        z = rng.choice(K, size=m, p=theta)
        counts = 1 + rng.poisson(events_per_entity - 1, size=m)
        X = rng.normal(size=(int(counts.sum()), F))
        zz = np.repeat(z, counts)
        y = np.einsum("nf,nf->n", X, W[zz]) + rng.normal(0.0, sigma, size=len(zz))
        ent = np.repeat(np.array([f"e{j:0{width}d}" for j in ents]), counts)
        clients[aid] = ClientData(X, y, ent)
        for j, k in zip(ents, z):
            labels[(aid, f"e{j:0{width}d}")] = int(k)
    fd = FederatedDataset(clients, [f"x{f}" for f in range(F)], target_name="y",
                          entity_name="entity")
    if return_truth:
        return fd, {"W": W, "psi": psi, "labels": labels}
    return fd


def split_events(fd: FederatedDataset, n_folds: int = 5, random_state=None):
    """K-fold split of the events *within* every agent-entity pair (the test events belong to
    known pairs, as in the paper's cross-validation).

    Yields ``(train, test)`` FederatedDatasets, one per fold. A pair with fewer events than
    folds is absent from some test folds; an agent whose events all fall in the test fold keeps
    its events in train (it would otherwise vanish).
    """
    rng = np.random.default_rng(random_state)
    fold_of: dict[str, np.ndarray] = {}
    for cid, cd in fd.items():
        ent = np.asarray(cd.entity).astype(str)
        f = np.empty(len(ent), dtype=np.int64)
        for e in np.unique(ent):  # loop over pairs, vectorized over their events
            idx = np.flatnonzero(ent == e)
            start = rng.integers(n_folds)
            f[idx[rng.permutation(len(idx))]] = (start + np.arange(len(idx))) % n_folds
        fold_of[cid] = f
    for k in range(n_folds):
        tr, te = {}, {}
        for cid, cd in fd.items():
            m = fold_of[cid] == k
            if (~m).sum() == 0:
                m = np.zeros_like(m)
            tr[cid] = cd.take(np.flatnonzero(~m))
            if m.any():
                te[cid] = cd.take(np.flatnonzero(m))
        yield (FederatedDataset(tr, fd.feature_names, fd.target_name, fd.entity_name),
               FederatedDataset(te, fd.feature_names, fd.target_name, fd.entity_name))
