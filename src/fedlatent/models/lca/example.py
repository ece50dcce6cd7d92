"""Latent class analysis's example: poLCA-style simulated data (``poLCA.simdata``: classes with
their own category probabilities, variables independent given the class), split over clients of
unequal sizes whose class shares differ; the small problems the generic tests run on it
(:class:`fedlatent.engine.contract.registry.Example`)."""

from __future__ import annotations

import numpy as np

from ...engine.contract.registry import Case, Example

__all__ = ["EXAMPLE", "make_lca_data", "true_parameters"]


def true_parameters(n_classes: int = 3, n_categories=(3, 3, 3, 3), seed: int = 0):
    """``(weights, probs)``: class shares and per class the category probabilities of each
    variable side by side (K, sum R_j), drawn as poLCA.simdata draws them (uniform shares
    perturbed; each variable's probabilities a Dirichlet draw, concentrated on one category)."""
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0x1CA,)))
    w = rng.dirichlet(np.full(n_classes, 5.0))
    blocks = []
    for R in n_categories:
        a = np.ones((n_classes, R))
        a[np.arange(n_classes), np.arange(n_classes) % R] = 6.0  # each class leans somewhere
        blocks.append(np.stack([rng.dirichlet(a[k]) for k in range(n_classes)]))
    return w, np.concatenate(blocks, axis=1)


def make_lca_data(n_clients: int = 6, mean_size: int = 60, n_classes: int = 3,
                  n_categories=(3, 3, 3, 3), random_state: int = 0, return_truth=False):
    """A federation of category codes (columns ``v1..vJ``, codes ``0..R_j - 1``) drawn from
    :func:`true_parameters`; clients of unequal sizes (1/3 to 5/3 of ``mean_size``), each with
    its own class shares (a Dirichlet draw around the global ones)."""
    import fedlatent as fl

    from .math import offsets

    w, probs = true_parameters(n_classes, n_categories, random_state)
    rng = np.random.default_rng(random_state)
    off = offsets(n_categories)
    data, labels = {}, {}
    for c in range(n_clients):
        n = int(rng.integers(max(2, mean_size // 3), 5 * mean_size // 3 + 1))
        z = rng.choice(n_classes, size=n, p=rng.dirichlet(20 * w))
        X = np.empty((n, len(n_categories)))
        for j in range(len(n_categories)):
            P = probs[z, off[j]:off[j + 1]]  # each row's category probabilities
            X[:, j] = (rng.random(n)[:, None] > np.cumsum(P, axis=1)).sum(axis=1)
        data[f"c{c:02d}"], labels[f"c{c:02d}"] = X, z
    fd = fl.FederatedDataset.from_arrays(
        data, feature_names=[f"v{j + 1}" for j in range(len(n_categories))])
    return (fd, labels, (w, probs)) if return_truth else fd


def _lca(**kw):
    import fedlatent as fl

    return fl.LatentClassAnalysis(**kw)


EXAMPLE = Example(
    cases={
        "default": Case(make_lca_data, lambda: _lca(n_components=3, n_categories=3,
                                                    max_rounds=5, random_state=0)),
        # (seed 4: no category held by 1 or 2 of a client's records, the rare-level rule)
        "flower": Case(lambda: make_lca_data(n_clients=3, random_state=4),
                       lambda: _lca(n_components=2, n_categories=3, max_rounds=2,
                                    random_state=16)),
    },
    fitted=("weights_", "probabilities_"),
    cli_args=("-k", "3", "--max-rounds", "5"),
)
