"""Latent class regression's example: the small problems the generic tests run on it
(:class:`fedlatent.engine.contract.registry.Example`). Nothing is imported until a case is built."""

from __future__ import annotations

import numpy as np

from ...engine.contract.registry import Case, Example


def two_lines(seed: int = 0, n_clients: int = 6):
    """Rows on one of two lines (``5 + 2x`` or ``15 - x``), mixed differently per client."""
    import fedlatent as fl

    rng = np.random.default_rng(seed)
    data = {}
    for c in range(n_clients):
        n = int(rng.integers(20, 60))
        X = rng.uniform(0, 10, size=(n, 1))
        k = rng.random(n) < (0.2 + 0.6 * (c % 2))
        y = np.where(k, 5 + 2 * X[:, 0], 15 - X[:, 0]) + rng.normal(size=n)
        data[f"c{c}"] = (X, y)
    return fl.FederatedDataset.from_arrays(data)


def _sites():
    import fedlatent as fl

    rng = np.random.default_rng(4)
    data = {}
    for i in range(3):
        x = rng.uniform(0, 10, size=(60 + 20 * i, 1))
        line = rng.random(len(x)) < 0.3 + 0.2 * i
        data[f"site-{i}"] = (x, np.where(line, 5 + 2 * x[:, 0], 15 - x[:, 0])
                             + rng.normal(size=len(x)))
    return fl.FederatedDataset.from_arrays(data)


def _four():
    import fedlatent as fl

    rng = np.random.default_rng(0)
    x = rng.uniform(0, 10, size=(4, 40))
    return fl.FederatedDataset.from_arrays(
        {f"s{c}": (x[c][:, None], np.where(rng.random(40) < .5, 5 + 2 * x[c], 15 - x[c])
                   + rng.normal(size=40)) for c in range(4)})


def _lcr(*args, **kw):
    import fedlatent as fl

    return fl.LatentClassRegression(*args, **kw)


EXAMPLE = Example(
    cases={
        "default": Case(two_lines, lambda: _lcr(2, max_rounds=4, random_state=0)),
        # one start (n_init=1): a Flower run always writes a checkpoint, and a fit with a
        # checkpoint runs one start, so the in-process reference must too
        "flower": Case(_sites, lambda: _lcr(2, max_rounds=2, n_init=1, random_state=15)),
        "saved": Case(_four, lambda: _lcr(2, max_rounds=10, random_state=0)),
    },
    fitted=("weights_", "coef_", "intercept_", "noise_variance_"),
    cli_args=("-k", "2", "--max-rounds", "4"),
)
