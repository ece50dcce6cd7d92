"""A site's replay of the server (issue 38): from a round's aggregate, the FedEM update and the
M-step give the next round's parameters to the replay tolerance; one coordinate moved by 1e-6
(relative) is refused, naming the round, the parameter and the largest difference."""

from __future__ import annotations

import re

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.node.replay import REPLAY_RTOL, params_refusal, replay
from fedlatent.engine.protocol.messages import unpack
from fedlatent.engine.stats import Stats
from replay_recording import recorded


def _rounds(name: str, cv: bool):
    """An example fit of ``name`` (full participation, one start), every message recorded."""
    return recorded(name, one_start=True, federation=fl.Federation(control_variates=cv))


def _total(replies: dict, weights: dict) -> Stats:
    """``sum_c w_c Q_c`` of the replies (what the verified aggregate holds), in client order."""
    out = None
    for c in sorted(replies):
        q = Stats(unpack(replies[c], "delta")) * float(weights[c])
        out = q if out is None else out + q
    return out


def _chain(model, weights, n_total, msgs, ups):
    """Every round replayed from the first, the state carried as a site carries it:
    ``{k + 1: (state, params)}`` for each round ``k`` with a next one."""
    state, out = None, {}
    # the fit's setting (the initialization round's message does not carry it)
    use_cv = any(bool(m.get("control_variates", False)) for m in msgs.values())
    for k in sorted(k for k in msgs if k + 1 in msgs):
        msg = msgs[k]
        state, params = replay(model, state, _total(ups[k], weights), unpack(msg, "params"),
                               n_total, init_round=state is None, gamma=1.0, p=1.0,
                               alpha=float(msg["alpha"]), use_cv=use_cv)
        out[k + 1] = (state, params)
    return out


@pytest.mark.parametrize("cv", [True, False])
@pytest.mark.parametrize("name", ["gmm", "lcr", "lca", "fedgmm", "hlcr"])
def test_the_replay_of_each_round_gives_the_next_rounds_parameters(name, cv):
    model, weights, n_total, msgs, ups = _rounds(name, cv)
    chain = _chain(model, weights, n_total, msgs, ups)
    assert len(chain) >= 2
    for k, (state, params) in chain.items():
        assert params_refusal(unpack(msgs[k], "params"), params, k, "c") is None, k
        S_next = Stats(unpack(msgs[k], "S_hat"))
        for key in S_next:
            np.testing.assert_allclose(state.S_hat[key], S_next[key], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", ["gmm", "lcr", "lca"])
def test_one_coordinate_moved_by_1e_6_relative_is_refused(name):
    model, weights, n_total, msgs, ups = _rounds(name, True)
    k, (_, params) = sorted(_chain(model, weights, n_total, msgs, ups).items())[-1]
    sent = unpack(msgs[k], "params")
    key = {"gmm": "means", "lcr": "beta", "lca": "probs"}[name]
    moved = {**sent, key: np.array(sent[key], copy=True)}
    flat = moved[key].reshape(-1)
    j = int(np.argmax(np.abs(flat)))
    flat[j] *= 1 + 1e-6
    why = params_refusal(moved, params, k, "c0")
    assert why is not None and why.startswith(
        f"client 'c0': round {k} refused: parameter {key!r} differs from the replay of the "
        "verified aggregate by ")
    assert f"above the tolerance {REPLAY_RTOL:g} of its largest entry" in why
    # the coordinate moved, and by what it was moved (the replay agrees with the rest to ~1e-12)
    by, at = re.search(r"by (\S+) at (\([0-9, ]*\))", why).groups()
    assert at == str(tuple(int(i) for i in np.unravel_index(j, moved[key].shape)))
    assert float(by) == pytest.approx(1e-6 * abs(flat[j]), rel=1e-2)


def test_a_parameter_added_or_left_out_is_refused():
    sent = {"a": np.ones(2)}
    assert "carries 'b'" in params_refusal({**sent, "b": np.ones(1)}, sent, 3, "c")
    assert "lacks 'a'" in params_refusal({}, sent, 3, "c")
    assert "differs" in params_refusal({"a": np.array([1.0, np.nan])}, sent, 3, "c")
