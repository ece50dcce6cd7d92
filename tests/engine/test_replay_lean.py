"""A verifying site's lean M-step (``replay_step``): equal to the server's ``server_step`` where
it answers, declining (the server's own path then) where the two could part, and never the
reason an honest server's parameters are refused."""

from __future__ import annotations

import numpy as np
import pytest

from fedlatent.engine.contract.degenerate import DEGENERATE_FRACTION
from fedlatent.engine.node.replay import REPLAY_RTOL, replay_refusal
from fedlatent.engine.stats import Stats
from fedlatent.models.gmm.math import lean_full_step
from fedlatent.models.gmm.model import GMMModel
from verified_doubles import soft_stats as _stats


def _largest_relative(a: dict, b: dict) -> float:
    return max(float(np.max(np.abs(a[k] - b[k])) / np.max(np.abs(b[k]))) for k in b
               if np.any(b[k]))


@pytest.mark.parametrize("seed", range(6))
def test_the_lean_step_is_the_server_step(seed):
    model, S = GMMModel(3), _stats(seed)
    params = {"center": np.random.default_rng(seed).normal(size=4)}
    lean = lean_full_step(S, params["center"], model.reg)
    ref = model.server_step(S, params, 500.0)
    assert lean is not None and lean.keys() == ref.keys()
    for k in ("weights", "means", "center"):  # the same arithmetic: the same bits
        np.testing.assert_array_equal(lean[k], ref[k])
    assert _largest_relative(lean, ref) < 1e-3 * REPLAY_RTOL  # (the factors' inverse by LU)


def test_a_component_near_the_degenerate_floor_goes_the_servers_way():
    """A component flattened onto a line: its lowest eigenvalue is below the floor the
    server lifts it to, so the lean step declines and ``replay_step`` is ``server_step``
    (which lifts it); the lean arithmetic alone would have kept the flat covariance."""
    model, S = GMMModel(3), _stats(1)
    sxx = S["sxx"].copy()
    mc = S["sx"][0] / S["nk"][0]
    cov = sxx[0] / S["nk"][0] - np.outer(mc, mc)
    vals, vecs = np.linalg.eigh(cov)
    vals[0] = 1e-9 * vals[-1]  # (far below DEGENERATE_FRACTION of any pooled eigenvalue)
    sxx[0] = (vecs * vals) @ vecs.T * S["nk"][0] + np.outer(mc, mc) * S["nk"][0]
    S = Stats({**S, "sxx": sxx})
    params = {"center": np.zeros(4)}
    assert lean_full_step(S, params["center"], model.reg) is None
    ref = model.server_step(S, params, 500.0)
    got = model.replay_step(S, params, 500.0)
    for k in ref:
        np.testing.assert_array_equal(got[k], ref[k])
    lowest = np.linalg.eigvalsh(np.linalg.inv(
        ref["precisions_cholesky"][0] @ ref["precisions_cholesky"][0].T))[0]
    assert lowest > 0.5 * DEGENERATE_FRACTION * 1e-3  # lifted off the line by the server


def test_a_count_at_the_floor_goes_the_servers_way():
    model, S = GMMModel(3), _stats(2)
    S = Stats({**S, "nk": np.array([S["nk"][0], S["nk"][1], 0.0])})
    assert lean_full_step(S, np.zeros(4), model.reg) is None


def test_a_private_or_diagonal_model_replays_the_server_step():
    S = _stats(3)
    diag = Stats({"nk": S["nk"], "sx": S["sx"], "sxx": np.einsum("kii->ki", S["sxx"])})
    model = GMMModel(3, covariance_type="diag")
    got, ref = (f(diag, {"center": np.zeros(4)}, 500.0)
                for f in (model.replay_step, model.server_step))
    for k in ref:
        np.testing.assert_array_equal(got[k], ref[k])


class _Skewed(GMMModel):
    """A model whose lean replay is off by 1e-7 relative in one entry (far above the
    tolerance): what a lean path that parts from the server's would give."""

    def replay_step(self, S, params, n_total):
        out = dict(super().replay_step(S, params, n_total))
        out["means"] = out["means"] * (1 + 1e-7)
        return out


def test_a_lean_replay_that_parts_from_the_server_never_refuses_it():
    model, S = _Skewed(3), _stats(4)
    params = {"center": np.zeros(4)}
    sent = model.server_step(S, params, 500.0)
    lean = model.replay_step(S, params, 500.0)
    assert replay_refusal(model, S, params, 500.0, sent, lean, 5, "c0") is None
    moved = {**sent, "means": sent["means"] * (1 + 1e-6)}  # a server's move: still refused
    why = replay_refusal(model, S, params, 500.0, moved, lean, 5, "c0")
    assert why is not None and why.startswith("client 'c0': round 5 refused: parameter "
                                              "'means' differs from the replay")
