"""SEC's example: the small problems the generic tests run on it
(:class:`fedlatent.engine.contract.registry.Example`). Nothing is imported until a case is built."""

from __future__ import annotations

from ...engine.contract.registry import Case, Example


def _simulation(n_learners: int, n_samples: int, seed: int):
    def make():
        from ...data.sec_data import make_sec_simulation1

        return make_sec_simulation1(n_learners=n_learners, n_samples=n_samples, snr=64.0,
                                    random_state=seed)[0]
    return make


def _sec(**kw):
    import fedlatent as fl

    return fl.SEC(**kw)


EXAMPLE = Example(
    cases={
        "default": Case(_simulation(6, 40, 0), lambda: _sec(candidates="linear",
                                                            random_state=0)),
        "flower": Case(_simulation(3, 40, 3), lambda: _sec(candidates="fairness",
                                                           n_clusters=2, random_state=14)),
        "saved": Case(_simulation(6, 25, 0), lambda: _sec(candidates="linear", n_clusters=2,
                                                          random_state=0)),
    },
    predict=lambda est, X, fd: est.predict(X, learner=fd.client_ids[0]),
    fitted=("errors_", "exchange_losses_", "labels_", "n_samples_"),
    cli_args=("--candidates", "linear"),
)
