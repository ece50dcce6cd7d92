"""HLCR as a statistician expects (issue 14): predictive mean over draws, sigma and delta
estimated on standardized data and reported in the user's units, every sweep run, unknown pairs
named, K chosen by held-out predictive likelihood."""

import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.data.dataset import ClientData, FederatedDataset
from fedlatent.engine import InProcessRuntime
from fedlatent.engine.rounds.loop import ConvergenceWarning
from fedlatent.models.hlcr import entity_statistics, gibbs_init, gibbs_sweep
from fedlatent.models.hlcr.scaling import (
    draw_hyper,
    moments_scaling,
    scaling_matrix,
    to_user_units,
    transform_statistics,
)
from tolerance import assert_close, assert_same

# small agents (16-32 events) with the default random intercept's extra sums: the saturation
# rule (tests/engine/test_rules_saturation.py) would refuse them; this module tests the sampler
pytestmark = pytest.mark.usefixtures("saturation_rule_off")


SIGMA = 0.5


@pytest.fixture(scope="module")
def synth():
    return fl.datasets.make_synthhlcr(n_agents=12, n_entities=12, entities_per_agent=4,
                                      events_per_entity=20, n_clusters=3, n_features=3,
                                      sigma=SIGMA, delta=1.0, random_state=3, return_truth=True)


def _fit(est, fd, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return est.fit(fd, **kw)


def _scaled(fd, a, b):
    return FederatedDataset({c: ClientData(cd.X, cd.y * a + b, cd.entity) for c, cd in fd.items()},
                            fd.feature_names, fd.target_name, fd.entity_name)


# ---- pure functions ---------------------------------------------------------------------------
@pytest.mark.parametrize("intercept", [True, False])
def test_transformed_statistics_are_the_statistics_of_standardized_rows(intercept):
    rng = np.random.default_rng(0)
    X = rng.normal(3.0, 2.0, size=(60, 3)) * [1, 10, 0.1]
    y = 100 + 20 * rng.normal(size=60)
    ent = rng.integers(0, 5, size=60)
    mx, sx, my, sy = moments_scaling(60, X.sum(0), (X * X).sum(0), y.sum(), y @ y, intercept)
    if intercept:
        np.testing.assert_allclose([mx, sx], [X.mean(0), X.std(0)], rtol=1e-12)
        np.testing.assert_allclose([my, sy], [y.mean(), y.std()], rtol=1e-12)
    else:
        np.testing.assert_allclose(sx, np.sqrt((X * X).mean(0)), rtol=1e-12)
        assert my == 0.0
    Xa = np.hstack([X, np.ones((60, 1))]) if intercept else X
    Xs = (X - mx) / sx
    Xsa = np.hstack([Xs, np.ones((60, 1))]) if intercept else Xs
    _, XtX, Xty, yty, n = entity_statistics(Xa, y, ent)
    _, want_XtX, want_Xty, want_yty, _ = entity_statistics(Xsa, (y - my) / sy, ent)
    got = transform_statistics(XtX, Xty, yty, n, scaling_matrix(mx, sx, intercept), my, sy)
    for g, w in zip(got, (want_XtX, want_Xty, want_yty)):
        np.testing.assert_allclose(g, w, rtol=1e-8, atol=1e-9)


def test_user_units_give_the_same_predictive_mean_and_variance():
    rng = np.random.default_rng(1)
    F = 3
    mx, sx, my, sy = rng.normal(size=F), rng.uniform(0.5, 3, F), 40.0, 7.0
    T = scaling_matrix(mx, sx, True)
    A = rng.normal(size=(2, F + 1, F + 1))
    D = np.einsum("kij,klj->kil", A, A) + np.eye(F + 1)
    c = rng.normal(size=(2, F + 1))
    Du, cu, su = to_user_units(D, c, 0.3, T, my, sy)
    x = rng.normal(size=(5, F))
    xa, xs = np.hstack([x, np.ones((5, 1))]), np.hstack([(x - mx) / sx, np.ones((5, 1))])
    for k in range(2):
        m, mu = np.linalg.solve(D[k], c[k]), np.linalg.solve(Du[k], cu[k])
        np.testing.assert_allclose(xa @ mu, my + sy * (xs @ m), rtol=1e-10)
        v = np.einsum("nf,fg,ng->n", xs, np.linalg.inv(D[k]), xs) * sy**2
        np.testing.assert_allclose(np.einsum("nf,fg,ng->n", xa, np.linalg.inv(Du[k]), xa), v,
                                   rtol=1e-9)
    assert su == pytest.approx(0.3 * sy)


def test_hyper_draws_concentrate_on_the_generating_sigma():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(2, 4000, 3))
    w = np.array([[1.0, -2.0, 0.5], [0.0, 1.0, 3.0]])
    y = np.einsum("knf,kf->kn", X, w) + 0.7 * rng.normal(size=(2, 4000))
    sums = (np.einsum("kni,knj->kij", X, X), np.einsum("kni,kn->ki", X, y), (y * y).sum(1))
    draws = [draw_hyper(*sums, 8000.0, 0.7, 2.0, rng, True, True) for _ in range(200)]
    sig, dlt = np.array(draws).T
    assert abs(sig.mean() - 0.7) < 0.01 and sig.std() < 0.01
    # delta^2 | w ~ IG(1 + 3, 1 + ||w||^2/2): its mean is (1 + ||w||^2/2)/3
    assert abs((dlt**2).mean() - (1 + (w * w).sum() / 2) / 3) < 0.25
    fixed = draw_hyper(*sums, 8000.0, 0.7, 2.0, rng, False, False)
    assert fixed == (0.7, 2.0)


# ---- the chain --------------------------------------------------------------------------------
def test_fixed_sigma_and_delta_run_the_reference_sampler(synth):
    fd, _ = synth
    est = _fit(fl.HLCR(3, sigma=SIGMA, delta=1.0, solver="gibbs", max_rounds=5, burn_in=3,
                       random_state=4, random_intercept=False), fd)  # the paper's sampler
    stats = [entity_statistics(np.hstack([cd.X, np.ones((cd.n_samples, 1))]), cd.y,
                               cd.entity)[1:] for _, cd in fd.items()]
    rng = np.random.default_rng(est.seed_)
    state = gibbs_init(stats, 3, 1.0, SIGMA, rng)
    for t in range(5):
        gibbs_sweep(state, 1.0, 1.0, SIGMA, rng.random(len(state["n"])))
        assert_same(est._path[t]["labels"], state["z"])  # labels: exact
        assert_close(est._path[t]["D"], state["D"], err_msg=f"sweep {t}")  # tests/tolerance.py
    assert est.feature_scale_.tolist() == [1.0] * 3 and est.target_scale_ == 1.0


@pytest.mark.parametrize("solver", ["gibbs", "federated"])
def test_every_sweep_runs_and_burn_in_and_thinning_are_honoured(synth, solver):
    fd, _ = synth
    est = _fit(fl.HLCR(3, solver=solver, max_rounds=12, burn_in=5, thin=3, random_state=0), fd)
    assert est.n_iter_ == 12  # no stop because a sweep moved nothing
    assert len(est.draws_sigma_) == 3  # sweeps 6, 9, 12
    df = est.history_.to_frame()
    kept = df["round"].isin([6, 9, 12]).to_numpy()
    assert df.pred_change[~kept].isna().all() and df.pred_change[kept][1:].notna().all()
    assert est.converged_ == (est.mixing_ < est.MIXING_TOL)
    with pytest.raises(ValueError, match=r"burn_in must be None or in \[0, max_rounds=12\)"):
        fl.HLCR(3, max_rounds=12, burn_in=12).fit(fd)


@pytest.mark.parametrize("solver", ["gibbs", "federated"])
def test_predictive_mean_is_the_average_of_the_draws(synth, solver):
    fd, _ = synth
    # the paper's model: the by-hand mean below has no entity intercept
    est = _fit(fl.HLCR(3, solver=solver, max_rounds=10, random_state=1, random_intercept=False),
               fd)
    cid = fd.client_ids[1]
    X, ent = fd[cid].X, np.asarray(fd[cid].entity)
    pair = np.array([np.flatnonzero((est.pair_agents_ == cid) & (est.pair_entities_ == e))[0]
                     for e in ent])
    Xa = np.hstack([X, np.ones((len(X), 1))])
    per = [np.einsum("nf,nf->n", Xa, np.linalg.solve(D, c[..., None])[..., 0][lab[pair]])
           for D, c, lab in zip(est.draws_precisions_, est.draws_c_, est.draws_labels_)]
    agents = [cid] * len(X)
    np.testing.assert_allclose(est.predict(X, agents, ent), np.mean(per, axis=0), rtol=1e-10)
    np.testing.assert_allclose(est.predict(X, agents, ent, method="sample"), per[-1],
                               rtol=1e-10)
    lab = est.labels_[pair]
    np.testing.assert_allclose(est.predict(X, agents, ent, method="map"),
                               np.einsum("nf,nf->n", X, est.coef_[lab]) + est.intercept_[lab],
                               rtol=1e-10)
    with pytest.raises(ValueError, match=r"method must be one of \('mean', 'sample', 'map'\)"):
        est.predict(X, agents, ent, method="median")


def test_results_are_in_the_users_units(synth):
    fd, _ = synth
    a = _fit(fl.HLCR(3, solver="gibbs", max_rounds=30, random_state=0), fd)
    b = _fit(fl.HLCR(3, solver="gibbs", max_rounds=30, random_state=0), _scaled(fd, 1000, 50))
    np.testing.assert_array_equal(a.labels_, b.labels_)
    assert b.sigma_ == pytest.approx(1000 * a.sigma_, rel=1e-6)
    assert abs(a.sigma_ - SIGMA) < 0.05 * SIGMA  # the generating noise sd, estimated
    np.testing.assert_allclose(b.coef_, 1000 * a.coef_, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(b.predict_dataset(fd), 1000 * a.predict_dataset(fd) + 50,
                               rtol=1e-6)
    assert b.target_mean_ == pytest.approx(1000 * a.target_mean_ + 50)


def test_unknown_pairs_warn_by_default_and_can_be_refused(synth):
    fd, _ = synth
    est = _fit(fl.HLCR(3, max_rounds=6, random_state=0), fd)
    cid = fd.client_ids[0]
    X = fd[cid].X[:4]
    agents, ents = [cid, cid, "zz", "zz"], [fd[cid].entity[0], "new", "e01", "e01"]
    with pytest.warns(UserWarning, match=r"3 rows belong to 2 \(agent, entity\) pairs the fit "
                      rf"did not see \('{cid}'/'new', 'zz'/'e01'\): their predictions use the "
                      "prior"):
        warned = est.predict(X, agents, ents)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(est.predict(X, agents, ents, unknown="prior"), warned)
    with pytest.raises(ValueError, match=r"3 rows belong to 2 .* give their observed events as "
                       "context=, or predict with unknown='prior'"):
        est.predict(X, agents, ents, unknown="error")
    with pytest.raises(ValueError, match=r"unknown must be one of \('warn', 'prior', 'error'\)"):
        est.predict(X, agents, ents, unknown="ignore")


def test_k_auto_picks_the_generating_k_from_sums_scored_on_the_agents():
    fd, truth = fl.datasets.make_synthhlcr(n_agents=12, n_entities=12, entities_per_agent=4,
                                           events_per_entity=20, n_clusters=3, n_features=3,
                                           sigma=0.3, delta=2.0, random_state=6,
                                           return_truth=True)
    assert (np.bincount(list(truth["labels"].values())) > 0).sum() == 3  # 3 clusters in use
    rt = InProcessRuntime(fd, record=True)
    # the held-out choice of K is the one without the random intercept (with it: WAIC)
    est = _fit(fl.HLCR("auto", n_clusters_range=(1, 4), max_rounds=16, random_state=0,
                       random_intercept=False), fd, runtime=rt)
    assert sorted(est.k_scores_) == [1, 2, 3, 4]
    assert est.n_clusters_ == 3 == max(est.k_scores_, key=est.k_scores_.get)
    assert est.coef_.shape == (3, 3) and est.k_scores_[3] > est.k_scores_[1] + 0.5
    held = [m for d, _, method, m in rt.log if d == "up" and method == "query"
            and set(m) == {"loglik", "n"}]
    assert len(held) == 4 * fd.n_clients  # every agent scored every K, two numbers each
    assert all(np.ndim(v) == 0 for m in held for v in m.values())
    moments = [m for d, _, method, m in rt.log if d == "up" and "sxx" in m]
    assert moments and all(set(m) == {"n", "sx", "sxx", "sy", "syy"} for m in moments)
    with pytest.raises(ValueError, match="n_clusters must be an integer K >= 1, got 'three'"):
        fl.HLCR("three").fit(fd)


@pytest.mark.usefixtures("saturation_rule_off")
def test_save_load_keeps_the_draws_and_the_choice_of_k(synth, tmp_path):
    fd, _ = synth
    est = _fit(fl.HLCR("auto", n_clusters_range=(2, 3), solver="gibbs", max_rounds=8,
                       random_state=0, random_intercept=False), fd)
    est.save(tmp_path / "m")
    back = fl.HLCR.load(tmp_path / "m")
    np.testing.assert_array_equal(back.predict_dataset(fd), est.predict_dataset(fd))
    assert back.k_scores_ == est.k_scores_ and back.n_clusters_ == est.n_clusters_
    assert back.sigma_ == est.sigma_
    np.testing.assert_array_equal(back.history_.to_frame().pred_change,
                                  est.history_.to_frame().pred_change)


def test_predictions_come_back_in_the_dataframes_row_order(synth):
    fd, _ = synth
    df = fd.to_pandas(client="agent").sample(frac=1.0, random_state=0)
    df.index = [f"r{i}" for i in range(len(df))][::-1]
    src = fl.FederatedDataset.from_pandas(df, client="agent", entity="entity", target="y",
                                          features=fd.feature_names)
    est = _fit(fl.HLCR(3, solver="gibbs", max_rounds=6, random_state=0), src)
    pred = est.predict_dataset(src)
    assert list(pred.index) == list(df.index)
    direct = est.predict(df[fd.feature_names], df["agent"], df["entity"])
    np.testing.assert_array_equal(pred.to_numpy(), direct)
    last = list(est.staged_predict(src, method="mean"))[-1]
    assert list(last.index) == list(df.index)
    np.testing.assert_allclose(last.to_numpy(), direct, rtol=1e-12)
    assert est.mse(src) == pytest.approx(float(np.mean((direct - df["y"].to_numpy()) ** 2)))
