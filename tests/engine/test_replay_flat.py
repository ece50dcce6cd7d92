"""A verifying site's steady rounds on its packed state (issue 38): the server's FedEM step on
flat vectors and the forward check's M-step arithmetic give the server's own bits, and a
refused round leaves what the site kept as it was."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_verified_rounds import Deviating, K, _case, _fit, _moved

from fedlatent.engine.faults import FederatedFitError
from fedlatent.engine.fedem.update import FedEMState
from fedlatent.engine.node.verify_kept import Plan, _layout, flat_step
from fedlatent.engine.protocol.messages import ERROR_KEY
from fedlatent.engine.secagg.encoding import FixedPoint
from fedlatent.engine.stats import Stats
from fedlatent.models.gmm import math as gmm_math
from fedlatent.models.gmm.math import gmm_full_parts, gmm_m_step
from tolerance import assert_same


def _random_stats(rng, K: int, d: int) -> Stats:
    scale = 10.0 ** rng.uniform(-3, 3)
    X = rng.normal(size=(K, 30, d)) * scale + rng.normal(size=d)
    nk = rng.dirichlet(np.ones(K)) * 10.0 ** rng.uniform(-2, 3)
    return Stats({"nk": nk, "sx": X.mean(1) * nk[:, None],
                  "sxx": np.einsum("kni,knj->kij", X, X) / 30 * nk[:, None, None]})


def _halved_then_ridged(S: Stats, center, reg: float):
    """The server's full-covariance M-step as it was written before the forward check shared
    it: the covariances halved with their transpose, then ``reg`` added to the diagonal."""
    nk = S["nk"] + 10 * np.finfo(np.float64).eps
    mc = S["sx"] / nk[:, None]
    cov = S["sxx"] / nk[:, None, None] - np.einsum("ki,kj->kij", mc, mc)
    cov = 0.5 * (cov + cov.transpose(0, 2, 1))
    d = mc.shape[1]
    cov.reshape(-1, d * d)[:, ::d + 1] += reg
    return nk / nk.sum(), mc + center, cov


def test_the_checks_covariances_before_the_half_sum_give_the_servers_bits():
    """2,000 random statistics (1 to 11 components, 1 to 6 features, counts and scales over
    five and six orders of magnitude): ``gmm_full_parts``' ``G``, which the forward check
    bounds (compiled at a verifying site, NumPy at the server), halved with its transpose,
    and ``gmm_m_step``'s covariances are the M-step as written before (ridge after the
    half-sum), bit for bit: the ridge first changes no value (a diagonal entry halved from
    twice itself is itself)."""
    rng = np.random.default_rng(0)
    for _ in range(2000):
        K, d = int(rng.integers(1, 12)), int(rng.integers(1, 7))
        S, center = _random_stats(rng, K, d), rng.normal(size=d)
        reg = float(rng.choice([0.0, 1e-6, 1e-3]))
        want = _halved_then_ridged(S, center, reg)
        for compiled in (False, True):  # (the server's and a verifying site's)
            weights, means, G = gmm_full_parts(S, center, reg, compiled)
            # the same IEEE operations on the same values (the ridge moved before the half-sum)
            for got in ((weights, means, (G + G.transpose(0, 2, 1)) * 0.5),
                        gmm_m_step(S, center, "full", reg)):
                for a, b in zip(got, want):
                    assert_same(a, b, "the same IEEE operations, the ridge before the half-sum")


@pytest.mark.parametrize("flat_entries", [0, 1 << 30], ids=["broadcast", "index-maps"])
def test_both_forms_of_the_full_covariance_parts_give_the_same_bits(monkeypatch,
                                                                     flat_entries):
    """``gmm_full_parts`` takes small models by index maps on flat arrays and larger ones by
    broadcasting: each form alone (the threshold moved) gives the M-step as written before
    on 500 random statistics (up to 40 components of 12 features: 5,760 entries)."""
    monkeypatch.setattr(gmm_math, "_FLAT_ENTRIES", flat_entries)
    rng = np.random.default_rng(1)
    for _ in range(500):
        K, d = int(rng.integers(1, 41)), int(rng.integers(1, 13))
        S, center = _random_stats(rng, K, d), rng.normal(size=d)
        reg = float(rng.choice([0.0, 1e-6]))
        weights, means, G = gmm_full_parts(S, center, reg)
        got = (weights, means, (G + G.transpose(0, 2, 1)) * 0.5)
        for a, b in zip(got, _halved_then_ridged(S, center, reg)):
            assert_same(a, b, "the same IEEE operations, by index maps or broadcasting")


def _plan(shapes: dict) -> Plan:
    rows = [[g, n, list(s)] for g in ("params", "S_hat", "V") for n, s in shapes[g].items()]
    return Plan(_layout(json.dumps(rows).encode())[0])


@pytest.mark.parametrize("control_variates", [True, False])
@pytest.mark.parametrize(("gamma", "alpha"), [(1.0, 1.0), (0.7, 1.0), (1.0, 0.3),
                                              (0.55, 0.25)])
def test_the_flat_fedem_step_is_the_servers_to_the_last_bit(control_variates, gamma, alpha):
    """The site's step on the aggregate's words (NumPy, or compiled) and the server's on the
    decoded aggregate (the fixed-point encoding's own decode) give the same bits, on 50
    random states a setting (words of every magnitude, negative ones among them)."""
    rng = np.random.default_rng(int(gamma * 100 + alpha * 10 + control_variates))
    for _ in range(50):
        encoding = FixedPoint(scale=float(rng.choice([2.0 ** 30, 3e8 + 1])))  # (and one
        # whose division rounds)
        K, d = int(rng.integers(1, 6)), int(rng.integers(1, 5))
        S, V = (_random_stats(rng, K, d) for _ in range(2))
        size = S.flatten().size
        words = rng.integers(-(1 << 62), 1 << 62, size=size) >> rng.integers(0, 62, size=size)
        agg = S.unflatten(encoding.decode({"a": words.view(np.uint64)})["a"])
        shapes = {"params": {"w": (K,), "m": (K, d)}, "S_hat": S.shapes,
                  "V": V.shapes if control_variates else {}}
        at = _plan(shapes)
        kept = np.concatenate([rng.normal(size=K + K * d), S.flatten()]
                              + ([V.flatten()] if control_variates else []))
        server = FedEMState(S, V if control_variates else None).advance(
            agg, False, gamma, 1.0, alpha, control_variates)
        for compiled in (False, True):  # (NumPy, or one compiled pass where numba is set up)
            new = flat_step(kept, at, words, encoding.scale, gamma, alpha, compiled=compiled)
            # the server's Stats.add_ block by block and flat_step on the whole vector: the
            # same elementwise additions and products, in the same order
            assert_same(new[at.spans["S_hat"]], server.S_hat.flatten())
            if control_variates:
                assert_same(new[at.spans["V"]], server.V.flatten())
            assert_same(kept[at.spans["S_hat"]], S.flatten())  # (what was kept: unchanged)


class Kept(Deviating):
    """:class:`Deviating`, keeping each node's verification state before round ``K``."""

    def call(self, client_ids, method, messages):
        if method == "estep" and any(int(m.get("secagg/round", 0)) == self.at
                                     for m in messages.values()):
            self.before = {c: {k: (v, np.array(v, copy=True))
                               for k, v in self.nodes[c].state.items()
                               if k.startswith("verify/")} for c in client_ids}
        return super().call(client_ids, method, messages)


@pytest.mark.parametrize("at", [K - 1, K], ids=["initialization-round", "steady-round"])
@pytest.mark.parametrize("name", ["gmm", "lcr"])
def test_a_refused_round_leaves_what_the_site_kept(name, at):
    """The initialization round (FedEM's first step) or a steady round moved by 1e-6: every
    site refuses it, naming it, and its packed state and round are the ones it kept
    before."""
    case, fd = _case(name)
    rt = Kept(fd, _moved, at=at)
    with pytest.raises(FederatedFitError, match=rf"^round {at}, exchange 'estep': 0 of "):
        _fit(name, rt)
    for c in fd.client_ids:
        state, before = rt.nodes[c].state, rt.before[c]
        held, bits = before["verify/kept"]
        assert state["verify/kept"] is held  # (never replaced)
        assert_same(held, bits)  # (nor written: the copy taken before the round)
        assert float(state["verify/round"]) == float(before["verify/round"][1]) == at - 1
        assert f"round {at} refused" in rt.replies[c][ERROR_KEY]
