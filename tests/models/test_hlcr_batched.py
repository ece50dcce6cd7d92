"""FedHLCR's batched agent step (issue 23, item 4): every in-process agent's step in one pass,
with the draws of the agents stepping one by one (today's FedHLCR, ``batched=False``)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine import InProcessRuntime
from fedlatent.engine.contract.model import client_rng
from fedlatent.engine.privacy.disclosure import DisclosurePolicy
from fedlatent.engine.privacy.enforce import suppress_blocks
from fedlatent.engine.stats import Stats
from tolerance import assert_same  # exact: labels are integers

# small agents (16-32 events) with the default random intercept's extra sums: the saturation
# rule (tests/engine/test_rules_saturation.py) would refuse them; this module tests the sampler
pytestmark = pytest.mark.usefixtures("saturation_rule_off")


RTOL = 1e-12


@pytest.fixture(scope="module")
def fd():
    # entities of 3 events or more: below that an agent's differencing rule keeps state of its
    # own, and the agents step one by one (tests/engine/test_rules_differencing.py)
    fd = fl.datasets.make_synthhlcr(n_agents=12, n_entities=30, entities_per_agent=5,
                                    events_per_entity=12, n_clusters=3, n_features=2,
                                    random_state=5)
    assert min(np.unique(np.asarray(fd[c].entity), return_counts=True)[1].min()
               for c in fd.client_ids) >= 3
    return fd


def _fit(fd, batched: bool, **kw):
    rt = InProcessRuntime(fd, batched=batched)
    est = fl.HLCR(kw.pop("n_clusters", 3), max_rounds=kw.pop("max_rounds", 6),
                  random_state=kw.pop("seed", 0), n_chains=kw.pop("n_chains", 1), **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(fd, runtime=rt)
    return est, rt


def _close(a, b, name):
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    assert a.shape == b.shape, name
    assert_same(np.isnan(a), np.isnan(b), err_msg=name)
    a, b = a[~np.isnan(b)], b[~np.isnan(b)]
    scale = max(float(np.max(np.abs(b))), 1e-300) if b.size else 1.0
    err = float(np.max(np.abs(a - b))) / scale if b.size else 0.0
    assert err <= RTOL, f"{name}: relative difference {err:.3g}"


SETTINGS = {
    "defaults": {},  # sigma, delta drawn; standardized statistics; two chains
    "paper": {"sigma": 0.7, "delta": 1.0},  # fixed sigma, delta (Algorithm 3 as written)
    "partial": {"federation": fl.Federation(participation=0.5, step_size=0.6,
                                            control_variates=False), "seed": 3},
    "control_variates": {"federation": fl.Federation(participation=0.6, step_size=0.5),
                         "seed": 1},
    "random_intercept": {"random_intercept": True},
    "track_h": {"federation": fl.Federation(track_h=True)},  # the evaluation pass too
    # K chosen on held-out events (an agent of 3 events keeps 2: every block disclosed)
    "choose_k": {"n_clusters": "auto", "n_clusters_range": (1, 2), "max_rounds": 4,
                 "random_intercept": False,
                 "federation": fl.Federation(disclosure=DisclosurePolicy.off())},
}


@pytest.mark.parametrize("name", list(SETTINGS))
def test_batched_agents_draw_what_the_agents_draw_one_by_one(fd, name):
    kw = dict(SETTINGS[name])
    if name == "defaults":
        kw["n_chains"] = 2
    one, rt1 = _fit(fd, False, **dict(kw))
    many, rt = _fit(fd, True, **dict(kw))
    assert rt1.batched_calls == 0
    assert rt.batched_calls >= many.n_rounds_  # every round of the fit ran batched
    assert_same(many.labels_, one.labels_)
    assert_same(many.draws_labels_, one.draws_labels_)
    for attr in ("coef_", "intercept_", "precisions_", "c_", "cluster_counts_", "sigma_",
                 "draws_precisions_", "draws_c_", "draws_sigma_", "draws_tau_",
                 "history_log_joint_", "history_train_mse_"):
        _close(getattr(many, attr), getattr(one, attr), attr)
    _close([np.nan if r.h_norm2 is None else r.h_norm2 for r in many.history_],
           [np.nan if r.h_norm2 is None else r.h_norm2 for r in one.history_], "h_norm2")
    if name == "defaults":
        for key in one.chains_:
            _close(many.chains_[key], one.chains_[key], f"chains_[{key!r}]")
    # the agents' own states: labels of each agent's entities, read back from the batch
    states = rt.get_client_states()
    for cid, cd in fd.items():
        lab = states[cid]["model/labels"]
        assert lab.shape == (len(np.unique(np.asarray(cd.entity))),)
        assert_same(lab, rt1.get_client_states()[cid]["model/labels"])


def test_batched_step_is_each_agents_step_with_its_blocks_suppressed(fd):
    from fedlatent.models.hlcr.batched import AgentBatch, agents_step
    from fedlatent.models.hlcr.model import HLCRModel

    model = HLCRModel(3, 1.0, 1.0, 1.0, 0.7, n_features=fd.n_features)
    rng = np.random.default_rng(0)
    params = model.initial_params()
    F = model.F
    params["D"] = params["D"] + 0.3 * np.eye(F)
    params["c"] = rng.normal(size=(3, F))
    params["coef"] = rng.normal(size=(3, F))
    params["counts"] = np.array([20.0, 25.0, 15.0])
    datas = [cd for _, cd in fd.items()]
    ids = fd.client_ids
    idx = np.array([0, 2, 3, 7, 11])  # a round's participants
    policy = DisclosurePolicy(min_records_per_block=9)
    state = np.empty(len(idx), dtype=object)
    for i, a in enumerate(idx):  # agent 0 starts unlabelled, the others from labels
        E = model.n_units(datas[a])
        state[i] = np.full(E, -1) if a == 0 else rng.integers(0, 3, size=E)
    rngs = [client_rng(7, ids[a], 4, 0) for a in idx]
    step = agents_step(model, params, AgentBatch(model, datas), idx, {"labels": state},
                       rngs, policy)
    suppressed = 0
    for i, a in enumerate(idx):
        alone = model.client_stats(params, datas[a], {"labels": state[i]},
                                   client_rng(7, ids[a], 4, 0))
        stats, small = suppress_blocks(policy, alone.stats,
                                       model.disclosure_blocks(alone.stats))
        suppressed += len(small)
        assert_same(step.state["labels"][i], alone.state["labels"])
        assert step.n[i] == alone.n
        _close(step.objective[i], alone.objective, "objective")
        for k, v in stats.items():
            _close(step.stats[k][i], v, k)
    assert suppressed > 0  # the policy zeroed some agents' small blocks


def test_vectorized_check_flags_every_agent_check_refuses(fd):
    from fedlatent.models.hlcr.batched import hlcr_suspects
    from fedlatent.models.hlcr.model import HLCRModel

    model = HLCRModel(3, 1.0, 1.0, 1.0, 0.7, n_features=fd.n_features)
    rng = np.random.default_rng(1)
    params = model.initial_params()
    params["counts"] = np.array([20.0, 25.0, 15.0])
    datas = [cd for _, cd in fd.items()]
    steps = [model.client_stats(params, cd, model.init_client_state(cd), rng) for cd in datas]
    stats = {k: np.stack([s.stats[k] for s in steps]) for k in steps[0].stats}
    n = np.array([s.n for s in steps], dtype=float)
    bad = {1: ("n_entities", (0,), -1.0), 3: ("yty", (1,), -50.0), 4: ("sse", (2,), -1.0),
           6: ("XtX", (0, 0, 0), -1e3), 8: ("n_events", (2,), 1e3),
           10: ("n_entities", (1,), 1e3)}  # row: (block, entry, the value it is given)
    for row, (key, at, value) in bad.items():
        stats[key][(row, *at)] = value
    refused = np.array([model.check(Stats({k: v[i] for k, v in stats.items()}), n[i])
                        is not None for i in range(len(n))])
    assert refused[list(bad)].all() and refused.sum() == len(bad)
    flagged = hlcr_suspects(model, stats, n)
    assert_same(flagged, refused)
    # with a slack: a row flagged only where check, given the same slack, may refuse it
    slack = {k: np.full_like(v, 1e-9) for k, v in stats.items()}
    flagged = hlcr_suspects(model, stats, n, lambda r: {k: v[r] for k, v in slack.items()})
    assert flagged[list(bad)].all() and flagged.sum() == len(bad)


def test_agents_with_small_entities_step_one_by_one_under_the_differencing_rule():
    """An entity of fewer than 3 events: each agent suppresses blocks by the span of those it
    released before (state of its own), so the in-process runtime does not batch the agents
    and the fit is the one-by-one fit."""
    small = fl.datasets.make_synthhlcr(n_agents=6, n_entities=12, entities_per_agent=4,
                                       events_per_entity=3, n_clusters=2, n_features=2,
                                       random_state=5)
    assert min(np.unique(np.asarray(small[c].entity), return_counts=True)[1].min()
               for c in small.client_ids) < 3
    many, rt = _fit(small, True, n_clusters=2)
    one, _ = _fit(small, False, n_clusters=2)
    assert rt.batched_calls == 0
    assert_same(many.labels_, one.labels_)  # the same path: labels are integers
