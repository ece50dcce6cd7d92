"""The Gaussian mixture's example: the small problems the generic tests run on it
(:class:`fedlatent.engine.contract.registry.Example`). Nothing is imported until a case is built."""

from __future__ import annotations

import numpy as np

from ...engine.contract.registry import Case, Example


def blobs(n_clients: int = 8, K: int = 3, d: int = 4, seed: int = 0):
    """Pooled ``K``-component data split over clients of unequal sizes (5 to 60 rows)."""
    import fedlatent as fl

    rng = np.random.default_rng(seed)
    means = rng.normal(scale=4, size=(K, d))
    X = np.vstack(
        [rng.normal(size=(400, d)) @ rng.normal(size=(d, d)) * 0.5 + means[k] for k in range(K)]
    )
    rng.shuffle(X)
    sizes = rng.integers(5, 60, size=n_clients).astype(float)
    cuts = (np.cumsum(sizes) / sizes.sum() * len(X)).astype(int)[:-1]
    parts = np.split(X, cuts)
    return fl.FederatedDataset.from_arrays({f"c{i:02d}": p for i, p in enumerate(parts)})


def _sites():
    import fedlatent as fl

    rng = np.random.default_rng(0)
    data = {f"site-{i}": rng.normal(size=(80 + 30 * i, 3)) + 1.5 * i for i in range(3)}
    return fl.FederatedDataset.from_arrays(data)


def _two_groups():
    import fedlatent as fl

    rng = np.random.default_rng(0)
    return fl.FederatedDataset.from_arrays(
        {f"c{c}": rng.normal(size=(40, 2)) + 3 * (c % 2) for c in range(4)})


def _gmm(**kw):
    import fedlatent as fl

    return fl.FederatedGaussianMixture(**kw)


def _saved():
    import fedlatent as fl

    return _gmm(n_components=2, max_rounds=5, tol=0, random_state=3, verbose=False,
                federation=fl.Federation(participation=0.5, step_size=0.5, random_state=3))


EXAMPLE = Example(
    cases={
        "default": Case(blobs, lambda: _gmm(n_components=3, max_rounds=4, random_state=0,
                                            verbose=False)),
        "flower": Case(_sites, lambda: _gmm(n_components=2, max_rounds=2, random_state=11)),
        "saved": Case(_two_groups, _saved),
    },
    fitted=("weights_", "means_", "covariances_", "precisions_cholesky_"),
    cli_args=("-k", "3", "--max-rounds", "4"),
)
