"""The contract's capability for statistics valid only at the broadcast parameters, and the
saturation rule's declaration: what the engine derives from a model's declarations alone.

The toy below is a federated Newton step for a Poisson mean (gradient and Hessian at the
broadcast log-mean): the engine has no code for it, only its ``broadcast_only`` reason."""

import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine import (
    ClientStep,
    FederatedModel,
    InProcessRuntime,
    Stats,
    register_model,
    run_federated_em,
)
from fedlatent.engine.contract import registry


@register_model
class NewtonPoissonToy(FederatedModel):
    """log-mean ``t``; a client sends ``g = sum (x - e^t)`` and ``h = sum e^t`` at the ``t`` it
    was sent; the server takes the Newton step ``t + g / h``."""

    name = "test-newton-poisson-toy"
    broadcast_only = "a gradient and a Hessian at the broadcast log-mean"

    def client_stats(self, params, data, state, rng, rows=None):
        x = data.X[:, 0] if rows is None else data.X[rows, 0]
        mu = float(np.exp(params["t"]))
        ll = float(np.sum(x * params["t"] - mu))
        return ClientStep(Stats({"g": np.array([x.sum() - mu * x.size]),
                                 "h": np.array([mu * x.size])}), x.size, ll, state)

    def stat_shapes(self, params):
        return {"g": (1,), "h": (1,)}

    def reply_numbers(self, data):
        return 2

    def server_step(self, S, params, n_total):
        return {"t": params["t"] + S["g"][0] / S["h"][0]}


def counts_fd(n_clients=6, seed=0):
    rng = np.random.default_rng(seed)
    return fl.FederatedDataset.from_arrays(
        {f"c{i}": rng.poisson(2.0 + i, size=(20 + 5 * i, 1)).astype(float)
         for i in range(n_clients)})


def fit(fd, fed, rounds=8):
    with warnings.catch_warnings():  # tol=0: the rounds asked for, no convergence
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        return run_federated_em(NewtonPoissonToy(), InProcessRuntime(fd), fed,
                                {"t": np.array(0.0)}, seed=0, max_rounds=rounds, tol=0.0,
                                progress=False)


def test_with_every_client_each_round_the_newton_steps_reach_the_mle():
    fd = counts_fd()
    res = fit(fd, fl.Federation(disclosure=fl.DisclosurePolicy.off()), rounds=12)
    assert float(res.params["t"]) == pytest.approx(np.log(fd.pooled().X.mean()), rel=1e-12)


REFUSED = [
    (dict(participation=0.5), r"participation=0\.5"),
    (dict(step_size=0.7), r"step_size=0\.7"),
    (dict(step_size=fl.StepSchedule()), r"step_size=StepSchedule"),
    (dict(batch_size=5), r"batch_size=5 \(mini-batches\)"),
    (dict(variance_reduction=fl.Spider(2, 5)), r"variance_reduction=Spider\(\.\.\.\) \(SPIDER\)"),
    (dict(acceleration="squarem"), r"acceleration='squarem'"),
    (dict(acceleration="newton"), r"acceleration='newton'"),
]


@pytest.mark.parametrize("settings, named", REFUSED)
def test_settings_that_average_across_rounds_are_refused_with_one_message(settings, named):
    fd = counts_fd()
    fed = fl.Federation(disclosure=fl.DisclosurePolicy.off(), **settings)
    with pytest.raises(ValueError, match="model 'test-newton-poisson-toy' sends statistics "
                       r"valid only at the parameters the server broadcast \(a gradient and a "
                       "Hessian at the broadcast log-mean\\).*not available with " + named):
        fit(fd, fed)


def test_every_problem_is_named_in_the_one_message():
    fed = fl.Federation(participation=0.5, step_size=0.5, batch_size=5)
    with pytest.raises(ValueError) as err:
        fed.check_model(NewtonPoissonToy())
    assert "participation=0.5; step_size=0.5; batch_size=5 (mini-batches)" in str(err.value)


def test_what_is_handled_is_not_refused():
    """The quantizer, control variates and secure aggregation keep a round's statistic the
    round's (plain steps); a model without the declaration takes every setting."""
    fed = fl.Federation(quantizer=fl.Quantizer(8), secure_aggregation=True)
    fed.check_model(NewtonPoissonToy())
    fd = counts_fd()
    res = fit(fd, fl.Federation(secure_aggregation=True, disclosure=fl.DisclosurePolicy.off()),
              rounds=12)
    assert float(res.params["t"]) == pytest.approx(np.log(fd.pooled().X.mean()), rel=1e-9)
    from fedlatent.models.gmm import GMMModel

    fl.Federation(participation=0.5, step_size=0.5, batch_size=5).check_model(
        GMMModel(2, "full"))


def test_a_model_without_reply_numbers_cannot_register():
    class Silent(FederatedModel):
        name = "test-silent"

        def client_stats(self, params, data, state, rng, rows=None):  # pragma: no cover
            raise NotImplementedError

        def stat_shapes(self, params):  # pragma: no cover
            return {"s": (1,)}

        def m_step(self, S, params, n_total):  # pragma: no cover
            return {}

    with pytest.raises(TypeError, match=r"model 'test-silent' \(Silent\) does not declare "
                       r"reply_numbers\(data\)"):
        register_model(Silent)
    assert "test-silent" not in registry._MODELS


def test_every_model_of_the_library_registers_with_its_declaration():
    registry.discover()
    names = [n for n in registry._MODELS if not n.startswith("test-")]
    assert {"gmm", "lcr", "lca", "hlcr", "fedgmm", "sec"} <= set(names)
    for n in names:
        cls = registry.model_class(n)
        assert not getattr(cls.reply_numbers, "undeclared", False), n
