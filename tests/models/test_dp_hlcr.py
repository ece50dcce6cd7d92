"""FedHLCR under differential privacy (fedlatent.models.hlcr.privacy): the per-entity bounds
hold for arbitrarily large replacements, no entity's label depends on another's, the private
fit spends exactly its plan, the noise is reproducible only with a noise_seed, a fit with
little noise matches the non-private one, and what cannot be protected is refused."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.data.dataset import ClientData
from fedlatent.data.hlcr_data import make_synthhlcr, split_events
from fedlatent.engine.privacy import DifferentialPrivacy
from fedlatent.engine.privacy.disclosure import DisclosurePolicy
from fedlatent.engine.privacy.enforce import suppress_blocks
from fedlatent.engine.protocol.exchange import setup_clients
from fedlatent.engine.protocol.messages import ERROR_KEY
from fedlatent.engine.transport.inprocess import InProcessRuntime
from fedlatent.models.hlcr import HLCRModel
from fedlatent.models.hlcr.model import HELDOUT_QUERY, MOMENTS_QUERY, SIZES_QUERY
from fedlatent.models.hlcr.privacy import (
    cap_events,
    dp_moments_scaling,
    hlcr_query_sensitivity,
    private_moments,
)
from fedlatent.models.hlcr.sampler import sample_public_prior_labels
from fedlatent.models.hlcr.scaling import moments_scaling, scaling_matrix

DELTA = 1e-5
M = 4  # events kept per entity
CENTER = (0.5, -0.5)


def _dp(eps=1.0, **kw):
    return DifferentialPrivacy(eps, DELTA, clip=3.0, target_range=(-5.0, 5.0), center=CENTER,
                               **kw)


def _agent(rng, n_entities, max_events):
    counts = rng.integers(1, max_events + 1, size=n_entities)
    ent = np.repeat(np.array([f"e{j:02d}" for j in range(n_entities)]), counts)
    perm = rng.permutation(len(ent))  # entities' events interleaved in the agent's rows
    X = rng.normal(size=(len(ent), 2)) * 2
    y = X @ np.array([1.0, -2.0]) + rng.normal(size=len(ent))
    return ClientData(X[perm], y[perm], ent[perm])


def _params(model, distinct=True):
    """Broadcast parameters with a scaling (standardized fit) and clusters that differ."""
    p = model.initial_params()
    K, F = model.K, model.F
    mx, sx = np.array(CENTER), np.array([1.5, 1.5])
    if distinct:
        W = np.array([[1.0, -2.0, 0.0], [-1.0, 1.0, 0.5], [0.0, 0.0, -1.0]])[:K]
        p["D"] = np.tile(np.eye(F) * 20.0, (K, 1, 1))
        p["c"] = 20.0 * W
        p["counts"] = np.array([5.0, 3.0, 1.0])[:K]
    p.update(T=scaling_matrix(mx, sx, True), y_shift=np.array(0.0), y_scale=np.array(2.5),
             x_shift=mx, x_scale=sx, sigma=np.array(0.7), delta=np.array(1.0),
             seed=np.array(0.0), step=np.array(0.0))
    return p


def _stats(model, data, params, seed):
    step = model.client_stats(params, data, {}, np.random.default_rng(seed))
    stats, _ = suppress_blocks(model.disclosure, step.stats, model.disclosure_blocks(step.stats))
    return stats, step.state["labels"]


# ---- sensitivity ---------------------------------------------------------------------------------
@pytest.mark.parametrize("n_entities, max_events", [(12, 2 * M), (4, 2)])
def test_replacing_one_entity_arbitrarily_moves_each_block_by_at_most_twice_its_bound(
        n_entities, max_events):
    """Large agents reach the bound; small ones (blocks of 1-2 events, suppressed under the
    default min_records_per_block=3) exercise the disclosure widening."""
    rng = np.random.default_rng(n_entities)
    dp = _dp()
    model = HLCRModel(3, 1.0, 1.0, 1.0, 0.7, True, 2, estimate_sigma=True, estimate_delta=True,
                      standardize=True, dp_max_events=M)
    model.disclosure = DisclosurePolicy()
    params = _params(model)
    data = _agent(rng, n_entities, max_events)
    base, base_z = _stats(model, model.dp_clip(data, dp), params, 7)
    bound = model.dp_sensitivity(params, dp)
    model.privacy = dp
    q_base = model.client_query(MOMENTS_QUERY, {}, model.dp_clip(data, dp), {}, None)[0]
    q_bound = model.dp_query_sensitivity(MOMENTS_QUERY, {}, dp)
    worst = dict.fromkeys(bound, 0.0)
    ent = np.asarray(data.entity)
    names = np.unique(ent)
    for _ in range(50):
        j = int(rng.integers(n_entities))
        keep = ent != names[j]
        m = int(rng.integers(1, 3 * M))  # more events than the cap, sometimes
        scale = 10.0 ** rng.uniform(0, 6)
        X2 = np.vstack([data.X[keep], rng.normal(size=(m, 2)) * scale])
        y2 = np.r_[data.y[keep], rng.normal(size=m) * scale]
        d2 = model.dp_clip(ClientData(X2, y2, np.r_[ent[keep], [names[j]] * m]), dp)
        moved, z = _stats(model, d2, params, 7)
        others = np.arange(n_entities) != j
        np.testing.assert_array_equal(z[others], base_z[others])  # labels independent
        for b in bound:
            gap = float(np.linalg.norm(moved[b] - base[b]))
            worst[b] = max(worst[b], gap)
            assert gap <= 2 * bound[b] * (1 + 1e-9), b
        q2 = model.client_query(MOMENTS_QUERY, {}, d2, {}, None)[0]
        for f in q_bound:
            assert np.linalg.norm(q2[f] - q_base[f]) <= 2 * q_bound[f] * (1 + 1e-9), f
    assert np.all(base["sse"] == 0) and bound["sse"] == 0  # not released
    if n_entities > 4:  # the bound is not vacuous: a replaced entity comes close
        assert worst["XtX"] > 0.5 * bound["XtX"]
        assert worst["n_entities"] >= 1.0


def test_the_bounds_are_those_of_the_derivation():
    dp = _dp()
    model = HLCRModel(3, 1.0, 1.0, 1.0, 0.7, True, 2, standardize=True, dp_max_events=M)
    p = _params(model)
    r = 3.0 / 1.5  # R / min(s), the centre at the shift
    B = 5.0 / 2.5  # max(|lo - m_y|, |hi - m_y|) / s_y
    model.disclosure = DisclosurePolicy(min_records_per_block=3)
    b = model.dp_sensitivity(p, dp)
    n = M + 2
    assert b == pytest.approx({"XtX": n * (r * r + 1), "Xty": n * np.sqrt(r * r + 1) * B,
                               "yty": n * B * B, "n_events": n, "n_entities": 3.0, "sse": 0.0})
    model.disclosure = DisclosurePolicy(count_scope="aggregate")  # secure aggregation
    assert model.dp_sensitivity(p, dp)["n_events"] == M
    assert hlcr_query_sensitivity(dp, M) == pytest.approx(
        {"n": M, "sx": 3.0 * M, "sxx": 9.0 * M, "sy": 5.0 * M, "syy": 25.0 * M})


def test_the_paper_prior_would_let_one_entity_move_the_others_labels():
    """Why the private sampler drops the within-agent counts: with them (Algorithm 3), the
    same uniforms give other entities other labels when one entity changes."""
    rng = np.random.default_rng(3)
    clipped = HLCRModel(3, 1.0, 1.0, 1.0, 0.7, True, 2, dp_max_events=M).dp_clip(
        _agent(rng, 12, 3), _dp())
    moved_any = {True: False, False: False}
    for private in (True, False):
        model = HLCRModel(3, 1.0, 1.0, 1.0, 0.7, True, 2, standardize=True,
                          dp_max_events=M if private else None)
        params = _params(model, distinct=False)  # flat likelihood: the prior decides
        state = {"labels": np.array([0] * 6 + [1] * 6)}
        z0 = model.client_stats(params, clipped, state, np.random.default_rng(1)).state["labels"]
        for j in range(12):
            st = {"labels": state["labels"].copy()}
            st["labels"][j] = (st["labels"][j] + 1) % 3  # entity j's history differs
            z = model.client_stats(params, clipped, st, np.random.default_rng(1)).state["labels"]
            moved_any[private] |= bool(np.any(np.delete(z != z0, j)))
    assert moved_any == {True: False, False: True}


def test_public_prior_labels_follow_psi_times_likelihood():
    rng = np.random.default_rng(0)
    ll = np.tile([0.0, np.log(2.0), np.log(0.5)], (40000, 1))
    counts = np.array([10.0, 10.0, 20.0])
    z, lp = sample_public_prior_labels(ll, np.full(40000, -1), counts, 3.0, rng)
    psi = (counts + 1.0) / 43.0
    p = psi * np.array([1.0, 2.0, 0.5])
    p /= p.sum()
    np.testing.assert_allclose(np.bincount(z, minlength=3) / 40000, p, atol=0.01)
    np.testing.assert_allclose(lp, np.log(psi)[z])


def test_cap_keeps_the_first_events_of_every_entity_in_row_order():
    ent = np.array(["b", "a", "b", "b", "a", "c", "b"])
    np.testing.assert_array_equal(cap_events(ent, 2), [0, 1, 2, 4, 5])
    np.testing.assert_array_equal(cap_events(ent, 1), [0, 1, 5])


@pytest.mark.parametrize("fit_intercept", [True, False])
def test_private_scaling_without_noise_is_the_plain_scaling(fit_intercept):
    """The sums about the clipping centre and the target's middle give back the standardizing
    moments exactly when no estimate is projected."""
    rng = np.random.default_rng(0)
    dp = _dp()
    X = np.array(CENTER) + rng.normal(size=(400, 2)) * 0.5
    y = rng.normal(size=400) + 0.3
    tot = private_moments(X, y, dp)
    got = dp_moments_scaling(tot, dp, fit_intercept)
    want = moments_scaling(400.0, X.sum(0), (X * X).sum(0), y.sum(), y @ y, fit_intercept)
    for g, w in zip(got[:4], want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
    assert got[4] == 400.0
    noisy = {**tot, "sxx": -tot["sxx"], "syy": -1.0}  # noise can make them negative
    _, sx, _, sy, _ = dp_moments_scaling(noisy, dp, True)
    np.testing.assert_allclose(sx, 0.05 * 3.0)  # the floor, a fraction of the radius
    assert sy == pytest.approx(0.05 * 5.0)


# ---- private fits --------------------------------------------------------------------------------
def _data(seed=0, n_agents=6, entities=10, events=8, K=2):
    fd = make_synthhlcr(n_agents=n_agents, n_entities=n_agents * entities,
                        entities_per_agent=entities, events_per_entity=events, n_clusters=K,
                        n_features=2, alpha=10.0, random_state=seed)
    return next(split_events(fd, 5, random_state=seed))


def _private(dp, max_rounds=4, **kw):
    return fl.HLCR(2, max_rounds=max_rounds, random_state=0, dp_max_events=8,
                   federation=fl.Federation(privacy=dp, **kw))


def _fit(est, fd):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return est.fit(fd)


def test_a_private_fit_spends_its_plan_round_by_round_and_never_more():
    tr, _ = _data()
    dp = DifferentialPrivacy(2.0, DELTA, clip=4.0, target_range=(-8.0, 8.0), noise_seed=0)
    est = _fit(_private(dp), tr)
    cal = dp.calibrate(4 + 1)  # four rounds and the standardizing moments
    h = est.history_.to_frame()
    assert list(h["round"]) == [1, 2, 3, 4]
    np.testing.assert_allclose(h["epsilon"], [cal.epsilon_after(1 + k) for k in range(1, 5)])
    assert np.all(np.diff(h["epsilon"]) > 0)
    assert est.privacy_spent_[0] == h["epsilon"].iloc[-1] <= 2.0
    assert est.privacy_spent_[0] > 1.99 and est.privacy_spent_[1] == DELTA
    assert h["objective"].isna().all()  # withheld: not covered by the noise
    assert np.isnan(est.mixing_)  # reads the agents' rows: not computed
    assert est.n_entities_ == sum(len(np.unique(cd.entity)) for _, cd in tr.items())
    assert np.all(np.isfinite(est.coef_)) and est.sigma_ > 0


def test_noise_is_fresh_without_a_noise_seed_and_reproducible_with_one():
    tr, _ = _data()

    def dp(**kw):
        return DifferentialPrivacy(2.0, DELTA, clip=4.0, target_range=(-8.0, 8.0), **kw)

    a, b = (_fit(_private(dp(), max_rounds=2), tr) for _ in range(2))
    assert not np.allclose(a.coef_, b.coef_)
    c, d = (_fit(_private(dp(noise_seed=5), max_rounds=2), tr) for _ in range(2))
    np.testing.assert_array_equal(c.coef_, d.coef_)
    np.testing.assert_array_equal(c.labels_, d.labels_)


def test_with_little_noise_the_private_fit_predicts_as_well_as_the_plain_one():
    """240 entities are few units: epsilon=1e4 (noise multiplier 0.02) is "little noise"
    here; at 1e3 the held-out MSE is still about 10% above the plain fit's."""
    tr, te = _data(seed=1, n_agents=6, entities=40, events=10)
    plain = _fit(fl.HLCR(2, max_rounds=8, random_state=0), tr)
    dp = DifferentialPrivacy(1e4, DELTA, clip=4.0, target_range=(-5.0, 5.0), noise_seed=1)
    priv = _fit(fl.HLCR(2, max_rounds=8, random_state=0, dp_max_events=10,
                        federation=fl.Federation(privacy=dp)), tr)
    assert priv.mse(te) == pytest.approx(plain.mse(te), rel=0.05)
    assert priv.mse(te) < 0.5 * _fit(fl.HLCR(1, max_rounds=8, random_state=0), tr).mse(te)


def test_distributed_noise_with_secure_aggregation_runs_and_spends_its_plan():
    tr, _ = _data(n_agents=5)
    dp = DifferentialPrivacy(2.0, DELTA, clip=4.0, target_range=(-8.0, 8.0),
                             noise="distributed", noise_seed=0)
    est = _fit(_private(dp, max_rounds=2, secure_aggregation=True, secagg_threshold=4), tr)
    assert len(est.history_) == 2 and 1.99 < est.privacy_spent_[0] <= 2.0
    assert np.all(np.isfinite(est.coef_))


# ---- refusals ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, dp_kw, message", [
    ({}, {"target_range": None}, r"needs DifferentialPrivacy\(target_range=\(lo, hi\)\), a "
     r"public bound on the target 'y'"),
    ({"dp_max_events": None}, {}, r"give HLCR\(dp_max_events=M\)"),
    ({"n_clusters": "auto"}, {}, r"n_clusters='auto' scores every K on held-out events"),
    ({"solver": "gibbs"}, {}, r"HLCR refuses Federation\(privacy=DifferentialPrivacy\(\.\.\.\)\)"
     r": solver='gibbs' pools the rows"),
])
def test_what_cannot_be_protected_is_refused_before_anything_is_sent(kw, dp_kw, message):
    tr, _ = _data()
    dp = DifferentialPrivacy(1.0, DELTA, clip=4.0, **{"target_range": (-8.0, 8.0), **dp_kw})
    est = fl.HLCR(max_rounds=2, random_state=0, federation=fl.Federation(privacy=dp),
                  **{"n_clusters": 2, "dp_max_events": 8, **kw})
    with pytest.raises(ValueError, match=message):
        est.fit(tr)


@pytest.mark.parametrize("query", [SIZES_QUERY, HELDOUT_QUERY])
def test_sizes_and_held_out_scores_are_refused_by_the_agents(query):
    tr, _ = _data()
    model = HLCRModel(2, 1.0, 1.0, 1.0, 0.7, True, 2, dp_max_events=8)
    dp = DifferentialPrivacy(1.0, DELTA, clip=4.0, target_range=(-8.0, 8.0))
    rt = InProcessRuntime(tr)
    setup_clients(rt, model, None, dp, 3)
    reps = rt.call(rt.client_ids, "query", {c: {"query": query} for c in rt.client_ids})
    assert all(f"query {query!r} is not available under differential privacy" in r[ERROR_KEY]
               for r in reps.values())


def test_an_agent_without_the_cap_or_the_target_bound_refuses_to_clip():
    data = _agent(np.random.default_rng(0), 3, 2)
    with pytest.raises(ValueError, match=r"give HLCR\(dp_max_events=M\)"):
        HLCRModel(2, 1.0, 1.0, 1.0, 0.7, True, 2).dp_clip(data, _dp())
    bare = DifferentialPrivacy(1.0, DELTA, clip=3.0)
    with pytest.raises(ValueError, match=r"target_range=\(lo, hi\)\): without a bound"):
        HLCRModel(2, 1.0, 1.0, 1.0, 0.7, True, 2, dp_max_events=M).dp_clip(data, bare)


def test_the_private_start_spreads_the_clusters_without_reading_data():
    """Standardized private fits start from K distinct prior means (no budget spent on them);
    the paper's start (identical clusters) stays for unstandardized fits."""
    tr, _ = _data()
    dp = DifferentialPrivacy(2.0, DELTA, clip=4.0, target_range=(-8.0, 8.0), noise_seed=0)
    p = _private(dp).initial_parameters(tr)
    W = p["coef"]
    assert len(np.unique(np.round(W, 12), axis=0)) == 2 and np.all(np.abs(W).sum(1) > 0)
    np.testing.assert_allclose(p["c"], np.einsum("kij,kj->ki", p["D"], W))
    assert p["dp_ridge"] > 0
    fixed = fl.HLCR(2, max_rounds=4, random_state=0, dp_max_events=8, sigma=1.0, delta=1.0,
                    standardize=False, federation=fl.Federation(privacy=dp))
    q = fixed.initial_parameters(tr)
    assert np.all(q["coef"] == 0) and np.all(q["c"] == 0)
    assert fixed._dp_init_releases == 0  # nothing asked before round 1
