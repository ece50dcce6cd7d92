"""FedGMM's example: the small problems the generic tests run on it
(:class:`fedlatent.engine.contract.registry.Example`). Nothing is imported until a case is built."""

from __future__ import annotations

from ...engine.contract.registry import Case, Example


def _default():
    from ...data.fedgmm_data import make_fedgmm_synthetic

    return make_fedgmm_synthetic(n_clients=4, n_samples_per_client=80, n_components=2,
                                 n_features=3, random_state=0).train


def _sites():
    from ...data.fedgmm_data import make_fedgmm_synthetic

    return make_fedgmm_synthetic(n_clients=3, n_samples_per_client=120, n_features=3,
                                 mean_scale=2.0, fractions=(0.8, 0.1, 0.1), random_state=5).train


def _saved_data():
    from ...data.fedgmm_data import make_fedgmm_synthetic

    return make_fedgmm_synthetic(4, 60, n_features=2, mean_scale=2.0, random_state=0).train


def _fedgmm(*args, **kw):
    import fedlatent as fl

    return fl.FedGMM(*args, **kw)


EXAMPLE = Example(
    cases={
        "default": Case(_default, lambda: _fedgmm(2, 2, max_rounds=3, random_state=0,
                                                  verbose=False)),
        # the random start: one query (every message costs seconds on a deployment)
        "flower": Case(_sites, lambda: _fedgmm(2, 2, max_rounds=2, init_params="random",
                                               random_state=12)),
        "saved": Case(_saved_data, lambda: _fedgmm(2, 2, max_rounds=4, random_state=0,
                                                   verbose=False)),
    },
    fitted=("weights_x_", "means_", "precisions_cholesky_", "coef_", "weights_y_"),
    cli_args=("-k", "2", "--learners", "2", "--max-rounds", "3"),
    personalized=True,
)
