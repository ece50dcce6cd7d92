"""Small federated data sets made here (no downloads), importable by any test module.

(Not in conftest.py: ``from conftest import ...`` picks whichever conftest was imported last.)
"""

import numpy as np


def make_blobs_federation(n_clients=50, K=3, d=4, seed=0, unequal=True):
    """Pooled 3-component data split over clients of unequal sizes (5 to 60 rows)."""
    import fedlatent as fl

    rng = np.random.default_rng(seed)
    means = rng.normal(scale=4, size=(K, d))
    X = np.vstack(
        [rng.normal(size=(400, d)) @ rng.normal(size=(d, d)) * 0.5 + means[k] for k in range(K)]
    )
    rng.shuffle(X)
    if unequal:
        sizes = rng.integers(5, 60, size=n_clients).astype(float)
    else:
        sizes = np.ones(n_clients)
    cuts = (np.cumsum(sizes) / sizes.sum() * len(X)).astype(int)[:-1]
    parts = np.split(X, cuts)
    return fl.FederatedDataset.from_arrays({f"c{i:02d}": p for i, p in enumerate(parts)})
