"""A site's replay of the start (issue 38): under secure aggregation the start each model's
server computes is replayed from the committed seed and the start's verified sums within
REPLAY_RTOL; a coordinate moved by 1e-6 (relative), a crafted start (``means_init=...``), a
crafted query of the start and another seed are refused with their exact messages."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.contract import registry
from fedlatent.engine.estimation.fitcontext import FitContext
from fedlatent.engine.node.replay import REPLAY_RTOL, params_refusal
from fedlatent.engine.node.replay_start import (
    PUBLIC_STARTS_HINT,
    Exchange,
    StartRefused,
    _unknowns_equal,
    replay_start,
    seed_refusal,
    start_refusal,
)

MODELS = ["gmm", "lcr", "lca", "fedgmm", "hlcr"]


def _secure_start(name: str, monkeypatch, **params):
    """The start of ``name``'s example under secure aggregation, and what a site saw of it:
    ``(model, start, exchanges, seed, n_features, n_total, n_clients)``, each summed exchange
    as its query, payload and (verified) total."""
    case = registry.estimator_entries()[name].load_example().case()
    fd = case.data()
    est = case.make()
    est.set_params(federation=fl.Federation(secure_aggregation=True), **params)
    seen: list[Exchange] = []
    ask_sum = FitContext.ask_sum

    def recording(self, query, payload=None, *, shapes, what=None):
        out = ask_sum(self, query, payload, shapes=shapes, what=what)
        seen.append(Exchange(query, dict(payload or {}), {k: np.array(v) for k, v in out.items()}))
        recording.ctx = self
        return out

    monkeypatch.setattr(FitContext, "ask_sum", recording)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = est.initial_parameters(fd)
    ctx = recording.ctx
    return (ctx.model, start, seen, int(ctx.seed), ctx.n_features,
            float(sum(ctx.n_units.values())), len(ctx.client_ids))


def _refusal(sent, model, seed, seen, f, n, m, **kw):
    return start_refusal(sent, model, seed, seen, "c0", n_features=f, n_total=n, n_clients=m,
                         **kw)


@pytest.mark.parametrize("name", MODELS)
def test_the_honest_start_replays_within_the_tolerance(name, monkeypatch):
    model, start, seen, seed, f, n, m = _secure_start(name, monkeypatch)
    assert seen  # every start of a verified fit is a function of summed exchanges
    starts = replay_start(model, seed, seen, n_features=f, n_total=n, n_clients=m)
    assert any(params_refusal(*_unknowns_equal(start, s), 1, "c0", REPLAY_RTOL) is None
               for s in starts)
    assert _refusal(start, model, seed, seen, f, n, m) is None


@pytest.mark.parametrize("name", MODELS)
def test_a_start_coordinate_moved_by_1e_6_relative_is_refused(name, monkeypatch):
    model, start, seen, seed, f, n, m = _secure_start(name, monkeypatch)
    key = max((k for k, v in start.items() if np.size(v) and np.max(np.abs(v)) > 0),
              key=lambda k: np.size(start[k]))
    moved = {**start, key: np.array(start[key], dtype=np.float64, copy=True)}
    flat = moved[key].reshape(-1)
    flat[int(np.argmax(np.abs(flat)))] *= 1 + 1e-6
    why = _refusal(moved, model, seed, seen, f, n, m)
    assert why is not None and why.startswith(
        f"client 'c0': round 1 refused: parameter {key!r} differs from the replay of the "
        "verified aggregate by ")
    assert why.endswith("; the start is not the one replayed from the committed seed and the "
                        f"verified aggregates: {PUBLIC_STARTS_HINT}")
    # a site whose policy allows public starts answers it
    assert _refusal(moved, model, seed, seen, f, n, m, public_starts=True) is None


@pytest.mark.parametrize("name,key,param", [("gmm", "means", "means_init"),
                                            ("lcr", "beta", "coef_init")])
def test_a_crafted_start_is_refused_unless_public_starts(name, key, param, monkeypatch):
    """The analyst's start (``means_init``, ``coef_init``) puts its first component 3 away
    from the replayed start: a probe the site refuses at round 1."""
    model, start, seen, seed, f, n, m = _secure_start(name, monkeypatch)
    crafted = np.array(start[key], copy=True)[:, :f]
    crafted[0] = crafted[0] + 3.0
    model2, start2, seen2, *_ = _secure_start(name, monkeypatch, **{param: crafted})
    np.testing.assert_array_equal(np.asarray(start2[key])[:, :f], crafted)
    why = _refusal(start2, model2, seed, seen2, f, n, m)
    assert why is not None and why.startswith(
        f"client 'c0': round 1 refused: parameter {key!r} differs from the replay of the "
        "verified aggregate by 3 at (0, ")
    assert _refusal(start2, model2, seed, seen2, f, n, m, public_starts=True) is None


def test_a_crafted_query_of_the_start_is_refused(monkeypatch):
    """The server asks hard-assignment sums to centres of its choosing (sharp probes)."""
    model, start, seen, seed, f, n, m = _secure_start("gmm", monkeypatch)
    i = next(i for i, e in enumerate(seen) if e.query == "hard_stats")
    probes = np.array(seen[i].payload["centers"], copy=True)
    probes[1, 0] += 1e-3
    forged = [*seen[:i], Exchange("hard_stats", {**seen[i].payload, "centers": probes},
                                  seen[i].total), *seen[i + 1:]]
    why = _refusal(start, model, seed, forged, f, n, m)
    assert why.startswith(
        "client 'c0': round 1 refused: its start cannot be replayed (k-means initialization "
        f"(hard-assignment sums to candidate centres): exchange {i + 1} is not the replayed "
        "start's 'hard_stats': parameter 'centers' differs from the replay of the verified "
        "aggregate by 0.001 at (1, 0)")
    extra = [*seen, Exchange("moments", {}, seen[0].total)]  # one exchange more
    with pytest.raises(StartRefused, match=(
            f"the transcript holds {len(seen) + 1} exchanges, the replayed start asks "
            f"{len(seen)}: 'moments' is not the start's")):
        replay_start(model, seed, extra, n_features=f, n_total=n, n_clients=m)


def test_an_exchange_is_read_from_the_query_message_a_client_receives():
    ex = Exchange.of({"query": "hard_stats", "seed": 3, "centers": np.ones((2, 1))},
                     {"nk": np.ones(2)})
    assert ex.query == "hard_stats" and list(ex.payload) == ["centers"]


def test_another_seed_is_refused():
    assert seed_refusal({"seed": 7}, 7, "c0", "query 'moments'") is None
    assert seed_refusal({"query": "moments", "seed": 8}, 7, "c0", "query 'moments'") == (
        "client 'c0': query 'moments' refused: it carries seed 8, not the seed 7 committed at "
        "the setup (random draws are the committed seed's)")


@pytest.mark.parametrize("name", MODELS)
def test_the_start_replays_from_aggregates_differing_in_their_last_bits(name, monkeypatch):
    """Another CPU's last bits (every aggregate moved by ~4e-16 relative): the start still
    replays within REPLAY_RTOL (measured: at most 2.7e-12 of a parameter's largest entry,
    the GMM's k-means start, over 20 draws)."""
    model, start, seen, seed, f, n, m = _secure_start(name, monkeypatch)
    rng = np.random.default_rng(1)
    for _ in range(5):
        noisy = [Exchange(e.query, e.payload, {
            k: np.asarray(v) * (1 + 4e-16 * rng.standard_normal(np.shape(v)))
            for k, v in e.total.items()}) for e in seen]
        assert _refusal(start, model, seed, noisy, f, n, m) is None
