"""The round loop against hand-written recursions of DESIGN section 1, on a linear toy model."""

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
from fedlatent.engine.contract.model import server_rng
from fedlatent.engine.rounds.loop import FederatedFitError


@register_model
class LinearToy(FederatedModel):
    """s_c(theta) = sum_i (x_i + a * mu): a contraction with fixed point mean(x) / (1 - a)."""

    name = "test-linear-toy"

    def __init__(self, a: float = 0.5):
        super().__init__(a=a)
        self.a = a

    def client_stats(self, params, data, state, rng, rows=None):
        X = data.X if rows is None else data.X[rows]
        s = X.sum(0) + self.a * X.shape[0] * params["mu"]
        return ClientStep(Stats({"s": s}), X.shape[0], -float(np.sum((X - params["mu"]) ** 2)),
                          state)

    def stat_shapes(self, params):
        return {"s": params["mu"].shape}

    def reply_numbers(self, data):
        return None  # declared off: the toy's clients (3 rows and up) test the loop, not the rule

    def server_step(self, S, params, n_total):
        return {"mu": S["s"].copy()}


def toy_fd(n_clients=8, seed=0):
    rng = np.random.default_rng(seed)
    return fl.FederatedDataset.from_arrays(
        {f"c{i}": rng.normal(loc=i, size=(rng.integers(3, 12), 2)) for i in range(n_clients)}
    )


def run(fd, fed, rounds, seed=3):
    model = LinearToy(0.5)
    return run_federated_em(model, InProcessRuntime(fd), fed, {"mu": np.zeros(2)}, seed=seed,
                            max_rounds=rounds, tol=0.0, progress=False)


def client_means(fd):
    return {c: fd[c].X.mean(0) for c in fd.client_ids}


def test_fedhlcr_smoothing_is_a_setting():
    """p = 1, no control variates: S_k = (1 - g) S_{k-1} + g * mean_c s_c(T(S_{k-1}))."""
    fd = toy_fd()
    g = 0.3
    res = run(fd, fl.Federation(step_size=g, control_variates=False), 6)
    n = fd.n_samples
    w = {c: fd[c].n_samples / n for c in fd.client_ids}
    xbar = sum(w[c] * m for c, m in client_means(fd).items())
    S = xbar + 0.5 * np.zeros(2)  # round 1: plain E-step at mu0 = 0
    for _ in range(2, 7):
        S = (1 - g) * S + g * (xbar + 0.5 * S)
    np.testing.assert_allclose(res.S_hat["s"], S, rtol=1e-12)


@pytest.mark.parametrize("weighting", ["samples", "uniform"])
def test_partial_participation_with_control_variates_matches_the_recursion(weighting):
    fd = toy_fd()
    p, g, seed = 0.5, 0.4, 11
    fed = fl.Federation(participation=p, step_size=g, client_weighting=weighting)
    res = run(fd, fed, 8, seed=seed)
    cids = fd.client_ids
    n = fd.n_samples
    w = {c: (fd[c].n_samples / n if weighting == "samples" else 1 / len(cids)) for c in cids}
    xb = client_means(fd)
    s_c = lambda c, S: xb[c] + 0.5 * S  # noqa: E731
    S = sum(w[c] * s_c(c, np.zeros(2)) for c in cids)
    Vc = {c: s_c(c, np.zeros(2)) - S for c in cids}  # V_c0 = S_c(theta_0) - S_0
    V = sum(w[c] * Vc[c] for c in cids)
    for k in range(2, 9):
        draw = server_rng(seed, k).random(len(cids))
        active = [c for c, u in zip(cids, draw) if u < p]
        agg = np.zeros(2)
        for c in active:
            q = s_c(c, S) - S - Vc[c]
            Vc[c] = Vc[c] + q
            agg += w[c] * q
        S = S + g * (agg / p + V)
        V = V + agg
    np.testing.assert_allclose(res.S_hat["s"], S, rtol=1e-10)
    assert [r.participants for r in res.history][0] == len(cids)


def test_history_records_bytes_participants_and_objective():
    fd = toy_fd()
    res = run(fd, fl.Federation(participation=0.5, quantizer=fl.Quantizer(2), step_size=0.5), 5)
    h = res.history.to_frame()
    assert list(h["round"]) == [1, 2, 3, 4, 5]
    assert h["participants"].iloc[0] == 8
    # quantized replies are smaller than float64 ones: 2 numbers -> 32 + 2*(1+2) bits + 16 bytes
    per_client = (32 + 2 * 3 + 7) // 8 + 16
    assert (h["bytes_up"].iloc[1:] == h["participants"].iloc[1:] * per_client).all()
    assert h["bytes_up"].iloc[0] == 8 * (16 + 16)
    assert np.isfinite(h["objective"]).all()


def test_rounds_without_participants_keep_the_statistic():
    """No client answers and V = sum_c w_c V_c0 = 0 exactly: S_hat stays at round 1's value."""
    fd = toy_fd(2)
    res = run(fd, fl.Federation(participation=1e-9, step_size=0.5), 3)
    assert [r.participants for r in res.history] == [2, 0, 0]
    first = run(fd, fl.Federation(participation=1e-9, step_size=0.5), 1)
    np.testing.assert_allclose(res.S_hat["s"], first.S_hat["s"], rtol=0, atol=1e-12)


class CorruptingRuntime(InProcessRuntime):
    """Turns one client's statistics into NaN from a given round on."""

    def __init__(self, fd, bad_client, from_round):
        super().__init__(fd)
        self.bad, self.from_round = bad_client, from_round

    def call(self, client_ids, method, messages):
        out = super().call(client_ids, method, messages)
        for c, rep in out.items():
            if method == "estep" and c == self.bad and messages[c]["round"] >= self.from_round:
                rep["delta/s"] = np.full_like(rep["delta/s"], np.nan)
        return out


def test_invalid_reply_is_refused_and_last_good_state_kept(tmp_path):
    """Issue 11: a malformed reply is excluded and recorded in ``rejected`` (the default), or,
    with ``on_invalid="raise"``, stops the run naming the client, the last good state kept."""
    fd = toy_fd()
    with pytest.warns(fl.ConvergenceWarning):
        res = run_federated_em(LinearToy(0.5), CorruptingRuntime(fd, "c3", 4), fl.Federation(),
                               {"mu": np.zeros(2)}, seed=0, max_rounds=10, tol=0.0,
                               progress=False)
    assert [r.rejected for r in res.history] == [{}] * 3 + [
        {"c3": "statistic 's' has non-finite values"}] * 7
    assert [r.participants for r in res.history] == [8] * 3 + [7] * 7
    assert np.all(np.isfinite(res.params["mu"]))
    rt = CorruptingRuntime(fd, "c3", 4)
    ck = tmp_path / "ck"
    with pytest.raises(FederatedFitError, match="client 'c3' sent an invalid reply: statistic "
                       "'s' has non-finite values") as err:
        run_federated_em(LinearToy(0.5), rt, fl.Federation(on_invalid="raise"),
                         {"mu": np.zeros(2)}, seed=0,
                         max_rounds=10, tol=0.0, progress=False, checkpoint=ck)
    with pytest.warns(fl.ConvergenceWarning):
        good = run(fd, fl.Federation(), 3, seed=0)
    np.testing.assert_allclose(err.value.last_good["mu"], good.params["mu"], rtol=0)
    from fedlatent.engine.fedem.checkpoint import load_arrays_json

    arrays, meta = load_arrays_json(ck)
    assert meta["round"] == 3
    np.testing.assert_allclose(arrays["params/mu"], good.params["mu"], rtol=0)


def test_missing_reply_is_absence_and_is_recorded():
    fd = toy_fd()

    class Dropping(InProcessRuntime):
        def call(self, client_ids, method, messages):
            out = super().call(client_ids, method, messages)
            if method == "estep" and messages[client_ids[0]]["round"] == 3:
                out.pop("c5", None)
            return out

    res = run_federated_em(LinearToy(0.5), Dropping(fd), fl.Federation(step_size=0.5),
                           {"mu": np.zeros(2)}, seed=0, max_rounds=4, tol=0.0, progress=False)
    assert res.history[2].missing == ["c5"]
    assert res.history[2].participants == 7
