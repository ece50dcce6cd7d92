"""HLCR inference (issue 24, items 1-3): several chains with rank-normalized split R-hat and
ESS (pinned against ArviZ), an ArviZ-style summary, posterior predictive intervals checked by
coverage of held-out events."""

import warnings
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats

import fedlatent as fl
from fedlatent.data.hlcr_data import split_events
from fedlatent.engine.rounds.loop import ConvergenceWarning
from fedlatent.models.hlcr import HLCR
from fedlatent.models.hlcr.diagnostics import ess_bulk, ess_tail, rhat
from fedlatent.models.hlcr.inference import mixture_quantiles, store_chains
from fedlatent.models.hlcr.solvers import ChainSettings

COLUMNS = ["mean", "sd", "5%", "95%", "ess_bulk", "ess_tail", "r_hat"]


def arviz_cases():
    """The arrays whose diagnostics ArviZ 0.21.0 gave (``az.rhat(x, method="rank")``,
    ``az.ess(x, method="bulk")``, ``az.ess(x, method="tail")``), printed to 12 digits."""
    rng = np.random.default_rng(0)
    iid = rng.normal(size=(2, 50))
    ar, e = np.zeros((3, 80)), rng.normal(size=(3, 80))
    for t in range(1, 80):
        ar[:, t] = 0.8 * ar[:, t - 1] + e[:, t]
    ar += np.array([[0.0], [0.3], [-0.2]])
    shift = rng.normal(size=(4, 31))
    shift[1] += 1.0
    ties = np.round(rng.gamma(2.0, size=(2, 40)), 1)
    return {"iid": (iid, 0.998536526007, 79.4867807796, 73.9966383799),
            "ar": (ar, 1.07390564899, 40.9400379167, 51.4811972371),
            "shift": (shift, 1.06419167378, 51.2032743902, 153.54301799),
            "ties": (ties, 0.978630318904, 82.6205906134, 67.4375796479)}


@pytest.mark.parametrize("case", ["iid", "ar", "shift", "ties"])
def test_rhat_and_ess_equal_arviz(case):
    x, r, bulk, tail = arviz_cases()[case]
    assert rhat(x) == pytest.approx(r, rel=1e-10)
    assert ess_bulk(x) == pytest.approx(bulk, rel=1e-10)
    assert ess_tail(x) == pytest.approx(tail, rel=1e-10)


def test_rhat_is_nan_for_one_chain_or_constant_draws():
    assert np.isnan(rhat(np.ones((2, 10))))
    assert np.isnan(rhat(np.random.default_rng(0).normal(size=(1, 10))))
    assert ess_bulk(np.ones((2, 10))) == 20.0
    jitter = 0.4 + 1e-16 * np.random.default_rng(1).normal(size=(2, 10))
    assert ess_bulk(jitter) == ess_tail(jitter) == 20.0 and np.isnan(rhat(jitter))


def test_mixture_quantiles_of_normals_and_of_a_two_point_mixture():
    q = mixture_quantiles(np.array([[1.0], [-2.0]]), np.array([[2.0], [0.5]]),
                          np.ones((2, 1)), [0.05, 0.95])
    np.testing.assert_allclose(q, np.array([[1.0], [-2.0]]) + np.array([[2.0], [0.5]])
                               * stats.norm.ppf([0.05, 0.95]), atol=1e-9)
    q = mixture_quantiles(np.array([[-1.0, 1.0]]), np.array([[0.3, 0.3]]),
                          np.array([[1.0, 3.0]]), [0.25])[0, 0]
    cdf = 0.25 * stats.norm.cdf(q, -1, 0.3) + 0.75 * stats.norm.cdf(q, 1, 0.3)
    assert cdf == pytest.approx(0.25, abs=1e-12)


@pytest.fixture(scope="module")
def synth():
    return fl.datasets.make_synthhlcr(n_agents=10, n_entities=10, entities_per_agent=4,
                                      events_per_entity=15, n_clusters=2, n_features=2,
                                      sigma=0.5, delta=1.0, random_state=3)


def fit(fd, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        kw.setdefault("federation", fl.Federation(disclosure=fl.DisclosurePolicy(
            max_parameters_per_record=np.inf)))  # agents of 60 events: saturation aside
        # the paper's model (the by-hand predictive below has no entity intercept)
        return HLCR(2, solver="gibbs", max_rounds=40, random_state=0, random_intercept=False,
                    **kw).fit(fd)


@pytest.fixture(scope="module")
def two(synth):
    return fit(synth)


def test_summary_pins_its_columns_and_rows(two, synth):
    s = two.summary()
    t = s.table
    assert list(t.columns) == COLUMNS
    assert list(t.loc["0"].index) == ["share", "x0", "x1", "intercept"]
    assert list(t.loc["all"].index) == ["sigma", "delta"]
    assert two.n_chains_ == 2 and s.info["Chains"] == "2" and s.info["Draws per chain"] == "20"
    assert list(two.summary(prob=0.5).table.columns[2:4]) == ["25%", "75%"]
    assert "HLCR posterior" in str(s)
    with pytest.raises(ValueError, match=r"prob must be in \(0, 1\)"):
        two.summary(prob=1.0)


def test_summary_numbers_are_those_of_the_chains(two):
    ch, t = two.chains_, two.summary().table
    assert ch["coef"].shape == (2, 20, 2, 3) and ch["sigma"].shape == (2, 20)
    for k in range(2):
        W, V = ch["coef"][:, :, k, 0], ch["coef_var"][:, :, k, 0]
        row = t.loc[(str(k), "x0")]
        assert row["mean"] == pytest.approx(W.mean(), rel=1e-12)
        assert row["sd"] == pytest.approx(np.sqrt(V.mean() + W.var()), rel=1e-12)
        assert row["r_hat"] == pytest.approx(rhat(W), rel=1e-12)
        cdf = np.mean(stats.norm.cdf(row["95%"], W.ravel(), np.sqrt(V.ravel())))
        assert cdf == pytest.approx(0.95, abs=1e-9)
    sig = t.loc[("all", "sigma")]
    assert sig["mean"] == pytest.approx(ch["sigma"].mean(), rel=1e-12)
    assert sig["5%"] == pytest.approx(np.quantile(ch["sigma"], 0.05), rel=1e-12)
    assert 0.4 < sig["mean"] < 0.6  # the generating sigma is 0.5
    # chain 0 is the fit's own chain: its draws are those predict averages over
    np.testing.assert_allclose(ch["sigma"][0], two.draws_sigma_, rtol=1e-12)


def test_chain_zero_is_the_one_chain_fit(two, synth):
    one = fit(synth, n_chains=1)
    assert one.n_chains_ == 1 and np.isnan(one.rhat_max_)
    np.testing.assert_allclose(two.coef_, one.coef_, rtol=1e-12)
    np.testing.assert_allclose(two.draws_c_, one.draws_c_, rtol=1e-12)
    assert one.summary().table["r_hat"].isna().all()


@pytest.mark.usefixtures("saturation_rule_off")
def test_federated_chains_leave_the_agents_with_chain_zero(synth):
    one = HLCR(2, max_rounds=12, random_state=0, n_chains=1)
    two = HLCR(2, max_rounds=12, random_state=0, n_chains=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        one.fit(synth)
        two.fit(synth)
    np.testing.assert_array_equal(two.labels_, one.labels_)
    np.testing.assert_allclose(two.coef_, one.coef_, rtol=1e-12)
    assert two.chains_["coef"].shape[0] == 3


def test_more_than_one_chain_is_refused_under_privacy():
    dp = fl.Federation(privacy=fl.DifferentialPrivacy(epsilon=1.0, delta=1e-5, clip=1.0))
    with pytest.raises(ValueError, match="n_chains=2: more than one chain is refused under "
                       "differential privacy"):
        HLCR(2, federation=dp, n_chains=2)._check_params()
    assert HLCR(2, federation=dp)._n_chains() == 1
    assert HLCR(2)._n_chains() == 2


def fake_draws(sigmas):
    D, c = np.eye(2)[None] * 4.0, np.ones((1, 2))
    return [{"D": D, "c": c, "counts": np.array([5.0]), "sigma": s, "delta": 1.0}
            for s in sigmas]


def test_chains_that_disagree_raise_a_convergence_warning_naming_the_parameter():
    from fedlatent.models.hlcr.inference import chain_arrays

    rng = np.random.default_rng(0)
    chain = ChainSettings(0, 1, 1.0, 1.0, True, False)
    est = SimpleNamespace(n_features_in_=1, fit_intercept=True, n_entities_=5,
                          feature_names_in_=np.array(["x"]))
    other = chain_arrays(fake_draws(2.0 + 0.1 * rng.normal(size=30)), {}, chain, 1, True)
    with pytest.warns(ConvergenceWarning, match=r"the 2 chains disagree: R-hat of cluster all "
                      r"'sigma' is \d+\.\d+ \(> 1.01\); raise max_rounds"):
        store_chains(est, SimpleNamespace(draws=fake_draws(1.0 + 0.1 * rng.normal(size=30))),
                     {}, chain, [other])
    assert est.rhat_max_ > 1.5
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = chain_arrays(fake_draws(1.0 + 0.1 * rng.normal(size=30)), {}, chain, 1, True)
        store_chains(est, SimpleNamespace(draws=fake_draws(1.0 + 0.1 * rng.normal(size=30))),
                     {}, chain, [same])
    assert est.rhat_max_ < 1.01


def test_predict_interval_is_the_posterior_predictive_mixture(two, synth):
    cid = synth.client_ids[0]
    cd = synth[cid]
    X, ents = cd.X[:3], cd.entity[:3]
    iv = two.predict_interval(X, [cid] * 3, ents, alpha=0.2)
    assert iv.shape == (3, 2)
    # by hand: each retained draw, the pair's known cluster, N(x^T H c, sigma^2 + x^T H x)
    Xa = np.column_stack([X, np.ones(3)])
    where = [int(np.flatnonzero((two.pair_agents_ == cid) & (two.pair_entities_ == e))[0])
             for e in ents]
    for i in range(3):
        cdfs = []
        for t in range(len(two.draws_sigma_)):
            k = two.draws_labels_[t][where[i]]
            H = np.linalg.inv(two.draws_precisions_[t][k])
            mu = Xa[i] @ H @ two.draws_c_[t][k]
            sd = np.sqrt(two.draws_sigma_[t] ** 2 + Xa[i] @ H @ Xa[i])
            cdfs.append(stats.norm.cdf(iv[i], mu, sd))
        np.testing.assert_allclose(np.mean(cdfs, axis=0), [0.1, 0.9], atol=1e-9)


@pytest.mark.usefixtures("saturation_rule_off")
@pytest.mark.slow
def test_90_percent_predictive_intervals_cover_88_to_92_percent_of_held_out_events():
    hits = []
    for rep in range(4):
        fd = fl.datasets.make_synthhlcr(n_agents=24, n_entities=24, entities_per_agent=4,
                                        events_per_entity=24, n_clusters=3, n_features=3,
                                        sigma=0.5, delta=1.0, random_state=20 + rep)
        train, test = next(split_events(fd, 2, random_state=rep))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            est = HLCR(3, solver="gibbs", max_rounds=60, random_state=rep,
                       n_chains=1).fit(train)
        for cid, cd in test.items():
            iv = est.predict_interval(cd.X, np.full(len(cd.y), cid), cd.entity, alpha=0.1)
            hits.append((iv[:, 0] <= cd.y) & (cd.y <= iv[:, 1]))
    hits = np.concatenate(hits)
    assert hits.size > 3000
    assert 0.88 <= hits.mean() <= 0.92, hits.mean()
