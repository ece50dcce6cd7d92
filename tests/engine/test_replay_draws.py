"""The server steps beyond the M-step's closed form that a site replays (issue 38): HLCR's
server-side draws of sigma and delta (keyed by the committed seed and the step) and FedGMM's
learners' damped Newton steps are ``server_step``'s, so node/replay.py's replay reproduces
them within REPLAY_RTOL over whole fits; draws keyed by another seed, or a learner's
coefficient moved by 1e-6 (relative), are refused."""

from __future__ import annotations

import numpy as np
import pytest

from fedlatent.engine.node.replay import params_refusal, replay
from fedlatent.engine.protocol.messages import unpack
from fedlatent.engine.stats import Stats
from replay_recording import recorded


def _replayed(model, weights, n_total, msgs, ups):
    """``{k + 1: (S_hat, params replayed, previous params)}`` for every round ``k``."""
    state, out = None, {}
    use_cv = any(bool(m.get("control_variates", False)) for m in msgs.values())
    for k in sorted(k for k in msgs if k + 1 in msgs):
        total = None
        for c in sorted(ups[k]):
            q = Stats(unpack(ups[k][c], "delta")) * float(weights[c])
            total = q if total is None else total + q
        previous = unpack(msgs[k], "params")
        state, params = replay(model, state, total, previous, n_total,
                               init_round=state is None, gamma=1.0, p=1.0,
                               alpha=float(msgs[k]["alpha"]), use_cv=use_cv)
        out[k + 1] = (state.S_hat, params, previous)
    return out


def test_hlcrs_server_side_draws_replay_and_another_seed_is_refused():
    model, w, n, msgs, ups = recorded("hlcr", max_rounds=12)
    assert model.estimates_hyper  # sigma and delta are drawn on the server each round
    chain = _replayed(model, w, n, msgs, ups)
    sigmas = []
    for k, (_, params, _) in chain.items():
        sent = unpack(msgs[k], "params")
        assert params_refusal(sent, params, k, "c0") is None, k
        assert float(sent["step"]) == k - 1  # the draws' stream: (seed, step)
        sigmas.append(float(sent["sigma"]))
    assert len(set(sigmas)) == len(sigmas)  # a new draw every round, each replayed
    # a server that draws from another stream (another seed) at the last round
    k, (S_hat, params, previous) = max(chain.items())
    forged = model.server_step(S_hat, {**previous, "seed": previous["seed"] + 1.0}, n)
    assert float(forged["sigma"]) != pytest.approx(float(params["sigma"]), rel=1e-6)
    why = params_refusal({**forged, "seed": previous["seed"]}, params, k, "c0")
    assert why.startswith(f"client 'c0': round {k} refused: parameter 'D' differs from the "
                          "replay of the verified aggregate by ")
    assert params_refusal(forged, params, k, "c0").startswith(
        f"client 'c0': round {k} refused: parameter 'D' differs")


@pytest.mark.parametrize("update", ["newton", "average"])
def test_fedgmms_learner_steps_replay_and_a_moved_coefficient_is_refused(update):
    # a small trust region: the Newton steps are damped in early rounds
    model, w, n, msgs, ups = recorded("fedgmm", learner_update=update, newton_step_max=0.05,
                                       max_rounds=8, tol=1e-12)
    chain = _replayed(model, w, n, msgs, ups)
    damped = 0
    for k, (_, params, previous) in chain.items():
        sent = unpack(msgs[k], "params")
        assert params_refusal(sent, params, k, "c0") is None, k
        if update == "newton":
            step = np.max(np.abs(sent["coef"] - previous["coef"]), axis=(1, 2))
            damped += int(np.any(np.isclose(step, 0.05, rtol=1e-9)))
    assert damped >= 2 if update == "newton" else damped == 0
    k, (_, params, _) = max(chain.items())
    sent = unpack(msgs[k], "params")
    coef = np.array(sent["coef"], copy=True)
    j = np.unravel_index(int(np.argmax(np.abs(coef))), coef.shape)
    coef[j] *= 1 + 1e-6
    why = params_refusal({**sent, "coef": coef}, params, k, "c0")
    assert why.startswith(f"client 'c0': round {k} refused: parameter 'coef' differs from the "
                          f"replay of the verified aggregate by ")
    assert f"at {tuple(int(i) for i in j)}" in why
