"""HLCR's example: the small problems the generic tests run on it
(:class:`fedlatent.engine.contract.registry.Example`). Nothing is imported until a case is built."""

from __future__ import annotations

import numpy as np

from ...engine.contract.registry import Case, Example


def _default():
    import fedlatent as fl

    # agents of 29 to 61 events: their cluster blocks pass the saturation rule (issue 22)
    return fl.datasets.make_synthhlcr(n_agents=5, n_entities=8, n_clusters=2, n_features=3,
                                      events_per_entity=8, random_state=0)


def _sites():
    import fedlatent as fl

    return fl.datasets.make_synthhlcr(n_agents=3, n_entities=9, entities_per_agent=4,
                                      events_per_entity=12, n_clusters=2, n_features=3,
                                      sigma=0.5, random_state=3)


def _saved_data():
    import fedlatent as fl

    return fl.datasets.make_synthhlcr(n_agents=6, n_entities=6, entities_per_agent=2,
                                      events_per_entity=16, n_clusters=2, n_features=2,
                                      sigma=0.3, random_state=0)


def _hlcr(*args, **kw):
    import fedlatent as fl

    return fl.HLCR(*args, **kw)


def predict(est, X, fd):
    """Predictions for rows ``X`` of the first client: its id and its entities'."""
    cid = fd.client_ids[0]
    n = len(X)
    return est.predict(X, np.full(n, cid), np.asarray(fd[cid].entity[:n]).astype(str))


EXAMPLE = Example(
    cases={
        "default": Case(_default, lambda: _hlcr(2, max_rounds=3, random_state=0)),
        "flower": Case(_sites, lambda: _hlcr(n_clusters=2, max_rounds=2, sigma=0.5,
                                             random_state=13)),
        "saved": Case(_saved_data, lambda: _hlcr(2, sigma=0.3, max_rounds=4, random_state=0)),
    },
    predict=predict,
    fitted=("coef_", "intercept_", "precisions_", "c_", "cluster_counts_"),
    cli_args=("-k", "2", "--max-rounds", "3"),
)
