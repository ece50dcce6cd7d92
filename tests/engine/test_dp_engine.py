"""Differential privacy through the engine: what the clients add, what the server counts.

The noise a client adds is the calibrated one (empirical variance over 200 seeds), one record
moves a client's clipped statistic by at most the stated sensitivity, the epsilon the history
reports is the accountant's own figure, the spend never exceeds the budget, and a fit stops
before a round that would exceed it.
"""

from __future__ import annotations

import json
import logging

import dp_accounting as dpa  # the `privacy` extra, which `make test` installs
import numpy as np
import pytest
from dp_accounting.pld.pld_privacy_accountant import PLDAccountant
from dp_accounting.rdp.rdp_privacy_accountant import RdpAccountant

import fedlatent as fl
from fedlatent.engine.privacy import DifferentialPrivacy, PrivacyBudget
from fedlatent.engine.privacy.client_dp import ClientPrivacy, release_stds
from fedlatent.engine.protocol.exchange import setup_clients
from fedlatent.engine.protocol.messages import ERROR_KEY, pack, unpack
from fedlatent.engine.rounds.loop import LoopOptions, run_rounds
from fedlatent.engine.stats import Stats
from fedlatent.engine.transport.inprocess import InProcessRuntime
from fedlatent.models.gmm.math import compute_precision_cholesky
from fedlatent.models.gmm.model import GMMModel
from tolerance import assert_same

DELTA = 1e-5


def _fd(n_clients=3, n=40, seed=0):
    rng = np.random.default_rng(seed)
    return fl.FederatedDataset.from_arrays(
        {f"c{i}": rng.normal(size=(n, 2)) * 3 + i for i in range(n_clients)})


def _params(K=2, d=2):
    cov = np.repeat(np.eye(d)[None] * 2.0, K, 0)
    return {"weights": np.full(K, 1 / K), "means": np.array([[-1.0, 0.0], [2.0, 1.0]]),
            "precisions_cholesky": compute_precision_cholesky(cov, "full"),
            "center": np.zeros(d)}


def _estep(rt, params, k):
    msg = {"seed": 0, "round": k, "mode": "full", **pack("params", params)}
    reps = rt.call(rt.client_ids, "estep", {c: msg for c in rt.client_ids})
    return reps


def _summed(reps):
    """The aggregate of the clients' sums (each reply is a per-unit mean times n)."""
    total = None
    for rep in reps.values():
        s = Stats(unpack(rep, "delta")) * float(rep["n"])
        total = s if total is None else total + s
    return total


def _exact(fd, model, params, dp):
    total = None
    for c in fd.client_ids:
        step = model.client_stats(params, model.dp_clip(fd[c], dp), {}, None)
        total = step.stats if total is None else total + step.stats
    return total


# ---- the noise is the calibrated noise --------------------------------------------------------
def test_empirical_variance_of_the_aggregated_statistic_over_200_seeds_matches_the_calibration():
    fd, model, params = _fd(), GMMModel(2, "full", 1e-6), _params()
    dp0 = DifferentialPrivacy(2.0, DELTA, clip=4.0, noise_seed=0)
    exact = _exact(fd, model, params, dp0)
    sq = {b: 0.0 for b in exact}
    seeds = 200
    for s in range(seeds):
        dp = DifferentialPrivacy(2.0, DELTA, clip=4.0, noise_seed=s)
        rt = InProcessRuntime(fd, batched=False)
        setup_clients(rt, model, None, dp, 10)
        noisy = _summed(_estep(rt, params, 1))
        for b in exact:
            sq[b] += float(np.mean((noisy[b] - exact[b]) ** 2))
    z = dp0.calibrate(10).noise_multiplier
    want = release_stds(model.dp_sensitivity(params, dp0), z)
    for b in exact:  # three clients, each adding the full (local) noise
        empirical = sq[b] / seeds
        assert empirical == pytest.approx(3 * want[b] ** 2, rel=0.10), b
    # the budget is split equally among the blocks: std proportional to each block's bound
    sens = model.dp_sensitivity(params, dp0)
    assert want["sx"] / want["nk"] == pytest.approx(sens["sx"] / sens["nk"])
    assert want["nk"] == pytest.approx(z * 2 * np.sqrt(3) * sens["nk"])


class _SecAgg:
    class config:  # noqa: N801 - mimics SecAggConfig's attribute
        threshold = 4


def test_distributed_noise_gives_any_unmaskable_sum_at_least_the_calibrated_variance():
    dp = DifferentialPrivacy(1.0, DELTA, clip=1.0, noise="distributed", noise_seed=3)
    sums = {"a": np.zeros(4000)}
    sens = {"a": 1.0}
    shares = [ClientPrivacy(dp, 5, f"c{i}").release(sums, sens, what="t", client_key=i,
                                                      round_=1, secagg=_SecAgg)["a"]
              for i in range(6)]
    full = release_stds(sens, dp.calibrate(5).noise_multiplier)["a"] ** 2
    # each share carries sigma^2 / t, t = 4 the threshold: 4 survivors carry sigma^2
    assert np.var(np.sum(shares[:4], axis=0)) == pytest.approx(full, rel=0.1)
    assert np.var(np.sum(shares, axis=0)) == pytest.approx(1.5 * full, rel=0.1)
    with pytest.raises(fl.engine.privacy.PrivacyBudgetExceeded, match="needs secure aggregation"):
        ClientPrivacy(dp, 5, "c0").release(sums, sens, what="t", client_key=0, round_=1)


# ---- sensitivity -------------------------------------------------------------------------------
def test_one_record_changed_arbitrarily_moves_the_clipped_statistic_by_at_most_the_bound():
    rng = np.random.default_rng(1)
    model, params = GMMModel(2, "full", 1e-6), _params()
    dp = DifferentialPrivacy(1.0, DELTA, clip=3.0, center=(0.5, -0.5))
    params = {**params, "center": np.array([0.5, -0.5])}
    X = rng.normal(size=(30, 2)) * 2
    data = fl.FederatedDataset.from_arrays({"a": X})["a"]
    base = model.client_stats(params, model.dp_clip(data, dp), {}, None).stats
    bound = model.dp_sensitivity(params, dp)
    model.privacy = dp  # the moments query is taken about the clipping centre under DP
    q_base = model.client_query("moments", {}, model.dp_clip(data, dp), {}, None)[0]
    q_bound = model.dp_query_sensitivity("moments", {}, dp)
    worst = {b: 0.0 for b in bound}
    for _ in range(50):
        X2 = X.copy()
        X2[rng.integers(30)] = rng.normal(size=2) * 10.0 ** rng.uniform(0, 6)
        d2 = model.dp_clip(fl.FederatedDataset.from_arrays({"a": X2})["a"], dp)
        moved = model.client_stats(params, d2, {}, None).stats
        for b in bound:
            worst[b] = max(worst[b], float(np.linalg.norm(moved[b] - base[b])))
            assert np.linalg.norm(moved[b] - base[b]) <= 2 * bound[b] * (1 + 1e-9), b
        q2 = model.client_query("moments", {}, d2, {}, None)[0]
        for f in q_bound:
            assert np.linalg.norm(q2[f] - q_base[f]) <= 2 * q_bound[f] * (1 + 1e-9), f
    assert worst["sx"] > 0.5 * bound["sx"]  # the bound is not vacuous: records reach it


# ---- accounting --------------------------------------------------------------------------------
def _gmm_fit(dp, max_rounds=3, **fed):
    fd = _fd(n=60)
    est = fl.FederatedGaussianMixture(2, random_state=0, max_rounds=max_rounds,
                                      federation=fl.Federation(privacy=dp, **fed))
    return est.fit(fd)


def test_reported_epsilon_is_the_accountants_figure_and_never_above_the_budget():
    dp = DifferentialPrivacy(2.0, DELTA, clip=5.0, noise_seed=0)
    est = _gmm_fit(dp)
    cal = est.privacy_calibration_
    assert cal.releases == 3 + 2  # three rounds, the moments and the private k-means start
    h = est.history_.to_frame()
    for k, eps in zip(h["round"], h["epsilon"], strict=True):
        acc = PLDAccountant(value_discretization_interval=1e-4)
        acc.compose(dpa.GaussianDpEvent(cal.noise_multiplier), 2 + int(k))
        assert eps == pytest.approx(acc.get_epsilon(DELTA), rel=1e-3)
    assert np.all(np.diff(h["epsilon"]) > 0)
    assert est.privacy_spent_[0] == h["epsilon"].iloc[-1] <= 2.0
    assert est.privacy_spent_[1] == DELTA
    assert est.privacy_spent_[0] > 1.99  # the plan spends (almost) the whole budget
    assert h["objective"].isna().all()  # withheld: not covered by the noise


def test_rdp_accountant_figure_too():
    dp = DifferentialPrivacy(4.0, DELTA, clip=5.0, accountant="rdp", noise_seed=0)
    est = _gmm_fit(dp, max_rounds=2)
    acc = RdpAccountant()
    acc.compose(dpa.GaussianDpEvent(est.privacy_calibration_.noise_multiplier), 4)
    assert est.privacy_spent_[0] == pytest.approx(acc.get_epsilon(DELTA), rel=1e-9)
    assert est.privacy_spent_[0] <= 4.0


def test_a_fit_stops_before_the_round_that_would_exceed_the_budget(caplog):
    fd, model = _fd(), GMMModel(2, "full", 1e-6)
    dp = DifferentialPrivacy(1.0, DELTA, clip=5.0, noise_seed=0)
    budget = PrivacyBudget(dp.calibrate(4))
    rt = InProcessRuntime(fd)
    fed = fl.Federation(privacy=dp)
    n_units = setup_clients(rt, model, None, dp, 4)
    with caplog.at_level(logging.WARNING):
        res = run_rounds(model, rt, fed, _params(), LoopOptions(seed=0, max_rounds=10),
                         n_units=n_units, privacy=budget)
    assert res.n_rounds == 4 and len(res.history) == 4
    assert "round 5 would spend epsilon=" in caplog.text
    assert budget.spent[0] <= 1.0
    assert res.history[-1].epsilon == budget.calibration.epsilon_after(4)


def test_a_client_refuses_a_release_beyond_its_plan_whatever_the_server_asks():
    fd, model = _fd(), GMMModel(2, "full", 1e-6)
    dp = DifferentialPrivacy(1.0, DELTA, clip=5.0, noise_seed=0)
    rt = InProcessRuntime(fd, batched=False)
    setup_clients(rt, model, None, dp, 2)
    for k in (1, 2):
        assert all(ERROR_KEY not in r for r in _estep(rt, _params(), k).values())
    third = _estep(rt, _params(), 3)
    assert all("would be release 3 of a plan of 2" in r[ERROR_KEY] for r in third.values())


# ---- the noise cannot be subtracted; simulations can reproduce it -------------------------------
def test_noise_is_fresh_without_a_noise_seed_and_reproducible_with_one():
    a = _gmm_fit(DifferentialPrivacy(1.0, DELTA, clip=5.0), max_rounds=1)
    b = _gmm_fit(DifferentialPrivacy(1.0, DELTA, clip=5.0), max_rounds=1)
    assert not np.allclose(a.means_, b.means_)
    c = _gmm_fit(DifferentialPrivacy(1.0, DELTA, clip=5.0, noise_seed=5), max_rounds=1)
    d = _gmm_fit(DifferentialPrivacy(1.0, DELTA, clip=5.0, noise_seed=5), max_rounds=1)
    assert_same(c.means_, d.means_)  # exact: one seed, one code path, the same operations


def test_a_private_fit_with_little_noise_finds_the_non_private_mixture():
    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(-3, 1, (3000, 2)), rng.normal(3, 1, (3000, 2))])
    rng.shuffle(X)
    fd = fl.FederatedDataset.from_arrays({f"c{i}": X[i::4] for i in range(4)})
    plain = fl.FederatedGaussianMixture(2, random_state=0).fit(fd)
    dp = DifferentialPrivacy(1e3, DELTA, clip=8.0, noise_seed=1)
    priv = fl.FederatedGaussianMixture(2, random_state=0, max_rounds=3,
                                       federation=fl.Federation(privacy=dp)).fit(fd)
    assert priv.score(X) == pytest.approx(plain.score(X), rel=1e-3)


# ---- what is refused, and how ------------------------------------------------------------------
@pytest.mark.parametrize("fed, message", [
    (dict(privacy=DifferentialPrivacy(1.0, DELTA, clip=1.0, noise="distributed")),
     "private only with secure aggregation"),
    (dict(privacy=DifferentialPrivacy(1.0, DELTA, clip=1.0), variance_reduction=fl.Spider()),
     "variance_reduction=Spider"),
    (dict(privacy=DifferentialPrivacy(1.0, DELTA, clip=1.0), track_h=True), "track_h=True"),
])
def test_settings_that_would_leak_are_refused_before_anything_is_sent(fed, message):
    with pytest.raises(ValueError, match=message):
        fl.Federation(**fed).validate()


def test_a_centre_of_the_wrong_width_is_refused_naming_the_counts():
    dp = DifferentialPrivacy(1.0, DELTA, clip=1.0, center=(0.0, 0.0, 0.0))
    with pytest.raises(ValueError, match="3 values for 2 features"):
        _gmm_fit(dp)


def test_a_query_without_a_declared_sensitivity_is_refused_by_the_client():
    fd, model = _fd(), GMMModel(2, "full", 1e-6)
    dp = DifferentialPrivacy(1.0, DELTA, clip=5.0)
    rt = InProcessRuntime(fd, batched=False)
    setup_clients(rt, model, None, dp, 3)
    reps = rt.call(rt.client_ids, "query", {c: {"query": "kmeans", "k": 2, "min_points": 3}
                                            for c in rt.client_ids})
    assert all("query 'kmeans' is not available under differential privacy" in r[ERROR_KEY]
               for r in reps.values())


def test_the_setting_travels_as_json_and_round_trips():
    dp = DifferentialPrivacy(2.0, DELTA, clip=1.5, target_range=(-1, 4), center=(1, 2),
                             noise="distributed", accountant="rdp", noise_seed=9)
    assert DifferentialPrivacy.from_config(json.loads(json.dumps(dp.to_config()))) == dp
    fed = fl.Federation(privacy=dp, secure_aggregation=True)
    assert fl.Federation.from_config(json.loads(json.dumps(fed.to_config()))) == fed


def test_sec_refuses_differential_privacy_saying_why():
    rng = np.random.default_rng(0)
    fd = fl.FederatedDataset.from_arrays(
        {f"c{i}": (rng.normal(size=(30, 2)), rng.normal(size=30)) for i in range(4)})
    dp = DifferentialPrivacy(1.0, DELTA, clip=1.0, target_range=(-3, 3))
    with pytest.raises(ValueError, match="SEC refuses Federation.privacy=Differential.*fitted "
                                         "model .* not sums of bounded records"):
        fl.SEC(n_clusters=2, federation=fl.Federation(privacy=dp)).fit(fd)


def test_a_saved_private_model_keeps_its_spend_and_calibration(tmp_path):
    est = _gmm_fit(DifferentialPrivacy(1.0, DELTA, clip=5.0, noise_seed=2), max_rounds=1)
    est.save(tmp_path / "m")
    back = fl.FederatedGaussianMixture.load(tmp_path / "m")
    assert back.privacy_spent_ == est.privacy_spent_
    assert back.privacy_calibration_ == est.privacy_calibration_
    assert_same(back.covariances_, est.covariances_)  # the values saved, read back
    assert np.all(np.linalg.eigvalsh(back.covariances_) > 0)


def test_an_auto_size_is_refused_under_dp_before_any_candidate_is_fitted():
    est = fl.FederatedGaussianMixture(
        "auto", federation=fl.Federation(privacy=DifferentialPrivacy(1.0, DELTA, clip=5.0)))
    with pytest.raises(ValueError, match="size 'auto' is chosen by held-out scores outside"):
        est.fit(_fd())


def test_private_fits_on_tiny_data_survive_any_noise_draw():
    # 3 clients of 60 rows at epsilon 1: the noise dwarfs the sums, yet the start and the
    # M-step stay finite and positive definite (fresh OS noise every fit)
    for _ in range(15):
        est = _gmm_fit(DifferentialPrivacy(1.0, DELTA, clip=5.0), max_rounds=1)
        assert np.all(np.linalg.eigvalsh(est.covariances_) > 0)
        assert np.all(np.isfinite(est.means_))
