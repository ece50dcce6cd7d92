"""Frequency weights in every registered model (issue 24 item 5, "Done when"): a fit with
weight 2 (or 3) on some rows equals the fit on the data with those rows repeated, to 1e-10.

Parametrized by the registry: a new model with an ``EXAMPLE`` is covered without editing this
file. The weighted and the duplicated fit do different floating-point work (a row times 2 is
not the row added twice), so they are compared at a stated tolerance: 1e-10 relative
(:data:`TOL`), or the model's own where it fits a learner iteratively (:data:`OWN_TOL`).
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.data.validation import DataValidationError
from fedlatent.engine.contract.registry import estimator_entries
from fedlatent.engine.faults import FederatedFitError

#: weighted vs duplicated: the same sums in another order, through a few EM rounds
TOL = 1e-10
#: models whose fit is not a closed-form function of the sums, with the reason
OWN_TOL: dict[str, float] = {}

ENTRIES = estimator_entries()


def weights_for(fd, seed: int = 7) -> dict[str, np.ndarray]:
    """Weight 1 on most rows, 2 on about a quarter and 3 on about a tenth, per client."""
    rng = np.random.default_rng(seed)
    out = {}
    for cid, cd in fd.items():
        u = rng.random(cd.n_samples)
        out[cid] = np.where(u < 0.1, 3.0, np.where(u < 0.35, 2.0, 1.0))
    return out


def weighted(fd, w):
    return fd.map(lambda cid, cd: cd.replace(weight=w[cid], rows=None))


def duplicated(fd, w):
    """Each row repeated as many times as its weight, next to itself (entity kept)."""
    return fd.map(lambda cid, cd: cd.replace(rows=None).take(
        np.repeat(np.arange(cd.n_samples), w[cid].astype(int))))


def _fit(make, fd):
    """A fit with disclosure control off: its rules count records, not weights, so a block of
    two weight-3 rows is refused where its six copies pass (test_disclosure_counts_records)."""
    est = make()
    fed = est.get_params().get("federation") or fl.Federation()
    est.set_params(federation=dataclasses.replace(fed, disclosure=fl.DisclosurePolicy.off()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return est.fit(fd)


def _arrays(est, names):
    return {n: np.asarray(getattr(est, n), dtype=np.float64) for n in names
            if getattr(est, n, None) is not None and np.asarray(getattr(est, n)).dtype != object}


@pytest.mark.parametrize("name", list(ENTRIES))
def test_weight_two_equals_the_row_twice(name):
    entry = ENTRIES[name]
    ex = entry.load_example()
    case = ex.case("default")
    fd = case.data()
    w = weights_for(fd)
    a, b = _fit(case.make, weighted(fd, w)), _fit(case.make, duplicated(fd, w))
    names = ex.fitted_arrays(entry.cls)
    got, want = _arrays(a, names), _arrays(b, names)
    assert got.keys() == want.keys() and got
    tol = OWN_TOL.get(name, TOL)
    for k in names:
        if k in got:
            np.testing.assert_allclose(got[k], want[k], rtol=tol, atol=tol * max(
                1.0, float(np.abs(want[k]).max(initial=0))), err_msg=f"{name}.{k}")
    ha, hb = getattr(a, "history_", None), getattr(b, "history_", None)
    if ha is not None and len(ha):
        assert len(ha) == len(hb)
        np.testing.assert_allclose(np.asarray(ha.objective, float),
                                   np.asarray(hb.objective, float), rtol=tol, atol=0)


@pytest.mark.parametrize("name", list(ENTRIES))
def test_predictions_do_not_read_weights(name):
    """Predict-side scores are a function of the fitted parameters and the rows alone."""
    entry = ENTRIES[name]
    ex = entry.load_example()
    case = ex.case("default")
    fd = case.data()
    w = weights_for(fd)
    fw = weighted(fd, w)
    est = _fit(case.make, fw)
    cid = fd.client_ids[0]
    X = fd[cid].X[:5]
    np.testing.assert_array_equal(np.asarray(ex.predict_rows(est, X, fw)),
                                  np.asarray(ex.predict_rows(est, X, fd)))


def _gmm_data():
    rng = np.random.default_rng(3)
    return fl.FederatedDataset.from_arrays(
        {f"c{c}": rng.normal(size=(30 + 7 * c, 2)) + 3 * (c % 2) for c in range(4)})


@pytest.mark.parametrize("cov", ["full", "tied", "diag", "spherical"])
def test_gmm_every_covariance_type(cov):
    fd = _gmm_data()
    w = weights_for(fd, seed=cov.__len__())

    def make():
        return fl.FederatedGaussianMixture(2, covariance_type=cov, max_rounds=6, tol=0,
                                           random_state=1, verbose=False)
    a, b = _fit(make, weighted(fd, w)), _fit(make, duplicated(fd, w))
    for k in ("weights_", "means_", "covariances_"):
        np.testing.assert_allclose(getattr(a, k), getattr(b, k), rtol=TOL, atol=TOL,
                                   err_msg=k)
    assert a.bic(weighted(fd, w)) == pytest.approx(b.bic(duplicated(fd, w)), rel=1e-10)


@pytest.mark.parametrize("model", ["gmm", "lcr"])
def test_standard_errors_equal_the_duplicated_rows(model):
    """engine/estimation/inference.py: Louis' information with frequency weights is the duplicated
    rows' (each record's score outer product counted w times)."""
    if model == "gmm":
        fd = _gmm_data()

        def make():
            return fl.FederatedGaussianMixture(2, covariance_type="full", max_rounds=30,
                                               tol=0, random_state=1, verbose=False)
    else:
        fd = ENTRIES["lcr"].load_example().case().data()

        def make():
            return fl.LatentClassRegression(2, max_rounds=30, tol=0, n_init=1, random_state=0)
    w = weights_for(fd, seed=11)
    a, b = _fit(make, weighted(fd, w)), _fit(make, duplicated(fd, w))
    ca, cb = a.cov_params().to_numpy(), b.cov_params().to_numpy()
    np.testing.assert_allclose(ca, cb, rtol=1e-8, atol=1e-10 * np.abs(cb).max())
    assert a.summary().info["Observations"] == b.summary().info["Observations"] == str(
        int(sum(x.sum() for x in w.values())))


def _two_rows_weighing_ten():
    rng = np.random.default_rng(0)
    data = {f"c{c}": rng.normal(size=(20, 2)) for c in range(3)}
    data["small"] = rng.normal(size=(2, 2))
    w = {c: np.ones(len(x)) for c, x in data.items()}
    w["small"] = np.array([5.0, 5.0])
    return data, w


@pytest.mark.usefixtures("saturation_rule_off")
def test_disclosure_counts_records_not_weights():
    """A client of two rows of weight 5 is two records: under min_records=3 it refuses, as
    it would without the weights; its ten copies would pass."""
    data, w = _two_rows_weighing_ten()
    fd = fl.FederatedDataset.from_arrays(data, weights=w)
    est = fl.FederatedGaussianMixture(2, max_rounds=2, random_state=0, verbose=False,
                                      federation=fl.Federation(on_refusal="stop"))
    with pytest.raises(FederatedFitError, match=r"client 'small': refused by the disclosure "
                                                r"policy: min_records=3 \(it holds fewer"):
        est.fit(fd)
    dup = fl.FederatedDataset.from_arrays({**data, "small": np.repeat(data["small"], 5, 0)})
    assert est.fit(dup).n_rounds_ == 2
    zero = {**w, "small": np.array([1.0, 1.0, 0.0, 0.0, 0.0])}  # 2 records + 3 of weight 0
    fd0 = fl.FederatedDataset.from_arrays(
        {**data, "small": np.vstack([data["small"], np.zeros((3, 2))])}, weights=zero)
    with pytest.raises(FederatedFitError, match=r"client 'small': refused by the disclosure "
                                                r"policy: min_records=3 \(it holds fewer"):
        est.fit(fd0)


def test_differential_privacy_refuses_weights_above_one():
    data, w = _two_rows_weighing_ten()
    data["small"] = np.repeat(data["small"], 3, 0)
    w["small"] = np.array([1.0, 1.0, 1.0, 1.0, 1.0, 2.5])
    dp = fl.DifferentialPrivacy(epsilon=5.0, delta=1e-5, clip=3.0)
    est = fl.FederatedGaussianMixture(2, max_rounds=2, random_state=0, verbose=False,
                                      federation=fl.Federation(privacy=dp, on_refusal="stop"))
    with pytest.raises(FederatedFitError,
                       match=r"client 'small' refuses differential privacy: 1 of its rows have "
                             r"a frequency weight above 1 \(largest 2.5\)"):
        est.fit(fl.FederatedDataset.from_arrays(data, weights=w))
    w["small"] = np.array([1.0, 1.0, 0.5, 1.0, 1.0, 0.25])  # weights <= 1 keep the bound
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert est.fit(fl.FederatedDataset.from_arrays(data, weights=w)).n_rounds_ == 2


def test_secure_aggregation_with_fractional_weights_is_the_plain_weighted_fit():
    """Fractional weights make fractional units: the secure sums' fixed-point rounding must
    not round them to whole numbers (the start's n, the objective's units)."""
    fd = _gmm_data()
    w = {c: 0.7 * v for c, v in weights_for(fd, seed=3).items()}

    def fit(secure):
        return _fit(lambda: fl.FederatedGaussianMixture(
            2, max_rounds=5, tol=0, random_state=1, verbose=False,
            federation=fl.Federation(secure_aggregation=secure)), weighted(fd, w))
    a, b = fit(True), fit(False)
    np.testing.assert_allclose(a.means_, b.means_, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(a.covariances_, b.covariances_, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(np.asarray(a.history_.objective, float),
                               np.asarray(b.history_.objective, float), rtol=1e-9)


def _hlcr_case():
    case = ENTRIES["hlcr"].load_example().case()
    return case, case.data()


@pytest.mark.usefixtures("saturation_rule_off")
def test_hlcr_refuses_an_entity_lighter_than_one_event():
    case, fd = _hlcr_case()
    first = fd.client_ids[0]
    n0 = int(np.sum(fd[first].entity == fd[first].entity[0]))  # its events (9 in the example)

    def light(cid, cd):
        w = np.ones(cd.n_samples)
        if cid == first:
            w[cd.entity == cd.entity[0]] = 0.1  # n0 events of weight 0.1
        return cd.replace(weight=w, rows=None)
    with pytest.raises(DataValidationError,
                       match=rf"client '{first}': the events of entity '.+' weigh "
                             rf"{n0 / 10:g} in all "
                             r"\(1 such entities\); every entity is at least one event"):
        case.make().fit(fd.map(light))


def test_hlcr_blocks_count_records_not_weights():
    """Disclosure control of an agent's cluster blocks counts their events of positive weight
    (records), not the weight sum the statistics carry."""
    from fedlatent.models.hlcr.model import HLCRModel

    case, fd = _hlcr_case()
    cd = fd[fd.client_ids[0]]
    w = np.where(np.arange(cd.n_samples) % 2 == 0, 10.0, 0.0)
    w[cd.entity == cd.entity[0]] = 10.0
    m = HLCRModel(2, 1.0, 1.0, 10.0, 1.0, n_features=cd.n_features)
    weighted_cd = cd.replace(weight=w)
    names = m._entity_stats(weighted_cd)[0]
    n_ev = m._entity_stats(weighted_cd)[4]
    rec = np.array([np.count_nonzero((np.asarray(cd.entity).astype(str) == e) & (w > 0))
                    for e in names])
    np.testing.assert_allclose(n_ev, [w[np.asarray(cd.entity).astype(str) == e].sum()
                                      for e in names])
    assert m.n_records(weighted_cd) == int(rec.sum()) < int(n_ev.sum())
    step = m.client_stats(m.initial_params(), weighted_cd, m.init_client_state(weighted_cd),
                          np.random.default_rng(0))
    blocks, _ = m.disclosure_blocks(step.stats)
    np.testing.assert_allclose(blocks.sum(), rec.sum())
    np.testing.assert_allclose(step.stats["n_events"].sum(), n_ev.sum())


def test_random_memberships_of_a_weighted_row_are_its_copies_draws():
    from fedlatent.engine.contract.mixture import MAX_DRAWS_PER_ROW, _memberships

    w = np.array([2.0, 0.0, 1.0, 3.0])
    got = _memberships(np.random.default_rng(5), 3, 4, w) * w[:, None]
    copies = np.random.default_rng(5).dirichlet(np.ones(3), size=6)  # rows 0, 0, 2, 3, 3, 3
    want = np.stack([copies[0:2].sum(0), np.zeros(3), copies[2], copies[3:6].sum(0)])
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-15)
    huge = _memberships(np.random.default_rng(5), 3, 4, np.full(4, MAX_DRAWS_PER_ROW + 1.0))
    np.testing.assert_allclose(huge, np.random.default_rng(5).dirichlet(np.ones(3), size=4))
