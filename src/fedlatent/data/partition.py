"""Partitioners for simulations: split pooled data over clients with Dirichlet skew."""

from __future__ import annotations

import numpy as np

from .dataset import ClientData, FederatedDataset

__all__ = ["dirichlet_partition", "partition_by_labels", "partition_by_components", "split_arrays"]


def dirichlet_partition(
    groups: np.ndarray,
    n_clients: int,
    alpha: float,
    random_state: int | np.random.Generator | None = None,
    min_samples: int = 1,
    max_tries: int = 100,
) -> list[np.ndarray]:
    """Indices per client with group proportions drawn from Dirichlet(alpha).

    For each group g (a label, or a latent component) a vector ``p_g ~ Dir(alpha 1_n)`` spreads the
    rows of g over the ``n_clients`` clients. Small ``alpha`` gives strongly skewed clients.
    Redrawn until every client has at least ``min_samples`` rows.

    Parameters
    ----------
    groups : ndarray of shape (n_samples,)
        Group of each row (labels for label skew, component ids for feature skew).
    n_clients : int
    alpha : float > 0
    random_state : int, Generator or None
    min_samples : int

    Returns
    -------
    list of ndarray
        ``n_clients`` sorted index arrays that partition ``range(n_samples)``.
    """
    if n_clients < 1:
        raise ValueError(f"n_clients must be >= 1, got {n_clients}")
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    groups = np.asarray(groups)
    if groups.shape[0] < n_clients * min_samples:
        raise ValueError(
            f"{groups.shape[0]} samples cannot give {n_clients} clients {min_samples} each"
        )
    rng = np.random.default_rng(random_state)
    uniq = np.unique(groups)
    for _ in range(max_tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
        for g in uniq:
            idx = np.flatnonzero(groups == g)
            rng.shuffle(idx)
            p = rng.dirichlet(np.full(n_clients, alpha))
            cuts = (np.cumsum(p)[:-1] * len(idx)).astype(int)
            for c, chunk in enumerate(np.split(idx, cuts)):
                parts[c].append(chunk)
        out = [np.sort(np.concatenate(p)) for p in parts]
        if min(len(o) for o in out) >= min_samples:
            return out
    raise ValueError(
        f"could not give every one of {n_clients} clients {min_samples} samples with "
        f"alpha={alpha} in {max_tries} draws; raise alpha or lower n_clients"
    )


def partition_by_labels(y, n_clients, alpha, random_state=None, min_samples=1):
    """Label skew: Dirichlet(alpha) over the labels ``y``."""
    return dirichlet_partition(y, n_clients, alpha, random_state, min_samples)


def partition_by_components(components, n_clients, alpha, random_state=None, min_samples=1):
    """Feature (covariate) skew: Dirichlet(alpha) over latent component ids."""
    return dirichlet_partition(components, n_clients, alpha, random_state, min_samples)


def split_arrays(
    X: np.ndarray,
    parts: list[np.ndarray],
    y: np.ndarray | None = None,
    prefix: str = "client",
    feature_names=None,
) -> FederatedDataset:
    """A FederatedDataset from pooled arrays and a partition (client ids ``prefix000``...)."""
    width = max(3, len(str(len(parts) - 1)))
    clients = {
        f"{prefix}{c:0{width}d}": ClientData(
            np.asarray(X[idx], dtype=np.float64), None if y is None else np.asarray(y)[idx]
        )
        for c, idx in enumerate(parts)
    }
    names = list(feature_names) if feature_names is not None else [
        f"x{j}" for j in range(X.shape[1])
    ]
    return FederatedDataset(clients, names, target_name="y" if y is not None else None)
