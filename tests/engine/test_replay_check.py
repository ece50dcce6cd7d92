"""A verifying site's forward check of GMM parameters (``check_step``: products only, no
M-step): it accepts an honest server's parameters, accepts nothing the replay refuses, and
leaves every case it cannot prove (a move, a floor, another shape) to the replay."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.node.replay import REPLAY_RTOL, params_refusal, step_refusal
from fedlatent.engine.stats import Stats
from fedlatent.models.gmm.model import GMMModel
from verified_doubles import soft_stats as _stats


def _clusters(seed: int, n: int = 600) -> Stats:
    """Mean statistics of three clusters of round rows (the benchmark's shape of data)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(0, 3, (3, 4))[rng.integers(0, 3, n)] + rng.normal(size=(n, 4))
    r = rng.dirichlet(np.ones(3), n)
    return Stats({"nk": r.mean(0), "sx": r.T @ X / n,
                  "sxx": np.einsum("nk,ni,nj->kij", r, X, X) / n})


def _honest(seed: int, stats=_stats):
    model, S = GMMModel(3), stats(seed)
    prev = {"center": np.random.default_rng(seed + 100).normal(size=4)}
    return model, S, prev, model.server_step(S, prev, 500.0)


def _moved(params: dict, name: str, at: tuple, rel: float) -> dict:
    """``params`` with one entry of ``name`` moved by ``rel`` times the parameter's largest."""
    out = {k: v.copy() for k, v in params.items()}
    out[name][at] += rel * float(np.abs(params[name]).max())
    return out


@pytest.mark.parametrize("seed", range(8))
def test_an_honest_servers_parameters_pass_without_a_replay(seed):
    model, S, prev, sent = _honest(seed, _clusters)
    assert model.check_step(S, sent, prev, 500.0, REPLAY_RTOL) is True


@pytest.mark.parametrize("seed", range(8))
def test_ill_conditioned_covariances_are_accepted_by_the_check_or_the_replay(seed):
    """Correlated features (covariances' condition numbers 30 to 1e4): the check accepts
    the better conditioned ones and leaves the others to the replay; none is refused."""
    model, S, prev, sent = _honest(seed)
    checked = model.check_step(S, sent, prev, 500.0, REPLAY_RTOL)
    assert step_refusal(model, S, prev, 500.0, sent, 3, "c") is None
    assert checked or seed in (2, 4, 5)  # (condition numbers 2.5e3 to 1e4)


@pytest.mark.parametrize("name, at", [("weights", (1,)), ("means", (2, 3)),
                                      ("precisions_cholesky", (0, 0, 0)),
                                      ("precisions_cholesky", (1, 1, 3)),
                                      ("precisions_cholesky", (2, 3, 3)),
                                      ("precisions_cholesky", (2, 0, 2)),
                                      ("center", (0,))])
def test_a_move_of_one_entry_by_1e6_is_left_to_the_replay_which_refuses_it(name, at):
    model, S, prev, honest = _honest(3, _clusters)
    assert model.check_step(S, honest, prev, 500.0, REPLAY_RTOL) is True
    sent = _moved(honest, name, at, 1e-6)
    assert model.check_step(S, sent, prev, 500.0, REPLAY_RTOL) is False
    why = step_refusal(model, S, prev, 500.0, sent, 4, "c1")
    assert why is not None and f"parameter {name!r}" in why and "round 4" in why


def test_a_lower_entry_a_nan_another_shape_a_key_more_or_a_list_are_not_accepted():
    model, S, prev, honest = _honest(5, _clusters)
    assert model.check_step(S, honest, prev, 500.0, REPLAY_RTOL) is True
    lower = {k: v.copy() for k, v in honest.items()}
    lower["precisions_cholesky"][1, 3, 0] = 1e-300  # (a factor no longer triangular)
    nan = _moved(honest, "precisions_cholesky", (0, 1, 2), 0.0)
    nan["precisions_cholesky"][0, 1, 2] = np.nan
    extra = {**honest, "means": np.vstack([honest["means"], honest["means"][:1]])}
    more = {**honest, "probe": np.zeros(4)}
    listed = {**honest, "weights": honest["weights"].tolist()}
    for sent in (lower, nan, extra, more, listed):
        assert model.check_step(S, sent, prev, 500.0, REPLAY_RTOL) is False


@pytest.mark.parametrize("seed", range(4))
def test_what_the_check_accepts_the_replay_accepts(seed):
    """Random moves of the factors from 1e-16 to 1e-6 of their largest entry: every set the
    check accepts, the server's own M-step replayed accepts too (the check is no looser), and
    it does accept the moves well inside the tolerance (it is not vacuous)."""
    model, S, prev, honest = _honest(seed, _clusters)
    rng = np.random.default_rng(seed)
    upper = np.triu(np.ones((4, 4)))
    accepted = 0
    for rel in np.logspace(-16, -6, 41):
        sent = dict(honest)
        U = honest["precisions_cholesky"]
        sent["precisions_cholesky"] = U + rel * np.abs(U).max() * rng.normal(size=U.shape) * upper
        if model.check_step(S, sent, prev, 500.0, REPLAY_RTOL):
            accepted += 1
            assert params_refusal(sent, model.server_step(S, prev, 500.0), 1, "c") is None
    assert accepted >= 13  # (every move up to 1e-13 of the largest entry, at least)


def test_a_floored_count_or_a_flat_component_goes_to_the_replay():
    model, S, prev, _ = _honest(2, _clusters)
    floored = Stats({**S, "nk": np.array([S["nk"][0], S["nk"][1], 0.0])})
    sent = model.server_step(floored, prev, 500.0)
    assert model.check_step(floored, sent, prev, 500.0, REPLAY_RTOL) is False
    sxx = S["sxx"].copy()  # component 0 flattened onto a line: the server lifts it
    mc = S["sx"][0] / S["nk"][0]
    vals, vecs = np.linalg.eigh(sxx[0] / S["nk"][0] - np.outer(mc, mc))
    vals[0] = 1e-9 * vals[-1]
    sxx[0] = ((vecs * vals) @ vecs.T + np.outer(mc, mc)) * S["nk"][0]
    flat = Stats({**S, "sxx": sxx})
    sent = model.server_step(flat, prev, 500.0)
    assert model.check_step(flat, sent, prev, 500.0, REPLAY_RTOL) is False
    assert step_refusal(model, flat, prev, 500.0, sent, 2, "c") is None  # (the replay's)


def test_diagonal_or_private_models_always_replay():
    S = _stats(3)
    diag = Stats({"nk": S["nk"], "sx": S["sx"], "sxx": np.einsum("kii->ki", S["sxx"])})
    model = GMMModel(3, covariance_type="diag")
    prev = {"center": np.zeros(4)}
    sent = model.server_step(diag, prev, 500.0)
    assert model.check_step(diag, sent, prev, 500.0, REPLAY_RTOL) is False
    assert step_refusal(model, diag, prev, 500.0, sent, 2, "c") is None


def test_a_verified_fit_checks_its_rounds_forward(monkeypatch):
    """The forward check is the path a verified fit's rounds take (every steady round of
    every site accepted by it), and the fit equals the unverified one."""
    seen = []
    check = GMMModel.check_step
    monkeypatch.setattr(GMMModel, "check_step",
                        lambda self, *a: seen.append(check(self, *a)) or seen[-1])
    rng = np.random.default_rng(0)
    fd = fl.FederatedDataset.from_arrays({f"c{i}": rng.normal(size=(60, 3)) + (i % 2) * 4
                                          for i in range(6)})
    means = []
    for verified in (True, False):
        est = fl.FederatedGaussianMixture(2, init_params="random", max_rounds=5, tol=0.0,
                                          random_state=1, verbose=False,
                                          federation=fl.Federation(secure_aggregation=True,
                                                                   verified=verified))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est.fit(fd)
        means.append(est.means_)
    assert len(seen) == 6 * 4 and all(seen)  # (rounds 2..5 of six sites)
    np.testing.assert_allclose(means[0], means[1], rtol=0, atol=1e-10)


def test_a_non_finite_centre_said_twice_is_left_to_the_replay():
    """The check compares the weights, means and centre by their bytes: a NaN or infinite
    centre, kept and sent alike (the same bytes), still goes to the replay (the means it
    gives are not finite), which refuses the NaN; a -0.0 for a 0.0 goes to the replay too,
    which accepts it (equal values)."""
    model, S, prev, honest = _honest(1, _clusters)
    for bad in (np.nan, np.inf):
        centre = prev["center"].copy()
        centre[2] = bad
        sent = model.server_step(S, {"center": centre}, 500.0)
        assert sent["center"].tobytes() == centre.tobytes()
        assert model.check_step(S, sent, {"center": centre}, 500.0, REPLAY_RTOL) is False
    why = step_refusal(model, S, {"center": centre}, 500.0, sent, 3, "c1")
    assert why is None  # (the replay takes equal infinities as equal: its own rule)
    centre[2] = np.nan
    sent = model.server_step(S, {"center": centre}, 500.0)
    why = step_refusal(model, S, {"center": centre}, 500.0, sent, 3, "c1")
    assert why is not None and "round 3 refused: parameter 'center'" in why
    zero = {"center": np.zeros(4)}
    sent = model.server_step(S, zero, 500.0)
    sent["center"] = -sent["center"]  # (-0.0 for 0.0: equal values, other bytes)
    assert model.check_step(S, sent, zero, 500.0, REPLAY_RTOL) is False
    assert step_refusal(model, S, zero, 500.0, sent, 3, "c1") is None  # (the replay's)
